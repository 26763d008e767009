"""The real pynvml adapter (PynvmlBackend), run in CI by monkeypatching pynvml's functions.

``FakeLibrary`` answers every pynvml call the adapter makes from per-GPU dicts, and can raise any
NVMLError code for any call on any GPU, or pretend the driver lacks a function. A few tests go one
level lower and replace the C function pointers, so pynvml's own ctypes wrappers (process structs,
field-value unions, the versioned fabric struct) run against the adapter too.
"""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from remote_gpu_trainer import nvml_session
from remote_gpu_trainer.health.backend import (
    ErrorKind,
    Fabric,
    GpuProcess,
    Memory,
    PynvmlBackend,
    RemappedRows,
    RetiredPages,
    Unread,
)
from remote_gpu_trainer.health.fakes import FakeProcesses
from remote_gpu_trainer.health.probe import probe
from remote_gpu_trainer.health.xid import KernelLog
from remote_gpu_trainer.models import Verdict

GIB = 1 << 30
NV = pynvml


def device(index: int = 0, **over: Any) -> dict[str, Any]:
    base = dict(
        name="NVIDIA A100-SXM4-80GB", uuid=f"GPU-{index}", bus=f"00000000:{0x10 + index:02X}:00.0", minor=index,
        vbios="92.00.45.00.05", recovery=0, ecc=(1, 1), ecc_counts={(1, 0): 0, (0, 0): 12, (1, 1): 0},
        remap=(0, 0, 0, 0), retired={NV.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [],
                 NV.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: []}, retired_pending=0, temp=35,
        thresholds={NV.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 88, NV.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 93},
        reasons=0x1, util=0, power=(400_000, 400_000), pcie=(16, 16, 4, 4), compute=0, persistence=1, mig=(0, 0),
        fabric=(0, 0), nvlinks=12, memory=(80 * GIB, 4 << 20, 500 << 20), procs={"compute": [], "graphics": []},
        violations={NV.NVML_PERF_POLICY_THERMAL: 0, NV.NVML_PERF_POLICY_POWER: 0},
        fields={NV.NVML_FI_DEV_PCIE_REPLAY_COUNTER: 0, NV.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: 0,
                NV.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: 0,
                NV.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 0},
    )
    base.update(over)
    return base


def _pointee(pointer: Any) -> Any:
    """What C would see behind a pointer argument. pynvml passes the caller's argument to C as is, so
    a struct (not ``ctypes.byref(struct)``) would be copied by value and C would write through garbage
    (SIGSEGV on a real H100): refuse it here as loudly."""
    assert type(pointer).__name__ == "CArgObject", f"NVML needs ctypes.byref(struct), got {type(pointer).__name__}"
    return pointer._obj


