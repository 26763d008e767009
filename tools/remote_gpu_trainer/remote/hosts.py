"""The ``host`` a caller names: validated before ssh ever sees it, and resolved the way ssh resolves it.

``host`` is what the user types after ``ssh``: an alias from ``~/.ssh/config`` or ``user@name[:port]``
(``[v6addr]:port`` for IPv6). OpenSSH treats a destination that starts with ``-`` as an option
(``-oProxyCommand=...`` runs a local command), so a host string must be a plain name before it reaches
argv, and argv carries ``--`` before it as a second guard.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass

from ..errors import InputError

_USER = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}"
_NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}"
_V6 = r"\[[0-9A-Fa-f:.]{2,45}\]"
_HOST = re.compile(rf"^(?:(?P<user>{_USER})@)?(?P<name>{_NAME}|{_V6})(?::(?P<port>[0-9]{{1,5}}))?$")

HOST_EXAMPLES = ["gpu-box (an alias from ~/.ssh/config)", "root@203.0.113.7:2222", "ubuntu@node-1"]


@dataclass(frozen=True)
class Host:
    """A validated host: ``given`` as the caller wrote it, and ssh's destination plus port."""

    given: str
    destination: str
    """``user@name`` or ``name``: what goes after ``--`` on ssh's command line."""
    port: int | None

    def ssh_target(self) -> list[str]:
        """The tail of an ssh argv: port option, ``--``, destination (nothing from the caller as an option)."""
        return [*(["-p", str(self.port)] if self.port else []), "--", self.destination]


def parse_host(value: str, field: str = "host") -> Host:
    """Validate a caller's host string. Raises :class:`InputError` naming ``field`` for anything else."""
    if not isinstance(value, str) or not value:
        raise InputError(field, "must be a non-empty ssh host", allowed=HOST_EXAMPLES)
    match = _HOST.match(value)
    if match is None:
        bad = sorted({c for c in value if not (c.isalnum() or c in "._-@:[]")})
        why = (f"contains {', '.join(repr(c) for c in bad)}" if bad
               else "is not an ssh alias or user@name[:port]")
        if value.startswith("-"):
            why = "starts with '-', which ssh would read as an option"
        raise InputError(field, f"{value[:60]!r} {why}", allowed=HOST_EXAMPLES)
    port = match.group("port")
    if port is not None and not 1 <= int(port) <= 65535:
        raise InputError(field, f"port {port} is outside 1-65535", allowed=HOST_EXAMPLES)
    name = match.group("name")
    if name.startswith("["):  # ssh wants a bare IPv6 address as the destination
        name = name[1:-1]
    user = match.group("user")
    return Host(given=value, destination=f"{user}@{name}" if user else name, port=int(port) if port else None)


def config_args() -> list[str]:
    """``-F FILE`` when ``RGT_SSH_CONFIG`` names one: ssh reads ~/.ssh/config from the passwd home, not
    ``$HOME``, so tests and unusual set-ups need the file passed explicitly."""
    path = os.environ.get("RGT_SSH_CONFIG")
    return ["-F", path] if path else []


@dataclass(frozen=True)
class Resolved:
    """What ``ssh -G`` says a host means after the user's config: the box's identity is user, host, port."""

    user: str
    hostname: str
    port: int
    options: dict[str, str]

    @property
    def identity(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"


@functools.lru_cache(maxsize=256)
def _resolve(destination: str, port: int | None, config: tuple[str, ...]) -> Resolved:
    argv = ["ssh", *config, "-G", *(["-p", str(port)] if port else []), "--", destination]
    out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise OSError(out.stderr.strip() or f"ssh -G exited {out.returncode}")
    options: dict[str, str] = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key.lower(), value.strip())
    return Resolved(user=options.get("user", ""), hostname=options.get("hostname", destination),
                    port=int(options.get("port", "22") or 22), options=options)


def resolve(host: Host) -> Resolved:
    """``ssh -G`` for ``host``, without connecting (cached per process and ssh config file)."""
    return _resolve(host.destination, host.port, tuple(config_args()))
