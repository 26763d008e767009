"""run_status on a 100 MB log vs `tail -c 64k` of that log, measured in the same run.

run_status must read only the log's tail (issue: ≤ 2x `ssh HOST tail -c 64k LOG` on a warm
connection). Locally the comparison is run_status in-process against a `tail -c 64k` subprocess;
with ``--host`` both go over ssh (the run is started on that box through the transport).

Usage: python bench/run_status.py [--size-mb 100] [--repeat 20] [--host HOST | --loopback]

``--loopback`` makes a loopback ssh box as the tests do (tests/sshbox.py) and uses it as the host. Over ssh
the baseline is ``tail -c 64k LOG`` through the same ssh options and ControlMaster connection as the tool.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

WRITER = """
import sys, time
line = b"step 123456/1000000 loss 1.2345 | 812.5 samples/s " + b"x" * 40 + b"\\n"
target = int(sys.argv[1]) << 20
with open(sys.stdout.fileno(), "wb", closefd=False) as out:
    written = 0
    while written < target:
        out.write(line * 1000)
        written += len(line) * 1000
    out.flush()
print("step 999/1000 loss 0.5", flush=True)
time.sleep(3600)
"""


def median_ms(fn, repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--host", default=None)
    parser.add_argument("--loopback", action="store_true", help="a loopback ssh box as the host")
    args = parser.parse_args()
    if args.loopback:
        return _on_loopback_box(args)
    return _measure(args)


def _on_loopback_box(args) -> int:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root / "tools"), str(root)]
    from tests.sshbox import Fleet

    fleet = Fleet(Path(tempfile.mkdtemp(prefix="rgt-bench-")))
    try:
        fleet.add("bench-box")
        with fleet.environment():
            fleet.install_runtime("bench-box")
            args.host = "bench-box"
            return _measure(args)
    finally:
        fleet.close()


def _measure(args) -> int:
    if not args.host:
        os.environ.setdefault("RGT_RUNS_DIR", tempfile.mkdtemp(prefix="rgt-bench-runs-"))
    from remote_gpu_trainer.runs.tool import SPECS

    tools = {s.name: s for s in SPECS}
    host = {"host": args.host} if args.host else {}
    started = tools["run_start"].call({"argv": ["python3", "-c", WRITER, str(args.size_mb)], "cwd": "/tmp", **host})
    try:
        log = started.log
        while True:
            status = tools["run_status"].call({"run_id": started.run_id, **host})
            if (status.log_bytes or 0) >= args.size_mb << 20 and status.progress and status.progress.step == 999:
                break
            time.sleep(0.2)
        if args.host:
            import shlex

            from remote_gpu_trainer.remote.hosts import parse_host
            from remote_gpu_trainer.remote.ssh import ssh_argv

            tail = ssh_argv(parse_host(args.host), f"tail -c 64k {shlex.quote(log)}")
        else:
            tail = ["tail", "-c", "64k", log]
        ours = median_ms(lambda: tools["run_status"].call({"run_id": started.run_id, **host}), args.repeat)
        base = median_ms(lambda: subprocess.run(tail, stdout=subprocess.DEVNULL, check=True), args.repeat)
        print(f"log {status.log_bytes / (1 << 20):.0f} MiB, progress read {status.progress.bytes_read} bytes")
        print(f"run_status        {ours:8.2f} ms (median of {args.repeat})")
        print(f"tail -c 64k       {base:8.2f} ms" + (" over ssh" if args.host else " (subprocess)"))
        print(f"ratio run_status / tail = {ours / base:.2f}  (target <= 2)")
    finally:
        dry = tools["run_stop"].call({"run_id": started.run_id, **host})
        if dry.confirm_token:
            tools["run_stop"].call({"run_id": started.run_id, "dry_run": False, "confirm_token": dry.confirm_token,
                                    "grace_s": 2, **host})
    return 0


if __name__ == "__main__":
    sys.exit(main())