class FakeLibrary:
    """Stands in for libnvidia-ml behind pynvml's Python functions. Handles are GPU indices."""

    def __init__(self, devices: list[dict[str, Any]]):
        self.devices = devices
        self.errors: dict[tuple[str, int | None], int] = {}
        self.missing: set[str] = set()
        self.calls: list[str] = []
        self.block: tuple[str, int, threading.Event] | None = None

    def fail(self, name: str, code: int, index: int | None = None) -> None:
        self.errors[(name, index)] = code

    def _enter(self, name: str, index: int | None) -> None:
        self.calls.append(name)
        if name in self.missing:
            raise NV.NVMLError(NV.NVML_ERROR_FUNCTION_NOT_FOUND)
        for key in ((name, index), (name, None)):
            if key in self.errors:
                raise NV.NVMLError(self.errors[key])
        if self.block and self.block[0] == name and self.block[1] == index:
            self.block[2].wait(30)

    def install(self, monkeypatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(NV, name, self._wrap(name, getattr(self, name)))

    def _wrap(self, name: str, fn):
        def call(*args):
            index = args[0] if args and isinstance(args[0], int) and name.startswith("nvmlDevice") else None
            self._enter(name, index)
            return fn(*args)
        return call

    # -- system --
    def nvmlInit(self): return None
    def nvmlSystemGetDriverVersion(self): return "550.54.15"
    def nvmlSystemGetNVMLVersion(self): return "12.550.54.15"
    def nvmlSystemGetCudaDriverVersion_v2(self): return 12040
    def nvmlDeviceGetCount(self): return len(self.devices)
    def nvmlDeviceGetHandleByIndex(self, i): return i

    # -- identity --
    def nvmlDeviceGetName(self, h): return self.devices[h]["name"]
    def nvmlDeviceGetUUID(self, h): return self.devices[h]["uuid"].encode()
    def nvmlDeviceGetPciInfo(self, h): return SimpleNamespace(busId=self.devices[h]["bus"].encode())
    def nvmlDeviceGetMinorNumber(self, h): return self.devices[h]["minor"]
    def nvmlDeviceGetVbiosVersion(self, h): return self.devices[h]["vbios"]

    def nvmlDeviceGetFieldValues(self, h, ids):
        out = []
        for field_id in ids:
            d = self.devices[h]
            value = d["recovery"] if field_id == NV.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION else d["fields"].get(field_id)
            ret = NV.NVML_ERROR_NOT_SUPPORTED if value is None else NV.NVML_SUCCESS
            out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=ret, value=SimpleNamespace(ullVal=value or 0),
                                       valueType=NV.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG))
        return out

    # -- memory health --
    def nvmlDeviceGetEccMode(self, h): return list(self.devices[h]["ecc"])
    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter): return self.devices[h]["ecc_counts"][(kind, counter)]
    def nvmlDeviceGetRemappedRows(self, h): return self.devices[h]["remap"]
    def nvmlDeviceGetRetiredPages(self, h, cause): return self.devices[h]["retired"][cause]
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h): return self.devices[h]["retired_pending"]
    def nvmlDeviceValidateInforom(self, h): return None

    # -- thermal, power, PCIe --
    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == NV.NVML_TEMPERATURE_GPU
        return self.devices[h]["temp"]
    def nvmlDeviceGetTemperatureThreshold(self, h, which): return self.devices[h]["thresholds"][which]
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self.devices[h]["reasons"]
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h): return self.devices[h]["reasons"]
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=self.devices[h]["util"], memory=0)
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return self.devices[h]["power"][0]
    def nvmlDeviceGetPowerManagementDefaultLimit(self, h): return self.devices[h]["power"][1]
    def nvmlDeviceGetCurrPcieLinkWidth(self, h): return self.devices[h]["pcie"][0]
    def nvmlDeviceGetMaxPcieLinkWidth(self, h): return self.devices[h]["pcie"][1]
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h): return self.devices[h]["pcie"][2]
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h): return self.devices[h]["pcie"][3]

    # -- modes --
    def nvmlDeviceGetComputeMode(self, h): return self.devices[h]["compute"]
    def nvmlDeviceGetPersistenceMode(self, h): return self.devices[h]["persistence"]
    def nvmlDeviceGetMigMode(self, h): return list(self.devices[h]["mig"])

    def nvmlDeviceGetGpuFabricInfoV(self, h, pointer):
        info = _pointee(pointer)
        assert info.version == NV.nvmlGpuFabricInfo_v2
        info.state, info.status = self.devices[h]["fabric"]
        return NV.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, h, pointer):
        info = _pointee(pointer)
        info.state, info.status = self.devices[h]["fabric"]
        return NV.NVML_SUCCESS

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self.devices[h]["nvlinks"]
        if isinstance(links, int):
            links = [1] * links
        if link >= len(links):
            raise NV.NVMLError(NV.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        total, used, reserved = self.devices[h]["memory"]
        if version is None:
            return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
        assert version == NV.nvmlMemory_v2
        return SimpleNamespace(total=total, used=used, reserved=reserved, free=total - used - reserved)

    def _procs(self, h, kind):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.devices[h]["procs"].get(kind, [])]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h): return self._procs(h, "compute")
    def nvmlDeviceGetComputeRunningProcesses_v2(self, h): return self._procs(h, "compute")
    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h): return self._procs(h, "graphics")
    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h): return self._procs(h, "graphics")
    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, h): return self._procs(h, "mps")
    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, h): return self._procs(h, "mps")

    def nvmlDeviceGetViolationStatus(self, h, policy):
        return SimpleNamespace(referenceTime=0, violationTime=self.devices[h]["violations"][policy])


@pytest.fixture
def lib(monkeypatch):
    nvml_session.reset_for_tests()
    library = FakeLibrary([device(0), device(1)])
    library.install(monkeypatch)
    yield library
    if library.block:
        library.block[2].set()
    nvml_session.reset_for_tests()


