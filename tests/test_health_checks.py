"""gpu_health verdicts: every named scenario through the real probe, and each check's thresholds."""

from __future__ import annotations

import dataclasses
import time

import pytest

from remote_gpu_trainer.health import checks as C
from remote_gpu_trainer.health.backend import Counters, ErrorKind, Fabric, GpuSnapshot, Memory, Unread
from remote_gpu_trainer.health.checks import GpuContext
from remote_gpu_trainer.health.fakes import SCENARIOS, h100
from remote_gpu_trainer.health.probe import HealthReport, probe
from remote_gpu_trainer.models import Verdict

GIB = 1 << 30


def run(name: str, **kwargs) -> HealthReport:
    scenario = SCENARIOS[name]()
    try:
        return probe(scenario.backend, kernel_log=scenario.read_kernel_log, processes=scenario.processes, **kwargs)
    finally:
        scenario.backend.release.set()


def verdicts(report: HealthReport, gpu: int) -> dict[str, Verdict]:
    return {c.name: c.verdict for c in report.gpus[gpu].checks}


def test_healthy_8xh100_passes_every_check():
    report = run("healthy-8xh100", expect_gpus=8)
    assert report.verdict is Verdict.PASS and report.exit_code == 0
    assert report.gpus_found == 8 and len(report.gpus) == 8
    names = [c.name for c in report.gpus[0].checks]
    assert names == ["reachable", "recovery_action", "ecc_mode", "ecc_uncorrected", "row_remap", "retired_pages",
                     "inforom", "temperature", "clock_events", "power_limit", "pcie_link", "compute_mode",
                     "persistence_mode", "mig_mode", "fabric", "nvlink", "vram_processes", "vram_unattributed", "xid"]
    for gpu in report.gpus:
        assert gpu.verdict is Verdict.PASS
        # retired pages do not exist on H100 (row remapping replaced them): SKIP, not PASS
        assert verdicts(report, gpu.index)["retired_pages"] is Verdict.SKIP
    assert {c.name: c.verdict for c in report.host_checks} == {
        "nvml_driver": Verdict.PASS, "gpu_count": Verdict.PASS, "vbios_consistency": Verdict.PASS,
        "xid_kernel_log": Verdict.PASS}


@pytest.mark.parametrize(("name", "overall", "gpu", "check", "verdict", "entry"), [
    ("ecc-dbe", Verdict.FAIL, 2, "ecc_uncorrected", Verdict.FAIL, "GOT-19"),
    ("ecc-dbe", Verdict.FAIL, 2, "xid", Verdict.FAIL, "GOT-19"),
    ("row-remap-pending", Verdict.FAIL, 5, "row_remap", Verdict.FAIL, "GOT-20"),
    ("row-remap-pending", Verdict.FAIL, 5, "xid", Verdict.WARN, "GOT-20"),
    ("thermal-throttle", Verdict.FAIL, 1, "temperature", Verdict.WARN, "GOT-24"),
    ("thermal-throttle", Verdict.FAIL, 1, "clock_events", Verdict.WARN, "GOT-24"),
    ("thermal-throttle", Verdict.FAIL, 3, "clock_events", Verdict.FAIL, "GOT-24"),
    ("thermal-throttle", Verdict.FAIL, 3, "temperature", Verdict.WARN, "GOT-24"),
    ("exclusive-process", Verdict.WARN, 0, "compute_mode", Verdict.WARN, "GOT-09"),
    ("mig-on", Verdict.WARN, 0, "mig_mode", Verdict.WARN, "GOT-28"),
    ("mig-on", Verdict.WARN, 0, "vram_unattributed", Verdict.SKIP, None),
    ("gpu-lost", Verdict.FAIL, 6, "reachable", Verdict.FAIL, "GOT-18"),
    ("fabric-in-progress", Verdict.FAIL, 0, "fabric", Verdict.FAIL, "NODE-05"),
    ("pcie-x8", Verdict.WARN, 7, "pcie_link", Verdict.WARN, "GOT-27"),
    ("old-driver", Verdict.PASS, 0, "recovery_action", Verdict.SKIP, None),
    ("old-driver", Verdict.PASS, 0, "clock_events", Verdict.SKIP, None),
    ("old-driver", Verdict.PASS, 0, "fabric", Verdict.SKIP, None),
])
def test_scenario_findings(name, overall, gpu, check, verdict, entry):
    report = run(name)
    assert report.verdict is overall
    found = next(c for c in report.gpus[gpu].checks if c.name == check)
    assert found.verdict is verdict, found
    assert (found.entry.id if found.entry else None) == entry
    if verdict in (Verdict.WARN, Verdict.FAIL):
        assert found.explanation and found.observed != "-"


