"""SPOT-01: trigger the stop handling by hand and judge by the checkpoint (the entry's Verify).

Failure: a training loop with no SIGTERM handler (``_step_trainer.py`` alone). Fix: the handler that
SPOT-02's Fix shows, run as written. The run is a plain ``python`` process in its own process group;
after its second step the entry's ``kill -TERM -- -<pgid>`` is sent, then the entry's checkpoint check
runs. The exit status is printed beside it: 0 for a plain process whose handler saved (the entry says so).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

TIMEOUT = 120
TRAINER = Path(__file__).with_name("_step_trainer.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(case) -> str:
    argv = [sys.executable, str(TRAINER)]
    if case.fixed:
        handler = case.tmp / "handler.py"
        handler.write_text(case.code("Fix", "signal.signal(signal.SIGTERM", role="fix", entry="SPOT-02"))
        argv.append(str(handler))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port())}
    log = (case.tmp / "train.log").open("w")
    proc = subprocess.Popen(argv, cwd=case.tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "step 2" not in (case.tmp / "train.log").read_text() and time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        kill = case.code("Verify", "kill -TERM").replace("<pgid>", str(proc.pid))
        case.shell(kill)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)  # the group this scenario started
            proc.wait()
        log.close()
    status = 128 - code if code < 0 else code
    return f"train exit {status}\n" + case.python_c(case.code("Verify", "checkpoint at step"))


def passed(outputs: list[str]) -> bool:
    return all("checkpoint at step" in out for out in outputs)
