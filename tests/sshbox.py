"""Loopback SSH "boxes" for tests: real servers on 127.0.0.1, reached by the real ``ssh`` client.

Two servers, so the remote code is proven against both and the suite runs where either exists:

* OpenSSH ``sshd`` (Debian's ``openssh-server``), started unprivileged-style with a private config, host key
  and ``authorized_keys``; ``SetEnv`` gives each box its own ``HOME``, ``PATH`` and ``RGT_HEALTH_FAKE``.
* an in-process server from ``asyncssh`` (a dev dependency) that runs each requested command with
  ``/bin/sh -c`` in a subprocess with the same per-box environment.

Every box has a private HOME: its own ``~/.cache/remote-gpu-trainer`` (runtime, runs, guard records) and no
``.bashrc``. The box's ``python3`` is this interpreter's base python, and a ``.pth`` file in the box's user
site-packages points at the test venv's site-packages, so the box sees torch, pydantic, psutil and pynvml
without downloading anything (the runtime must not run python with ``-I`` or ``-s``).

The client side is a generated ``ssh_config`` (``RGT_SSH_CONFIG``) with one ``Host`` block per alias:
``IdentitiesOnly``, its own ``UserKnownHostsFile`` and ``StrictHostKeyChecking`` per alias, so tests can
build an unknown, a changed or an accepted-on-first-use host key, a wrong client key, or a closed port.

Use (the session fixture ``ssh_fleet`` in tests/conftest.py builds one; tests/test_remote.py)::

    fleet = Fleet(tmp_path)                 # keys, config, control dir
    fleet.add("box1", scenario="healthy-8xh100")                     # sshd if installed, else asyncssh
    fleet.add("box2", scenario="ecc-dbe", server="asyncssh")
    fleet.add_closed("deadbox")              # an alias whose port has no listener
    with fleet.environment():                # RGT_SSH_CONFIG / RGT_SSH_CONTROL_DIR set for this block
        fleet.install_runtime("box1")        # the real `box install`; other boxes share it via symlink
        spec.call({"host": "box1", ...})
    fleet.close()

Only loopback addresses are ever contacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


def have_asyncssh() -> bool:
    try:
        import asyncssh  # noqa: F401
    except ImportError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rgt-test", "-f", str(path)], check=True)


@dataclass
class Box:
    alias: str
    port: int
    home: Path
    env: dict[str, str]
    server: str
    stop: object = None
    extra_config: list[str] = field(default_factory=list)


class _AsyncsshServer:
    """asyncssh in a background thread with its own event loop; each command runs in a real subprocess."""

    def __init__(self, port: int, host_key: Path, authorized: Path, env: dict[str, str],
                 interactive_only: bool = False):
        import asyncssh

        self.loop = asyncio.new_event_loop()
        self.children: set[int] = set()

        async def handle(process) -> None:
            if not process.command or interactive_only:  # like a provider proxy that only opens a shell
                process.stdout.write(b"this endpoint only offers an interactive shell\r\n")
                process.exit(1)
                return
            child = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", process.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=env["HOME"], start_new_session=True)
            self.children.add(child.pid)

            async def feed() -> None:  # client → command; EOF closes the command's stdin, as sshd does
                try:
                    while data := await process.stdin.read(65536):
                        child.stdin.write(data)
                        await child.stdin.drain()
                except (OSError, asyncssh.Error):
                    pass
                finally:
                    child.stdin.close()

            async def drain(reader, writer) -> None:  # command → client, until the command closes it
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()

            feeding = asyncio.ensure_future(feed())
            try:
                await asyncio.gather(drain(child.stdout, process.stdout), drain(child.stderr, process.stderr))
                process.exit(await child.wait())
            except (OSError, asyncssh.Error):  # the client went away: end the command like sshd would
                if child.returncode is None:
                    child.kill()
                    await child.wait()
            finally:
                feeding.cancel()
                self.children.discard(child.pid)

        async def start():
            return await asyncssh.create_server(
                asyncssh.SSHServer, "127.0.0.1", port, server_host_keys=[str(host_key)],
                authorized_client_keys=str(authorized), process_factory=handle, encoding=None)

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=10)

    def close(self) -> None:
        async def stop():
            self.server.close()
            await self.server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class Fleet:
    """Keys, a client config and any number of loopback boxes under one directory."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.host_key = root / "host_ed25519"
        self.client_key = root / "client_ed25519"
        self.other_key = root / "stranger_ed25519"
        for key in (self.host_key, self.client_key, self.other_key):
            _keygen(key)
        self.authorized = root / "authorized_keys"
        self.authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        # ControlPath sockets need a short path (~104-108 bytes): not under pytest's deep tmp dirs.
        self.control_dir = Path(tempfile.mkdtemp(prefix="rgt-cm-"))
        self.config = root / "ssh_config"
        self.boxes: dict[str, Box] = {}
        self._blocks: list[str] = []
        self.runtime_owner: str | None = None
        self._write_config()

    # -- boxes ---------------------------------------------------------------------------------------
    def _home(self, alias: str) -> Path:
        home = self.root / "homes" / alias
        (home / ".local" / "bin").mkdir(parents=True, exist_ok=True)
        python = home / ".local" / "bin" / "python3"
        if not python.exists():
            python.symlink_to(sys._base_executable)  # type: ignore[attr-defined]
        site = home / ".local" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        site.mkdir(parents=True, exist_ok=True)
        (site / "rgt-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        return home

    def add(self, alias: str, scenario: str | None = None, server: str | None = None,
            env: dict[str, str] | None = None, known: bool = True, interactive_only: bool = False) -> Box:
        """Start a box. ``known=False`` leaves its host key out of known_hosts (accept-new applies);
        ``interactive_only`` (asyncssh) answers every command with a banner, like a shell-only proxy."""
        if interactive_only:
            server = "asyncssh"
        server = server or ("sshd" if SSHD else "asyncssh")
        home = self._home(alias)
        box_env = {"HOME": str(home), "PATH": f"{home}/.local/bin:/usr/local/bin:/usr/bin:/bin",
                   "LANG": "C.UTF-8", **({"RGT_HEALTH_FAKE": scenario} if scenario else {}), **(env or {})}
        port = free_port()
        if server == "sshd":
            stop = self._start_sshd(alias, port, box_env)
        else:
            stop = _AsyncsshServer(port, self.host_key, self.authorized, box_env, interactive_only)
        _wait_listening(port)
        box = Box(alias, port, home, box_env, server, stop)
        self.boxes[alias] = box
        known_hosts = self.root / f"known_hosts.{alias}"
        if known:
            known_hosts.write_text(f"[127.0.0.1]:{port} {self.host_key.with_suffix('.pub').read_text()}")
        self.add_alias(alias, port, known_hosts=known_hosts, strict=None if not known else "yes")
        return box

    def _start_sshd(self, alias: str, port: int, env: dict[str, str]):
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        conf = self.root / f"sshd_config.{alias}"
        pairs = " ".join(f"{k}={v}" for k, v in env.items())
        conf.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {self.host_key}",
            f"PidFile {self.root / f'sshd.{alias}.pid'}", f"AuthorizedKeysFile {self.authorized}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PermitRootLogin prohibit-password", "PrintMotd no", f"SetEnv {pairs}", ""]))
        log = self.root / f"sshd.{alias}.log"
        return subprocess.Popen([SSHD, "-D", "-f", str(conf), "-E", str(log)], stdin=subprocess.DEVNULL)

    def add_alias(self, alias: str, port: int, known_hosts: Path | None = None, strict: str | None = "yes",
                  identity: Path | None = None) -> None:
        lines = [f"Host {alias}", "  HostName 127.0.0.1", f"  Port {port}", f"  User {_user()}",
                 f"  IdentityFile {identity or self.client_key}", "  IdentitiesOnly yes",
                 f"  UserKnownHostsFile {known_hosts or self.root / f'known_hosts.{alias}'}",
                 "  GlobalKnownHostsFile /dev/null", "  LogLevel ERROR"]
        if strict:
            lines.append(f"  StrictHostKeyChecking {strict}")
        self._blocks.append("\n".join(lines))
        self._write_config()

    def add_closed(self, alias: str) -> None:
        """An alias whose port has no listener (connection refused)."""
        self.add_alias(alias, free_port())

    def _write_config(self) -> None:
        self.config.write_text("\n\n".join(self._blocks) + "\n")

    # -- environment and runtime -------------------------------------------------------------------------
    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        saved = {k: os.environ.get(k) for k in ("RGT_SSH_CONFIG", "RGT_SSH_CONTROL_DIR")}
        os.environ["RGT_SSH_CONFIG"] = str(self.config)
        os.environ["RGT_SSH_CONTROL_DIR"] = str(self.control_dir)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def install_runtime(self, alias: str):
        """The real install on the first box; later boxes get a symlink to that runtime (same interpreter)."""
        from remote_gpu_trainer.remote.box import install
        from remote_gpu_trainer.remote.hosts import parse_host
        from remote_gpu_trainer.remote.runtime import runtime_version

        version = runtime_version()
        if self.runtime_owner is None:
            report = install(parse_host(alias))
            self.runtime_owner = alias
            return report
        target = self.boxes[alias].home / ".cache" / "remote-gpu-trainer"
        target.mkdir(parents=True, exist_ok=True)
        link = target / version
        if not link.exists():
            link.symlink_to(self.boxes[self.runtime_owner].home / ".cache" / "remote-gpu-trainer" / version)
        return None

    def box_processes(self, alias: str) -> list:
        """Processes of ours still running for a box (their command line names that box's runtime)."""
        import psutil

        marker = str(self.boxes[alias].home)
        found = []
        for proc in psutil.process_iter(["cmdline", "environ"]):
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(proc.info["cmdline"] or [])
                env = proc.info.get("environ") or {}
                if "remote_gpu_trainer" in cmd and (marker in cmd or env.get("HOME") == marker):
                    found.append(proc)
        return found

    def close(self) -> None:
        from remote_gpu_trainer.remote.session import POOL

        POOL.close_all()
        for alias in self.boxes:  # end the ControlPersist masters
            subprocess.run(["ssh", "-F", str(self.config), "-o", f"ControlPath={self.control_dir}/%C", "-O", "exit",
                            alias], capture_output=True, stdin=subprocess.DEVNULL, timeout=10, check=False)
        for sock in self.control_dir.glob("*"):
            with contextlib.suppress(OSError):
                sock.unlink()
        for box in self.boxes.values():
            if isinstance(box.stop, subprocess.Popen):
                box.stop.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    box.stop.wait(timeout=5)
            elif box.stop is not None:
                box.stop.close()  # type: ignore[attr-defined]
        shutil.rmtree(self.control_dir, ignore_errors=True)


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