def read(index: int = 0):
    backend = PynvmlBackend()
    assert backend.open(5).ok
    return backend.worker.call(lambda: backend.read_gpu(index), "test", 10)


def test_healthy_gpu_is_read_completely(lib):
    gpu = read(0)
    assert gpu.lost is None
    assert (gpu.name, gpu.uuid, gpu.pci_bus_id, gpu.minor) == ("NVIDIA A100-SXM4-80GB", "GPU-0", "00000000:10:00.0", 0)
    assert gpu.recovery_action == 0 and gpu.ecc_mode == (True, True)
    assert (gpu.ecc_uncorrected_volatile, gpu.ecc_corrected_volatile, gpu.ecc_uncorrected_aggregate) == (0, 12, 0)
    assert gpu.remapped_rows == RemappedRows(0, 0, False, False)
    assert gpu.retired_pages == RetiredPages(0, 0, False)
    assert gpu.inforom_valid is True
    assert (gpu.temperature_c, gpu.temp_slowdown_c, gpu.temp_shutdown_c) == (35, 88, 93)
    assert gpu.clock_event_reasons == 0x1 and gpu.utilization_gpu == 0
    assert (gpu.power_limit_mw, gpu.power_default_limit_mw) == (400_000, 400_000)
    assert (gpu.pcie_width, gpu.pcie_max_width, gpu.pcie_gen, gpu.pcie_max_gen) == (16, 16, 4, 4)
    assert gpu.compute_mode == 0 and gpu.persistence is True and gpu.mig_mode == (False, False)
    assert gpu.fabric == Fabric(0, 0)
    assert gpu.nvlink_active == (True,) * 12  # stops at the first link the GPU does not have
    assert gpu.memory == Memory(total=80 * GIB, used=4 << 20, reserved=500 << 20)
    assert gpu.processes == ()
    assert gpu.counters.thermal_violation_ns == 0 and gpu.counters.pcie_replays == 0 and gpu.counters.at > 0


@pytest.mark.parametrize(("code", "kind"), [
    (NV.NVML_ERROR_NOT_SUPPORTED, ErrorKind.NOT_SUPPORTED),
    (NV.NVML_ERROR_NO_PERMISSION, ErrorKind.NO_PERMISSION),
    (NV.NVML_ERROR_UNKNOWN, ErrorKind.ERROR),
    (NV.NVML_ERROR_TIMEOUT, ErrorKind.ERROR),
])
def test_an_error_on_one_call_becomes_unread_for_that_signal_only(lib, code, kind):
    lib.fail("nvmlDeviceGetRemappedRows", code, index=0)
    gpu = read(0)
    assert isinstance(gpu.remapped_rows, Unread)
    assert gpu.remapped_rows.kind is kind and gpu.remapped_rows.call == "nvmlDeviceGetRemappedRows"
    assert gpu.remapped_rows.code == code
    assert gpu.lost is None and gpu.temperature_c == 35  # everything else still read
    assert read(1).remapped_rows == RemappedRows(0, 0, False, False)  # other GPU unaffected


@pytest.mark.parametrize("code", [NV.NVML_ERROR_GPU_IS_LOST, NV.NVML_ERROR_RESET_REQUIRED])
def test_gpu_lost_mid_read_stops_reading_that_gpu(lib, code):
    lib.fail("nvmlDeviceGetTemperature", code, index=1)
    gpu = read(1)
    assert gpu.lost is not None and gpu.lost.call == "nvmlDeviceGetTemperature"
    assert gpu.lost.kind in (ErrorKind.GPU_IS_LOST, ErrorKind.RESET_REQUIRED)
    assert gpu.name == "NVIDIA A100-SXM4-80GB"  # what was read before is kept
    assert "nvmlDeviceGetComputeMode" not in lib.calls  # and nothing after it is attempted


def test_no_handle_means_lost_unless_refused(lib):
    from remote_gpu_trainer.health.checks import lost_check

    lib.fail("nvmlDeviceGetHandleByIndex", NV.NVML_ERROR_UNKNOWN, index=0)
    lib.fail("nvmlDeviceGetHandleByIndex", NV.NVML_ERROR_NO_PERMISSION, index=1)
    gpu = read(0)
    assert gpu.lost is not None and gpu.lost.call == "nvmlDeviceGetHandleByIndex"
    assert lost_check(gpu).verdict is Verdict.FAIL
    refused = read(1)
    assert refused.lost.kind is ErrorKind.NO_PERMISSION and lost_check(refused).verdict is Verdict.UNKNOWN


