"""Ports: parsing ``29500`` / ``"29500-29510"`` specs, scanning who holds them, and port_status.

``port_status`` answers the question behind ``errno: 98 - Address already in use``: is the port
free, who holds it, and what should the launch use instead. "Free" means both that no socket in
this network namespace blocks it (/proc/net, including owners we cannot see) and that a test
``bind()`` succeeds the way c10d's TCPStore binds: wildcard address, IPv6 dual-stack first,
``SO_REUSEADDR`` on (torch/csrc/distributed/c10d/socket.cpp, SocketListenOp). The test socket is
bound and closed without ``listen()``, so nothing can connect to it and no packet is sent.

Suggested ports stay near the requested one and outside the kernel's ephemeral range
(``net.ipv4.ip_local_port_range``, unless listed in ``ip_local_reserved_ports``): a port in that
range can be taken at any moment by an outgoing connection.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .sockets import OwnerScan, Proto, SocketEntry, find_owners, read_sockets

MAX_PORT = 65535
MAX_RANGE_WIDTH = 1024
MAX_PORTS = 4096
PORT_SPEC_HELP = "a port 1-65535, or a range LOW-HIGH of at most 1024 ports, e.g. 29500 or 29500-29510"


def parse_port_specs(items: Sequence[int | str]) -> list[int]:
    """Sorted unique ports. Raises ValueError with a sentence saying what is wrong and what is allowed.

    Items are ints, or strings holding a port, a ``LOW-HIGH`` range, or a comma list of those.
    """
    if not items:
        raise ValueError(f"give at least one port: {PORT_SPEC_HELP}")
    ports: set[int] = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise ValueError(f"{item!r} is not a port: {PORT_SPEC_HELP}")
        tokens = [str(item)] if isinstance(item, int) else [t.strip() for t in item.split(",") if t.strip()]
        if not tokens:
            raise ValueError(f"empty port entry: {PORT_SPEC_HELP}")
        for token in tokens:
            low_text, dash, high_text = token.partition("-")
            if not low_text.isdigit() or (dash and not high_text.isdigit()):
                raise ValueError(f"{token!r} is not a port or range: {PORT_SPEC_HELP}")
            low = int(low_text)
            high = int(high_text) if dash else low
            for value in (low, high):
                if not 1 <= value <= MAX_PORT:
                    raise ValueError(f"port {value} is out of range: {PORT_SPEC_HELP}")
            if low > high:
                raise ValueError(f"range {token!r} is reversed: write {high}-{low}")
            if high - low + 1 > MAX_RANGE_WIDTH:
                raise ValueError(f"range {token!r} spans {high - low + 1} ports; at most {MAX_RANGE_WIDTH} per range")
            ports.update(range(low, high + 1))
    if len(ports) > MAX_PORTS:
        raise ValueError(f"{len(ports)} ports requested; at most {MAX_PORTS} in one call")
    return sorted(ports)


@dataclass
class PortScan:
    """Sockets on the requested ports and their owners (see sockets.py for the owner kinds)."""

    sockets: list[SocketEntry]
    owners: OwnerScan

    def pids_of(self, entry: SocketEntry) -> list[int]:
        return sorted(self.owners.owners.get(entry.inode, ()))

    def owner_kind(self, entry: SocketEntry) -> str:
        if entry.inode == 0:
            return "kernel"
        return "visible" if self.pids_of(entry) else "invisible"


def scan_ports(ports: Iterable[int], protocols: Iterable[Proto] = ("tcp",), *, include_connected: bool = False
               ) -> PortScan:
    """Listeners on ``ports`` (plus, with ``include_connected``, every socket whose local or remote
    port is one of them), with their owning pids."""
    sockets = read_sockets(ports, protocols, listening_only=not include_connected, match_remote=include_connected)
    return PortScan(sockets=sockets, owners=find_owners(entry.inode for entry in sockets))


def invisible_note(entry: SocketEntry, unreadable: int) -> str:
    """Why nobody visible holds ``entry``, with the socket's uid so the user knows whom to ask."""
    try:
        import pwd

        owner = f"{pwd.getpwuid(entry.uid).pw_name} (uid {entry.uid})"
    except (KeyError, ImportError):
        owner = f"uid {entry.uid}"
    if unreadable:
        return (f"held by a process of {owner} that this user cannot inspect ({unreadable} processes' fd tables "
                "are unreadable); the port is NOT free: ask its owner or an admin")
    return (f"held by a process of {owner} that is not visible here: another PID namespace sharing this network "
            "namespace (a container or pod sidecar) or /proc mounted with hidepid; the port is NOT free")


# ---------------------------------------------------------------- port_status helpers


def _read_ints(path: str) -> list[int]:
    try:
        return [int(x) for x in Path(path).read_text().split()]
    except (OSError, ValueError):
        return []


def ephemeral_range() -> tuple[int, int] | None:
    """``net.ipv4.ip_local_port_range``: ports the kernel hands to outgoing connections."""
    values = _read_ints("/proc/sys/net/ipv4/ip_local_port_range")
    return (values[0], values[1]) if len(values) == 2 else None


def reserved_ports() -> set[int]:
    """``net.ipv4.ip_local_reserved_ports``: excluded from ephemeral use, so safe to pick."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_reserved_ports").read_text().strip()
    except OSError:
        return set()
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found.update(range(int(low), int(high or low) + 1))
    return found


def in_ephemeral_range(port: int, ephemeral: tuple[int, int] | None, reserved: set[int]) -> bool:
    return ephemeral is not None and ephemeral[0] <= port <= ephemeral[1] and port not in reserved


def bind_test(port: int) -> tuple[bool, str | None]:
    """Bind (no listen) as TCPStore would; ``(True, None)`` or ``(False, reason)``."""
    errors = []
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                try:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                except OSError:
                    pass
            try:
                sock.bind((address, port))
                return True, None
            except OSError as err:
                name = errno.errorcode.get(err.errno or 0, "error")
                errors.append(f"bind {address} port {port}: {name} ({err.strerror})")
    return False, "; ".join(errors) or "no usable address family"


def blocking_ports(low: int, high: int) -> set[int]:
    """Local ports in [low, high] with any TCP socket on them (listening or not): one /proc/net read."""
    return {entry.local_port for entry in read_sockets(range(low, high + 1), ("tcp",), listening_only=False)}


def suggest_free_port(port: int, span: int) -> int | None:
    """The nearest port above ``port`` (within ``span``) that is unused, outside the ephemeral range
    and bindable; ``None`` if there is none."""
    high = min(MAX_PORT, port + span)
    taken = blocking_ports(port + 1, high) if port < high else set()
    ephemeral, reserved = ephemeral_range(), reserved_ports()
    for candidate in range(port + 1, high + 1):
        if candidate in taken or in_ephemeral_range(candidate, ephemeral, reserved):
            continue
        if bind_test(candidate)[0]:
            return candidate
    return None
