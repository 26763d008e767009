"""gpu_health and reap_vram_zombies on a real NVIDIA GPU (skipped where NVML finds none).

These check what fakes cannot: that every NVML call the adapter makes exists with the signature it
uses on a real driver, that no check crashes (nor the NVML worker process: no call is skipped after a
crash), that the probe agrees with nvidia-smi, and that it is quick. Most go through the production
path (NvmlProcessBackend: the adapter in the NVML worker process); one runs the adapter in this
process. Run this file first and alone (bench/gpu_suite.sh does): an in-process native fault ends
pytest. Record `rgt health` output from such a machine in bench/RESULTS.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from remote_gpu_trainer import nvml_session
from remote_gpu_trainer.health.backend import NvmlProcessBackend, PynvmlBackend
from remote_gpu_trainer.health.checks import GPU_CHECKS
from remote_gpu_trainer.health.probe import probe
from remote_gpu_trainer.health.zombies import ReapInput, reap
from remote_gpu_trainer.models import Verdict

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", [NvmlProcessBackend, PynvmlBackend], ids=["worker-process", "in-process"])
def test_real_probe_reads_every_gpu_and_every_check(backend):
    report = probe(backend(), timeout_s=120)
    assert report.backend == "nvml" and report.gpus_found >= 1 and report.driver_version
    assert len(report.gpus) == report.gpus_found
    for gpu in report.gpus:
        names = [c.name for c in gpu.checks]
        if names == ["reachable"]:
            pytest.fail(f"GPU {gpu.index} not read: {gpu.checks[0]}")
        assert len(names) == len(GPU_CHECKS) + 2
        assert gpu.name and gpu.uuid and gpu.pci_bus_id and gpu.memory_total_bytes
        for check in gpu.checks:
            # an adapter/signature bug shows up as UNKNOWN "... failed: ..." from an unexpected error
            assert not (check.verdict is Verdict.UNKNOWN and "TypeError" in check.explanation), check
            assert "crashed the NVML worker" not in check.explanation, check
    assert report.exit_code in (0, 1, 3)
    assert nvml_session.session().restarts == 0 and not nvml_session.session().skipped


def test_probe_agrees_with_nvidia_smi():
    if not shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi not installed")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60)
    rows = [line.split(", ") for line in smi.stdout.strip().splitlines()]
    report = probe(NvmlProcessBackend(), timeout_s=120)
    assert [(g.uuid, g.pci_bus_id.upper()) for g in report.gpus] == [(r[1], r[2].upper()) for r in rows]


def test_second_probe_reuses_the_worker_and_is_fast():
    probe(NvmlProcessBackend(), timeout_s=120)
    pid = nvml_session.session().worker_pid
    again = probe(NvmlProcessBackend(), timeout_s=120)
    assert again.elapsed_s < 5 and nvml_session.session().worker_pid == pid


def test_only_the_worker_loads_libnvidia_ml_and_inforom_is_checked_once_per_boot(tmp_path, monkeypatch):
    monkeypatch.setenv("RGT_CACHE_DIR", str(tmp_path))
    nvml_session.reset_for_tests()  # a worker that sees this cache dir
    try:
        report = probe(NvmlProcessBackend(), timeout_s=120)
        pid = nvml_session.session().worker_pid
        assert "libnvidia-ml" in Path(f"/proc/{pid}/maps").read_text()
        saved = (tmp_path / "nvml-inforom.json").read_text()
        assert all(g.uuid in saved for g in report.gpus)
    finally:
        nvml_session.reset_for_tests()


def test_sampling_window_on_a_real_gpu():
    report = probe(NvmlProcessBackend(), timeout_s=120, sample_s=0.5)
    clock = next(c for c in report.gpus[0].checks if c.name == "clock_events")
    assert "in 0." in clock.observed or clock.verdict is Verdict.SKIP


def test_zombie_dry_run_on_a_real_gpu():
    report = reap(ReapInput(), NvmlProcessBackend())
    assert report.dry_run and report.gpus_found >= 1 and report.exit_code == 0


def test_rgt_health_cli_json_on_a_real_gpu():
    out = subprocess.run([sys.executable, "-m", "remote_gpu_trainer", "health", "--json"], capture_output=True,
                         text=True, timeout=300)
    data = json.loads(out.stdout)
    assert out.returncode == data["exit_code"] and data["gpus_found"] >= 1


def test_the_health_daemon_answers_as_the_normal_path_on_a_real_gpu(monkeypatch):
    """The first `rgt health` starts the warm daemon (healthd.py); the next is answered by it without pydantic,
    with the same checks and status (a real GPU's temperature and power move between two reads: not the bytes)."""
    from remote_gpu_trainer import healthd

    from .test_healthd import NOT_ANSWERED, daemon_pid, fast, rgt

    runtime = tempfile.mkdtemp(prefix="rgt-", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    monkeypatch.delenv(healthd.NO_DAEMON_ENV, raising=False)
    try:
        alone = rgt("health", "--json")
        pid = daemon_pid()
        served = fast("health", "--json")
        assert served.returncode not in (NOT_ANSWERED, 98), served.stderr
        assert served.returncode == alone.returncode
        mine, theirs = json.loads(served.stdout), json.loads(alone.stdout)
        assert [(g["index"], [c["name"] for c in g["checks"]]) for g in mine["gpus"]] == \
            [(g["index"], [c["name"] for c in g["checks"]]) for g in theirs["gpus"]]
        assert (mine["driver_version"], mine["gpus_found"]) == (theirs["driver_version"], theirs["gpus_found"])
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libcuda" not in maps and "torch" not in maps and "libnvidia-ml" not in maps
    finally:
        healthd.stop_all()
        shutil.rmtree(runtime, ignore_errors=True)
