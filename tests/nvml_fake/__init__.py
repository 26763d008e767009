"""A fake ``libnvidia-ml.so.1`` at NVML's C ABI: build it, and write its scenario files.

``fake_nvml.c`` is compiled with the system C compiler against NVIDIA's own ``nvml.h`` (the PyPI
package ``nvidia-nvml-dev``, in the ``dev`` extra), so its structs have the header's layouts. The
real, unmodified pynvml loads it through ``LD_LIBRARY_PATH``; pynvml loads the library once per
process, so it is used by child processes (the NVML worker process, or a test's child).

What it answers comes from the Python scenarios in ``health/fakes.py``, the one source of scenario
truth: :func:`write_scenario` turns a scenario's snapshots into the flat file the C library reads
(``RGT_FAKE_NVML_SCENARIO``), each field as the NVML call that the adapter reads it from.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"

# nvmlReturn_t values (nvml.h); pynvml's constants are the same numbers.
SUCCESS, NOT_SUPPORTED, NO_PERMISSION, DRIVER_NOT_LOADED = 0, 3, 4, 9
LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND, CORRUPTED_INFOROM = 12, 13, 14
GPU_IS_LOST, RESET_REQUIRED, LIB_RM_VERSION_MISMATCH, UNKNOWN = 15, 16, 18, 999
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
"""NVML_VALUE_NOT_AVAILABLE as an unsigned long long: a process's memory that NVML does not report."""


class Unavailable(RuntimeError):
    """The fake cannot be built here (no C compiler, or no nvml.h): the reason says which."""


def header_dir() -> Path:
    """The include directory of NVIDIA's nvml.h from the installed nvidia-nvml-dev wheel."""
    for entry in sys.path:
        for found in sorted(glob.glob(os.path.join(entry, "nvidia", "*", "include", "nvml.h"))):
            return Path(found).parent
    raise Unavailable("NVIDIA's nvml.h not found: install the dev extra (pip install -e '.[dev]' brings "
                      "nvidia-nvml-dev)")


def build(out_dir: Path) -> Path:
    """Compile the fake into ``out_dir/libnvidia-ml.so.1``; returns ``out_dir`` (for LD_LIBRARY_PATH)."""
    compiler = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if not compiler:
        raise Unavailable("no C compiler (gcc/cc) on PATH")
    include = header_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-deprecated-declarations",
            f"-I{include}", f"-Wl,-soname,{LIBRARY}", "-o", str(out_dir / LIBRARY), str(SOURCE)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"building the fake NVML failed:\n{' '.join(argv)}\n{done.stderr}")
    return out_dir


def environment(lib_dir: Path, scenario_file: Path, fault: str | None = None, once: Path | None = None,
                hang_s: float | None = None) -> dict[str, str]:
    """Variables that make a new process's pynvml load the fake with this scenario (and fault)."""
    env = {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(lib_dir), os.environ.get("LD_LIBRARY_PATH")])),
           "RGT_FAKE_NVML_SCENARIO": str(scenario_file), "RGT_FAKE_NVML_FAULT": fault or "",
           "RGT_FAKE_NVML_FAULT_ONCE": str(once) if once else ""}
    if hang_s is not None:
        env["RGT_FAKE_NVML_HANG_S"] = str(int(hang_s))
    return env


# --- scenario files -----------------------------------------------------------------------------------


def _code(unread) -> int:
    from remote_gpu_trainer.health.backend import ErrorKind

    if unread.code is not None:
        return int(unread.code)
    return {ErrorKind.NOT_SUPPORTED: NOT_SUPPORTED, ErrorKind.FUNCTION_NOT_FOUND: FUNCTION_NOT_FOUND,
            ErrorKind.NO_PERMISSION: NO_PERMISSION, ErrorKind.GPU_IS_LOST: GPU_IS_LOST,
            ErrorKind.RESET_REQUIRED: RESET_REQUIRED}.get(unread.kind, UNKNOWN)


_INIT_CODES = {"no_driver": LIBRARY_NOT_FOUND, "driver_not_loaded": DRIVER_NOT_LOADED,
               "driver_library_mismatch": LIB_RM_VERSION_MISMATCH, "no_permission": NO_PERMISSION}


