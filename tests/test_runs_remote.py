"""Runs on a box through ``host``: a real gloo training run on a loopback ssh box (tests/sshbox.py),
started, watched across a dropped connection, stopped with its token; a failing run's diagnosis."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from remote_gpu_trainer.registry import all_specs
from remote_gpu_trainer.remote.session import POOL

from .conftest import call_ok

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
SPECS = {spec.name: spec for spec in all_specs()}


def call(tool: str, **arguments):
    return SPECS[tool].call(arguments)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _drop_connections(fleet) -> None:
    """Close every session and the ssh ControlMaster sockets: the next call makes a new connection."""
    POOL.close_all()
    for alias in fleet.boxes:
        subprocess.run(["ssh", "-F", str(fleet.config), "-o", f"ControlPath={fleet.control_dir}/%C", "-O", "exit",
                        alias], capture_output=True, stdin=subprocess.DEVNULL, timeout=10, check=False)


async def _wait(client, run_id: str, predicate, timeout_s: float = 60.0) -> dict:
    import anyio

    end = time.monotonic() + timeout_s
    status = await call_ok(client, "run_status", {"run_id": run_id, "host": "box-a"})
    while not predicate(status) and time.monotonic() < end:
        await anyio.sleep(0.3)
        status = await call_ok(client, "run_status", {"run_id": run_id, "host": "box-a"})
    assert predicate(status), json.dumps(status, indent=1)[:3000]
    return status


@pytest.mark.anyio
async def test_gloo_run_over_mcp_through_a_host_survives_a_dropped_connection_and_stops(ssh_fleet, client):
    port = _free_port()
    python = str(ssh_fleet.boxes["box-a"].train_python)  # the user's training venv on the box
    started = await call_ok(client, "run_start", {
        "host": "box-a", "name": "gloo-remote", "cwd": str(FIXTURES),
        "argv": [python, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}",
                 str(FIXTURES / "train_gloo.py"), "100000", "0.05"]})
    assert started["host"] == "box-a" and started["run_id"]
    run_id = started["run_id"]
    box_runs = ssh_fleet.boxes["box-a"].home / ".cache" / "remote-gpu-trainer" / "runs"
    assert (box_runs / run_id / "meta.json").is_file()  # the ledger lives in the box's home
    status = await _wait(client, run_id, lambda s: ((s.get("progress") or {}).get("step") or 0) >= 3)
    assert status["state"] == "running" and status["progress"]["total"] == 100000

    _drop_connections(ssh_fleet)  # the agent's connection goes away; the run does not
    status = await _wait(client, run_id, lambda s: s["state"] == "running")
    pids = [p["pid"] for p in status["processes"]]
    assert len(pids) >= 3 and all(psutil.pid_exists(pid) for pid in pids)

    dry = await call_ok(client, "run_stop", {"run_id": run_id, "host": "box-a"})
    assert dry["dry_run"] and dry["confirm_token"]
    stopped = await call_ok(client, "run_stop", {"run_id": run_id, "host": "box-a", "dry_run": False,
                                                 "confirm_token": dry["confirm_token"], "grace_s": 10})
    assert stopped["verified"], stopped["summary"]
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert alive == []
    final = await _wait(client, run_id, lambda s: s["state"] == "killed", timeout_s=15)
    assert not final["processes"] and not any(g.get("used_bytes") for g in final["gpu"])
    listed = await call_ok(client, "run_list", {"host": "box-a"})
    assert run_id in [r["run_id"] for r in listed["runs"]]


def test_failing_run_on_a_host_reports_its_diagnosis(ssh_fleet, tmp_path):
    started = call("run_start", host="box-b", cwd=str(tmp_path),
                   argv=[str(ssh_fleet.boxes["box-b"].train_python), str(FIXTURES / "fail_unused_param.py")])
    end = time.monotonic() + 60
    status = call("run_status", host="box-b", run_id=started.run_id)
    while status.state in ("starting", "running") and time.monotonic() < end:
        time.sleep(0.3)
        status = call("run_status", host="box-b", run_id=started.run_id)
    assert status.state == "failed" and status.host == "box-b"
    assert status.diagnosis and status.diagnosis[0].id == "DIST-10"
    logs = call("run_logs", host="box-b", run_id=started.run_id, lines=5)
    assert logs.host == "box-b" and logs.text


def test_status_of_an_unreachable_box_says_what_is_likely(ssh_fleet):
    ssh_fleet.add_closed("box-gone")
    status = call("run_status", host="box-gone", run_id="20260101-000000-gone")
    assert status.state == "unreachable" and status.host == "box-gone"
    assert status.next_step
