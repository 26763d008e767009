"""nvml_session: one NVML worker process per server, one nvmlInit in it, and timeouts that really fire.

SerialWorker (the in-process job thread the fakes use) and the init's error naming run with a
monkeypatched pynvml; the session itself runs its real worker process, with the C-level fake
libnvidia-ml (tests/nvml_fake) or, at the end, the real library loader on this driverless machine.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pynvml
import pytest

from remote_gpu_trainer import nvml_session
from remote_gpu_trainer.nvml_session import NvmlHang, SerialWorker
from remote_gpu_trainer.nvml_worker import open_nvml
from tests.nvml_fake import scenario_text


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
    status = open_nvml()  # what the worker process runs first
    assert not status.ok and status.reason == reason
    assert words in status.detail


def test_unexpected_exception_during_init_is_a_status(monkeypatch):
    def broken():
        raise RuntimeError("ctypes exploded")

    _patch_ok(monkeypatch, [], init=broken)
    status = open_nvml()
    assert not status.ok and status.reason == "error" and "ctypes exploded" in status.detail


def test_init_happens_once_in_the_worker_and_never_in_this_process(fake_nvml):
    fake_nvml("healthy-8xh100")
    first = nvml_session.nvml_status()
    pid = nvml_session.session().worker_pid
    second = nvml_session.nvml_status()
    assert first.ok and second is first and nvml_session.session().worker_pid == pid
    assert (first.driver_version, first.nvml_version, first.device_count, first.cuda_driver_version) == \
        ("570.86.15", "12.570.86.15", 8, "12.8")
    assert "libnvidia-ml" not in Path("/proc/self/maps").read_text()  # only the worker loaded it
    assert "libnvidia-ml" in Path(f"/proc/{pid}/maps").read_text()


def test_init_failures_from_the_c_library_are_named(fake_nvml):
    fake_nvml("driver-mismatch")
    status = nvml_session.nvml_status()
    assert status.reason == "driver_library_mismatch" and "reboot" in status.detail


def test_failed_init_is_retried_later_but_not_on_every_call(fake_nvml, monkeypatch):
    scenario = fake_nvml("driver-mismatch")
    assert nvml_session.nvml_status().reason == "driver_library_mismatch"
    scenario.write_text(scenario_text("healthy-8xh100"))  # e.g. the reboot: the same worker retries
    assert nvml_session.nvml_status().reason == "driver_library_mismatch"  # cached: no retry yet
    monkeypatch.setattr(nvml_session, "RETRY_FAILED_INIT_AFTER_S", 0.0)
    pid = nvml_session.session().worker_pid
    assert nvml_session.nvml_status().ok and nvml_session.session().worker_pid == pid


def test_hung_init_reports_timeout_and_later_calls_reuse_the_same_attempt(fake_nvml):
    fake_nvml("healthy-8xh100", fault="hang:nvmlInitWithFlags", hang_s=2)
    started = time.monotonic()
    status = nvml_session.nvml_status(timeout_s=0.3)
    assert status.reason == "timeout" and "XID 79" in status.detail
    assert time.monotonic() - started < 2
    pid = nvml_session.session().worker_pid
    assert nvml_session.nvml_status(timeout_s=0.1).reason == "timeout"
    assert nvml_session.nvml_status(timeout_s=10).ok  # the slow init finished: the same attempt
    assert nvml_session.session().worker_pid == pid


def test_a_crash_in_init_is_a_status_and_a_later_call_starts_a_new_worker(fake_nvml, monkeypatch):
    fake_nvml("healthy-8xh100", fault="segv:nvmlInitWithFlags")
    status = nvml_session.nvml_status()
    assert status.reason == "crashed" and "SIGSEGV" in status.detail and "nvmlInit" in status.detail
    monkeypatch.setattr(nvml_session, "RETRY_FAILED_INIT_AFTER_S", 0.0)
    assert nvml_session.nvml_status().ok  # the fault fired once: a new worker initialises


def test_real_library_loader_without_a_driver_is_fast_and_named():
    """This machine has no NVIDIA driver: the worker's real pynvml must say so in well under a second."""
    if nvml_session.nvml_status().ok:
        pytest.skip("a working NVIDIA driver is present")
    nvml_session.reset_for_tests()
    started = time.monotonic()
    status = nvml_session.nvml_status()
    assert time.monotonic() - started < 1.0
    assert status.reason in ("no_driver", "driver_not_loaded") and "nvmlInit failed" in status.detail


def test_without_pynvml_the_worker_answers_pynvml_missing(tmp_path, monkeypatch):
    """A box where nvidia-ml-py is not installed: a status, not a dead worker (the worker gets our sys.path)."""
    (tmp_path / "pynvml.py").write_text("raise ImportError(\"No module named 'pynvml'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    nvml_session.reset_for_tests()
    status = nvml_session.nvml_status()
    assert status.reason == "pynvml_missing" and "nvidia-ml-py is not installed" in status.detail
    assert nvml_session.session().restarts == 0


def test_an_error_reply_from_the_worker_is_an_nvml_fault_callers_catch(fake_nvml):
    """The worker answers a bug on its side with ("error", text): callers catch NvmlFault only, so it must be one
    (a plain RuntimeError escaped them as a traceback), and the worker keeps serving."""
    fake_nvml("healthy-8xh100")
    session = nvml_session.session()
    assert session.status().ok
    pid = session.worker_pid
    with pytest.raises(nvml_session.NvmlFault) as raised:
        session.request("no_such_op")
    assert isinstance(raised.value, nvml_session.NvmlWorkerError)
    assert "no_such_op" in str(raised.value) and "KeyError" in str(raised.value)
    assert session.worker_pid == pid and session.restarts == 0


def test_busy_racing_a_close_reads_nothing_rather_than_raising(fake_nvml):
    """busy() takes the worker without the lock (it must answer while a call holds it): a close in between leaves
    it a worker whose progress page is unmapped, which must read as "in no call", not ValueError: mmap closed."""
    fake_nvml("healthy-8xh100")
    session = nvml_session.session()
    assert session.status().ok
    worker = session._worker  # what a concurrent busy() holds when close() runs
    session.close()
    assert worker is not None and worker.in_flight() is None
