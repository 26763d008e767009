"""The real adapter, the real NVML worker process and the real pynvml against NVML's C ABI.

A fake ``libnvidia-ml.so.1`` (tests/nvml_fake/fake_nvml.c) is compiled once per session against
NVIDIA's own nvml.h and loaded by the unmodified pynvml in the worker process. Python-level fakes
accept a struct passed by value as happily as a pointer; this one reads through the pointer and
checks versioned structs' version words, as NVML does, so the by-value fabric call that segfaulted a
real H100 fails here. Its answers come from the Python scenarios (health/fakes.py), so every scenario
must give the same verdicts through the C ABI as through the Python fake.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote_gpu_trainer import nvml_session
from remote_gpu_trainer.health.backend import Fabric, NvmlProcessBackend, Unread
from remote_gpu_trainer.health.fakes import SCENARIOS, scenario
from remote_gpu_trainer.health.probe import probe
from remote_gpu_trainer.health.tool import SPECS as HEALTH_SPECS
from remote_gpu_trainer.health.zombies import ReapInput, reap
from remote_gpu_trainer.idle.sampling import sample
from remote_gpu_trainer.models import Verdict
from remote_gpu_trainer.render.gpus import local_gpus
from tests.nvml_fake import environment, write_scenario

from .conftest import call_ok

GPU_HEALTH = HEALTH_SPECS[0]
ROOT = Path(__file__).resolve().parents[1]


def _ready() -> None:
    """Start the worker with a generous limit, so a test's short timeout_s times the call, not our start."""
    assert NvmlProcessBackend().open(60).ok


def _verdicts(report) -> dict[str, str]:
    """Every check's verdict by GPU and name; the C ABI may word an unread signal differently."""
    out = {f"host.{c.name}": c.verdict.value for c in report.host_checks}
    for gpu in report.gpus:
        out.update({f"gpu{gpu.index}.{c.name}": c.verdict.value for c in gpu.checks})
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_gives_the_same_verdicts_through_the_c_abi(fake_nvml, name):
    fake_nvml(name, hang_s=30)
    python_fake = scenario(name)
    if python_fake.backend.status.ok:
        _ready()
    timeout = 1.0 if python_fake.backend.hang_on else 10.0
    kwargs = dict(processes=python_fake.processes, kernel_log=python_fake.read_kernel_log, timeout_s=timeout)
    through_c = probe(NvmlProcessBackend(), **kwargs)
    python_fake.backend.release.set()  # a hung Python fake lets go (the C one is killed by the session)
    expected = probe(scenario(name).backend, **kwargs)
    assert through_c.backend == "nvml"
    assert _verdicts(through_c) == _verdicts(expected)
    assert through_c.verdict == expected.verdict and through_c.exit_code == expected.exit_code
    assert nvml_session.session().restarts == 0  # no call crashed the worker


def test_the_healthy_board_reads_in_full_through_pynvml_and_the_c_abi(fake_nvml):
    """Every field the adapter reads, from the header's structs: fabric via ctypes.byref, the memory v2
    and process structs, field values, violation times."""
    fake_nvml("zombie-orphan-namespaced")
    backend = NvmlProcessBackend()
    assert backend.open(10).ok
    want = scenario("zombie-orphan-namespaced").backend.gpus
    for index in (0, 1, 5):
        got = backend.worker.call(lambda i=index: backend.read_gpu(i), "test", 10)
        assert got.fabric == Fabric(state=3, status=0)  # NVSwitch fabric completed
        assert got.memory == want[index].memory and got.processes == want[index].processes
        assert (got.name, got.uuid, got.pci_bus_id, got.nvlink_active) == \
            (want[index].name, want[index].uuid, want[index].pci_bus_id, want[index].nvlink_active)
        assert isinstance(got.retired_pages, Unread) and got.retired_pages.kind.value == "not_supported"
    assert nvml_session.session().restarts == 0


# --- the by-value struct (issue 27) ---------------------------------------------------------------------

FABRIC_CALL = """
import ctypes, sys
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
info = pynvml.c_nvmlGpuFabricInfoV_t()
info.version = pynvml.nvmlGpuFabricInfo_v2
argument = ctypes.byref(info) if sys.argv[1] == "pointer" else info
try:
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, argument)
except pynvml.NVMLError as err:
    print("refused", err.value, err)
    sys.exit(0)
print("state", int(info.state) & 0xFF)
"""


