"""The background-job registry: start returns at once, poll reports progress, then the result."""

from __future__ import annotations

import threading
import time

import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.jobs import JobRegistry


def test_start_returns_before_the_work_ends_and_poll_gives_progress_then_result():
    registry = JobRegistry()
    gate = threading.Event()

    def work(progress):
        progress(1, 2, "half way")
        gate.wait(5)
        return {"answer": 42}

    job_id = registry.start(work, name="preflight")
    assert job_id.startswith("preflight-")
    status = registry.wait(job_id, timeout_s=0.3)
    assert (status.state, status.done, status.progress, status.total, status.message) == (
        "running", False, 1, 2, "half way")
    gate.set()
    status = registry.wait(job_id, timeout_s=5)
    assert (status.state, status.done, status.result) == ("done", True, {"answer": 42})


def test_a_failing_job_reports_its_error_instead_of_losing_it():
    registry = JobRegistry()

    def work(progress):
        raise RuntimeError("host b unreachable")

    status = registry.wait(registry.start(work), timeout_s=5)
    assert (status.state, status.done, status.error, status.error_type) == (
        "failed", True, "host b unreachable", "RuntimeError")


def test_the_registry_is_bounded_and_refuses_when_every_slot_still_runs():
    registry = JobRegistry(max_jobs=2)
    gate = threading.Event()
    ids = [registry.start(lambda p: gate.wait(5)) for _ in range(2)]
    with pytest.raises(InputError) as err:
        registry.start(lambda p: None)
    assert err.value.field == "job_id"
    gate.set()
    for job_id in ids:
        assert registry.wait(job_id, timeout_s=5).done
    third = registry.start(lambda p: "ok")  # a finished job makes room
    assert registry.wait(third, timeout_s=5).result == "ok"


def test_finished_jobs_expire_and_an_unknown_id_is_a_clear_input_error():
    registry = JobRegistry(keep_s=0.5)
    job_id = registry.start(lambda p: 1)
    assert registry.wait(job_id, timeout_s=5).done
    time.sleep(0.6)
    with pytest.raises(InputError) as err:
        registry.poll(job_id)
    assert err.value.field == "job_id" and "expired" in str(err.value)


def test_daemon_pool_gives_results_and_errors_and_drops_what_was_cancelled():
    from remote_gpu_trainer.jobs import DaemonPool

    gate = threading.Event()
    with DaemonPool(1, "test-pool") as pool:
        first = pool.submit(lambda: gate.wait(5) and "ran")
        failing = pool.submit(lambda: 1 / 0)
        queued = pool.submit(lambda: "never")
        assert queued.cancel()  # not started: the one worker is busy with the first
        gate.set()
    assert first.result(timeout=5) == "ran"
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=5)
    assert queued.cancelled()


def test_a_daemon_pool_never_holds_the_process_at_exit():
    """A ThreadPoolExecutor's workers are joined at exit: a fleet check with one hung box kept `rgt` open after
    its answer. The pool's workers are daemon threads."""
    import subprocess
    import sys

    code = """
import time
from remote_gpu_trainer.jobs import DaemonPool
pool = DaemonPool(2, "test")
future = pool.submit(time.sleep, 120)
pool.shutdown(cancel=[future])
print("answered", flush=True)
"""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "answered", done.stderr
    assert time.monotonic() - started < 20, "the process waited for a pool worker at exit"
