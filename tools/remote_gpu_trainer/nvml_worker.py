"""The NVML worker process: the one place this package loads libnvidia-ml and calls NVML.

Started by ``nvml_session`` (which explains why NVML lives in its own process). It initialises NVML
as soon as it starts, sends that status, then answers requests read from stdin until stdin closes:
``(op, args)`` in, ``("ok", result)`` or ``("error", text)`` out, each a length-prefixed pickle.
Before every NVML call it writes the call's name into a shared page, so the session can say which
call crashed or hangs after this process can no longer say anything. faulthandler writes the Python
stack of a native fault to stderr, which the session keeps.

Imports stay minimal (no pydantic): this process starts on the cold path of ``rgt health``.
"""

from __future__ import annotations

import faulthandler
import json
import mmap
import os
import struct
import sys
import time
from typing import IO, Any

from .nvml_session import PROGRESS_SIZE, NvmlStatus, send_message

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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(pynvml: Any) -> str | None:
    try:
        version = pynvml.nvmlSystemGetCudaDriverVersion_v2()
    except (pynvml.NVMLError, AttributeError):
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def open_nvml() -> NvmlStatus:
    """``nvmlInit`` in this process and the basic facts, or why it failed, as a status (never raises)."""
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
    except Exception as err:  # an unexpected failure inside pynvml is a status, not a crash
        return NvmlStatus(False, "error", f"opening NVML failed: {type(err).__name__}: {err}")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        nvml = _text(pynvml.nvmlSystemGetNVMLVersion())
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        return NvmlStatus(False, "error", f"NVML initialised but basic queries failed: {err}")
    return NvmlStatus(True, "ok", f"NVML {nvml}, driver {driver}, {count} GPU(s)", driver, nvml, count,
                      _cuda_version(pynvml))


class Progress:
    """The NVML call in flight, in a page the session can read after this process died or while it hangs."""

    def __init__(self, fd: int):
        self.page = mmap.mmap(fd, PROGRESS_SIZE)

    def note(self, label: str) -> None:
        data = label.encode(errors="replace")[:PROGRESS_SIZE - 9]
        struct.pack_into("d", self.page, 0, time.monotonic())
        self.page[8:9 + len(data)] = data + b"\0"

    def clear(self) -> None:
        self.page[8] = 0


def _receive(stream: IO[bytes]) -> Any:
    import pickle

    header = stream.read(4)
    if len(header) < 4:
        return None
    size, = struct.unpack("!I", header)
    data = stream.read(size)
    return pickle.loads(data) if len(data) == size else None


def serve(requests: IO[bytes], replies: IO[bytes], progress: Progress, skip: dict[tuple[str, int | None], str]) -> None:
    from .health.backend import InforomCache, PynvmlBackend, inforom_cache_file

    began = time.monotonic()
    try:
        import pynvml  # noqa: F401 (timed apart from nvmlInit: both are on the cold path)
    except ImportError:
        pass  # open_nvml() says so as a status (pynvml_missing)
    imported = time.monotonic()
    progress.note("nvmlInit")
    status = open_nvml()
    progress.clear()
    timings = {"main_at": began, "import_pynvml_s": imported - began, "nvml_init_s": time.monotonic() - imported}
    send_message(replies, ("status", (status, timings)))
    reader = PynvmlBackend(note=progress.note, done=progress.clear, skip=skip,
                           inforom=InforomCache(inforom_cache_file()))

    def retry_init() -> NvmlStatus:
        """The session asks again after RETRY_FAILED_INIT_AFTER_S (e.g. ``modprobe nvidia`` since)."""
        nonlocal status
        if not status.ok:
            progress.note("nvmlInit")
            status = open_nvml()
            progress.clear()
        return status

    ops = {"retry_init": retry_init, "read_gpu": reader.read_gpu, "read_counters": reader.read_counters,
           "read_processes": reader.read_processes, "list_devices": reader.list_devices}
    while True:
        message = _receive(requests)
        if message is None:  # the session closed our stdin (or went away): done
            return
        op, args = message
        try:
            reply: tuple[str, Any] = ("ok", ops[op](*args))
        except Exception as err:  # a bug on our side is an answer, not a dead worker
            reply = ("error", f"{op}: {type(err).__name__}: {err}")
        send_message(replies, reply)


def main() -> None:
    """``python -S -c ... main()`` with argv: [paths] <progress fd> <skip list as JSON>."""
    faulthandler.enable()
    progress = Progress(int(sys.argv[2]))
    skip = {(name, index): why for name, index, why in json.loads(sys.argv[3])}
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed (by us, pynvml or the driver) goes to stderr, never into the replies
    serve(sys.stdin.buffer, replies, progress, skip)
