"""The warm health daemon: a fresh ``rgt health`` answered by a process that already holds NVML.

**Why.** A fresh ``rgt health`` spends nearly all its time becoming Python. On an H200 box (issue 27) the
interpreter took 66 ms, pydantic and the CLI 165 ms, the health tool 66 ms, the first probe 42 ms: 416 ms against
165 ms for ``nvidia-smi -q``, while the probe itself, warm, took 7 ms. A process that imports pydantic cannot
beat ``nvidia-smi -q`` there. So, as ``nvidia-persistenced`` keeps the driver initialised and ssh's
``ControlPersist`` keeps a connection up, the first ``rgt health`` leaves a process behind that holds NVML
initialised and the health tool imported; the next ``rgt health`` asks it before importing anything else
(``rgt.py``) and pays only for the interpreter's start and one round trip on a unix socket.

**What runs.** ``python -S -c … healthd.main()``, detached (``detach.py``: own session, no terminal, stdin
/dev/null, output appended to ``health-<key>.log``), marked ``RGT_HELPER=health-daemon``, with its own NVML worker
process (``nvml_session``: a crash or hang inside NVML costs a check, never the daemon). It never imports torch
and holds no CUDA context, only NVML's device files: the VRAM-holder scan needs ``/dev/nvidia-uvm``, and
``box_idle``, ``run_status`` and the run supervisor never count a process marked ``RGT_HELPER`` as a run's
(``runs/members.py``), so it is never activity.

**Where.** A unix socket ``health-<key>.sock`` in a private directory: ``$XDG_RUNTIME_DIR/remote-gpu-trainer``,
else ``${TMPDIR:-/tmp}/rgt-<uid>`` (as tmux does). Not the cache directory: on clusters that is often an NFS home
shared by many nodes, where a socket made on one node is dead on the others. The directory must be a real
directory of ours with mode 0700, or nothing is used or started.

**Who may ask what.** Every connection's peer must be this uid (``SO_PEERCRED``, checked by both sides). A
request is ``rgt health`` with its command-line words: the daemon parses them with the CLI's own parser and
answers with the CLI's own code (``cli.run_spec``), so the output is the normal path's, byte for byte, apart
from the measured ``elapsed_s``. No other command, never code, never a shell. ``--help``, a usage error, a
``--host`` or anything else it does not answer gets "fall back", and the caller runs the normal path.

**Which daemon.** ``<key>`` is a checksum of everything that shapes the daemon process: this package's code
(``codestamp``: path, size, mtime of every file), the Python (its directory and version) and the variables that
shape NVML and its worker (``KEY_VARIABLES`` and every ``RGT_*`` except the daemon's own settings). The request
carries the full text of that material and the daemon compares it exactly: an edited, upgraded or differently
configured checkout never talks to a daemon that is not its own. The rest of the caller's environment
(``CUDA_VISIBLE_DEVICES``, which the launch-environment check reads, ``PATH``…) and its working directory apply
for the duration of its request; requests are served one at a time.

**Lifetime.** An ``rgt health`` that answered in-process, on this machine, with NVML working, starts one for next
time (:func:`after_cli`); a lock file makes any second one exit at once. It exits after ``RGT_DAEMON_IDLE_S``
seconds without a request (default 600), within a minute of its code changing or its socket being removed, on
SIGTERM, when the NVIDIA library its worker loaded is replaced (a driver upgrade: from then on a fresh process's
answer differs, a driver/library mismatch), or when asked: ``rgt health --no-daemon`` answers in-process and stops
every health daemon of this user. Like nvidia-persistenced or any NVML monitor, it keeps the GPUs' device files
open while it lives (in its NVML worker): stop it before ``rmmod nvidia``.
``RGT_NO_DAEMON=1`` neither uses nor starts one. Nothing depends on it: whatever goes wrong on the way to it (none
running, another key, refused, killed, busy, slow) falls back silently to the normal path.

The MCP server does not use it: a server is warm already (its own NVML worker lives as long as it does).

This module is imported by the fast path before anything else: it imports only what the client needs, and
everything the daemon needs inside the daemon's functions.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import sys
import zlib

from .codestamp import code_stamp

TYPE_CHECKING = False  # typing itself costs milliseconds to import (see the module docstring)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping, Sequence

COMMAND = "health"
NO_DAEMON_ENV = "RGT_NO_DAEMON"
IDLE_ENV = "RGT_DAEMON_IDLE_S"
DEFAULT_IDLE_S = 600.0
NO_DAEMON_FLAG = "--no-daemon"
NO_DAEMON_DEST = "_no_daemon"
KEY_VARIABLES = frozenset({"LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME", "HOME", "XDG_CACHE_HOME"})
"""Besides ``RGT_*``: what decides which libnvidia-ml and which Python modules the daemon loads, and where its
NVML worker keeps the per-boot InfoROM facts. They are fixed for the daemon's life, so they select the daemon."""
SETTINGS = frozenset({NO_DAEMON_ENV, IDLE_ENV, "RGT_HELPER"})
"""``RGT_*`` variables that change nothing in an answer (RGT_HELPER: the mark the daemon itself carries)."""
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
ACCEPT_TIMEOUT_S = 1.0
"""Connect, and wait for the daemon to take the request: it serves one at a time, a few ms each. A caller queued
behind a long one (``--sample-s``) answers in-process instead."""
CHECK_EVERY_S = 60.0
MAX_FRAME = 64 << 20

