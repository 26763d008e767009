"""One child process with a deadline: its own session (so a kill takes everything it started), no stdin, output
captured; at the deadline the whole session is killed and what it had written is kept."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass


@dataclass
class Finished:
    out: bytes
    err: bytes
    returncode: int | None
    """None: killed at the deadline."""


def run_bounded(argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
                cwd: str | None = None) -> Finished:
    """Run ``argv`` for at most ``timeout_s`` seconds. Raises OSError when it cannot start."""
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            child.kill()
        out, err = child.communicate()
        return Finished(out, err, None)
    return Finished(out, err, child.returncode)
