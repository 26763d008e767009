"""Signal an already-approved set of processes: children first, SIGTERM, wait, optional SIGKILL.

``terminate(targets, escalate=..., grace_s=...)`` takes :class:`ProcInfo` snapshots that passed the
safety rules and the confirm token, and returns one :class:`Outcome` per pid:

1. Order children before parents (deepest in the process tree first). For a torchrun tree the
   workers get SIGTERM a few microseconds before the agent, so the agent is already shutting down
   (not restarting workers) when it notices them exit, and no worker is orphaned holding the GPU.
2. Re-check each pid's start time right before signalling: a pid reused since the snapshot is
   skipped (``pid_reused``); psutil re-checks again inside ``send_signal``.
3. SIGTERM everything in one pass. A stopped process (``T``, e.g. suspended with Ctrl-Z) also gets
   SIGCONT, or the SIGTERM would stay pending forever.
4. Poll until all exited or ``grace_s`` passed, re-reading /proc each time (a stale snapshot in the
   wait loop is how other reapers never notice the exit). An exited child that its parent has not
   reaped yet (zombie) counts as exited: it holds no port or memory.
5. With ``escalate``: SIGKILL the survivors (children first) and wait up to ``kill_wait_s``.
   Without it, survivors are reported as ``survived_term``; nothing is killed without being asked.
6. A survivor of SIGKILL is reported ``unkillable`` (D state: stuck in the kernel).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from ..toolspec import Progress, no_progress
from .snapshot import STOPPED, ZOMBIE, ProcessTable, ProcInfo, read_start_ticks

KILL_WAIT_S = 5.0
POLL_S = 0.05

# Outcome codes, in the words the report uses.
EXITED_AFTER_TERM = "exited_after_term"
EXITED_AFTER_KILL = "exited_after_kill"
SURVIVED_TERM = "survived_term"
UNKILLABLE = "unkillable"
ALREADY_GONE = "already_gone"
PID_REUSED = "pid_reused"
PERMISSION_DENIED = "permission_denied"


@dataclass(frozen=True)
class Outcome:
    pid: int
    code: str
    detail: str


def order_children_first(targets: Sequence[ProcInfo], table: ProcessTable) -> list[ProcInfo]:
    """Deepest first; ties by pid descending (later-started siblings first, the common case)."""
    return sorted(targets, key=lambda info: (table.depth(info.pid), info.pid), reverse=True)


def _same_process(info: ProcInfo) -> bool:
    if info.start_ticks is not None:
        return read_start_ticks(info.pid) == info.start_ticks
    try:
        return info.create_time is not None and abs(psutil.Process(info.pid).create_time() - info.create_time) < 0.02
    except psutil.Error:
        return False


def _exited(proc: psutil.Process) -> bool:
    try:
        # is_running() also says False when the pid now belongs to another process.
        return not proc.is_running() or proc.status() == ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def _wait(procs: list[psutil.Process], timeout_s: float, what: str, progress: Progress) -> list[psutil.Process]:
    """Poll until every process exited or the timeout passed; return those still alive."""
    start = time.monotonic()
    alive = [p for p in procs if not _exited(p)]
    last_report = 0.0
    while alive:
        elapsed = time.monotonic() - start
        if elapsed >= timeout_s:
            break
        if elapsed - last_report >= 0.5:
            progress(round(elapsed, 1), timeout_s, f"waiting for {len(alive)} process(es) to exit after {what}")
            last_report = elapsed
        time.sleep(min(POLL_S, timeout_s - elapsed))
        alive = [p for p in alive if not _exited(p)]
    return alive


def _send(proc: psutil.Process, sig: int, outcomes: dict[int, Outcome]) -> bool:
    """Send ``sig``; on failure record why and return False."""
    try:
        proc.send_signal(sig)
        return True
    except psutil.NoSuchProcess:
        outcomes[proc.pid] = Outcome(proc.pid, ALREADY_GONE, "exited before it was signalled")
    except psutil.AccessDenied:
        outcomes[proc.pid] = Outcome(proc.pid, PERMISSION_DENIED, "the kernel refused the signal (EPERM)")
    return False


def terminate(targets: Sequence[ProcInfo], *, escalate: bool, grace_s: float, kill_wait_s: float = KILL_WAIT_S,
              table: ProcessTable | None = None, progress: Progress = no_progress) -> dict[int, Outcome]:
    """Signal ``targets`` (already approved!) as described in the module docstring."""
    table = table or ProcessTable.read()
    outcomes: dict[int, Outcome] = {}
    procs: list[psutil.Process] = []
    for info in order_children_first(targets, table):
        try:
            proc = psutil.Process(info.pid)
        except psutil.NoSuchProcess:
            outcomes[info.pid] = Outcome(info.pid, ALREADY_GONE, "exited before it was signalled")
            continue
        if not _same_process(info):
            outcomes[info.pid] = Outcome(info.pid, PID_REUSED, "the pid now belongs to another process: not signalled")
            continue
        stopped = info.status in STOPPED
        if _send(proc, signal.SIGTERM, outcomes):
            if stopped:
                _send(proc, signal.SIGCONT, {})
            procs.append(proc)

    alive = _wait(procs, grace_s, "SIGTERM", progress)
    for proc in procs:
        if proc not in alive:
            outcomes[proc.pid] = Outcome(proc.pid, EXITED_AFTER_TERM, "exited after SIGTERM")
    if not alive:
        return outcomes
    if not escalate:
        for proc in alive:
            outcomes[proc.pid] = Outcome(proc.pid, SURVIVED_TERM,
                                         f"still running {grace_s:g} s after SIGTERM; not killed because "
                                         "signal=KILL was not asked for")
        return outcomes

    killed = []
    for proc in alive:  # already children first
        if _send(proc, signal.SIGKILL, outcomes):
            killed.append(proc)
    still = _wait(killed, kill_wait_s, "SIGKILL", progress)
    for proc in killed:
        if proc in still:
            outcomes[proc.pid] = Outcome(proc.pid, UNKILLABLE,
                                         f"still present {kill_wait_s:g} s after SIGKILL: stuck in the kernel "
                                         "(D state); only the blocking call returning, a GPU reset or a reboot ends it")
        else:
            outcomes[proc.pid] = Outcome(proc.pid, EXITED_AFTER_KILL,
                                         f"ignored SIGTERM for {grace_s:g} s; exited after SIGKILL")
    return outcomes