def _gpu_lines(gpu, later) -> Iterable[str]:
    """One GPU's snapshot as the NVML calls the adapter reads each field from."""
    from remote_gpu_trainer.health.backend import Unread

    i = gpu.index

    def value(reading, calls: tuple[str, ...], line: str):
        if isinstance(reading, Unread):
            return [f"{i} err {call} {_code(reading)}" for call in calls]
        return [f"{i} {line}"]

    def text(reading, key: str, call: str):
        return value(reading, (call,), f"{key} {reading}")

    if gpu.lost is not None:  # it falls off the bus at the call the scenario names, as NVML would show it
        call = gpu.lost.call if gpu.lost.call.startswith("nvml") else "nvmlDeviceGetHandleByIndex_v2"
        yield f"{i} lost {_code(gpu.lost)} {call}"
    yield from text(gpu.name, "name", "nvmlDeviceGetName")
    yield from text(gpu.uuid, "uuid", "nvmlDeviceGetUUID")
    yield from text(gpu.pci_bus_id, "bus", "nvmlDeviceGetPciInfo_v3")
    yield from text(gpu.minor, "minor", "nvmlDeviceGetMinorNumber")
    yield from text(gpu.vbios, "vbios", "nvmlDeviceGetVbiosVersion")
    fields = {"recovery": gpu.recovery_action, "pcie_replay": gpu.counters.pcie_replays,
              "nvlink_replay": gpu.counters.nvlink_replay_errors,
              "nvlink_recovery": gpu.counters.nvlink_recovery_errors,
              "nvlink_crc_flit": gpu.counters.nvlink_crc_errors}
    for name, reading in fields.items():
        yield f"{i} fielderr {name} {_code(reading)}" if isinstance(reading, Unread) else f"{i} field {name} {reading}"
    mode = gpu.ecc_mode
    yield from value(mode, ("nvmlDeviceGetEccMode",), f"ecc_mode {int(mode[0])} {int(mode[1])}" if
                     not isinstance(mode, Unread) else "")
    for kind, counter, reading in ((1, 0, gpu.ecc_uncorrected_volatile), (0, 0, gpu.ecc_corrected_volatile),
                                   (1, 1, gpu.ecc_uncorrected_aggregate)):
        yield (f"{i} eccerr {kind} {counter} {_code(reading)}" if isinstance(reading, Unread)
               else f"{i} ecc {kind} {counter} {reading}")
    rows = gpu.remapped_rows
    yield from value(rows, ("nvmlDeviceGetRemappedRows",), "" if isinstance(rows, Unread) else
                     f"remap {rows.correctable} {rows.uncorrectable} {int(rows.pending)} {int(rows.failed)}")
    pages = gpu.retired_pages
    yield from value(pages, ("nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"),
                     "" if isinstance(pages, Unread) else
                     f"retired {pages.single_bit} {pages.double_bit} {int(pages.pending)}")
    yield from value(gpu.inforom_valid, ("nvmlDeviceValidateInforom",), f"inforom {int(gpu.inforom_valid is True)}")
    yield from text(gpu.temperature_c, "temp", "nvmlDeviceGetTemperature")
    for which, reading in ((1, gpu.temp_slowdown_c), (0, gpu.temp_shutdown_c)):  # NVML_TEMPERATURE_THRESHOLD_*
        yield f"{i} threrr {which} {_code(reading)}" if isinstance(reading, Unread) else f"{i} thr {which} {reading}"
    yield from value(gpu.clock_event_reasons, ("nvmlDeviceGetCurrentClocksEventReasons",
                                               "nvmlDeviceGetCurrentClocksThrottleReasons"),
                     f"reasons {gpu.clock_event_reasons}")
    yield from value(gpu.utilization_gpu, ("nvmlDeviceGetUtilizationRates",), f"util {gpu.utilization_gpu} 0")
    yield from text(gpu.power_limit_mw, "power_limit", "nvmlDeviceGetEnforcedPowerLimit")
    yield from text(gpu.power_default_limit_mw, "power_default", "nvmlDeviceGetPowerManagementDefaultLimit")
    yield from text(gpu.power_usage_mw, "power_usage", "nvmlDeviceGetPowerUsage")
    pcie = (gpu.pcie_width, gpu.pcie_max_width, gpu.pcie_gen, gpu.pcie_max_gen)
    calls = ("nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetCurrPcieLinkGeneration",
             "nvmlDeviceGetMaxPcieLinkGeneration")
    yield f"{i} pcie " + " ".join("0" if isinstance(p, Unread) else str(p) for p in pcie)
    for reading, call in zip(pcie, calls, strict=True):
        if isinstance(reading, Unread):
            yield f"{i} err {call} {_code(reading)}"
    yield from text(gpu.compute_mode, "compute_mode", "nvmlDeviceGetComputeMode")
    yield from value(gpu.persistence, ("nvmlDeviceGetPersistenceMode",), f"persistence {int(gpu.persistence is True)}")
    mig = gpu.mig_mode
    yield from value(mig, ("nvmlDeviceGetMigMode",), "" if isinstance(mig, Unread) else
                     f"mig {int(mig[0])} {int(mig[1])}")
    fabric = gpu.fabric
    yield from value(fabric, ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"),
                     "" if isinstance(fabric, Unread) else f"fabric {fabric.state} {fabric.status}")
    links = gpu.nvlink_active
    if isinstance(links, Unread):
        yield f"{i} err nvmlDeviceGetNvLinkState {_code(links)}"
    else:
        yield f"{i} nvlink " + " ".join(str(int(up)) for up in links)
    memory = gpu.memory
    if isinstance(memory, Unread):
        yield f"{i} err nvmlDeviceGetMemoryInfo_v2 {_code(memory)}"
        yield f"{i} err nvmlDeviceGetMemoryInfo {_code(memory)}"
    elif memory.reserved is None:
        yield f"{i} memory_v1 {memory.total} {memory.used}"
    else:
        yield f"{i} memory {memory.total} {memory.used} {memory.reserved}"
    procs = gpu.processes
    if isinstance(procs, Unread):
        for kind in ("Compute", "Graphics", "MPSCompute"):
            for version in ("_v3", "_v2"):
                yield f"{i} err nvmlDeviceGet{kind}RunningProcesses{version} {_code(procs)}"
    else:
        for proc in procs:
            for kind in proc.kinds:
                used = NOT_AVAILABLE if proc.used_bytes is None else proc.used_bytes
                yield f"{i} proc {kind} {proc.pid} {used}"
    for policy, now, then in ((1, gpu.counters.thermal_violation_ns, getattr(later, "thermal_violation_ns", None)),
                              (0, gpu.counters.power_violation_ns, getattr(later, "power_violation_ns", None))):
        if isinstance(now, Unread):
            yield f"{i} violerr {policy} {_code(now)}"
        else:
            yield f"{i} viol {policy} {now}" + (f" {then}" if isinstance(then, int) else "")


