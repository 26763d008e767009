"""One NVML session per process, opened lazily and never allowed to hang the caller.

``nvmlInit`` can block for a long time on a GPU that fell off the bus, so it runs in a daemon thread
and callers wait at most ``timeout_s``. A hung init is remembered: later calls wait on the same
thread instead of starting another. pynvml is imported here and nowhere at module level.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

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


_lock = threading.Lock()
_status: NvmlStatus | None = None
_init_thread: threading.Thread | None = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
    return NvmlStatus(True, "ok", f"NVML {nvml}, driver {driver}, {count} GPU(s)", driver, nvml, count)


def _init_worker() -> None:
    global _status
    result = _open()
    with _lock:
        _status = result


def nvml_status(timeout_s: float = 10.0) -> NvmlStatus:
    """The process-wide NVML status, initialising NVML on first use."""
    global _init_thread
    with _lock:
        if _status is not None:
            return _status
        if _init_thread is None:
            _init_thread = threading.Thread(target=_init_worker, name="nvml-init", daemon=True)
            _init_thread.start()
        thread = _init_thread
    thread.join(timeout_s)
    with _lock:
        if _status is not None:
            return _status
    return NvmlStatus(False, "timeout", f"nvmlInit did not return within {timeout_s:g} s: the driver is "
                      "likely wedged (look for XID 79 'fallen off the bus' in dmesg); a reset or reboot is needed")


def reset_for_tests() -> None:
    """Forget the cached status so a test can open a fresh (fake) session."""
    global _status, _init_thread
    with _lock:
        _status = None
        _init_thread = None
