"""The health checks: pure functions from what NVML said to a verdict with its evidence.

Each check returns a :class:`Check`: name, verdict, the observed value, the threshold it was held
against, one line of explanation and the catalog entry to read. A value that could not be read
becomes SKIP (the GPU or driver lacks the feature) or UNKNOWN (it should be readable but was not),
never PASS. Thresholds are the peers' (DCGM level-1 diagnostics and health watches, NVIDIA's Xid
catalog and device plugin, Meta GCM, gpud), summarised in the skill's NVML facts; temperature is
judged against each GPU's own slowdown/shutdown thresholds, never hard-coded numbers.

"Idle" matters: a power cap or a slowdown is normal under full load and alarming on an idle GPU,
so several checks read the GPU's utilisation first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import Field

from ..models import EntryRef, StrictModel, Verdict, worst
from ..tables import gib
from .backend import Counters, ErrorKind, GpuSnapshot, Unread
from .holders import Holder, HolderClass
from .xid import XidEvent, describe

BUSY_UTIL_PERCENT = 10
"""At or above this GPU utilisation the GPU counts as loaded (clocks reduced for power is then normal)."""
TEMP_IDLE_MARGIN_C = 10
"""An idle GPU this close to its slowdown temperature has a cooling problem."""
MAX_RETIRED_PAGES = 63
"""DCGM's DCGM_LIMIT_MAX_RETIRED_PAGES: at or above it the GPU should be replaced."""
PCIE_REPLAYS_PER_MIN = 8
"""DCGM's health watch: more PCIe replays per minute than this is a degraded link."""
NVLINK_CRC_PER_S = 100
"""DCGM: NVLink CRC errors only matter at 100+/s."""
UNATTRIBUTED_BYTES = 1 << 30
"""VRAM used beyond what the listed processes account for; below 1 GiB it is driver noise."""

COMPUTE_MODES = {0: "Default", 1: "Exclusive Thread", 2: "Prohibited", 3: "Exclusive Process"}
FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
RECOVERY_ACTIONS = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET",
                    5: "BUS_RESET", 6: "SYSTEM_REBOOT", 7: "RECOVER_IMEX_DOMAIN"}

# Clock event (throttle) reason bits, nvmlClocksEventReason*.
GPU_IDLE, APP_CLOCKS, SW_POWER_CAP, HW_SLOWDOWN = 0x1, 0x2, 0x4, 0x8
SYNC_BOOST, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE, DISPLAY_CLOCKS = 0x10, 0x20, 0x40, 0x80, 0x100
MASKED_REASONS = GPU_IDLE | APP_CLOCKS | SYNC_BOOST | DISPLAY_CLOCKS
"""Benign bits: idle, application clocks, sync boost, display clocks (NVSentinel#890)."""
REASON_NAMES = {SW_POWER_CAP: "SW power cap", HW_SLOWDOWN: "HW slowdown", SW_THERMAL: "SW thermal slowdown",
                HW_THERMAL: "HW thermal slowdown", HW_POWER_BRAKE: "HW power brake"}
HW_REASONS = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE

# Catalog entries, written out literally so a project test can check that each one exists.
E_LOST = EntryRef(file="references/gotchas_universal.md", id="GOT-18")
E_HANG = EntryRef(file="references/gotchas_universal.md", id="GOT-23")
E_ECC = EntryRef(file="references/gotchas_universal.md", id="GOT-19")
E_REMAP = EntryRef(file="references/gotchas_universal.md", id="GOT-20")
E_APP_XID = EntryRef(file="references/gotchas_universal.md", id="GOT-21")
E_FATAL_XID = EntryRef(file="references/gotchas_universal.md", id="GOT-22")
E_THROTTLE = EntryRef(file="references/gotchas_universal.md", id="GOT-24")
E_PERSISTENCE = EntryRef(file="references/gotchas_universal.md", id="GOT-25")
E_KERNEL_LOG = EntryRef(file="references/gotchas_universal.md", id="GOT-26")
E_PCIE = EntryRef(file="references/gotchas_universal.md", id="GOT-27")
E_EXCLUSIVE = EntryRef(file="references/gotchas_universal.md", id="GOT-09")
E_ORPHANS = EntryRef(file="references/gotchas_universal.md", id="GOT-06")
E_NAMESPACED = EntryRef(file="references/gotchas_universal.md", id="GOT-07")
E_PKILL = EntryRef(file="references/gotchas_universal.md", id="GOT-08")
E_MISMATCH = EntryRef(file="references/gotchas_universal.md", id="GOT-11")
E_NOT_LOADED = EntryRef(file="references/gotchas_universal.md", id="GOT-12")
E_NO_DEVICES = EntryRef(file="references/gotchas_universal.md", id="GOT-13")
E_NO_LIBRARY = EntryRef(file="references/gotchas_universal.md", id="GOT-17")
E_FABRIC = EntryRef(file="references/multinode.md", id="NODE-05")
E_MIG = EntryRef(file="references/gotchas_universal.md", id="GOT-28")
E_INFOROM = EntryRef(file="references/gotchas_universal.md", id="GOT-29")
E_VBIOS = EntryRef(file="references/gotchas_universal.md", id="GOT-30")
E_NVLINK = EntryRef(file="references/gotchas_universal.md", id="GOT-31")
E_GPU_BUSY = EntryRef(file="references/training/oom-memory.md", id="OOM-06")


