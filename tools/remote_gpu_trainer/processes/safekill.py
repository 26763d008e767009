"""Two-phase safe kill of an arbitrary set of pids: the one entry point other tools should use.

``kill_port_holders`` uses it for port holders, ``reap_vram_zombies`` for same-user GPU orphans.
The caller decides *which* pids are candidates and says why (``{pid: "holds tcp :29500"}``);
this module decides whether each may be signalled and does it safely::

    report = safe_kill({4242: "holds tcp 127.0.0.1:29500 LISTEN"}, dry_run=True)
    report.confirm_token          # show report.targets to the user, then:
    report = safe_kill({4242: ...}, dry_run=False, confirm_token=token, signal="TERM", grace_s=10)

Steps (each in its own module, each documented there):

1. snapshot every pid once (snapshot.py) and note the launcher group it belongs to (launchers.py);
2. apply the refusal rules (safety.py): pid ≤ 1, self and ancestors, other users unless root and
   allowed, protected system/access processes, login shells, zombies (their parent is named),
   D state (reported as unkillable);
3. dry run: return every candidate with the action it would get, plus a confirm token over the
   fingerprints of those that would be signalled (fingerprint.py);
4. real run: re-snapshot, require the token to match exactly those processes (a restarted or new
   process is refused, naming the pid, and a fresh token is returned for review); then
   terminate.py: children first, SIGTERM, wait ``grace_s``, SIGKILL only when ``signal="KILL"``.

``signal="KILL"`` means *escalate*: SIGTERM first, SIGKILL for whatever is still alive after
``grace_s`` (use ``grace_s=0`` for an immediate SIGKILL after the SIGTERM). Training jobs get a
chance to flush logs and release NCCL/GPU state before the hard kill.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from ..errors import InputError
from ..models import StrictModel
from ..tables import format_table
from ..toolspec import Progress, no_progress
from .fingerprint import check_token, fingerprint, make_token
from .launchers import find_launcher, launcher_kind
from .safety import DEFAULT_POLICY, Caller, Policy, Refusal, refusal
from .snapshot import STOPPED, ZOMBIE, ProcessTable, ProcInfo, snapshot
from .terminate import Outcome, terminate

Signal = Literal["TERM", "KILL"]
Action = Literal["would_signal", "signalled", "refused", "not_signalled"]
MAX_COMMAND_CHARS = 8192
"""A command line is kept whole (a run name or rendezvous id at its end identifies the target); past this, which
only a generated ``python -c`` script reaches, the row says how much was left out."""


class ProcessRow(StrictModel):
    """One process as a report shows it."""

    pid: int
    ppid: int
    parent: str | None = Field(None, description="Parent's name, e.g. 'torchrun' or 'bash'")
    name: str
    command: str = Field(description=f"The whole command line (control characters escaped; beyond "
                         f"{MAX_COMMAND_CHARS} characters it ends with how many were left out)")
    user: str | None
    uid: int | None
    status: str = Field(description="psutil status: running, sleeping, stopped, zombie, disk-sleep (D state)...")
    started: str | None = Field(None, description="Start time, ISO 8601 local time")
    age_s: float | None = Field(None, description="Seconds since it started")
    torchrun_group: int | None = Field(None, description="Pid of the distributed launcher (torchrun, "
                                       "torch.distributed.launch, accelerate launch, deepspeed) whose tree this "
                                       "process belongs to")
    launcher: str | None = Field(None, description="Kind of that launcher, when this process is the launcher itself")


class KillTarget(ProcessRow):
    why: str = Field(description="Why the caller considered it: e.g. 'holds tcp 127.0.0.1:29500 LISTEN'")
    action: Action = Field(description="would_signal (dry run), signalled, refused (a safety rule), "
                           "not_signalled (the real run stopped: confirm token mismatch)")
    refusal: str | None = Field(None, description="Refusal code: pid_le_1, self, ancestor, session, zombie, "
                                "kernel_thread, other_user, protected, login_shell, uninterruptible, gone")
    outcome: str | None = Field(None, description="After a real run: exited_after_term, exited_after_kill, "
                                "survived_term, unkillable, already_gone, pid_reused, permission_denied")
    detail: str = Field("", description="The reason, in words")


class KillReport(StrictModel):
    dry_run: bool
    signal: Signal
    grace_s: float
    targets: list[KillTarget] = Field(description="Every candidate, children before parents")
    confirm_token: str | None = Field(None, description="Pass back with dry_run=false to signal exactly the "
                                      "'would_signal' processes; null when nothing would be signalled")
    token_problems: list[str] = Field(default_factory=list, description="Why the real run refused to start")
    executed: bool = Field(False, description="True when signals were sent")


def printable(text: str) -> str:
    """Control characters (a ``python -c`` script's newlines) as visible escapes, so tables stay tables."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def whole_command(command: str) -> str:
    """The command line for a report: printable, whole up to :data:`MAX_COMMAND_CHARS`."""
    text = printable(command)
    if len(text) <= MAX_COMMAND_CHARS:
        return text
    return f"{text[:MAX_COMMAND_CHARS]}… (+{len(text) - MAX_COMMAND_CHARS} characters)"


def age_text(age_s: float | None) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``, ``2 d 04 h``: a process's age as a person reads it."""
    if age_s is None:
        return "-"
    seconds = int(age_s)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600:02d} h"


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return dt.datetime.fromtimestamp(timestamp).isoformat(timespec="seconds")


