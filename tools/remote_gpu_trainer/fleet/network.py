"""What one box's network says about a multi-node run: the route to the head, InfiniBand/RoCE ports,
whether the head's rendezvous port can be reached from here, and a short-lived listener on the head.

Why each one: NCCL picks its socket interface by name prefix and can pick docker0 or a VPN
(NODE-01), so the interface that routes to the head is the value ``NCCL_SOCKET_IFNAME`` should get.
A worker that cannot open a TCP connection to head:port never joins the rendezvous (NODE-02), and
only a connect made *on the worker* proves it. Nothing listens on the port before the job starts, so
the head's check holds a listener there for a few seconds while the workers connect.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil
from pydantic import Field

from ..models import StrictModel

ConnectOutcome = Literal["ok", "refused", "timeout", "unresolvable", "error"]


class IbPort(StrictModel):
    device: str = Field(description="RDMA device, e.g. mlx5_0")
    port: int
    state: str = Field(description="Port state as sysfs gives it, e.g. '4: ACTIVE'")
    link_layer: str = Field(description="InfiniBand, or Ethernet for RoCE")
    rate_gbps: float | None = Field(description="Link rate in Gbit/s (sysfs 'rate', e.g. 400 Gb/sec (4X NDR))")

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state.upper()


class Route(StrictModel):
    iface: str | None = Field(description="Interface the kernel routes the head's address through")
    src: str | None = Field(description="This box's source address on that route")
    speed_mbps: int | None = Field(description="Link speed of that interface (sysfs, Mbit/s); None when unknown")
    detail: str = Field(description="How it was found, or why not")


def resolve_addresses(name: str) -> list[str]:
    """Every address ``name`` resolves to on this box (getaddrinfo, the way c10d resolves it)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def local_addresses() -> dict[str, list[str]]:
    """Interface → its IPv4/IPv6 addresses (psutil)."""
    found: dict[str, list[str]] = {}
    for iface, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                found.setdefault(iface, []).append(addr.address.split("%", 1)[0])
    return found


