"""Tools on a box through ``host``: real ssh client, real loopback ssh servers (tests/sshbox.py), no mocks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.models import Verdict
from remote_gpu_trainer.registry import all_specs
from remote_gpu_trainer.remote import RemoteError, parse_host
from remote_gpu_trainer.remote.runtime import runtime_version
from remote_gpu_trainer.remote.session import POOL
from remote_gpu_trainer.remote.ssh import classify_ssh_failure

from .conftest import call_error, call_ok

SPECS = {spec.name: spec for spec in all_specs()}


def call(tool: str, **arguments):
    return SPECS[tool].call(arguments)


# --- host strings -----------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["gpu-box", "root@203.0.113.7:2222", "ubuntu@node-1.example.org", "box_1",
                                  "root@[2001:db8::1]:22"])
def test_plain_hosts_parse(host):
    parsed = parse_host(host)
    assert parsed.given == host and not parsed.destination.startswith("-")


def test_port_and_user_are_split_for_ssh():
    parsed = parse_host("root@203.0.113.7:2222")
    assert parsed.ssh_target() == ["-p", "2222", "--", "root@203.0.113.7"]


HOSTILE = ["-oProxyCommand=touch {marker}", "box;touch {marker}", "$(touch {marker})", "`touch {marker}`",
           "box\ntouch {marker}", "box touch", "box\x00", "a@b@c", "box:99999", ""]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_host_strings_are_refused_before_ssh_runs(template, tmp_path):
    marker = tmp_path / "pwned"
    host = template.format(marker=marker)
    with pytest.raises(InputError) as err:
        call("port_status", port=29500, host=host)
    assert err.value.field == "host" and "allowed" in str(err.value)
    assert not marker.exists()


def test_ssh_messages_are_classified_verbatim():
    """The texts OpenSSH 9 prints (shared/facts/remote-ssh.md); DNS is not contacted from tests."""
    host = parse_host("gpu-box")
    cases = {
        "ssh: Could not resolve hostname no-such-host.invalid: Name or service not known": "unknown_host",
        "ssh: connect to host 127.0.0.1 port 1: Connection refused": "connection_refused",
        "ssh: connect to host 10.1.2.3 port 22: Connection timed out": "timeout",
        "root@127.0.0.1: Permission denied (publickey).": "auth_refused",
        "@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nHost key verification failed.":
            "host_key_changed",
        "Host key verification failed.": "host_key_unknown",
    }
    for text, kind in cases.items():
        error = classify_ssh_failure(host, text)
        assert error.kind == kind, text
        assert error.next_step and "gpu-box" in str(error)


# --- tools through host -------------------------------------------------------------------------------

def test_health_answers_for_each_box_with_its_own_gpus(ssh_fleet):
    healthy = call("gpu_health", host="box-a", expect_gpus=8)
    sick = call("gpu_health", host="box-b")
    assert healthy.verdict is Verdict.PASS and healthy.host == "box-a"
    assert healthy.box.endswith(f"@127.0.0.1:{ssh_fleet.boxes['box-a'].port}")  # ssh -G: user, host, port
    assert sick.verdict is Verdict.FAIL and sick.host == "box-b"
    assert any(c.verdict is Verdict.FAIL and "ecc" in c.name.lower() for g in sick.gpus for c in g.checks)
    local = call("gpu_health")  # no host: this machine (no NVIDIA driver here), and says so
    assert local.host is None and local.box is None


def test_a_warm_call_reuses_the_open_session(ssh_fleet):
    call("port_status", port=29500, host="box-a")
    idle = [s for group in POOL._idle.values() for s in group if s.host.given == "box-a"]
    assert idle, "the session was not kept for the next call"
    pid = idle[0].hello["pid"]
    call("port_status", port=29501, host="box-a")
    again = [s for group in POOL._idle.values() for s in group if s.host.given == "box-a"]
    assert pid in [s.hello["pid"] for s in again]


def test_skill_info_reports_the_box_runtime(ssh_fleet):
    info = call("skill_info", host="box-b")
    assert info.host == "box-b" and info.runtime == runtime_version()  # the box's own build, hash included
    assert ".cache/remote-gpu-trainer" in info.skill_root  # answered by the runtime on the box


def test_skill_info_on_a_box_starts_its_login_shell_once(ssh_fleet):
    """The login shell (start-up files and all) is read once per skill_info, for the training env and for
    CUDA_VISIBLE_DEVICES both: on a box with a slow .profile, twice is twice as slow."""
    box = ssh_fleet.add("si-once", scenario="healthy-8xh100")
    ssh_fleet.install_runtime("si-once")
    with (box.home / ".profile").open("a") as profile:
        profile.write('echo started >> "$HOME/login-shells"\n')
    info = call("skill_info", host="si-once")
    assert info.host == "si-once"
    assert (box.home / "login-shells").read_text().count("started") == 1


def _listener(port: int) -> subprocess.Popen:
    code = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('127.0.0.1', {port})); s.listen(); print('ready', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    for _ in range(100):  # settled into sleep: a process still paging in is briefly in D state
        if psutil.Process(proc.pid).status() == psutil.STATUS_SLEEPING:
            break
        time.sleep(0.02)
    return proc


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_port_kill_through_host_needs_that_box_token(ssh_fleet):
    port = _free_port()
    holder = _listener(port)
    try:
        status = call("port_status", port=port, host="box-a")
        assert not status.free and status.host == "box-a"
        dry = call("kill_port_holders", ports=[port], host="box-a")
        assert dry.dry_run and dry.confirm_token and holder.pid in [t.pid for t in dry.targets]
        other = call("kill_port_holders", ports=[port], host="box-b").confirm_token
        with pytest.raises(InputError) as refused:  # same machine, same pids, but another box: refused
            call("kill_port_holders", ports=[port], host="box-a", dry_run=False, confirm_token=other)
        assert "another box" in str(refused.value)
        assert holder.poll() is None
        done = call("kill_port_holders", ports=[port], host="box-a", dry_run=False, confirm_token=dry.confirm_token)
        assert done.executed and done.verdict is Verdict.PASS, done.summary
        assert holder.wait(timeout=10) is not None
    finally:
        if holder.poll() is None:
            holder.kill()


def test_zombie_report_through_host_classifies_the_box(ssh_fleet):
    box = ssh_fleet.add("box-z", scenario="zombie-orphan-namespaced")
    ssh_fleet.install_runtime("box-z")
    report = call("reap_vram_zombies", host="box-z")
    assert report.host == "box-z" and report.dry_run
    assert box.port and report.holders


def test_hostile_arguments_stay_data_on_the_box(ssh_fleet, tmp_path):
    marker = tmp_path / "pwned"
    for path in (f"$(touch {marker})", f"`touch {marker}`", f"x; touch {marker}"):
        with pytest.raises(InputError) as err:
            call("diagnose_error", host="box-a", log_path=path)
        assert err.value.field == "log_path"
    result = call("diagnose_error", host="box-a", text=f"$(touch {marker})\n`touch {marker}`\nValueError: Attempting "
                  "to unscale FP16 gradients.")
    assert result.matches and not marker.exists()


def test_diagnose_reads_the_tail_of_a_log_on_the_box(ssh_fleet):
    log = ssh_fleet.boxes["box-b"].home / "train.log"
    log.write_text("step 1 loss 2.0\n" * 20000 + "ValueError: Attempting to unscale FP16 gradients.\n")
    result = call("diagnose_error", host="box-b", log_path=str(log), tail_bytes=4096)
    assert result.host == "box-b" and result.matches[0].id.startswith("AMP")
    assert result.lines_scanned < 400  # only the tail was read


def test_repro_runs_on_the_box_torch_and_streams_progress(ssh_fleet):
    seen: list[tuple] = []
    report = SPECS["repro_scaler_bug"].call({"host": "box-a", "case": "fp16_unscale", "device": "cpu"},
                                            lambda done, total=None, message="": seen.append((done, total, message)))
    assert report.host == "box-a" and report.torch_version and report.reproduced >= 1
    assert seen and all(isinstance(m, str) for _, _, m in seen)  # the box's progress lines, as they came


# --- failures, each clear ---------------------------------------------------------------------------

def _kind(host: str) -> RemoteError:
    with pytest.raises(RemoteError) as err:
        call("port_status", port=29500, host=host)
    assert host in str(err.value) and err.value.next_step
    return err.value


def test_closed_port_wrong_key_and_host_keys(ssh_fleet, tmp_path):
    # A box of its own: an open ControlMaster to the same user@host:port would be reused, skipping the checks.
    port = ssh_fleet.add("box-keys").port
    ssh_fleet.add_closed("box-closed")
    ssh_fleet.add_alias("box-stranger", port, known_hosts=tmp_path / "kh-a", identity=ssh_fleet.other_key)
    (tmp_path / "kh-a").write_text(f"[127.0.0.1]:{port} {ssh_fleet.host_key.with_suffix('.pub').read_text()}")
    ssh_fleet.add_alias("box-unknown", port, known_hosts=tmp_path / "kh-empty", strict="yes")
    (tmp_path / "kh-changed").write_text(f"[127.0.0.1]:{port} {ssh_fleet.other_key.with_suffix('.pub').read_text()}")
    ssh_fleet.add_alias("box-changed", port, known_hosts=tmp_path / "kh-changed", strict="yes")
    assert _kind("box-closed").kind == "connection_refused"
    assert _kind("box-stranger").kind == "auth_refused"
    assert _kind("box-unknown").kind == "host_key_unknown"
    changed = _kind("box-changed")
    assert changed.kind == "host_key_changed"
    assert f"ssh-keygen -f {tmp_path / 'kh-changed'} -R '[127.0.0.1]:{port}'" in changed.next_step  # its own file


def test_a_new_box_key_is_recorded_on_first_use(ssh_fleet, tmp_path):
    port = ssh_fleet.add("box-fresh", scenario="healthy-8xh100").port
    ssh_fleet.install_runtime("box-fresh")
    known = tmp_path / "kh-new"
    ssh_fleet.add_alias("box-new", port, known_hosts=known, strict=None)  # the user configured nothing
    assert call("port_status", port=29500, host="box-new").host == "box-new"  # accept-new
    assert f"[127.0.0.1]:{port}" in known.read_text()


def test_missing_runtime_and_version_mismatch_say_the_fix(ssh_fleet):
    ssh_fleet.add("box-bare", server="asyncssh" if ssh_fleet.boxes["box-b"].server == "asyncssh" else None)
    missing = _kind("box-bare")
    assert missing.kind == "runtime_missing" and "rgt box install box-bare" in missing.next_step
    old = ssh_fleet.boxes["box-bare"].home / ".cache" / "remote-gpu-trainer" / "0.0.1+0123456789ab"
    old.mkdir(parents=True)
    (old / "ready").write_text("")
    mismatch = _kind("box-bare")
    assert mismatch.kind == "version_mismatch" and "0.0.1+0123456789ab" in mismatch.message


def test_an_endpoint_that_only_opens_a_shell_is_named(ssh_fleet):
    ssh_fleet.add("box-shell-only", interactive_only=True)
    error = _kind("box-shell-only")
    assert error.kind == "no_command_channel" and "interactive shell" in error.message


def test_box_status_install_and_remove(ssh_fleet):
    ssh_fleet.add("box-life", scenario="healthy-8xh100")
    before = call("box_status", host="box-life")
    assert before.state == "missing"
    installed = call("box_install", host="box-life")
    assert installed.state == "ready" and "ready" in installed.hosts[0].steps
    assert call("box_install", host="box-life").hosts[0].summary.endswith("already installed")  # idempotent
    assert call("gpu_health", host="box-life").verdict is Verdict.PASS
    runs = ssh_fleet.boxes["box-life"].home / ".cache" / "remote-gpu-trainer" / "runs"
    runs.mkdir()
    removed = call("box_remove", host="box-life")
    assert removed.state == "removed" and runs.is_dir()  # never the runs' records
    assert call("box_status", host="box-life").state == "missing"


def test_remote_timeout_leaves_no_process_on_the_box(ssh_fleet, monkeypatch):
    monkeypatch.setenv("RGT_REMOTE_TIMEOUT", "1")
    with pytest.raises(RemoteError) as err:
        call("repro_scaler_bug", host="box-a", case="fp16_unscale", device="cpu")
    assert err.value.kind == "remote_timeout"
    deadline = time.monotonic() + 10
    while ssh_fleet.box_processes("box-a") and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = [p for p in ssh_fleet.box_processes("box-a") if "remote.serve" not in " ".join(p.cmdline())]
    assert not leftover, [p.cmdline() for p in leftover]


# --- over MCP and the CLI ------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_over_mcp_tools_take_host_and_refuse_unknown_arguments(ssh_fleet, client):
    health = await call_ok(client, "gpu_health", {"host": "box-b"})
    assert health["host"] == "box-b" and health["verdict"] == "FAIL"
    text = (await client.call_tool("gpu_health", {"host": "box-a"})).content[0].text
    assert text.startswith("[host box-a]") and len(text) < 4000
    assert "bogus" in await call_error(client, "gpu_health", {"host": "box-a", "bogus": 3})
    assert "host" in await call_error(client, "provider_info", {"provider": "runpod", "host": "box-a"})
    refused = await call_error(client, "port_status", {"port": 29500, "host": "box-closed-mcp"})
    assert "box-closed-mcp" in refused
    dry = await call_ok(client, "kill_port_holders", {"ports": [1], "host": "box-a"})
    assert dry["host"] == "box-a" and dry["dry_run"] is True


def test_cli_takes_host_and_rgt_host(ssh_fleet):
    # `rgt box install` first: a no-op when this checkout is the one installed at the session's start, and the
    # real install path through the CLI when files changed since (the build hash is the version).
    install = subprocess.run([sys.executable, "-m", "remote_gpu_trainer.cli", "box", "install", "box-b"],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0 and "box-b: runtime" in install.stdout, install.stderr
    env = {**os.environ, "RGT_HOST": "box-b"}
    out = subprocess.run([sys.executable, "-m", "remote_gpu_trainer.cli", "health", "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert json.loads(out.stdout)["host"] == "box-b" and out.returncode == 1  # ECC: FAIL
    out = subprocess.run([sys.executable, "-m", "remote_gpu_trainer.cli", "ports", "29500", "--host", "nosuch-alias"],
                         capture_output=True, text=True, env={**os.environ, "RGT_SSH_CONFIG": str(Path(os.environ[
                             "RGT_SSH_CONFIG"]))}, timeout=60)
    assert out.returncode in (2, 5) and "nosuch-alias" in out.stderr and "Traceback" not in out.stderr


def test_a_slow_install_goes_on_in_the_background_and_a_later_call_reports_it(ssh_fleet):
    ssh_fleet.add("box-slow")
    first = call("box_install", host="box-slow", wait_s=0)  # an MCP client would give up on a long call
    assert first.state in ("installing", "ready")
    deadline = time.monotonic() + 120
    report = first
    while report.state == "installing" and time.monotonic() < deadline:
        time.sleep(1)
        report = call("box_install", host="box-slow", wait_s=5)
    assert report.state == "ready" and "ready" in report.hosts[0].steps
    assert call("gpu_health", host="box-slow").host == "box-slow"


@pytest.mark.anyio
async def test_over_mcp_every_box_tool_of_the_issue_works_through_an_alias(ssh_fleet, client):
    """The issue's bar, over MCP: health, port status, kill with the dry run's token, zombies, a repro and a
    diagnosis of a log file on the box, all through one ssh alias."""
    assert (await call_ok(client, "gpu_health", {"host": "box-a", "expect_gpus": 8}))["verdict"] == "PASS"
    port = _free_port()
    holder = _listener(port)
    try:
        status = await call_ok(client, "port_status", {"port": port, "host": "box-a"})
        assert status["free"] is False and status["host"] == "box-a"
        dry = await call_ok(client, "kill_port_holders", {"ports": [port], "host": "box-a"})
        assert holder.pid in [t["pid"] for t in dry["targets"]] and holder.poll() is None
        done = await call_ok(client, "kill_port_holders", {"ports": [port], "host": "box-a", "dry_run": False,
                                                           "confirm_token": dry["confirm_token"]})
        assert done["executed"] and holder.wait(timeout=10) is not None
    finally:
        if holder.poll() is None:
            holder.kill()
    zombies = await call_ok(client, "reap_vram_zombies", {"host": "box-b"})
    assert zombies["host"] == "box-b" and zombies["dry_run"] is True
    repro = await call_ok(client, "repro_scaler_bug", {"case": "no_inf_checks", "device": "cpu", "host": "box-b"})
    assert repro["host"] == "box-b" and repro["reproduced"] >= 1
    log = ssh_fleet.boxes["box-a"].home / "mcp-train.log"
    log.write_text("[rank0]: AssertionError: No inf checks were recorded for this optimizer.\n")
    found = await call_ok(client, "diagnose_error", {"log_path": str(log), "host": "box-a"})
    assert found["host"] == "box-a" and found["matches"][0]["id"].startswith("AMP")