def _describe(info: ProcInfo) -> str:
    command = info.command
    return f"pid {info.pid} ({command[:60]}{'…' if len(command) > 60 else ''})"


def process_row(info: ProcInfo, table: ProcessTable) -> dict:
    """Fields of :class:`ProcessRow` for ``info`` (a dict, so subclasses can add their own)."""
    parent = snapshot(info.ppid) if info.ppid > 0 else None
    return dict(
        pid=info.pid, ppid=info.ppid, parent=parent.name if parent else None, name=info.name,
        command=whole_command(info.command),
        user=info.username or (str(info.uid) if info.uid is not None else None),
        uid=info.uid, status=info.status, started=_iso(info.create_time),
        age_s=round(time.time() - info.create_time, 1) if info.create_time else None,
        torchrun_group=find_launcher(info.pid, table), launcher=launcher_kind(info.cmdline),
    )


def target_table(targets: list[KillTarget]) -> str:
    """The targets of a dry run or a kill as people check them before consenting: who, how old, what it runs
    (the whole command line, wrapped), and what it got or would get and why."""
    return format_table(
        ["pid", "user", "group", "age", "action", "outcome", "why / detail", "command"],
        [[t.pid, t.user, t.torchrun_group, age_text(t.age_s), t.action if not t.refusal else f"refused:{t.refusal}",
          t.outcome, f"{t.why}. {t.detail}".strip(". "), t.command or t.name] for t in targets],
        wrap=["why / detail", "command"])


@dataclass(frozen=True)
class Assessed:
    """A candidate after the safety rules: ``refusal is None`` means it may be signalled."""

    pid: int
    why: str
    info: ProcInfo | None
    refusal: Refusal | None


def assess(candidates: Mapping[int, str], *, policy: Policy, caller: Caller, table: ProcessTable) -> list[Assessed]:
    """Snapshot and judge each candidate; children before parents, the order signals go out."""
    assessed = []
    for pid, why in candidates.items():
        info = snapshot(pid)
        parent_name = None
        if info is not None and info.status == ZOMBIE:
            parent = snapshot(info.ppid)
            parent_name = parent.name if parent else None
        assessed.append(Assessed(pid, why, info, refusal(info, caller, policy, parent_name=parent_name)))
    assessed.sort(key=lambda a: (table.depth(a.pid), a.pid), reverse=True)
    return assessed


def safe_kill(candidates: Mapping[int, str], *, dry_run: bool = True, confirm_token: str | None = None,
              signal: Signal = "TERM", grace_s: float = 10.0, policy: Policy = DEFAULT_POLICY,
              caller: Caller | None = None, table: ProcessTable | None = None,
              progress: Progress = no_progress) -> KillReport:
    """Dry run (default) or confirmed kill of ``candidates`` (pid → why). See the module docstring.

    Raises :class:`InputError` on ``confirm_token`` when a real run has something to signal but no
    token, or a malformed one. A well-formed token that no longer matches is not an error: the
    report says what changed and carries a fresh token.
    """
    caller = caller or Caller.current()
    table = table or ProcessTable.read()
    rows = assess(candidates, policy=policy, caller=caller, table=table)
    approved = [row.info for row in rows if row.refusal is None and row.info is not None]
    token = make_token(fingerprint(info) for info in approved) if approved else None

    # Described before any signal: a dead launcher's command line can no longer be read.
    bases = {row.pid: process_row(row.info, table) for row in rows if row.info is not None}

    def build(action_for_ok: Action, outcomes: Mapping[int, Outcome] | None = None) -> list[KillTarget]:
        targets = []
        for row in rows:
            info, why = row.info, row.why
            if info is None:
                targets.append(KillTarget(pid=row.pid, ppid=0, name="?", command="", user=None, uid=None,
                                          status="gone", why=why, action="refused", refusal="gone",
                                          detail="the process no longer exists"))
                continue
            base = bases[row.pid]
            if row.refusal is not None:
                targets.append(KillTarget(**base, why=why, action="refused", refusal=row.refusal.code,
                                          detail=row.refusal.detail))
                continue
            outcome = outcomes.get(row.pid) if outcomes else None
            detail = "stopped (suspended): SIGCONT follows the SIGTERM so it can exit" if info.status in STOPPED else ""
            targets.append(KillTarget(**base, why=why, action=action_for_ok,
                                      outcome=outcome.code if outcome else None,
                                      detail=outcome.detail if outcome else detail))
        return targets

    if dry_run or not approved:
        return KillReport(dry_run=dry_run, signal=signal, grace_s=grace_s, confirm_token=token,
                          targets=build("would_signal" if dry_run else "not_signalled"))
    if not confirm_token:
        raise InputError("confirm_token", "required when dry_run is false: run the dry run first, review its "
                         "targets, then pass the confirm_token it returned")
    infos = {info.pid: info for info in approved}
    problems = check_token(confirm_token, [fingerprint(info) for info in approved],
                           describe=lambda pid: _describe(infos[pid]))
    if problems:
        return KillReport(dry_run=False, signal=signal, grace_s=grace_s, confirm_token=token,
                          targets=build("not_signalled"), token_problems=[p.detail for p in problems])
    outcomes = terminate(approved, escalate=signal == "KILL", grace_s=grace_s, table=table, progress=progress)
    return KillReport(dry_run=False, signal=signal, grace_s=grace_s, executed=True,
                      targets=build("signalled", outcomes))


__all__ = ["Assessed", "Caller", "KillReport", "KillTarget", "Policy", "ProcessRow", "assess", "safe_kill"]