def test_thermal_throttle_window_measures_violation_time():
    report = run("thermal-throttle", sample_s=0.2)
    clock = next(c for c in report.gpus[1].checks if c.name == "clock_events")
    assert "thermal-limited" in clock.observed and "thermal violations during the sampling window" in clock.explanation
    assert report.sample_s == 0.2 and report.elapsed_s >= 0.2


def test_gpu_lost_reports_only_reachability_and_the_xid():
    report = run("gpu-lost", expect_gpus=8)
    lost = report.gpus[6]
    assert [c.name for c in lost.checks] == ["reachable"]
    assert "GPU is lost" in lost.checks[0].observed
    assert report.gpus[5].verdict is Verdict.PASS
    assert report.exit_code == 1


def test_nvml_hang_returns_fail_within_the_timeout_and_names_the_call():
    started = time.monotonic()
    report = run("nvml-hang", timeout_s=0.5)
    assert time.monotonic() - started < 3
    assert report.verdict is Verdict.FAIL and report.exit_code == 1
    hung = report.gpus[4].checks[0]
    assert hung.verdict is Verdict.FAIL and "nvmlDeviceGetRemappedRows (GPU 4)" in hung.observed
    assert hung.entry.id == "GOT-23"
    assert [g.verdict for g in report.gpus[:4]] == [Verdict.PASS] * 4
    assert all(g.checks[0].verdict is Verdict.UNKNOWN for g in report.gpus[5:])  # not probed, never PASS


def test_no_driver_is_fail_with_exit_4_and_a_reason():
    report = run("no-driver")
    assert report.verdict is Verdict.FAIL and report.exit_code == 4 and report.gpus == []
    driver = report.host_checks[0]
    assert driver.name == "nvml_driver" and "libnvidia-ml.so.1" in driver.observed
    assert driver.entry.id == "GOT-17" and "/dev/nvidia*" in driver.explanation
    assert run("no-driver", expect_gpus=8).exit_code == 1  # a GPU box that should have 8: a failure, not "no GPU"


def test_driver_mismatch_is_fail_exit_1():
    report = run("driver-mismatch")
    assert report.exit_code == 1 and report.host_checks[0].entry.id == "GOT-11"


def test_container_with_unreadable_kernel_log_skips_xids_and_passes():
    """In a container the kernel log is the provider's: SKIP (never PASS) and a clean overall verdict."""
    report = run("container-healthy")
    assert report.verdict is Verdict.PASS and report.exit_code == 0
    log = next(c for c in report.host_checks if c.name == "xid_kernel_log")
    assert log.verdict is Verdict.SKIP and log.entry.id == "GOT-26"
    assert "provider's host" in log.explanation
    assert report.gpus[0].verdict is Verdict.PASS


def test_host_with_unreadable_kernel_log_is_unknown_exit_3():
    """On a host the log is readable with the right permission, so not reading it is UNKNOWN."""
    scenario = SCENARIOS["container-healthy"]()
    scenario.processes.container = False
    try:
        report = probe(scenario.backend, kernel_log=scenario.read_kernel_log, processes=scenario.processes)
    finally:
        scenario.backend.release.set()
    assert report.verdict is Verdict.UNKNOWN and report.exit_code == 3
    log = next(c for c in report.host_checks if c.name == "xid_kernel_log")
    assert log.verdict is Verdict.UNKNOWN and log.entry.id == "GOT-26"
    assert report.summary.startswith("UNKNOWN: [UNKNOWN] xid_kernel_log (unreadable)")


