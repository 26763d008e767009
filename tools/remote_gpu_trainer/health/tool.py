"""The ``gpu_health`` and ``reap_vram_zombies`` tools (``rgt health``, ``rgt zombies``): glue and rendering.

Logic lives in probe.py (health), holders.py (classification) and zombies.py (reaping). This
module picks the backend (real NVML, or a named fake when ``RGT_HEALTH_FAKE`` is set), and turns
reports into text for people.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import Field

from ..hostinfo import is_box_runtime
from ..models import StrictModel, Verdict
from ..processes.safekill import age_text, safe_kill, target_table
from ..tables import format_table, gib, where
from ..toolspec import Progress, ToolSpec
from .backend import NvmlBackend, NvmlProcessBackend
from .checks import Check
from .holders import ProcessSource
from .probe import EXIT_CODES_DOC, HealthReport, probe, with_host_check
from .xid import KernelLog, read_kernel_log
from .zombies import ReapInput, ZombieReport, reap

if TYPE_CHECKING:
    from ..trainenv.launch import Setting
    from ..trainenv.login import ShellRead

FAKE_ENV = "RGT_HEALTH_FAKE"


class HealthInput(StrictModel):
    expect_gpus: int | None = Field(None, ge=1, le=1024, description="How many GPUs this machine should have "
                                    "(e.g. 8 for an 8×H100 node). Fewer found is FAIL; default: at least one.")
    indices: list[int] | None = Field(None, max_length=1024, description="Only probe these GPUs (NVML indices, PCI "
                                      "bus order); default all. The GPU count is still checked against expect_gpus.")
    sample_s: float = Field(0.0, ge=0, le=10, description="Sampling window in seconds for cumulative counters "
                            "(thermal/power violation time, PCIe replays, NVLink errors). 0 = instantaneous only.")
    timeout_s: float = Field(30.0, ge=1, le=300, description="Longest wait for NVML to initialise, and again for "
                             "reading all GPUs; a call still blocked after it is reported as FAIL naming the call. "
                             "sample_s comes on top.")


def _sources() -> tuple[NvmlBackend, ProcessSource | None, Callable[[], KernelLog]]:
    """(backend, process source, kernel-log reader): a named fake when RGT_HEALTH_FAKE is set.
    A source of None means this machine's processes."""
    name = os.environ.get(FAKE_ENV)
    if name:
        from .fakes import scenario

        fake = scenario(name)
        return fake.backend, fake.processes, fake.read_kernel_log
    return NvmlProcessBackend(), None, read_kernel_log


def probe_gpus(args: HealthInput, progress: Progress) -> HealthReport:
    """What NVML says, nothing about the launch environment (the fleet check reads that itself)."""
    backend, processes, kernel_log = _sources()
    return probe(backend, expect_gpus=args.expect_gpus, indices=args.indices, sample_s=args.sample_s,
                 timeout_s=args.timeout_s, kernel_log=kernel_log, processes=processes, progress=progress)


def launch_cuda_visible(login: ShellRead | None = None) -> Setting | None:
    """``CUDA_VISIBLE_DEVICES`` as a launch here gets it. On a box (the runtime serving a session) that is the
    login shell's, which ``ssh box cmd`` never sees; run locally, it is the caller's own environment.
    ``login``: a reading of the login shell the caller already has (starting it again costs its start-up files).

    Run locally with the variable unset (the usual ``rgt health``), trainenv is not imported at all: importing
    its modules and building their pydantic models was most of the first probe in a fresh process (42 ms on an
    H200 box where a warm probe takes 7; against the C-level fake on 2 CPUs, 17 ms before, 9 ms without it)."""
    if not is_box_runtime():
        value = os.environ.get("CUDA_VISIBLE_DEVICES")
        if value is None:
            return None
        from ..trainenv.launch import Setting

        return Setting(name="CUDA_VISIBLE_DEVICES", value=value, source="this shell")
    from ..trainenv.launch import read_launch_env
    from ..trainenv.login import read_login_env

    return read_launch_env(login or read_login_env()).get("CUDA_VISIBLE_DEVICES")


def gpu_health(args: HealthInput, progress: Progress) -> HealthReport:
    report = probe_gpus(args, progress)
    setting = launch_cuda_visible() if report.gpus_found else None  # no GPU: nothing the variable could hide
    if setting is None:
        return report
    from ..trainenv.launch import cuda_visible_check

    check = cuda_visible_check(setting, report.gpus_found, [g.uuid for g in report.gpus])
    return with_host_check(report, check) if check else report


