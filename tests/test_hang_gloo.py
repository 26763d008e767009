"""Hang forensics on real 4-rank gloo jobs under torchrun, started with run_start and watched by the supervisor.

Five runs start at once (module fixture) so their torch imports overlap: rank 2 skips an all_reduce, rank 1
sleeps inside ``__getitem__``, rank 3 is stuck and then SIGKILLed, rank 1 sends a tensor of another size
(with the flight recorder on), and a healthy run. Each hanging run goes quiet after step 2; the supervisor
marks it stalled after ``STALL_S``, takes every rank's stack once and keeps the verdict in stacks.json,
which run_status shows and the notification carries.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from remote_gpu_trainer.processes.snapshot import ProcessTable
from remote_gpu_trainer.registry import all_specs

from .conftest import kill_runs

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
SCENARIOS = FIXTURES / "hang_scenarios.py"
TOOLS = {spec.name: spec for spec in all_specs()}
STALL_S = 3.0
LINE = {m.group(1): n for n, text in enumerate(SCENARIOS.read_text().splitlines(), 1)
        if (m := re.search(r"# <- (\w+)", text))}


def call(tool: str, **arguments):
    return TOOLS[tool].call(arguments)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(scenario: str, python: str = sys.executable) -> list[str]:
    """The command of one scenario: 4 ranks, gloo, a free port. ``python`` is the interpreter that has torch."""
    return [python, "-m", "torch.distributed.run", "--nproc-per-node=4", f"--master-port={_free_port()}",
            str(SCENARIOS), scenario]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hang")
    saved = {k: os.environ.get(k) for k in ("RGT_RUNS_DIR", "RGT_HEALTH_FAKE")}
    os.environ["RGT_RUNS_DIR"] = str(folder / "runs")
    os.environ.pop("RGT_HEALTH_FAKE", None)
    notes = folder / "notes.jsonl"
    notify = [sys.executable, str(FIXTURES / "notify_to_file.py"), str(notes)]
    started = {}
    try:
        for scenario in ("getitem", "skip", "stuck", "size", "healthy"):
            started[scenario] = call("run_start", argv=torchrun(scenario), cwd=str(folder), name=scenario,
                                     stall_after_s=STALL_S, notify=notify, flight_recorder=scenario == "size",
                                     skip_checks=["port"]).run_id
        yield started, notes
    finally:
        kill_runs(folder / "runs")
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def wait_status(run_id: str, predicate, timeout_s: float = 120.0):
    end = time.monotonic() + timeout_s
    status = call("run_status", run_id=run_id)
    while not predicate(status) and time.monotonic() < end:
        time.sleep(0.3)
        status = call("run_status", run_id=run_id)
    assert predicate(status), status.model_dump_json(indent=1)[:4000]
    return status


def hung(status) -> bool:
    """Stalled after step 2 with the stacks of the hang taken. A loaded machine can also go quiet for STALL_S
    while torch starts: that stall's stacks move ("progressing"), and it clears when step 1 is printed."""
    return (status.state == "stalled" and (status.progress.step or 0) >= 2 and status.hang is not None
            and status.hang.finding != "progressing")


def wait_verdict(run_id: str):
    status = wait_status(run_id, hung)
    print(f"\n{run_id}: {status.hang.verdict}")
    return status


def site(name: str) -> str:
    return f"`hang_scenarios.py:{LINE[name]}`"


def test_rank_that_skips_an_all_reduce_is_named_and_the_others_collective_given(runs):
    status = wait_verdict(runs[0]["skip"])
    assert status.hang.verdict == (f"ranks 0, 1, 3 wait in `all_reduce` at {site('metric')}; rank 2 waits in "
                                   f"`barrier` at {site('barrier')} (DIST-13)")
    assert (status.hang.odd_ranks, status.hang.collective, status.hang.entry.id) == ([2], "all_reduce", "DIST-13")
    assert f"where: {status.hang.verdict}" in TOOLS["run_status"].render_text(status)


def test_rank_stuck_in_getitem_is_named_with_its_workers_line_and_notified(runs):
    run_id = runs[0]["getitem"]
    status = wait_verdict(run_id)
    verdict = status.hang.verdict
    assert verdict.startswith(f"ranks 0, 2, 3 wait in `all_reduce` at {site('grads')}; rank 1 is in "
                              f"`DataLoader.__next__` → {site('getitem')} (`__getitem__`, worker pid ")
    assert verdict.endswith("(DATA-11)") and status.hang.odd_ranks == [1]
    stored = json.loads(Path(status.hang.file).read_text())
    rank1 = next(p for p in stored["processes"] if p["rank"] == 1 and p["role"] == "rank")
    assert rank1["mechanism"] == "signal" and rank1["samples"] == 3 and rank1["moving"] is False
    end = time.monotonic() + 30
    while time.monotonic() < end:
        notes = [json.loads(line) for line in runs[1].read_text().splitlines()] if runs[1].exists() else []
        mine = [n for n in notes if n["RGT_RUN_ID"] == run_id and n["RGT_RUN_STATE"] == "stalled"
                and "DataLoader" in n["RGT_RUN_DIAGNOSIS"]]
        if mine:
            break
        time.sleep(0.2)
    assert mine and mine[-1]["RGT_RUN_DIAGNOSIS"].startswith(verdict), "notify carries the one-line verdict"