def test_expect_gpus_and_indices():
    assert next(c for c in run("healthy-8xh100", expect_gpus=9).host_checks if c.name == "gpu_count").verdict \
        is Verdict.FAIL
    assert next(c for c in run("healthy-8xh100", expect_gpus=4).host_checks if c.name == "gpu_count").verdict \
        is Verdict.WARN
    report = run("ecc-dbe", indices=[0, 1])
    assert [g.index for g in report.gpus] == [0, 1] and report.exit_code == 0
    assert any("only GPU(s) 0, 1 of 8" in n for n in report.notes)
    # GPU 2's XID 48 is not theirs to fail on, but it is not hidden either
    host = next(c for c in report.host_checks if c.name == "xid_kernel_log")
    assert host.verdict is Verdict.WARN and "XID 48" in host.observed


def test_out_of_range_index_is_an_input_error_naming_the_field():
    from remote_gpu_trainer.errors import InputError

    with pytest.raises(InputError) as err:
        run("healthy-8xh100", indices=[3, 8])
    assert err.value.field == "indices" and "no GPU 8" in str(err.value) and "allowed: 0, 1" in str(err.value)


def test_vram_holders_are_classified_in_the_health_report():
    report = run("zombie-orphan-namespaced")
    assert verdicts(report, 0)["vram_processes"] is Verdict.WARN  # an active job: the GPU is in use
    assert "orphan" in next(c for c in report.gpus[1].checks if c.name == "vram_processes").explanation
    assert verdicts(report, 2)["vram_processes"] is Verdict.FAIL  # a D-state holder: only a reset frees it
    assert "phantom" in next(c for c in report.gpus[4].checks if c.name == "vram_processes").observed


def test_xid_of_a_gpu_nvml_no_longer_lists_fails_the_host_check():
    scenario = SCENARIOS["gpu-lost"]()
    scenario.backend.gpus = scenario.backend.gpus[:6]  # GPU 6 dropped off the bus and out of NVML's count
    scenario.backend.status = dataclasses.replace(scenario.backend.status, device_count=6)
    report = probe(scenario.backend, expect_gpus=8, kernel_log=scenario.read_kernel_log, processes=scenario.processes)
    host = next(c for c in report.host_checks if c.name == "xid_kernel_log")
    assert host.verdict is Verdict.FAIL and "XID 79" in host.observed and host.entry.id == "GOT-18"


# --- single checks at their thresholds -------------------------------------------------------------


def check(fn, gpu: GpuSnapshot, ctx: GpuContext | None = None):
    return fn(gpu, ctx or GpuContext())


@pytest.mark.parametrize(("temp", "util", "verdict"), [
    (76, 0, Verdict.PASS), (77, 0, Verdict.WARN), (86, 90, Verdict.PASS), (87, 90, Verdict.WARN),
    (87, 0, Verdict.FAIL), (92, 90, Verdict.FAIL),
])
def test_temperature_against_the_gpus_own_thresholds(temp, util, verdict):
    result = check(C.check_temperature, h100(0, temperature_c=temp, utilization_gpu=util))
    assert result.verdict is verdict
    assert result.threshold == "slowdown 87 °C, shutdown 92 °C"


@pytest.mark.parametrize(("reasons", "util", "verdict"), [
    (0x1 | 0x2 | 0x10 | 0x100, 0, Verdict.PASS),  # idle, app clocks, sync boost, display: masked
    (0x4, 95, Verdict.PASS),  # SW power cap under load is normal
    (0x4, 0, Verdict.WARN),  # power-capped while idle
    (0x20, 95, Verdict.WARN),  # SW thermal slowdown
    (0x8, 95, Verdict.WARN), (0x40, 95, Verdict.WARN), (0x80, 95, Verdict.WARN),  # HW reasons while loaded
    (0x8, 0, Verdict.FAIL), (0x40, 0, Verdict.FAIL), (0x80, 0, Verdict.FAIL),  # HW reasons while idle
])
def test_clock_event_reasons(reasons, util, verdict):
    assert check(C.check_clock_events, h100(0, clock_event_reasons=reasons, utilization_gpu=util)).verdict is verdict


