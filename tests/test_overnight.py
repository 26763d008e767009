"""The overnight journey of issue 26, through ``host``, on loopback boxes with no NVML whose runtime has no MCP SDK.

A user says: "start my run (``./launch.sh`` backgrounds it), tell me through ``notify-me`` if it dies or hangs,
and stop the pod (never terminate) once nothing useful has run for a while; I'm going to bed." The agent makes
exactly the calls the issue names, then its ssh session goes away (pool closed, ControlMaster ended). Three boxes
at once: a run that hangs (its checkpoint folder, a 1 MiB tmpfs, will fill), one that dies with an error, one that
succeeds. What must happen on each box without anyone connected: the person is notified (the hang within the
stall window with the run's name, the error with its diagnosis), the guard warns before it stops and tells after,
the stop (a fake ``runpodctl``) comes after the idle window and never before, and terminate is never called.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from remote_gpu_trainer.registry import all_specs

from .test_runs_remote import _drop_connections

pytestmark = pytest.mark.slow

SPECS = {spec.name: spec for spec in all_specs()}
STALL_S = 4.0
IDLE_MINUTES = 0.1  # 6 s
WARN_MINUTES = 0.05  # 3 s before the stop
LAUNCH = """#!/bin/sh
# the user's launcher: starts training in the background and returns at once
cd "$(dirname "$0")"
mkdir -p runs/nightly
nohup "$HOME/venvs/pt/bin/python" train.py > runs/nightly/train.log 2>&1 &
echo "training started, pid $!"
exit 0
"""
TRAIN = """import os, sys, time, zipfile
MODE = {mode!r}
for step in range(1, 16):
    print(f"step {{step}}/1000 loss {{1 / step:.4f}}", flush=True)
    if MODE == "hang" and step in (5, 10):
        with zipfile.ZipFile(f"ckpt/checkpoint-{{step}}.pt", "w") as archive:
            archive.writestr(f"checkpoint-{{step}}/data.pkl", b"\\x80\\x02}}q\\x00.")
            archive.writestr(f"checkpoint-{{step}}/data/0", os.urandom(300_000))
    if MODE == "error" and step == 10:
        raise RuntimeError("Expected to have finished reduction in the prior iteration before starting a new "
                           "one. This error indicates that your module has parameters that were not used in "
                           "producing loss.")
    time.sleep(0.2)
if MODE == "hang":
    time.sleep(3600)  # a rank stuck in a collective: alive, silent
