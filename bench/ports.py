"""Port-holder discovery cost with 0 / 1,000 / 10,000 extra listening sockets, against ss and lsof.

A helper process holds N extra loopback listeners (the noise), another holds the target port.
Each method must answer "which pids listen on the target port", measured in the same run:

* ``rgt scan``        processes.ports.scan_ports: netlink sock_diag filtered by port in the kernel,
                      then an fd scan only for the matching inodes (what the tools use)
* ``rgt scan /proc``  the same with /proc/net/tcp{,6} parsing (the fallback where netlink is refused)
* ``rgt dry run``     the whole kill_port_holders dry run (scan + snapshots + tree + token)
* ``psutil``          psutil.net_connections("tcp") filtered to LISTEN on the port
* ``ss -ltnp``        as in the issue (all listeners, with processes); also filtered ``sport = :PORT``
* ``lsof``            ``lsof -nP -iTCP -sTCP:LISTEN`` as in the issue; also ``-t -iTCP:PORT``

Prints medians (ms) and each method's ratio to ``ss -ltnp`` in the same run; goal: ``rgt scan``
not slower than ``ss -ltnp`` at 10,000 sockets. Loopback only.

    python bench/ports.py [--counts 0 1000 10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from remote_gpu_trainer.processes.sockets import find_owners, read_sockets
from remote_gpu_trainer.processes.tool import SPECS

NOISE = """
import resource, socket, sys, time
count = int(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(count):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    held.append(s)
print("ready", flush=True)
time.sleep(3600)
"""
TARGET = """
import socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(3600)
"""


def _spawn(code: str, *args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def _scan_pids(port: int, backend: str = "auto") -> set[int]:
    sockets = read_sockets([port], backend=backend)
    owners = find_owners(entry.inode for entry in sockets)
    return {pid for entry in sockets for pid in owners.owners.get(entry.inode, ())}


def methods(port: int, target_pid: int) -> dict[str, Callable[[], bool]]:
    """Each returns True when it found the target pid (checked once, then timed)."""
    kill = next(s for s in SPECS if s.name == "kill_port_holders")
    found: dict[str, Callable[[], bool]] = {
        "rgt scan": lambda: target_pid in _scan_pids(port),
        "rgt scan /proc": lambda: target_pid in _scan_pids(port, "proc"),
        "rgt dry run": lambda: [t.pid for t in kill.call({"ports": [port]}).targets] == [target_pid],
        "psutil.net_connections": lambda: any(
            c.pid == target_pid for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port),
    }
    if shutil.which("ss"):
        found["ss -ltnp"] = lambda: f"pid={target_pid}," in _run(["ss", "-ltnp"])
        found["ss -Hltnp sport=:PORT"] = lambda: f"pid={target_pid}," in _run(["ss", "-Hltnp", f"sport = :{port}"])
    if shutil.which("lsof"):
        found["lsof -iTCP -sTCP:LISTEN"] = lambda: f" {target_pid} " in _run(["lsof", "-nP", "-iTCP", "-sTCP:LISTEN"])
        found["lsof -t -iTCP:PORT -sTCP:LISTEN"] = lambda: str(target_pid) in _run(
            ["lsof", "-nP", "-t", f"-iTCP:{port}", "-sTCP:LISTEN"]).split()
    found["baseline: spawn `true`"] = lambda: _run(["true"]) == ""
    return found


def measure(count: int, repeat: int) -> dict[str, float]:
    noise, ready = _spawn(NOISE, str(count))
    target, port_text = _spawn(TARGET)
    try:
        assert ready == "ready", "noise process failed (raise ulimit -n?)"
        port = int(port_text)
        table = methods(port, target.pid)
        for name, method in table.items():
            if not method():
                raise SystemExit(f"{name} did not find pid {target.pid} on port {port}")
        samples: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(repeat):  # interleaved, so load changes hit every method alike
            for name, method in table.items():
                start = time.perf_counter()
                method()
                samples[name].append(time.perf_counter() - start)
        return {name: statistics.median(values) * 1000 for name, values in samples.items()}
    finally:
        for proc in (noise, target):
            proc.kill()
            proc.wait()
            proc.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if max(args.counts) + 100 > hard:
        raise SystemExit(f"ulimit -n hard limit {hard} is too low for {max(args.counts)} sockets")
    results = {count: measure(count, args.repeat) for count in args.counts}
    names = list(next(iter(results.values())))
    reference = "ss -ltnp" if "ss -ltnp" in names else "psutil.net_connections"
    header = "| method | " + " | ".join(f"N={c:,} ms (×{reference})" for c in args.counts) + " |"
    print(f"median of {args.repeat}, {psutil.cpu_count()} CPUs, {len(psutil.pids())} processes; "
          f"ratio = method / {reference} in the same run\n")
    print(header)
    print("|" + "---|" * (len(args.counts) + 1))
    for name in names:
        cells = [f"{results[c][name]:.1f} ({results[c][name] / results[c][reference]:.2f}×)" for c in args.counts]
        print(f"| {name} | " + " | ".join(cells) + " |")
    verdict = results[max(args.counts)]["rgt scan"] <= results[max(args.counts)][reference]
    print(f"\ngoal (rgt scan <= {reference} at N={max(args.counts):,}): {'met' if verdict else 'NOT met'}")


if __name__ == "__main__":
    main()
