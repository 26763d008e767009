"""What the supervisor follows: watched files and files the run writes (progress), a launcher that detaches
(`nohup … & exit 0`, a setsid'd child) with the exit codes it can know, and a stall decided from file progress
whatever the GPU says. Real processes, RGT_RUNS_DIR in a temporary folder, short thresholds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote_gpu_trainer.runs.ledger import RunDir
from remote_gpu_trainer.runs.tool import SPECS

TOOLS = {spec.name: spec for spec in SPECS}
PY = sys.executable


@pytest.fixture(autouse=True)
def _own_ledger(runs_dir):
    """Every test here gets its own run ledger (conftest.runs_dir)."""


def call(tool: str, **arguments):
    return TOOLS[tool].call(arguments)


def wait_status(run_id: str, predicate, timeout_s: float = 40.0):
    end = time.monotonic() + timeout_s
    status = call("run_status", run_id=run_id)
    while not predicate(status) and time.monotonic() < end:
        time.sleep(0.2)
        status = call("run_status", run_id=run_id)
    assert predicate(status), status.model_dump_json(indent=1)[:3000]
    return status


def quiet_for(run_id: str, seconds: float) -> list[str]:
    """Every state run_status reported over ``seconds`` (polled)."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(call("run_status", run_id=run_id).state)
        time.sleep(0.25)
    return seen


LOGS_TO_A_FILE = """import os, sys, time
os.makedirs("runs/exp1", exist_ok=True)
with open("runs/exp1/train.log", "a") as log:
    for step in range(1, {steps} + 1):
        log.write(f"step {{step}}/{steps} loss {{1 / step:.3f}}\\n")
        log.flush()
        time.sleep(0.2)
"""


def test_a_watched_log_file_keeps_the_run_from_stalling_and_status_names_it(tmp_path):
    started = call("run_start", argv=[PY, "-c", LOGS_TO_A_FILE.format(steps=40)], cwd=str(tmp_path),
                   watch=["runs/*/train.log"], stall_after_s=1.5)
    status = wait_status(started.run_id, lambda s: s.progress and (s.progress.step or 0) >= 3)
    assert status.follows and status.follows.endswith("runs/exp1/train.log")
    assert status.progress.total == 40
    assert "stalled" not in quiet_for(started.run_id, 4.0)  # stdout is silent all along


def test_a_file_the_run_holds_open_for_writing_counts_as_progress(tmp_path):
    started = call("run_start", argv=[PY, "-c", LOGS_TO_A_FILE.format(steps=40)], cwd=str(tmp_path),
                   stall_after_s=1.5)
    status = wait_status(started.run_id, lambda s: (s.progress and (s.progress.step or 0) >= 3))
    assert status.follows and status.follows.endswith("runs/exp1/train.log")
    assert "stalled" not in quiet_for(started.run_id, 4.0)


CHILD = """import sys, time
print("child up", flush=True)
steps = int(sys.argv[2])
for step in range(1, steps + 1):
    print(f"step {step}/{steps}", flush=True)
    time.sleep(0.2)
sys.exit(int(sys.argv[1]))
"""


def _launcher(tmp_path: Path, how: str, code: int, steps: int = 15) -> list[str]:
    (tmp_path / "child.py").write_text(CHILD)
    script = tmp_path / "launch.sh"
    script.write_text(f"#!/bin/sh\n{how} {PY} child.py {code} {steps} > child.log 2>&1 &\necho launched\nexit 0\n")
    script.chmod(0o755)
    return [str(script)]


@pytest.mark.parametrize("how", ["nohup", "setsid"])
def test_a_launcher_that_backgrounds_its_job_is_followed_until_the_job_ends(tmp_path, how):
    started = call("run_start", argv=_launcher(tmp_path, how, 5), cwd=str(tmp_path), watch=["child.log"])
    status = wait_status(started.run_id, lambda s: "launcher exited" in s.detail)
    assert status.state == "running" and "1 process continues" in status.detail
    assert [p.command.split()[-3:-1] for p in status.processes] == [["child.py", "5"]]
    final = wait_status(started.run_id, lambda s: s.state not in ("starting", "running"))
    # the supervisor is the job's subreaper: it reaped the re-parented child and knows its exit code
    assert (final.state, final.exit_code) == ("failed", 5), final.detail
    assert "launcher exited with code 0" in final.detail


def test_a_detached_job_that_succeeds_is_succeeded(tmp_path):
    started = call("run_start", argv=_launcher(tmp_path, "nohup", 0), cwd=str(tmp_path))
    wait_status(started.run_id, lambda s: s.state == "running" and "continues" in s.detail)
    final = wait_status(started.run_id, lambda s: s.state not in ("starting", "running"))
    assert (final.state, final.exit_code) == ("succeeded", 0)


