"""Runs the skill did not start: run_status / run_logs by pid, by a process pattern (shown resolved to pids)
or by log path; state from the process, progress and stall from the log, diagnosis on its tail; run_adopt puts
such a run in the ledger, watched (exit status unknown: its supervisor is not its parent), notified, and seen by
the idle guard's ledger."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.registry import all_specs

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
RECORDER = str(FIXTURES / "notify_record.py")
TOOLS = {spec.name: spec for spec in all_specs()}

HAND_RUN = """import sys, time
# {marker}
for step in range(1, 6):
    print(f"step {{step}}/100 loss {{1 / step:.3f}}", flush=True)
    time.sleep(0.1)
if sys.argv[1] == "fail":
    raise RuntimeError("Expected to have finished reduction in the prior iteration before starting a new one. "
                       "This error indicates that your module has parameters that were not used in producing loss.")
time.sleep(600)  # hung: alive, silent
"""


@pytest.fixture(autouse=True)
def _own_ledger(runs_dir):
    """Every test here gets its own run ledger (conftest.runs_dir)."""


@pytest.fixture
def hand_run(tmp_path):
    """Start a job by hand, as a user does with `nohup python train.py > train.log 2>&1 &`."""
    started: list[subprocess.Popen] = []

    def start(mode: str = "hang") -> tuple[subprocess.Popen, Path, str]:
        marker = f"hand-train-{uuid.uuid4().hex[:8]}"
        log = tmp_path / f"{marker}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-c", HAND_RUN.format(marker=marker), mode], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
                                    start_new_session=True)
        started.append(proc)
        return proc, log, marker

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def call(tool: str, **arguments):
    return TOOLS[tool].call(arguments)


def until(fn, predicate, timeout_s: float = 30.0):
    end = time.monotonic() + timeout_s
    value = fn()
    while not predicate(value) and time.monotonic() < end:
        time.sleep(0.2)
        value = fn()
    assert predicate(value), value.model_dump_json(indent=1)[:3000] if hasattr(value, "model_dump_json") else value
    return value


def test_status_by_pid_finds_the_log_it_writes_and_a_quiet_one_is_stalled(hand_run):
    proc, log, _marker = hand_run()
    status = until(lambda: call("run_status", pid=proc.pid, stall_after_s=1.5),
                   lambda s: s.progress and s.progress.step == 5)
    assert status.run_id is None and status.resolved_pids == [proc.pid]
    assert status.follows == str(log)  # its stdout, a regular file it holds open for writing
    assert status.state in ("running", "stalled")
    stalled = until(lambda: call("run_status", pid=proc.pid, stall_after_s=1.5), lambda s: s.state == "stalled")
    assert str(log) in stalled.detail and "1.5" in stalled.detail
    assert call("run_logs", pid=proc.pid, lines=2).text == "step 4/100 loss 0.250\nstep 5/100 loss 0.200\n"


def test_a_pattern_shows_the_pids_it_resolved_to_and_never_reaches_run_stop(hand_run):
    proc, log, marker = hand_run()
    status = call("run_status", pattern=marker, logs=[str(log)])
    assert status.resolved_pids == [proc.pid] and status.pattern == marker
    with pytest.raises(InputError, match="pattern"):
        TOOLS["run_stop"].validate({"pattern": marker})
    with pytest.raises(InputError, match="pattern"):
        call("run_status", pattern="no-process-has-this-in-its-command-line-" + uuid.uuid4().hex)


def test_a_dead_hand_started_run_is_ended_with_the_diagnosis_of_its_log(hand_run):
    proc, log, _marker = hand_run("fail")
    proc.wait(timeout=30)
    status = call("run_status", logs=[str(log)])
    assert status.state == "ended" and "exit status unknown" in status.detail
    assert status.diagnosis and status.diagnosis[0].id == "DIST-10"


def test_adopt_watches_a_hand_started_run_notifies_its_stall_and_its_end(hand_run, tmp_path):
    from remote_gpu_trainer.idle.ledger import our_runs

    proc, log, _marker = hand_run()
    notes = tmp_path / "notes.jsonl"
    adopted = call("run_adopt", pid=proc.pid, name="by-hand", stall_after_s=1.5,
                   notify=[sys.executable, RECORDER, str(notes), "{state}", "{message}"])
    assert adopted.run_id and "by-hand" in adopted.run_id and adopted.follows == str(log)
    stalled = until(lambda: call("run_status", run_id=adopted.run_id), lambda s: s.state == "stalled")
    assert stalled.adopted and str(log) in stalled.detail
    assert [r.state for r in our_runs(stall_s=3600) if r.run_id == adopted.run_id] == ["stalled"]
    assert proc.pid in next(r.pids for r in our_runs(stall_s=3600) if r.run_id == adopted.run_id)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ended = until(lambda: call("run_status", run_id=adopted.run_id), lambda s: s.state not in ("stalled", "running"))
    assert ended.state == "ended" and "exit status unknown" in ended.detail
    until(lambda: notes.read_text().splitlines() if notes.exists() else [], lambda lines: len(lines) >= 2)
    notes_seen = [json.loads(line)["argv"] for line in notes.read_text().splitlines()]
    assert [n[0] for n in notes_seen] == ["stalled", "ended"]
    assert all(adopted.run_id in n[1] for n in notes_seen)
