"""nvml_session: one NVML init per process, one worker thread, and a timeout that really fires.

pynvml is monkeypatched (nvmlInit & co.), so these run without a GPU and without a driver; the
no-driver case at the end runs the real library loader on this machine.
"""

from __future__ import annotations

import threading
import time

import pynvml
import pytest

from remote_gpu_trainer import nvml_session
from remote_gpu_trainer.nvml_session import NvmlHang, SerialWorker


@pytest.fixture(autouse=True)
def fresh_session():
    nvml_session.reset_for_tests()
    yield
    nvml_session.reset_for_tests()


def _patch_ok(monkeypatch, calls: list[str], init=None) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", init or (lambda: calls.append("init")))
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "570.86.15")
    monkeypatch.setattr(pynvml, "nvmlSystemGetNVMLVersion", lambda: b"12.570.86.15")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 8)
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", lambda: 12080)


def test_worker_returns_results_and_reraises_errors():
    worker = SerialWorker("t")
    assert worker.call(lambda: 41 + 1, "add", 5) == 42
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0, "div", 5)
    names = set()
    for _ in range(3):
        names.add(worker.call(lambda: threading.current_thread().name, "name", 5))
    assert len(names) == 1 and names.pop().startswith("t-")  # every job on the same single thread


def test_worker_hang_raises_with_the_call_it_is_stuck_in_and_fails_fast_afterwards():
    worker = SerialWorker("t")
    release = threading.Event()

    def stuck():
        worker.detail = "nvmlDeviceGetTemperature (GPU 3)"
        release.wait(30)
        return "late"

    started = time.monotonic()
    with pytest.raises(NvmlHang) as first:
        worker.call(stuck, "probe", 0.3)
    assert 0.25 <= time.monotonic() - started < 5
    assert first.value.stuck_in == "nvmlDeviceGetTemperature (GPU 3)"
    # A second caller whose timeout the stuck call has already outlasted is told at once, without queueing.
    time.sleep(0.35)
    started = time.monotonic()
    with pytest.raises(NvmlHang) as second:
        worker.call(lambda: "never runs", "probe 2", 0.3)
    assert time.monotonic() - started < 0.2
    assert second.value.waited_s == 0.0 and second.value.stuck_for_s >= 0.3
    release.set()
    assert worker.call(lambda: "ok", "after", 5) == "ok"  # the thread recovers once the call returns


def test_cancelled_job_is_never_run():
    worker = SerialWorker("t")
    release = threading.Event()
    ran: list[str] = []
    worker.submit(lambda: release.wait(30), "blocker")
    time.sleep(0.05)
    with pytest.raises(NvmlHang):
        worker.call(lambda: ran.append("late"), "queued", 0.2)
    release.set()
    assert worker.call(lambda: "done", "next", 5) == "done"
    assert ran == []  # its caller gave up before it started: NVML is not touched for nobody


def test_init_happens_once_and_is_cached(monkeypatch):
    calls: list[str] = []
    _patch_ok(monkeypatch, calls)
    first = nvml_session.nvml_status()
    second = nvml_session.nvml_status()
    assert first.ok and second is first
    assert calls == ["init"]
    assert (first.driver_version, first.nvml_version, first.device_count, first.cuda_driver_version) == \
        ("570.86.15", "12.570.86.15", 8, "12.8")


@pytest.mark.parametrize(("code", "reason", "words"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no_driver", "libnvidia-ml.so.1"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded", "modprobe"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "driver_library_mismatch", "Driver/library version mismatch"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission", "/dev/nvidia"),
    (pynvml.NVML_ERROR_UNKNOWN, "error", "Unknown"),
])
def test_init_failures_are_named(monkeypatch, code, reason, words):
    def fail():
        raise pynvml.NVMLError(code)

    _patch_ok(monkeypatch, [], init=fail)
    status = nvml_session.nvml_status()
    assert not status.ok and status.reason == reason
    assert words in status.detail


def test_failed_init_is_retried_later_but_not_on_every_call(monkeypatch):
    attempts: list[int] = []

    def fail():
        attempts.append(1)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    _patch_ok(monkeypatch, [], init=fail)
    assert nvml_session.nvml_status().reason == "driver_not_loaded"
    assert nvml_session.nvml_status().reason == "driver_not_loaded"
    assert len(attempts) == 1
    monkeypatch.setattr(nvml_session, "RETRY_FAILED_INIT_AFTER_S", 0.0)
    calls: list[str] = []
    _patch_ok(monkeypatch, calls)  # e.g. after `modprobe nvidia`
    assert nvml_session.nvml_status().ok and calls == ["init"]


def test_hung_init_reports_timeout_and_later_calls_reuse_the_same_attempt(monkeypatch):
    release = threading.Event()
    inits: list[int] = []

    def slow_init():
        inits.append(1)
        release.wait(30)

    _patch_ok(monkeypatch, [], init=slow_init)
    started = time.monotonic()
    status = nvml_session.nvml_status(timeout_s=0.2)
    assert status.reason == "timeout" and "XID 79" in status.detail
    assert time.monotonic() - started < 2
    assert nvml_session.nvml_status(timeout_s=0.1).reason == "timeout"
    release.set()
    assert nvml_session.nvml_status(timeout_s=5).ok
    assert len(inits) == 1


def test_unexpected_exception_during_init_is_a_status(monkeypatch):
    def broken():
        raise RuntimeError("ctypes exploded")

    _patch_ok(monkeypatch, [], init=broken)
    status = nvml_session.nvml_status()
    assert not status.ok and status.reason == "error" and "ctypes exploded" in status.detail


def test_real_library_loader_without_a_driver_is_fast_and_named():
    """This machine has no NVIDIA driver: the real pynvml must say so in well under a second."""
    if nvml_session.nvml_status().ok:
        pytest.skip("a working NVIDIA driver is present")
    nvml_session.reset_for_tests()
    started = time.monotonic()
    status = nvml_session.nvml_status()
    assert time.monotonic() - started < 1.0
    assert status.reason in ("no_driver", "driver_not_loaded") and "nvmlInit failed" in status.detail
