#!/usr/bin/env python3
"""check_staleness.py — is a training run alive AND making progress? One bounded, read-only poll.

"The process exists" and "the GPU shows 100 %" are not progress: a NCCL wait spins at 100 %, a
deadlocked DataLoader keeps the process alive forever (MON-04, MON-11). This script combines:

* the run's own record, as written by the run_one launcher: ``pgid`` (its process group),
  ``token`` (an id every process of the run carries in its environment as RGT_RUN_TOKEN, so a
  reused process-group id is not mistaken for the run), ``exit_code`` and ``state``;
* progress: the age of ``heartbeat`` (the training loop touches it every step or N steps; its
  text may be "STEP UNIX_TIME") or, without one, of the log file;
* optionally the GPUs (``--gpu``): utilisation and memory from nvidia-smi, to tell a NCCL spin
  (stale at high utilisation) from an I/O or DataLoader stall (stale at 0 %).

It never matches processes by name (a watcher that does counts itself, MON-03). Python 3 standard
library only.

Exit status: 0 running and fresh · 1 needs attention (stale, stopped, dead without an exit code,
or finished with a non-zero exit code) · 2 bad usage · 3 finished with exit code 0 (verify the
artifacts next: verify_local.py) · 4 unknown (no process record, no log: nothing to judge).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

EXIT_RUNNING, EXIT_ATTENTION, EXIT_USAGE, EXIT_FINISHED, EXIT_UNKNOWN = 0, 1, 2, 3, 4
BUSY_GPU_PERCENT = 50


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="check_staleness.py",
        description="Is a run alive and progressing? Reads RUN_DIR/{pgid,token,exit_code,state,heartbeat,train.log} "
        "(the run_one launcher's layout); each can be overridden.",
        epilog="Exit status: 0 running and fresh, 1 needs attention (stale/stopped/dead/failed), 2 bad usage, "
        "3 finished with exit code 0, 4 unknown (nothing to judge).",
    )
    parser.add_argument("run_dir", nargs="?", type=Path, help="run directory (default: none; give --pid/--log)")
    parser.add_argument("--max-age", type=float, default=600.0,
                        help="seconds without a heartbeat/log update before the run counts as stale (default 600; "
                        "about 10x the usual step or logging interval)")
    parser.add_argument("--log", type=Path, help="log file (default RUN_DIR/train.log)")
    parser.add_argument("--heartbeat", type=Path, help="heartbeat file (default RUN_DIR/heartbeat)")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--pid", type=int, help="a single process to check instead of RUN_DIR/pgid")
    who.add_argument("--pgid", type=int, help="a process group to check instead of RUN_DIR/pgid")
    parser.add_argument("--gpu", action="store_true", help="also read GPU utilisation with nvidia-smi")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.max_age <= 0:
        parser.error("--max-age must be > 0")
    if args.run_dir is None and args.pid is None and args.pgid is None and args.log is None:
        parser.error("give RUN_DIR, or --pid/--pgid and --log")
    if args.run_dir is not None and not args.run_dir.is_dir():
        parser.error(f"RUN_DIR {args.run_dir} is not a directory")
    return args


def read_text(path: Path | None) -> str | None:
    try:
        return path.read_text().strip() if path else None
    except OSError:
        return None


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) from /proc/PID/stat, or None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[2])


def group_members(pgid: int) -> dict[int, str]:
    """pid -> state letter of every visible process in process group ``pgid``."""
    members = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat and stat[1] == pgid:
                members[int(entry.name)] = stat[0]
    return members


def carries_token(pid: int, token: str) -> bool | None:
    """Does PID's environment hold RGT_RUN_TOKEN=token? None when the environment is unreadable."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return f"RGT_RUN_TOKEN={token}".encode() in environ.split(b"\0")


def liveness(args: argparse.Namespace, run_dir: Path | None) -> dict:
    """What the process record says: alive?, members and their states, and why."""
    if args.pid is not None:
        stat = proc_stat(args.pid)
        if stat is None or stat[0] == "Z":
            return {"alive": False, "detail": f"pid {args.pid} is gone" + (" (zombie)" if stat else "")}
        return {"alive": True, "states": {args.pid: stat[0]}, "detail": f"pid {args.pid} state {stat[0]}"}
    pgid_text = str(args.pgid) if args.pgid is not None else read_text(run_dir / "pgid" if run_dir else None)
    if not pgid_text:
        return {"alive": None, "detail": "no pgid recorded"}
    if not pgid_text.isdigit():
        return {"alive": None, "detail": f"pgid file holds {pgid_text!r}, not a number"}
    pgid = int(pgid_text)
    members = {pid: state for pid, state in group_members(pgid).items() if state != "Z"}
    if not members:
        return {"alive": False, "pgid": pgid, "detail": f"no live process in group {pgid}"}
    token = read_text(run_dir / "token" if run_dir else None)
    if token:
        verdicts = [carries_token(pid, token) for pid in members]
        if verdicts and all(v is False for v in verdicts):
            return {"alive": False, "pgid": pgid, "detail": f"group {pgid} now belongs to other processes "
                    f"(no RGT_RUN_TOKEN={token}): the run is gone"}
    return {"alive": True, "pgid": pgid, "states": members,
            "detail": f"group {pgid}: {len(members)} process(es), states {''.join(sorted(set(members.values())))}"}


