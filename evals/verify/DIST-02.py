"""DIST-02: a stale process of the user's still listens on the rendezvous port, then the Fix's
``kill_port_holders`` dry run and its confirmation stop exactly that holder. The Verify is the entry's
``port_status(...)`` call, run through the tool registry like MCP and the CLI do. Port 29500 of the
entry's text is replaced by a free port, so the scenario never touches a real job's port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

HOLDER = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(120)"


def _call(span: str, port: int, **extra):
    from remote_gpu_trainer.catalog import parse_tool_call, registered_tools

    name, arguments = parse_tool_call(span)
    arguments = {**arguments, **({"port": port} if "port" in arguments else {"ports": [port]}), **extra}
    return registered_tools()[name].call(arguments)


def run(case) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(port=port)], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until it listens
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        if case.fixed:
            fix = case.code("Fix", "kill_port_holders(ports=[29500], dry_run=true)", role="fix")
            preview = _call(fix, port)
            _call(fix, port, dry_run=False, confirm_token=preview.confirm_token)
            holder.wait(timeout=30)
        result = _call(case.code("Verify", "port_status(port=29500)"), port)
        return f"port free: {result.free} ({result.summary[:80]})\n"
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)  # the holder this scenario started
            holder.wait()


def passed(outputs: list[str]) -> bool:
    return all(out.startswith("port free: True") for out in outputs)
