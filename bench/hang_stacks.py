"""Stacks of every rank of a hung 8-rank job, gathered and grouped, vs one process's dump, in the same run.

Goal (issue "which rank is stuck"): all 8 ranks gathered and grouped in under 5 s. The job is
``tests/fixtures/runs/hang_scenarios.py getitem`` under torchrun with 8 gloo ranks on CPU, each with a
DataLoader worker (17 Python processes with the launcher); rank 1 hangs in ``__getitem__`` at step 3 and
the others wait in ``all_reduce``. It runs with the rank hook armed (as run_start arms it), so the
measurement is the mechanism run_stacks uses:

* ``gather+group, 1 sample``: one signal round over all 17 processes, parsed and judged;
* ``gather+group, run_stacks default``: 3 samples 0.25 s apart (0.5 s of it is the deliberate wait that
  tells moving from stuck), parsed and judged;
* baselines: one signal dump of one rank; one ``py-spy dump --nonblocking`` of one rank when py-spy is
  on PATH (``pip install py-spy``) or given with ``--py-spy``.

Usage: python bench/hang_stacks.py [--ranks 8] [--repeat 5] [--py-spy PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from remote_gpu_trainer.processes.snapshot import ProcessTable  # noqa: E402
from remote_gpu_trainer.runs.hang import judge  # noqa: E402
from remote_gpu_trainer.runs.stacks import collect, hook_env  # noqa: E402

SCENARIOS = ROOT / "tests" / "fixtures" / "runs" / "hang_scenarios.py"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--py-spy", default=shutil.which("py-spy"))
    args = parser.parse_args()
    run = Path(tempfile.mkdtemp(prefix="rgt-bench-hang-"))
    env = {**os.environ, **hook_env(run, dict(os.environ))}
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.ranks}",
            f"--master-port={_port()}", str(SCENARIOS), "getitem"]
    job = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=run,
                           start_new_session=True)
    pids: list[int] = []
    try:
        print(f"starting {args.ranks} gloo ranks (each with a DataLoader worker) …", flush=True)
        deadline = time.monotonic() + 300
        report = None
        while time.monotonic() < deadline:
            time.sleep(2)
            pids = [job.pid, *ProcessTable.read().descendants(job.pid)]
            report = judge(collect(pids, run / "stacks", samples=2, interval_s=0.2))
            if report.finding == "odd_ranks" and len(report.groups) == 2:
                break
        assert report is not None and report.finding == "odd_ranks", report and report.verdict
        print(f"hung: {report.verdict}")
        ranks = [p for p in report.processes if p.role == "rank"]
        rank0 = next(p.pid for p in ranks if p.rank == 0)
        print(f"{len(report.processes)} processes: {len(ranks)} ranks, "
              f"{sum(p.role == 'worker' for p in report.processes)} workers, the launcher\n")

        def one_round() -> None:
            assert judge(collect(pids, run / "stacks", samples=1)).finding == "odd_ranks"

        def default_run_stacks() -> None:
            assert judge(collect(pids, run / "stacks", samples=3, interval_s=0.25)).finding == "odd_ranks"

        def one_dump() -> None:
            assert collect([rank0], run / "stacks", samples=1)[0].threads

        rows = [("gather+group, 1 sample (all processes)", median_s(one_round, args.repeat)),
                ("gather+group, run_stacks default (3 samples)", median_s(default_run_stacks, args.repeat)),
                ("baseline: signal dump of one rank", median_s(one_dump, args.repeat))]
        if args.py_spy:
            def py_spy() -> None:
                subprocess.run([args.py_spy, "dump", "--nonblocking", "--pid", str(rank0)], check=True,
                               capture_output=True, timeout=30)
            rows.append(("baseline: py-spy dump --nonblocking of one rank", median_s(py_spy, args.repeat)))
        else:
            print("(py-spy not found: pass --py-spy PATH for that baseline)")
        base = rows[2][1]
        print(f"{'measurement':<50} {'median s':>9} {'× one dump':>11}")
        for name, seconds in rows:
            print(f"{name:<50} {seconds:>9.3f} {seconds / base:>11.1f}")
        if args.py_spy:
            print(f"\nrun_stacks default / one py-spy dump: {rows[1][1] / rows[3][1]:.1f}×; "
                  f"1-sample round / one py-spy dump: {rows[0][1] / rows[3][1]:.1f}×")
        verdict = "PASS" if rows[1][1] < 5.0 else "FAIL"
        print(f"goal: {args.ranks} ranks gathered and grouped in < 5 s: {verdict} ({rows[1][1]:.2f} s)")
        return 0 if verdict == "PASS" else 1
    finally:
        for pid in reversed(pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        job.wait()
        shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
