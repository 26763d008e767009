"""The small interface between the health checks and NVML, and its real pynvml adapter.

Checks never call pynvml. They read a :class:`GpuSnapshot` in which every signal is either its
value or an :class:`Unread` that says why it could not be read (the GPU lacks the feature, the
driver is too old, no permission, ...). That keeps "could not read" apart from "read and fine" all
the way to the verdict, and lets the same checks run on named fake scenarios (``fakes.py``) in CI
and on real NVML on a GPU box.

Backends are plain synchronous objects. The caller runs their methods through ``backend.worker``
with a timeout (``worker.call(fn, label, timeout_s)``), so a call that hangs in the driver costs a
verdict, not the server. The production backend, :class:`NvmlProcessBackend`, sends each read to
the NVML worker process (``nvml_session``), so a native fault costs one unread signal, not the
process. :class:`PynvmlBackend` is the adapter that worker runs; used in-process (tests drive it with a
monkeypatched pynvml) a native fault would take the calling process with it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, Union

from .. import nvml_session
from ..nvml_session import NvmlSession, NvmlStatus, SerialWorker

T = TypeVar("T")


class ErrorKind(StrEnum):
    NOT_SUPPORTED = "not_supported"
    """The GPU does not have the feature (no ECC on a GeForce, no NVLink on a PCIe card): SKIP."""
    FUNCTION_NOT_FOUND = "function_not_found"
    """The driver does not export the call (too old): SKIP."""
    NO_PERMISSION = "no_permission"
    """NVML refused: UNKNOWN."""
    GPU_IS_LOST = "gpu_is_lost"
    """The GPU stopped answering: FAIL, nothing else about it can be read."""
    RESET_REQUIRED = "reset_required"
    """The GPU needs a reset before it can be used: FAIL."""
    ERROR = "error"
    """Any other NVML error: UNKNOWN."""


LOST_KINDS = frozenset({ErrorKind.GPU_IS_LOST, ErrorKind.RESET_REQUIRED})


@dataclass(frozen=True)
class Unread:
    """Why a signal has no value."""

    kind: ErrorKind
    call: str
    detail: str = ""
    code: int | None = None
    """The raw nvmlReturn_t, for the few callers that treat one specific error specially."""
    skipped: bool = False
    """Not called at all: it crashed an earlier worker (the skip list). Says nothing about the GPU itself."""


NOT_READ = Unread(ErrorKind.ERROR, "-", "not read")

Reading = Union[T, Unread]  # noqa: UP007 (a generic alias: Reading[int] is int | Unread)


@dataclass(frozen=True)
class Memory:
    total: int
    used: int
    reserved: int | None
    """Driver/firmware reservation (NVML memory v2). None when only the v1 API answered; v1's
    ``used`` then includes the reservation."""


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class RetiredPages:
    single_bit: int
    double_bit: int
    pending: bool


@dataclass(frozen=True)
class Fabric:
    state: int
    """NVML_GPU_FABRIC_STATE_*: 0 not supported, 1 not started, 2 in progress, 3 completed."""
    status: int
    """nvmlReturn_t of the fabric registration: 0 = success."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    """None when NVML does not report it (MIG, WDDM)."""
    kinds: tuple[Literal["compute", "graphics", "mps"], ...]


@dataclass(frozen=True)
class Counters:
    """Cumulative counters, read twice to measure what happened during the sampling window."""

    at: float = 0.0
    """time.monotonic() of the read."""
    thermal_violation_ns: Reading[int] = NOT_READ
    power_violation_ns: Reading[int] = NOT_READ
    pcie_replays: Reading[int] = NOT_READ
    nvlink_replay_errors: Reading[int] = NOT_READ
    nvlink_recovery_errors: Reading[int] = NOT_READ
    nvlink_crc_errors: Reading[int] = NOT_READ


@dataclass(frozen=True)
class GpuProcesses:
    """What reap_vram_zombies needs about one GPU: identity, memory and the processes NVML lists."""

    index: int
    lost: Unread | None = None
    uuid: Reading[str] = NOT_READ
    minor: Reading[int] = NOT_READ
    """N in /dev/nvidiaN: how a process's open files prove it holds this GPU."""
    memory: Reading[Memory] = NOT_READ
    processes: Reading[tuple[GpuProcess, ...]] = NOT_READ


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything the checks read about one GPU, taken in one pass."""

    index: int
    lost: Unread | None = None
    """Set when the GPU answered GPU_IS_LOST / RESET_REQUIRED (or no handle): nothing else is valid."""
    name: Reading[str] = NOT_READ
    uuid: Reading[str] = NOT_READ
    pci_bus_id: Reading[str] = NOT_READ
    minor: Reading[int] = NOT_READ
    vbios: Reading[str] = NOT_READ
    recovery_action: Reading[int] = NOT_READ
    ecc_mode: Reading[tuple[bool, bool]] = NOT_READ
    """(current, pending) enabled."""
    ecc_uncorrected_volatile: Reading[int] = NOT_READ
    ecc_corrected_volatile: Reading[int] = NOT_READ
    ecc_uncorrected_aggregate: Reading[int] = NOT_READ
    remapped_rows: Reading[RemappedRows] = NOT_READ
    retired_pages: Reading[RetiredPages] = NOT_READ
    inforom_valid: Reading[bool] = NOT_READ
    temperature_c: Reading[int] = NOT_READ
    temp_slowdown_c: Reading[int] = NOT_READ
    temp_shutdown_c: Reading[int] = NOT_READ
    clock_event_reasons: Reading[int] = NOT_READ
    utilization_gpu: Reading[int] = NOT_READ
    power_limit_mw: Reading[int] = NOT_READ
    power_default_limit_mw: Reading[int] = NOT_READ
    power_usage_mw: Reading[int] = NOT_READ
    """Power draw now (nvmlDeviceGetPowerUsage): near idle draw on a loaded GPU is the sign of a stall."""
    pcie_width: Reading[int] = NOT_READ
    pcie_max_width: Reading[int] = NOT_READ
    pcie_gen: Reading[int] = NOT_READ
    pcie_max_gen: Reading[int] = NOT_READ
    compute_mode: Reading[int] = NOT_READ
    persistence: Reading[bool] = NOT_READ
    mig_mode: Reading[tuple[bool, bool]] = NOT_READ
    """(current, pending) enabled."""
    fabric: Reading[Fabric] = NOT_READ
    nvlink_active: Reading[tuple[bool, ...]] = NOT_READ
    memory: Reading[Memory] = NOT_READ
    processes: Reading[tuple[GpuProcess, ...]] = NOT_READ
    counters: Counters = field(default_factory=Counters)


class NvmlBackend(Protocol):
    """What the health probe and the zombie reaper need from NVML. Methods run on ``worker``."""

    name: str
    """``nvml`` for the real adapter, ``fake:<scenario>`` for a fake."""

    @property
    def worker(self) -> SerialWorker | NvmlSession: ...

    def open(self, timeout_s: float) -> NvmlStatus: ...

    def read_gpu(self, index: int) -> GpuSnapshot: ...

    def read_counters(self, index: int) -> Counters: ...

    def read_processes(self, index: int) -> GpuProcesses: ...


# ------------------------------------------------------------------------------------------------
# The real adapter


class _Lost(Exception):
    def __init__(self, unread: Unread):
        self.unread = unread


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _error_kind(pynvml: Any, code: int) -> ErrorKind:
    kinds = {
        pynvml.NVML_ERROR_NOT_SUPPORTED: ErrorKind.NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: ErrorKind.FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION: ErrorKind.NO_PERMISSION,
        pynvml.NVML_ERROR_GPU_IS_LOST: ErrorKind.GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED: ErrorKind.RESET_REQUIRED,
    }
    return kinds.get(code, ErrorKind.ERROR)


class InforomCache:
    """InfoROM validity per GPU, checked once per boot.

    ``nvmlDeviceValidateInforom`` checksums the InfoROM: 70 ms per GPU of an 80 ms warm probe on an
    H100 (issue 27), and its answer cannot change while the machine is up. The answer is kept in
    memory and, with a ``path``, in a file keyed by the kernel's boot id, so a fresh ``rgt health``
    after the first one of a boot skips it too. Only definite answers are kept (valid, corrupted, not
    supported); an error is asked again next time.
    """

    BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

    def __init__(self, path: Path | None = None):
        self.path = path
        self.boot = self._boot_id() if path else None
        self.states: dict[str, str] = {}
        if self.path and self.boot:
            try:
                saved = json.loads(self.path.read_text())
                if saved.get("boot_id") == self.boot and isinstance(saved.get("gpus"), dict):
                    self.states = {str(k): str(v) for k, v in saved["gpus"].items()}
            except (OSError, ValueError, AttributeError):
                pass

    def _boot_id(self) -> str | None:
        try:
            return self.BOOT_ID.read_text().strip() or None
        except OSError:
            return None

    def get(self, key: str) -> str | None:
        return self.states.get(key)

    def put(self, key: str, state: str) -> None:
        self.states[key] = state
        if not (self.path and self.boot):
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            temp.write_text(json.dumps({"boot_id": self.boot, "gpus": self.states}))
            os.replace(temp, self.path)
        except OSError:
            pass  # a read-only home: the in-memory answer still serves this process


def inforom_cache_file() -> Path:
    from ..paths import cache_dir

    return cache_dir() / "nvml-inforom.json"


_local_worker = SerialWorker("nvml-local")


class PynvmlBackend:
    """Reads GPUs through nvidia-ml-py in *this* process. Every call goes through :meth:`_call`, which
    turns an NVMLError into an :class:`Unread` (or stops reading a lost GPU) and says which call is in
    flight (``note``), so a hang or a crash is reported with the exact call and GPU.

    It runs inside the NVML worker process (``nvml_worker``), which passes ``note``/``done`` (the
    shared progress page), ``skip`` (calls that crashed an earlier worker) and a per-boot InfoROM
    cache. In-process, without them, it is what the adapter tests drive."""

    name = "nvml"

    def __init__(self, note: Callable[[str], None] | None = None, done: Callable[[], None] | None = None,
                 skip: dict[tuple[str, int | None], str] | None = None, inforom: InforomCache | None = None):
        self._note = note
        self._done = done
        self.skip = dict(skip or {})
        self.inforom = inforom or InforomCache()

    @property
    def _nvml(self) -> Any:
        import pynvml  # lazily (cached by Python after the first time): the server starts without it

        return pynvml

    @property
    def worker(self) -> SerialWorker:
        return _local_worker

    def open(self, timeout_s: float) -> NvmlStatus:
        from ..nvml_worker import open_nvml

        try:
            return self.worker.call(open_nvml, "nvmlInit", timeout_s)
        except nvml_session.NvmlHang:
            return NvmlStatus(False, "timeout", f"nvmlInit did not return within {timeout_s:g} s")

    # -- plumbing --------------------------------------------------------------------------------

    def _call(self, index: int | None, name: str, *args: Any) -> Any:
        """``pynvml.<name>(*args)``, or an Unread; raises _Lost when the GPU is gone."""
        skipped = self.skip.get((name, index))
        if skipped:
            return Unread(ErrorKind.ERROR, name, skipped, skipped=True)
        label = f"{name} (GPU {index})" if index is not None else name
        if self._note:
            self._note(label)
        else:
            self.worker.detail = label
        try:
            return getattr(self._nvml, name)(*args)
        except self._nvml.NVMLError as err:
            unread = Unread(_error_kind(self._nvml, err.value), name, str(err), err.value)
            if unread.kind in LOST_KINDS:
                raise _Lost(unread) from None
            return unread
        finally:
            if self._done:
                self._done()

    def _first(self, index: int, names: tuple[str, ...], *args: Any) -> Any:
        """The first of several API versions the driver exports (newest first)."""
        result: Any = Unread(ErrorKind.FUNCTION_NOT_FOUND, names[-1])
        for name in names:
            result = self._call(index, name, *args)
            if not (isinstance(result, Unread) and result.kind is ErrorKind.FUNCTION_NOT_FOUND):
                return result
        return result

    def _handle(self, index: int) -> Any:
        handle = self._call(index, "nvmlDeviceGetHandleByIndex", index)
        # No handle at all: as good as lost (nvidia-smi "Unknown Error"), or, when the call was skipped, unread:
        # either way nothing more can be read, and lost_check tells the two apart.
        if isinstance(handle, Unread):
            raise _Lost(handle)
        return handle

    def _fields(self, index: int, handle: Any, field_ids: list[int]) -> list[Reading[int]]:
        """Batch-read NVML field values; each field carries its own return code."""
        values = self._call(index, "nvmlDeviceGetFieldValues", handle, field_ids)
        if isinstance(values, Unread):
            return [values] * len(field_ids)
        out: list[Reading[int]] = []
        for value in values:
            if value.nvmlReturn != self._nvml.NVML_SUCCESS:
                kind = _error_kind(self._nvml, value.nvmlReturn)
                if value.nvmlReturn == self._nvml.NVML_ERROR_INVALID_ARGUMENT:  # field unknown to this driver
                    kind = ErrorKind.NOT_SUPPORTED
                out.append(Unread(kind, "nvmlDeviceGetFieldValues", f"field {value.fieldId}", value.nvmlReturn))
            else:
                out.append(_field_number(self._nvml, value))
        return out

    # -- readers ---------------------------------------------------------------------------------

    def read_gpu(self, index: int) -> GpuSnapshot:
        values: dict[str, Any] = {}
        try:
            handle = self._handle(index)
            self._read_identity(index, handle, values)
            self._read_memory_health(index, handle, values)
            self._read_thermal_power(index, handle, values)
            self._read_modes(index, handle, values)
            values["memory"] = self._memory(index, handle)
            values["processes"] = self._processes(index, handle)
            values["counters"] = self._counters(index, handle)
        except _Lost as lost:
            return GpuSnapshot(index=index, lost=lost.unread, **values)
        return GpuSnapshot(index=index, **values)

    def read_counters(self, index: int) -> Counters:
        try:
            return self._counters(index, self._handle(index))
        except _Lost as lost:
            return Counters(at=time.monotonic(), thermal_violation_ns=lost.unread, power_violation_ns=lost.unread)

    def read_processes(self, index: int) -> GpuProcesses:
        values: dict[str, Any] = {}
        try:
            handle = self._handle(index)
            values["uuid"] = _map(self._call(index, "nvmlDeviceGetUUID", handle), _text)
            values["minor"] = self._call(index, "nvmlDeviceGetMinorNumber", handle)
            values["memory"] = self._memory(index, handle)
            values["processes"] = self._processes(index, handle)
        except _Lost as lost:
            return GpuProcesses(index=index, lost=lost.unread, **values)
        return GpuProcesses(index=index, **values)

    def list_devices(self) -> list[tuple[str, str, tuple[int, int]]]:
        """(name, uuid, compute capability) of every GPU, for the launch renderers. Raises on any
        unreadable value: the renderers then say "unknown", never guess."""
        out = []
        for index in range(self._nvml.nvmlDeviceGetCount()):
            try:
                handle = self._handle(index)
                name = self._call(index, "nvmlDeviceGetName", handle)
                uuid = self._call(index, "nvmlDeviceGetUUID", handle)
                capability = self._call(index, "nvmlDeviceGetCudaComputeCapability", handle)
            except _Lost as lost:
                raise RuntimeError(f"GPU {index}: {lost.unread.kind.value} in {lost.unread.call}") from None
            for reading in (name, uuid, capability):
                if isinstance(reading, Unread):
                    raise RuntimeError(f"GPU {index}: {reading.call} failed: {reading.detail or reading.kind}")
            out.append((_text(name), _text(uuid), (int(capability[0]), int(capability[1]))))
        return out

    def _read_identity(self, index: int, handle: Any, values: dict[str, Any]) -> None:
        nv = self._nvml
        values["name"] = _map(self._call(index, "nvmlDeviceGetName", handle), _text)
        values["uuid"] = _map(self._call(index, "nvmlDeviceGetUUID", handle), _text)
        values["pci_bus_id"] = _map(self._call(index, "nvmlDeviceGetPciInfo", handle), lambda p: _text(p.busId))
        values["minor"] = self._call(index, "nvmlDeviceGetMinorNumber", handle)
        values["vbios"] = _map(self._call(index, "nvmlDeviceGetVbiosVersion", handle), _text)
        values["recovery_action"] = self._fields(index, handle, [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]

    def _read_memory_health(self, index: int, handle: Any, values: dict[str, Any]) -> None:
        nv = self._nvml
        values["ecc_mode"] = _map(self._call(index, "nvmlDeviceGetEccMode", handle),
                                  lambda m: (m[0] == nv.NVML_FEATURE_ENABLED, m[1] == nv.NVML_FEATURE_ENABLED))
        total = "nvmlDeviceGetTotalEccErrors"
        values["ecc_uncorrected_volatile"] = self._call(index, total, handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                        nv.NVML_VOLATILE_ECC)
        values["ecc_corrected_volatile"] = self._call(index, total, handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                                      nv.NVML_VOLATILE_ECC)
        values["ecc_uncorrected_aggregate"] = self._call(index, total, handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                         nv.NVML_AGGREGATE_ECC)
        values["remapped_rows"] = _map(self._call(index, "nvmlDeviceGetRemappedRows", handle),
                                       lambda r: RemappedRows(int(r[0]), int(r[1]), bool(r[2]), bool(r[3])))
        values["retired_pages"] = self._retired_pages(index, handle)
        values["inforom_valid"] = self._inforom(index, handle, values.get("uuid"))

    def _inforom(self, index: int, handle: Any, uuid: Any) -> Reading[bool]:
        """Valid, corrupted, or why not read; asked once per boot (see :class:`InforomCache`)."""
        call = "nvmlDeviceValidateInforom"
        key = uuid if isinstance(uuid, str) else f"index-{index}"
        state = self.inforom.get(key)
        if state is None:
            answer = self._call(index, call, handle)  # returns None when valid
            if not isinstance(answer, Unread):
                state = "valid"
            elif answer.code == self._nvml.NVML_ERROR_CORRUPTED_INFOROM:
                state = "corrupted"
            elif answer.kind is ErrorKind.NOT_SUPPORTED:
                state = "not_supported"
            else:
                return answer
            self.inforom.put(key, state)
        if state == "not_supported":
            return Unread(ErrorKind.NOT_SUPPORTED, call, "Not Supported (checked once this boot)")
        return state == "valid"

    def _retired_pages(self, index: int, handle: Any) -> Reading[RetiredPages]:
        nv = self._nvml
        pages = "nvmlDeviceGetRetiredPages"
        single = self._call(index, pages, handle, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        double = self._call(index, pages, handle, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = self._call(index, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        for part in (single, double, pending):
            if isinstance(part, Unread):
                return part
        return RetiredPages(len(single), len(double), pending == nv.NVML_FEATURE_ENABLED)

    def _read_thermal_power(self, index: int, handle: Any, values: dict[str, Any]) -> None:
        nv = self._nvml
        values["temperature_c"] = self._call(index, "nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU)
        threshold = "nvmlDeviceGetTemperatureThreshold"
        values["temp_slowdown_c"] = self._call(index, threshold, handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        values["temp_shutdown_c"] = self._call(index, threshold, handle, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        values["clock_event_reasons"] = self._first(
            index, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), handle)
        values["utilization_gpu"] = _map(self._call(index, "nvmlDeviceGetUtilizationRates", handle), lambda u: u.gpu)
        values["power_limit_mw"] = self._call(index, "nvmlDeviceGetEnforcedPowerLimit", handle)
        values["power_default_limit_mw"] = self._call(index, "nvmlDeviceGetPowerManagementDefaultLimit", handle)
        values["power_usage_mw"] = self._call(index, "nvmlDeviceGetPowerUsage", handle)
        values["pcie_width"] = self._call(index, "nvmlDeviceGetCurrPcieLinkWidth", handle)
        values["pcie_max_width"] = self._call(index, "nvmlDeviceGetMaxPcieLinkWidth", handle)
        values["pcie_gen"] = self._call(index, "nvmlDeviceGetCurrPcieLinkGeneration", handle)
        values["pcie_max_gen"] = self._call(index, "nvmlDeviceGetMaxPcieLinkGeneration", handle)

    def _read_modes(self, index: int, handle: Any, values: dict[str, Any]) -> None:
        nv = self._nvml
        values["compute_mode"] = self._call(index, "nvmlDeviceGetComputeMode", handle)
        values["persistence"] = _map(self._call(index, "nvmlDeviceGetPersistenceMode", handle),
                                     lambda m: m == nv.NVML_FEATURE_ENABLED)
        values["mig_mode"] = _map(self._call(index, "nvmlDeviceGetMigMode", handle),
                                  lambda m: (m[0] == nv.NVML_DEVICE_MIG_ENABLE, m[1] == nv.NVML_DEVICE_MIG_ENABLE))
        values["fabric"] = self._fabric(index, handle)
        values["nvlink_active"] = self._nvlink(index, handle)

    def _fabric(self, index: int, handle: Any) -> Reading[Fabric]:
        """The one struct this adapter hands to NVML itself. pynvml sets no ``argtypes`` and passes the
        argument straight to C, so it must be ``ctypes.byref(info)``: the struct itself (by value)
        made NVML write through a garbage pointer and segfaulted the process on a real H100. ctypes is
        imported here, in the NVML worker, not with the module: every tool's parent process imports this one."""
        import ctypes

        nv = self._nvml
        info = nv.c_nvmlGpuFabricInfoV_t()
        info.version = nv.nvmlGpuFabricInfo_v2
        done = self._call(index, "nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info))
        if isinstance(done, Unread) and done.kind is ErrorKind.FUNCTION_NOT_FOUND:
            info = nv.c_nvmlGpuFabricInfo_t()
            done = self._call(index, "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info))
        if isinstance(done, Unread):
            return done
        # nvml.h declares the state `unsigned char`; pynvml reads 4 bytes there, three of them padding
        # NVML never promised to zero. Keep the byte the header defines.
        return Fabric(state=int(info.state) & 0xFF, status=int(info.status))

    def _nvlink(self, index: int, handle: Any) -> Reading[tuple[bool, ...]]:
        """Link states until the first link the GPU does not have (NOT_SUPPORTED / INVALID_ARGUMENT)."""
        nv = self._nvml
        active: list[bool] = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            state = self._call(index, "nvmlDeviceGetNvLinkState", handle, link)
            if isinstance(state, Unread):
                no_such_link = state.kind is ErrorKind.NOT_SUPPORTED or state.code == nv.NVML_ERROR_INVALID_ARGUMENT
                if no_such_link and active:
                    break  # past the GPU's last link
                if no_such_link:
                    return Unread(ErrorKind.NOT_SUPPORTED, state.call, "no NVLink on this GPU", state.code)
                return state
            active.append(state == nv.NVML_FEATURE_ENABLED)
        return tuple(active)

    def _memory(self, index: int, handle: Any) -> Reading[Memory]:
        info = self._call(index, "nvmlDeviceGetMemoryInfo", handle, self._nvml.nvmlMemory_v2)
        old_driver = isinstance(info, Unread) and (info.kind is ErrorKind.FUNCTION_NOT_FOUND or
                                                   info.code == self._nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if old_driver:
            v1 = self._call(index, "nvmlDeviceGetMemoryInfo", handle)
            return _map(v1, lambda m: Memory(total=int(m.total), used=int(m.used), reserved=None))
        return _map(info, lambda m: Memory(total=int(m.total), used=int(m.used), reserved=int(m.reserved)))

    def _processes(self, index: int, handle: Any) -> Reading[tuple[GpuProcess, ...]]:
        """Compute, graphics and MPS lists merged by pid. Newest struct version first: an old
        struct on a new driver scrambles pids, so only versions the driver exports are used."""
        merged: dict[int, tuple[int | None, list[str]]] = {}
        sources = {
            "compute": ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
            "graphics": ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
            "mps": ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2"),
        }
        first_error: Unread | None = None
        for kind, names in sources.items():
            procs = self._first(index, names, handle)
            if isinstance(procs, Unread):
                if kind == "compute":
                    first_error = procs
                continue
            for proc in procs:  # a pid in two lists ("C+G") is one process: keep the larger figure
                used, kinds = merged.get(int(proc.pid), (None, []))
                if proc.usedGpuMemory is not None:
                    used = max(used or 0, int(proc.usedGpuMemory))
                merged[int(proc.pid)] = (used, [*kinds, kind])
        if first_error is not None and not merged:
            return first_error
        return tuple(GpuProcess(pid, used, tuple(kinds)) for pid, (used, kinds) in sorted(merged.items()))  # type: ignore[arg-type]

    def _counters(self, index: int, handle: Any) -> Counters:
        nv = self._nvml
        violation = "nvmlDeviceGetViolationStatus"
        thermal = _map(self._call(index, violation, handle, nv.NVML_PERF_POLICY_THERMAL),
                       lambda v: int(v.violationTime))
        power = _map(self._call(index, violation, handle, nv.NVML_PERF_POLICY_POWER), lambda v: int(v.violationTime))
        replays, nvl_replay, nvl_recovery, nvl_crc = self._fields(index, handle, [
            nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER, nv.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
            nv.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, nv.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL])
        return Counters(at=time.monotonic(), thermal_violation_ns=thermal, power_violation_ns=power,
                        pcie_replays=replays, nvlink_replay_errors=nvl_replay, nvlink_recovery_errors=nvl_recovery,
                        nvlink_crc_errors=nvl_crc)


class NvmlProcessBackend:
    """The backend the tools use: every read runs :class:`PynvmlBackend` in the NVML worker process
    (``nvml_session``), so a native fault or a wedged driver never takes the caller down."""

    name = "nvml"

    @property
    def worker(self) -> NvmlSession:
        return nvml_session.session()

    def open(self, timeout_s: float) -> NvmlStatus:
        return self.worker.status(timeout_s)

    def read_gpu(self, index: int) -> GpuSnapshot:
        return self.worker.request("read_gpu", index)

    def read_counters(self, index: int) -> Counters:
        return self.worker.request("read_counters", index)

    def read_processes(self, index: int) -> GpuProcesses:
        return self.worker.request("read_processes", index)

    def list_devices(self) -> list[tuple[str, str, tuple[int, int]]]:
        return self.worker.request("list_devices")


def _map(reading: Any, fn: Callable[[Any], T]) -> Reading[T]:
    return reading if isinstance(reading, Unread) else fn(reading)


def _field_number(pynvml: Any, value: Any) -> int:
    """The numeric member of an nvmlFieldValue_t's union that its valueType names."""
    member = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }.get(value.valueType, "ullVal")
    return int(getattr(value.value, member))
