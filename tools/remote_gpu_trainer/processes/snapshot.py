"""What we know about a process at one instant, plus the process tree, read once.

Every later step (safety rules, fingerprints, kill order, reports) works on these frozen snapshots,
so the decisions are pure functions that tests can drive with hand-made snapshots, and a process
that changes after its snapshot is caught by the fingerprint check instead of by luck.

Fields are read with ``psutil.Process.oneshot()`` (one pass over /proc/<pid>/stat and status).
A field the caller may not read (another user's process) is ``None``, never a guess.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

# psutil status strings this package acts on (psutil.STATUS_*), kept literal for readable reports.
ZOMBIE = "zombie"
DISK_SLEEP = "disk-sleep"  # D state: uninterruptible; signals wait until the kernel call returns
STOPPED = ("stopped", "tracing-stop")  # T / t: SIGTERM stays pending until SIGCONT


@dataclass(frozen=True)
class ProcInfo:
    """One process as seen at snapshot time."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    uid: int | None
    """Real uid (who started it); ``None`` if unreadable."""
    username: str | None
    status: str
    """psutil status: running, sleeping, disk-sleep, stopped, zombie, ..."""
    create_time: float | None
    """Start time, seconds since the epoch (boot time + start ticks): stable for the process's life."""
    sid: int | None = None
    """Session id: a session leader (pid == sid) is a login shell, a tmux pane shell or a daemon."""
    start_ticks: int | None = None
    """Start time in clock ticks since boot (/proc/<pid>/stat field 22). Unlike ``create_time`` it
    never moves when the wall clock is stepped (NTP), so it is what fingerprints use."""

    @property
    def command(self) -> str:
        """The command line for people; kernel threads and zombies have none, so show the name."""
        return " ".join(self.cmdline) if self.cmdline else f"[{self.name}]"


def snapshot(pid: int) -> ProcInfo | None:
    """Read one process, or ``None`` if it does not exist (any more)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            data = proc.as_dict(["ppid", "name", "cmdline", "uids", "username", "status", "create_time"],
                                ad_value=None)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return None
    try:
        sid: int | None = os.getsid(pid)
    except OSError:
        sid = None
    uids = data["uids"]
    return ProcInfo(
        pid=pid,
        ppid=data["ppid"] or 0,
        name=data["name"] or "?",
        cmdline=tuple(data["cmdline"] or ()),
        uid=uids.real if uids is not None else None,
        username=data["username"],
        status=data["status"] or "?",
        create_time=data["create_time"],
        sid=sid,
        start_ticks=read_start_ticks(pid),
    )


def read_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat; ``None`` off Linux or if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        # The name (field 2) is in parentheses and may itself contain spaces or ')': split after the last ')'.
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def read_cmdline(pid: int) -> tuple[str, ...]:
    """argv of ``pid`` straight from /proc (empty if gone, a zombie or a kernel thread)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return ()
    return tuple(arg.decode("utf-8", "surrogateescape") for arg in raw.rstrip(b"\0").split(b"\0")) if raw else ()


HELPER_ENV = "RGT_HELPER"
"""In the environment of a helper process the package starts for its own work (the NVML worker, the health daemon):
never a member of a run, even where it descends from one (an ``rgt health`` inside a training script starts them)
or reaches a supervisor as an orphan (the supervisor adopts every other orphan as part of its run)."""


def read_environ(pid: int, names: tuple[str, ...]) -> dict[str, str]:
    """Selected variables of /proc/<pid>/environ (the environment the process started with); {} if unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    found = {}
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        if name.decode(errors="replace") in names:
            found[name.decode()] = value.decode(errors="replace")
    return found


def is_helper(pid: int) -> bool:
    """Whether ``pid`` is one of the package's own helpers (:data:`HELPER_ENV`); False where unreadable."""
    return bool(read_environ(pid, (HELPER_ENV,)))


def snapshot_many(pids: Iterable[int]) -> dict[int, ProcInfo | None]:
    return {pid: snapshot(pid) for pid in pids}


class ProcessTable:
    """The parent, process group and session of every visible process, read once, for tree and group walks.

    Reading them for all processes costs ~1 ms for ~100 processes; walking is free. A pid that appears
    later is simply absent, which is what a consistent snapshot should do. ``group`` and ``session`` are
    empty where /proc is missing (psutil's fallback knows only parents).
    """

    def __init__(self, parent: Mapping[int, int], group: Mapping[int, int] | None = None,
                 session: Mapping[int, int] | None = None, state: Mapping[int, str] | None = None):
        self.parent = dict(parent)
        self.group = dict(group or {})
        self.session = dict(session or {})
        self.state = dict(state or {})
        """The one-letter state of /proc/<pid>/stat (``Z``: a zombie, exited and not reaped)."""
        self._children: dict[int, list[int]] = {}
        for pid, ppid in self.parent.items():
            self._children.setdefault(ppid, []).append(pid)

    @classmethod
    def read(cls) -> ProcessTable:
        """One read of /proc/<pid>/stat per process (psutil.process_iter costs three times that)."""
        parent: dict[int, int] = {}
        group: dict[int, int] = {}
        session: dict[int, int] = {}
        state: dict[int, str] = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            names = []
        for name in names:
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    stat = handle.read()
                fields = stat[stat.rindex(b")") + 2:].split(None, 5)
                pid = int(name)
                parent[pid], group[pid], session[pid] = int(fields[1]), int(fields[2]), int(fields[3])
                state[pid] = fields[0].decode(errors="replace")
            except (OSError, ValueError, IndexError):  # exited meanwhile
                continue
        if not parent:  # no /proc (not Linux): psutil knows the platform's way
            parent = {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"]) if p.info.get("ppid") is not None}
        return cls(parent, group, session, state)

    def children(self, pid: int) -> list[int]:
        return list(self._children.get(pid, ()))

    def alive(self, pid: int) -> bool:
        """In the table and not a zombie."""
        return pid in self.parent and self.state.get(pid) != "Z"

    def ancestors(self, pid: int) -> list[int]:
        """Parent, grandparent, ... up to (excluding) pid 0. Stops on a loop, which /proc can show
        transiently when a pid is reused mid-walk."""
        chain: list[int] = []
        seen = {pid}
        current = self.parent.get(pid)
        while current and current not in seen:
            chain.append(current)
            seen.add(current)
            current = self.parent.get(current)
        return chain

    def descendants(self, pid: int) -> list[int]:
        """Children, grandchildren, ... breadth first."""
        found: list[int] = []
        queue = list(self._children.get(pid, ()))
        seen = {pid}
        while queue:
            child = queue.pop(0)
            if child in seen:
                continue
            seen.add(child)
            found.append(child)
            queue.extend(self._children.get(child, ()))
        return found

    def depth(self, pid: int) -> int:
        return len(self.ancestors(pid))