# Frame kinds. Request: one KIND, MATERIAL, CWD, then one ARG per word and one ENV per variable, then END.
# Reply: ACCEPTED, any STDERR (live), one STDOUT, then EXIT (status) or FALL_BACK (reason) at any point.
KIND, MATERIAL, CWD, ARG, ENV, END = b"k", b"m", b"d", b"a", b"v", b"."
ACCEPTED, STDERR, STDOUT, EXIT, FALL_BACK = b"A", b"E", b"O", b"X", b"F"


# --- which daemon, where ------------------------------------------------------------------------------


def key_material(environ: Mapping[str, str], package_dir: str = PACKAGE_DIR) -> str:
    """Everything that shapes the daemon process (module docstring, "Which daemon"), as text."""
    variables = sorted(f"{name}={value}" for name, value in environ.items()
                       if name in KEY_VARIABLES or (name.startswith("RGT_") and name not in SETTINGS))
    python = f"{os.path.dirname(os.path.abspath(sys.executable))} {sys.version}"
    return "\n".join([python, *variables, code_stamp([package_dir])])


def checksum(material: str) -> str:
    """64 bits (CRC-32 and Adler-32) naming the socket; the material itself is compared exactly."""
    data = material.encode(errors="surrogatepass")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def runtime_dir(create: bool = False) -> str | None:
    """The private directory of this user's daemon sockets; None when it is missing or not private."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(base):
        path = os.path.join(base, "remote-gpu-trainer")
    else:
        path = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"rgt-{os.geteuid()}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    return path if private_dir(path) else None


def private_dir(path: str) -> bool:
    """A real directory (not a link), owned by this user, that nobody else may enter or list."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def socket_path(material: str, create: bool = False) -> str | None:
    directory = runtime_dir(create)
    return None if directory is None else os.path.join(directory, f"health-{checksum(material)}.sock")


def same_user(uid: int | None) -> bool:
    """Whether a peer with this uid may talk to us (and we to it): only this user itself, root included."""
    return uid is not None and uid == os.geteuid()


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a unix socket (SO_PEERCRED, Linux); None where unknown."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    except OSError:
        return None
    return uid


# --- frames -------------------------------------------------------------------------------------------


def frame(kind: bytes, data: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(data)) + data


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        data += chunk
    return data


