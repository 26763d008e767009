"""Start a process that outlives its caller: own session, stdin from /dev/null, output to a file.

Used for whatever must keep running after an ssh connection drops or an agent exits: the run
supervisor (``runs/supervisor.py``) and the idle guard. Why each part matters:

* **Own session** (``setsid`` via ``start_new_session``): the process has no controlling terminal,
  so the SIGHUP sent when an ssh session or a terminal closes never reaches it, and it leads its own
  process group, so a Ctrl-C or a group signal aimed at the caller does not hit it either.
* **stdin from /dev/null**: nothing blocks reading a terminal that is gone, and the ssh channel is
  not held open by an inherited stdin (an ssh command returns only when every copy of its pipes is
  closed, which is why a bare ``nohup cmd &`` over ssh can hang the connection).
* **stdout and stderr to a file**, opened for appending, mode 0600 (logs can hold tokens): the
  process never writes to a closed pipe (SIGPIPE / EPIPE would kill or break it).
* **Reaped by a daemon thread** while the caller lives: a long-lived caller (the MCP server) would
  otherwise keep an exited child as a zombie, which still looks like a live pid to a status check.
  When the caller exits first, the kernel re-parents the process to init (or a subreaper), which
  reaps it.

Never runs anything through a shell: ``argv`` is a list, passed to ``execve`` as is.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

LOG_MODE = 0o600


def spawn_detached(argv: Sequence[str], log_path: Path | str, *, cwd: Path | str | None = None,
                   env: Mapping[str, str] | None = None) -> int:
    """Start ``argv`` detached (see the module docstring) and return its pid.

    ``env`` is the complete environment (None: inherit the caller's). Raises OSError when the log
    cannot be opened or the program cannot be executed (e.g. FileNotFoundError for a missing program).
    """
    if not argv:
        raise ValueError("argv is empty")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_MODE)
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                cwd=cwd, env=dict(env) if env is not None else None,
                                start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return proc.pid


__all__ = ["spawn_detached"]
