"""Which processes belong to a run: the launcher and everything it started, wherever it went.

A launcher that detaches its job (``nohup python train.py & exit 0``, a ``setsid`` child, a double fork) leaves
processes that are no longer its descendants once it exits: the kernel re-parents them to the nearest
subreaper. The supervisor makes itself one (``PR_SET_CHILD_SUBREAPER``, see supervisor.py), so they become its
children, and it records every member it sees in ``members.json`` (pid and start ticks). Any reader
(run_status, run_stop, the idle guard, the supervisor itself) then takes the union of:

* the recorded members still running (same pid **and** start ticks: a reused pid is not a member);
* every process of the supervisor's session (the launcher inherits it, and a ``nohup … &`` child keeps it);
* the launcher's process group, for processes started after the launcher (a reused pgid is not mistaken);
* every descendant of all of those (a ``setsid``'d child of a member stays found while its parent lives,
  and is recorded from then on).

Never the supervisor itself, nor its notify commands (they run in their own session and descend from no member),
nor the package's own helpers and their children (``RGT_HELPER`` in their environment: the NVML worker and the
warm health daemon an ``rgt health`` in a training script starts; the daemon lives on for minutes after it).
For an adopted run (run_adopt: a process we did not start) the root is that process: it, its recorded members
and their descendants.
"""

from __future__ import annotations

from typing import Any

from ..processes.fingerprint import boot_id
from ..processes.snapshot import ProcessTable, is_helper, read_start_ticks
from .ledger import SUPERVISOR, RunDir, read_json, write_json

MEMBERS = "members.json"


def recorded(run: RunDir) -> dict[int, int | None]:
    """pid → start ticks of the members the supervisor recorded."""
    data = read_json(run.file(MEMBERS)) or {}
    out: dict[int, int | None] = {}
    for item in data.get("members", []):
        if isinstance(item, dict) and isinstance(item.get("pid"), int):
            out[item["pid"]] = item.get("start_ticks")
    return out


def record(run: RunDir, members: dict[int, int | None]) -> None:
    write_json(run.file(MEMBERS), {"members": [{"pid": pid, "start_ticks": ticks}
                                               for pid, ticks in sorted(members.items())]})


def live_members(run: RunDir, meta: dict[str, Any], table: ProcessTable | None = None) -> list[int]:
    """The run's live processes now (see the module docstring), sorted; [] after a reboot."""
    root, ticks = meta.get("pid"), meta.get("start_ticks")
    pgid = meta.get("pgid") or root
    if not (root or pgid) or meta.get("boot_id", boot_id()) != boot_id():
        return []
    table = table or ProcessTable.read()
    supervisor = (run.read(SUPERVISOR) or {}).get("pid")
    found: set[int] = set()
    if root and table.alive(root) and (ticks is None or read_start_ticks(root) == ticks):
        found.add(root)
    found.update(pid for pid, started in recorded(run).items()
                 if table.alive(pid) and (started is None or read_start_ticks(pid) == started))
    if not meta.get("adopted"):
        session = meta.get("sid")
        for pid in table.parent:
            in_session = session is not None and table.session.get(pid) == session
            in_group = pgid is not None and (table.group[pid] if pid in table.group else _pgid(pid)) == pgid
            if (in_session or in_group) and pid != supervisor and table.alive(pid) and _not_older(pid, ticks):
                found.add(pid)
    for member in list(found):
        found.update(pid for pid in table.descendants(member) if table.alive(pid))
    found.discard(supervisor)
    helpers = [pid for pid in found if is_helper(pid)]  # ours, not the run's: they may outlive it by minutes
    found.difference_update(helpers, *(table.descendants(pid) for pid in helpers))
    return sorted(found)


def _pgid(pid: int) -> int | None:
    import os

    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _not_older(pid: int, ticks: int | None) -> bool:
    """Started no earlier than the launcher: an id shared by chance with an older process does not count."""
    if ticks is None:
        return True
    started = read_start_ticks(pid)
    return started is not None and started >= ticks
