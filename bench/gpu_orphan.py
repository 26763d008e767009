"""A real orphaned CUDA process, reaped with its confirm token (a step of bench/gpu_suite.sh).

A launcher in its own session (like torchrun started from a shell) starts a worker that holds
``--gib`` GiB of CUDA memory; the launcher is SIGKILLed, so the worker is re-parented (to pid 1 or
the container's subreaper). Then ``rgt zombies`` must classify it ``orphan`` in a dry run, and the
real run with the dry run's token must end it and give the memory back. Prints one JSON line.
Needs CUDA; without it prints {"skipped": ...} and exits 0.

    python bench/gpu_orphan.py [--gib 2] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROLE_ENV = "RGT_ORPHAN_ROLE"


def worker(pid_file: Path, gib: float) -> None:
    import torch

    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    pid_file.write_text(str(os.getpid()))
    time.sleep(900)


def launcher(pid_file: Path, gib: float, log: Path) -> None:
    env = {**os.environ, ROLE_ENV: "worker"}
    with log.open("w") as out:  # never the suite's stdout: a live child would hold its tee open
        subprocess.Popen([sys.executable, __file__, "--pid-file", str(pid_file), "--gib", str(gib)], env=env,
                         stdout=out, stderr=subprocess.STDOUT)
    time.sleep(900)


def rgt(*args: str, timeout: float = 120) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "remote_gpu_trainer", *args, "--json"], capture_output=True,
                          text=True, timeout=timeout)
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        return done.returncode, {"error": (done.stdout + done.stderr)[-800:]}


def parent_of(pid: int) -> tuple[int, str]:
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    try:
        return ppid, Path(f"/proc/{ppid}/comm").read_text().strip()
    except OSError:
        return ppid, "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--work", default="/tmp/rgt-orphan")
    parser.add_argument("--pid-file")
    ns = parser.parse_args()
    role = os.environ.get(ROLE_ENV)
    if role == "worker":
        worker(Path(ns.pid_file), ns.gib)
        return 0
    work = Path(ns.work)
    work.mkdir(parents=True, exist_ok=True)
    pid_file = work / "worker.pid"
    if role == "launcher":
        launcher(pid_file, ns.gib, work / "worker.log")
        return 0
    try:
        import torch

        if not torch.cuda.is_available():
            print(json.dumps({"skipped": "torch sees no CUDA device"}))
            return 0
    except ImportError:
        print(json.dumps({"skipped": "torch is not installed"}))
        return 0
    pid_file.unlink(missing_ok=True)
    with (work / "launcher.log").open("w") as out:
        launch = subprocess.Popen([sys.executable, __file__, "--gib", str(ns.gib), "--work", str(work)],
                                  env={**os.environ, ROLE_ENV: "launcher"}, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=out)
    result: dict = {"gib": ns.gib}
    pid = None
    try:
        for _ in range(120):
            if pid_file.exists():
                break
            time.sleep(0.5)
        else:
            result["error"] = "the worker never held CUDA memory: " + (work / "worker.log").read_text()[-400:]
            return 1
        pid = int(pid_file.read_text())
        os.kill(launch.pid, signal.SIGKILL)
        launch.wait()
        time.sleep(1)
        result["worker_pid"], (result["parent_pid"], result["parent_name"]) = pid, parent_of(pid)
        code, dry = rgt("zombies", "--min-age-s", "0")
        mine = [h for h in dry.get("holders", []) if h.get("pid") == pid]
        result["dry_run"] = {"exit": code, "class": mine[0]["kind"] if mine else None,
                             "candidate": mine[0]["candidate"] if mine else None, "summary": dry.get("summary")}
        token = dry.get("confirm_token")
        if not token:
            result["error"] = "the dry run offered no confirm_token"
            return 1
        code, real = rgt("zombies", "--min-age-s", "0", "--no-dry-run", "--confirm-token", token)
        result["reap"] = {"exit": code, "summary": real.get("summary"),
                          "memory": [(m["gpu"], m["used_bytes_before"], m["used_bytes_after"])
                                     for m in real.get("memory", [])]}
        time.sleep(1)
        result["worker_gone"] = not Path(f"/proc/{pid}").exists()
        return 0 if result["worker_gone"] and result["dry_run"]["class"] == "orphan" else 1
    finally:
        if pid and Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)  # never leave it holding the GPU
        if launch.poll() is None:
            launch.kill()
        print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
