"""One NVML session per process, and one thread that makes every NVML call.

Why one dedicated thread: an NVML call can block for minutes on a GPU that fell off the bus (the
calling thread sits in the kernel, in D state). Every NVML call therefore runs as a job on a
single daemon thread, and callers wait with a timeout: a wedged driver costs one stuck thread and a
FAIL/UNKNOWN verdict, never a hung server or a pile of stuck threads. While that thread is stuck,
later callers are told so at once instead of queueing behind it.

Why once per process: ``nvmlInit`` takes seconds without persistence mode and serialises across
processes, so it runs once (as the first job of that thread) and NVML is never shut down. A failed
init is retried after a few seconds, so ``modprobe nvidia`` under a running server is picked up.

pynvml is imported here (inside functions) and in ``health.backend``, never at module level.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

RETRY_FAILED_INIT_AFTER_S = 5.0

# pynvml.NVML_ERROR_* constant name → (reason, advice) for a failed nvmlInit.
_INIT_FAILURES: dict[str, tuple[str, str]] = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "no_driver",
        "libnvidia-ml.so.1 was not found: no NVIDIA driver here, or the container was started without "
        "the NVIDIA runtime (--gpus all / nvidia-container-toolkit)",
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "driver_not_loaded",
        "the NVIDIA kernel driver is not loaded (modprobe nvidia, or reboot after a driver install)",
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "driver_library_mismatch",
        "Driver/library version mismatch: the user-space NVML library and the loaded kernel module "
        "differ, usually after a driver upgrade without reboot; reboot or reload the nvidia kernel modules",
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "no_permission",
        "no permission to open /dev/nvidia* (check the device nodes and your groups)",
    ),
}

#: Reasons meaning "there is no usable NVIDIA GPU stack here at all", as opposed to a broken one.
NO_GPU_REASONS = frozenset({"pynvml_missing", "no_driver", "driver_not_loaded"})


@dataclass(frozen=True)
class NvmlStatus:
    ok: bool
    reason: str
    """``ok`` or one of: pynvml_missing, no_driver, driver_not_loaded, driver_library_mismatch,
    no_permission, timeout, error."""
    detail: str
    driver_version: str | None = None
    nvml_version: str | None = None
    device_count: int | None = None
    cuda_driver_version: str | None = None
    """The CUDA version the driver supports, e.g. ``12.4`` (what ``nvidia-smi`` prints top right)."""


class NvmlHang(TimeoutError):
    """An NVML job did not finish in time; ``stuck_in`` names the call the worker is blocked in."""

    def __init__(self, label: str, waited_s: float, stuck_in: str | None, stuck_for_s: float):
        self.label = label
        self.waited_s = waited_s
        self.stuck_in = stuck_in
        self.stuck_for_s = stuck_for_s
        where = f" (blocked in {stuck_in} for {stuck_for_s:.1f} s)" if stuck_in else ""
        super().__init__(f"{label} did not finish within {waited_s:g} s{where}")


class Job(Generic[T]):
    """One unit of work for the worker thread; the submitter waits on it with its own timeout."""

    def __init__(self, fn: Callable[[], T], label: str):
        self.fn = fn
        self.label = label
        self.done = threading.Event()
        self.cancelled = False
        self.result: T | None = None
        self.error: BaseException | None = None

    def wait(self, timeout_s: float | None) -> bool:
        return self.done.wait(timeout_s)

    def outcome(self) -> T:
        """The result, or re-raise the job's exception. Only call after ``wait`` returned True."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class SerialWorker:
    """A daemon thread that runs jobs one at a time and can say what it is blocked in."""

    _ids = itertools.count()

    def __init__(self, name: str = "nvml"):
        self.name = name
        self._jobs: queue.SimpleQueue[Job[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running: tuple[str, float] | None = None
        self.detail: str | None = None
        """Set by the running job to the call it is making (e.g. ``nvmlDeviceGetTemperature (GPU 3)``),
        so a timeout can say exactly where NVML hung."""

    def submit(self, fn: Callable[[], T], label: str) -> Job[T]:
        job = Job(fn, label)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"{self.name}-{next(self._ids)}",
                                                daemon=True)
                self._thread.start()
        self._jobs.put(job)
        return job

    def busy(self) -> tuple[str, float] | None:
        """``(what it is doing, seconds so far)`` of the running job, or None when idle."""
        running = self._running
        if running is None:
            return None
        label, started = running
        return (self.detail or label, time.monotonic() - started)

    def call(self, fn: Callable[[], T], label: str, timeout_s: float) -> T:
        """Run ``fn`` on the worker and return its result; raise :class:`NvmlHang` after ``timeout_s``.

        If the worker has already been blocked for longer than ``timeout_s`` on an earlier job, fail
        at once: queueing behind a wedged driver call would only hang this caller too.
        """
        stuck = self.busy()
        if stuck is not None and stuck[1] >= timeout_s:
            raise NvmlHang(label, 0.0, stuck[0], stuck[1])
        job = self.submit(fn, label)
        if not job.wait(timeout_s):
            job.cancelled = True
            stuck = self.busy()
            raise NvmlHang(label, timeout_s, stuck[0] if stuck else None, stuck[1] if stuck else 0.0)
        return job.outcome()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job.cancelled:  # its caller gave up before it started: do not touch NVML for nobody
                job.done.set()
                continue
            self._running = (job.label, time.monotonic())
            self.detail = None
            try:
                job.result = job.fn()
            except BaseException as err:  # handed to the waiting caller, never lost in this thread
                job.error = err
            finally:
                self._running = None
                self.detail = None
                job.done.set()


_lock = threading.Lock()
_worker = SerialWorker("nvml")
_status: NvmlStatus | None = None
_status_at = 0.0
_init_job: Job[NvmlStatus] | None = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(pynvml: Any) -> str | None:
    try:
        version = pynvml.nvmlSystemGetCudaDriverVersion_v2()
    except (pynvml.NVMLError, AttributeError):
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _open() -> NvmlStatus:
    try:
        import pynvml
    except ImportError as err:
        return NvmlStatus(False, "pynvml_missing", f"nvidia-ml-py is not installed ({err})")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        by_code = {getattr(pynvml, name): info for name, info in _INIT_FAILURES.items()}
        reason, advice = by_code.get(err.value, ("error", ""))
        return NvmlStatus(False, reason, f"nvmlInit failed: {err}" + (f" — {advice}" if advice else ""))
    except OSError as err:  # a broken libnvidia-ml.so can fail at dlopen time
        return NvmlStatus(False, "no_driver", f"loading libnvidia-ml failed: {err}")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        nvml = _text(pynvml.nvmlSystemGetNVMLVersion())
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        return NvmlStatus(False, "error", f"NVML initialised but basic queries failed: {err}")
    return NvmlStatus(True, "ok", f"NVML {nvml}, driver {driver}, {count} GPU(s)", driver, nvml, count,
                      _cuda_version(pynvml))


def _open_and_remember() -> NvmlStatus:
    global _status, _status_at
    result = _open()
    with _lock:
        _status, _status_at = result, time.monotonic()
    return result


def nvml_status(timeout_s: float = 10.0) -> NvmlStatus:
    """The process-wide NVML status, initialising NVML on first use (and retrying a failed init)."""
    global _init_job
    with _lock:
        fresh = _status is not None and (_status.ok or time.monotonic() - _status_at < RETRY_FAILED_INIT_AFTER_S)
        if fresh:
            return _status  # type: ignore[return-value]
        if _init_job is None or _init_job.done.is_set():
            _init_job = _worker.submit(_open_and_remember, "nvmlInit")
        job = _init_job
    if job.wait(timeout_s):
        try:
            return job.outcome()
        except Exception as err:  # an unexpected failure inside pynvml is a status, not a crash
            return NvmlStatus(False, "error", f"opening NVML failed: {type(err).__name__}: {err}")
    return NvmlStatus(False, "timeout", f"nvmlInit did not return within {timeout_s:g} s: the driver is "
                      "likely wedged (look for XID 79 'fallen off the bus' in dmesg); a reset or reboot is needed")


def worker() -> SerialWorker:
    """The thread every real NVML call must run on (see the module docstring)."""
    return _worker


def reset_for_tests() -> None:
    """Forget the cached status and start a fresh worker, so a test can open a new (fake) session.

    A worker left blocked by a test's fake hang is abandoned (it is a daemon thread).
    """
    global _status, _status_at, _init_job, _worker
    with _lock:
        _status, _status_at, _init_job = None, 0.0, None
        _worker = SerialWorker("nvml")