def read_frame(conn: socket.socket) -> tuple[bytes, bytes]:
    head = _exactly(conn, 5)
    size, = struct.unpack("!I", head[1:])
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return head[:1], _exactly(conn, size)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _connect(path: str) -> socket.socket:
    """Connected to the daemon at ``path``, whose uid was checked; raises OSError otherwise."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(ACCEPT_TIMEOUT_S)
        conn.connect(path)
        if not same_user(peer_uid(conn)):
            raise PermissionError(f"{path} is served by another user")
    except BaseException:
        conn.close()
        raise
    return conn


def _request(kind: str, material: str = "", argv: Sequence[str] = (), environ: Mapping[bytes, bytes] | None = None,
             cwd: bytes = b"/") -> bytes:
    frames = [frame(KIND, kind.encode()), frame(MATERIAL, _bytes(material)), frame(CWD, cwd)]
    frames += [frame(ARG, os.fsencode(word)) for word in argv]
    frames += [frame(ENV, name + b"=" + value) for name, value in (environ or {}).items()]
    return b"".join([*frames, frame(END)])


# --- the client: rgt's fast path ----------------------------------------------------------------------


def wanted(environ: Mapping[str, str]) -> bool:
    """False when ``RGT_NO_DAEMON`` is set (to anything but empty or 0): never use or start a daemon."""
    return environ.get(NO_DAEMON_ENV, "") in ("", "0")


def eligible(argv: Sequence[str]) -> bool:
    """``rgt health [flags]`` a daemon may answer: not help, not another host, not --no-daemon. Only a shortcut:
    the daemon parses the words itself and falls back on anything it does not answer."""
    if not argv or argv[0] != COMMAND or not wanted(os.environ):
        return False
    return not any(word in ("-h", "--help", "--host", NO_DAEMON_FLAG) or word.startswith("--host=")
                   for word in argv[1:])


def answer(argv: Sequence[str]) -> int | None:
    """Print the daemon's answer to ``rgt <argv>`` (stdout, stderr) and return its exit status; None when no
    daemon answered, with nothing printed (progress lines excepted, if it died half-way): run the normal path."""
    if not eligible(argv):
        return None
    material = key_material(os.environ)
    path = socket_path(material)
    if path is None:
        return None
    printed: list[str] = []
    try:
        with _connect(path) as conn:
            conn.sendall(_request(COMMAND, material, argv, os.environb, os.getcwdb()))
            if read_frame(conn)[0] != ACCEPTED:
                return None
            conn.settimeout(reply_limit_s(argv))
            while True:
                kind, data = read_frame(conn)
                if kind == STDERR:
                    sys.stderr.write(_text(data))
                    sys.stderr.flush()
                elif kind == STDOUT:
                    printed.append(_text(data))
                elif kind == EXIT:
                    code = int(data)
                    break
                else:  # FALL_BACK, or a frame this version does not know
                    return None
    except (OSError, ValueError):  # none there, refused, another user, closed, timed out (TimeoutError)
        return None
    try:
        sys.stdout.write("".join(printed))
        sys.stdout.flush()
    except BrokenPipeError:  # as cli.main answers `rgt health | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code


def reply_limit_s(argv: Sequence[str]) -> float:
    """How long an answer may take: NVML's timeout twice (init, then the reads), the sampling window, 15 s more.
    A value that cannot be read here gets the tool's maximum (HealthInput: 300 s, 10 s).

    The CLI's argparse takes any unambiguous prefix (``--timeout-`` is ``--timeout-s``), and this client has no
    parser (nothing is imported on the fast path), so a prefix counts here too. A prefix argparse finds ambiguous
    (``--time``: ``--timeout-s`` or ``--timeout_s``) is a usage error there, and the daemon falls back."""
    values = {"--timeout-s": 30.0, "--sample-s": 0.0}
    words = list(argv)
    for at, word in enumerate(words):
        if word == "--":
            break
        name, given, value = word.partition("=")
        name = next((full for full in values if len(name) > 2 and full.startswith(name.replace("_", "-"))), "")
        if name:
            try:
                values[name] = float(value if given else words[at + 1])
            except (IndexError, ValueError):
                values = {"--timeout-s": 300.0, "--sample-s": 10.0}
                break
    return 2 * values["--timeout-s"] + values["--sample-s"] + 15


# --- starting and stopping ----------------------------------------------------------------------------


def add_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-daemon`` on ``rgt health``: where a person looks for what the daemon is and how to stop it."""
    parser.add_argument(
        NO_DAEMON_FLAG, action="store_true", dest=NO_DAEMON_DEST,
        help="answer in this process and stop this user's health daemons. Without it, an `rgt health` run here with "
        "a working GPU leaves a small daemon behind (python, marked RGT_HELPER=health-daemon; NVML only, no CUDA "
        "context, never counted by box_idle) that answers the next `rgt health` with NVML initialised and nothing "
        "to import; it listens on a "
        "unix socket in $XDG_RUNTIME_DIR/remote-gpu-trainer (else /tmp/rgt-UID) and exits after 10 idle minutes "
        "(RGT_DAEMON_IDLE_S). RGT_NO_DAEMON=1: never use or start one")


