"""Wall time of ``repro_scaler_bug`` against the floor of any torch repro, measured in the same run.

Floor = a fresh process that only imports torch and builds one optimizer (the first optimizer
imports ``torch._dynamo``, which every repro pays too). Measured = the tool's own path (worker
subprocess, every bug run and fix run, judging) for ``case=all`` without the distributed case,
and for every single-process variant. Runs alternate floor/measured so load changes hit both.
Goal: ``all`` single-process ≤ 1.5× the floor. The distributed case (2 forked gloo ranks per
run) is timed separately for information.

    python bench/repro.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from remote_gpu_trainer.repro.tool import plan, run_pairs
from remote_gpu_trainer.toolspec import no_progress

FLOOR = "import torch; torch.optim.SGD([torch.zeros(1, requires_grad=True)])"


def floor_s() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR], check=True, capture_output=True)
    return time.perf_counter() - start


def tool_s(pairs) -> float:
    start = time.perf_counter()
    results, _ = run_pairs(pairs, "cpu", 120.0, no_progress)
    elapsed = time.perf_counter() - start
    bad = [(r.variant, r.status) for r in results if r.status not in ("reproduced", "cuda_only") or not r.fixed_ok]
    if bad:
        raise SystemExit(f"repro failures, timing meaningless: {bad}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    defaults = [(c, v) for c, v in plan("all", None) if not c.distributed]
    every = [(c, v) for c, v in plan("all", "all") if not c.distributed]
    distributed = [(c, v) for c, v in plan("all", None) if c.distributed]
    series: dict[str, list[float]] = {"floor": [], "all": [], "every": [], "distributed": []}
    floor_s(), tool_s(defaults[:1])  # warm the page cache for both
    for _ in range(args.runs):
        series["floor"].append(floor_s())
        series["all"].append(tool_s(defaults))
        series["every"].append(tool_s(every))
        series["distributed"].append(tool_s(distributed))
    med = {k: statistics.median(v) for k, v in series.items()}
    print(f"runs: {args.runs} (median wall seconds)")
    print(f"floor (python + import torch + first optimizer): {med['floor']:.2f} s")
    print(f"repro all, {len(defaults)} single-process cases (bug + fix each): {med['all']:.2f} s  "
          f"ratio {med['all'] / med['floor']:.2f}x  (goal <= 1.5x)")
    print(f"repro every single-process variant ({len(every)}): {med['every']:.2f} s  "
          f"ratio {med['every'] / med['floor']:.2f}x")
    print(f"fsdp_ddp_double_wrap default variant (2 gloo ranks, bug + fix): {med['distributed']:.2f} s  "
          f"ratio {med['distributed'] / med['floor']:.2f}x")


if __name__ == "__main__":
    main()
