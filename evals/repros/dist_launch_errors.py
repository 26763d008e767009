"""DIST-02, -04, -27, PAR-03 and MON-01 on CPU: what the torchrun launcher itself prints.

    python evals/repros/dist_launch_errors.py [CASE...]

Each case starts ``python -m torch.distributed.run`` (torchrun; ``torch.distributed.launch`` for
DIST-04) with a two-line worker script written to a temporary directory, and holds the launcher's
combined output against the entry's signatures: a port another process already listens on
(DIST-02), a worker that raises (DIST-27), an argparse script under the deprecated launcher
(DIST-04), two workers without OMP_NUM_THREADS (PAR-03), and SIGHUP to the launcher as a closed ssh
session sends it (MON-01).
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _catalog_check import check, summary

WORKERS = {
    "raise": "import os\nif os.environ['RANK'] == '0':\n    raise KeyError('labels')\n",
    "argparse": "import argparse\nargparse.ArgumentParser().parse_args()\n",
    "ok": "print('worker ok', flush=True)\n",
    "sleep": "import time\nprint('worker ready', flush=True)\ntime.sleep(60)\n",
}


def launch(tmp: Path, worker: str, flags: list[str], module: str = "torch.distributed.run",
           env: dict | None = None, signal_after_ready: signal.Signals | None = None) -> str:
    script = tmp / f"w_{worker}.py"  # not argparse.py: it would shadow the module
    script.write_text(WORKERS[worker])
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | (env or {})
    argv = [sys.executable, "-m", module, *flags, str(script)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    if signal_after_ready is not None:
        for line in proc.stdout:
            lines.append(line)
            if "worker ready" in line:
                break
        time.sleep(1)
        proc.send_signal(signal_after_ready)
    out, _ = proc.communicate(timeout=120)
    return "".join(lines) + out + f"\n(launcher exit status {proc.returncode})"


def dist02(tmp: Path) -> None:
    with socket.socket() as taken:  # another job's store on the port
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        text = launch(tmp, "ok", ["--nproc-per-node=1", "--master-port", str(port), "--master-addr",
                                  "127.0.0.1", "--nnodes=1", "--node-rank=0"])
    check("DIST-02", "torchrun on a taken port", text, show="EADDRINUSE")


def dist04(tmp: Path) -> None:
    text = launch(tmp, "argparse", ["--nproc-per-node=1", "--master-port", "0"],
                  module="torch.distributed.launch")
    check("DIST-04", "torch.distributed.launch", text, show="unrecognized")


def dist27(tmp: Path) -> None:
    text = launch(tmp, "raise", ["--standalone", "--nproc-per-node=2"])
    check("DIST-27", "worker raises KeyError", text, show="errors.ChildFailedError:")


def par03(tmp: Path) -> None:
    check("PAR-03", "2 workers, no OMP_NUM_THREADS",
          launch(tmp, "ok", ["--standalone", "--nproc-per-node=2"]), show="OMP_NUM_THREADS")


def mon01(tmp: Path) -> None:
    text = launch(tmp, "sleep", ["--standalone", "--nproc-per-node=1"], signal_after_ready=signal.SIGHUP)
    check("MON-01", "SIGHUP to torchrun", text, show="death signal")
    check("MON-01", "... the exception", text, show="SignalException:")


CASES = {"dist02": dist02, "dist04": dist04, "dist27": dist27, "par03": par03, "mon01": mon01}

if __name__ == "__main__":
    import torch

    print(f"torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as d:
        for name in sys.argv[1:] or CASES:
            CASES[name](Path(d))
    raise SystemExit(summary())
