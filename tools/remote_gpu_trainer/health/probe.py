"""The gpu_health probe: read every selected GPU once (through the NVML worker, under a deadline),
optionally read the counters again after a short window, then judge.

Order of work and why:

1. Open NVML (once per process). No driver → a fast, explicit "no GPU" answer that says why
   (library missing, module not loaded, device nodes or PCI devices present or not).
2. One ``read_gpu`` request per GPU to the NVML worker, each with what is left of ``timeout_s``. A
   request that does not come back marks that GPU FAIL (naming the call it hung in) and the rest
   UNKNOWN: a wedged driver would hang every later call too, so nothing more is sent after it. A call
   that crashes the worker is skipped after a restart: its one check is UNKNOWN, naming the call.
3. With ``sample_s`` > 0, sleep on the caller's thread (NVML stays free) and read the
   cumulative counters again: thermal/power violation time, PCIe replays, NVLink errors.
4. The kernel log (XIDs of this boot) is read on a thread while the GPUs are read; the process
   classification runs after, in this process.
"""

from __future__ import annotations

import glob
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

from pydantic import Field

from ..errors import InputError
from ..models import StrictModel, Verdict, worst
from ..nvml_session import NO_GPU_REASONS, NvmlCrash, NvmlHang, NvmlStatus
from ..toolspec import Progress, no_progress
from . import checks as C
from .backend import Counters, GpuProcesses, GpuSnapshot, NvmlBackend, Unread
from .checks import Check, GpuContext
from .holders import Classification, LocalProcesses, ProcessSource, classify
from .xid import KernelLog, XidEvent, pci_key, read_kernel_log

T = TypeVar("T")
EXIT_OK, EXIT_FAIL, EXIT_UNKNOWN, EXIT_NO_GPU = 0, 1, 3, 4
EXIT_CODES_DOC = ("Exit status: 0 PASS or WARN only (trainable; read the warnings) · 1 FAIL (do not train here; "
                  "includes an NVML hang, fewer GPUs than --expect-gpus, a driver/library mismatch) · 2 bad input · "
                  "3 UNKNOWN (nothing failed, but a signal could not be read, e.g. the kernel log in a container) · "
                  "4 no NVIDIA GPU here at all (no driver/library, or zero GPUs) and no --expect-gpus given.")


class GpuReport(StrictModel):
    index: int = Field(description="NVML index (PCI bus order; CUDA's default order may differ, see GOT-10)")
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    verdict: Verdict
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: int | None
    utilization_percent: int | None
    checks: list[Check]


class HealthReport(StrictModel):
    verdict: Verdict = Field(description="Worst of all checks: FAIL > UNKNOWN > WARN > PASS (SKIP ignored)")
    exit_code: int = Field(description="What `rgt health` exits with: 0 PASS/WARN, 1 FAIL, 3 UNKNOWN, 4 no GPU")
    summary: str = Field(description="One line: the verdict and the findings that decided it")
    backend: str = Field(description="'nvml', or 'fake:<scenario>' when a test scenario was requested")
    gpus_found: int
    driver_version: str | None
    cuda_driver_version: str | None
    nvml_version: str | None
    in_container: bool
    sample_s: float
    elapsed_s: float
    host_checks: list[Check]
    gpus: list[GpuReport]
    notes: list[str] = Field(default_factory=list)


def _uptime_s() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def pci_nvidia_gpus(sysfs: str = "/sys/bus/pci/devices") -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers, readable without any driver: tells "no GPU in
    this machine" apart from "a GPU is here but the driver is missing"."""
    found = []
    for device in sorted(glob.glob(f"{sysfs}/*")):
        try:
            vendor = Path(device, "vendor").read_text().strip()
            klass = Path(device, "class").read_text().strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass[:6] in ("0x0300", "0x0302"):
            found.append(Path(device).name)
    return found


def _driver_entry(reason: str) -> C.EntryRef | None:
    return {"driver_library_mismatch": C.E_MISMATCH, "driver_not_loaded": C.E_NOT_LOADED, "no_driver": C.E_NO_LIBRARY,
            "timeout": C.E_HANG}.get(reason)


