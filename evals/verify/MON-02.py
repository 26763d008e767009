"""MON-02: a training script whose prints go to a log file through a pipe-less redirect (block-buffered,
nothing reaches the file for a long time) vs the same launch with the Fix's ``PYTHONUNBUFFERED=1``.
The Verify is the entry's ``tail -n 3 runs/exp1/train.log`` one second after the start."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

TRAIN = ("import pathlib, time\nfor step in range(1, 1000):\n    print(f'step {step} loss 1.0')\n"
         "    if step == 20:\n        pathlib.Path('runs/exp1/step20').touch()   # a sign not through stdout\n"
         "    time.sleep(0.05)\n")


def run(case) -> str:
    os.makedirs("runs/exp1", exist_ok=True)
    (case.tmp / "train.py").write_text(TRAIN)
    env_line = case.code("Fix", "PYTHONUNBUFFERED=1", role="fix") if case.fixed else ""
    # the failing launch as a user's shell has it: no PYTHONUNBUFFERED, whatever this process's environment says
    python = shlex.quote(sys.executable)
    launch = f"exec env -u PYTHONUNBUFFERED {env_line} {python} train.py > runs/exp1/train.log 2>&1"
    proc = subprocess.Popen(["bash", "-c", launch], cwd=case.tmp, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists("runs/exp1/step20") and time.monotonic() < deadline:
            time.sleep(0.05)  # twenty steps done: far more than one logging interval
        return case.shell(case.code("Verify", "tail -n 3 runs/exp1/train.log"))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run this scenario started
        proc.wait()


def passed(outputs: list[str]) -> bool:
    return all("step " in out for out in outputs)
