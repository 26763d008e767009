"""reap_vram_zombies: classify every VRAM holder and every RAM orphan, and free what is provably a stale orphan of
ours.

Classification is ``holders.classify`` (GPU holders, through NVML) and ``holders.ram_orphans`` (helpers of a dead
job that hold host memory, from /proc alone: DataLoader workers, multiprocessing children, torchrun ranks whose
parent died; "memory gone after I killed my run"); killing is ``processes.safekill.safe_kill``, the same
two-phase machinery as kill_port_holders (dry run → confirm token bound to pid, start time, uid, command line and
the box → SIGTERM, grace, optional SIGKILL, children first, protected and ancestor processes refused). This module
only chooses the candidates (same-user orphans proven to hold the GPU or left behind by their parent, and their
device-holding descendants), passes them on, and reports VRAM and RAM before and after. Without NVML the GPU part
is skipped with its reason and the RAM part still runs.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from functools import partial

from pydantic import Field

from ..models import EntryRef, StrictModel, Verdict
from ..nvml_session import NO_GPU_REASONS, NvmlFault
from ..processes.safekill import KillReport, Signal, safe_kill, whole_command
from ..tables import gib
from ..toolspec import Progress, cli_host_args, no_progress
from .backend import GpuProcesses, Memory, NvmlBackend
from .checks import E_HANG, E_NAMESPACED, E_ORPHANS, E_PKILL
from .holders import Holder, HolderClass, LocalProcesses, ProcessSource, RamOrphan, classify, ram_orphans
from .probe import EXIT_FAIL, EXIT_NO_GPU, EXIT_OK, select_indices


class HolderRow(StrictModel):
    gpu: int = Field(description="NVML GPU index")
    pid: int
    kind: HolderClass = Field(description="active, orphan, zombie, uninterruptible, namespaced, phantom, invalid_pid")
    nvml_listed: bool = Field(description="False: found only by scanning /proc for open /dev/nvidia* files")
    used_bytes: int | None = Field(description="VRAM NVML attributes to the pid (null: not reported, e.g. MIG)")
    command: str
    user: str | None
    status: str | None = Field(description="psutil status: running, sleeping, zombie, disk-sleep, ...")
    age_s: float | None
    holds_device: bool | None = Field(description="Has this GPU's /dev/nvidiaN open (null: its files are unreadable)")
    candidate: bool = Field(description="Offered to the safe kill (which can still refuse it)")
    reason: str
    remedy: str
    local_holders: list[int] = Field(default_factory=list, description="For namespaced: local pids holding the GPU")


class RamOrphanRow(StrictModel):
    pid: int
    ppid: int
    kind: str = Field(description="DataLoader worker, multiprocessing child or torchrun rank")
    rss_bytes: int | None = Field(description="Resident host memory it holds")
    command: str
    user: str | None
    age_s: float | None
    candidate: bool = Field(description="Offered to the safe kill (which can still refuse it)")
    reason: str


class GpuMemoryRow(StrictModel):
    gpu: int
    used_bytes_before: int | None
    used_bytes_after: int | None = Field(None, description="After a real run; null in a dry run")


class ZombieReport(StrictModel):
    verdict: Verdict = Field(description="PASS: no stale holder. WARN: stale holders found (dry run), or some need a "
                             "remedy this tool cannot apply. FAIL: a real run left a target alive or was refused")
    exit_code: int = Field(description="What `rgt zombies` exits with: 0 done, 1 a target survived or the token did "
                           "not match, 2 bad input, 4 no NVIDIA GPU")
    summary: str
    dry_run: bool
    backend: str
    gpus_found: int
    in_container: bool
    holders: list[HolderRow]
    kill: KillReport | None = Field(None, description="The safe-kill step: targets with action/refusal/outcome")
    confirm_token: str | None = Field(None, description="Pass back with dry_run=false to signal exactly the "
                                      "would_signal targets")
    memory: list[GpuMemoryRow]
    ram_orphans: list[RamOrphanRow] = Field(default_factory=list, description="Helpers of a dead job that hold host "
                                            "RAM (read from /proc, with or without NVML)")
    next_step: str
    notes: list[str] = Field(default_factory=list)
    references: list[EntryRef]


def _row(holder: Holder) -> HolderRow:
    info = holder.info
    return HolderRow(gpu=holder.gpu, pid=holder.pid, kind=holder.cls, nvml_listed=holder.nvml_listed,
                     used_bytes=holder.used_bytes, command=whole_command(holder.command),
                     user=(info.username or (str(info.uid) if info.uid is not None else None)) if info else None,
                     status=info.status if info else None,
                     age_s=round(holder.age_s, 1) if holder.age_s is not None else None,
                     holds_device=holder.holds_device, candidate=holder.candidate, reason=holder.reason,
                     remedy=holder.remedy, local_holders=list(holder.local_holders))


def candidates_of(holders: Sequence[Holder]) -> dict[int, str]:
    """pid → why, one entry per process even when it holds several GPUs."""
    gpus: dict[int, list[str]] = {}
    role: dict[int, str] = {}
    for holder in holders:
        if holder.candidate:
            used = f", {gib(holder.used_bytes, 1)}" if holder.used_bytes else ""
            gpus.setdefault(holder.pid, []).append(f"GPU {holder.gpu}{used}")
            role[holder.pid] = "orphan" if holder.cls is HolderClass.ORPHAN else "child of an orphan"
    return {pid: f"{role[pid]} holding {'; '.join(held)}" for pid, held in gpus.items()}


class ReapInput(StrictModel):
    dry_run: bool = Field(True, description="Only classify and report what would be signalled; returns a "
                          "confirm_token. Nothing is signalled unless this is false and the token matches.")
    signal: Signal = Field("TERM", description="TERM: SIGTERM, wait grace_s, report survivors. KILL: SIGTERM, wait "
                           "grace_s, then SIGKILL whatever is still alive.")
    grace_s: float = Field(10.0, ge=0, le=120, description="Seconds to wait after SIGTERM.")
    confirm_token: str | None = Field(None, min_length=1, max_length=8192, description="The confirm_token from the "
                                      "dry run; required when dry_run is false. Binds pid, start time, uid and "
                                      "command line of each target, so a restarted or reused pid is refused.")
    indices: list[int] | None = Field(None, description="Only these GPUs (NVML indices); default all.")
    min_age_s: float = Field(60.0, ge=0, le=86400, description="Orphans younger than this are not offered for "
                             "killing (a job may still be starting up).")
    timeout_s: float = Field(30.0, ge=1, le=300, description="Longest wait for NVML (it can hang on a sick GPU).")


def _cli_command(args: ReapInput, token: str) -> str:
    parts = ["rgt", "zombies", *cli_host_args(), "--no-dry-run", "--signal", args.signal,
             "--grace-s", f"{args.grace_s:g}", "--min-age-s", f"{args.min_age_s:g}"]
    if args.indices:
        parts += ["--indices", *map(str, args.indices)]
    return shlex.join([*parts, "--confirm-token", token])


def _read_all(backend: NvmlBackend, indices: list[int], timeout_s: float) -> tuple[list[GpuProcesses], str | None]:
    """Process lists of ``indices`` through the NVML worker; stops at the first hang (or a crash the
    worker could not get past) and says where."""
    deadline = time.monotonic() + timeout_s
    gpus = []
    for index in indices:
        try:
            gpus.append(backend.worker.call(partial(backend.read_processes, index), f"processes GPU {index}",
                                            max(deadline - time.monotonic(), 0.05)))
        except NvmlFault as fault:
            what = "hung" if isinstance(fault, TimeoutError) else "failed"
            return gpus, f"NVML {what} on GPU {index} ({fault}); GPUs after it were not read: run gpu_health"
    return gpus, None


def _used(gpus: Sequence[GpuProcesses]) -> dict[int, int | None]:
    return {g.index: g.memory.used if isinstance(g.memory, Memory) else None for g in gpus}


KillStep = Callable[..., KillReport]


def _ram_row(orphan: RamOrphan) -> RamOrphanRow:
    info = orphan.info
    return RamOrphanRow(pid=info.pid, ppid=info.ppid, kind=orphan.kind, rss_bytes=orphan.rss_bytes,
                        command=whole_command(info.command),
                        user=info.username or (str(info.uid) if info.uid is not None else None),
                        age_s=round(orphan.age_s, 1) if orphan.age_s is not None else None,
                        candidate=orphan.candidate, reason=orphan.reason)


def reap(args: ReapInput, backend: NvmlBackend, *, processes: ProcessSource | None = None,
         kill_step: KillStep | None = safe_kill, progress: Progress = no_progress) -> ZombieReport:
    """Dry run (default) or confirmed reap. See the module docstring.

    ``kill_step`` is ``safe_kill``; None skips it (a fake scenario's pids are not this machine's, so neither
    are RAM orphans read for it).
    """
    source = processes or LocalProcesses()
    refs = [E_ORPHANS, E_PKILL]
    status = backend.open(args.timeout_s)
    base = dict(dry_run=args.dry_run, backend=backend.name, in_container=source.in_container(), references=refs)
    ram = [_ram_row(o) for o in ram_orphans(source, args.min_age_s)] if kill_step is not None else []
    ram_candidates = {r.pid: f"{r.kind} left behind by its dead parent, holding {gib(r.rss_bytes, 2)} of RAM"
                      for r in ram if r.candidate}
    if not status.ok:
        no_gpu = status.reason in NO_GPU_REASONS
        note = f"NVML unavailable ({status.reason}): {status.detail}"
        if not ram:
            return ZombieReport(**base, verdict=Verdict.FAIL if not no_gpu else Verdict.SKIP,
                                exit_code=EXIT_NO_GPU if no_gpu else EXIT_FAIL, gpus_found=0, holders=[], memory=[],
                                summary=f"{note}; no helper of a dead job holds RAM",
                                next_step="No GPU holder can be read without NVML (gpu_health gives the driver "
                                          "diagnosis) and no RAM orphan was found.")
        kill = _kill(args, kill_step, ram_candidates, progress)
        return _judge(args, base, 0, [], kill, [], [f"{note}: VRAM holders were not checked"], ram=ram,
                      offered=len(ram_candidates))
    count = status.device_count or 0
    indices = select_indices(args.indices, count)
    notes: list[str] = []
    progress(0, 3, "reading NVML process lists")
    gpus, hang = _read_all(backend, indices, args.timeout_s)
    before = _used(gpus)
    progress(1, 3, "classifying holders")
    result = classify(gpus, source, args.min_age_s)
    notes += result.notes
    candidates = {**ram_candidates, **candidates_of(result.holders)}
    rows = [_row(h) for h in result.holders]
    kill = None
    if kill_step is None:
        notes.append("fake scenario: candidates are neither fingerprinted nor signalled")
    else:
        kill = _kill(args, kill_step, candidates, progress)
    memory = [GpuMemoryRow(gpu=i, used_bytes_before=before.get(i)) for i in before]
    if kill is not None and kill.executed:
        time.sleep(0.5)  # the driver frees a context shortly after its last holder exits
        after_gpus, hang_after = _read_all(backend, list(before), args.timeout_s)
        hang = hang or hang_after
        after = _used(after_gpus)
        memory = [GpuMemoryRow(gpu=i, used_bytes_before=before[i], used_bytes_after=after.get(i)) for i in before]
    if any(h.cls in (HolderClass.NAMESPACED, HolderClass.PHANTOM) for h in result.holders):
        refs.append(E_NAMESPACED)
    if any(h.cls is HolderClass.UNINTERRUPTIBLE for h in result.holders):
        refs.append(E_HANG)
    report = _judge(args, base, count, rows, kill, memory, notes, ram=ram, offered=len(candidates))
    if hang:  # the holders listed are real, but the picture is incomplete and a GPU is sick
        report = report.model_copy(update=dict(verdict=Verdict.FAIL, exit_code=EXIT_FAIL,
                                               summary=f"{hang}. {report.summary}",
                                               references=refs if E_HANG in refs else [*refs, E_HANG]))
    return report


def _kill(args: ReapInput, kill_step: KillStep | None, candidates: dict[int, str],
          progress: Progress) -> KillReport | None:
    if kill_step is None or not (candidates or not args.dry_run):
        return None
    progress(2, 3, "safe kill" if not args.dry_run else "fingerprinting candidates")
    return kill_step(candidates, dry_run=args.dry_run, confirm_token=args.confirm_token, signal=args.signal,
                     grace_s=args.grace_s, progress=progress)


def _judge(args: ReapInput, base: dict, count: int, rows: list[HolderRow], kill: KillReport | None,
           memory: list[GpuMemoryRow], notes: list[str], offered: int,
           ram: list[RamOrphanRow] | None = None) -> ZombieReport:
    ram = ram or []
    stale = [r for r in rows if r.kind is not HolderClass.ACTIVE] + [r for r in ram if r.candidate]
    would = [t for t in kill.targets if t.action == "would_signal"] if kill else []
    common = dict(**base, gpus_found=count, holders=rows, kill=kill, memory=memory, notes=notes,
                  confirm_token=kill.confirm_token if kill else None, ram_orphans=ram)
    counts = {k: sum(r.kind is k for r in rows) for k in HolderClass}
    kinds = ", ".join([f"{n} {k.value}" for k, n in counts.items() if n]
                      + ([f"{len(ram)} RAM orphan(s) holding {gib(sum(r.rss_bytes or 0 for r in ram), 2)}"]
                         if ram else []))
    if kill is not None and kill.token_problems:
        return ZombieReport(**common, verdict=Verdict.FAIL, exit_code=EXIT_FAIL,
                            summary="Nothing was signalled: processes changed since the dry run. "
                                    + " ".join(kill.token_problems),
                            next_step="Review the targets (a fresh confirm_token is included) and confirm again.")
    if kill is not None and kill.executed:
        survivors = [t for t in kill.targets if t.outcome in ("survived_term", "unkillable", "permission_denied")]
        freed = sum(max(0, (m.used_bytes_before or 0) - (m.used_bytes_after or 0)) for m in memory)
        ram_freed = sum(r.rss_bytes or 0 for r in ram if any(t.pid == r.pid and t.action == "signalled"
                                                              for t in kill.targets))
        summary = (f"Signalled {sum(t.action == 'signalled' for t in kill.targets)} process(es); VRAM freed "
                   f"{freed / (1 << 30):.1f} GiB" + (f", RAM freed {gib(ram_freed, 2)}" if ram_freed else "")
                   + (f"; {len(survivors)} survived" if survivors else ""))
        step = ("Some ignored SIGTERM: run the dry run again and confirm with signal=KILL." if
                any(t.outcome == "survived_term" for t in survivors) else
                "Check gpu_health; remaining holders need the remedy in their row.")
        return ZombieReport(**common, verdict=Verdict.FAIL if survivors else Verdict.PASS,
                            exit_code=EXIT_FAIL if survivors else EXIT_OK, summary=summary, next_step=step)
    if not rows and not ram:
        return ZombieReport(**common, verdict=Verdict.PASS, exit_code=EXIT_OK,
                            summary=f"No process holds VRAM on {len(memory)} GPU(s), no helper of a dead job holds RAM",
                            next_step="Nothing to do.")
    if not stale and not would:
        return ZombieReport(**common, verdict=Verdict.PASS, exit_code=EXIT_OK,
                            summary=f"{len(rows)} holder(s), all active jobs: nothing stale",
                            next_step="Nothing to reap. Stop a running job from where it was started.")
    if kill is None and offered:
        summary = f"{kinds}; {offered} candidate(s), not signalled (fake scenario)"
    else:
        summary = kinds + (f"; would signal {len(would)} process(es)" if would else "; nothing this tool may signal")
    if would and kill and kill.confirm_token:
        step = ("Show the would_signal targets to the user (an orphan can be a detached job they still want). "
                "To proceed: call again with dry_run=false and this confirm_token, or "
                f"`{_cli_command(args, kill.confirm_token)}`")
    else:
        step = ("Apply the remedy in each row; this tool only signals same-user orphans proven to hold the GPU or "
                "left behind (with their RAM) by a parent that died.")
    return ZombieReport(**common, verdict=Verdict.WARN, exit_code=EXIT_OK, summary=summary, next_step=step)