def progress(args: argparse.Namespace, run_dir: Path | None, now: float) -> dict:
    """Age of the newest progress signal: the heartbeat when it exists, else the log."""
    heartbeat = args.heartbeat or (run_dir / "heartbeat" if run_dir else None)
    log = args.log or (run_dir / "train.log" if run_dir else None)
    for kind, path in (("heartbeat", heartbeat), ("log", log)):
        if path is None:
            continue
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        found = {"source": kind, "path": str(path), "age_s": round(max(0.0, now - mtime), 1)}
        if kind == "heartbeat":
            parts = (read_text(path) or "").split()
            if parts and parts[0].lstrip("-").isdigit():
                found["step"] = int(parts[0])
        else:
            found["last_line"] = last_line(path)
        return found
    return {"source": None, "age_s": None}


def last_line(path: Path, limit: int = 4096) -> str:
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - limit))
        lines = [line for line in handle.read().replace(b"\r", b"\n").split(b"\n") if line.strip()]
    return lines[-1].decode(errors="replace")[:200] if lines else ""


def gpu_activity() -> dict:
    """Utilisation and memory per GPU; in a container nvidia-smi's PIDs are host PIDs, so no attribution."""
    if shutil.which("nvidia-smi") is None:
        return {"read": False, "detail": "nvidia-smi not found"}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return {"read": False, "detail": "nvidia-smi did not answer in 20 s (GOT-23)"}
    if out.returncode != 0:
        return {"read": False, "detail": (out.stdout + out.stderr).strip().splitlines()[0][:200]}
    gpus = []
    for line in out.stdout.strip().splitlines():
        index, util, mem = (part.strip() for part in line.split(","))
        gpus.append({"index": int(index), "util_percent": int(util) if util.isdigit() else None,
                     "memory_used_mib": int(mem) if mem.isdigit() else None})
    return {"read": True, "gpus": gpus}


def judge(alive: dict, prog: dict, exit_code: str | None, gpu: dict | None, max_age: float) -> tuple[str, int, str]:
    """(state, exit status, explanation)."""
    if alive["alive"] is not True:
        if exit_code is not None:
            if exit_code == "0":
                return "finished", EXIT_FINISHED, "exit code 0: verify the artifacts (verify_local.py), not the log"
            return "failed", EXIT_ATTENTION, (f"exit code {exit_code}: 137=SIGKILL (OOM?), 143=SIGTERM, "
                                              "129=SIGHUP (MON-06)")
        if alive["alive"] is False:
            return "dead", EXIT_ATTENTION, ("no process and no exit_code: killed hard (SIGKILL, OOM killer, reboot or "
                                            "container restart); check memory.events / dmesg, then relaunch to resume")
        if prog["age_s"] is None:
            return "unknown", EXIT_UNKNOWN, "no process record and no log/heartbeat: nothing to judge"
    states = set((alive.get("states") or {}).values())
    if states and states <= {"T", "t"}:
        return "stopped", EXIT_ATTENTION, "every process of the run is stopped (SIGSTOP / job control): kill -CONT it"
    if prog["age_s"] is None:
        if alive["alive"]:
            return "running", EXIT_RUNNING, "alive, but no heartbeat or log to measure progress: add a heartbeat"
        return "unknown", EXIT_UNKNOWN, "no process record; no heartbeat or log"
    if prog["age_s"] > max_age:
        hint = "no progress"
        if gpu and gpu.get("read"):
            utils = [g["util_percent"] for g in gpu["gpus"] if g["util_percent"] is not None]
            if utils and max(utils) >= BUSY_GPU_PERCENT:
                hint += f"; GPUs busy ({max(utils)} %): a collective waiting on a missing rank? (MON-11, NODE-07)"
            elif utils:
                hint += (f"; GPUs idle ({max(utils)} %): DataLoader deadlock or I/O stall? "
                         "py-spy dump the ranks (MON-04)")
        if "D" in states:
            hint += "; a process is in D state (blocked in the kernel: filesystem or driver)"
        if alive["alive"] is None:
            return "stale", EXIT_ATTENTION, f"{prog['source']} is {prog['age_s']:.0f}s old (> {max_age:g}s) and " \
                                            "no process record: it probably died"
        age = f"{prog['source']} is {prog['age_s']:.0f}s old (> {max_age:g}s)"
        return "stale", EXIT_ATTENTION, f"alive but {age}: {hint}"
    unconfirmed = "" if alive["alive"] else " (no process record to confirm it is alive)"
    return "running", EXIT_RUNNING, f"{prog['source']} updated {prog['age_s']:.0f}s ago{unconfirmed}"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    now = time.time()
    run_dir = args.run_dir
    alive = liveness(args, run_dir)
    prog = progress(args, run_dir, now)
    exit_code = read_text(run_dir / "exit_code" if run_dir else None)
    gpu = gpu_activity() if args.gpu else None
    state, status, why = judge(alive, prog, exit_code, gpu, args.max_age)
    report = {"state": state, "exit_status": status, "why": why, "process": alive, "progress": prog,
              "exit_code": exit_code, "gpu": gpu, "run_state_file": read_text(run_dir / "state" if run_dir else None)}
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return status
    print(f"{state.upper()}: {why}")
    print(f"  process:  {alive['detail']}")
    if prog["source"]:
        step = f", step {prog['step']}" if "step" in prog else ""
        print(f"  progress: {prog['source']} {prog['path']} updated {prog['age_s']:.0f}s ago{step}")
        if prog.get("last_line"):
            print(f"  last log: {prog['last_line']}")
    else:
        print("  progress: no heartbeat or log found")
    if exit_code is not None:
        print(f"  exit_code: {exit_code}")
    if gpu is not None:
        if gpu.get("read"):
            print("  gpus:     " + ", ".join(f"{g['index']}: {g['util_percent']}% {g['memory_used_mib']} MiB"
                                          for g in gpu["gpus"]))
        else:
            print(f"  gpus:     unknown ({gpu['detail']})")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
