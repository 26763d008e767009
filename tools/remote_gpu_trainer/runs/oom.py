"""OOM-kill evidence for a run on a box without a scheduler.

Two sources, both read by the supervisor, which is the only one there when it happens:

* **the cgroup's OOM-kill counter**: cgroup v2 ``memory.events`` (``oom_kill N``) of the cgroup in
  the ``0::`` line of ``/proc/<pid>/cgroup``; on a cgroup v1 box the memory controller's
  ``memory.oom_control`` carries the same ``oom_kill N`` line. The supervisor remembers every cgroup
  the run's processes were seen in, with its count at first sight, and compares at the end: a rise
  means the OOM killer killed something in there while the run lived. The counter covers the
  cgroup's whole subtree, and a container's cgroup is shared with everything in the container, so
  a rise only counts when the run also ended abnormally (SIGKILL or a non-zero exit).
* **the kernel log**, where readable (``/dev/kmsg``; containers usually withhold it): the
  ``Killed process <pid>`` line the OOM killer prints, matched to the run's pids.

A SIGKILL with neither is reported as ``killed`` with the signal.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from ..health.xid import read_kmsg

CGROUP_ROOT = Path("/sys/fs/cgroup")
_KILLED = re.compile(r"(?:Out of memory|Memory cgroup out of memory)[^\n]*?: Killed process (\d+)")

Cgroup = tuple[str, str]
"""(``v2`` or ``v1``, path inside that hierarchy)."""


def cgroups_of(pid: int, proc: Path = Path("/proc")) -> list[Cgroup]:
    """The cgroups of ``pid`` that can count OOM kills: the v2 one and the v1 memory one, if any."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return []
    found: list[Cgroup] = []
    for line in text.splitlines():
        _id, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "" and _id == "0":
            found.append(("v2", path.strip() or "/"))
        elif "memory" in controllers.split(","):
            found.append(("v1", path.strip() or "/"))
    return found


def _events_file(cgroup: Cgroup, root: Path) -> list[Path]:
    kind, path = cgroup
    rel = path.lstrip("/")
    if kind == "v1":
        return [root / "memory" / rel / "memory.oom_control"]
    # v2 is /sys/fs/cgroup itself, or /sys/fs/cgroup/unified on a hybrid box
    return [root / rel / "memory.events", root / "unified" / rel / "memory.events"]


def oom_kill_count(cgroup: Cgroup, root: Path = CGROUP_ROOT) -> int | None:
    """The cgroup's ``oom_kill`` counter; None when unreadable (no memory controller there)."""
    for path in _events_file(cgroup, root):
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def kernel_oom_lines(started: Mapping[int, int | None], kmsg: str = "/dev/kmsg") -> tuple[list[str], str | None]:
    """Kernel-log lines saying the OOM killer killed one of the run's processes (pid → start time in clock ticks
    since boot, None if unknown), and why the log was unreadable. A line logged before the process it names
    started is about an earlier process that had the same pid (pids are reused), never this run."""
    try:
        lines = read_kmsg(kmsg, "Killed process")
    except OSError as err:
        return [], f"kernel log not readable ({kmsg}: {err.strerror or err})"
    hz = os.sysconf("SC_CLK_TCK")
    found = []
    for line in lines:
        match = _KILLED.search(line)
        if match is None or int(match.group(1)) not in started:
            continue
        ticks, logged_s = started[int(match.group(1))], _kmsg_seconds(line)
        if ticks is not None and logged_s is not None and logged_s < ticks / hz:
            continue
        found.append(line.split(";", 1)[-1].strip())
    return found[-5:], None


def _kmsg_seconds(record: str) -> float | None:
    """Seconds since boot of a /dev/kmsg record (``priority,sequence,microseconds,flags;message``)."""
    fields = record.split(";", 1)[0].split(",")
    try:
        return int(fields[2]) / 1e6
    except (IndexError, ValueError):
        return None