def test_a_stall_is_declared_from_file_progress_while_the_gpu_spins_at_full_load(tmp_path, monkeypatch):
    """A rank hung in an NCCL collective keeps its GPU at 100 %: GPU load must not veto the stall."""
    from remote_gpu_trainer.runs import gpu
    from remote_gpu_trainer.runs.supervisor import StallWatch

    run = RunDir(tmp_path)
    (tmp_path / "log").write_text("step 1\n")
    rank = subprocess.Popen(["sleep", "60"])  # stands for a rank spinning in a collective: alive, writing nothing
    try:
        busy = [gpu.GpuUse(gpu=0, pid=rank.pid, used_bytes=1 << 30, gpu_util_percent=100)]
        monkeypatch.setattr(gpu, "run_gpu_use", lambda pids, backend=None, timeout_s=5.0: (busy, None))
        watch = StallWatch(run, 0.3)
        end = time.monotonic() + 10
        began = False
        while not began and time.monotonic() < end:
            began = watch.check({rank.pid})
            time.sleep(0.05)
        assert began, "no stall while the log stayed still and the GPU read 100 %"
    finally:
        rank.kill()
        rank.wait()


def test_run_stop_reaches_a_job_its_launcher_detached_with_setsid(tmp_path):
    """A setsid'd job leaves the launcher's session and group: run_stop still lists it, stops it, verifies."""
    started = call("run_start", argv=_launcher(tmp_path, "setsid", 0, steps=600), cwd=str(tmp_path))
    status = wait_status(started.run_id, lambda s: "continues" in s.detail)
    child = status.processes[0].pid
    dry = call("run_stop", run_id=started.run_id)
    assert [t.pid for t in dry.kill.targets if t.action == "would_signal"] == [child]
    stopped = call("run_stop", run_id=started.run_id, dry_run=False, confirm_token=dry.confirm_token, grace_s=5)
    assert stopped.verified, stopped.summary
    final = wait_status(started.run_id, lambda s: s.state not in ("starting", "running"))
    assert final.state == "killed" and "run_stop" in final.detail


FULL_DISK_JOB = """import os, subprocess, sys, time
print("started", flush=True)
while not os.path.exists("full"):
    time.sleep(0.05)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])  # a new member: members.json
with open("progress.log", "a") as out:  # a watched file moves: watch.json
    for step in range(8):
        out.write(f"step {{step}}\\n")
        out.flush()
        time.sleep(0.2)
helper.wait()
while not os.path.exists("{go_on}"):
    time.sleep(0.05)
"""


@pytest.fixture
def tiny_disk(runs_dir):
    """The run ledger on a 512 KiB tmpfs that the test can fill (ENOSPC for real): root only."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    runs_dir.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(runs_dir)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield runs_dir
    from tests.conftest import kill_runs

    kill_runs(runs_dir)
    time.sleep(0.5)
    subprocess.run(["umount", "-l", str(runs_dir)], check=False)


HOG = """import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
full = False
while not os.path.exists(sys.argv[2]):
    try:
        os.write(fd, b"\\0" * 4096)
    except OSError:  # full: take any page freed later too, as a process filling the disk would
        if not full:
            open(sys.argv[3], "w").close()
            full = True
        time.sleep(0.002)
