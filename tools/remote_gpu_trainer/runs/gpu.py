"""GPU use of a run's own processes, through the health tools' NVML backend (or its fakes).

NVML lists, per GPU, the pids holding memory there; a run's processes are found in those lists by
pid. Per-process utilisation is not in the backend's interface, so a GPU's utilisation is reported
for every GPU the run holds memory on (on a GPU shared with another job it includes that job).
Every NVML call runs in the NVML worker process with a deadline: a sick GPU or a native fault costs a
note, never a hung or dead supervisor or status call. No GPU or no driver is not an error: the
answer is empty with a note.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial

from pydantic import Field

from ..health.backend import GpuProcesses, Memory, NvmlBackend
from ..models import StrictModel
from ..nvml_session import NvmlFault

NEAR_IDLE_PERCENT = 5
"""At or below this, a GPU counts as idle for the stall check (a working training step shows far more)."""


class GpuUse(StrictModel):
    gpu: int = Field(description="NVML GPU index")
    pid: int
    used_bytes: int | None = Field(description="VRAM NVML attributes to this pid (null: not reported, e.g. MIG)")
    gpu_util_percent: int | None = Field(description="That GPU's utilisation (all its processes), null if unread")


def default_backend() -> NvmlBackend:
    """The real NVML adapter, or the named fake when ``RGT_HEALTH_FAKE`` is set (as gpu_health does)."""
    from ..health.tool import _sources

    return _sources()[0]


def _processes(backend: NvmlBackend, indices: Iterable[int], deadline: float) -> list[GpuProcesses]:
    return [backend.worker.call(partial(backend.read_processes, i), f"processes GPU {i}",
                                max(deadline - time.monotonic(), 0.05)) for i in indices]


def read_holders(indices: list[int] | None, backend: NvmlBackend | None = None,
                 timeout_s: float = 5.0) -> tuple[list[GpuProcesses], str | None]:
    """Process lists of ``indices`` (None: every GPU) and a note when NVML could not answer."""
    backend = backend or default_backend()
    deadline = time.monotonic() + timeout_s
    status = backend.open(timeout_s)
    if not status.ok:
        return [], f"NVML unavailable ({status.reason}): no GPU information"
    count = status.device_count or 0
    wanted = [i for i in (indices if indices is not None else range(count)) if 0 <= i < count]
    try:
        return _processes(backend, wanted, deadline), None
    except NvmlFault as fault:
        return [], f"NVML did not answer ({fault}): run gpu_health"


@dataclass
class GpuReading:
    """Every GPU's process list, read once, and each GPU's utilisation read at most once, under one deadline:
    run_status's two views of the GPUs (the run's use, its placement) share it instead of each reading NVML."""

    backend: NvmlBackend
    holders: list[GpuProcesses]
    note: str | None
    deadline: float
    utils: dict[int, int | None] = field(default_factory=dict)
    faults: dict[int, str] = field(default_factory=dict)

    @classmethod
    def read(cls, backend: NvmlBackend | None = None, timeout_s: float = 5.0) -> GpuReading:
        backend = backend or default_backend()
        deadline = time.monotonic() + timeout_s
        holders, note = read_holders(None, backend, timeout_s)
        return cls(backend, holders, note, deadline)

    def util(self, index: int) -> int | None:
        """GPU ``index``'s utilisation (None: not reported, or NVML did not answer: then ``faults`` says why)."""
        if index not in self.utils:
            try:
                snap = self.backend.worker.call(partial(self.backend.read_gpu, index), f"GPU {index}",
                                                max(self.deadline - time.monotonic(), 0.05))
                self.utils[index] = snap.utilization_gpu if isinstance(snap.utilization_gpu, int) else None
            except NvmlFault as fault:  # hung or its worker died: a note, never a traceback
                self.utils[index] = None
                self.faults[index] = f"NVML did not answer reading GPU {index} ({fault})"
        return self.utils[index]


def run_gpu_use(pids: set[int], backend: NvmlBackend | None = None, timeout_s: float = 5.0,
                reading: GpuReading | None = None) -> tuple[list[GpuUse], str | None]:
    """One row per (GPU, run pid) that NVML lists, with the GPU's utilisation; and a note if NVML failed.
    ``reading``: NVML as already read (run_status shares one with gpu_placement)."""
    reading = reading or GpuReading.read(backend, timeout_s)
    note = reading.note
    rows: list[GpuUse] = []
    for gpu in reading.holders:
        if isinstance(gpu.processes, tuple):
            mine = [p for p in gpu.processes if p.pid in pids]
            if mine:
                util = reading.util(gpu.index)
                note = reading.faults.get(gpu.index, note)
                rows += [GpuUse(gpu=gpu.index, pid=p.pid, used_bytes=p.used_bytes, gpu_util_percent=util)
                         for p in mine]
    return rows, note


def gpus_idle(rows: list[GpuUse]) -> bool | None:
    """True: every GPU the run holds is near idle; False: one is busy; None: no GPU evidence."""
    readings = [r.gpu_util_percent for r in rows if r.gpu_util_percent is not None]
    if not readings:
        return None
    return max(readings) <= NEAR_IDLE_PERCENT


def used_bytes(gpu: GpuProcesses) -> int | None:
    return gpu.memory.used if isinstance(gpu.memory, Memory) else None