def _verdict_exit(verdict: Verdict, no_gpu: bool) -> int:
    if no_gpu:
        return EXIT_NO_GPU
    return {Verdict.FAIL: EXIT_FAIL, Verdict.UNKNOWN: EXIT_UNKNOWN}.get(verdict, EXIT_OK)


def _where_the_gpu_went(on_pci: bool, device_nodes: bool, in_container: bool) -> str:
    """What the PCI bus and /dev say when NVML cannot load: no GPU at all, or a GPU without a usable driver."""
    if not on_pci and not device_nodes:
        return ("no NVIDIA GPU is attached here (a CPU-only machine" +
                (", or a container started without --gpus / the NVIDIA runtime)" if in_container else ")"))
    if device_nodes:
        return ("the GPU device files are here but the driver's user-space library is not: the NVIDIA container "
                "runtime did not mount it, or the driver install is incomplete")
    return ("a GPU is on the PCI bus but there are no /dev/nvidia* files: " +
            ("the container was started without --gpus / the NVIDIA runtime" if in_container
             else "the NVIDIA driver is not installed or not loaded"))


def no_nvml_report(status: NvmlStatus, backend: str, expect_gpus: int | None, in_container: bool,
                   started: float) -> HealthReport:
    pci = pci_nvidia_gpus()
    nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
    seen = (f"PCI: {len(pci)} NVIDIA GPU(s){' (' + ', '.join(pci[:4]) + ')' if pci else ''}; "
            f"/dev/nvidia*: {', '.join(nodes[:4]) if nodes else 'none'}")
    if status.reason in NO_GPU_REASONS:
        seen += f" → {_where_the_gpu_went(bool(pci), bool(nodes), in_container)}"
    driver = Check(name="nvml_driver", verdict=Verdict.FAIL, observed=status.detail, threshold="NVML initialises",
                   explanation=seen, entry=_driver_entry(status.reason))
    threshold = f"= {expect_gpus}" if expect_gpus is not None else "≥ 1"
    count = Check(name="gpu_count", verdict=Verdict.FAIL, observed="0 usable", threshold=threshold,
                  explanation="no GPU can be used until NVML works")
    no_gpu = status.reason in NO_GPU_REASONS and expect_gpus is None
    lead = "no NVIDIA GPU found" if status.reason in NO_GPU_REASONS else "NVML unusable"
    return HealthReport(verdict=Verdict.FAIL, exit_code=_verdict_exit(Verdict.FAIL, no_gpu),
                        summary=f"FAIL: {lead} ({status.reason}): {status.detail}", backend=backend, gpus_found=0,
                        driver_version=None, cuda_driver_version=None, nvml_version=None, in_container=in_container,
                        sample_s=0.0, elapsed_s=round(time.monotonic() - started, 4), host_checks=[driver, count],
                        gpus=[])


def _count_check(found: int, expect: int | None) -> Check:
    if expect is None:
        verdict = Verdict.PASS if found else Verdict.FAIL
        return Check(name="gpu_count", verdict=verdict, observed=str(found), threshold="≥ 1 (set expect_gpus to check)",
                     explanation="GPUs visible to NVML" if found else "NVML works but sees no GPU",
                     entry=None if found else C.E_NO_DEVICES)
    if found < expect:
        return Check(name="gpu_count", verdict=Verdict.FAIL, observed=str(found), threshold=f"= {expect}",
                     explanation=f"{expect - found} GPU(s) missing: fallen off the bus, disabled, or not passed into "
                                 "this container", entry=C.E_LOST)
    if found > expect:
        return Check(name="gpu_count", verdict=Verdict.WARN, observed=str(found), threshold=f"= {expect}",
                     explanation="more GPUs than expected: a different machine type, or set CUDA_VISIBLE_DEVICES")
    return Check(name="gpu_count", verdict=Verdict.PASS, observed=str(found), threshold=f"= {expect}",
                 explanation="all expected GPUs are visible")


