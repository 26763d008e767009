"""Which GPU each rank is on, through NVML: "are all 7 of my GPUs actually working on this model?"

NVML lists, per GPU, the pids holding memory there; a rank is a run process with ``RANK`` in its
environment. So each rank maps to the GPUs it holds memory on, and two findings follow: two ranks on
one GPU (every rank on ``cuda:0``, DIST-01) and a GPU the run can see (``CUDA_VISIBLE_DEVICES`` of
its ranks, else every GPU) that no rank uses. Each GPU's utilisation says how busy it is.

A limit said out loud instead of guessed around: inside a container without the host's PID
namespace NVML reports host pids, so no run pid matches while the GPUs show work; the report then
says placement is unknown rather than "no rank on any GPU". NVML indices are PCI bus order, which
is what ``CUDA_VISIBLE_DEVICES`` means when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (on a box of identical
GPUs CUDA's default order gives the same indices).
"""

from __future__ import annotations

from pydantic import Field

from ..health.backend import NvmlBackend
from ..models import StrictModel
from .gpu import GpuReading
from .hang import rank_ranges


class GpuRow(StrictModel):
    gpu: int
    visible: bool = Field(description="The run's ranks can see this GPU (CUDA_VISIBLE_DEVICES)")
    ranks: list[int] = Field(description="Ranks holding memory on it")
    pids: list[int] = Field(description="Run processes holding memory on it (ranks and others)")
    used_bytes: int | None = Field(description="VRAM NVML attributes to the run's processes on it")
    util_percent: int | None = Field(description="The GPU's utilisation (all its processes)")


class RankGpus(StrictModel):
    rank: int | None
    pid: int
    gpus: list[int]


class Placement(StrictModel):
    gpus: list[GpuRow] = Field(default_factory=list)
    ranks: list[RankGpus] = Field(default_factory=list)
    findings: list[str] = Field(default_factory=list, description="Shared GPUs, visible GPUs with no rank, ranks "
                                "on no GPU; empty when every rank has its own GPU")
    note: str | None = Field(None, description="Why placement is unknown or partial")


def ranks_of(pids: list[int]) -> tuple[dict[int, int | None], list[str | None]]:
    """(pid → RANK, CUDA_VISIBLE_DEVICES per rank) of a run's processes. A DataLoader worker inherits its
    rank's RANK, so a process whose parent has the same RANK is not a rank; without any RANK (a plain
    ``python train.py``) every process counts, with rank None."""
    from ..processes.snapshot import ProcessTable, read_environ

    env = {pid: read_environ(pid, ("RANK", "CUDA_VISIBLE_DEVICES")) for pid in pids}
    parent = ProcessTable.read().parent
    ranks = {pid: int(e["RANK"]) for pid, e in env.items() if e.get("RANK", "").isdigit()
             and env.get(parent.get(pid, 0), {}).get("RANK") != e["RANK"]}
    if not ranks:
        return {pid: None for pid in pids}, [env[pid].get("CUDA_VISIBLE_DEVICES") for pid in pids]
    return dict(ranks), [env[pid].get("CUDA_VISIBLE_DEVICES") for pid in ranks]


def _visible(cuda_visible: list[str | None], count: int) -> set[int]:
    """Indices the ranks can see: the union of their CUDA_VISIBLE_DEVICES (all GPUs if unset or not plain indices)."""
    seen: set[int] = set()
    for value in cuda_visible:
        parts = [p.strip() for p in (value or "").split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            return set(range(count))
        seen.update(int(p) for p in parts)
    return seen or set(range(count))


def gpu_placement(ranks: dict[int, int | None], cuda_visible: list[str | None], backend: NvmlBackend | None = None,
                  timeout_s: float = 5.0, reading: GpuReading | None = None) -> Placement | None:
    """Map run processes (pid → rank, None for a process without RANK) to GPUs. None: no GPU here.
    ``reading``: NVML as already read (run_status shares one with run_gpu_use)."""
    reading = reading or GpuReading.read(backend, timeout_s)
    holders, note = reading.holders, reading.note
    if note:
        return Placement(note=note) if "unavailable" not in note else None
    if not holders:
        return None
    visible = _visible(cuda_visible, len(holders))
    rows: list[GpuRow] = []
    on: dict[int, list[int]] = {pid: [] for pid in ranks}
    listed_any = False
    for gpu in holders:
        procs = gpu.processes if isinstance(gpu.processes, tuple) else ()
        listed_any = listed_any or bool(procs)
        mine = [p for p in procs if p.pid in ranks]
        for proc in mine:
            on[proc.pid].append(gpu.index)
        util = None
        if mine or gpu.index in visible:
            util = reading.util(gpu.index)
            note = reading.faults.get(gpu.index, note)
        used = [p.used_bytes for p in mine if p.used_bytes is not None]
        rows.append(GpuRow(gpu=gpu.index, visible=gpu.index in visible,
                           ranks=sorted(r for p in mine if (r := ranks[p.pid]) is not None),
                           pids=sorted(p.pid for p in mine), used_bytes=sum(used) if used else None, util_percent=util))
    by_rank = [RankGpus(rank=rank, pid=pid, gpus=sorted(on[pid])) for pid, rank in
               sorted(ranks.items(), key=lambda kv: (kv[1] is None, kv[1] if kv[1] is not None else kv[0]))]
    placement = Placement(gpus=rows, ranks=by_rank, note=note)
    if not any(r.gpus for r in by_rank):
        busy = [r.gpu for r in rows if r.util_percent]
        placement.note = note or (
            "NVML lists processes but none of the run's pids (a container with its own PID namespace sees host "
            "pids): placement unknown" if listed_any else
            "NVML lists no process on any GPU" + (" although some are busy (a container hides them)" if busy else
                                                   ": the run holds no GPU memory (it runs on CPU, or has not "
                                                   "created its CUDA context yet)"))
        return placement
    placement.findings = _findings(rows, by_rank)
    return placement


def _findings(rows: list[GpuRow], by_rank: list[RankGpus]) -> list[str]:
    found = []
    for row in rows:
        if len(row.ranks) > 1:
            found.append(f"{rank_ranges(row.ranks)} share GPU {row.gpu} (every rank on cuda:0? set the device from "
                         "LOCAL_RANK: DIST-01)")
    idle = [row.gpu for row in rows if row.visible and not row.pids]
    if idle:
        which = ", ".join(map(str, idle))
        found.append(f"GPU{'s' if len(idle) > 1 else ''} {which} visible to the run but used by no rank")
    lost = [r for r in by_rank if r.rank is not None and not r.gpus]
    if lost:
        found.append(f"{rank_ranges(r.rank for r in lost if r.rank is not None)} hold no GPU memory (on CPU, or "
                     "not started yet)")
    return found


def placement_text(placement: Placement) -> list[str]:
    """Lines for run_status: one per GPU the run uses or can see, then the findings."""
    lines = []
    for row in placement.gpus:
        if not row.visible and not row.pids:
            continue
        who = rank_ranges(row.ranks) if row.ranks else (f"pids {', '.join(map(str, row.pids))}" if row.pids else
                                                         "no rank")
        busy = f"{row.util_percent} % busy" if row.util_percent is not None else "load unread"
        lines.append(f"GPU {row.gpu}: {who} · {busy}")
    lines += [f"placement: {f}" for f in placement.findings]
    if placement.note:
        lines.append(f"placement: {placement.note}")
    return lines
