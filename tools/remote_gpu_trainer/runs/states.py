"""One state per run, decided from the run directory and the box's process table.

=========== ==================================================================================
state       when
=========== ==================================================================================
starting    the supervisor is up but the training process is not started yet
running     the training process runs (or, after a launcher that detached, the processes it started) and a
            progress file (its log, a watched file, a file it writes) changed within the stall threshold
stalled     alive, but no progress file changed for stall_after_s and its stacks did not move (GPU load is
            not used: a rank hung in a collective keeps its GPU at 100 %)
succeeded   exit code 0
failed      non-zero exit code (or the command could not be started)
killed      ended by a signal (run_stop's SIGTERM, a SIGKILL from outside, ...)
oom_killed  the OOM killer: the cgroup's oom_kill count rose or the kernel log names a run pid
ended       its processes are gone and the exit status is unknown: an adopted run (the supervisor is not its
            parent), or a detached process that was not the supervisor's to reap
lost        the box rebooted (boot id changed), or the supervisor vanished without writing exit.json
unreachable the box did not answer (decided on the caller's side, see tool.status_when_unreachable)
=========== ==================================================================================

Why the supervisor decides the end states: only the parent of the training process sees its exact
wait status, and only while the process lives can the cgroup holding it be found. ``exit.json`` is
its verdict; the reader just trusts it. Without one the reader checks the supervisor is still that
same process (pid plus start ticks, so a reused pid is not mistaken for it).
"""

from __future__ import annotations

import signal as signal_module
import time
from dataclasses import dataclass
from typing import Literal

from ..processes.fingerprint import boot_id
from ..processes.snapshot import ZOMBIE, read_start_ticks, snapshot
from .ledger import EXIT, LAUNCHER, STALL, SUPERVISOR, RunDir

State = Literal["starting", "running", "stalled", "succeeded", "failed", "killed", "oom_killed", "ended", "lost",
                "unreachable"]
ENDED: frozenset[str] = frozenset({"succeeded", "failed", "killed", "oom_killed", "ended", "lost"})
SUPERVISOR_START_GRACE_S = 15.0
"""How long a run may lack supervisor.json before it counts as lost (a loaded box starts Python slowly)."""


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def end_state(exit_code: int | None, signal: int | None, oom_evidence: bool) -> State:
    """The state for a process that ended with ``exit_code`` or ``signal``."""
    abnormal = signal == signal_module.SIGKILL or (exit_code not in (None, 0))
    if oom_evidence and abnormal:
        return "oom_killed"
    if signal is not None:
        return "killed"
    return "succeeded" if exit_code == 0 else "failed"


@dataclass(frozen=True)
class Classified:
    state: State
    detail: str
    exit_code: int | None = None
    signal: int | None = None


def supervisor_alive(run: RunDir) -> bool | None:
    """True: the very supervisor that started this run still runs. None: it has not written its file."""
    record = run.read(SUPERVISOR)
    if record is None:
        return None
    pid, ticks = record.get("pid"), record.get("start_ticks")
    if not isinstance(pid, int):
        return False
    info = snapshot(pid)
    if info is None or info.status == ZOMBIE:
        return False
    return ticks is None or read_start_ticks(pid) == ticks


def classify(run: RunDir, now: float | None = None) -> Classified:
    """The run's state, see the module docstring."""
    now = time.time() if now is None else now
    meta = run.meta()
    ended = run.read(EXIT)
    if ended is not None:
        return Classified(ended.get("state", "failed"), ended.get("detail", ""), ended.get("exit_code"),
                          ended.get("signal"))
    if meta.get("boot_id") and meta["boot_id"] != boot_id():
        return Classified("lost", "the box rebooted since the run started (boot id changed): the run and its "
                                  "supervisor died with it; resume from the last checkpoint")
    alive = supervisor_alive(run)
    if alive is None:
        if now - float(meta.get("created_at", now)) < SUPERVISOR_START_GRACE_S:
            return Classified("starting", "the supervisor is starting")
        return Classified("lost", "the supervisor never started (no supervisor.json): see the run's log")
    if not alive:
        ended = run.read(EXIT)  # it may have written exit.json and exited since the first read
        if ended is not None:
            return classify(run, now)
        return Classified("lost", "the supervisor vanished without recording the end (killed, or the box ran out "
                                  "of memory); the training process may still run: see processes in run_status")
    if not meta.get("pid"):
        return Classified("starting", "the supervisor is starting the training process")
    stall = run.read(STALL)
    if stall is not None and not progressed_since(run, stall):
        return Classified("stalled", stall.get("detail", "no log growth"))
    return Classified("running", launcher_detail(run))


def progressed_since(run: RunDir, stall: dict) -> bool:
    """Whether a progress file was written after the stall was recorded. The supervisor removes stall.json at its
    next poll once one is, but it can be busy for seconds first (taking stacks, a flight-recorder dump), and a
    reader must not report a stall that is already over (nor the stacks taken for it)."""
    from .watch import WATCH, last_changes

    since = stall.get("since")
    if not isinstance(since, (int, float)):
        return False
    files = [str(run.log), *(f["path"] for f in (run.read(WATCH) or {}).get("files", []) if isinstance(f, dict))]
    return max(last_changes(files).values(), default=0.0) > since


def launcher_detail(run: RunDir) -> str:
    """``launcher exited with code 0; 1 process continues (python train.py)`` while a detached job runs."""
    launcher = run.read(LAUNCHER)
    if not launcher:
        return ""
    code, sig = launcher.get("exit_code"), launcher.get("signal")
    how = f"with code {code}" if sig is None else f"by {signal_name(sig)}"
    going = launcher.get("continuing") or []
    commands = [c for c in launcher.get("commands") or [] if c]
    example = f" ({commands[0][:120]})" if commands else ""
    return (f"launcher exited {how}; {len(going)} process{'es continue' if len(going) != 1 else ' continues'}"
            f"{example}")