def test_hw_slowdown_with_unknown_load_is_not_called_idle():
    unread = Unread(ErrorKind.NOT_SUPPORTED, "nvmlDeviceGetUtilizationRates")
    assert check(C.check_clock_events, h100(0, clock_event_reasons=0x8, utilization_gpu=unread)).verdict is Verdict.WARN


def test_power_limit_below_default_warns():
    assert check(C.check_power_limit, h100(0, power_limit_mw=699_500)).verdict is Verdict.PASS  # rounding
    capped = check(C.check_power_limit, h100(0, power_limit_mw=500_000))
    assert capped.verdict is Verdict.WARN and "29 % below default" in capped.explanation


def test_pcie_generation_drop_is_normal_only_when_idle():
    assert check(C.check_pcie_link, h100(0, pcie_gen=1)).verdict is Verdict.PASS
    assert check(C.check_pcie_link, h100(0, pcie_gen=1, utilization_gpu=80)).verdict is Verdict.WARN
    assert check(C.check_pcie_link, h100(0, pcie_width=8)).verdict is Verdict.WARN


def test_pcie_replay_rate_over_the_window():
    gpu = h100(0, counters=Counters(at=10.0, pcie_replays=100))
    calm = check(C.check_pcie_link, gpu, GpuContext(later=Counters(at=70.0, pcie_replays=105)))
    noisy = check(C.check_pcie_link, gpu, GpuContext(later=Counters(at=70.0, pcie_replays=120)))
    assert calm.verdict is Verdict.PASS and noisy.verdict is Verdict.WARN


@pytest.mark.parametrize(("mode", "verdict"), [(0, Verdict.PASS), (1, Verdict.WARN), (2, Verdict.FAIL),
                                               (3, Verdict.WARN)])
def test_compute_modes(mode, verdict):
    result = check(C.check_compute_mode, h100(0, compute_mode=mode))
    assert result.verdict is verdict
    if mode == 3:
        assert "busy or unavailable" in result.explanation and result.observed == "Exclusive Process"


def test_ecc_mode_off_or_pending():
    assert check(C.check_ecc_mode, h100(0, ecc_mode=(False, False))).verdict is Verdict.WARN
    pending = check(C.check_ecc_mode, h100(0, ecc_mode=(True, False)))
    assert pending.verdict is Verdict.WARN and pending.observed == "on (pending off)"


def test_retired_pages_limit_and_pending():
    from remote_gpu_trainer.health.backend import RetiredPages

    assert check(C.check_retired_pages, h100(0, retired_pages=RetiredPages(30, 32, False))).verdict is Verdict.PASS
    assert check(C.check_retired_pages, h100(0, retired_pages=RetiredPages(30, 33, False))).verdict is Verdict.FAIL
    assert check(C.check_retired_pages, h100(0, retired_pages=RetiredPages(0, 1, True))).verdict is Verdict.FAIL


def test_recovery_action_names_the_action():
    result = check(C.check_recovery_action, h100(0, recovery_action=2))
    assert result.verdict is Verdict.FAIL and result.observed == "NODE_REBOOT"


def test_nvlink_link_down_is_fail_on_nvswitch_and_warn_on_a_bridge():
    links = (True,) * 17 + (False,)
    assert check(C.check_nvlink, h100(0, nvlink_active=links)).verdict is Verdict.FAIL
    bridge = h100(0, nvlink_active=(True, True, False, True), fabric=Fabric(0, 0))
    assert check(C.check_nvlink, bridge).verdict is Verdict.WARN
    unused = h100(0, nvlink_active=(False,) * 4, fabric=Fabric(0, 0))
    assert check(C.check_nvlink, unused).verdict is Verdict.SKIP


def test_nvlink_errors_over_the_window():
    gpu = h100(0, counters=Counters(at=0.0, nvlink_replay_errors=5, nvlink_recovery_errors=0, nvlink_crc_errors=0))
    later = Counters(at=1.0, nvlink_replay_errors=5, nvlink_recovery_errors=0, nvlink_crc_errors=20)
    assert check(C.check_nvlink, gpu, GpuContext(later=later)).verdict is Verdict.WARN  # 20 CRC/s < 100/s
    later = dataclasses.replace(later, nvlink_crc_errors=500)
    assert check(C.check_nvlink, gpu, GpuContext(later=later)).verdict is Verdict.FAIL
    later = dataclasses.replace(later, nvlink_crc_errors=0, nvlink_replay_errors=6)
    assert check(C.check_nvlink, gpu, GpuContext(later=later)).verdict is Verdict.FAIL


