"""One child process with a deadline: its own session (so a kill takes everything it started), no stdin, output
captured; at the deadline the whole session is killed and what it had written is kept.

The deadline is on the child itself, not on its output: stdout and stderr go to temporary files, not pipes. A
start-up file that backgrounds a job (``x &`` in a .bashrc) or starts a daemon (``setsid x &``) hands it our
stdout; waiting for pipes to close would wait for that job, report a shell that finished as one that hung, and
kill the user's job. So we wait for the child, kill its process group only when the child itself overruns, and
then read the files (bounded)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from typing import IO

#: At most this much of each stream is kept (an environment dump is kilobytes; a runaway printer is not).
MAX_BYTES = 8 * 1024 * 1024


@dataclass
class Finished:
    out: bytes
    err: bytes
    returncode: int | None
    """None: killed at the deadline."""


def _read(f: IO[bytes], max_bytes: int) -> bytes:
    f.seek(0)
    return f.read(max_bytes)


def run_bounded(argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
                cwd: str | None = None, max_bytes: int = MAX_BYTES) -> Finished:
    """Run ``argv`` for at most ``timeout_s`` seconds. Raises OSError when it cannot start.

    Finished when ``argv``'s own process exits, whatever it left running in the background (that is left alone);
    on an overrun its process group is killed and ``returncode`` is None."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 env=env, cwd=cwd, start_new_session=True)
        try:
            returncode: int | None = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                child.kill()
            child.wait()
            returncode = None
        return Finished(_read(out, max_bytes), _read(err, max_bytes), returncode)