def test_function_not_found_falls_back_to_older_api_versions(lib):
    lib.missing |= {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuFabricInfoV",
                    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
                    "nvmlDeviceGetMPSComputeRunningProcesses_v3"}
    lib.devices[0].update(reasons=0x1 | 0x40, fabric=(3, 0), procs={"compute": [(4242, 2 * GIB)]})
    gpu = read(0)
    assert gpu.clock_event_reasons == 0x41  # nvmlDeviceGetCurrentClocksThrottleReasons (pre-r535)
    assert gpu.fabric == Fabric(3, 0)  # nvmlDeviceGetGpuFabricInfo (non-versioned)
    assert gpu.processes == (GpuProcess(4242, 2 * GIB, ("compute",)),)  # the _v2 process structs
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in lib.calls


def test_function_missing_in_every_version_is_function_not_found(lib):
    lib.missing |= {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"}
    gpu = read(0)
    assert isinstance(gpu.clock_event_reasons, Unread)
    assert gpu.clock_event_reasons.kind is ErrorKind.FUNCTION_NOT_FOUND


def test_memory_v1_fallback_on_an_old_driver(lib, monkeypatch):
    def v2_rejected(handle, version=None):
        if version is not None:
            raise NV.NVMLError(NV.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return lib.nvmlDeviceGetMemoryInfo(handle)

    monkeypatch.setattr(NV, "nvmlDeviceGetMemoryInfo", v2_rejected)
    gpu = read(0)
    assert gpu.memory == Memory(total=80 * GIB, used=(4 << 20) + (500 << 20), reserved=None)


def test_per_field_errors_in_a_field_value_batch(lib):
    lib.devices[0]["recovery"] = None  # the driver does not know the recovery-action field
    lib.devices[0]["fields"][NV.NVML_FI_DEV_PCIE_REPLAY_COUNTER] = 7
    gpu = read(0)
    assert isinstance(gpu.recovery_action, Unread) and gpu.recovery_action.kind is ErrorKind.NOT_SUPPORTED
    assert gpu.counters.pcie_replays == 7


def test_nvlink_absent_and_inforom_corrupted(lib):
    lib.devices[0]["nvlinks"] = 0
    lib.fail("nvmlDeviceValidateInforom", NV.NVML_ERROR_CORRUPTED_INFOROM, index=0)
    gpu = read(0)
    assert isinstance(gpu.nvlink_active, Unread) and gpu.nvlink_active.kind is ErrorKind.NOT_SUPPORTED
    assert gpu.inforom_valid is False


def test_processes_merge_compute_and_graphics_and_keep_unknown_memory(lib):
    lib.devices[0]["procs"] = {"compute": [(10, 3 * GIB), (11, None)], "graphics": [(10, 3 * GIB)], "mps": [(12, GIB)]}
    gpu = read(0)
    assert gpu.processes == (GpuProcess(10, 3 * GIB, ("compute", "graphics")), GpuProcess(11, None, ("compute",)),
                             GpuProcess(12, GIB, ("mps",)))


def test_a_hang_names_the_call_and_gpu(lib):
    release = threading.Event()
    lib.block = ("nvmlDeviceGetRemappedRows", 1, release)
    backend = PynvmlBackend()
    assert backend.open(5).ok
    report = probe(backend, timeout_s=0.5, kernel_log=lambda: KernelLog(True, "t", ""), processes=FakeProcesses())
    gpu1 = report.gpus[1]
    assert report.verdict is Verdict.FAIL and report.exit_code == 1
    assert gpu1.verdict is Verdict.FAIL and gpu1.checks[0].name == "reachable"
    assert "nvmlDeviceGetRemappedRows (GPU 1)" in gpu1.checks[0].observed
    assert report.gpus[0].verdict is Verdict.PASS
    release.set()


def test_full_probe_through_the_real_adapter(lib):
    lib.devices[1].update(remap=(0, 1, 1, 0), compute=3, temp=90, util=0, reasons=0x1 | 0x8,
                          procs={"compute": [(999_999, 5 * GIB)]})
    report = probe(PynvmlBackend(), expect_gpus=2, kernel_log=lambda: KernelLog(True, "t", ""),
                   processes=FakeProcesses())
    assert report.backend == "nvml" and report.driver_version == "550.54.15" and report.cuda_driver_version == "12.4"
    verdicts = {c.name: c.verdict for c in report.gpus[1].checks}
    assert verdicts["row_remap"] is Verdict.FAIL
    assert verdicts["compute_mode"] is Verdict.WARN
    assert verdicts["temperature"] is Verdict.FAIL  # idle at/above slowdown
    assert verdicts["clock_events"] is Verdict.FAIL  # HW slowdown while idle
    assert verdicts["vram_processes"] is Verdict.WARN  # pid 999999 is not visible here: phantom
    assert report.gpus[0].verdict is Verdict.PASS
    assert report.verdict is Verdict.FAIL


# -- one level lower: pynvml's own ctypes wrappers over fake C functions ----------------------------


class FakeCFunctions:
    """Replaces pynvml._nvmlGetFunctionPointer: Python callables that fill the ctypes out-params."""

    def __init__(self):
        self.table: dict[str, Any] = {}

    def __call__(self, name):
        if name not in self.table:
            raise NV.NVMLError(NV.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self.table[name]


@pytest.fixture
def cfuncs(monkeypatch):
    fake = FakeCFunctions()
    monkeypatch.setattr(NV, "_nvmlGetFunctionPointer", fake)
    return fake


def test_process_structs_through_pynvml_wrappers(cfuncs):
    procs = [(101, 3 * GIB), (202, NV.NVML_VALUE_NOT_AVAILABLE_ulonglong.value)]

    def compute_v3(handle, count_p, array):
        count = count_p._obj
        if array is None:
            count.value = len(procs)
            return NV.NVML_ERROR_INSUFFICIENT_SIZE
        entries = ctypes.cast(array, ctypes.POINTER(NV.c_nvmlProcessInfo_v3_t))
        for i, (pid, used) in enumerate(procs):
            entries[i].pid, entries[i].usedGpuMemory = pid, used
        count.value = len(procs)
        return NV.NVML_SUCCESS

    def none(handle, count_p, array):
        count_p._obj.value = 0
        return NV.NVML_SUCCESS

    cfuncs.table.update({"nvmlDeviceGetComputeRunningProcesses_v3": compute_v3,
                         "nvmlDeviceGetGraphicsRunningProcesses_v3": none,
                         "nvmlDeviceGetMPSComputeRunningProcesses_v3": none})
    result = PynvmlBackend()._processes(0, handle=None)
    assert result == (GpuProcess(101, 3 * GIB, ("compute",)), GpuProcess(202, None, ("compute",)))


def test_field_values_and_fabric_struct_through_pynvml_wrappers(cfuncs):
    def field_values(handle, count, values):
        array = ctypes.cast(values, ctypes.POINTER(NV.c_nvmlFieldValue_t))
        for i in range(count.value):
            if array[i].fieldId == NV.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                array[i].nvmlReturn = NV.NVML_SUCCESS
                array[i].valueType = NV.NVML_VALUE_TYPE_UNSIGNED_INT
                array[i].value.uiVal = NV.NVML_GPU_RECOVERY_ACTION_GPU_RESET
            else:
                array[i].nvmlReturn = NV.NVML_ERROR_NOT_SUPPORTED
        return NV.NVML_SUCCESS

    def fabric_v(handle, pointer):  # pynvml hands our argument to C as is: it must be a pointer
        info = _pointee(pointer)
        assert info.version == NV.nvmlGpuFabricInfo_v2
        info.state, info.status = NV.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0
        return NV.NVML_SUCCESS

    cfuncs.table.update({"nvmlDeviceGetFieldValues": field_values, "nvmlDeviceGetGpuFabricInfoV": fabric_v})
    backend = PynvmlBackend()
    recovery, replays = backend._fields(0, None, [NV.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
                                                  NV.NVML_FI_DEV_PCIE_REPLAY_COUNTER])
    assert recovery == NV.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert isinstance(replays, Unread) and replays.kind is ErrorKind.NOT_SUPPORTED
    assert backend._fabric(0, None) == Fabric(NV.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0)


def test_the_health_tool_imports_no_ctypes_in_the_calling_process():
    """Only the NVML worker builds ctypes structs (_fabric): the process that imports the tool does not need it."""
    import subprocess
    import sys

    code = "import sys; import remote_gpu_trainer.health.tool; print('ctypes' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
