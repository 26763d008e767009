"""Pre-flight of 8 hosts vs the slowest single-host check, measured in the same run.

Each "host" is a child process running ``host_facts`` (health through a fake scenario, torch probe,
network), the same per-host work the ssh transport would start on a box. The fleet check is parallel,
so its cost should stay near the slowest host's: goal ≤ 2×.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_fleet import _port, local_caller

from remote_gpu_trainer.fleet.tool import PreflightInput, run_fleet

SCENARIOS = ["healthy-8xh100", "ecc-dbe", "driver-535-8xh100", "healthy-8xh100",
             "pcie-x8", "healthy-8xh100", "mig-on", "healthy-8xh100"]


def check(hosts: dict[str, str]) -> float:
    args = PreflightInput(hosts=list(hosts), head_addr="127.0.0.1", port=_port(), checkpoint_dir="/tmp",
                          concurrency=16)
    started = time.perf_counter()
    run_fleet(args, lambda *a, **k: None, caller=local_caller(hosts))
    return time.perf_counter() - started


def main() -> None:
    singles = [check({f"h{i}": s}) for i, s in enumerate(SCENARIOS)]
    fleet = check({f"h{i}": s for i, s in enumerate(SCENARIOS)})
    slowest = max(singles)
    print(f"single host: slowest {slowest:.2f} s, fastest {min(singles):.2f} s")
    print(f"8 hosts:     {fleet:.2f} s")
    print(f"ratio 8 hosts / slowest single: {fleet / slowest:.2f}x (goal <= 2x)")
    print(f"note: all 8 'hosts' share this machine's {os.cpu_count()} CPU(s) (each imports torch in a child); "
          "on real boxes each host has its own CPUs, so the ratio here is an upper bound")


if __name__ == "__main__":
    main()