def _vbios_check(snapshots: Sequence[GpuSnapshot]) -> Check:
    by_model: dict[str, set[str]] = {}
    for gpu in snapshots:
        if isinstance(gpu.name, str) and isinstance(gpu.vbios, str):
            by_model.setdefault(gpu.name, set()).add(gpu.vbios)
    threshold = "one VBIOS per GPU model"
    if sum(1 for gpu in snapshots if isinstance(gpu.vbios, str)) < 2:
        return Check(name="vbios_consistency", verdict=Verdict.SKIP, observed="-", threshold=threshold,
                     explanation="needs two or more GPUs with a readable VBIOS version")
    mixed = {model: sorted(versions) for model, versions in by_model.items() if len(versions) > 1}
    if mixed:
        text = "; ".join(f"{model}: {', '.join(v)}" for model, v in mixed.items())
        return Check(name="vbios_consistency", verdict=Verdict.WARN, observed=text, threshold=threshold,
                     explanation="GPUs of one model run different VBIOS versions: a swapped or reflashed board; "
                                 "mention it to the provider if one GPU misbehaves", entry=C.E_VBIOS)
    return Check(name="vbios_consistency", verdict=Verdict.PASS, observed=f"{len(by_model)} model(s)",
                 threshold=threshold, explanation="same VBIOS on every GPU of a model")


def _kernel_log_check(log: KernelLog, unmatched: list[XidEvent], uptime_s: float | None, partial: bool,
                      in_container: bool) -> Check:
    """XIDs that match no probed GPU. With ``partial`` (only some GPUs selected) they may belong to a
    GPU the caller deliberately left out, so they warn instead of failing the selection.

    An unreadable log is never PASS. Inside a container it is SKIP: the kernel log belongs to the
    provider's host, so nothing on this box can fix it, and an UNKNOWN there would turn the overall
    verdict of every healthy rented container into UNKNOWN. On a host it is UNKNOWN: a permission
    the user can grant (sudo, CAP_SYSLOG, kernel.dmesg_restrict=0)."""
    threshold = "readable; no critical XID outside the probed GPUs"
    if not log.readable:
        if in_container:
            return Check(name="xid_kernel_log", verdict=Verdict.SKIP, observed="unreadable", threshold=threshold,
                         explanation=f"{log.reason}; in a container the kernel log stays on the provider's host, "
                                     "so XIDs cannot be checked from here (ask the provider, or run gpu_health "
                                     "on the host)", entry=C.E_KERNEL_LOG)
        return Check(name="xid_kernel_log", verdict=Verdict.UNKNOWN, observed="unreadable", threshold=threshold,
                     explanation=f"{log.reason}; XIDs (hardware faults) cannot be checked from here",
                     entry=C.E_KERNEL_LOG)
    if not unmatched:
        return Check(name="xid_kernel_log", verdict=Verdict.PASS, observed=f"{len(log.xids)} XID line(s) via "
                     f"{log.source}", threshold=threshold, explanation="XIDs of each GPU are judged in its xid check")
    verdict, observed, why, entry = C.xid_summary(unmatched, uptime_s)
    if partial and verdict is Verdict.FAIL:
        verdict = Verdict.WARN
    devices = ", ".join(sorted({e.device for e in unmatched}))
    return Check(name="xid_kernel_log", verdict=verdict, observed=f"{observed} on {devices}", threshold=threshold,
                 explanation=f"{why}; logged for a device that matches no probed GPU (one that dropped off the bus, "
                             "or one not selected)", entry=entry)


def _gpu_processes(gpu: GpuSnapshot) -> GpuProcesses:
    return GpuProcesses(index=gpu.index, lost=gpu.lost, uuid=gpu.uuid, minor=gpu.minor, memory=gpu.memory,
                        processes=gpu.processes)


def _value(reading: object) -> object:
    return None if isinstance(reading, Unread) else reading


def _gpu_report(index: int, gpu: GpuSnapshot | None, checks: list[Check]) -> GpuReport:
    memory = _value(gpu.memory) if gpu else None
    return GpuReport(
        index=index, name=_value(gpu.name) if gpu else None, uuid=_value(gpu.uuid) if gpu else None,
        pci_bus_id=_value(gpu.pci_bus_id) if gpu else None, verdict=worst([c.verdict for c in checks]),
        memory_used_bytes=getattr(memory, "used", None), memory_total_bytes=getattr(memory, "total", None),
        temperature_c=_value(gpu.temperature_c) if gpu else None,
        utilization_percent=_value(gpu.utilization_gpu) if gpu else None, checks=checks)