def test_unattributed_vram():
    empty = h100(0, memory=Memory(80 * GIB, 2 * GIB, 600 << 20), processes=())
    warn = check(C.check_vram_unattributed, empty, GpuContext(in_container=True))
    assert warn.verdict is Verdict.WARN and warn.entry.id == "GOT-07"
    assert check(C.check_vram_unattributed, h100(0)).verdict is Verdict.PASS


# Every signal a check reads, with each way it can be unreadable, must never produce PASS.
SIGNALS = {
    C.check_recovery_action: ["recovery_action"], C.check_ecc_mode: ["ecc_mode"],
    C.check_ecc_uncorrected: ["ecc_uncorrected_volatile"], C.check_row_remap: ["remapped_rows"],
    C.check_retired_pages: ["retired_pages"], C.check_inforom: ["inforom_valid"],
    C.check_temperature: ["temperature_c", "temp_slowdown_c", "temp_shutdown_c"],
    C.check_clock_events: ["clock_event_reasons"], C.check_power_limit: ["power_limit_mw", "power_default_limit_mw"],
    C.check_pcie_link: ["pcie_width", "pcie_max_width", "pcie_gen", "pcie_max_gen"],
    C.check_compute_mode: ["compute_mode"], C.check_persistence: ["persistence"], C.check_mig: ["mig_mode"],
    C.check_fabric: ["fabric"], C.check_nvlink: ["nvlink_active"], C.check_vram_processes: ["processes"],
    C.check_vram_unattributed: ["memory", "processes"],
}


def test_every_gpu_check_is_covered_by_the_unread_table():
    assert set(SIGNALS) == set(C.GPU_CHECKS)


@pytest.mark.parametrize("kind", list(ErrorKind))
@pytest.mark.parametrize("fn", list(SIGNALS), ids=lambda f: f.__name__)
def test_an_unreadable_signal_is_never_pass(fn, kind):
    for field in SIGNALS[fn]:
        gpu = h100(0, **{field: Unread(kind, f"nvmlX_{field}", "boom")})
        result = check(fn, gpu)
        assert result.verdict is not Verdict.PASS, (fn.__name__, field, kind, result)
        expected = Verdict.SKIP if kind in (ErrorKind.NOT_SUPPORTED, ErrorKind.FUNCTION_NOT_FOUND) else Verdict.UNKNOWN
        assert result.verdict is expected
        assert result.explanation


def test_every_entry_ref_names_an_existing_catalog_entry():
    from remote_gpu_trainer.paths import skill_root

    refs = [v for v in vars(C).values() if isinstance(v, C.EntryRef)]
    assert len(refs) >= 15
    for ref in refs:
        text = (skill_root() / ref.file).read_text()
        assert f"### {ref.id} " in text, ref


def test_no_driver_diagnosis_from_pci_and_device_files(tmp_path):
    from remote_gpu_trainer.health.probe import _where_the_gpu_went, pci_nvidia_gpus

    for address, vendor, klass in (("0000:3b:00.0", "0x10de", "0x030200"), ("0000:3c:00.0", "0x10de", "0x040300"),
                                   ("0000:00:02.0", "0x8086", "0x030000")):
        (tmp_path / address).mkdir()
        (tmp_path / address / "vendor").write_text(vendor + "\n")
        (tmp_path / address / "class").write_text(klass + "\n")
    assert pci_nvidia_gpus(str(tmp_path)) == ["0000:3b:00.0"]  # the NVIDIA audio function is not a GPU
    assert "no NVIDIA GPU is attached" in _where_the_gpu_went(False, False, in_container=False)
    assert "started without --gpus" in _where_the_gpu_went(True, False, in_container=True)
    assert "not installed or not loaded" in _where_the_gpu_went(True, False, in_container=False)
    assert "user-space library" in _where_the_gpu_went(True, True, in_container=True)
