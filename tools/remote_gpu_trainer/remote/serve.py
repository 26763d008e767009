"""The box side of a session: ``python -m remote_gpu_trainer.remote.serve``, one JSON document per line.

The local side keeps this process open over one ssh channel, so a warm call costs one round trip and no
Python start-up. Protocol (stdin → stdout)::

    ← {"hello": {"version": "0.1.0+…", "python": "3.11.7", "pid": 123}}
    → {"id": 1, "tool": "gpu_health", "module": "remote_gpu_trainer.health.tool", "arguments": {...},
       "box": "root@10.0.0.5:22", "timeout_s": 120}
    ← {"id": 1, "progress": [1, 3, "reading GPUs"]}          (zero or more)
    ← {"id": 1, "result": {...}}   or   {"id": 1, "error": {"kind": "...", "message": "..."}}

Arguments are data: they are validated by the same ToolSpec input model as on the local side and never
reach a shell. Nothing of ours outlives the session: when stdin closes (the local side exited or gave up)
or a request overruns its deadline, this process ends its process group (the tools' helper children)
and exits. Detached runs and guards start their own sessions, so they are not in that group.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import threading
import traceback
from typing import Any

import psutil

from ..errors import InputError

#: What tools print would corrupt the protocol, so they get stderr as stdout; replies use a private fd
#: (and requests are read from a private copy of stdin).
_out: Any = None
_out_lock = threading.Lock()


def _send(message: dict[str, Any]) -> None:
    line = json.dumps(message, separators=(",", ":"), default=str)
    with _out_lock:
        _out.write(line + "\n")
        _out.flush()


def _end_everything(code: int) -> None:
    """Stop our helper processes (children of tools), then leave without running more Python."""
    if os.getpgrp() == os.getpid():  # we lead our own group: safe to signal all of it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            os.killpg(os.getpid(), signal.SIGTERM)
        except OSError:
            pass
    session = os.getsid(0)
    for child in psutil.Process().children(recursive=True):
        try:
            if os.getsid(child.pid) == session:  # a run or guard started its own session: it must live on
                child.kill()
        except (psutil.Error, OSError):
            pass
    os._exit(code)


def _handle(request: dict[str, Any]) -> None:
    from ..registry import find_spec

    rid = request.get("id")
    spec = find_spec(str(request.get("tool")), request.get("module"))
    if spec is None or not spec.remote:
        _send({"id": rid, "error": {"kind": "unknown_tool", "message": f"no remote tool {request.get('tool')!r} "
                                    "in this runtime"}})
        return
    os.environ["RGT_BOX_DESTINATION"] = str(request.get("box") or "")
    os.environ["RGT_BOX_ALIAS"] = str(request.get("alias") or "")  # how the person names this box: notify's {host}

    def progress(done: float, total: float | None = None, message: str = "") -> None:
        _send({"id": rid, "progress": [done, total, message]})

    try:
        result = spec.call(dict(request.get("arguments") or {}), progress)
    except InputError as err:
        _send({"id": rid, "error": {"kind": "input", "field": err.field, "message": str(err)}})
        return
    except Exception as err:  # reported to the caller with its tail; the session stays usable
        tail = "".join(traceback.format_exception(err))[-3000:]
        _send({"id": rid, "error": {"kind": "remote_tool_failed", "message": f"{type(err).__name__}: {err}",
                                    "traceback": tail}})
        return
    _send({"id": rid, "result": result.model_dump(mode="json")})


def _run_with_deadline(request: dict[str, Any]) -> None:
    worker = threading.Thread(target=_handle, args=(request,), daemon=True)
    worker.start()
    worker.join(float(request.get("timeout_s") or 600))
    if worker.is_alive():
        _send({"id": request.get("id"), "error": {"kind": "remote_timeout", "message": "the tool overran its "
                                                  f"{request.get('timeout_s')} s deadline on the box"}})
        _end_everything(3)


def main() -> None:
    global _out
    try:
        os.setsid()  # our own group, so ending it cannot touch sshd or the caller's shell
    except OSError:
        pass
    _out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    requests = os.fdopen(os.dup(sys.stdin.fileno()), "r", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # A tool's child process must never read the protocol: fd 0 becomes /dev/null for everything we start.
    os.dup2(os.open(os.devnull, os.O_RDONLY), sys.stdin.fileno())
    from .runtime import runtime_version

    _send({"hello": {"version": runtime_version(), "python": platform.python_version(), "pid": os.getpid()}})
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as err:
            _send({"id": None, "error": {"kind": "protocol", "message": f"not JSON: {err}"}})
            continue
        _run_with_deadline(request)
    _end_everything(0)  # stdin closed: the local side is gone


if __name__ == "__main__":
    main()