def after_cli(namespace: argparse.Namespace) -> None:
    """After ``rgt health`` answered in this process: with ``--no-daemon`` stop the daemons; otherwise, where one
    could have answered (this machine, real NVML working, not disabled), start one for the next call."""
    if getattr(namespace, NO_DAEMON_DEST, False):
        stop_all()
        return
    from .health.tool import FAKE_ENV
    from .nvml_session import session

    status = session().last_status
    if (not wanted(os.environ) or getattr(namespace, "host", None) or os.environ.get(FAKE_ENV)
            or status is None or not status.ok):
        return
    sys.stdout.flush()  # the answer first: starting a process takes a few milliseconds
    start(os.environ)


def take_lock(path: str) -> int | None:
    """The lock of the daemon of socket ``path``, held until its fd is closed (or the process ends); None when a
    daemon holds it (running, or starting) or it cannot be opened."""
    import fcntl

    try:
        fd = os.open(path.removesuffix(".sock") + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def start(environ: Mapping[str, str]) -> int | None:
    """Start the daemon for ``environ`` detached, unless one holds its lock; its pid, or None."""
    path = socket_path(key_material(environ), create=True)
    lock = None if path is None else take_lock(path)
    if lock is None:
        return None
    os.close(lock)  # free again for the daemon, which takes it for its life
    from .detach import spawn_detached
    from .nvml_session import python_command
    from .processes.snapshot import HELPER_ENV

    try:
        return spawn_detached(python_command("healthd"), path.removesuffix(".sock") + ".log", cwd="/",
                              env={**environ, HELPER_ENV: "health-daemon"})
    except OSError:
        return None


def sockets() -> list[str]:
    """The sockets of this user's health daemons (of any key)."""
    directory = runtime_dir()
    if directory is None:
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.startswith("health-") and name.endswith(".sock"))


def ask(path: str, kind: str) -> int | None:
    """``ping`` (the daemon's pid) or ``stop`` (0 once it agreed to exit) one daemon; None when it did not answer."""
    try:
        with _connect(path) as conn:
            conn.sendall(_request(kind))
            while True:
                what, data = read_frame(conn)
                if what == STDOUT:
                    return int(data)
                if what != STDERR:
                    return 0 if what == EXIT else None
    except (OSError, ValueError):
        return None


def stop_all() -> int:
    """Ask every health daemon of this user to exit; how many agreed."""
    return sum(ask(path, "stop") == 0 for path in sockets())


# --- the daemon ---------------------------------------------------------------------------------------


class _Stream:
    """``sys.stdout`` or ``sys.stderr`` of one request: its text goes out as frames while ``live``, else is held."""

    encoding = "utf-8"

    def __init__(self, kind: bytes, send: Callable[[bytes, str], None]):
        self.kind, self.send = kind, send
        self.live = False
        self.held: list[str] = []

    def write(self, text: str) -> int:
        if self.live:
            self.send(self.kind, text)
        else:
            self.held.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def go_live(self) -> None:
        self.live = True
        if self.held:
            self.send(self.kind, "".join(self.held))
            self.held.clear()


