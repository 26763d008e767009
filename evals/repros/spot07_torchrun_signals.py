"""SPOT-07 on CPU: which signals torchrun passes to its workers.

    python evals/repros/spot07_torchrun_signals.py

Starts ``torchrun --nproc-per-node=1`` (no process group needed) with a worker that saves on
SIGTERM or SIGUSR1 (spot07_worker.py), sends the agent one signal, and prints torchrun's exit status
and whether the worker's handler ran. Three cases: SIGUSR1 with default flags, SIGTERM with default
flags, SIGUSR1 with ``--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1``.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = Path(__file__).with_name("spot07_worker.py")
HANDLE_USR1 = "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


def trial(sig: signal.Signals, extra: list[str]) -> tuple[int, bool, bool]:
    """(torchrun's exit status as a shell shows it, handler ran, worker left running)."""
    with tempfile.TemporaryDirectory() as tmp:
        marker = Path(tmp) / "saved"
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", *extra,
                str(WORKER), str(marker)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        worker = 0
        for line in proc.stdout:  # wait until the worker has installed its handlers
            if "ready" in line:
                worker = int(line.split("worker ", 1)[1].split()[0])
                break
        time.sleep(1)
        proc.send_signal(sig)
        rc = proc.wait(timeout=90)
        time.sleep(0.5)
        orphan = _alive(worker)
        if orphan:
            os.kill(worker, signal.SIGKILL)  # the worker this script started, left behind by torchrun
        return (128 - rc if rc < 0 else rc), marker.exists(), orphan


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    for sig, extra in ((signal.SIGUSR1, []), (signal.SIGTERM, []), (signal.SIGUSR1, [HANDLE_USR1])):
        rc, saved, orphan = trial(sig, extra)
        print(f"{sig.name:8} {' '.join(extra) or '(default flags)':62} torchrun exit {rc:3}  "
              f"worker handler ran: {saved!s:5}  worker left running: {orphan}", flush=True)
