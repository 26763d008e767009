"""Process fingerprints and confirm tokens: what makes a two-phase kill safe against PID reuse.

A dry run fingerprints every process it would signal: pid, start time, real uid and command line,
plus the box's identity (ssh destination, hostname, boot id), hashed to 12 hex digits. The **confirm
token** it returns lists those ``pid-digest`` pairs. The real run fingerprints the processes it is
about to signal again and goes ahead only if every one of them is in the token with the same digest:

* PID reuse cannot redirect a kill: a new process on an old pid has another start time.
* A restarted job (same command, new start time) is refused: the user confirmed the old one.
* A process that appeared after the dry run (a respawned worker) is refused: it is not in the token.
* A process from the dry run that has exited since is simply not signalled.

Each problem names the pid, so the caller can show the user what changed.

Why a plain hash and not an HMAC: the token is a record of consent that must survive from one
``rgt`` invocation (or MCP call) to the next without a key file. It does not authenticate anyone:
a caller able to signal these processes could run the dry run itself. What matters is that it is
bound to the exact processes, which the hash does. The boot id keeps a token from outliving a reboot.

Use::

    fps = [fingerprint(info) for info in targets]      # ProcInfo from snapshot.py
    token = make_token(fps)                             # dry run: hand this to the user
    problems = check_token(token, current_fps)          # real run: [] means go ahead
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..errors import InputError
from .snapshot import ProcInfo

TOKEN_PREFIX = "rgt1"
_ENTRY = re.compile(r"^([1-9][0-9]{0,9})-([0-9a-f]{12})$")
_BOX = re.compile(r"^box-[0-9a-f]{10}$")
MAX_TOKEN_LENGTH = 8192
"""Room for ~450 processes, far more than one port's holders and their workers."""


@cache
def boot_id() -> str:
    """Changes at every boot, so a token cannot outlive the processes' machine lifetime."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "no-boot-id"


def box_identity() -> str:
    """Which box this is, as the caller reached it: the ssh destination (``user@host:port`` as ``ssh -G``
    resolved it, set per request by the remote session; empty for local calls), this machine's hostname
    and its boot id. A token bound to it cannot kill on another box that happens to reuse the pids, nor
    after a reboot."""
    import os
    import socket

    return "\x1f".join([os.environ.get("RGT_BOX_DESTINATION", ""), socket.gethostname(), boot_id()])


def box_tag() -> str:
    return "box-" + hashlib.sha256(box_identity().encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Fingerprint:
    """Identity of one process: equal fingerprints mean the very same process."""

    pid: int
    start: str
    """Start ticks since boot where /proc has them (immune to clock steps), else the start time."""
    uid: int | None
    cmdline: tuple[str, ...]

    def digest(self) -> str:
        parts = [box_identity(), str(self.pid), self.start, str(self.uid), "\0".join(self.cmdline)]
        return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:12]


def fingerprint(info: ProcInfo) -> Fingerprint:
    """Fingerprint a snapshot. Raises ValueError when the start time is unreadable: such a process
    cannot be told apart from a successor on the same pid, so it must not be signalled."""
    if info.start_ticks is not None:
        start = f"ticks:{info.start_ticks}"
    elif info.create_time is not None:
        start = f"time:{info.create_time:.2f}"  # psutil's 10 ms resolution elsewhere
    else:
        raise ValueError(f"pid {info.pid}: start time unreadable, cannot fingerprint")
    return Fingerprint(pid=info.pid, start=start, uid=info.uid, cmdline=info.cmdline)


def make_token(fingerprints: Iterable[Fingerprint]) -> str:
    """``rgt1.box-<tag>.<pid>-<digest>...``, sorted by pid: shell-safe, readable, comparable. The box tag
    lets a token used on the wrong box be refused with that reason (the digests would differ anyway)."""
    entries = sorted({(fp.pid, fp.digest()) for fp in fingerprints})
    return ".".join([TOKEN_PREFIX, box_tag(), *(f"{pid}-{digest}" for pid, digest in entries)])


def parse_token(token: str, field: str = "confirm_token") -> dict[int, str]:
    """pid → digest. Raises :class:`InputError` naming ``field`` for anything not made by make_token."""
    text = token.strip()
    parts = text.split(".")
    if len(text) > MAX_TOKEN_LENGTH or parts[0] != TOKEN_PREFIX or len(parts) < 2:
        raise InputError(field, "not a confirm token from a dry run of this tool",
                         allowed=[f"the '{TOKEN_PREFIX}.<pid>-<digest>...' value a dry run returned"])
    entries: dict[int, str] = {}
    for part in parts[1:]:
        if _BOX.match(part):  # checked against this box in check_token, which runs where the processes are
            continue
        match = _ENTRY.match(part)
        if not match:
            raise InputError(field, f"malformed entry {part[:40]!r} in the confirm token",
                             allowed=["<pid>-<12 hex digits>, as returned by the dry run"])
        entries[int(match.group(1))] = match.group(2)
    return entries


@dataclass(frozen=True)
class TokenProblem:
    pid: int
    problem: str
    """``not_in_dry_run`` or ``changed``."""
    detail: str


def check_token(token: str, current: Iterable[Fingerprint], describe=lambda pid: f"pid {pid}") -> list[TokenProblem]:
    """Compare the processes about to be signalled with the token. Empty list: go ahead.

    ``describe(pid)`` names a process in messages (e.g. ``pid 4242 (python train.py)``).
    Pids in the token that are not current targets are fine: they exited or no longer qualify.
    """
    confirmed = parse_token(token)
    tags = [part for part in token.strip().split(".") if _BOX.match(part)]
    if tags and tags[0] != box_tag():
        raise InputError("confirm_token", "this confirm token was made on another box, or on this one before a "
                         "reboot: nothing was signalled", allowed=["the token of a dry run on this host"])
    problems: list[TokenProblem] = []
    for fp in sorted(current, key=lambda f: f.pid):
        expected = confirmed.get(fp.pid)
        if expected is None:
            problems.append(TokenProblem(fp.pid, "not_in_dry_run",
                                         f"{describe(fp.pid)} was not in the dry run: it started or began "
                                         "to qualify since; run the dry run again and review it"))
        elif expected != fp.digest():
            problems.append(TokenProblem(fp.pid, "changed",
                                         f"{describe(fp.pid)} is not the process the dry run saw (different "
                                         "start time, user or command: restarted, or the pid was reused)"))
    return problems
