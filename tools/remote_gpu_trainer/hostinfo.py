"""Facts about the host that several tools need (container or not), read cheaply from /proc."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_CONTAINER_MARKERS = ("docker", "kubepods", "containerd", "libpod", "lxc", "crio")


@cache
def in_container() -> bool:
    """True inside Docker/Podman/Kubernetes/LXC. PIDs that NVML reports are then host PIDs."""
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(marker in cgroup for marker in _CONTAINER_MARKERS)