class Check(StrictModel):
    name: str = Field(description="Stable check name, e.g. row_remap, temperature, compute_mode")
    verdict: Verdict
    observed: str = Field(description="What was read, with units")
    threshold: str = Field(description="What it was held against")
    explanation: str = Field(description="One line: what it means for training and what to do")
    entry: EntryRef | None = Field(None, description="Catalog entry to read for this finding")


@dataclass(frozen=True)
class GpuContext:
    """What a GPU's checks need besides its snapshot."""

    later: Counters | None = None
    """The second counter read, ``sample_s`` after the snapshot's; None without a window."""
    holders: Sequence[Holder] = ()
    xids: Sequence[XidEvent] | None = None
    """XIDs logged for this GPU since boot; None when the kernel log was unreadable."""
    in_container: bool = False


def _mode_text(current: bool, pending: bool) -> str:
    text = "on" if current else "off"
    return text if pending == current else f"{text} (pending {'on' if pending else 'off'})"


def unread_check(name: str, unread: Unread, what: str, entry: EntryRef | None = None,
                 observed: str = "-", threshold: str = "-") -> Check:
    """SKIP when the GPU or driver lacks the feature, UNKNOWN when it should have answered."""
    if unread.kind is ErrorKind.NOT_SUPPORTED:
        return Check(name=name, verdict=Verdict.SKIP, observed=observed, threshold=threshold,
                     explanation=f"{what}: not supported on this GPU ({unread.detail or unread.call})")
    if unread.kind is ErrorKind.FUNCTION_NOT_FOUND:
        return Check(name=name, verdict=Verdict.SKIP, observed=observed, threshold=threshold,
                     explanation=f"{what}: this driver does not provide {unread.call} (too old for this check)")
    reason = "NVML refused: no permission" if unread.kind is ErrorKind.NO_PERMISSION else \
        f"{unread.call} failed: {unread.detail or unread.kind}"
    return Check(name=name, verdict=Verdict.UNKNOWN, observed=observed, threshold=threshold,
                 explanation=f"{what} could not be read ({reason})", entry=entry)


def _first_unread(*values: object) -> Unread | None:
    return next((v for v in values if isinstance(v, Unread)), None)


def busy(gpu: GpuSnapshot) -> bool | None:
    """Loaded (utilisation ≥ BUSY_UTIL_PERCENT), idle, or None when utilisation is unreadable."""
    return None if isinstance(gpu.utilization_gpu, Unread) else gpu.utilization_gpu >= BUSY_UTIL_PERCENT


def _load_word(gpu: GpuSnapshot) -> str:
    return {True: "loaded", False: "idle", None: "load unknown"}[busy(gpu)]


# --- per-GPU checks ------------------------------------------------------------------------------


