"""Hang forensics on a real GPU (``gpu`` marker: skipped without one). What the CPU tests cannot show:

* sampling ranks that hold a CUDA context and run kernels does not disturb them (they keep stepping);
* GPU placement through the real NVML: two ranks that both put their tensors on ``cuda:0`` are named as
  sharing GPU 0 (or, in a container whose NVML sees host pids, placement is reported unknown, not wrong);
* the flight recorder with NCCL: the hook's JSON dump holds ``nccl:all_reduce`` entries with NCCL's own
  states. One GPU is enough: a 1-rank NCCL group records its collectives; a hang between NCCL ranks (and
  NCCL's own dump on timeout) needs two GPUs and is not run here.

Run: ``python -m pytest tests/test_hang_gpu.py -q -s`` (about a minute; prints what it saw).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .test_hang_gloo import FIXTURES, TOOLS, _free_port, call, wait_status

pytestmark = pytest.mark.gpu


def _start(mode: str, ranks: int, tmp_path, **extra):
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", f"--master-port={_free_port()}",
            str(FIXTURES / "gpu_ranks.py"), mode]
    return call("run_start", argv=argv, cwd=str(tmp_path), name=f"gpu-{mode}", skip_checks=["port", "gpus"],
                allow_shared_gpus=True, **extra)


@pytest.fixture(autouse=True)
def _own_ledger(runs_dir):
    """Every test here gets its own run ledger (conftest.runs_dir: none of its runs is left running)."""


def test_cuda_ranks_keep_stepping_while_sampled_and_sharing_gpu0_is_named(tmp_path):
    run = _start("share", 2, tmp_path)
    wait_status(run.run_id, lambda s: (s.progress.step or 0) >= 5)
    for _ in range(8):
        report = call("run_stacks", run_id=run.run_id)
        assert report.finding == "progressing", report.verdict
    print(f"\nrun_stacks: {report.verdict} ({report.took_s} s)")
    before = call("run_status", run_id=run.run_id).progress.step
    status = wait_status(run.run_id, lambda s: (s.progress.step or 0) >= before + 20, timeout_s=120)
    assert status.state == "running"
    placement = status.placement
    print("placement:", placement.model_dump_json() if placement else None)
    print(TOOLS["run_status"].render_text(status))
    assert placement is not None
    if any(r.gpus for r in placement.ranks):
        assert [(r.rank, r.gpus) for r in placement.ranks] == [(0, [0]), (1, [0])]
        assert placement.findings[0].startswith("ranks 0, 1 share GPU 0")
        assert placement.gpus[0].util_percent is not None
    else:
        assert "placement unknown" in (placement.note or ""), placement


def test_nccl_flight_recorder_dump_on_a_stall(tmp_path):
    run = _start("nccl", 1, tmp_path, flight_recorder=True, stall_after_s=5)
    status = wait_status(run.run_id, lambda s: s.state == "stalled" and (s.progress.step or 0) >= 20
                   and s.hang is not None and s.hang.finding != "progressing")
    print(f"\nstall verdict: {status.hang.verdict}")
    folder = Path(status.log).parent / "flight_recorder"
    dumps = sorted(folder.glob("rank0-*.json"))
    assert dumps, list(folder.iterdir())
    dump = json.loads(dumps[-1].read_text())
    assert dump.get("entries"), f"{dumps[-1].name}: no entries; keys {sorted(dump)}"
    entries = dump["entries"]
    names = {e["profiling_name"] for e in entries}
    states = {e["state"] for e in entries}
    print(f"flight recorder: {len(entries)} entries, names {names}, states {states}")
    assert "nccl:all_reduce" in names and len(entries) >= 20
    report = call("run_stacks", run_id=run.run_id, samples=2)
    print(f"run_stacks: {report.verdict}; flight recorder: {report.flight_recorder.summary}")
    assert report.flight_recorder.mismatches == []
