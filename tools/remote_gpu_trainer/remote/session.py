"""Sessions: one ssh process per host running the runtime's JSON-lines server, kept open between calls.

A warm call is one line out and one line back over an open channel (no ssh handshake, no Python start-up
on the box). Calls to one host run one at a time per session; a second concurrent call to the same host
opens another session, so a long repro never blocks a status read. Every ssh child gets its own stdin
pipe: it must never inherit the MCP server's stdin, which is the protocol pipe.

A deadline is armed before connecting. When it passes, the ssh process is killed; the box's server sees
its stdin close and ends its process group, so no process of ours is left on the box.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import queue
import subprocess
import threading
import time
from typing import Any

from ..errors import InputError
from ..toolspec import Progress, no_progress
from .errors import RemoteError
from .hosts import Host, config_args, resolve
from .runtime import runtime_version, serve_command
from .ssh import classify_ssh_failure, ssh_argv

CONNECT_DEADLINE_S = 30.0
MAX_IDLE_PER_HOST = 2

_EOF = object()


class Session:
    def __init__(self, host: Host, deadline: float):
        self.host = host
        self.version = runtime_version()
        self.proc = subprocess.Popen(ssh_argv(host, serve_command(self.version)), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._lines: queue.Queue[Any] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._next_id = 0
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()
        self.hello = self._read_hello(deadline)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode("utf-8", errors="replace"))
        self._lines.put(_EOF)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw.decode("utf-8", errors="replace"))

    def _stderr_text(self) -> str:
        return "".join(self._stderr)

    def _next_line(self, deadline: float) -> Any:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            return self._lines.get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError from None

    def _ended(self) -> RemoteError:
        """The ssh process ended: say why, from its exit status and stderr."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr_reader.join(timeout=2)  # the pipe is closed: its last lines are read
        text = self._stderr_text()
        if code == 255:
            return classify_ssh_failure(self.host, text)
        if code == 90 or "rgt-runtime-missing" in text:
            return _runtime_error(self.host, self.version, text)
        tail = text.strip()[-800:] or "no output"
        return RemoteError(self.host.given, "remote_tool_failed", f"the box's runtime ended (exit {code}): "
                           f"{tail.splitlines()[-1][:200] if tail else ''}",
                           f"run `rgt box status {self.host.given}`; reinstall with "
                           f"`rgt box install {self.host.given}` if it is damaged", detail=tail)

    def _read_hello(self, deadline: float) -> dict[str, Any]:
        first_lines: list[str] = []
        while True:
            try:
                line = self._next_line(deadline)
            except TimeoutError:
                self.close()
                raise RemoteError(self.host.given, "timeout", "the box did not answer within "
                                  f"{CONNECT_DEADLINE_S:g} s", "check that the box is up (`ssh HOST true` in a "
                                  "terminal); a proxy that only offers an interactive shell never answers "
                                  "a command") from None
            if line is _EOF:
                error = self._ended()
                if error.kind == "remote_tool_failed" and first_lines:
                    raise _no_command_channel(self.host, "".join(first_lines))
                raise error
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                first_lines.append(line)
                if len(first_lines) > 20:
                    self.close()
                    raise _no_command_channel(self.host, "".join(first_lines)) from None
                continue
            if isinstance(message, dict) and "hello" in message:
                return message["hello"]

    def request(self, tool: str, arguments: dict[str, Any], box: str, timeout_s: float,
                progress: Progress) -> dict[str, Any]:
        self._next_id += 1
        rid = self._next_id
        from ..registry import home_of

        line = json.dumps({"id": rid, "tool": tool, "module": home_of(tool), "arguments": arguments, "box": box,
                           "alias": self.host.given, "timeout_s": timeout_s})
        deadline = time.monotonic() + timeout_s + 5  # the box ends itself at timeout_s; this is the backstop
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._ended() from None
        while True:
            try:
                raw = self._next_line(deadline)
            except TimeoutError:
                self.close()
                raise RemoteError(self.host.given, "remote_timeout", f"{tool} did not finish within {timeout_s:g} s",
                                  "the call was stopped and its processes on the box ended; retry, or raise "
                                  "RGT_REMOTE_TIMEOUT for slow checks") from None
            if raw is _EOF:
                raise self._ended()
            try:
                message = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if message.get("id") != rid:
                continue
            if "progress" in message:
                done, total, text = [*message["progress"], None, None, ""][:3]
                progress(done, total, text or "")
            elif "result" in message:
                return message["result"]
            elif "error" in message:
                raise _tool_error(self.host, tool, message["error"])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # the box's server exits on EOF
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _tool_error(host: Host, tool: str, error: dict[str, Any]) -> Exception:
    kind = error.get("kind", "remote_tool_failed")
    if kind == "input":
        made = InputError(error.get("field") or "input", "")
        made.args = (error.get("message", ""),)
        return made
    if kind == "remote_timeout":
        return RemoteError(host.given, "remote_timeout", f"{tool}: {error.get('message')}",
                           "its processes on the box were ended; retry, or raise RGT_REMOTE_TIMEOUT")
    trace = str(error.get("traceback", ""))
    where = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")][-1:]
    return RemoteError(host.given, "remote_tool_failed", f"{tool} failed on the box: {error.get('message')}"
                       + (f" ({where[0][:200]})" if where else ""),
                       "rerun it by hand on the box to see the whole traceback: "
                       f"`~/.cache/remote-gpu-trainer/{runtime_version()}/venv/bin/rgt ...` with the same arguments "
                       "(`--help` lists them); report it if it is our bug", detail=trace)


