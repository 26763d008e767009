"""GPU load over a short window: utilisation, memory, power and processes per GPU.

One reading lies: NVML's utilisation is the share of the last sample period (1/6 s to 1 s) in which a
kernel ran, so a data-loading pause reads 0 % and a single stray kernel reads 100 %. The window takes
several readings and keeps the mean and the maximum; a GPU counts as idle only if even its maximum
stayed under the threshold.

Reads go through the same :class:`~remote_gpu_trainer.health.backend.NvmlBackend` as ``gpu_health``
(real NVML, or a named fake under ``RGT_HEALTH_FAKE``), through the NVML worker process with a
timeout, so a wedged driver or a native fault costs an ``unknown`` verdict, not a hung or dead tool or
guard.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..health.backend import NvmlBackend, NvmlProcessBackend, Unread
from ..nvml_session import NvmlFault

FAKE_ENV = "RGT_HEALTH_FAKE"


def backend_here() -> NvmlBackend:
    """Real NVML, or the fake scenario ``RGT_HEALTH_FAKE`` names (tests, demos)."""
    name = os.environ.get(FAKE_ENV)
    if name:
        from ..health.fakes import scenario

        return scenario(name).backend
    return NvmlProcessBackend()


@dataclass
class GpuWindow:
    """What one GPU did during the window."""

    index: int
    name: str | None = None
    utilization: list[int] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    processes: dict[int, int | None] = field(default_factory=dict)
    """pid → VRAM bytes, every pid seen on this GPU during the window."""
    lost: str | None = None

    @property
    def util_max(self) -> int | None:
        return max(self.utilization) if self.utilization else None

    @property
    def util_mean(self) -> float | None:
        return sum(self.utilization) / len(self.utilization) if self.utilization else None

    @property
    def power_w_mean(self) -> float | None:
        return sum(self.power_w) / len(self.power_w) if self.power_w else None


@dataclass
class Window:
    ok: bool
    """False when NVML could not be opened or hung: the GPUs' state is unknown."""
    detail: str
    backend: str
    started_at: float
    seconds: float
    samples: int
    gpus: list[GpuWindow]


def _value(reading: object) -> object | None:
    return None if isinstance(reading, Unread) else reading


def sample(window_s: float, interval_s: float = 1.0, timeout_s: float = 10.0, backend: NvmlBackend | None = None,
           sleep: Callable[[float], None] = time.sleep) -> Window:
    """Read every GPU at the start, every ``interval_s`` and at the end of ``window_s`` (at least once)."""
    backend = backend or backend_here()
    started = time.time()
    begin = time.monotonic()
    status = backend.open(timeout_s)
    if not status.ok:
        return Window(False, status.detail, backend.name, started, 0.0, 0, [])
    gpus = [GpuWindow(i) for i in range(status.device_count or 0)]
    samples = 0
    while True:
        try:
            for gpu in gpus:
                snap = backend.worker.call(lambda i=gpu.index: backend.read_gpu(i), f"idle sample GPU {gpu.index}",
                                           timeout_s)
                _add(gpu, snap)
        except NvmlFault as fault:
            what = "hung" if isinstance(fault, TimeoutError) else "failed"
            return Window(False, f"NVML {what}: {fault}", backend.name, started, time.monotonic() - begin, samples,
                          gpus)
        samples += 1
        left = window_s - (time.monotonic() - begin)
        if left <= 0:
            break
        sleep(min(interval_s, left))
    return Window(True, status.detail, backend.name, started, time.monotonic() - begin, samples, gpus)


def _add(gpu: GpuWindow, snap: object) -> None:
    from ..health.backend import GpuSnapshot

    assert isinstance(snap, GpuSnapshot)
    if snap.lost is not None:
        gpu.lost = f"{snap.lost.kind.value} in {snap.lost.call}"
        return
    gpu.name = _value(snap.name) or gpu.name  # type: ignore[assignment]
    util = _value(snap.utilization_gpu)
    if isinstance(util, int):
        gpu.utilization.append(util)
    power = _value(snap.power_usage_mw)
    if isinstance(power, int):
        gpu.power_w.append(power / 1000)
    memory = _value(snap.memory)
    if memory is not None:
        gpu.memory_used_bytes = memory.used  # type: ignore[attr-defined]
        gpu.memory_total_bytes = memory.total  # type: ignore[attr-defined]
    procs = _value(snap.processes)
    if isinstance(procs, tuple):
        for proc in procs:
            gpu.processes[proc.pid] = proc.used_bytes