def scenario_text(name: str) -> str:
    """The flat file for the Python scenario ``name`` (health/fakes.py)."""
    from remote_gpu_trainer.health.fakes import scenario

    fake = scenario(name).backend
    status = fake.status
    lines = [f"# scenario {name} (written from remote_gpu_trainer.health.fakes)"]
    if not status.ok:
        lines.append(f"init {_INIT_CODES.get(status.reason, UNKNOWN)}")
        return "\n".join([*lines, "count 0", ""])
    major, minor = (status.cuda_driver_version or "12.8").split(".")
    lines += [f"driver {status.driver_version}", f"nvml {status.nvml_version}",
              f"cuda {int(major) * 1000 + int(minor) * 10}", f"count {len(fake.gpus)}"]
    for gpu in fake.gpus:
        lines += _gpu_lines(gpu, fake.later.get(gpu.index))
        if gpu.index in fake.hang_on:  # where FakeBackend blocks: the same calls block in C
            lines += [f"{gpu.index} hang nvmlDeviceGetRemappedRows",
                      f"{gpu.index} hang nvmlDeviceGetComputeRunningProcesses_v3"]
    return "\n".join([*lines, ""])


def write_scenario(name: str, path: Path) -> Path:
    path.write_text(scenario_text(name))
    return path
