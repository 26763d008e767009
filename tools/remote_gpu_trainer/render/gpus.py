"""Which GPUs a launch will see, and what precision their generation supports.

Two sources, in this order: NVML through the process-wide session (``nvml_session``: its own worker
process, a timeout, never a hung or crashed server), then the ``CUDA_VISIBLE_DEVICES`` the launch would inherit. A
machine without an NVIDIA driver is a normal case here (the agent may render on a laptop for a
remote box): the answer is then "no GPU here", which the checks report as SKIP or UNKNOWN, never
as PASS.

bf16 needs compute capability 8.0 (Ampere) or newer: below that, torch emulates it slowly through
fp32 and ``torch.cuda.is_bf16_supported()`` may still say True (AMP-10).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .. import nvml_session
from ..errors import InputError

NVML_TIMEOUT_S = 5.0
BF16_MIN_CC = (8, 0)

# Compute capability by model, from NVIDIA's CUDA GPU list; the longest matching key wins, so
# "A100" and "RTX 6000 ADA" do not shadow each other.
GPU_CC: dict[str, tuple[int, int]] = {
    "K80": (3, 7), "M60": (5, 2), "P4": (6, 1), "P40": (6, 1), "P100": (6, 0), "V100": (7, 0), "TITAN V": (7, 0),
    "T4": (7, 5), "RTX 2080": (7, 5), "RTX 2070": (7, 5), "RTX 2060": (7, 5), "TITAN RTX": (7, 5),
    "QUADRO RTX": (7, 5), "A100": (8, 0), "A800": (8, 0), "A30": (8, 0), "A10": (8, 6), "A10G": (8, 6),
    "A16": (8, 6), "A2": (8, 6), "A40": (8, 6), "RTX A4000": (8, 6), "RTX A5000": (8, 6), "RTX A6000": (8, 6),
    "A6000": (8, 6), "RTX 3060": (8, 6), "RTX 3070": (8, 6), "RTX 3080": (8, 6), "RTX 3090": (8, 6),
    "L4": (8, 9), "L20": (8, 9), "L40": (8, 9), "L40S": (8, 9), "RTX 4060": (8, 9), "RTX 4070": (8, 9),
    "RTX 4080": (8, 9), "RTX 4090": (8, 9), "RTX 6000 ADA": (8, 9), "RTX 5000 ADA": (8, 9), "H100": (9, 0),
    "H800": (9, 0), "H200": (9, 0), "H20": (9, 0), "GH200": (9, 0), "B100": (10, 0), "B200": (10, 0),
    "GB200": (10, 0), "B300": (10, 3), "RTX 5080": (12, 0), "RTX 5090": (12, 0), "RTX PRO 6000": (12, 0),
}
_NAME_NOISE = re.compile(r"^(NVIDIA|TESLA|GEFORCE|QUADRO(?= RTX A))\s+")
_CC_TEXT = re.compile(r"^(?:SM_?)?(\d{1,2})\.?(\d)$")


def _normalise(name: str) -> str:
    text = re.sub(r"[\s_]+", " ", name.strip().upper())
    while _NAME_NOISE.match(text):
        text = _NAME_NOISE.sub("", text, count=1)
    return text


def capability_of(gpu: str) -> tuple[int, int]:
    """Compute capability for a GPU model ("A100", "NVIDIA H100 80GB HBM3", "T4") or a capability
    ("8.6", "sm_80"). Raises InputError for a name this table does not know."""
    text = _normalise(gpu)
    match = _CC_TEXT.match(text.replace(" ", ""))
    if match:
        return int(match.group(1)), int(match.group(2))
    best = ""
    for key in GPU_CC:
        pattern = r"(^|[\s-])" + re.escape(key) + r"($|[\s-])"
        if re.search(pattern, text) and len(key) > len(best):
            best = key
    if not best:
        raise InputError("gpu", f"unknown GPU {gpu!r}: give a model name or a compute capability such as 8.6",
                         allowed=[*sorted(GPU_CC), "a compute capability like 7.5 or sm_80"])
    return GPU_CC[best]


@dataclass(frozen=True)
class LocalGpus:
    """What this host can tell about the GPUs a launch from here would use."""

    source: str
    """``nvml``, ``cuda_visible_devices`` (NVML unavailable, count taken from the variable) or ``none``."""
    count: int | None
    """GPUs visible to CUDA after CUDA_VISIBLE_DEVICES; None when unknown."""
    names: list[str] = field(default_factory=list)
    capabilities: list[tuple[int, int]] = field(default_factory=list)
    detail: str = ""


def parse_visible(value: str, uuids: list[str] | None, physical: int | None) -> list[int] | int:
    """Indices CUDA would expose for CUDA_VISIBLE_DEVICES=value. CUDA stops at the first entry it
    cannot use, so "0,1,7" on a 4-GPU box exposes two GPUs. Without NVML (``physical`` None) only
    the number of well-formed entries can be given, returned as an int."""
    entries = [e.strip() for e in value.split(",")] if value.strip() else []
    seen: list[int] = []
    well_formed = 0
    for entry in entries:
        if re.fullmatch(r"\d+", entry):
            index = int(entry)
            if physical is not None and index >= physical:
                break
        elif re.fullmatch(r"(GPU|MIG)-[0-9A-Fa-f-]+", entry):
            if uuids is None:
                well_formed += 1
                continue
            matches = [i for i, u in enumerate(uuids) if u.lower().startswith(entry.lower())]
            if len(matches) != 1:
                break
            index = matches[0]
        else:
            break
        if index in seen:
            break
        seen.append(index)
        well_formed += 1
    return seen if physical is not None else well_formed


def _read_devices() -> tuple[list[str], list[str], list[tuple[int, int]]]:
    from ..health.backend import NvmlProcessBackend

    devices = NvmlProcessBackend().list_devices()
    return [d[0] for d in devices], [d[1] for d in devices], [d[2] for d in devices]


def local_gpus(environ: dict[str, str] | None = None) -> LocalGpus:
    """The GPUs a process started from here would see (NVML first, CUDA_VISIBLE_DEVICES second)."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    status = nvml_session.nvml_status(NVML_TIMEOUT_S)
    if status.ok:
        try:
            names, uuids, ccs = nvml_session.session().call(_read_devices, "render: list GPUs", NVML_TIMEOUT_S)
        except Exception as err:  # a hang or an NVML error is "unknown", never "no GPU"
            return LocalGpus("nvml", None, detail=f"NVML answered init but not the device list: {err}")
        indices = list(range(len(names))) if visible is None else parse_visible(visible, uuids, len(names))
        assert isinstance(indices, list)
        note = f"CUDA_VISIBLE_DEVICES={visible!r} exposes {len(indices)} of {len(names)}" if visible is not None \
            else f"{len(names)} GPU(s), CUDA_VISIBLE_DEVICES unset"
        return LocalGpus("nvml", len(indices), [names[i] for i in indices], [ccs[i] for i in indices],
                         f"NVML: {note}")
    if visible is not None:
        count = parse_visible(visible, None, None)
        assert isinstance(count, int)
        return LocalGpus("cuda_visible_devices", count,
                         detail=f"NVML unavailable ({status.reason}); CUDA_VISIBLE_DEVICES={visible!r} names {count} "
                         "device(s), not confirmed")
    reason = "no NVIDIA GPU on this host" if status.reason in nvml_session.NO_GPU_REASONS else "NVML unusable"
    return LocalGpus("none", None, detail=f"{reason} ({status.detail})")
