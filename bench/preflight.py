"""Pre-flight of 8 hosts vs the slowest single-host check, through the real transport, in one run.

Eight loopback ssh boxes (tests/sshbox.py: OpenSSH sshd where installed, else asyncssh, each with its own
HOME, runtime and fake GPU scenario) are checked one at a time and then all together with the ``preflight``
logic (ssh → the box's runtime → ``host_facts``: health, a torch import in a child, network, the head's
port held while the workers connect). Sessions are warm in both cases (a warm-up round runs first), as in
a long-lived MCP server. The fleet check is parallel, so its cost should stay near the slowest host's:
goal ≤ 2×. ``--cold`` also closes every ssh session and ControlMaster before each measurement.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remote_gpu_trainer.fleet.tool import PreflightInput, run_fleet
from remote_gpu_trainer.processes.ports import suggest_free_port
from remote_gpu_trainer.remote.session import POOL
from tests.sshbox import SSHD, Fleet

SCENARIOS = ["healthy-8xh100", "ecc-dbe", "driver-535-8xh100", "healthy-8xh100",
             "pcie-x8", "healthy-8xh100", "mig-on", "healthy-8xh100"]


def drop_connections(fleet: Fleet) -> None:
    POOL.close_all()
    for alias in fleet.boxes:
        subprocess.run(["ssh", "-F", str(fleet.config), "-o", f"ControlPath={fleet.control_dir}/%C", "-O", "exit",
                        alias], capture_output=True, stdin=subprocess.DEVNULL, timeout=10, check=False)


def busy_cpu_s() -> float:
    """CPU-seconds spent by the whole machine so far (the boxes' processes are sshd's children, not ours)."""
    times = psutil.cpu_times()
    return times.user + times.system + getattr(times, "nice", 0.0)


def check(hosts: list[str], fleet: Fleet, cold: bool) -> tuple[float, str, float]:
    if cold:
        drop_connections(fleet)
    args = PreflightInput(hosts=hosts, port=suggest_free_port(29400, 500) or 29400, checkpoint_dir="/tmp",
                          concurrency=16, timeout_s=120)
    started, cpu = time.perf_counter(), busy_cpu_s()
    result = run_fleet(args, lambda *a, **k: None)
    took, cpu = time.perf_counter() - started, busy_cpu_s() - cpu
    unreachable = [r.host for r in result.hosts if not r.reachable]
    if unreachable:
        raise SystemExit(f"bench broken: {unreachable} unreachable: {result.hosts[0].error}")
    return took, result.verdict.value, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cold", action="store_true", help="new ssh connections and sessions for every check")
    parser.add_argument("--hosts", type=int, default=len(SCENARIOS), choices=range(2, len(SCENARIOS) + 1),
                        metavar=f"2..{len(SCENARIOS)}", help="fleet size (default: all 8)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rgt-bench-fleet-") as tmp:
        fleet = Fleet(Path(tmp))
        try:
            scenarios = SCENARIOS[:opts.hosts]
            aliases = [f"bench-{i}" for i in range(len(scenarios))]
            for alias, scenario in zip(aliases, scenarios, strict=True):
                fleet.add(alias, scenario=scenario)
            with fleet.environment():
                for alias in aliases:
                    fleet.install_runtime(alias)
                check(aliases, fleet, cold=False)  # warm-up: ssh masters, sessions, page cache
                runs = [check([alias], fleet, opts.cold) for alias in aliases]
                together, verdict, cpu = check(aliases, fleet, opts.cold)
        finally:
            fleet.close()
    singles = [took for took, _, _ in runs]
    slowest = max(singles)
    cpus = os.cpu_count() or 1
    server = "OpenSSH sshd" if SSHD else "asyncssh"
    print(f"transport: real ssh client → {server} on 127.0.0.1, {'cold' if opts.cold else 'warm'} sessions")
    n = len(singles)
    print(f"single host: slowest {slowest:.2f} s, fastest {min(singles):.2f} s, sum of all {n} {sum(singles):.2f} s")
    print(f"{n} hosts:     {together:.2f} s (fleet verdict {verdict}); machine CPU used {cpu:.1f} CPU-s = "
          f"{cpu / together:.2f} of {cpus} cores busy; CPU floor {cpu / cpus:.2f} s")
    ratio = together / slowest
    print(f"ratio {n} hosts / slowest single: {ratio:.2f}x (goal <= 2x); {n} hosts / serial sum: "
          f"{together / sum(singles):.2f}")
    if ratio > 2:
        print(f"MISSED: all {n} 'boxes' share this machine's {cpus} CPU(s): {n} box-side runtimes each import torch in "
              "a child and read fake NVML at once, so CPU time, not the fleet's waiting, sets the total. On real "
              "boxes each host has its own CPUs; the serial-sum ratio shows the work overlaps.")
    else:
        print(f"note: all {n} 'boxes' share this machine's {cpus} CPU(s); on real boxes each has its own, so the "
              "ratio here is an upper bound")


if __name__ == "__main__":
    main()
