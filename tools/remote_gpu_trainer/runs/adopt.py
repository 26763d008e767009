"""Runs the skill did not start: found by pid, by a command-line pattern or by the log they write.

"My fine-tune died last night" and "which of my two runs is stuck" are about jobs a person started by hand
(``nohup python train.py > train.log &``, a tmux pane, a notebook terminal). This module turns what they know
into processes and files:

* a **pid**: it and its descendants;
* a **pattern**: a regular expression matched against every command line (never this tool's own process or its
  ancestors); the processes whose parent does not match too are the roots. One root is the answer and the result
  shows the pids it resolved to; several are refused with each listed (pick one by pid). A pattern is only ever
  used to *find*: run_stop takes a run_id and a confirm token, never a pattern;
* **logs**: the files themselves; the process writing one is found from ``/proc`` (``processes/openfiles.py``).
  No writer means the run has ended: its state is ``ended`` with the diagnosis of the log's tail.

Its state comes from the process (alive, or gone with an unknown exit status: only a parent can read it),
progress and stall from the newest of its log files (given, or the regular files it holds open for writing),
against ``stall_after_s``. ``run_adopt`` records such a run in the ledger with a supervisor that watches it
(supervisor.py, adopted mode), so notify and the idle guard cover it like a run of ours.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..processes.openfiles import files_open_for_writing
from ..processes.snapshot import ProcessTable, read_cmdline, snapshot

MAX_LISTED = 8


@dataclass(frozen=True)
class Target:
    root: int | None
    """The process asked about (None: nothing runs; only its logs are left)."""
    pattern: str | None
    logs: list[str]

    def pids(self, table: ProcessTable | None = None) -> list[int]:
        """The root and its live descendants."""
        if self.root is None:
            return []
        table = table or ProcessTable.read()
        if not table.alive(self.root):
            return []
        return [self.root, *(p for p in table.descendants(self.root) if table.alive(p))]


def _command(pid: int) -> str:
    return " ".join(read_cmdline(pid))


def _mine(table: ProcessTable) -> set[int]:
    me = os.getpid()
    return {me, *table.ancestors(me)}


def absolute_logs(logs: list[str] | None, cwd: Path | None = None) -> list[str]:
    """Log paths as given: ``~`` and relative paths resolve against the home directory (or ``cwd``)."""
    base = cwd or Path.home()
    return [str((base / Path(os.path.expanduser(p))).resolve()) if not os.path.isabs(os.path.expanduser(p))
            else str(Path(os.path.expanduser(p)).resolve()) for p in logs or []]


def by_pattern(pattern: str, table: ProcessTable | None = None) -> list[int]:
    """Root pids whose command line matches ``pattern``; InputError naming ``pattern`` when none does."""
    try:
        regex = re.compile(pattern)
    except re.error as err:
        raise InputError("pattern", f"not a valid regular expression: {err}") from None
    table = table or ProcessTable.read()
    skip = _mine(table)
    matches = {pid for pid in table.parent if pid not in skip and table.alive(pid) and regex.search(_command(pid))}
    roots = sorted(pid for pid in matches if table.parent.get(pid) not in matches)
    if not roots:
        raise InputError("pattern", f"no running process's command line matches {pattern!r}")
    return roots


def writers_of(paths: list[str], table: ProcessTable | None = None) -> list[int]:
    """Root pids of the processes holding any of ``paths`` open for writing."""
    table = table or ProcessTable.read()
    wanted = set(paths)
    skip = _mine(table)
    found = {pid for pid in table.parent if pid not in skip and table.alive(pid)
             and wanted & set(files_open_for_writing(pid))}
    return sorted(pid for pid in found if table.parent.get(pid) not in found)


def _one(roots: list[int], field: str, what: str) -> int:
    if len(roots) > 1:
        listed = "; ".join(f"pid {pid} ({_command(pid)[:160]})" for pid in roots[:MAX_LISTED])
        raise InputError(field, f"{what} {len(roots)} separate processes: {listed}. Ask again with pid= for the one "
                         "you mean")
    return roots[0]


def resolve(pid: int | None, pattern: str | None, logs: list[str] | None) -> Target:
    """The process and the logs a caller means (see the module docstring)."""
    paths = absolute_logs(logs)
    if pid is not None:
        info = snapshot(pid)
        if info is None or info.status == "zombie":
            if paths:
                return Target(None, None, paths)
            raise InputError("pid", f"no process {pid} on this box (it ended?); give logs=[...] to read how it ended")
        if pid in _mine(ProcessTable.read()) or pid == 1:
            raise InputError("pid", f"pid {pid} ({info.name}) is this tool or its session, not a training run")
        return Target(pid, None, paths)
    if pattern is not None:
        return Target(_one(by_pattern(pattern), "pattern", f"{pattern!r} matches"), pattern, paths)
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise InputError("logs", f"no file {missing[0]} on this box")
    writers = writers_of(paths)
    return Target(_one(writers, "logs", "the logs are written by") if writers else None, None, paths)


