"""Server side of the repro worker: start it, feed it jobs, enforce time limits, survive hangs and crashes.

The server never imports torch. It starts ``python -m remote_gpu_trainer.repro.worker`` in its own
process group (so a kill also takes any forked ranks), reads one JSON event per line, and gives
each job ``timeout_s`` from its ``start`` event. A job that overruns is reported as ``timeout``, a
worker that dies mid-job as ``crashed`` (with the tail of its stderr); either way the worker is
killed and a fresh one picks up the jobs that have not run, so one bad case never costs the others.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..toolspec import Progress, no_progress
from ..torch_hint import INSTALL_HINT, no_training_torch, torch_missing
from ..trainenv.child import child_environ
from ..trainenv.find import TrainingEnv, find_training_env

IMPORT_TIMEOUT_S = 180.0
"""Limit for interpreter start + ``import torch`` + the first optimizer (2–8 s on a busy 2-core box)."""
GRACE_S = 0.5
"""Slack past a job's limit for its result line to arrive (distributed ranks get less than the limit)."""


@dataclass(frozen=True)
class Job:
    case: str
    variant: str


@dataclass
class WorkerRun:
    """What the workers reported: torch facts from the first ``ready`` and one raw result per job."""

    results: list[dict[str, Any]]
    torch_version: str | None = None
    device: str | None = None
    cuda_available: bool | None = None
    worker_start_s: float | None = None
    workers: int = 0
    notes: list[str] = field(default_factory=list)
    torch_missing: str | None = None
    """Set when the worker could not import torch: what happened and how to add it (jobs are ``not_run``)."""
    training: TrainingEnv | None = None
    """The interpreter the workers ran under, and how it was found."""


def failed(job: Job, status: str, detail: str) -> dict[str, Any]:
    """A raw result for a job that produced no observation (timeout, crash, worker failure)."""
    return {"case": job.case, "variant": job.variant, "status": status, "detail": detail}


