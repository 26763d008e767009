"""A fleet in one call: ``box_install(hosts=[...])`` / ``rgt box install h1 h2 …`` on loopback boxes (tests/sshbox.py):
parallel installs, one progress line per box state change, a row per box, and pre-flight naming the one command
that installs every box it found without the runtime."""

from __future__ import annotations

import json

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.fleet.tool import PreflightInput, render_preflight, run_fleet
from remote_gpu_trainer.registry import all_specs

from .conftest import call_ok

SPECS = {spec.name: spec for spec in all_specs()}
INSTALL = SPECS["box_install"]


def test_a_fleet_installs_in_one_call_with_a_row_per_box(ssh_fleet):
    for alias in ("inst-1", "inst-2"):
        ssh_fleet.add(alias, scenario="healthy-8xh100")
    ssh_fleet.add_closed("inst-dead")
    hosts = ["inst-1", "inst-2", "box-a", "inst-dead"]
    seen: list[tuple[float, float | None, str]] = []
    report = INSTALL.call({"hosts": hosts}, lambda done, total=None, message="": seen.append((done, total, message)))
    assert [r.host for r in report.hosts] == hosts
    assert [r.outcome for r in report.hosts] == ["installed", "installed", "already", "failed"]
    dead = report.hosts[3]
    assert dead.error_kind == "connection_refused" and dead.next_step and "inst-dead" in dead.summary
    assert report.state == "failed" and INSTALL.exit_code(report) == 1
    assert "rgt box install inst-dead" in report.next_step  # the retry names only the failed box
    # one progress display: a line per state change of a box, never the same line again
    messages = [m for _, _, m in seen]
    assert all(m.split(": ", 1)[0] in hosts for m in messages)
    assert len(messages) == len(set(messages)) and len(messages) <= 6 * len(hosts)
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen) and seen[-1][0] == seen[-1][1]
    assert SPECS["gpu_health"].call({"host": "inst-2"}).host == "inst-2"  # the runtime works there
    text = INSTALL.text(report)
    assert "inst-dead" in text and "connection_refused" in text and "nothing accepts ssh connections" in text


def test_rgt_box_install_takes_several_hosts(ssh_fleet, capsys):
    assert cli.main(["box", "install", "box-a", "box-b"]) == 0
    captured = capsys.readouterr()
    table = captured.out
    assert "2 box(es)" in table and "box-a" in table and "box-b" in table and "already" in table
    assert captured.err.count("box-a: ") == 2  # checking, already installed: one line per change
    assert cli.main(["box", "install", "--hosts", "box-a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hosts"][0]["outcome"] == "already"
    assert cli.main(["box", "install"]) == 2
    assert "give hosts" in capsys.readouterr().err
    assert cli.main(["box", "install", "box-a", "--", "-oProxyCommand=x"]) == 2  # checked before ssh sees it
    assert "hosts" in capsys.readouterr().err


@pytest.mark.anyio
async def test_over_mcp_box_install_takes_a_list_and_still_one_host(ssh_fleet, client):
    several = await call_ok(client, "box_install", {"hosts": ["box-a", "box-b"]})
    assert [r["host"] for r in several["hosts"]] == ["box-a", "box-b"] and several["state"] == "ready"
    one = await call_ok(client, "box_install", {"host": "box-b"})
    assert one["hosts"][0]["outcome"] == "already"


def test_preflight_gives_the_one_command_for_every_box_without_the_runtime(ssh_fleet):
    for alias in ("pf-bare-1", "pf-bare-2"):
        ssh_fleet.add(alias, scenario="healthy-8xh100")
    seen: list[str] = []
    result = run_fleet(PreflightInput(hosts=["box-a", "pf-bare-1", "pf-bare-2"], timeout_s=60, wait_s=None),
                       lambda done, total=None, message="": seen.append(message))
    command = "rgt box install pf-bare-1 pf-bare-2"
    mcp = 'box_install(hosts=["pf-bare-1", "pf-bare-2"])'
    bare = [row for row in result.hosts if row.host.startswith("pf-bare")]
    assert all(row.error.kind == "runtime_missing" and command in row.error.next_step for row in bare)
    assert any(command in note and mcp in note for note in result.notes)  # structured content
    assert command in render_preflight(result) and mcp in render_preflight(result)  # and the text
    assert not any(m.endswith(": ok") for m in seen)  # no "ok" before the verdict
    assert "box-a: facts read" in seen


def test_an_install_still_running_does_not_hold_the_process_at_exit():
    """A job is a daemon thread (jobs.py): a process that ends (Ctrl-C on `rgt box install`, the MCP server
    shutting down) must not wait for the installs still running. The install is replaced by one that never ends
    (this is about threads, not ssh: the loopback installs are above)."""
    import subprocess
    import sys
    import time

    code = """
import threading, time
from remote_gpu_trainer.remote import box
from remote_gpu_trainer.remote.hosts import parse_host
box.install = lambda host, progress=None, payload=None, **kw: time.sleep(120)
report = box.install_many([parse_host("never-1"), parse_host("never-2")], False, lambda *a, **k: None, 0.5,
                          concurrency=2)
print(report.state, flush=True)
"""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "installing", done.stderr
    assert time.monotonic() - started < 20, "the process waited for the installs at exit"


def test_a_batch_whose_job_was_dropped_still_reports_its_rows(ssh_fleet, monkeypatch):
    """Jobs are dropped an hour after they end (or for 16 newer ones): a later call naming a host of that batch
    reports the batch's rows, never "job_id: no job" (box_install has no job_id field)."""
    import time

    from remote_gpu_trainer import jobs
    from remote_gpu_trainer.remote import box
    from remote_gpu_trainer.remote.hosts import parse_host

    monkeypatch.setattr(box, "_batches", {})
    monkeypatch.setattr(jobs, "JOBS", jobs.JobRegistry(keep_s=0.0))  # a finished job is gone at once
    first = box.install_many([parse_host("box-a")], False, lambda *a, **k: None, 0)
    assert first.hosts[0].outcome == "installing"
    batch = box._batches["box-a"]
    deadline = time.monotonic() + 120
    while "box-a" not in batch.rows and time.monotonic() < deadline:
        time.sleep(0.1)
    later = box.install_many([parse_host("box-a"), parse_host("box-b")], False, lambda *a, **k: None, None)
    assert [(r.host, r.outcome) for r in later.hosts] == [("box-a", "already"), ("box-b", "already")]


def test_a_full_job_registry_is_an_error_naming_hosts(ssh_fleet, monkeypatch):
    import threading

    from remote_gpu_trainer import jobs
    from remote_gpu_trainer.errors import InputError
    from remote_gpu_trainer.remote import box
    from remote_gpu_trainer.remote.hosts import parse_host

    monkeypatch.setattr(box, "_batches", {})
    registry = jobs.JobRegistry(max_jobs=1)
    monkeypatch.setattr(jobs, "JOBS", registry)
    release = threading.Event()
    registry.start(lambda progress: release.wait(30), "busy")
    try:
        with pytest.raises(InputError) as caught:
            box.install_many([parse_host("box-a")], False, lambda *a, **k: None, None)
    finally:
        release.set()
    assert caught.value.field == "hosts" and "box_install" in str(caught.value), caught.value
    assert "box-a" not in box._batches  # nothing half-registered: the next call starts afresh