def reap_vram_zombies(args: ReapInput, progress: Progress) -> ZombieReport:
    backend, processes, _ = _sources()
    kill_step = None if processes is not None else safe_kill  # a fake's pids are not this machine's processes
    return reap(args, backend, processes=processes, kill_step=kill_step, progress=progress)


# --- rendering ------------------------------------------------------------------------------------


def _fake_banner(report: HealthReport | ZombieReport) -> list[str]:
    if not report.backend.startswith("fake:"):
        return []
    machine = getattr(report, "host", None) or "this machine"
    return [f"!! FAKE NVML scenario '{report.backend.removeprefix('fake:')}' ({FAKE_ENV}): not {machine}'s state"]


def _entry(check: Check) -> str:
    return f"  → {check.entry.file}#{check.entry.id}" if check.entry else ""


def _finding(where: str, check: Check) -> str:
    return (f"{check.verdict.value:<7} {where:<6} {check.name}: {check.observed}  (expected {check.threshold})\n"
            f"{'':15}{check.explanation}{_entry(check)}")


def render_health(report: HealthReport) -> str:
    lines = [f"gpu_health: {report.summary}"]
    facts = [f"backend {report.backend}"]
    if report.driver_version:
        facts.append(f"driver {report.driver_version} · CUDA {report.cuda_driver_version or '?'}")
    facts += [f"{report.gpus_found} GPU(s)", *(["container"] if report.in_container else []),
              f"{report.elapsed_s:.2f} s" + (f" (window {report.sample_s:g} s)" if report.sample_s else "")]
    lines.append(" · ".join(facts))
    lines += _fake_banner(report)
    if report.gpus:
        rows = []
        for gpu in report.gpus:
            issues = [c.name for c in gpu.checks if c.verdict not in (Verdict.PASS, Verdict.SKIP)]
            memory = (f"{gib(gpu.memory_used_bytes, 1)} / {gib(gpu.memory_total_bytes, 0)}"
                      if gpu.memory_total_bytes else "-")
            rows.append([gpu.index, gpu.name or "?", gpu.verdict, memory,
                         f"{gpu.temperature_c} °C" if gpu.temperature_c is not None else "-",
                         f"{gpu.utilization_percent} %" if gpu.utilization_percent is not None else "-",
                         ", ".join(issues) or "-"])
        lines += ["", format_table(["gpu", "name", "verdict", "memory", "temp", "util", "findings"], rows)]
    findings = [_finding("host", c) for c in report.host_checks if c.verdict is not Verdict.PASS]
    for gpu in report.gpus:
        findings += [_finding(f"GPU {gpu.index}", c) for c in gpu.checks
                     if c.verdict not in (Verdict.PASS, Verdict.SKIP)]
    skipped = sum(c.verdict is Verdict.SKIP for g in report.gpus for c in g.checks)
    if findings:
        lines += ["", "findings:", *findings]
    if skipped:
        lines.append(f"\n{skipped} per-GPU check(s) skipped (feature absent or driver too old); --json shows all")
    lines += [f"note: {n}" for n in report.notes]
    place = where(report)
    meaning = {0: "trainable", 1: f"do not train {place}", 3: "some signals unreadable", 4: f"no NVIDIA GPU {place}"}
    lines.append(f"\nexit {report.exit_code}: {meaning.get(report.exit_code, '')}")
    return "\n".join(lines)


def render_zombies(report: ZombieReport) -> str:
    head = f"{report.verdict.value}  {report.summary}"
    parts = [f"DRY RUN (nothing signalled)\n{head}" if report.dry_run else head]
    parts += _fake_banner(report)
    if report.holders:
        parts.append(format_table(
            ["gpu", "pid", "kind", "vram", "user", "age", "nvml", "candidate", "command"],
            [[h.gpu, h.pid, h.kind, gib(h.used_bytes, 1), h.user, age_text(h.age_s),
              "listed" if h.nvml_listed else "scan", "yes" if h.candidate else "-", h.command]
             for h in report.holders], wrap=["command"]))
        parts.append("\n".join(f"GPU {h.gpu} pid {h.pid} ({h.kind}): {h.reason}\n    remedy: {h.remedy}"
                               for h in report.holders if h.kind != "active" or h.candidate))
    if report.ram_orphans:
        parts.append(format_table(["pid", "ppid", "kind", "ram", "user", "age", "candidate", "command"],
                                  [[r.pid, r.ppid, r.kind, gib(r.rss_bytes, 2), r.user,
                                    f"{r.age_s / 60:.0f} min" if r.age_s else "-", "yes" if r.candidate else "-",
                                    r.command[:50]] for r in report.ram_orphans]))
        parts.append("\n".join(f"pid {r.pid} ({r.kind}): {r.reason}" for r in report.ram_orphans))
    if report.kill and report.kill.targets:
        parts.append(target_table(report.kill.targets))
    if report.memory:
        parts.append(format_table(["gpu", "used before", "used after"],
                                  [[m.gpu, gib(m.used_bytes_before, 1), gib(m.used_bytes_after, 1)]
                                   for m in report.memory]))
    parts += [f"note: {n}" for n in report.notes]
    if report.confirm_token and report.dry_run:
        parts.append(f"confirm_token: {report.confirm_token}")
    parts.append(f"next: {report.next_step}")
    return "\n\n".join(parts)


