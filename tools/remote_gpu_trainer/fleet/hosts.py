"""Which machines make up the fleet: a list of ssh hosts, a hostfile, or the current Slurm allocation.

Hostfiles come in the shape users already have: DeepSpeed's (``worker-0 slots=16``, matched in
DeepSpeed's ``launcher/runner.py`` by ``^(\\S+)\\s+slots=(\\d+)``, ``#`` comments and blank lines
skipped, a repeated host refused) and the plain one-host-per-line list that pdsh, torchrun wrappers
and ``scontrol show hostnames`` print. Slurm nodelists (``node[01-04,07]``) are expanded with the
maintained ``python-hostlist`` package (module ``hostlist``), not a hand-written bracket parser.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

_SLOTS = re.compile(r"^(\S+)\s+slots=(\d+)")
_PLAIN = re.compile(r"^(\S+)$")
NODELIST_ENV = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
HOSTFILE_EXAMPLES = ["worker-0 slots=8", "worker-1", "# a comment"]


@dataclass(frozen=True)
class FleetHost:
    """One machine as the caller named it, and the GPU slots its hostfile line gave (None: not said)."""

    host: str
    slots: int | None = None


def parse_hostfile_text(text: str, field: str = "hostfile") -> list[FleetHost]:
    """Parse a DeepSpeed-style or plain hostfile. Raises :class:`InputError` on a line it cannot read."""
    found: dict[str, FleetHost] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _SLOTS.match(line) or _PLAIN.match(line)
        if match is None:
            raise InputError(field, f"line {number} {raw.strip()[:80]!r} is neither 'HOST slots=N' nor one host",
                             allowed=HOSTFILE_EXAMPLES)
        host = match.group(1)
        if host in found:  # DeepSpeed refuses this too: "Hostfile contains multiple entries for …"
            raise InputError(field, f"line {number}: {host} is listed twice", allowed=HOSTFILE_EXAMPLES)
        slots = int(match.group(2)) if match.re is _SLOTS else None
        if slots == 0:
            raise InputError(field, f"line {number}: {host} has slots=0", allowed=HOSTFILE_EXAMPLES)
        found[host] = FleetHost(host, slots)
    if not found:
        raise InputError(field, "names no host", allowed=HOSTFILE_EXAMPLES)
    return list(found.values())


def read_hostfile(path: str) -> list[FleetHost]:
    try:
        text = Path(path).expanduser().read_text()
    except OSError as err:
        raise InputError("hostfile", f"cannot read {path}: {err.strerror or err}") from None
    return parse_hostfile_text(text)


def expand_nodelist(nodelist: str, field: str = "slurm") -> list[str]:
    """``node[01-04,07]`` → node01…node04, node07, with python-hostlist (what Slurm's own syntax means)."""
    try:
        import hostlist
    except ImportError:
        raise InputError(field, "expanding a Slurm nodelist needs the python-hostlist package: "
                         "pip install python-hostlist") from None
    try:
        hosts = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist as err:
        raise InputError(field, f"bad Slurm nodelist {nodelist[:80]!r}: {err}",
                         allowed=["node[01-04,07]", "gpu-a[1-2],gpu-b3"]) from None
    if not hosts:
        raise InputError(field, f"Slurm nodelist {nodelist!r} names no node")
    return hosts


def slurm_nodelist() -> str:
    """The allocation's nodelist from the environment (inside ``salloc``/``sbatch``)."""
    for name in NODELIST_ENV:
        value = os.environ.get(name)
        if value:
            return value
    raise InputError("slurm", "no SLURM_JOB_NODELIST here: run inside an allocation (salloc/sbatch) or pass hosts")


def srun_available() -> bool:
    """True inside an allocation with ``srun`` on PATH: the fan-out then needs no ssh at all."""
    return shutil.which("srun") is not None and any(os.environ.get(n) for n in ("SLURM_JOB_ID", "SLURM_JOBID"))


def fleet_from(hosts: list[str] | None, hostfile: str | None, slurm: bool) -> list[FleetHost]:
    """Exactly one of the three ways to name the fleet."""
    given = [name for name, value in (("hosts", hosts), ("hostfile", hostfile), ("slurm", slurm)) if value]
    if len(given) != 1:
        raise InputError("hosts", f"name the fleet exactly one way (got {', '.join(given) or 'none'})",
                         allowed=["hosts=[...]", "hostfile=PATH", "slurm=true"])
    if hosts:
        if len(set(hosts)) != len(hosts):
            raise InputError("hosts", "a host is listed twice")
        return [FleetHost(h) for h in hosts]
    if hostfile:
        return read_hostfile(hostfile)
    return [FleetHost(h) for h in expand_nodelist(slurm_nodelist())]
