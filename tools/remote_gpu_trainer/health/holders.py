"""Who holds GPU memory, and what kind of holder each one is.

NVML lists the pids that hold VRAM; this module decides, for each, whether it is a live job, an
orphan left behind by a dead launcher, a zombie, a process stuck in the kernel, a pid from another
PID namespace, a context nobody holds any more, or a pid NVML cannot have meant. Evidence comes
from the process table (through :class:`ProcessSource`, which tests replace) and from a scan of
``/proc/*/fd`` for open ``/dev/nvidia*`` files: the only proof that a local process really holds a
GPU, because NVML reports *host* pids and the driver has no notion of PID namespaces.

Classes (``HolderClass``):

``active``           alive and its launcher (parent) is alive: a running job. Never a kill candidate.
``orphan``           alive, re-parented to PID 1 or a subreaper because its launcher exited
                     (torchrun killed, SSH dropped). The only class that can be a kill candidate.
``zombie``           exited, not reaped by its parent: signals do nothing; the parent must reap it.
``uninterruptible``  D state, blocked in the kernel (often the driver of a sick GPU): signals wait
                     forever; only a GPU reset or reboot helps.
``namespaced``       NVML's pid is not this namespace's process (we are in a container): the local
                     holders of that GPU's device file are listed instead, never mapped 1:1.
``phantom``          nobody visible holds the GPU: a context leaked by the driver, or a holder outside
                     this container. A GPU reset or a restart frees it, not a signal.
``invalid_pid``      pid 0 or 0xFFFFFFFF or beyond pid_max: nvidia-ml-py and the driver disagree on
                     the process struct layout (scrambled pids).

A kill candidate must be an orphan, owned by the caller's uid, proven to hold that GPU's
``/dev/nvidiaN`` and at least ``min_age_s`` old; descendants of a candidate that hold a GPU device
file go with it (DataLoader workers keep the CUDA context alive). Everything else gets a remedy.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from ..hostinfo import in_container
from ..processes.snapshot import DISK_SLEEP, ZOMBIE, ProcessTable, ProcInfo, snapshot
from ..processes.workers import is_run_supervisor, worker_kind
from .backend import GpuProcesses, Unread

DEVICE_PREFIX = "/dev/nvidia"
INVALID_PIDS = frozenset({0, 0xFFFFFFFF})
DEFAULT_PID_MAX = 4194304  # the kernel's upper bound (PID_MAX_LIMIT on 64-bit)
D_STATE_CONFIRM_S = 1.0
D_STATE_POLL_S = 0.1

# Processes that adopt orphans: PID 1 of hosts and containers, and the usual subreapers.
ADOPTERS = frozenset({"init", "systemd", "tini", "dumb-init", "docker-init", "catatonit", "s6-svscan",
                      "runit", "runsvdir", "containerd-shim", "containerd-shim-runc-v2", "conmon", "pause"})


class HolderClass(StrEnum):
    ACTIVE = "active"
    ORPHAN = "orphan"
    ZOMBIE = "zombie"
    UNINTERRUPTIBLE = "uninterruptible"
    NAMESPACED = "namespaced"
    PHANTOM = "phantom"
    INVALID_PID = "invalid_pid"


@dataclass(frozen=True)
class DeviceUse:
    """GPU device files one process has open."""

    minors: frozenset[int] = frozenset()
    """N of each open /dev/nvidiaN."""
    uvm: bool = False
    """/dev/nvidia-uvm open: the CUDA runtime opens it, NVML-only monitors do not."""


@dataclass(frozen=True)
class DeviceScan:
    holders: dict[int, DeviceUse]
    unreadable: frozenset[int]
    """Pids whose open files we may not list (other users' processes when not root)."""


def scan_device_holders(prefix: str = DEVICE_PREFIX, proc: str = "/proc") -> DeviceScan:
    """Every process with a GPU device file open, from ``/proc/<pid>/fd`` (about 10 ms for ~100 processes).

    ``prefix`` is injectable so tests can have real processes open stand-in files.
    """
    pattern = re.compile(re.escape(prefix) + r"(\d+|-uvm)$")
    holders: dict[int, DeviceUse] = {}
    unreadable: set[int] = set()
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except PermissionError:
            unreadable.add(pid)
            continue
        except OSError:  # exited meanwhile
            continue
        minors: set[int] = set()
        uvm = False
        for fd in fds:
            try:
                target = os.readlink(f"{proc}/{pid}/fd/{fd}")
            except OSError:
                continue
            match = pattern.match(target)
            if match is None:
                continue
            if match.group(1) == "-uvm":
                uvm = True
            else:
                minors.add(int(match.group(1)))
        if minors or uvm:
            holders[pid] = DeviceUse(frozenset(minors), uvm)
    return DeviceScan(holders, frozenset(unreadable))


class ProcessSource(Protocol):
    """Everything classification asks about processes; ``LocalProcesses`` reads the real ones."""

    def info(self, pid: int) -> ProcInfo | None: ...

    def pgid(self, pid: int) -> int | None: ...

    def systemd_unit(self, pid: int) -> str | None: ...

    def devices(self) -> DeviceScan: ...

    def descendants(self, pid: int) -> list[int]: ...

    def in_container(self) -> bool: ...

    def uid(self) -> int: ...

    def pid_max(self) -> int: ...

    def now(self) -> float: ...

    def wait(self, seconds: float) -> None: ...


class LocalProcesses:
    """The processes of this machine (or container), via psutil and /proc. One instance = one
    consistent-enough view: the device scan and the process tree are read once and cached."""

    def __init__(self, device_prefix: str = DEVICE_PREFIX):
        self.device_prefix = device_prefix
        self._scan: DeviceScan | None = None
        self._table: ProcessTable | None = None

    def info(self, pid: int) -> ProcInfo | None:
        return snapshot(pid)

    def pgid(self, pid: int) -> int | None:
        try:
            return os.getpgid(pid)
        except OSError:
            return None

    def systemd_unit(self, pid: int) -> str | None:
        """The ``*.service`` that systemd started this process in, if any: such a process has
        systemd as its real parent, so ppid 1 does not make it an orphan."""
        try:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        for line in cgroup.splitlines():
            leaf = line.rsplit("/", 1)[-1]
            if leaf.endswith(".service"):
                return leaf
        return None

    def devices(self) -> DeviceScan:
        if self._scan is None:
            self._scan = scan_device_holders(self.device_prefix)
        return self._scan

    def descendants(self, pid: int) -> list[int]:
        if self._table is None:
            self._table = ProcessTable.read()
        return self._table.descendants(pid)

    def in_container(self) -> bool:
        return in_container()

    def uid(self) -> int:
        return os.getuid()

    def pid_max(self) -> int:
        try:
            return int(Path("/proc/sys/kernel/pid_max").read_text())
        except (OSError, ValueError):
            return DEFAULT_PID_MAX

    def now(self) -> float:
        return time.time()

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(frozen=True)
class Holder:
    """One process holding (or said by NVML to hold) a GPU, classified."""

    gpu: int
    pid: int
    cls: HolderClass
    reason: str
    """Why it got this class, in words."""
    remedy: str
    nvml_listed: bool = True
    """False for a local process found only by the /dev/nvidia* scan (a container's own view)."""
    used_bytes: int | None = None
    info: ProcInfo | None = None
    holds_device: bool | None = None
    """Proven to have /dev/nvidiaN of this GPU open; None when its open files are unreadable."""
    candidate: bool = False
    """May be offered to the safe-kill step (which applies its own refusal rules on top)."""
    local_holders: tuple[int, ...] = ()
    """For namespaced: the local pids that hold this GPU's device file."""
    age_s: float | None = None

    @property
    def command(self) -> str:
        return self.info.command if self.info else ""


@dataclass(frozen=True)
class Classification:
    holders: list[Holder]
    in_container: bool
    notes: list[str] = field(default_factory=list)


def parent_gone(info: ProcInfo, source: ProcessSource) -> tuple[bool, str]:
    """Was this process re-parented because its launcher exited? ``(answer, why)``.

    Linux does not record the original parent, so the evidence is indirect and errs towards "no":
    the parent is PID 1 or a known subreaper, *and* the process is neither a systemd service, nor
    a deliberately detached session leader (``setsid``, daemons), nor in its parent's own process
    group (a child that PID 1 itself started, e.g. by a container's entrypoint script). A run supervisor's
    own job and what it adopted from a detaching launcher are its live run, never gone (``_supervised_job``).
    """
    if info.ppid <= 0:
        return False, "no parent (kernel process)"
    parent = source.info(info.ppid)
    parent_name = parent.name if parent else "?"
    if info.ppid != 1 and parent_name not in ADOPTERS and not is_run_supervisor(parent):
        return False, f"its parent pid {info.ppid} ({parent_name}) is alive"
    if is_run_supervisor(parent):
        live = _supervised_job(info, parent)
        if live:
            return False, live
        parent_name = "a run supervisor, the subreaper of its run"
    unit = source.systemd_unit(info.pid)
    if unit:
        return False, f"started by systemd unit {unit}"
    if info.sid == info.pid:
        return False, "leads its own session (started detached with setsid or as a daemon)"
    pgid = source.pgid(info.pid)
    if pgid is not None and pgid == source.pgid(info.ppid):
        return False, f"in the process group of its parent pid {info.ppid} ({parent_name}), which started it"
    return True, f"re-parented to pid {info.ppid} ({parent_name}): the process that launched it has exited"


def _supervised_job(info: ProcInfo, supervisor: ProcInfo) -> str | None:
    """Why a child of a live run supervisor is part of its running job, or None for a helper left behind.

    The supervisor starts the job itself (in a process group of its own, so the group test below cannot see
    the link) and, as the run's subreaper, adopts what the launcher detached (``nohup python train.py &``):
    both are the live run, not leftovers, while the supervisor watches it. Only a helper kind (a DataLoader
    worker, a multiprocessing child, a torchrun rank) can reach the supervisor because the process that
    started it died: those may be orphans (the RAM-orphan case). The supervisor's own launched child is never
    one, whatever its kind.
    """
    run_id = Path(supervisor.cmdline[-1]).name if supervisor.cmdline else "?"
    if info.pid == _launched_pid(supervisor):
        return f"the job that run {run_id}'s supervisor (pid {supervisor.pid}) started and still follows"
    kind = worker_kind(info)
    if kind is None:
        return (f"a process of run {run_id}, adopted by its supervisor (pid {supervisor.pid}) after its launcher "
                "detached it (nohup/&): the run is live while the supervisor follows it")
    return None


def _launched_pid(supervisor: ProcInfo) -> int | None:
    """The pid the supervisor started, from its run's meta.json (the run folder is its last argument)."""
    from ..runs.ledger import RunDir

    if len(supervisor.cmdline) < 2:
        return None
    pid = RunDir(Path(supervisor.cmdline[-1])).meta().get("pid")
    return pid if isinstance(pid, int) else None


def _remedy_for_state(cls: HolderClass, info: ProcInfo, source: ProcessSource) -> str:
    if cls is HolderClass.ZOMBIE:
        parent = source.info(info.ppid)
        name = f" ({parent.name})" if parent else ""
        return (f"already exited; its parent pid {info.ppid}{name} has not reaped it. Ending or fixing that parent "
                "clears it; if VRAM stays used after that, a child still holds the CUDA context")
    if cls is HolderClass.UNINTERRUPTIBLE:
        return ("stuck in the kernel (D state): signals wait until the driver call returns, which on a sick GPU may "
                "be never. A GPU reset (nvidia-smi -r, root, idle GPU) or a reboot frees it: the user's call")
    if cls is HolderClass.ORPHAN:
        return ("stale if its job is gone: reap_vram_zombies (dry run) offers it when it is yours; a detached job "
                "you still want (nohup/setsid) is also an orphan, so check the command and age first")
    return "a running job: stop it from where it was started if it should not be here"


def _settled(info: ProcInfo, source: ProcessSource) -> ProcInfo:
    """The process's state once a D state has had time to pass. Brief D states are normal (page
    faults, reading a dataset, NFS); only one that lasts D_STATE_CONFIRM_S means "stuck"."""
    waited = 0.0
    while info.status == DISK_SLEEP and waited < D_STATE_CONFIRM_S:
        source.wait(D_STATE_POLL_S)
        waited += D_STATE_POLL_S
        again = source.info(info.pid)
        if again is None or again.create_time != info.create_time:
            return info  # exited (or pid reused) meanwhile: keep what we saw
        info = again
    return info


def _state_class(info: ProcInfo, source: ProcessSource) -> tuple[HolderClass, str, ProcInfo]:
    if info.status == ZOMBIE:
        return HolderClass.ZOMBIE, "zombie: exited, waiting for its parent to reap it", info
    info = _settled(info, source)
    if info.status == DISK_SLEEP:
        return (HolderClass.UNINTERRUPTIBLE, f"D state for {D_STATE_CONFIRM_S:g} s and more: blocked in an "
                "uninterruptible kernel call", info)
    gone, why = parent_gone(info, source)
    return (HolderClass.ORPHAN if gone else HolderClass.ACTIVE), why, info


def _age(info: ProcInfo | None, now: float) -> float | None:
    return None if info is None or info.create_time is None else max(0.0, now - info.create_time)


def _candidate(holder: Holder, source: ProcessSource, min_age_s: float) -> tuple[bool, str]:
    if holder.cls is not HolderClass.ORPHAN or holder.info is None:
        return False, ""
    if holder.info.uid != source.uid():
        return False, "owned by another user: not offered for killing"
    if holder.holds_device is not True:
        return False, "not proven to hold the GPU's device file: not offered for killing"
    if holder.age_s is None or holder.age_s < min_age_s:
        return False, f"younger than min_age_s={min_age_s:g} s: may still be starting up"
    return True, ""


def classify(gpus: Sequence[GpuProcesses], source: ProcessSource, min_age_s: float = 60.0,
             include_local: bool = True) -> Classification:
    """Classify every NVML-listed holder of ``gpus`` and, with ``include_local``, the local CUDA
    processes NVML did not list (in a container NVML's pids are host pids, so these are the only
    pids we can act on). The /proc fd scan runs only when something needs it."""
    container = source.in_container()
    now = source.now()
    pid_max = source.pid_max()
    me = os.getpid()
    notes: list[str] = []
    minor_to_gpu = {g.minor: g.index for g in gpus if isinstance(g.minor, int)}
    holders: list[Holder] = []
    listed_here: set[tuple[int, int]] = set()  # (gpu, local pid) covered by an NVML row

    def holds(pid: int, minor: object) -> bool | None:
        scan = source.devices()
        if pid in scan.unreadable or not isinstance(minor, int):
            return None
        return minor in scan.holders.get(pid, DeviceUse()).minors

    def local_holders_of(minor: object) -> tuple[int, ...]:
        """Local CUDA processes on that GPU. /dev/nvidia-uvm marks a CUDA context: NVML-only monitors
        (nvidia-persistenced, nvtop, this server) open /dev/nvidiaN too but hold no VRAM."""
        return tuple(sorted(pid for pid, use in source.devices().holders.items()
                            if isinstance(minor, int) and minor in use.minors and use.uvm and pid != me))

    for gpu in gpus:
        if gpu.lost is not None or isinstance(gpu.processes, Unread):
            why = gpu.lost or gpu.processes
            notes.append(f"GPU {gpu.index}: process list unreadable ({why.call}: {why.detail or why.kind})")
            continue
        device = f"/dev/nvidia{gpu.minor}" if isinstance(gpu.minor, int) else "its /dev/nvidiaN"
        for proc in gpu.processes:
            base = Holder(gpu=gpu.index, pid=proc.pid, cls=HolderClass.ACTIVE, reason="", remedy="",
                          used_bytes=proc.used_bytes)
            if proc.pid in INVALID_PIDS or proc.pid > pid_max:
                holders.append(replace(base, cls=HolderClass.INVALID_PID,
                                       reason=f"pid {proc.pid} cannot exist (pid_max {pid_max})",
                                       remedy="nvidia-ml-py and the driver disagree on the process struct: install "
                                              "an nvidia-ml-py matching the driver's major version"))
                continue
            info = source.info(proc.pid)
            exited_or_stuck = info is not None and info.status in (ZOMBIE, DISK_SLEEP)  # a zombie has no open files
            if info is None or (holds(proc.pid, gpu.minor) is False and not exited_or_stuck):
                local = local_holders_of(gpu.minor)
                other = "" if info is None else \
                    f"local pid {proc.pid} is a different process (it does not hold {device}); "
                if local:
                    holders.append(replace(
                        base, cls=HolderClass.NAMESPACED, info=None, local_holders=local,
                        reason=f"{other}NVML reports host pids and this pid is not ours to see"
                               f"{' (container)' if container else ''}; local holders of {device}: "
                               f"{', '.join(map(str, local))}",
                        remedy="act on the local holders (listed as their own rows), never on this pid"))
                else:
                    where = ("outside this container (another tenant or the host), or a context leaked by the driver"
                             if container else "a context the driver kept after its process died")
                    holders.append(replace(
                        base, cls=HolderClass.PHANTOM, info=None,
                        reason=f"{other}no process here holds {device}: {where}",
                        remedy=("restart the pod/container, or ask the provider to reset the GPU" if container else
                                f"reset the idle GPU (sudo nvidia-smi -r -i {gpu.index}) or reboot: the user's call")))
                continue
            cls, why, info = _state_class(info, source)
            holder = replace(base, cls=cls, reason=why, remedy=_remedy_for_state(cls, info, source), info=info,
                             holds_device=holds(proc.pid, gpu.minor), age_s=_age(info, now))
            listed_here.add((gpu.index, proc.pid))
            holders.append(holder)

    # Local CUDA processes on the GPUs we looked at that no NVML row accounts for (in a container:
    # all of them, since NVML's pids are host pids).
    for pid, use in sorted(source.devices().holders.items() if include_local else ()):
        if pid == me or not use.uvm:
            continue
        for minor in sorted(use.minors):
            gpu_index = minor_to_gpu.get(minor)
            if gpu_index is None or (gpu_index, pid) in listed_here:
                continue
            info = source.info(pid)
            if info is None:
                continue
            cls, why, info = _state_class(info, source)
            holders.append(Holder(gpu=gpu_index, pid=pid, cls=cls, nvml_listed=False, info=info, holds_device=True,
                                  age_s=_age(info, now),
                                  reason=f"found by the /dev/nvidia{minor} scan (a CUDA context: /dev/nvidia-uvm "
                                         f"open), not in NVML's list; {why}",
                                  remedy=_remedy_for_state(cls, info, source)))

    holders = [_with_candidacy(h, source, min_age_s) for h in holders]
    return Classification(_with_descendants(holders, source), container, notes)


def _with_candidacy(holder: Holder, source: ProcessSource, min_age_s: float) -> Holder:
    ok, why_not = _candidate(holder, source, min_age_s)
    if why_not:
        return replace(holder, reason=f"{holder.reason}; {why_not}")
    return replace(holder, candidate=ok)


def _with_descendants(holders: list[Holder], source: ProcessSource) -> list[Holder]:
    """A candidate's descendants that hold a GPU device file go with it: DataLoader workers forked
    after CUDA init keep the context (and the VRAM) alive after their parent dies."""
    roots = {h.pid for h in holders if h.candidate}
    if not roots:
        return holders
    scan = source.devices()
    joined: dict[int, int] = {}
    for root in sorted(roots):
        for child in source.descendants(root):
            if child in scan.holders and child not in roots:
                joined.setdefault(child, root)
    if not joined:
        return holders
    out = []
    for holder in holders:
        root = joined.get(holder.pid)
        if root is not None and holder.cls is HolderClass.ACTIVE and holder.info and holder.info.uid == source.uid():
            holder = replace(holder, candidate=True,
                             reason=f"{holder.reason}; descendant of orphan {root} holding a GPU device file: "
                                    "goes with it")
        out.append(holder)
    return out


def summarize(holders: Iterable[Holder]) -> dict[HolderClass, int]:
    counts: dict[HolderClass, int] = {}
    for holder in holders:
        counts[holder.cls] = counts.get(holder.cls, 0) + 1
    return counts


# ------------------------------------------------------------------ orphans that hold host RAM


@dataclass(frozen=True)
class RamOrphan:
    """A helper of a training job (DataLoader worker, multiprocessing child, torchrun rank) re-parented after the
    process it served died, and the host memory it keeps."""

    info: ProcInfo
    kind: str
    rss_bytes: int | None
    candidate: bool
    reason: str
    age_s: float | None


def _rss(pid: int) -> int | None:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None


def ram_orphans(source: ProcessSource, min_age_s: float, table: ProcessTable | None = None) -> list[RamOrphan]:
    """Helpers of a dead job that hold RAM, found without NVML: a process of a helper kind
    (``processes/workers.py``) whose parent is PID 1, a known subreaper or a run supervisor, with the same
    evidence as a GPU orphan (``parent_gone``). A live job's helpers have a live parent and are never listed; a
    main training process detached on purpose (nohup) is no helper kind and is never listed either.
    A candidate is also the caller's own and at least ``min_age_s`` old."""
    table = table or ProcessTable.read()
    me = os.getpid()
    now = source.now()
    adopters = {1}
    for ppid in set(table.parent.values()):
        parent = source.info(ppid) if ppid > 1 else None
        if parent is not None and (parent.name in ADOPTERS or is_run_supervisor(parent)):
            adopters.add(ppid)
    found = []
    for pid, ppid in sorted(table.parent.items()):
        if ppid not in adopters or pid == me or not table.alive(pid):
            continue
        info = source.info(pid)
        kind = worker_kind(info) if info is not None else None
        if info is None or kind is None:
            continue
        gone, why = parent_gone(info, source)
        age = _age(info, now)
        candidate = gone
        if gone and info.uid != source.uid():
            candidate, why = False, f"{why}; owned by another user: not offered for killing"
        elif gone and (age is None or age < min_age_s):
            candidate, why = False, f"{why}; younger than min_age_s={min_age_s:g} s"
        found.append(RamOrphan(info, kind, _rss(pid), candidate, why, age))
    return found