SPECS = [
    ToolSpec(
        name="gpu_health",
        remote=True,
        cli="health",
        title="GPU pre-flight health check",
        description=(
            "Can I train on this box, and what will bite me? Reads every GPU through NVML (not nvidia-smi) "
            "and judges: driver/NVML load (incl. driver/library mismatch), GPU count vs expect_gpus, lost "
            "GPUs, recovery action, ECC mode and uncorrectable errors, row remapping and retired pages, "
            "InfoROM, temperature against each GPU's own slowdown/shutdown thresholds, clock-event "
            "(throttle) reasons with idle bits masked, power limit below default, PCIe width, compute mode "
            "(Exclusive Process → WARN: breaks multi-process launches; Prohibited → FAIL), persistence, "
            "MIG, NVSwitch fabric state, NVLink, processes holding VRAM (classified: active/orphan/zombie/"
            "D-state/namespaced/phantom) and VRAM no process accounts for, and XIDs from the kernel log "
            "(SKIP when a container hides the host kernel log, UNKNOWN when unreadable on a host), and the launch "
            "environment's CUDA_VISIBLE_DEVICES (on a box: what a login shell exports, which ssh commands never "
            "see; NVML ignores it): WARN when it hides GPUs, FAIL when it names none of them. Every "
            "check has a verdict (PASS/WARN/FAIL/"
            "UNKNOWN/SKIP), the observed value, the threshold, one line of explanation and a catalog "
            "entry; an unreadable signal is never PASS. NVML runs in its own worker process with a timeout, "
            "so a sick GPU yields FAIL naming the call that hung, and a call that crashes NVML yields "
            "UNKNOWN naming it, never a hung or dead server. Without a driver it answers in "
            f"milliseconds and says why. Read-only: changes nothing. {EXIT_CODES_DOC}"
        ),
        input_model=HealthInput,
        output_model=HealthReport,
        run=gpu_health,
        read_only=True,
        idempotent=True,
        render_text=render_health,
        exit_code=lambda report: report.exit_code,
    ),
    ToolSpec(
        name="reap_vram_zombies",
        remote=True,
        cli="zombies",
        title="Find and reap stale VRAM holders and RAM orphans of a dead job",
        description=(
            "GPU memory, or host memory, still used after a run ended or was killed? RAM: helpers of a dead job "
            "(DataLoader workers named pt_data_worker, multiprocessing children, torchrun ranks) re-parented to "
            "PID 1 or a subreaper after their parent died, with their RSS, found from /proc (works without NVML); "
            "a live job's workers (live parent) and a job detached on purpose (not a helper) are never offered. "
            "GPU: classifies every process NVML reports on each GPU: "
            "active, orphan (launcher gone), zombie, uninterruptible (D state), namespaced (NVML gives host "
            "pids in a container; the local holders of /dev/nvidiaN are listed instead), phantom (nobody "
            "holds it: GPU reset or restart), invalid_pid. Only same-user orphans proven to hold the GPU's "
            "/dev/nvidiaN (and their device-holding children, e.g. DataLoader workers) are offered for "
            "killing; everything else gets its remedy. Dry run by default: returns the targets and a "
            "confirm_token bound to each process's pid, start time, uid and command line. A real run needs "
            "dry_run=false plus that token, sends SIGTERM, waits grace_s, SIGKILLs survivors only with "
            "signal=KILL, children first, never protected/ancestor/other-user processes, then reports VRAM "
            "before and after. Show the dry-run targets to the user before confirming: a detached job they "
            "still want (nohup/setsid) can also be an orphan. Exit status: 0 done or dry run · 1 a target "
            "survived or the token no longer matched · 2 bad input · 4 no NVIDIA GPU and no RAM orphan."
        ),
        input_model=ReapInput,
        output_model=ZombieReport,
        run=reap_vram_zombies,
        read_only=False,
        destructive=True,
        idempotent=True,
        render_text=render_zombies,
        exit_code=lambda report: report.exit_code,
    ),
]