os.close(fd)
os.unlink(sys.argv[1])
"""


def _fill(folder: Path, flags: Path) -> subprocess.Popen:
    """A process that fills ``folder``'s filesystem and keeps it full (ENOSPC for everyone else) until
    ``flags/free`` exists; returns once it is full."""
    hog = subprocess.Popen([PY, "-c", HOG, str(folder / "filler"), str(flags / "free"), str(flags / "filled")])
    end = time.monotonic() + 10
    while not (flags / "filled").exists() and time.monotonic() < end:
        time.sleep(0.02)
    assert (flags / "filled").exists(), "the filesystem did not fill"
    return hog


def test_a_full_disk_neither_kills_the_supervisor_nor_loses_the_end_notification(tmp_path, tiny_disk):
    """ENOSPC on the ledger while the run works: the supervisor goes on (the run does not read lost) and records
    the end once space is back; a run that ends while the disk is still full is notified all the same."""
    notes = tmp_path / "notes.jsonl"
    recorder = [PY, str(Path(__file__).parent / "fixtures" / "runs" / "notify_record.py"), str(notes), "{state}",
                "{message}"]
    work = tmp_path / "work"
    work.mkdir()
    first = call("run_start", argv=[PY, "-c", FULL_DISK_JOB.format(go_on="freed")], cwd=str(work),
                 watch=["progress.log"], notify=recorder, skip_checks=["disk"])
    second = call("run_start", argv=[PY, "-c", FULL_DISK_JOB.format(go_on="full")], cwd=str(work),
                  watch=["progress.log"], notify=recorder, skip_checks=["disk"])
    for run_id in (first.run_id, second.run_id):
        log = tiny_disk / run_id / "log"
        wait_status(run_id, lambda s, log=log: s.state == "running" and "started" in log.read_text())
    hog = _fill(tiny_disk, work)
    (work / "full").touch()  # both jobs now spawn a helper and write progress while every ledger write fails
    end = time.monotonic() + 30
    while len(notes.read_text().splitlines() if notes.exists() else []) < 1 and time.monotonic() < end:
        time.sleep(0.2)
    [ended_full] = [json.loads(line) for line in notes.read_text().splitlines()]
    assert ended_full["argv"][0] == "succeeded" and "lost" in ended_full["argv"][1], ended_full["argv"]
    assert ended_full["env"]["RGT_RUN_ID"] == second.run_id
    (work / "free").touch()
    hog.wait(timeout=10)
    (work / "freed").touch()
    status = wait_status(first.run_id, lambda s: s.state not in ("running", "stalled"))
    assert status.state == "succeeded", status.detail
    end = time.monotonic() + 15  # the notification follows exit.json
    while len(notes.read_text().splitlines()) < 2 and time.monotonic() < end:
        time.sleep(0.1)
    assert [json.loads(line)["argv"][0] for line in notes.read_text().splitlines()] == ["succeeded", "succeeded"]


def test_a_stall_is_judged_on_the_stacks_just_taken_not_on_an_older_stacks_json(tmp_path, tiny_disk):
    """The previous stall's stacks.json said 'progressing'; this stall's stacks cannot be written (full disk). The
    supervisor must judge the stacks it just took (not moving: a stall), not re-read the stale file and postpone."""
    from remote_gpu_trainer.runs.hang import STACKS, on_stall
    from remote_gpu_trainer.runs.supervisor import StallWatch, _watch_stall

    started = call("run_start", argv=[PY, "-c", "import time; time.sleep(120)"], cwd=str(tmp_path),
                   rank_hook=False, stall_after_s=600, skip_checks=["disk"])
    run = RunDir(tiny_disk / started.run_id)
    wait_status(started.run_id, lambda s: s.state == "running")
    on_stall(run)  # an earlier stall's stacks.json, then edited as if its stacks had moved
    earlier = json.loads(run.file(STACKS).read_text())
    assert earlier["finding"] != "progressing", earlier["verdict"]
    run.write(STACKS, {**earlier, "finding": "progressing"})
    stall = StallWatch(run, 0.2)
    time.sleep(0.5)
    hog = _fill(tiny_disk, tmp_path)
    try:
        _watch_stall(run, run.meta(), stall, [started.pid])
    finally:
        (tmp_path / "free").touch()
        hog.wait(timeout=10)
    assert stall.stalled, "postponed on the stale 'progressing' of the previous stall's stacks.json"


def test_watch_globs_are_looked_up_on_the_scan_throttle_and_a_forced_poll_still_finds_a_late_log(tmp_path,
                                                                                                 monkeypatch):
    """A ``**`` glob over a big tree every poll (about once a second) is costly: globs share the open-file scan's
    throttle; the final poll(force=True) still finds a log that appeared in the run's last moments."""
    import glob as glob_module

    from remote_gpu_trainer.runs.watch import ProgressFiles

    (tmp_path / "run").mkdir()
    (tmp_path / "logs").mkdir()
    files = ProgressFiles(RunDir(tmp_path / "run"), {"cwd": str(tmp_path), "watch": ["logs/**/*.log"],
                                                     "stall_after_s": 900})
    calls = []
    real_glob = glob_module.glob
    monkeypatch.setattr(glob_module, "glob", lambda *a, **k: (calls.append(a), real_glob(*a, **k))[1])
    for _ in range(10):
        files.poll([])
    assert len(calls) == 1, f"{len(calls)} glob lookups in 10 quick polls"
    (tmp_path / "logs" / "late.log").write_text("step 1\n")
    files.poll([])
    assert str(tmp_path / "logs" / "late.log") not in files.sources  # not looked up again yet
    files.poll([], force=True)
    assert files.sources.get(str(tmp_path / "logs" / "late.log")) == "watch 'logs/**/*.log'"
