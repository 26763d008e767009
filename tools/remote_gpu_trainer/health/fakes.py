"""Named fake machines for gpu_health and reap_vram_zombies: NVML, processes and kernel log.

They go through the same interfaces as the real thing (``NvmlBackend``, ``ProcessSource``, a
kernel-log reader), so every check, the hang handling and the rendering run in CI without a GPU.
A fake hang really blocks the fake's NVML thread, so the probe's timeout handling runs for real. The
same scenarios drive the C-level fake ``libnvidia-ml.so.1`` of the tests (``tests/nvml_fake``), which
runs the real adapter in the real NVML worker process.

``RGT_HEALTH_FAKE=<scenario> rgt health`` runs a scenario from the CLI (demos, docs, evals); the
report then says ``backend: fake:<scenario>`` so it can never pass for this machine's state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ..nvml_session import NvmlStatus, SerialWorker
from ..processes.snapshot import ProcInfo
from .backend import (
    Counters,
    ErrorKind,
    Fabric,
    GpuProcess,
    GpuProcesses,
    GpuSnapshot,
    Memory,
    RemappedRows,
    Unread,
)
from .holders import DeviceScan, DeviceUse
from .xid import KernelLog, XidEvent

GIB = 1 << 30
FAKE_UID = 1000
OK_STATUS = NvmlStatus(True, "ok", "NVML 12.570.86.15, driver 570.86.15, 8 GPU(s)", "570.86.15", "12.570.86.15", 8,
                       "12.8")


def _ns(call: str) -> Unread:
    return Unread(ErrorKind.NOT_SUPPORTED, call, "Not Supported")


class FakeBackend:
    """An NvmlBackend over fixed snapshots; ``hang_on`` GPUs block in read_gpu until released."""

    def __init__(self, name: str, status: NvmlStatus, gpus: list[GpuSnapshot], hang_on: frozenset[int] = frozenset(),
                 later: Mapping[int, Counters] | None = None, hang_s: float = 120.0):
        self.name = f"fake:{name}"
        self.status = status
        self.gpus = gpus
        self.hang_on = hang_on
        self.later = dict(later or {})
        self.hang_s = hang_s
        self.release = threading.Event()
        """Set it to let a hung call return (tests do, so no thread outlives them for long)."""
        self.calls: list[str] = []
        self._worker = SerialWorker(f"fake-nvml-{name}")

    @property
    def worker(self) -> SerialWorker:
        return self._worker

    def open(self, timeout_s: float) -> NvmlStatus:
        return self.status

    def _maybe_hang(self, index: int, call: str) -> None:
        if index in self.hang_on:
            self._worker.detail = f"{call} (GPU {index})"
            self.release.wait(self.hang_s)

    def read_gpu(self, index: int) -> GpuSnapshot:
        self.calls.append(f"read_gpu({index})")
        self._maybe_hang(index, "nvmlDeviceGetRemappedRows")
        gpu = self.gpus[index]
        return replace(gpu, counters=replace(gpu.counters, at=time.monotonic()))

    def read_counters(self, index: int) -> Counters:
        self.calls.append(f"read_counters({index})")
        return replace(self.later.get(index, self.gpus[index].counters), at=time.monotonic())

    def read_processes(self, index: int) -> GpuProcesses:
        self.calls.append(f"read_processes({index})")
        self._maybe_hang(index, "nvmlDeviceGetComputeRunningProcesses_v3")
        gpu = self.gpus[index]
        return GpuProcesses(index=index, lost=gpu.lost, uuid=gpu.uuid, minor=gpu.minor, memory=gpu.memory,
                            processes=gpu.processes)


@dataclass
class FakeProcesses:
    """A ProcessSource over hand-made processes."""

    procs: dict[int, ProcInfo] = field(default_factory=dict)
    pgids: dict[int, int] = field(default_factory=dict)
    units: dict[int, str] = field(default_factory=dict)
    holders: dict[int, DeviceUse] = field(default_factory=dict)
    unreadable: frozenset[int] = frozenset()
    children: dict[int, list[int]] = field(default_factory=dict)
    container: bool = False
    my_uid: int = FAKE_UID
    clock: float = 1_000_000.0
    after_wait: dict[int, ProcInfo] = field(default_factory=dict)
    """What info() returns once wait() has been called (e.g. a D state that passes)."""
    waited: float = 0.0

    def info(self, pid: int) -> ProcInfo | None:
        if self.waited and pid in self.after_wait:
            return self.after_wait[pid]
        return self.procs.get(pid)

    def pgid(self, pid: int) -> int | None:
        return self.pgids.get(pid, pid if pid in self.procs else None)

    def systemd_unit(self, pid: int) -> str | None:
        return self.units.get(pid)

    def devices(self) -> DeviceScan:
        return DeviceScan(dict(self.holders), self.unreadable)

    def descendants(self, pid: int) -> list[int]:
        found, queue = [], list(self.children.get(pid, []))
        while queue:
            child = queue.pop(0)
            found.append(child)
            queue.extend(self.children.get(child, []))
        return found

    def in_container(self) -> bool:
        return self.container

    def uid(self) -> int:
        return self.my_uid

    def pid_max(self) -> int:
        return 4194304

    def now(self) -> float:
        return self.clock

    def wait(self, seconds: float) -> None:
        self.waited += seconds
        self.clock += seconds


def proc(pid: int, ppid: int, cmd: str, *, uid: int = FAKE_UID, status: str = "sleeping", age_s: float = 3600,
         sid: int | None = None, clock: float = 1_000_000.0) -> ProcInfo:
    argv = tuple(cmd.split())
    return ProcInfo(pid=pid, ppid=ppid, name=argv[0].rsplit("/", 1)[-1] if argv else "?", cmdline=argv, uid=uid,
                    username="trainer" if uid == FAKE_UID else f"uid{uid}", status=status,
                    create_time=clock - age_s, sid=sid if sid is not None else ppid, start_ticks=pid * 100)


@dataclass
class Scenario:
    name: str
    description: str
    backend: FakeBackend
    processes: FakeProcesses
    kernel_log: KernelLog

    def read_kernel_log(self) -> KernelLog:
        return self.kernel_log


def h100(index: int, **changes: object) -> GpuSnapshot:
    """One idle, healthy H100 SXM on an NVSwitch board (values typical of nvidia-smi -q on one)."""
    gpu = GpuSnapshot(
        index=index, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-fake-0000-0000-0000-00000000000{index}",
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0", minor=index, vbios="96.00.99.00.01",
        recovery_action=0, ecc_mode=(True, True), ecc_uncorrected_volatile=0, ecc_corrected_volatile=0,
        ecc_uncorrected_aggregate=0, remapped_rows=RemappedRows(0, 0, False, False),
        retired_pages=_ns("nvmlDeviceGetRetiredPages"), inforom_valid=True, temperature_c=33, temp_slowdown_c=87,
        temp_shutdown_c=92, clock_event_reasons=0x1, utilization_gpu=0, power_limit_mw=700_000,
        power_default_limit_mw=700_000, pcie_width=16, pcie_max_width=16, pcie_gen=5, pcie_max_gen=5, compute_mode=0,
        persistence=True, mig_mode=(False, False), fabric=Fabric(state=3, status=0), nvlink_active=(True,) * 18,
        memory=Memory(total=80 * GIB, used=4 << 20, reserved=600 << 20), processes=(),
        counters=Counters(thermal_violation_ns=0, power_violation_ns=0, pcie_replays=0, nvlink_replay_errors=0,
                          nvlink_recovery_errors=0, nvlink_crc_errors=0))
    return replace(gpu, **changes)


def _xid(gpu: GpuSnapshot, code: int, text: str, at_s: float = 3600.0) -> XidEvent:
    assert isinstance(gpu.pci_bus_id, str)
    bus = gpu.pci_bus_id.lower().split(":", 1)[1].rsplit(".", 1)[0]
    return XidEvent(device=f"PCI:0000:{bus}", code=code, text=text, at_s=at_s)


READABLE_EMPTY = KernelLog(True, "fake:/dev/kmsg", "")


def _scenario(name: str, description: str, gpus: list[GpuSnapshot], *, status: NvmlStatus = OK_STATUS,
              hang_on: frozenset[int] = frozenset(), later: Mapping[int, Counters] | None = None,
              processes: FakeProcesses | None = None, kernel_log: KernelLog = READABLE_EMPTY) -> Scenario:
    if status.ok and status.device_count != len(gpus):
        status = replace(status, device_count=len(gpus), detail=f"NVML {status.nvml_version}, driver "
                         f"{status.driver_version}, {len(gpus)} GPU(s)")
    return Scenario(name, description, FakeBackend(name, status, gpus, hang_on, later), processes or FakeProcesses(),
                    kernel_log)


def _eight(**per_gpu: dict) -> list[GpuSnapshot]:
    return [h100(i, **per_gpu.get(f"gpu{i}", {})) for i in range(8)]


def healthy() -> Scenario:
    return _scenario("healthy-8xh100", "8× H100 SXM, idle, healthy, persistence on, fabric completed", _eight())


def driver_535() -> Scenario:
    """The healthy board on an older driver branch: a fleet check must notice it differs from its peers."""
    status = NvmlStatus(True, "ok", "NVML 12.535.183.01, driver 535.183.01, 8 GPU(s)", "535.183.01", "12.535.183.01",
                        8, "12.2")
    return _scenario("driver-535-8xh100", "8× H100 SXM, idle, healthy, on driver 535.183.01 (CUDA 12.2)", _eight(),
                     status=status)


def ecc_dbe() -> Scenario:
    gpus = _eight(gpu2={"ecc_uncorrected_volatile": 2, "ecc_uncorrected_aggregate": 3, "ecc_corrected_volatile": 41})
    log = KernelLog(True, "fake:/dev/kmsg", "", (_xid(gpus[2], 48, "pid=4711, name=python, An uncorrectable double "
                                                              "bit error (DBE) has been detected on GPU"),))
    return _scenario("ecc-dbe", "GPU 2: 2 volatile uncorrectable ECC errors and XID 48", gpus, kernel_log=log)


def row_remap_pending() -> Scenario:
    gpus = _eight(gpu5={"remapped_rows": RemappedRows(0, 1, True, False)})
    log = KernelLog(True, "fake:/dev/kmsg", "", (_xid(gpus[5], 63, "Row Remapper: New row marked for remapping, "
                                                              "reset gpu to activate."),))
    return _scenario("row-remap-pending", "GPU 5: an uncorrectable row waiting for a reset (XID 63)", gpus,
                     kernel_log=log)


def thermal_throttle() -> Scenario:
    hot = {"temperature_c": 88, "utilization_gpu": 98, "clock_event_reasons": 0x40 | 0x20 | 0x4}
    warm_idle = {"temperature_c": 80, "clock_event_reasons": 0x1 | 0x8}
    gpus = _eight(gpu1=hot, gpu3=warm_idle)
    later = {1: replace(gpus[1].counters, thermal_violation_ns=400_000_000, power_violation_ns=100_000_000)}
    return _scenario("thermal-throttle", "GPU 1 loaded at its slowdown temperature with thermal slowdown; GPU 3 "
                     "idle but hot with HW slowdown", gpus, later=later)


def exclusive_process() -> Scenario:
    return _scenario("exclusive-process", "every GPU in Exclusive Process compute mode",
                     [h100(i, compute_mode=3) for i in range(8)])


def mig_on() -> Scenario:
    procs = (GpuProcess(2101, None, ("compute",)),)
    gpus = _eight(gpu0={"mig_mode": (True, True), "processes": procs, "memory": Memory(80 * GIB, 20 * GIB, 600 << 20)})
    processes = FakeProcesses(procs={2101: proc(2101, 2000, "python serve.py"), 2000: proc(2000, 1, "bash")},
                              holders={2101: DeviceUse(frozenset({0}), True)})
    return _scenario("mig-on", "GPU 0 has MIG enabled with a process on a slice", gpus, processes=processes)


def gpu_lost() -> Scenario:
    gpus = _eight(gpu6={"lost": Unread(ErrorKind.GPU_IS_LOST, "nvmlDeviceGetTemperature", "GPU is lost")})
    log = KernelLog(True, "fake:/dev/kmsg", "", (_xid(gpus[6], 79, "pid=0, GPU has fallen off the bus."),))
    return _scenario("gpu-lost", "GPU 6 fell off the bus (GPU_IS_LOST, XID 79)", gpus, kernel_log=log)


def nvml_hang() -> Scenario:
    return _scenario("nvml-hang", "NVML blocks forever while reading GPU 4", _eight(), hang_on=frozenset({4}))


def no_driver() -> Scenario:
    status = NvmlStatus(False, "no_driver", "nvmlInit failed: NVML Shared Library Not Found — libnvidia-ml.so.1 was "
                        "not found: no NVIDIA driver here, or the container was started without the NVIDIA runtime "
                        "(--gpus all / nvidia-container-toolkit)")
    return _scenario("no-driver", "no NVIDIA driver or library", [], status=status,
                     kernel_log=KernelLog(False, "-", "kernel log not readable (fake)"))


def driver_mismatch() -> Scenario:
    status = NvmlStatus(False, "driver_library_mismatch", "nvmlInit failed: RM has detected an NVML/RM version "
                        "mismatch. — Driver/library version mismatch: reboot or reload the nvidia kernel modules")
    return _scenario("driver-mismatch", "driver upgraded without a reboot", [], status=status)


def fabric_in_progress() -> Scenario:
    return _scenario("fabric-in-progress", "NVSwitch fabric still initialising (CUDA would fail with error 802)",
                     [h100(i, fabric=Fabric(state=2, status=0)) for i in range(8)])


def pcie_x8() -> Scenario:
    return _scenario("pcie-x8", "GPU 7 trained its link at x8", _eight(gpu7={"pcie_width": 8}))


def container_healthy() -> Scenario:
    """A rented container: healthy GPUs, kernel log closed, NVML lists no processes."""
    log = KernelLog(False, "-", "kernel log not readable (/dev/kmsg: Operation not permitted): container runtimes "
                    "usually withhold CAP_SYSLOG")
    return _scenario("container-healthy", "1× H100 in a container: healthy, kernel log unreadable", [h100(0)],
                     processes=FakeProcesses(container=True), kernel_log=log)


def old_driver() -> Scenario:
    """A driver older than several NVML calls: those checks SKIP, never PASS."""
    missing = Unread(ErrorKind.FUNCTION_NOT_FOUND, "nvmlDeviceGetGpuFabricInfoV", "Function Not Found")
    gpus = [h100(i, recovery_action=_ns("nvmlDeviceGetFieldValues"), fabric=missing,
                 clock_event_reasons=Unread(ErrorKind.FUNCTION_NOT_FOUND, "nvmlDeviceGetCurrentClocksThrottleReasons",
                                            "Function Not Found")) for i in range(2)]
    return _scenario("old-driver", "2 GPUs on an old driver: newer NVML calls missing", gpus)


def zombie_orphan_namespaced() -> Scenario:
    """Every holder class on one box: an active job, a stale orphan with a DataLoader child, a zombie,
    a D-state process, a pid from another namespace, a phantom context and a scrambled pid."""
    clock = 1_000_000.0
    procs = {
        1: proc(1, 0, "/sbin/init", uid=0, sid=1),
        500: proc(500, 1, "sshd: trainer", uid=0, sid=500),
        900: proc(900, 500, "-bash", sid=900),
        1000: proc(1000, 900, "torchrun --nproc-per-node 1 train.py", sid=900),
        1001: proc(1001, 1000, "python train.py --local-rank 0", sid=900),
        2001: proc(2001, 1, "python train.py --local-rank 0", sid=1950),   # launcher 1950 is gone
        2002: proc(2002, 2001, "python train.py --local-rank 0", sid=1950),  # its DataLoader worker
        3001: proc(3001, 1000, "python eval.py", status="zombie", sid=900),
        4001: proc(4001, 1, "python stuck.py", status="disk-sleep", sid=3990),
    }
    pgids = {1: 1, 500: 500, 900: 900, 1000: 1000, 1001: 1000, 2001: 1950, 2002: 1950, 3001: 1000, 4001: 3990}
    holders = {1001: DeviceUse(frozenset({0}), True), 2001: DeviceUse(frozenset({1}), True),
               2002: DeviceUse(frozenset({1}), True), 4001: DeviceUse(frozenset({2}), True),
               5005: DeviceUse(frozenset({3}), True)}
    procs[5005] = proc(5005, 1, "python leftover.py", sid=5000)
    pgids[5005] = 5000
    gpus = _eight(
        gpu0={"processes": (GpuProcess(1001, 30 * GIB, ("compute",)),), "memory": Memory(80 * GIB, 30 * GIB, None)},
        gpu1={"processes": (GpuProcess(2001, 22 * GIB, ("compute",)), GpuProcess(2002, 1 * GIB, ("compute",))),
              "memory": Memory(80 * GIB, 23 * GIB, None)},
        gpu2={"processes": (GpuProcess(3001, 5 * GIB, ("compute",)), GpuProcess(4001, 9 * GIB, ("compute",))),
              "memory": Memory(80 * GIB, 14 * GIB, None)},
        gpu3={"processes": (GpuProcess(884422, 12 * GIB, ("compute",)),), "memory": Memory(80 * GIB, 12 * GIB, None)},
        gpu4={"processes": (GpuProcess(771133, 7 * GIB, ("compute",)),), "memory": Memory(80 * GIB, 7 * GIB, None)},
        gpu5={"processes": (GpuProcess(0xFFFFFFFF, 3 * GIB, ("compute",)),), "memory": Memory(80 * GIB, 3 * GIB, None)},
    )
    processes = FakeProcesses(procs=procs, pgids=pgids, holders=holders, children={1000: [1001, 3001], 2001: [2002]},
                              clock=clock)
    return _scenario("zombie-orphan-namespaced", "GPU 0 active job; GPU 1 orphan + its worker; GPU 2 zombie and "
                     "D-state holders; GPU 3 host pid with a local holder; GPU 4 phantom; GPU 5 scrambled pid",
                     gpus, processes=processes)


def idle_box() -> Scenario:
    """A rented box whose run has ended: no utilisation, no processes, idle power draw."""
    return _scenario("idle-8xh100", "8× H100 SXM, 0 % utilisation, no processes, ~70 W each (an idle box that "
                     "still bills)", [h100(i, power_usage_mw=70_000) for i in range(8)])


def busy_box() -> Scenario:
    """Every GPU loaded by one training process (pid 7001, not a run of ours unless a ledger says so)."""
    gpus = [h100(i, utilization_gpu=97, power_usage_mw=650_000, temperature_c=64, clock_event_reasons=0x0,
                 memory=Memory(80 * GIB, 71 * GIB, 600 << 20),
                 processes=(GpuProcess(7001 + i, 70 * GIB, ("compute",)),)) for i in range(8)]
    return _scenario("busy-8xh100", "8× H100 SXM at 97 % utilisation, one training process per GPU, ~650 W each",
                     gpus)


def shared_gpu(pids: tuple[int, int, int] = (7101, 7102, 7103)) -> Scenario:
    """Four GPUs, three training processes: the first two on GPU 0 (every rank on cuda:0), the third on
    GPU 1, GPUs 2 and 3 idle. ``pids`` lets a test put its own processes there."""
    first, second, third = pids
    gpus = [h100(0, utilization_gpu=99, memory=Memory(80 * GIB, 41 * GIB, 600 << 20),
                 processes=(GpuProcess(first, 20 * GIB, ("compute",)), GpuProcess(second, 20 * GIB, ("compute",)))),
            h100(1, utilization_gpu=96, memory=Memory(80 * GIB, 21 * GIB, 600 << 20),
                 processes=(GpuProcess(third, 20 * GIB, ("compute",)),)),
            h100(2), h100(3)]
    return _scenario("shared-gpu-4xh100", "4× H100: two training processes on GPU 0, one on GPU 1, GPUs 2-3 idle",
                     gpus)


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "healthy-8xh100": healthy,
    "driver-535-8xh100": driver_535,
    "ecc-dbe": ecc_dbe,
    "row-remap-pending": row_remap_pending,
    "thermal-throttle": thermal_throttle,
    "exclusive-process": exclusive_process,
    "mig-on": mig_on,
    "gpu-lost": gpu_lost,
    "nvml-hang": nvml_hang,
    "no-driver": no_driver,
    "driver-mismatch": driver_mismatch,
    "fabric-in-progress": fabric_in_progress,
    "pcie-x8": pcie_x8,
    "container-healthy": container_healthy,
    "old-driver": old_driver,
    "zombie-orphan-namespaced": zombie_orphan_namespaced,
    "idle-8xh100": idle_box,
    "busy-8xh100": busy_box,
    "shared-gpu-4xh100": shared_gpu,
}


def scenario(name: str) -> Scenario:
    from ..errors import InputError

    if name not in SCENARIOS:
        raise InputError("RGT_HEALTH_FAKE", f"unknown fake scenario {name!r}", allowed=SCENARIOS)
    return SCENARIOS[name]()
