"""Regular files a process holds open for writing: where a run writes its log when not to stdout.

A training script that logs to ``runs/<name>/train.log`` (a ``FileHandler``, a ``print(file=…)``, a shell
redirection of a detached child) keeps that file open with write access. ``/proc/<pid>/fd/N`` names the file and
``/proc/<pid>/fdinfo/N``'s ``flags`` (octal, ``O_ACCMODE`` in the low two bits) says whether it was opened for
writing, so this needs no ptrace, no lsof and no help from the process. Device nodes, pipes, sockets, shared
memory (``/dev/shm``), ``/proc`` and ``/sys`` and deleted files are skipped before fdinfo is read.
"""

from __future__ import annotations

import os
import stat

O_ACCMODE = 0o3
_SKIP = ("/dev/", "/proc/", "/sys/", "/run/")


def files_open_for_writing(pid: int, proc: str = "/proc") -> list[str]:
    """Paths of the regular files ``pid`` has open for writing (O_WRONLY or O_RDWR); [] when unreadable."""
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return []
    found: set[str] = set()
    for fd in fds:
        try:
            target = os.readlink(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            continue
        if not target.startswith("/") or target.startswith(_SKIP) or target.endswith(" (deleted)") or target in found:
            continue
        if _write_access(f"{proc}/{pid}/fdinfo/{fd}"):
            try:
                if stat.S_ISREG(os.stat(target).st_mode):
                    found.add(target)
            except OSError:
                continue
    return sorted(found)


def _write_access(fdinfo: str) -> bool:
    try:
        with open(fdinfo) as handle:
            for line in handle:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
    except (OSError, ValueError, IndexError):
        return False
    return False