def _hang_check(index: int, hang: NvmlHang, during: str) -> Check:
    where = hang.stuck_in or hang.label
    return Check(name="reachable", verdict=Verdict.FAIL, observed=f"no answer from {where} after {hang.waited_s:.1f} s",
                 threshold="answers within timeout_s",
                 explanation=f"NVML hung {during} on this GPU: the driver is stuck on it (look for XID 79/119 in "
                             "dmesg); a GPU reset or reboot is needed, and NVML stays unusable in this server until "
                             "then",
                 entry=C.E_HANG)


def _not_probed(index: int, why: str, entry: C.EntryRef | None = None) -> Check:
    return Check(name="reachable", verdict=Verdict.UNKNOWN, observed="not probed", threshold="answers NVML",
                 explanation=why, entry=entry)


def _summary(verdict: Verdict, host: list[Check], gpus: list[GpuReport]) -> str:
    findings = [(c.verdict, f"{c.name} ({c.observed})") for c in host]
    for gpu in gpus:
        findings += [(c.verdict, f"GPU {gpu.index} {c.name} ({c.observed})") for c in gpu.checks]
    order = {Verdict.FAIL: 0, Verdict.UNKNOWN: 1, Verdict.WARN: 2}
    shown = sorted((f for f in findings if f[0] in order), key=lambda f: order[f[0]])
    if not shown:
        return f"{verdict}: {len(gpus)} GPU(s), all checks passed"
    text = "; ".join(f"[{v}] {what}" for v, what in shown[:4])
    more = f" (+{len(shown) - 4} more)" if len(shown) > 4 else ""
    return f"{verdict}: {text}{more}"


def with_host_check(report: HealthReport, check: Check) -> HealthReport:
    """``report`` with one more host check, its verdict, exit status and summary judged again."""
    host = [*report.host_checks, check]
    verdict = worst([c.verdict for c in host] + [g.verdict for g in report.gpus])
    no_gpu = report.exit_code == EXIT_NO_GPU
    return report.model_copy(update={"host_checks": host, "verdict": verdict, "summary": _summary(
        verdict, host, report.gpus), "exit_code": _verdict_exit(verdict, no_gpu)})


def select_indices(indices: list[int] | None, count: int) -> list[int]:
    if not indices:
        return list(range(count))
    bad = sorted({i for i in indices if not 0 <= i < count})
    if bad:
        raise InputError("indices", f"no GPU {', '.join(map(str, bad))} on this machine ({count} found)",
                         allowed=range(count))
    return sorted(set(indices))