print("training complete", flush=True)
"""
RECORD = '#!/bin/sh\nprintf "%s\\t%s\\n" "$(date +%s.%N)" "$*" >> "$HOME/{name}.log"\n'


@dataclass
class Night:
    kind: str
    alias: str
    home: Path
    project: Path
    run_id: str = ""

    def lines(self, name: str) -> list[tuple[float, str]]:
        path = self.home / f"{name}.log"
        if not path.exists():
            return []
        return [(float(at), text) for at, text in (line.split("\t", 1) for line in path.read_text().splitlines())]

    def events(self) -> list[dict]:
        path = self.home / ".cache" / "remote-gpu-trainer" / "guard" / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def call(tool: str, **arguments):
    return SPECS[tool].call(arguments)


def _box(fleet, kind: str) -> Night:
    alias = f"night-{kind}"
    home = fleet.root / "homes" / alias
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("runpodctl", "notify-me"):
        (bin_dir / name).write_text(RECORD.format(name=name))
        (bin_dir / name).chmod(0o755)
    fleet.add(alias, scenario="no-driver", env={"RUNPOD_POD_ID": f"pod-{kind}"}, bin_dirs=[bin_dir])
    fleet.install_runtime(alias)
    project = home / "proj"
    (project / "ckpt").mkdir(parents=True)
    (project / "launch.sh").write_text(LAUNCH)
    (project / "launch.sh").chmod(0o755)
    (project / "train.py").write_text(TRAIN.format(mode=kind))
    return Night(kind, alias, home, project)


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return predicate()


def test_overnight_hang_error_and_success_are_notified_and_the_pod_is_stopped_after_the_idle_window(ssh_fleet):
    from .test_box_runtime import _failed_in_runtime

    nights = [_box(ssh_fleet, kind) for kind in ("hang", "error", "ok")]
    hang = nights[0]
    # The hang's checkpoint folder is a 1 MiB tmpfs that will fill. Mounting it needs root; without root (or with
    # RGT_TEST_NO_TMPFS=1) the night runs on a plain folder and only the checkpoint verdict goes unchecked.
    tmpfs = os.geteuid() == 0 and not os.environ.get("RGT_TEST_NO_TMPFS") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(hang.project / "ckpt")]).returncode == 0
    try:
        assert set(_failed_in_runtime(ssh_fleet, hang.alias, [], ["mcp", "torch"])) == {"mcp", "torch"}
        t0 = time.time()
        for night in nights:  # what the agent calls, through host
            extra = {"checkpoint_dir": "ckpt", "save_every_steps": 5} if night.kind == "hang" else {}
            started = call("run_start", host=night.alias, command="./launch.sh", cwd=str(night.project),
                           name="nightly", watch=["runs/*/train.log"], notify=["notify-me", "{message}"],
                           stall_after_s=STALL_S, **extra)
            night.run_id = started.run_id
            plan = dict(host=night.alias, action="stop", idle_minutes=IDLE_MINUTES, warn_minutes=WARN_MINUTES,
                        on_stalled=True, interval_s=0.5, allow_unsynced=True, notify=["notify-me", "{message}"])
            dry = call("idle_guard", **plan)
            assert "GPU load cannot be read" in dry.plan and dry.argv == ["runpodctl", "stop", "pod",
                                                                          f"pod-{night.kind}"]
            assert call("idle_guard", **plan, dry_run=False, confirm_token=dry.confirm_token).armed
        _drop_connections(ssh_fleet)  # the agent's ssh session is gone; nobody is connected from here on

        assert _wait_for(lambda: all(n.lines("runpodctl") and len(n.lines("notify-me")) >= 4 for n in nights),
                         180), {n.kind: (n.lines("notify-me"), n.events()[-3:]) for n in nights}
        timeline = []
        for night in nights:
            notes, stops = night.lines("notify-me"), night.lines("runpodctl")
            idle = [e for e in night.events() if e["event"] == "idle"]
            assert [text for _, text in stops] == [f"stop pod pod-{night.kind}"]  # the stop, never remove/terminate
            stop_at, idle_at = stops[0][0], idle[-1]["at"]
            assert stop_at - idle_at >= IDLE_MINUTES * 60 - 0.05, "stopped before the idle window was over"
            first, *rest = notes
            assert night.run_id in first[1], first
            if night.kind == "hang":
                log_quiet_since = (night.project / "runs" / "nightly" / "train.log").stat().st_mtime
                assert "STALLED" in first[1] and "runs/nightly/train.log" in first[1]
                assert STALL_S <= first[0] - log_quiet_since <= STALL_S + 30, (first, log_quiet_since)
            elif night.kind == "error":
                assert "FAILED" in first[1] and "DIST-10" in first[1] and "exit code 1" in first[1]
            else:
                assert "succeeded" in first[1] and "exit code 0" in first[1]
            warning = next(at for at, text in rest if "will stop" in text)
            stopped = next(at for at, text in rest if "stopped" in text and "runpodctl stop pod" in text)
            assert idle_at <= warning < stop_at <= stopped
            timeline += [(at - t0, night.kind, text) for at, text in notes]
            timeline += [(stop_at - t0, night.kind, "runpodctl " + stops[0][1]), (idle_at - t0, night.kind,
                                                                                     "guard: idle")]
        print("\novernight timeline (s after the first run_start):")
        for at, kind, text in sorted(timeline):
            print(f"  {at:6.1f}  {kind:5}  {text[:150]}")

        # a new connection in the morning: every tool still answers, and says what happened
        states = {n.kind: call("run_status", host=n.alias, run_id=n.run_id) for n in nights}
        assert states["hang"].state == "stalled" and states["hang"].follows.endswith("runs/nightly/train.log")
        if tmpfs:
            assert states["hang"].checkpoints.verdict == "FAIL" and "tmpfs" in states["hang"].checkpoints.summary
        else:
            assert states["hang"].checkpoints.verdict in ("PASS", "WARN"), states["hang"].checkpoints
        assert (states["error"].state, states["error"].exit_code) == ("failed", 1)
        assert states["error"].diagnosis[0].id == "DIST-10"
        assert (states["ok"].state, states["ok"].exit_code) == ("succeeded", 0)
        idle = call("box_idle", host=hang.alias, window_s=0)
        assert [r.checkpoints.verdict for r in idle.runs if r.run_id == hang.run_id] == [
            states["hang"].checkpoints.verdict]
    finally:
        for night in nights:
            if night.run_id:
                try:
                    dry = call("run_stop", host=night.alias, run_id=night.run_id)
                    if dry.confirm_token:
                        call("run_stop", host=night.alias, run_id=night.run_id, dry_run=False,
                             confirm_token=dry.confirm_token, grace_s=2)
                    call("idle_guard", host=night.alias, remove=True)
                except Exception as err:  # cleanup must reach every box
                    print(f"cleanup of {night.alias}: {err}")
        if tmpfs:
            subprocess.run(["umount", "-l", str(hang.project / "ckpt")], capture_output=True)