def run_cli(argv: Sequence[str], send: Callable[[bytes, str], None]) -> int | None:
    """``rgt <argv>`` as cli.main runs it, stdout and stderr sent through ``send``; its exit status, or None (and
    nothing sent) when the words are not a request for this daemon: the caller runs the normal path."""
    from contextlib import redirect_stderr, redirect_stdout

    from . import cli

    out, err = _Stream(STDOUT, send), _Stream(STDERR, send)
    with redirect_stdout(out), redirect_stderr(err):  # type: ignore[type-var]
        try:
            namespace = cli.parse(list(argv))
        except SystemExit:  # --help or a usage error: the normal path prints them for the caller's terminal
            return None
        spec = getattr(namespace, "spec", None)
        if (spec is None or spec.cli != COMMAND or getattr(namespace, "host", None)
                or getattr(namespace, NO_DAEMON_DEST, False)):
            return None
        err.go_live()  # progress lines as they come
        code = cli.run_spec(spec, namespace)
    send(STDOUT, "".join(out.held))
    return code


class _Request:
    def __init__(self) -> None:
        self.kind = ""
        self.material = ""
        self.cwd = b"/"
        self.argv: list[str] = []
        self.environ: dict[bytes, bytes] = {}


def _read_request(conn: socket.socket) -> _Request:
    request = _Request()
    while True:
        kind, data = read_frame(conn)
        if kind == END:
            return request
        if kind == KIND:
            request.kind = data.decode()
        elif kind == MATERIAL:
            request.material = _text(data)
        elif kind == CWD:
            request.cwd = data
        elif kind == ARG:
            request.argv.append(os.fsdecode(data))
        elif kind == ENV:
            name, _, value = data.partition(b"=")
            request.environ[name] = value


class _AsCaller:
    """The caller's environment and working directory for the length of its request (one request at a time)."""

    def __init__(self, environ: dict[bytes, bytes], cwd: bytes):
        self.environ, self.cwd = environ, cwd
        self.saved: dict[bytes, bytes] = {}

    def __enter__(self) -> None:
        os.chdir(self.cwd)  # first: when it fails, nothing has changed
        self.saved = dict(os.environb)
        os.environb.clear()
        os.environb.update(self.environ)

    def __exit__(self, *_exc: object) -> None:
        os.environb.clear()
        os.environb.update(self.saved)
        os.chdir("/")