def _child(code: str, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


@pytest.fixture
def fake_env(nvml_fake_lib, tmp_path) -> dict[str, str]:
    return environment(nvml_fake_lib, write_scenario("healthy-8xh100", tmp_path / "healthy.nvml"))


def test_a_struct_passed_by_value_is_refused_or_crashes_at_the_c_abi(fake_env):
    by_value = _child(FABRIC_CALL, "value", env=fake_env)
    crashed = by_value.returncode < 0
    refused = by_value.returncode == 0 and by_value.stdout.startswith("refused")
    assert crashed or refused, (by_value.returncode, by_value.stdout, by_value.stderr)
    by_pointer = _child(FABRIC_CALL, "pointer", env=fake_env)
    assert by_pointer.returncode == 0 and by_pointer.stdout.split() == ["state", "3"], by_pointer


REVERTED_ADAPTER = """
import ctypes
from remote_gpu_trainer.health import backend
from remote_gpu_trainer.nvml_worker import open_nvml
assert open_nvml().ok
# The adapter as it was before issue 27. _fabric imports ctypes when called and looks byref up then; pynvml,
# imported by open_nvml above, keeps the byref it bound at its own import.
ctypes.byref = lambda struct: struct
print(backend.PynvmlBackend().read_gpu(0).fabric)
"""


def test_reverting_the_byref_fix_fails_here(fake_env):
    """The adapter with the fix reverted (struct by value), in a child: it must not read the fabric."""
    reverted = _child(REVERTED_ADAPTER, env={**fake_env, "PYTHONPATH": str(ROOT / "tools")})
    assert reverted.returncode < 0 or "Fabric(state=3" not in reverted.stdout, reverted.stdout
    fixed = _child(REVERTED_ADAPTER.replace("ctypes.byref = ", "_ = "), env={**fake_env,
                                                                                "PYTHONPATH": str(ROOT / "tools")})
    assert fixed.returncode == 0 and "Fabric(state=3, status=0)" in fixed.stdout, fixed.stderr


# --- faults inside one NVML call: never the caller ---------------------------------------------------


def _check(report, gpu: int, name: str):
    return next(c for c in report.gpus[gpu].checks if c.name == name)


def test_a_segfault_in_one_call_costs_that_check_and_the_next_call_works(fake_nvml):
    fake_nvml("healthy-8xh100", fault="segv:nvmlDeviceGetGpuFabricInfoV@3")
    first = GPU_HEALTH.call({})
    fabric = _check(first, 3, "fabric")
    assert fabric.verdict is Verdict.UNKNOWN and "nvmlDeviceGetGpuFabricInfoV" in fabric.explanation
    assert "SIGSEGV" in fabric.explanation
    assert first.verdict is Verdict.UNKNOWN and "GPU 3 fabric" in first.summary
    assert all(c.verdict in (Verdict.PASS, Verdict.SKIP) for g in first.gpus for c in g.checks if c is not fabric)
    assert nvml_session.session().restarts == 1
    pid = nvml_session.session().worker_pid
    started = time.monotonic()
    second = GPU_HEALTH.call({})  # the same worker answers at once; the crashing call stays skipped
    assert time.monotonic() - started < 5 and nvml_session.session().worker_pid == pid
    assert _verdicts(second) == _verdicts(first) and nvml_session.session().restarts == 1


def test_a_skipped_handle_call_makes_that_gpu_unknown_not_lost(fake_nvml):
    """After nvmlDeviceGetHandleByIndex crashed the worker it is skipped: that says nothing about the GPU, so its
    verdict is UNKNOWN naming the call, never FAIL "lost (XID 79), move the job"."""
    fake_nvml("healthy-8xh100", fault="segv:nvmlDeviceGetHandleByIndex_v2@3")
    report = GPU_HEALTH.call({})
    reachable = _check(report, 3, "reachable")
    assert reachable.verdict is Verdict.UNKNOWN, reachable
    assert "nvmlDeviceGetHandleByIndex" in reachable.observed and "SIGSEGV" in reachable.observed
    assert "XID 79" not in reachable.explanation and report.verdict is Verdict.UNKNOWN
    assert all(c.verdict in (Verdict.PASS, Verdict.SKIP) for g in report.gpus if g.index != 3 for c in g.checks)


def test_a_segfault_on_every_gpu_is_survived_once_per_gpu(fake_nvml):
    fake_nvml("healthy-8xh100", fault="segv:nvmlDeviceGetRemappedRows", once=False)
    report = GPU_HEALTH.call({})
    rows = [_check(report, i, "row_remap") for i in range(8)]
    assert all(c.verdict is Verdict.UNKNOWN and "nvmlDeviceGetRemappedRows" in c.explanation for c in rows)
    assert nvml_session.session().restarts == 8
    assert _check(report, 0, "temperature").verdict is Verdict.PASS


def test_a_hang_in_one_call_is_fail_naming_it_and_the_next_call_gets_a_fresh_worker(fake_nvml):
    fake_nvml("healthy-8xh100", fault="hang:nvmlDeviceGetTemperature@2", hang_s=60)
    _ready()
    started = time.monotonic()
    first = GPU_HEALTH.call({"timeout_s": 1})
    assert time.monotonic() - started < 10
    reachable = _check(first, 2, "reachable")
    assert reachable.verdict is Verdict.FAIL and "nvmlDeviceGetTemperature (GPU 2)" in reachable.observed
    assert first.verdict is Verdict.FAIL and first.gpus[0].verdict is Verdict.PASS
    pid = nvml_session.session().worker_pid
    second = GPU_HEALTH.call({"timeout_s": 5})
    assert second.verdict is Verdict.PASS and nvml_session.session().worker_pid != pid


def test_a_worker_that_survives_sigkill_is_abandoned_and_reported_not_waited_for(fake_nvml, monkeypatch):
    """A process in D state ignores SIGKILL until the driver lets go; simulated by a kill that does nothing."""
    fake_nvml("healthy-8xh100", fault="hang:nvmlDeviceGetTemperature@0", hang_s=60)
    _ready()
    real_kill = nvml_session._Worker.kill
    monkeypatch.setattr(nvml_session._Worker, "kill", lambda self: None)
    first = GPU_HEALTH.call({"timeout_s": 1})
    assert _check(first, 0, "reachable").verdict is Verdict.FAIL
    started = time.monotonic()
    again = GPU_HEALTH.call({"timeout_s": 5})  # told at once, no second stuck worker
    assert time.monotonic() - started < 2
    reachable = _check(again, 0, "reachable")
    assert "still stuck" in reachable.observed and "nvmlDeviceGetTemperature (GPU 0)" in reachable.observed
    stuck = nvml_session.session()._abandoned[0][0]
    real_kill(stuck)  # the driver lets go
    for _ in range(100):
        if stuck.process.poll() is not None:
            break
        time.sleep(0.05)
    assert GPU_HEALTH.call({"timeout_s": 5}).verdict is Verdict.PASS


@pytest.mark.anyio
async def test_over_mcp_a_segfault_and_a_hang_are_answers_and_the_server_lives_on(client, fake_nvml):
    fake_nvml("healthy-8xh100", fault="segv:nvmlDeviceGetPersistenceMode@1")
    data = await call_ok(client, "gpu_health")
    assert data["verdict"] == "UNKNOWN" and "GPU 1 persistence_mode" in data["summary"]
    check = next(c for c in data["gpus"][1]["checks"] if c["name"] == "persistence_mode")
    assert "nvmlDeviceGetPersistenceMode" in check["explanation"] and "SIGSEGV" in check["explanation"]
    assert (await call_ok(client, "gpu_health"))["verdict"] == "UNKNOWN"  # answered again, same skip
    fake_nvml("healthy-8xh100", fault="hang:nvmlDeviceGetUUID@0", hang_s=60)
    _ready()
    data = await call_ok(client, "gpu_health", {"timeout_s": 1})
    assert data["verdict"] == "FAIL" and "nvmlDeviceGetUUID (GPU 0)" in data["gpus"][0]["checks"][0]["observed"]
    assert (await call_ok(client, "gpu_health", {"timeout_s": 5}))["verdict"] == "PASS"
    assert (await call_ok(client, "skill_info"))["name"]  # every other tool still answers


# --- the other NVML users through the C ABI --------------------------------------------------------------


def test_reap_dry_run_classifies_the_same_through_the_c_abi(fake_nvml):
    fake_nvml("zombie-orphan-namespaced")
    python_fake = scenario("zombie-orphan-namespaced")
    through_c = reap(ReapInput(), NvmlProcessBackend(), processes=python_fake.processes, kill_step=None)
    expected = reap(ReapInput(), scenario("zombie-orphan-namespaced").backend, processes=python_fake.processes,
                    kill_step=None)
    assert [(h.gpu, h.pid, h.kind, h.candidate) for h in through_c.holders] == \
        [(h.gpu, h.pid, h.kind, h.candidate) for h in expected.holders]
    assert through_c.summary == expected.summary and through_c.dry_run


def test_reap_tool_on_this_machine_with_the_c_abi(fake_nvml):
    fake_nvml("healthy-8xh100")
    from remote_gpu_trainer.health.tool import SPECS

    report = SPECS[1].call({})
    assert report.backend == "nvml" and report.dry_run and not report.holders


def test_idle_sampling_reads_utilisation_and_power_through_the_c_abi(fake_nvml):
    fake_nvml("idle-8xh100")
    assert NvmlProcessBackend().open(10).ok  # the window should not include the worker's start
    window = sample(0.3, 0.1, backend=NvmlProcessBackend())
    assert window.ok and len(window.gpus) == 8 and window.samples >= 2
    assert all(g.util_max == 0 and g.power_w_mean == 70 for g in window.gpus)
    fake_nvml("busy-8xh100")
    window = sample(0, backend=NvmlProcessBackend())
    assert [g.util_max for g in window.gpus] == [97] * 8 and window.gpus[3].processes == {7004: 70 << 30}


def test_box_idle_tool_through_the_c_abi(fake_nvml, tmp_path, monkeypatch):
    monkeypatch.setenv("RGT_RUNS_DIR", str(tmp_path))
    fake_nvml("busy-8xh100")
    from remote_gpu_trainer.idle.tool import SPECS

    result = SPECS[0].call({"window_s": 0})
    assert result.verdict == "busy" and all(g.util_max == 97 for g in result.gpus)


def test_idle_sampling_after_a_crash_is_still_an_answer(fake_nvml):
    fake_nvml("busy-8xh100", fault="segv:nvmlDeviceGetUtilizationRates@0")
    window = sample(0, backend=NvmlProcessBackend())
    assert window.ok and window.gpus[0].util_max is None and window.gpus[1].util_max == 97


def test_render_reads_names_and_compute_capability_through_the_c_abi(fake_nvml):
    fake_nvml("container-healthy")
    gpus = local_gpus({})
    assert gpus.source == "nvml" and gpus.names == ["NVIDIA H100 80GB HBM3"] and gpus.capabilities == [(9, 0)]


def test_inforom_is_validated_once_per_boot(fake_nvml, monkeypatch):
    fake_nvml("healthy-8xh100")
    assert GPU_HEALTH.call({}).verdict is Verdict.PASS
    cache = Path(os.environ["RGT_CACHE_DIR"]) / "nvml-inforom.json"
    assert cache.is_file() and Path("/proc/sys/kernel/random/boot_id").read_text().strip() in cache.read_text()
    # A new worker (a fresh `rgt health`) in the same boot never calls it again: a crash there would show.
    nvml_session.reset_for_tests()
    monkeypatch.setenv("RGT_FAKE_NVML_FAULT", "segv:nvmlDeviceValidateInforom")
    monkeypatch.setenv("RGT_FAKE_NVML_FAULT_ONCE", "")
    report = GPU_HEALTH.call({})
    assert report.verdict is Verdict.PASS and nvml_session.session().restarts == 0
    assert _check(report, 0, "inforom").observed == "valid"


def test_cli_table_survives_a_crash(fake_nvml, nvml_fake_lib, tmp_path):
    """`rgt health` as a fresh process: the table prints, naming the call, exit 3 (UNKNOWN)."""
    fake_nvml("healthy-8xh100")
    env = environment(nvml_fake_lib, tmp_path / "healthy-8xh100.nvml", "segv:nvmlDeviceGetEccMode@0")
    env["RGT_CACHE_DIR"] = str(tmp_path / "cli-cache")
    done = subprocess.run([sys.executable, "-m", "remote_gpu_trainer", "health"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})
    assert done.returncode == 3, done.stdout + done.stderr
    assert "nvmlDeviceGetEccMode" in done.stdout and "SIGSEGV" in done.stdout
    assert "exit 3: some signals unreadable" in done.stdout
