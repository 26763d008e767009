"""Issue 26 on a real GPU (``gpu`` marker: skipped without one). What the CPU tests cannot show: a run whose GPU
spins at full load while it makes no progress (a rank waiting in a collective looks like this) is declared
``stalled`` by its supervisor, with the busy GPU only as evidence, and box_idle reads the box ``stalled``, not
``busy``, because the only load on the GPU is that run's. One GPU is enough.

Run: ``python -m pytest tests/test_runs_gpu.py -q -s`` (under a minute; prints what it saw).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from remote_gpu_trainer.registry import all_specs

pytestmark = pytest.mark.gpu
TOOLS = {spec.name: spec for spec in all_specs()}
SPIN = """import torch
torch.ones(1, device="cuda")
print("step 1/100 loss 1.0", flush=True)
while True:  # busy kernels, no output: what a rank spinning in an NCCL collective looks like from outside
    torch.cuda._sleep(200_000_000)
    torch.cuda.synchronize()
"""


@pytest.fixture(autouse=True)
def _ledger(tmp_path, monkeypatch):
    for name, sub in (("RGT_RUNS_DIR", "runs"), ("RGT_GUARD_DIR", "guard"), ("RGT_CUSTODY_DIR", "custody")):
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.delenv("RGT_HEALTH_FAKE", raising=False)


def test_a_run_spinning_its_gpu_without_progress_is_stalled_and_the_box_is_not_busy(tmp_path):
    started = TOOLS["run_start"].call({"argv": [sys.executable, "-c", SPIN], "cwd": str(tmp_path), "name": "spin",
                                       "stall_after_s": 8, "skip_checks": ["port", "gpus"]})
    try:
        end = time.monotonic() + 120
        status = TOOLS["run_status"].call({"run_id": started.run_id})
        while status.state != "stalled" and time.monotonic() < end:
            time.sleep(1)
            status = TOOLS["run_status"].call({"run_id": started.run_id})
        idle = TOOLS["box_idle"].call({"window_s": 3, "interval_s": 0.5})
        busiest = max((g.util_max or 0 for g in idle.gpus), default=0)
        print(f"\nrun_status: {status.state} — {status.detail}\nbox_idle: {idle.verdict}, GPU util max {busiest} %, "
              f"processes {[p.pid for g in idle.gpus for p in g.processes]}, run pid {started.pid}")
        assert status.state == "stalled", status.detail
        assert busiest > 50, "the spinning kernels should keep the GPU busy while the run is stalled"
        if started.pid not in {p.pid for g in idle.gpus for p in g.processes}:
            pytest.skip("NVML lists host pids here (a container): the GPU's load cannot be tied to the run")
        assert idle.verdict == "stalled", idle.evidence
        assert "GPUs it holds at up to" in status.detail
    finally:
        os.kill(started.pid, signal.SIGKILL)
