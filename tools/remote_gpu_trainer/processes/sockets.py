"""Who holds a port: sockets from netlink sock_diag (or /proc/net), owners from /proc/<pid>/fd.

Two passes, so the cost follows the number of *matching* sockets, not of all sockets:

1. Ask the kernel for the sockets of the caller's network namespace whose local port (or, for
   clients, remote port) is wanted: netlink sock_diag with a port filter (netlink.py), or, where
   a sandbox refuses netlink, the /proc/net/{tcp,tcp6,udp,udp6} tables, keeping only matching rows.
2. Only if something matched, walk /proc/<pid>/fd once, ``readlink`` each entry through a
   directory fd, and keep the pids whose descriptor is ``socket:[<inode>]`` of a matched row.
   Sockets shared by several processes (a parent and the children that inherited it) list them all.

bench/ports.py measures this against ``psutil.net_connections`` (which resolves every socket of
every process), ``ss -ltnp`` and ``lsof -iTCP -sTCP:LISTEN`` with 0 / 1,000 / 10,000 extra
listeners, in one run; the numbers go to bench/RESULTS.md.

Owner kinds, because "no pid found" must never read as "the port is free":

``visible``    one or more pids found.
``invisible``  the socket exists but no readable fd points at it: a process of another user whose
               /proc/<pid>/fd we may not read, a process in another PID namespace that shares this
               network namespace (a pod sidecar, a ``--network container:`` peer), or /proc mounted
               with ``hidepid``. The port is *held*. The socket's uid (reported by the kernel) still
               says whose.
``kernel``     inode 0, no file: a TIME_WAIT / FIN_WAIT2 connection the kernel keeps after its process
               closed it (TIME_WAIT lasts 60 s on Linux), or a connection still queued for a
               listener's accept(). No process to kill; it goes away by itself or with its listener.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from . import netlink
from .netlink import NetlinkUnavailable

PROC = Path("/proc")
PROC_NET = PROC / "net"

TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
    "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN",
    "0B": "CLOSING", "0C": "NEW_SYN_RECV",
}
# UDP reuses the TCP state numbers: 07 (CLOSE) is a bound, unconnected socket; 01 a connected one.
UDP_STATES = {"07": "UNCONN", "01": "ESTABLISHED"}
LISTEN_STATE = {"tcp": b"0A", "udp": b"07"}

Proto = Literal["tcp", "udp"]
Family = Literal["ipv4", "ipv6"]
TABLES: dict[tuple[str, str], str] = {("tcp", "ipv4"): "tcp", ("tcp", "ipv6"): "tcp6",
                                      ("udp", "ipv4"): "udp", ("udp", "ipv6"): "udp6"}


@dataclass(frozen=True)
class SocketEntry:
    proto: Proto
    family: Family
    local_addr: str
    local_port: int
    remote_addr: str
    remote_port: int
    state: str
    uid: int
    inode: int

    @property
    def listening(self) -> bool:
        """A TCP listener, or a bound unconnected UDP socket: what makes ``bind()`` fail for others."""
        return self.state in ("LISTEN", "UNCONN")

    @property
    def local(self) -> str:
        return _endpoint(self.local_addr, self.local_port, self.family)

    @property
    def remote(self) -> str | None:
        return None if self.remote_port == 0 else _endpoint(self.remote_addr, self.remote_port, self.family)


def _endpoint(addr: str, port: int, family: Family) -> str:
    return f"[{addr}]:{port}" if family == "ipv6" else f"{addr}:{port}"


def decode_address(hex_addr: bytes) -> str:
    """/proc/net prints each 32-bit word of the address as a host-endian integer: undo that."""
    words = [int(hex_addr[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_addr), 8)]
    return str(ipaddress.ip_address(b"".join(words)))


def parse_proc_net(data: bytes, proto: Proto, family: Family, ports: frozenset[int], *,
                   listening_only: bool = True, match_remote: bool = False) -> list[SocketEntry]:
    """Rows of one /proc/net table whose local port (or remote port, with ``match_remote``) is wanted.

    ``listening_only`` keeps TCP LISTEN and unconnected UDP rows. Pure: tests feed it sample text.
    """
    wanted = {b"%04X" % port for port in ports}
    listen_state = LISTEN_STATE[proto]
    states = TCP_STATES if proto == "tcp" else UDP_STATES
    found: list[SocketEntry] = []
    for line in data.split(b"\n")[1:]:
        # sl local rem st rest...: a 4-way split is enough to filter; most rows stop here.
        head = line.split(None, 4)
        if len(head) < 5:
            continue
        local, remote, state = head[1], head[2], head[3]
        local_hit = local[-4:] in wanted
        if not (local_hit or (match_remote and remote[-4:] in wanted)):
            continue
        if listening_only and (state != listen_state or not local_hit):
            continue
        rest = head[4].split()
        # rest: tx:rx tr:when retrnsmt uid timeout inode ...
        if len(rest) < 6:
            continue
        local_hex, _, local_port = local.partition(b":")
        remote_hex, _, remote_port = remote.partition(b":")
        state_text = state.decode()
        found.append(SocketEntry(
            proto=proto, family=family,
            local_addr=decode_address(local_hex), local_port=int(local_port, 16),
            remote_addr=decode_address(remote_hex), remote_port=int(remote_port, 16),
            state=states.get(state_text, f"state {state_text}"), uid=int(rest[3]), inode=int(rest[5]),
        ))
    return found


Backend = Literal["auto", "netlink", "proc"]


class SocketTablesUnavailable(OSError):
    """Neither netlink nor /proc/net could be read: ports cannot be checked on this system."""


def read_sockets(ports: Iterable[int], protocols: Iterable[Proto] = ("tcp",), *, listening_only: bool = True,
                 match_remote: bool = False, backend: Backend = "auto", proc_net: Path | None = None
                 ) -> list[SocketEntry]:
    """Matching sockets of this network namespace, IPv4 and IPv6.

    ``auto`` asks netlink sock_diag (fast, filtered in the kernel; see netlink.py) and falls back
    to parsing /proc/net when a sandbox refuses it; ``proc`` forces the fallback (tests, bench).
    """
    wanted = frozenset(ports)
    if backend != "proc":
        try:
            return _read_netlink(wanted, tuple(protocols), listening_only, match_remote)
        except NetlinkUnavailable:
            if backend == "netlink":
                raise
    proc_net = proc_net or PROC_NET
    found: list[SocketEntry] = []
    for proto in protocols:
        read_any = False
        for family in ("ipv4", "ipv6"):
            try:
                data = (proc_net / TABLES[(proto, family)]).read_bytes()
            except OSError:  # no IPv6 table without IPv6
                continue
            read_any = True
            found += parse_proc_net(data, proto, family, wanted,  # type: ignore[arg-type]
                                    listening_only=listening_only, match_remote=match_remote)
        if not read_any:
            # "Nothing found" must not read as "free" when nothing could be looked at.
            raise SocketTablesUnavailable(f"cannot list {proto} sockets here: netlink sock_diag refused and "
                                          f"{proc_net}/{TABLES[(proto, 'ipv4')]} unreadable (not Linux?)")
    return found


def _read_netlink(wanted: frozenset[int], protocols: tuple[Proto, ...], listening_only: bool,
                  match_remote: bool) -> list[SocketEntry]:
    program = netlink.bytecode(netlink.port_ranges(wanted), source=True, dest=match_remote)
    found: list[SocketEntry] = []
    for proto in protocols:
        number, names = (socket.IPPROTO_TCP, TCP_STATES) if proto == "tcp" else (socket.IPPROTO_UDP, UDP_STATES)
        states = netlink.ALL_STATES if not listening_only else (
            netlink.TCPF_LISTEN if proto == "tcp" else netlink.UDP_UNCONNECTED)
        for family, family_name in ((socket.AF_INET, "ipv4"), (socket.AF_INET6, "ipv6")):
            try:
                rows = netlink.dump(family, number, states, program)
            except netlink.NetlinkUnavailable:
                if family == socket.AF_INET6 and not socket.has_ipv6:
                    continue
                raise
            for state, laddr, lport, raddr, rport, uid, inode in rows:
                # The kernel filter already matched; re-check, since an oversized filter is left out.
                if lport not in wanted and not (match_remote and rport in wanted):
                    continue
                found.append(SocketEntry(proto=proto, family=family_name,  # type: ignore[arg-type]
                                         local_addr=laddr, local_port=lport, remote_addr=raddr, remote_port=rport,
                                         state=names.get(f"{state:02X}", f"state {state:02X}"), uid=uid,
                                         inode=inode))
    return found


@dataclass
class OwnerScan:
    """Socket inode → pids holding it, and how many fd tables we could not read (for the
    invisible-owner explanation)."""

    owners: dict[int, set[int]] = field(default_factory=dict)
    unreadable: int = 0


def find_owners(inodes: Iterable[int], proc: Path = PROC) -> OwnerScan:
    """Pids with an fd on each socket inode; one pass over /proc, nothing at all if ``inodes`` is empty."""
    targets = {f"socket:[{inode}]": inode for inode in inodes if inode}
    scan = OwnerScan()
    if not targets:
        return scan
    with os.scandir(proc) as entries:
        pids = [int(entry.name) for entry in entries if entry.name.isdigit()]
    for pid in pids:
        try:
            fd_dir = os.open(f"{proc}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY)
        except PermissionError:
            scan.unreadable += 1
            continue
        except OSError:  # exited meanwhile
            continue
        try:
            for name in os.listdir(fd_dir):
                try:
                    link = os.readlink(name, dir_fd=fd_dir)
                except OSError:
                    continue
                inode = targets.get(link)
                if inode is not None:
                    scan.owners.setdefault(inode, set()).add(pid)
        except PermissionError:
            scan.unreadable += 1
        finally:
            os.close(fd_dir)
    return scan