def iface_speed_mbps(iface: str, sysfs: str = "/sys/class/net") -> int | None:
    try:
        speed = int(Path(sysfs, iface, "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def parse_ip_route_get(text: str) -> tuple[str | None, str | None, bool]:
    """``ip -o route get ADDR`` → (dev, src, local). ``local`` routes mean the address is this box's own."""
    words = text.split()
    dev = words[words.index("dev") + 1] if "dev" in words[:-1] else None
    src = words[words.index("src") + 1] if "src" in words[:-1] else None
    return dev, src, bool(words) and words[0] == "local"


def _proc_net_route(address: str, path: str = "/proc/net/route") -> str | None:
    """IPv4 longest-prefix match over /proc/net/route, when ``ip`` is missing (minimal containers)."""
    try:
        target = int(ipaddress.IPv4Address(address))
        lines = Path(path).read_text().splitlines()[1:]
    except (OSError, ValueError):
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        dest = int.from_bytes(bytes.fromhex(fields[1]), "little")
        mask = int.from_bytes(bytes.fromhex(fields[7]), "little")
        if target & mask == dest and (best is None or mask.bit_count() > best[0]):
            best = (mask.bit_count(), fields[0])
    return best[1] if best else None


def owner_of(address: str, addresses: dict[str, list[str]]) -> str | None:
    """The interface holding ``address`` (the head routes its own address via ``lo``; we want the NIC)."""
    for iface, addrs in addresses.items():
        if address in addrs:
            return iface
    return None


def route_to(address: str, addresses: dict[str, list[str]] | None = None) -> Route:
    """The interface this box uses to reach ``address`` (an IP literal)."""
    addresses = local_addresses() if addresses is None else addresses
    own = owner_of(address, addresses)
    if own is not None:
        return Route(iface=own, src=address, speed_mbps=iface_speed_mbps(own),
                     detail=f"{address} is this box's own address on {own}")
    try:
        out = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True, timeout=5,
                             stdin=subprocess.DEVNULL)
        dev, src, _ = parse_ip_route_get(out.stdout) if out.returncode == 0 else (None, None, False)
        if dev:
            return Route(iface=dev, src=src, speed_mbps=iface_speed_mbps(dev), detail=f"ip route get {address}")
        detail = f"ip route get {address}: {out.stderr.strip() or 'no dev'}"
    except (OSError, subprocess.TimeoutExpired) as err:
        detail = f"ip route get: {err}"
    dev = _proc_net_route(address)
    if dev:
        return Route(iface=dev, src=None, speed_mbps=iface_speed_mbps(dev), detail="/proc/net/route")
    return Route(iface=None, src=None, speed_mbps=None, detail=detail)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "?"


def _rate_gbps(text: str) -> float | None:
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def ib_ports(sysfs: str = "/sys/class/infiniband") -> list[IbPort]:
    """RDMA ports from sysfs: InfiniBand, or RoCE when the link layer is Ethernet."""
    found = []
    for device in sorted(Path(sysfs).glob("*")) if Path(sysfs).is_dir() else []:
        for port_dir in sorted((device / "ports").glob("*")):
            found.append(IbPort(device=device.name, port=int(port_dir.name) if port_dir.name.isdigit() else 0,
                                state=_read(port_dir / "state"), link_layer=_read(port_dir / "link_layer"),
                                rate_gbps=_rate_gbps(_read(port_dir / "rate"))))
    return found


@dataclass
class Connect:
    outcome: ConnectOutcome
    detail: str
    address: str | None = None


def connect_with_retry(name: str, port: int, wait_s: float, attempt_s: float = 1.0) -> Connect:
    """Open a TCP connection to name:port from this box, retrying refusals until ``wait_s`` (the head's
    listener may open a moment later). A timeout means packets are dropped: a firewall or wrong network."""
    addresses = resolve_addresses(name)
    if not addresses:
        return Connect("unresolvable", f"{name} does not resolve on this box")
    deadline = time.monotonic() + wait_s
    last = Connect("error", "not tried")
    while True:
        for address in addresses:
            left = max(0.05, min(attempt_s, deadline - time.monotonic()))
            try:
                with socket.create_connection((address, port), timeout=left):
                    return Connect("ok", f"connected to {address}:{port}", address)
            except TimeoutError:
                last = Connect("timeout", f"connect to {address}:{port} timed out after {left:.1f} s", address)
            except OSError as err:
                kind: ConnectOutcome = "refused" if err.errno == errno.ECONNREFUSED else "error"
                last = Connect(kind, f"connect to {address}:{port}: {err.strerror or err}", address)
        if time.monotonic() >= deadline:
            return last
        time.sleep(0.2)


def _close_after_peer(conn: socket.socket, wait_s: float = 1.0) -> None:
    """Let the worker close first. A server-side TIME_WAIT on head:port would make torchrun's TCPStore (no
    SO_REUSEADDR) fail with EADDRINUSE for a minute after this check; a reset sent at once can reach the
    worker before its connect() returns and read as a failure. A peer that stays silent gets the reset."""
    try:
        conn.settimeout(wait_s)
        conn.recv(1)  # b"": the worker closed; we then close without leaving TIME_WAIT here
    except OSError:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        conn.close()


class HeadListener:
    """Hold head:port open for a short while so workers can prove they reach it; reports whether the
    port was free. Binds the way torchrun's TCPStore does (all addresses, dual stack when available)."""

    def __init__(self, port: int, expected: int, hold_s: float):
        self.port, self.expected, self.hold_s = port, expected, hold_s
        self.accepted: list[str] = []
        self.free: bool | None = None
        self.detail = ""
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def _bind(self) -> socket.socket:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            address: tuple = ("::", self.port)
        except OSError:
            sock, address = socket.socket(socket.AF_INET, socket.SOCK_STREAM), ("0.0.0.0", self.port)
        try:
            sock.bind(address)
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        return sock

    def start(self) -> HeadListener:
        try:
            self._sock = self._bind()
        except OSError as err:
            name = errno.errorcode.get(err.errno or 0, "error")
            self.free, self.detail = False, f"bind port {self.port}: {name} ({err.strerror})"
            return self
        self.free, self.detail = True, f"port {self.port} bound and listening for {self.hold_s:g} s"
        self._thread = threading.Thread(target=self._serve, name="rgt-head-listener", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        assert self._sock is not None
        deadline = time.monotonic() + self.hold_s
        self._sock.settimeout(0.1)
        while time.monotonic() < deadline and len(self.accepted) < self.expected:
            try:
                conn, peer = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            _close_after_peer(conn)
            self.accepted.append(str(peer[0]))
        self._sock.close()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join(self.hold_s + 1)
