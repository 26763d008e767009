"""run_pull and box_idle end to end through a loopback SSH box (tests/sshbox.py): the box's custody
record is written over ssh, and box_idle on the box then counts the pulled run as copied off."""

from __future__ import annotations

import json
import time

import pytest

from remote_gpu_trainer.idle.tool import SPECS

from .conftest import call_ok

BOX_IDLE, RUN_PULL = SPECS[0], SPECS[2]


def test_pull_through_ssh_verifies_and_box_idle_then_sees_it_copied(ssh_fleet, tmp_path):
    ssh_fleet.add("idlebox", scenario="idle-8xh100")
    ssh_fleet.install_runtime("idlebox")
    home = ssh_fleet.boxes["idlebox"].home
    run = home / ".cache" / "remote-gpu-trainer" / "runs" / "run-1"
    (run / "ckpt").mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"pgid": None}))
    (run / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": time.time() - 60}))
    (run / "ckpt" / "last.pt").write_bytes(b"w" * 100_000)

    before = BOX_IDLE.call({"window_s": 0, "host": "idlebox"})
    assert before.verdict == "idle" and before.unsynced_count == 3 and not before.terminate_safe

    pulled = RUN_PULL.call({"host": "idlebox", "run_id": "run-1", "dest": str(tmp_path / "local")})
    assert pulled.verdict == "verified", pulled.rsync_tail
    assert pulled.verified == 3 and pulled.recorded_on_box == 3
    assert (tmp_path / "local" / "run-1" / "ckpt" / "last.pt").read_bytes() == b"w" * 100_000

    after = BOX_IDLE.call({"window_s": 0, "host": "idlebox"})
    assert after.unsynced_count == 0 and after.terminate_safe


@pytest.mark.anyio
async def test_over_mcp_idle_box_custody_pull_then_the_guard_stops_it_after_the_window(ssh_fleet, server, tmp_path):
    """Issue 21's whole path through a loopback host: idle with its cost and the provider's commands, an
    unsynced checkpoint listed, pulled back verified, then the armed guard runs the (fake) provider stop
    after the idle window and not before."""
    from mcp import Client

    alias = "guard-e2e"
    home = ssh_fleet.root / "homes" / alias
    (home / "bin").mkdir(parents=True)
    record = home / "runpodctl.calls"
    fake = home / "bin" / "runpodctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\n")
    fake.chmod(0o755)
    ssh_fleet.add(alias, scenario="idle-8xh100", env={"RUNPOD_POD_ID": "pod-e2e"}, bin_dirs=[home / "bin"])
    ssh_fleet.install_runtime(alias)
    run = home / ".cache" / "remote-gpu-trainer" / "runs" / "run-e2e"
    (run / "ckpt").mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"pgid": None}))
    (run / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": time.time() - 3600}))
    (run / "ckpt" / "step-1000.pt").write_bytes(b"c" * 200_000)

    async with Client(server, mode="legacy") as client:
        idle = await call_ok(client, "box_idle", {"host": alias, "window_s": 1, "interval_s": 0.5,
                                                  "price_per_hour": 2.5})
        assert idle["host"] == alias and idle["verdict"] == "idle"
        assert idle["provider"]["name"] == "runpod" and idle["idle_cost"] and idle["idle_cost"] > 0
        assert idle["stop"]["command"]["inside"].startswith("runpodctl stop pod")
        assert idle["terminate"]["command"]["inside"] and idle["terminate"]["wipes"]
        assert any(u["path"].endswith("step-1000.pt") for u in idle["unsynced"]) and not idle["terminate_safe"]

        dry = await call_ok(client, "idle_guard", {"host": alias, "action": "stop", "idle_minutes": 0.05,
                                                   "interval_s": 0.2})
        assert dry["mode"] == "dry_run" and dry["confirm_token"] and dry["argv"][:2] == ["runpodctl", "stop"]

        pulled = await call_ok(client, "run_pull", {"host": alias, "run_id": "run-e2e", "dest": str(tmp_path)})
        assert pulled["verdict"] == "verified"
        assert (tmp_path / "run-e2e" / "ckpt" / "step-1000.pt").read_bytes() == b"c" * 200_000
        assert (await call_ok(client, "box_idle", {"host": alias, "window_s": 0}))["terminate_safe"]

        armed_at = time.time()
        armed = await call_ok(client, "idle_guard", {"host": alias, "action": "stop", "idle_minutes": 0.05,
                                                     "interval_s": 0.2, "dry_run": False,
                                                     "confirm_token": dry["confirm_token"]})
        assert armed["mode"] == "armed" and armed["armed"]
        time.sleep(1.0)
        assert not record.exists()  # idle, but not yet for the whole 3 s window
        deadline = time.time() + 30
        while not record.exists() and time.time() < deadline:
            time.sleep(0.2)
        assert record.read_text().split() == ["stop", "pod", "pod-e2e"] and time.time() - armed_at >= 3
        shown = await call_ok(client, "box_idle", {"host": alias, "window_s": 0})
        assert "runpodctl stop pod pod-e2e" in (shown["guard"]["notice"] or "")