def _identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _loaded_library(pid: int | None, name: str) -> str | None:
    """The file of the shared library ``name`` mapped into process ``pid`` (from /proc/<pid>/maps), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:  # address perms offset device inode [path]
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and name in os.path.basename(fields[5].strip()):
                    return fields[5].strip()
    except OSError:
        return None
    return None


def _log(message: str) -> None:
    import time

    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} health daemon {os.getpid()}: {message}", flush=True)


class Daemon:
    """Serves one socket until idle (module docstring, "Lifetime")."""

    def __init__(self, environ: dict[str, str], material: str, path: str, idle_s: float):
        self.environ, self.material, self.path, self.idle_s = environ, material, path, idle_s
        self.library: tuple[str, tuple[int, int] | None] | None = None
        """The libnvidia-ml its NVML worker loaded, and that file's identity then."""

    def driver_changed(self) -> bool:
        """Whether the NVIDIA library file its worker loaded was replaced or removed (a driver upgrade). A fresh
        process would now load the new one (and, until a reboot, fail with a driver/library mismatch), so this
        daemon's answers would no longer be the normal path's: it stops answering and exits."""
        return self.library is not None and _identity(self.library[0]) != self.library[1]

    def warm_up(self) -> bool:
        """NVML initialised (in the worker), the CLI, the health tool and the probe's lazy imports loaded, by one
        ``rgt health --json`` whose answer goes nowhere. False when NVML does not work: nothing to keep warm."""
        from .nvml_session import session

        status = session().status(30)
        if not status.ok:
            _log(f"NVML does not work here ({status.reason}: {status.detail}); not serving")
            return False
        run_cli([COMMAND, "--json"], lambda kind, text: None)
        library = _loaded_library(session().worker_pid, "libnvidia-ml")
        self.library = None if library is None else (library, _identity(library))
        return True

    def serve(self) -> str:
        """Answer requests until one of the ends in the module docstring; which one."""
        import time

        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fresh = f"{self.path}.{os.getpid()}"
        if os.path.lexists(fresh):
            os.unlink(fresh)
        listener.bind(fresh)
        os.chmod(fresh, 0o600)
        listener.listen(64)
        os.replace(fresh, self.path)  # atomic: a caller finds the old socket or ours, never none
        mine = _identity(self.path)
        _log(f"serving {self.path} (exits after {self.idle_s:g} s without a request)")
        try:
            last = time.monotonic()
            while True:
                left = self.idle_s - (time.monotonic() - last)
                if left <= 0:
                    return f"idle for {self.idle_s:g} s"
                listener.settimeout(min(left, CHECK_EVERY_S))
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    if _identity(self.path) != mine:
                        return "its socket was removed or replaced"
                    if key_material(self.environ) != self.material:
                        return "the package's code changed"
                    if self.driver_changed():
                        return "the NVIDIA driver's library changed"
                    continue
                with conn:
                    stop = self.handle(conn)
                last = time.monotonic()
                if stop:
                    return stop
        finally:
            listener.close()
            if _identity(self.path) == mine:
                os.unlink(self.path)

    def handle(self, conn: socket.socket) -> str | None:
        """One connection; why the daemon must stop now, or None. Never raises: a bad request costs its answer."""
        def send(kind: bytes, text: str) -> None:
            conn.sendall(frame(kind, _bytes(text)))

        try:
            conn.settimeout(10.0)
            if not same_user(peer_uid(conn)):
                _log(f"refused a connection from uid {peer_uid(conn)}")
                return None
            request = _read_request(conn)
            if request.kind == "ping":
                send(STDOUT, str(os.getpid()))
                send(EXIT, "0")
                return None
            if request.kind == "stop":
                send(EXIT, "0")
                return "asked to stop"
            if request.kind != COMMAND or request.material != self.material:
                send(FALL_BACK, "another command" if request.kind != COMMAND else "another code or environment")
                return None
            if self.driver_changed():
                send(FALL_BACK, "the NVIDIA driver's library changed")
                return "the NVIDIA driver's library changed"
            conn.sendall(frame(ACCEPTED))
            with _AsCaller(request.environ, request.cwd):
                code = run_cli(request.argv, send)
            if code is None:
                send(FALL_BACK, "not a request for the daemon")
            else:
                send(EXIT, str(code))
        except (OSError, ValueError):  # the caller left, or sent nonsense: it answers itself
            pass
        except Exception as err:  # a bug under the CLI: the caller falls back to the normal path, which shows it
            _log(f"request failed: {type(err).__name__}: {err}")
            try:
                send(FALL_BACK, f"{type(err).__name__}: {err}")
            except OSError:
                pass
        return None


def idle_seconds(environ: Mapping[str, str]) -> float:
    try:
        return max(float(environ.get(IDLE_ENV) or DEFAULT_IDLE_S), 1.0)
    except ValueError:
        return DEFAULT_IDLE_S


def main() -> None:
    """The daemon process, started by :func:`start`."""
    import contextlib
    import signal

    from .nvml_session import session
    from .processes.snapshot import HELPER_ENV

    environ = {name: value for name, value in os.environ.items() if name != HELPER_ENV}
    material = key_material(environ)
    path = socket_path(material, create=True)
    if path is None:
        _log("no private runtime directory (XDG_RUNTIME_DIR, else TMPDIR or /tmp: rgt-UID, mode 0700); not serving")
        return
    if take_lock(path) is None:  # another daemon of this key is running or starting
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    daemon = Daemon(environ, material, path, idle_seconds(environ))
    try:
        if daemon.warm_up():
            _log(f"exiting: {daemon.serve()}")
            for leftover in (".lock", ".log"):  # a clean end leaves nothing behind; a failure keeps its log
                with contextlib.suppress(OSError):
                    os.unlink(path.removesuffix(".sock") + leftover)
    finally:
        session().close()


def pids() -> list[int]:
    """The pids of this user's running health daemons (each asked over its socket)."""
    return [pid for pid in (ask(path, "ping") for path in sockets()) if pid]