def test_mismatched_sizes_are_named_by_the_flight_recorder(runs):
    status = wait_verdict(runs[0]["size"])
    assert status.hang.verdict.startswith(f"ranks 0, 2, 3 wait in `barrier` at {site('barrier')}; rank 1 waits in "
                                          f"`all_reduce` at {site('metric')}; flight recorder: collective #")
    assert "differs in sizes: rank 1 [[2]]; ranks 0, 2, 3 [[1]]" in status.hang.verdict
    report = call("run_stacks", run_id=runs[0]["size"], samples=2, interval_s=0.1)
    fr = report.flight_recorder
    assert [(m.aspect, m.by_value) for m in fr.mismatches] == [("sizes", {"[[2]]": [1], "[[1]]": [0, 2, 3]})]
    assert fr.never_entered[0].missing == [1] and fr.never_entered[0].op == "barrier"
    assert sorted(r.rank for r in fr.ranks) == [0, 1, 2, 3]


def test_stuck_rank_then_sigkilled_names_it_at_the_stall_and_at_the_end(runs):
    run_id = runs[0]["stuck"]
    status = wait_verdict(run_id)
    assert status.hang.verdict == (f"ranks 0–2 wait in `all_reduce` at {site('grads')}; rank 3 is in `slow_io` at "
                                   f"{site('slow_io')} (DIST-14)")
    fresh = call("run_stacks", run_id=run_id)
    assert fresh.verdict == status.hang.verdict and fresh.took_s < 5
    rank3 = next(p for p in fresh.processes if p.rank == 3 and p.role == "rank")
    assert all(psutil.Process(p.pid).status() != "stopped" for p in fresh.processes), "sampling stops no one"
    os.kill(rank3.pid, signal.SIGKILL)
    ended = wait_status(run_id, lambda s: s.state == "failed")
    assert ended.hang.verdict.endswith(f"at the end: rank 3 (pid {rank3.pid}) failed first: exit code -9 (SIGKILL); "
                                       "torchrun then stopped ranks 0–2")
    assert ended.hang.verdict.startswith(f"at the stall: ranks 0–2 wait in `all_reduce` at {site('grads')}")
    print(f"\n{run_id}: {ended.hang.verdict}")


def test_healthy_run_is_progressing_and_keeps_running_after_sampling(runs):
    run_id = runs[0]["healthy"]
    wait_status(run_id, lambda s: (s.progress.step or 0) >= 5)
    ranks = sorted(p.pid for p in call("run_stacks", run_id=run_id, samples=2).processes if p.role == "rank")
    for _ in range(3):
        report = call("run_stacks", run_id=run_id, samples=4, interval_s=0.05)
        assert report.finding == "progressing", report.verdict
    assert report.verdict.startswith("all 4 ranks progressing (") and report.verdict.endswith("nothing odd")
    print(f"\n{run_id}: {report.verdict}")
    assert report.entry is None and report.odd_ranks == []
    before = call("run_status", run_id=run_id).progress.step
    after = wait_status(run_id, lambda s: (s.progress.step or 0) >= before + 10, timeout_s=60)
    assert after.state == "running" and after.hang is None
    assert sorted(p.pid for p in report.processes if p.role == "rank") == ranks
    assert all(psutil.Process(pid).status() not in ("stopped", "zombie") for pid in ranks)


def _py_spy_cannot_read() -> str:
    """Why py-spy cannot read a process here ('' when it can): not installed, or no ptrace (a container without
    CAP_SYS_PTRACE, Yama's scope 2-3). Where it can, the test must pass; where it cannot, it says why it skipped."""
    if shutil.which("py-spy") is None:
        return "py-spy not installed (the dev extra has it: pip install -e '.[dev]')"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        done = subprocess.run(["py-spy", "dump", "--nonblocking", "--pid", str(child.pid)], capture_output=True,
                              text=True, timeout=30)
        return "" if done.returncode == 0 else f"py-spy cannot read a process here: {done.stderr.strip()[:200]}"
    finally:
        child.kill()
        child.wait()


def test_a_job_started_by_hand_is_read_with_py_spy(tmp_path):
    """No rank hook: the pid of a torchrun the user started; py-spy reads each rank without stopping it."""
    why = _py_spy_cannot_read()
    if why:
        pytest.skip(why)
    job = subprocess.Popen(torchrun("stuck"), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        end = time.monotonic() + 120
        report = call("run_stacks", pid=job.pid, samples=2)
        # during start-up the ranks are odd too (one still in init_process_group): wait for the hang itself
        while not (report.finding == "odd_ranks" and "all_reduce" in report.verdict) and time.monotonic() < end:
            time.sleep(1)
            report = call("run_stacks", pid=job.pid, samples=2)
        print(f"\npid {job.pid}: {report.verdict}")
        assert report.verdict == (f"ranks 0–2 wait in `all_reduce` at {site('grads')}; rank 3 is in `slow_io` at "
                                  f"{site('slow_io')} (DIST-14)")
        assert {p.mechanism for p in report.processes if p.role == "rank"} == {"py-spy"}
    finally:
        for pid in reversed([job.pid, *ProcessTable.read().descendants(job.pid)]):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        job.wait()
