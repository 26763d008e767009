"""Hang forensics through ``host``: a 4-rank gloo run on a loopback ssh box (tests/sshbox.py) stalls with rank 1
stuck in ``__getitem__``; the box's supervisor takes the stacks, run_status and run_stacks over ssh name the rank
and where it is, and run_stop's token ends it, ranks included."""

from __future__ import annotations

import sys
import time

import psutil
import pytest

from .test_hang_gloo import SCENARIOS, STALL_S, TOOLS, hung, site, torchrun

pytestmark = pytest.mark.slow


def box_python(fleet, alias: str) -> str:
    """The python that has torch on the box. Today's loopback boxes see this venv's torch, so it is this
    interpreter; a box whose torch lives in the user's own venv gives that venv's python here."""
    return sys.executable


def call(tool: str, **arguments):
    return TOOLS[tool].call(arguments)


def test_stuck_dataloader_rank_named_through_the_box(ssh_fleet):
    started = call("run_start", host="box-a", argv=torchrun("getitem", box_python(ssh_fleet, "box-a")),
                   cwd=str(SCENARIOS.parent), name="hang-remote", stall_after_s=STALL_S, skip_checks=["port"])
    run_id = started.run_id
    try:
        end = time.monotonic() + 120
        status = call("run_status", host="box-a", run_id=run_id)
        while not hung(status) and time.monotonic() < end:
            time.sleep(0.3)
            status = call("run_status", host="box-a", run_id=run_id)
        assert hung(status), status.model_dump_json(indent=1)[:3000]
        print(f"\n{run_id} on box-a: {status.hang.verdict}")
        expected = (f"ranks 0, 2, 3 wait in `all_reduce` at {site('grads')}; rank 1 is in `DataLoader.__next__` → "
                    f"{site('getitem')} (`__getitem__`, worker pid ")
        assert status.host == "box-a" and status.hang.verdict.startswith(expected)
        box_runs = ssh_fleet.boxes["box-a"].home / ".cache" / "remote-gpu-trainer" / "runs"
        assert (box_runs / run_id / "stacks.json").is_file()  # kept in the run folder on the box

        report = call("run_stacks", host="box-a", run_id=run_id)
        assert report.host == "box-a" and report.verdict.startswith(expected) and report.entry.id == "DATA-11"
        assert {p.mechanism for p in report.processes if p.role in ("rank", "worker")} == {"signal"}
        text = TOOLS["run_stacks"].render_text(report)
        assert text.splitlines()[0] == report.verdict and "ODD rank 1" in text
    finally:
        dry = call("run_stop", host="box-a", run_id=run_id)
        pids = [t.pid for t in dry.kill.targets] if dry.kill else []
        stopped = call("run_stop", host="box-a", run_id=run_id, dry_run=False, confirm_token=dry.confirm_token,
                       grace_s=2)
        assert stopped.verified, stopped.summary
        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