def check_recovery_action(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "recovery_action", gpu.recovery_action
    if isinstance(value, Unread):
        return unread_check(name, value, "GPU recovery action (needs driver R550+)", threshold="NONE")
    action = RECOVERY_ACTIONS.get(value, f"code {value}")
    if value == 0:
        return Check(name=name, verdict=Verdict.PASS, observed=action, threshold="NONE",
                     explanation="the driver asks for no recovery")
    return Check(name=name, verdict=Verdict.FAIL, observed=action, threshold="NONE",
                 explanation=f"the driver says this GPU needs {action} before it can be trusted; do not train here "
                             "until that is done (the user's call)", entry=E_FATAL_XID)


def check_ecc_mode(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "ecc_mode", gpu.ecc_mode
    if isinstance(value, Unread):
        return unread_check(name, value, "ECC mode", threshold="enabled")
    current, pending = value
    observed = _mode_text(current, pending)
    if pending != current:
        return Check(name=name, verdict=Verdict.WARN, observed=observed, threshold="pending = current",
                     explanation="an ECC mode change waits for a GPU reset or reboot", entry=E_ECC)
    if not current:
        return Check(name=name, verdict=Verdict.WARN, observed=observed, threshold="enabled",
                     explanation="this GPU supports ECC but it is off: memory errors go undetected and corrupt "
                                 "training silently", entry=E_ECC)
    return Check(name=name, verdict=Verdict.PASS, observed=observed, threshold="enabled", explanation="ECC is on")


def check_ecc_uncorrected(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "ecc_uncorrected", gpu.ecc_uncorrected_volatile
    if isinstance(value, Unread):
        return unread_check(name, value, "volatile uncorrectable ECC count", threshold="0")
    parts = [f"{value} since driver load"]
    if not isinstance(gpu.ecc_uncorrected_aggregate, Unread):
        parts.append(f"{gpu.ecc_uncorrected_aggregate} lifetime")
    if not isinstance(gpu.ecc_corrected_volatile, Unread):
        parts.append(f"{gpu.ecc_corrected_volatile} corrected")
    observed = ", ".join(parts)
    if value > 0:
        return Check(name=name, verdict=Verdict.FAIL, observed=observed, threshold="0 since driver load",
                     explanation="uncorrectable memory errors since the driver loaded: results can be corrupt and "
                                 "the next one crashes the run; reset the GPU or use another one", entry=E_ECC)
    return Check(name=name, verdict=Verdict.PASS, observed=observed, threshold="0 since driver load",
                 explanation="no uncorrectable memory errors since the driver loaded")


def check_row_remap(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "row_remap", gpu.remapped_rows
    threshold = "no pending remap, no remap failure"
    if isinstance(value, Unread):
        return unread_check(name, value, "row remapping (Ampere and newer)", threshold=threshold)
    observed = (f"{value.correctable} corr + {value.uncorrectable} unc rows remapped"
                f"{', PENDING' if value.pending else ''}{', FAILURE' if value.failed else ''}")
    if value.failed:
        return Check(name=name, verdict=Verdict.FAIL, observed=observed, threshold=threshold,
                     explanation="a row remap failed: spare rows are exhausted; the GPU needs replacing", entry=E_REMAP)
    if value.pending:
        return Check(name=name, verdict=Verdict.FAIL, observed=observed, threshold=threshold,
                     explanation="a bad memory row is waiting to be remapped and can still be hit until the GPU is "
                                 "reset (the user's call)", entry=E_REMAP)
    return Check(name=name, verdict=Verdict.PASS, observed=observed, threshold=threshold,
                 explanation="no pending or failed row remaps")


def check_retired_pages(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "retired_pages", gpu.retired_pages
    threshold = f"none pending, < {MAX_RETIRED_PAGES} retired"
    if isinstance(value, Unread):
        return unread_check(name, value, "page retirement (pre-Ampere GPUs)", threshold=threshold)
    total = value.single_bit + value.double_bit
    observed = f"{value.single_bit} SBE + {value.double_bit} DBE retired{', PENDING' if value.pending else ''}"
    if value.pending:
        return Check(name=name, verdict=Verdict.FAIL, observed=observed, threshold=threshold,
                     explanation="a page retirement waits for a GPU reset; until then the bad page can be hit",
                     entry=E_REMAP)
    if total >= MAX_RETIRED_PAGES:
        return Check(name=name, verdict=Verdict.FAIL, observed=observed, threshold=threshold,
                     explanation="as many retired pages as DCGM's replacement limit: the memory is failing",
                     entry=E_REMAP)
    return Check(name=name, verdict=Verdict.PASS, observed=observed, threshold=threshold,
                 explanation="no pending retirements, below the replacement limit")


def check_inforom(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "inforom", gpu.inforom_valid
    if isinstance(value, Unread):
        return unread_check(name, value, "InfoROM validation", threshold="valid")
    if not value:
        return Check(name=name, verdict=Verdict.WARN, observed="corrupted", threshold="valid",
                     explanation="the InfoROM (where ECC and retirement records live) is corrupted: error "
                                 "accounting is unreliable; the GPU needs service", entry=E_INFOROM)
    return Check(name=name, verdict=Verdict.PASS, observed="valid", threshold="valid", explanation="InfoROM is valid")


def check_temperature(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name = "temperature"
    temp, slowdown, shutdown = gpu.temperature_c, gpu.temp_slowdown_c, gpu.temp_shutdown_c
    if isinstance(temp, Unread):
        return unread_check(name, temp, "GPU temperature")
    missing = _first_unread(slowdown, shutdown)
    if missing is not None:
        return unread_check(name, missing, "this GPU's slowdown/shutdown temperatures", observed=f"{temp} °C")
    assert isinstance(slowdown, int) and isinstance(shutdown, int)
    load = busy(gpu)
    observed = f"{temp} °C ({_load_word(gpu)})"
    threshold = f"slowdown {slowdown} °C, shutdown {shutdown} °C"
    if temp >= shutdown:
        verdict, why = Verdict.FAIL, "at the shutdown temperature: the GPU will switch off"
    elif temp >= slowdown:
        verdict = Verdict.WARN if load else Verdict.FAIL
        why = ("at the slowdown temperature: clocks are being cut" +
               ("" if load else " while idle, a cooling failure"))
    elif not load and temp >= slowdown - TEMP_IDLE_MARGIN_C:
        verdict, why = Verdict.WARN, f"idle yet within {TEMP_IDLE_MARGIN_C} °C of slowdown: check cooling"
    else:
        return Check(name=name, verdict=Verdict.PASS, observed=observed, threshold=threshold,
                     explanation=f"{slowdown - temp} °C below slowdown")
    return Check(name=name, verdict=verdict, observed=observed, threshold=threshold, explanation=why, entry=E_THROTTLE)


def _delta(early: object, late: object) -> int | None:
    return late - early if isinstance(early, int) and isinstance(late, int) else None


def check_clock_events(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "clock_events", gpu.clock_event_reasons
    threshold = "no HW slowdown/thermal/power brake; SW thermal none; power cap only under load"
    if isinstance(value, Unread):
        return unread_check(name, value, "clock event (throttle) reasons", threshold=threshold)
    load = busy(gpu)
    active = value & ~MASKED_REASONS
    names = [label for bit, label in REASON_NAMES.items() if active & bit]
    verdicts, why = [Verdict.PASS], []
    if active & HW_REASONS:
        verdicts.append(Verdict.WARN if load is not False else Verdict.FAIL)
        why.append("hardware is forcing clocks down" + (" on an idle GPU: power or cooling fault" if load is False
                                                        else " (at least halves throughput)"))
    if active & SW_THERMAL:
        verdicts.append(Verdict.WARN)
        why.append("the driver cuts clocks to stay under a temperature limit")
    if active & SW_POWER_CAP and load is False:
        verdicts.append(Verdict.WARN)
        why.append("power-capped while idle")
    window = ""
    if ctx.later is not None:
        span_ns = max(1, int((ctx.later.at - gpu.counters.at) * 1e9))
        thermal = _delta(gpu.counters.thermal_violation_ns, ctx.later.thermal_violation_ns)
        power = _delta(gpu.counters.power_violation_ns, ctx.later.power_violation_ns)
        window = f"; in {span_ns / 1e9:.1f} s: thermal-limited {_pct(thermal, span_ns)}, power-limited " \
                 f"{_pct(power, span_ns)}"
        if thermal:
            verdicts.append(Verdict.WARN)
            why.append("thermal violations during the sampling window")
        if power and load is False:
            verdicts.append(Verdict.WARN)
            why.append("power violations while idle")
    observed = f"{', '.join(names) or 'none'} ({_load_word(gpu)}){window}"
    verdict = worst(verdicts)
    if verdict is Verdict.PASS:
        ok = "no throttling" if not names else "power capping under load is normal"
        return Check(name=name, verdict=verdict, observed=observed, threshold=threshold, explanation=ok)
    return Check(name=name, verdict=verdict, observed=observed, threshold=threshold, explanation="; ".join(why),
                 entry=E_THROTTLE)


def _pct(part_ns: int | None, span_ns: int) -> str:
    return "?" if part_ns is None else f"{100 * min(part_ns, span_ns) / span_ns:.0f} %"


def check_power_limit(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, limit, default = "power_limit", gpu.power_limit_mw, gpu.power_default_limit_mw
    missing = _first_unread(limit, default)
    if missing is not None:
        return unread_check(name, missing, "enforced and default power limits", threshold="enforced = default")
    assert isinstance(limit, int) and isinstance(default, int)
    observed = f"{limit / 1000:.0f} W of default {default / 1000:.0f} W"
    if limit < default - 1000:
        return Check(name=name, verdict=Verdict.WARN, observed=observed, threshold="enforced ≥ default",
                     explanation=f"capped {100 * (default - limit) / default:.0f} % below default by the host: "
                                 "expect lower clocks under load; only the machine owner can change it",
                     entry=E_THROTTLE)
    return Check(name=name, verdict=Verdict.PASS, observed=observed, threshold="enforced ≥ default",
                 explanation="full default power limit")


def check_pcie_link(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name = "pcie_link"
    values = (gpu.pcie_width, gpu.pcie_max_width, gpu.pcie_gen, gpu.pcie_max_gen)
    missing = _first_unread(*values)
    if missing is not None:
        return unread_check(name, missing, "PCIe link width/generation", threshold="width = max")
    width, max_width, gen, max_gen = values
    assert isinstance(width, int) and isinstance(max_width, int) and isinstance(gen, int) and isinstance(max_gen, int)
    load = busy(gpu)
    observed = f"x{width} Gen{gen} (max x{max_width} Gen{max_gen}, {_load_word(gpu)})"
    threshold = "width = max; generation = max under load"
    verdicts, why = [Verdict.PASS], []
    if width < max_width:
        verdicts.append(Verdict.WARN)
        why.append(f"running at x{width} of x{max_width}: host↔GPU copies and PCIe NCCL traffic are slower")
    if gen < max_gen and load:
        verdicts.append(Verdict.WARN)
        why.append(f"Gen{gen} under load (max Gen{max_gen})")
    if ctx.later is not None:
        replays = _delta(gpu.counters.pcie_replays, ctx.later.pcie_replays)
        minutes = max(ctx.later.at - gpu.counters.at, 1e-3) / 60
        if replays is not None:
            observed += f"; {replays} replays in window"
            if replays / minutes > PCIE_REPLAYS_PER_MIN:
                verdicts.append(Verdict.WARN)
                why.append(f"{replays / minutes:.0f} PCIe replays/min (> {PCIE_REPLAYS_PER_MIN}): a flaky link")
    verdict = worst(verdicts)
    if verdict is Verdict.PASS:
        idle_note = " (a lower generation while idle is normal power saving)" if gen < max_gen else ""
        return Check(name=name, verdict=verdict, observed=observed, threshold=threshold,
                     explanation=f"full link width{idle_note}")
    return Check(name=name, verdict=verdict, observed=observed, threshold=threshold, explanation="; ".join(why),
                 entry=E_PCIE)


def check_compute_mode(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "compute_mode", gpu.compute_mode
    if isinstance(value, Unread):
        return unread_check(name, value, "compute mode", threshold="Default")
    mode = COMPUTE_MODES.get(value, f"mode {value}")
    if value == 2:
        return Check(name=name, verdict=Verdict.FAIL, observed=mode, threshold="Default",
                     explanation="Prohibited: no process may create a CUDA context on this GPU", entry=E_EXCLUSIVE)
    if value in (1, 3):
        return Check(name=name, verdict=Verdict.WARN, observed=mode, threshold="Default",
                     explanation="only one process may hold a CUDA context on this GPU: a second one (two ranks per "
                                 "GPU, a DataLoader worker or monitor touching CUDA, a leftover process) fails with "
                                 "'CUDA-capable device(s) is/are busy or unavailable'; one rank per GPU is fine",
                     entry=E_EXCLUSIVE)
    return Check(name=name, verdict=Verdict.PASS, observed=mode, threshold="Default",
                 explanation="any number of processes may share the GPU")


def check_persistence(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "persistence_mode", gpu.persistence
    if isinstance(value, Unread):
        return unread_check(name, value, "persistence mode", threshold="on")
    if not value:
        return Check(name=name, verdict=Verdict.WARN, observed="off", threshold="on",
                     explanation="the driver re-initialises the GPU for every new client: each first CUDA/NVML call "
                                 "takes seconds; on a rented box it is the host's setting", entry=E_PERSISTENCE)
    return Check(name=name, verdict=Verdict.PASS, observed="on", threshold="on", explanation="GPU state is kept")


def check_mig(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "mig_mode", gpu.mig_mode
    if isinstance(value, Unread):
        return unread_check(name, value, "MIG mode", threshold="off")
    current, pending = value
    observed = _mode_text(current, pending)
    if current:
        return Check(name=name, verdict=Verdict.WARN, observed=observed, threshold="off",
                     explanation="MIG is on: each process sees only a slice (select it with CUDA_VISIBLE_DEVICES="
                                 "MIG-<uuid>); one process cannot use several slices, so multi-GPU training across "
                                 "MIG instances does not work", entry=E_MIG)
    if pending != current:
        return Check(name=name, verdict=Verdict.WARN, observed=observed, threshold="pending = current",
                     explanation="a MIG mode change waits for a GPU reset", entry=E_MIG)
    return Check(name=name, verdict=Verdict.PASS, observed=observed, threshold="off", explanation="whole GPU")


def check_fabric(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "fabric", gpu.fabric
    threshold = "completed, status success (NVSwitch systems)"
    if isinstance(value, Unread):
        return unread_check(name, value, "NVSwitch fabric state", threshold=threshold)
    state = FABRIC_STATES.get(value.state, f"state {value.state}")
    if value.state == 0:
        return Check(name=name, verdict=Verdict.SKIP, observed=state, threshold=threshold,
                     explanation="not an NVSwitch system: no fabric to check")
    if value.state == 3 and value.status == 0:
        return Check(name=name, verdict=Verdict.PASS, observed=state, threshold=threshold,
                     explanation="fabric manager finished configuring NVLink")
    detail = f"{state}, status {value.status}"
    return Check(name=name, verdict=Verdict.FAIL, observed=detail, threshold=threshold,
                 explanation="the NVLink fabric is not ready: CUDA init fails with error 802 'system not yet "
                             "initialized'; the host's nvidia-fabricmanager must run (wait a minute after boot, then "
                             "ask the provider)", entry=E_FABRIC)


def on_nvswitch(gpu: GpuSnapshot) -> bool:
    return not isinstance(gpu.fabric, Unread) and gpu.fabric.state != 0


def check_nvlink(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, value = "nvlink", gpu.nvlink_active
    threshold = "all links up; no replay/recovery errors; CRC < 100/s"
    if isinstance(value, Unread):
        return unread_check(name, value, "NVLink link state", threshold=threshold)
    up = sum(value)
    observed = f"{up}/{len(value)} links up"
    verdicts, why = [Verdict.PASS], []
    if up == 0:
        if on_nvswitch(gpu):
            verdicts.append(Verdict.FAIL)
            why.append("no NVLink up on an NVSwitch system: GPU-to-GPU traffic cannot use NVLink")
        else:
            return Check(name=name, verdict=Verdict.SKIP, observed=observed, threshold=threshold,
                         explanation="no NVLink in use (no bridge or switch)")
    elif up < len(value):
        verdicts.append(Verdict.FAIL if on_nvswitch(gpu) else Verdict.WARN)
        why.append(f"{len(value) - up} link(s) down: NCCL bandwidth drops or collectives hang")
    if ctx.later is not None:
        seconds = max(ctx.later.at - gpu.counters.at, 1e-3)
        replay = _delta(gpu.counters.nvlink_replay_errors, ctx.later.nvlink_replay_errors)
        recovery = _delta(gpu.counters.nvlink_recovery_errors, ctx.later.nvlink_recovery_errors)
        crc = _delta(gpu.counters.nvlink_crc_errors, ctx.later.nvlink_crc_errors)
        observed += f"; in window: {replay} replay, {recovery} recovery, {crc} CRC errors"
        if replay or recovery:
            verdicts.append(Verdict.FAIL)
            why.append("NVLink replay/recovery errors during the window")
        if crc:
            verdicts.append(Verdict.FAIL if crc / seconds >= NVLINK_CRC_PER_S else Verdict.WARN)
            why.append(f"{crc / seconds:.0f} NVLink CRC errors/s")
    verdict = worst(verdicts)
    if verdict is Verdict.PASS:
        return Check(name=name, verdict=verdict, observed=observed, threshold=threshold, explanation="all links up")
    return Check(name=name, verdict=verdict, observed=observed, threshold=threshold, explanation="; ".join(why),
                 entry=E_NVLINK)


def _holder_text(holder: Holder) -> str:
    used = f" {gib(holder.used_bytes, 1)}" if holder.used_bytes is not None else ""
    command = f" {holder.command[:40]}" if holder.command else ""
    return f"pid {holder.pid} {holder.cls.value}{used}{command}"


def check_vram_processes(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, procs = "vram_processes", gpu.processes
    threshold = "no process holds VRAM"
    if isinstance(procs, Unread):
        return unread_check(name, procs, "processes holding VRAM", threshold=threshold)
    listed = [h for h in ctx.holders if h.nvml_listed]
    if not procs:
        return Check(name=name, verdict=Verdict.PASS, observed="none", threshold=threshold,
                     explanation="NVML lists no process on this GPU")
    more = f"; +{len(listed) - 4} more" if len(listed) > 4 else ""
    observed = "; ".join(_holder_text(h) for h in listed[:4]) + more
    classes = {h.cls for h in listed}
    if HolderClass.UNINTERRUPTIBLE in classes:
        return Check(name=name, verdict=Verdict.FAIL, observed=observed, threshold=threshold,
                     explanation="a VRAM holder is stuck in the kernel (D state): signals cannot free it; a GPU reset "
                                 "or reboot is needed", entry=E_ORPHANS)
    stale = classes & {HolderClass.ORPHAN, HolderClass.ZOMBIE, HolderClass.PHANTOM, HolderClass.NAMESPACED,
                       HolderClass.INVALID_PID}
    if stale:
        entry = E_NAMESPACED if classes & {HolderClass.NAMESPACED, HolderClass.PHANTOM} and ctx.in_container \
            else E_ORPHANS
        return Check(name=name, verdict=Verdict.WARN, observed=observed, threshold=threshold,
                     explanation=f"VRAM held by {', '.join(sorted(c.value for c in stale))} process(es): run "
                                 "reap_vram_zombies (dry run) for the remedy of each", entry=entry)
    return Check(name=name, verdict=Verdict.WARN, observed=observed, threshold=threshold,
                 explanation="the GPU is already in use by a running job: a new run shares its memory and compute",
                 entry=E_GPU_BUSY)


def check_vram_unattributed(gpu: GpuSnapshot, ctx: GpuContext) -> Check:
    name, memory, procs = "vram_unattributed", gpu.memory, gpu.processes
    threshold = f"< {gib(UNATTRIBUTED_BYTES, 0)} used beyond the listed processes"
    missing = _first_unread(memory, procs)
    if missing is not None:
        return unread_check(name, missing, "memory use per process", threshold=threshold)
    assert not isinstance(memory, Unread) and not isinstance(procs, Unread)
    if any(p.used_bytes is None for p in procs):
        return Check(name=name, verdict=Verdict.SKIP, observed=f"{gib(memory.used)} used", threshold=threshold,
                     explanation="NVML reports no per-process memory here (MIG or WDDM): cannot attribute")
    attributed = sum(p.used_bytes or 0 for p in procs)
    unattributed = max(0, memory.used - attributed)
    observed = f"{gib(unattributed)} of {gib(memory.used)} used ({len(procs)} listed process(es))"
    if unattributed >= UNATTRIBUTED_BYTES:
        where = ("another container on this GPU, or this container's own processes (NVML hides them here)"
                 if ctx.in_container else "a context the driver kept after its process died")
        return Check(name=name, verdict=Verdict.WARN, observed=observed, threshold=threshold,
                     explanation=f"VRAM in use that no listed process accounts for: {where}; reap_vram_zombies "
                                 "(dry run) lists the local holders of the device",
                     entry=E_NAMESPACED if ctx.in_container else E_ORPHANS)
    return Check(name=name, verdict=Verdict.PASS, observed=observed, threshold=threshold,
                 explanation="the listed processes account for the used memory")


def xid_entry(code: int) -> EntryRef:
    if code == 79:
        return E_LOST
    if code in (48, 92, 94, 95, 140):
        return E_ECC
    if code in (63, 64):
        return E_REMAP
    if code in (13, 31, 43, 45, 68):
        return E_APP_XID
    return E_FATAL_XID


def xid_summary(events: Sequence[XidEvent], uptime_s: float | None) -> tuple[Verdict, str, str, EntryRef | None]:
    """(verdict, observed, explanation, entry) for a set of XID events."""
    by_code: dict[int, list[XidEvent]] = {}
    for event in events:
        by_code.setdefault(event.code, []).append(event)
    ranked = sorted(by_code, key=lambda c: (describe(c).verdict is not Verdict.FAIL, c))
    parts = []
    for code in ranked:
        last = by_code[code][-1]
        known = uptime_s is not None and last.at_s is not None and uptime_s >= last.at_s
        ago = f", last {(uptime_s - last.at_s) / 3600:.1f} h ago" if known else ""  # type: ignore[operator]
        parts.append(f"XID {code} ×{len(by_code[code])}{ago}")
    top = ranked[0]
    info = describe(top)
    verdict = worst([describe(c).verdict for c in by_code])
    return verdict, "; ".join(parts), f"XID {top}: {info.meaning} → {info.action}", xid_entry(top)


def check_xid(gpu: GpuSnapshot, ctx: GpuContext, uptime_s: float | None = None) -> Check:
    name = "xid"
    if ctx.xids is None:
        return Check(name=name, verdict=Verdict.SKIP, observed="-", threshold="no critical XID since boot",
                     explanation="kernel log unreadable: see the host check xid_kernel_log")
    if not ctx.xids:
        return Check(name=name, verdict=Verdict.PASS, observed="none", threshold="no critical XID since boot",
                     explanation="no XID logged for this GPU since boot")
    verdict, observed, why, entry = xid_summary(ctx.xids, uptime_s)
    return Check(name=name, verdict=verdict, observed=observed, threshold="no critical XID since boot",
                 explanation=why + " (since boot: if the GPU was reset after it, the other checks tell its state now)",
                 entry=entry)


GPU_CHECKS: tuple[Callable[[GpuSnapshot, GpuContext], Check], ...] = (
    check_recovery_action, check_ecc_mode, check_ecc_uncorrected, check_row_remap, check_retired_pages,
    check_inforom, check_temperature, check_clock_events, check_power_limit, check_pcie_link, check_compute_mode,
    check_persistence, check_mig, check_fabric, check_nvlink, check_vram_processes, check_vram_unattributed,
)


def lost_check(gpu: GpuSnapshot) -> Check:
    """A GPU NVML cannot open. Lost / reset required / an unknown error is FAIL; being refused
    (no permission, e.g. a GPU not passed into this container) or a handle call that was skipped
    (it crashed the worker before) is UNKNOWN: we learned nothing."""
    assert gpu.lost is not None
    observed = f"{gpu.lost.call}: {gpu.lost.detail or gpu.lost.kind}"
    if gpu.lost.skipped:  # the handle call crashed an earlier worker: we did not ask, so we do not know
        return Check(name="reachable", verdict=Verdict.UNKNOWN, threshold="GPU answers NVML", observed=observed,
                     explanation="the call that opens this GPU is skipped (it crashed the NVML worker before), so "
                                 "nothing about it was read: its health is unknown, not lost. nvidia-smi -i on it, "
                                 "or a server restart (which clears the skip list), tells more")
    if gpu.lost.kind in (ErrorKind.NO_PERMISSION, ErrorKind.NOT_SUPPORTED):
        return Check(name="reachable", verdict=Verdict.UNKNOWN, threshold="GPU answers NVML", observed=observed,
                     explanation="NVML may not open this GPU here (not passed into this container, or device "
                                 "permissions): its health is unknown")
    return Check(name="reachable", verdict=Verdict.FAIL, threshold="GPU answers NVML", observed=observed,
                 explanation="the GPU is lost or needs a reset (often XID 79, fallen off the bus): nothing can run on "
                             "it until a reset or reboot; move the job", entry=E_LOST)


def evaluate_gpu(gpu: GpuSnapshot, ctx: GpuContext, uptime_s: float | None = None) -> list[Check]:
    if gpu.lost is not None:
        return [lost_check(gpu)]
    reachable = Check(name="reachable", verdict=Verdict.PASS, observed="answers NVML", threshold="GPU answers NVML",
                      explanation="the GPU answers NVML")
    return [reachable, *(check(gpu, ctx) for check in GPU_CHECKS), check_xid(gpu, ctx, uptime_s)]
