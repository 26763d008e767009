"""XIDs from the kernel log: read what this boot logged, and say what each XID means for training.

NVML's XID events only cover the future, so a one-shot probe has to read the log. ``/dev/kmsg``
holds exactly the current boot (an XID from before the last reboot is not a current problem), then
``journalctl -k -b 0``. Both are commonly closed: ``kernel.dmesg_restrict=1`` for non-root users, and
container runtimes withhold CAP_SYSLOG. An unreadable log is reported as such (UNKNOWN), never as
"no XIDs".

Verdicts follow NVIDIA's Xid catalog resolution buckets (RESET_GPU / RESTART_BM → FAIL,
RESTART_APP → WARN, IGNORE → PASS); an XID not in the table is treated as critical, as NVIDIA's
Kubernetes device plugin does for every XID outside its application-error list.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..models import Verdict

XID_LINE = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)(?:, (.*))?")
_KMSG_PREFIX = re.compile(r"^\d+,\d+,(\d+),[^;]*;")
_MONOTONIC_PREFIX = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")
_MAX_EVENTS = 500


@dataclass(frozen=True)
class XidInfo:
    meaning: str
    action: str
    verdict: Verdict


# From NVIDIA's Xid catalog (Resolution Bucket) as summarised in the skill's facts; see GOT-18..22.
XID_TABLE: dict[int, XidInfo] = {
    8: XidInfo("GPU idle timeout", "restart the application", Verdict.WARN),
    13: XidInfo("graphics engine exception (usually a bug in the job)", "fix/restart the application", Verdict.WARN),
    31: XidInfo("GPU memory page fault (usually a bug in the job)", "fix/restart the application", Verdict.WARN),
    43: XidInfo("GPU stopped processing (the job's kernel faulted)", "none for the GPU", Verdict.PASS),
    45: XidInfo("preemptive cleanup after another error", "read the XIDs logged around it", Verdict.WARN),
    46: XidInfo("GPU stopped processing (timeout)", "reset the GPU", Verdict.FAIL),
    48: XidInfo("double-bit ECC error", "reset the GPU; repeated → replace", Verdict.FAIL),
    62: XidInfo("internal micro-controller halt", "reset the GPU", Verdict.FAIL),
    63: XidInfo("row remap / page retirement recorded", "reset the GPU to apply the remap", Verdict.WARN),
    64: XidInfo("row remap / page retirement failure", "reset the GPU; repeated → replace (RMA)", Verdict.FAIL),
    68: XidInfo("video decoder exception", "restart the application", Verdict.WARN),
    74: XidInfo("NVLink error", "check NVLink/fabric, reset the GPU", Verdict.FAIL),
    79: XidInfo("GPU has fallen off the bus", "reboot the node; repeated → hardware service", Verdict.FAIL),
    92: XidInfo("high single-bit ECC error rate", "watch it; none needed now", Verdict.WARN),
    94: XidInfo("contained uncorrectable memory error", "restart the application; reset later to remap", Verdict.WARN),
    95: XidInfo("uncontained uncorrectable memory error", "reset the GPU", Verdict.FAIL),
    109: XidInfo("context-switch timeout", "reset the GPU", Verdict.FAIL),
    119: XidInfo("GSP RPC timeout", "reset the GPU", Verdict.FAIL),
    120: XidInfo("GSP error", "reset the GPU", Verdict.FAIL),
    136: XidInfo("link training failure", "reset the GPU", Verdict.FAIL),
    140: XidInfo("ECC unrecovered error (escape)", "reset the GPU", Verdict.FAIL),
    143: XidInfo("GPU initialisation failure", "reset the GPU", Verdict.FAIL),
    151: XidInfo("key rotation error", "restart the VM", Verdict.FAIL),
    154: XidInfo("GPU recovery action changed", "follow the recovery action (gpu_health shows it)", Verdict.FAIL),
    155: XidInfo("NVLink software error", "reset the GPU", Verdict.FAIL),
    156: XidInfo("resource retirement event", "reset the GPU", Verdict.FAIL),
    158: XidInfo("fatal timeout", "reset the GPU", Verdict.FAIL),
}


def describe(code: int) -> XidInfo:
    return XID_TABLE.get(code, XidInfo("not in this skill's table (see NVIDIA's Xid catalog)",
                                       "look it up; treated as critical", Verdict.FAIL))


@dataclass(frozen=True)
class XidEvent:
    device: str
    """As logged, e.g. ``PCI:0000:3b:00``."""
    code: int
    text: str
    at_s: float | None
    """Seconds since boot, when the log line carries it."""


@dataclass(frozen=True)
class KernelLog:
    readable: bool
    source: str
    """``/dev/kmsg``, ``journalctl``, a test path, or ``-`` when nothing was readable."""
    reason: str
    """Why it could not be read (empty when readable)."""
    xids: tuple[XidEvent, ...] = ()


def parse_xids(lines: list[str]) -> tuple[XidEvent, ...]:
    """XID events from kmsg records (``6,123,4567890,-;NVRM: ...``), ``journalctl -o
    short-monotonic`` lines (``[ 12.3] host kernel: NVRM: ...``) or plain dmesg text."""
    events: list[XidEvent] = []
    for line in lines:
        match = XID_LINE.search(line)
        if not match:
            continue
        at_s: float | None = None
        if kmsg := _KMSG_PREFIX.match(line):
            at_s = int(kmsg.group(1)) / 1e6
        elif mono := _MONOTONIC_PREFIX.match(line):
            at_s = float(mono.group(1))
        events.append(XidEvent(device=match.group(1), code=int(match.group(2)),
                               text=(match.group(3) or "").strip(), at_s=at_s))
    return tuple(events[-_MAX_EVENTS:])


def read_kmsg(path: str, needle: str = "NVRM") -> list[str]:
    """The records of the kmsg ring buffer that contain ``needle``, without blocking (kmsg returns one record
    per read). Shared by the XID check and the run supervisor's OOM evidence."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    lines: list[str] = []
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break  # end of the buffer
            except OSError as err:
                if err.errno == errno.EPIPE:  # a record was overwritten while reading: skip it
                    continue
                raise
            if not chunk:
                break
            lines.extend(line for line in chunk.decode(errors="replace").splitlines() if needle in line)
    finally:
        os.close(fd)
    return lines


