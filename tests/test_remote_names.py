"""Paths and names as users write them, on loopback boxes (tests/sshbox.py): ``~`` and relative paths mean the box
user's home, every text about a box names it, and a host-key failure gives steps that work when followed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.registry import all_specs
from remote_gpu_trainer.remote import RemoteError

SPECS = {spec.name: spec for spec in all_specs()}


def call(tool: str, **arguments):
    return SPECS[tool].call(arguments)


def _fingerprint(public_key) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(public_key)], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def _follow(next_step: str, cwd) -> list[str]:
    """Run the shell commands a next step gives in backticks, in order, as a person would (not the one that runs on
    the box itself); return what they printed."""
    printed = []
    for command in re.findall(r"`([^`]+)`", next_step):
        if command.startswith(("ssh-keygen", "ssh-keyscan", "cat ")) and "/etc/ssh/" not in command:
            done = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, (command, done.stderr)
            printed.append(done.stdout)
    return printed


def _error(tool: str, **arguments) -> RemoteError:
    with pytest.raises(RemoteError) as err:
        call(tool, **arguments)
    return err.value


# --- host keys ------------------------------------------------------------------------------------------------

def test_a_changed_key_under_strict_checking_is_fixed_by_following_the_steps(ssh_fleet, tmp_path):
    box = ssh_fleet.add("box-rerented", scenario="healthy-8xh100")  # its own port: no shared master skips the check
    ssh_fleet.install_runtime("box-rerented")
    known = tmp_path / "kh-rerented"
    known.write_text(f"[127.0.0.1]:{box.port} {ssh_fleet.other_key.with_suffix('.pub').read_text()}")
    ssh_fleet.add_alias("box-rerented-strict", box.port, known_hosts=known, strict="yes")
    error = _error("port_status", port=29500, host="box-rerented-strict")
    new_key = _fingerprint(ssh_fleet.host_key.with_suffix(".pub"))
    assert error.kind == "host_key_changed" and new_key in error.message  # the banner's fingerprint is kept
    assert f"ssh-keygen -f {known} -R '[127.0.0.1]:{box.port}'" in error.next_step  # the config's own file
    assert "ssh-keyscan" in error.next_step and "StrictHostKeyChecking yes" in error.next_step
    printed = _follow(error.next_step, tmp_path)
    assert any(new_key in out for out in printed)  # the verify step shows the key the banner named
    assert call("port_status", port=29500, host="box-rerented-strict").host == "box-rerented-strict"


def test_a_changed_key_under_accept_new_needs_only_the_removal(ssh_fleet, tmp_path):
    box = ssh_fleet.add("box-rerented2", scenario="healthy-8xh100")
    ssh_fleet.install_runtime("box-rerented2")
    known = tmp_path / "kh-rerented2"
    known.write_text(f"[127.0.0.1]:{box.port} {ssh_fleet.other_key.with_suffix('.pub').read_text()}")
    ssh_fleet.add_alias("box-rerented-default", box.port, known_hosts=known, strict=None)  # the user set nothing
    error = _error("port_status", port=29500, host="box-rerented-default")
    assert error.kind == "host_key_changed" and "ssh-keyscan" not in error.next_step
    _follow(error.next_step, tmp_path)
    assert call("port_status", port=29500, host="box-rerented-default").host == "box-rerented-default"  # accept-new
    assert _fingerprint(known) == _fingerprint(ssh_fleet.host_key.with_suffix(".pub"))


def test_an_unknown_key_under_strict_checking_gets_the_keyscan_steps(ssh_fleet, tmp_path):
    box = ssh_fleet.add("box-unseen", scenario="healthy-8xh100")
    ssh_fleet.install_runtime("box-unseen")
    known = tmp_path / "kh-unseen"
    known.write_text("")
    ssh_fleet.add_alias("box-unseen-strict", box.port, known_hosts=known, strict="yes")
    error = _error("port_status", port=29500, host="box-unseen-strict")
    assert error.kind == "host_key_unknown" and f">> {known}" in error.next_step
    _follow(error.next_step, tmp_path)
    assert call("port_status", port=29500, host="box-unseen-strict").host == "box-unseen-strict"


# --- paths as users write them --------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["~/names-train.log", "names-train.log", "logs/../names-train.log"])
def test_log_paths_resolve_against_the_box_users_home(ssh_fleet, path):
    log = ssh_fleet.boxes["box-a"].home / "names-train.log"
    log.write_text("[rank0]: AssertionError: No inf checks were recorded for this optimizer.\n")
    (log.parent / "logs").mkdir(exist_ok=True)
    found = call("diagnose_error", host="box-a", log_path=path)
    assert found.host == "box-a" and found.matches[0].id.startswith("AMP")


def test_a_missing_log_on_a_box_names_the_box_and_the_resolved_path(ssh_fleet):
    with pytest.raises(InputError) as err:
        call("diagnose_error", host="box-a", log_path="~/no-such.log")
    text = str(err.value)
    assert err.value.field == "log_path" and "box-a" in text
    assert str(ssh_fleet.boxes["box-a"].home / "no-such.log") in text


def test_a_relative_run_directory_is_in_the_box_users_home(ssh_fleet):
    (ssh_fleet.boxes["box-b"].home / "proj").mkdir(exist_ok=True)
    started = call("run_start", host="box-b", argv=[sys.executable, "-c", "print('hi')"], cwd="proj",
                   skip_checks=["port", "gpus"])
    assert started.cwd == str(ssh_fleet.boxes["box-b"].home / "proj")
    assert "--host box-b" in started.next_step  # the command it prints reaches the same box


# --- every text about a box names it ----------------------------------------------------------------------------

def test_rgt_health_on_a_box_without_gpus_names_the_box(ssh_fleet, capsys):
    ssh_fleet.add("box-cpu", scenario="no-driver")
    ssh_fleet.install_runtime("box-cpu")
    assert cli.main(["health", "--host", "box-cpu"]) == 4
    out = capsys.readouterr().out
    assert out.startswith("[host box-cpu] ") and "no NVIDIA GPU on box-cpu" in out and "GPU here" not in out
    assert "not box-cpu's state" in out  # the fake scenario's banner


def test_a_dry_run_on_a_box_shows_whole_commands_with_age_and_a_command_for_that_box(ssh_fleet):
    from .test_remote import _free_port, _listener

    port = _free_port()
    holder = _listener(port)
    try:
        dry = call("kill_port_holders", ports=[port], host="box-a")
        target = next(t for t in dry.targets if t.pid == holder.pid)
        assert target.command.endswith("time.sleep(120)") and target.age_s is not None and target.age_s >= 0
        assert f"rgt ports {port} --host box-a --no-dry-run" in dry.next_step
        status = call("port_status", port=port, host="box-a")
        assert status.holders[0].command == target.command
        assert "time.sleep(120)" in SPECS["port_status"].text(status)  # whole in the text too
    finally:
        holder.kill()


def test_info_lists_the_tools_mcp_lists():
    info = call("skill_info")
    assert sorted(info.tools) == sorted(s.name for s in all_specs() if not s.internal)
    assert "host_facts" not in info.tools


def test_the_cli_names_the_host_of_any_remote_result(ssh_fleet, capsys):
    assert cli.main(["port-status", "--port", "29500", "--host", "box-a"]) in (0, 1)  # 1: something holds it
    assert capsys.readouterr().out.startswith("[host box-a] ")


def test_progress_from_a_box_names_the_box(ssh_fleet):
    seen: list[str] = []
    SPECS["gpu_health"].call({"host": "box-a"}, lambda done, total=None, message="": seen.append(message))
    assert seen and all(m.startswith("box-a: ") for m in seen if m)
