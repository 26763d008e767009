"""Facts about the host that several tools need (container or not), read cheaply from /proc."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

BOX_MARKER = "RGT_BOX_DESTINATION"
"""Set by the box's session server (remote/serve.py) for every request: this process is a box runtime."""
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


def is_box_runtime() -> bool:
    """True when this process serves a box session (the runtime's python is then never the user's)."""
    return BOX_MARKER in os.environ