def _read_journal(timeout_s: float) -> list[str]:
    """The current boot's kernel messages from the journal. Every boot logs kernel lines, so an
    empty answer means "not allowed to see them" (journalctl then still exits 0), not "no XIDs"."""
    out = subprocess.run(["journalctl", "-k", "-b", "0", "-o", "short-monotonic", "--no-pager", "-q"],
                         capture_output=True, text=True, timeout=timeout_s)
    lines = out.stdout.splitlines()
    if out.returncode != 0 or not lines:
        raise PermissionError(out.stderr.strip().splitlines()[0] if out.stderr.strip()
                              else f"journalctl -k returned no kernel messages (exit {out.returncode})")
    return [line for line in lines if "NVRM" in line]


def read_kernel_log(kmsg_path: str = "/dev/kmsg", use_journal: bool = True, timeout_s: float = 5.0) -> KernelLog:
    """XIDs of the current boot, or why the kernel log could not be read."""
    reasons = []
    try:
        return KernelLog(True, kmsg_path, "", parse_xids(read_kmsg(kmsg_path)))
    except OSError as err:
        reasons.append(f"{kmsg_path}: {err.strerror or err}")
    if use_journal and shutil.which("journalctl"):
        try:
            return KernelLog(True, "journalctl", "", parse_xids(_read_journal(timeout_s)))
        except (OSError, subprocess.SubprocessError) as err:
            reasons.append(f"journalctl -k: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
    restrict = _dmesg_restrict()
    hint = ("kernel.dmesg_restrict=1 limits the kernel log to root/CAP_SYSLOG" if restrict == "1"
            else "container runtimes usually withhold CAP_SYSLOG")
    return KernelLog(False, "-", f"kernel log not readable ({'; '.join(reasons)}): {hint}")


def _dmesg_restrict() -> str | None:
    try:
        return Path("/proc/sys/kernel/dmesg_restrict").read_text().strip()
    except OSError:
        return None


def pci_key(bus_id: str) -> str:
    """Normalise NVML's ``00000000:3B:00.0`` and the log's ``PCI:0000:3b:00`` to ``0000:3b:00``
    (domain:bus:device), so an XID line can be matched to a GPU."""
    parts = bus_id.lower().removeprefix("pci:").split(".")[0].split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            pass
    return ":".join(parts)