def _runtime_error(host: Host, version: str, stderr: str) -> RemoteError:
    installed = ""
    for line in stderr.splitlines():
        if "installed:" in line:
            installed = line.split("installed:", 1)[1].strip()
    fix = f"rgt box install {host.given}"
    if installed:
        return RemoteError(host.given, "version_mismatch", f"the box has runtime {installed}, this checkout needs "
                           f"{version}", f"run `{fix}` (installs {version} beside the old one; "
                           f"`rgt box remove {host.given}` clears old versions)")
    return RemoteError(host.given, "runtime_missing", "the box has no remote-gpu-trainer runtime",
                       f"run `{fix}` once (a venv under ~/.cache/remote-gpu-trainer, no root; it uses the box's "
                       "own torch), or over MCP call box_install(host=...)")


def _endpoint_hint(host: Host) -> str | None:
    """The provider profile whose SSH fact names this endpoint says which endpoint runs commands."""
    from ..providers import load_profiles

    try:
        hostname = resolve(host).hostname
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    for profile in load_profiles().values():
        fact = profile.front.network.ssh.value
        if hostname and hostname in fact:
            return f"{profile.front.name} (profiles/{profile.path.name}): {fact}"
    return None


def _no_command_channel(host: Host, text: str) -> RemoteError:
    first = text.strip().splitlines()[0][:200] if text.strip() else ""
    hint = _endpoint_hint(host)
    return RemoteError(host.given, "no_command_channel",
                       f"this ssh endpoint did not run our command (it printed: {first!r})",
                       hint or "use an ssh endpoint that runs commands (e.g. the box's own sshd on its direct "
                       "TCP port), not a proxy that only opens an interactive shell", detail=text[-2000:])


class Pool:
    """Idle sessions per host. Keyed by the host string and the ssh config file in force."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, tuple[str, ...]], list[Session]] = {}
        self._lock = threading.Lock()

    def _key(self, host: Host) -> tuple[str, tuple[str, ...]]:
        return host.given, tuple(config_args())

    def acquire(self, host: Host) -> Session:
        key = self._key(host)
        with self._lock:
            sessions = self._idle.get(key, [])
            while sessions:
                session = sessions.pop()
                if session.alive and session.version == runtime_version():
                    return session
                session.close()
        return Session(host, time.monotonic() + CONNECT_DEADLINE_S)

    def release(self, session: Session) -> None:
        if not session.alive:
            return
        with self._lock:
            sessions = self._idle.setdefault(self._key(session.host), [])
            if len(sessions) < MAX_IDLE_PER_HOST:
                sessions.append(session)
                return
        session.close()

    def close_all(self) -> None:
        with self._lock:
            sessions = [s for group in self._idle.values() for s in group]
            self._idle.clear()
        for session in sessions:
            session.close()


POOL = Pool()
atexit.register(POOL.close_all)


def default_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get("RGT_REMOTE_TIMEOUT", "600")))
    except ValueError:
        return 600.0


def call_remote(host: Host, tool: str, arguments: dict[str, Any], progress: Progress = no_progress,
                timeout_s: float | None = None) -> dict[str, Any]:
    """Run ``tool`` on ``host`` with already-validated ``arguments``; the box's result as JSON data."""
    try:
        box = resolve(host).identity
    except (OSError, ValueError, subprocess.TimeoutExpired) as err:
        raise RemoteError(host.given, "ssh_failed", f"ssh could not read its configuration for this host ({err})",
                          "check ~/.ssh/config (or RGT_SSH_CONFIG) with `ssh -G HOST`") from None
    session = POOL.acquire(host)
    try:
        result = session.request(tool, arguments, box, timeout_s or default_timeout(), progress)
    except (RemoteError, InputError):
        POOL.release(session)  # the box answered with an error; a dead or timed-out session is dropped
        raise
    except BaseException:
        session.close()
        raise
    POOL.release(session)
    return result