def _worker_env(training: TrainingEnv, device: str, extra: dict[str, str] | None) -> dict[str, str]:
    # is_available() without initialising CUDA before the fork
    env = child_environ(training, {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"})
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def _torch_problem(event: dict[str, Any]) -> str:
    """The one sentence a user reads when the worker's ``import torch`` failed."""
    if event["kind"] == "torch_missing":
        return torch_missing(event["message"], event.get("python"))
    return (f"torch is installed but does not import in {event.get('python')} ({event['message']}): "
            f"reinstall it; {INSTALL_HINT}")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()
    proc.wait()


def _reader(stream, events: queue.Queue) -> None:
    for line in stream:
        try:
            events.put(json.loads(line))
        except ValueError:
            continue
    events.put(None)


def _tail(path: str, limit: int = 1500) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    lines = [ln for ln in text.splitlines() if ln.strip() and "Failed to initialize NumPy" not in ln]
    return "\n".join(lines)[-limit:]


def _describe_exit(rc: int | None, stderr_tail: str) -> str:
    if rc is not None and rc < 0:
        try:
            how = f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            how = f"killed by signal {-rc}"
    else:
        how = f"exited with status {rc}"
    return f"worker {how}" + (f"; stderr tail:\n{stderr_tail}" if stderr_tail else "")


def _run_once(jobs: list[Job], pending: list[int], run: WorkerRun, device: str, timeout_s: float,
              progress: Progress, extra_env: dict[str, str] | None, total: int, training: TrainingEnv) -> bool:
    """Run ``pending`` job indexes in one worker; return False if the worker cannot run at all."""
    request = {"jobs": [{"case": jobs[i].case, "variant": jobs[i].variant} for i in pending],
               "device": device, "timeout_s": timeout_s}
    with tempfile.NamedTemporaryFile("w+", prefix="rgt-repro-stderr-", suffix=".txt", delete=False) as err:
        stderr_path = err.name
    try:
        with open(stderr_path, "w") as stderr:
            proc = subprocess.Popen([training.python, "-m", "remote_gpu_trainer.repro.worker"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                    env=_worker_env(training, device, extra_env), start_new_session=True)
        run.workers += 1
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
        events: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, events), daemon=True).start()
        return _drive(proc, events, jobs, pending, run, timeout_s, progress, stderr_path, total)
    finally:
        os.unlink(stderr_path)


def _drive(proc: subprocess.Popen, events: queue.Queue, jobs: list[Job], pending: list[int], run: WorkerRun,
           timeout_s: float, progress: Progress, stderr_path: str, total: int) -> bool:
    local = list(pending)  # worker's job index -> our job index
    current: int | None = None
    ready = False
    deadline = time.monotonic() + IMPORT_TIMEOUT_S
    while True:
        try:
            event = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            _kill(proc)
            if current is None:
                what = "importing torch" if not ready else "between jobs"
                for i in list(pending):
                    run.results[i] = failed(jobs[i], "crashed", f"worker timed out {what}")
                pending.clear()
                return False
            run.results[current] = failed(jobs[current], "timeout",
                                          f"killed after {timeout_s:g} s (bug + fix run did not finish)")
            pending.remove(current)
            progress(total - len(pending), total, f"{jobs[current].case}/{jobs[current].variant}: timeout")
            return True
        if event is None:  # worker exited
            rc = proc.wait()
            if current is not None:
                run.results[current] = failed(jobs[current], "crashed", _describe_exit(rc, _tail(stderr_path)))
                pending.remove(current)
                progress(total - len(pending), total, f"{jobs[current].case}/{jobs[current].variant}: crashed")
                return True
            if pending:
                detail = _describe_exit(rc, _tail(stderr_path))
                for i in list(pending):
                    run.results[i] = failed(jobs[i], "crashed", f"worker stopped before this job: {detail}")
                pending.clear()
                return False
            return True
        kind = event.get("event")
        if kind == "ready":
            ready = True
            if run.torch_version is None:
                run.torch_version, run.device = event["torch_version"], event["device"]
                run.cuda_available, run.worker_start_s = event["cuda_available"], event["import_s"]
            deadline = time.monotonic() + timeout_s + GRACE_S
        elif kind == "start":
            current = local[event["index"]]
            job = jobs[current]
            progress(total - len(pending), total, f"running {job.case}/{job.variant}")
            deadline = time.monotonic() + timeout_s + GRACE_S
        elif kind == "result" and current is not None:
            run.results[current] = event["result"]
            pending.remove(current)
            progress(total - len(pending), total, f"{jobs[current].case}/{jobs[current].variant}: done")
            current = None
            deadline = time.monotonic() + timeout_s + GRACE_S
        elif kind == "error":
            _kill(proc)
            if event.get("field") == "device":
                raise InputError("device", event["message"], allowed=["auto", "cpu"])
            if event.get("kind") in ("torch_missing", "torch_broken"):
                run.torch_missing = _torch_problem(event)
                for i in list(pending):
                    run.results[i] = failed(jobs[i], "not_run", "not run: torch is not importable here")
                pending.clear()
                return False
            for i in list(pending):
                run.results[i] = failed(jobs[i], "crashed", event["message"])
            pending.clear()
            return False
        elif kind == "done":
            proc.wait()
            return True


def run_jobs(jobs: list[Job], device: str = "auto", timeout_s: float = 120.0, progress: Progress = no_progress,
             extra_env: dict[str, str] | None = None, training: TrainingEnv | None = None) -> WorkerRun:
    """Run ``jobs`` in worker processes under the training interpreter (default: found, trainenv/find.py); every
    job gets a raw result (observation or failure record)."""
    run = WorkerRun(results=[{} for _ in jobs])
    pending = list(range(len(jobs)))
    training = training or find_training_env()
    run.training = training
    if training.python is None or not training.has_torch:
        run.torch_missing = no_training_torch(training)
        for i in pending:
            run.results[i] = failed(jobs[i], "not_run", "not run: no python with torch")
        return run
    progress(0, len(jobs), "starting the repro worker (imports torch)")
    while pending:
        before = len(pending)
        if not _run_once(jobs, pending, run, device, timeout_s, progress, extra_env, len(jobs), training):
            break
        if len(pending) == before:  # a worker that ends without running anything must not loop forever
            for i in pending:
                run.results[i] = failed(jobs[i], "crashed", "worker finished without running this job")
            break
    if run.workers > 1:
        run.notes.append(f"{run.workers} workers were started: a timed-out or crashed job restarts the worker "
                         "for the jobs after it")
    return run