def _in_background(fn: Callable[[], T]) -> Callable[[], T]:
    """Start ``fn`` on a daemon thread; the returned callable waits for its result (or re-raises)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as err:  # handed to the caller by the returned callable
            box["error"] = err

    thread = threading.Thread(target=run, name="kernel-log", daemon=True)
    thread.start()

    def result() -> T:
        thread.join()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["result"]  # type: ignore[return-value]

    return result


def probe(backend: NvmlBackend, *, expect_gpus: int | None = None, indices: list[int] | None = None,
          sample_s: float = 0.0, timeout_s: float = 30.0, kernel_log: Callable[[], KernelLog] = read_kernel_log,
          processes: ProcessSource | None = None, progress: Progress = no_progress) -> HealthReport:
    """Run every check and return the report. See the module docstring for the order of work."""
    started = time.monotonic()
    source = processes or LocalProcesses()
    status = backend.open(timeout_s)
    if not status.ok:
        return no_nvml_report(status, backend.name, expect_gpus, source.in_container(), started)
    log_reader = _in_background(kernel_log)  # /dev/kmsg or journalctl: overlaps the NVML reads
    # A fresh budget for the reads: a slow first nvmlInit (no persistence mode) must not turn into a
    # false "hang" on the GPUs read after it.
    deadline = time.monotonic() + timeout_s
    count = status.device_count or 0
    selected = select_indices(indices, count)
    snapshots: dict[int, GpuSnapshot] = {}
    failed: dict[int, Check] = {}
    notes: list[str] = []

    def on_worker(fn: Callable[[], object], label: str, index: int, during: str) -> object | None:
        try:
            return backend.worker.call(fn, label, max(deadline - time.monotonic(), 0.05))
        except NvmlHang as hang:
            failed[index] = _hang_check(index, hang, during)
        except NvmlCrash as crash:
            failed[index] = _not_probed(index, f"{crash}: NVML faults natively on this GPU; every crash was "
                                        "survived, but no reading came back", C.E_HANG)
        except Exception as err:  # an adapter bug must cost one GPU's checks, not the whole answer
            failed[index] = _not_probed(index, f"reading this GPU failed: {type(err).__name__}: {err}")
        return None

    for n, index in enumerate(selected):
        progress(n, len(selected), f"reading GPU {index}")
        snapshot = on_worker(partial(backend.read_gpu, index), f"read GPU {index}", index, "while reading")
        if isinstance(snapshot, GpuSnapshot):
            snapshots[index] = snapshot
        if index in failed and failed[index].verdict is Verdict.FAIL:
            break  # NVML is stuck: sending more calls after it would only wait too
    later: dict[int, Counters] = {}
    if sample_s > 0 and snapshots and not failed:
        progress(len(selected), len(selected), f"sampling counters for {sample_s:g} s")
        deadline += sample_s  # the window is not NVML time: timeout_s budgets only the NVML calls
        time.sleep(sample_s)
        for index in snapshots:
            counters = on_worker(partial(backend.read_counters, index), f"counters GPU {index}", index,
                                 "during the sampling window")
            if isinstance(counters, Counters):
                later[index] = counters
            elif index in failed:
                break
    log = log_reader()
    uptime = _uptime_s()
    holders = _classify(snapshots, source, notes)
    by_pci = {pci_key(g.pci_bus_id): i for i, g in snapshots.items() if isinstance(g.pci_bus_id, str)}
    xids: dict[int, list[XidEvent]] = {i: [] for i in snapshots}
    unmatched: list[XidEvent] = []
    for event in log.xids:
        owner = by_pci.get(pci_key(event.device))
        (xids[owner] if owner is not None else unmatched).append(event)

    gpus: list[GpuReport] = []
    hung_at = next((i for i, c in failed.items() if c.verdict is Verdict.FAIL), None)
    for index in selected:
        gpu = snapshots.get(index)
        if index in failed:
            checks = [failed[index]]
        elif gpu is None:
            checks = [_not_probed(index, f"not probed: NVML was stuck on GPU {hung_at}", C.E_HANG)]
        else:
            ctx = GpuContext(later=later.get(index), holders=[h for h in holders.holders if h.gpu == index],
                             xids=xids[index] if log.readable else None, in_container=holders.in_container)
            checks = C.evaluate_gpu(gpu, ctx, uptime)
        gpus.append(_gpu_report(index, gpu, checks))
    progress(len(selected), len(selected), "judging")
    versions = f"driver {status.driver_version}, CUDA {status.cuda_driver_version or '?'}, NVML {status.nvml_version}"
    host = [Check(name="nvml_driver", verdict=Verdict.PASS, observed=versions, threshold="NVML initialises",
                  explanation="NVML and the kernel driver agree"),
            _count_check(count, expect_gpus), _vbios_check(list(snapshots.values())),
            _kernel_log_check(log, unmatched, uptime, partial=len(selected) < count,
                              in_container=holders.in_container)]
    if indices:
        notes.append(f"only GPU(s) {', '.join(map(str, selected))} of {count} were probed")
    verdict = worst([c.verdict for c in host] + [g.verdict for g in gpus])
    return HealthReport(
        verdict=verdict, exit_code=_verdict_exit(verdict, no_gpu=count == 0 and expect_gpus is None),
        summary=_summary(verdict, host, gpus), backend=backend.name, gpus_found=count,
        driver_version=status.driver_version, cuda_driver_version=status.cuda_driver_version,
        nvml_version=status.nvml_version, in_container=holders.in_container, sample_s=sample_s,
        elapsed_s=round(time.monotonic() - started, 4), host_checks=host, gpus=gpus, notes=notes)


def _classify(snapshots: dict[int, GpuSnapshot], source: ProcessSource, notes: list[str]) -> Classification:
    try:
        result = classify([_gpu_processes(g) for g in snapshots.values()], source, include_local=False)
    except OSError as err:  # /proc unreadable (hidepid, odd sandboxes): processes are then UNKNOWN-ish
        notes.append(f"process classification unavailable: {err}")
        return Classification([], source.in_container())
    notes.extend(result.notes)
    return result
