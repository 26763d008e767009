"""Loopback SSH "boxes" for tests that look like freshly rented boxes: real servers on 127.0.0.1, reached by the
real ``ssh`` client.

Two servers, so the remote code is proven against both and the suite runs where either exists:

* OpenSSH ``sshd`` (Debian's ``openssh-server``), started unprivileged-style with a private config, host key
  and ``authorized_keys``; ``SetEnv`` gives each box its own ``HOME``, ``PATH`` and ``RGT_HEALTH_FAKE``.
* an in-process server from ``asyncssh`` (a dev dependency) that runs each requested command with
  ``/bin/sh -c`` in a subprocess with the same per-box environment.

What a box looks like (its private HOME is ``<root>/homes/<alias>``)::

    python3 (on PATH)            the machine's clean system python (:func:`clean_python`, Debian's 3.11 here):
                                 its standard library and the distribution's own packages, nothing of the
                                 test venv (no pydantic, psutil, mcp, torch), as on a fresh rented box
    ~/venvs/pt/                  the user's training environment (``box.train_python``): a venv with torch,
                                 reached through the one path file of the boxes (``TRAIN_STACK_PTH``, in
                                 this venv only), which names a folder of symlinks to torch and the
                                 distributions it requires (:func:`torch_stack`); plus ``bin/torchrun``
    ~/.profile, ~/.bashrc        Debian's, abbreviated: .profile sources .bashrc, which stops at once for a
                                 non-interactive shell (``ssh box cmd``); after that line, the user's additions:
    ~/.config/train/env          sourced by .bashrc: exports (NCCL_*, CUDA_VISIBLE_DEVICES, …) from ``LoginEnv``
    ~/.config/pip/pip.conf       the box's package index: a local mirror (the session's wheelhouse), as
                                 AutoDL-style boxes have; ``pip_index=False`` leaves it out
    ~/.cache/remote-gpu-trainer/<version>
                                 the runtime, only after ``install_runtime``: a symlink to the one runtime
                                 that the real ``rgt box install --wheels`` built for the whole test run

The runtime therefore gets its dependencies the way a user's does: ``install_runtime`` runs the real install
with ``wheels=True`` once per test run (pytest-xdist workers share it through ``shared``, under a file
lock), from a wheelhouse that ``pip download`` fills once and that is kept across test runs
(:func:`wheelhouse`, ``~/.cache/remote-gpu-trainer-tests/wheelhouse/<key>``). Every other box links to that
runtime, so each box's own python stays clean.

A box's login environment is set per box with ``Fleet.add(..., login=LoginEnv(env_file={...}))``: a node
whose ``~/.config/train/env`` exports ``NCCL_SOCKET_IFNAME=eth9`` or ``CUDA_VISIBLE_DEVICES=2`` is one line
in a test. What a non-interactive ``ssh box cmd`` sees is only the sshd environment (``env=``).

The client side is a generated ``ssh_config`` (``RGT_SSH_CONFIG``) with one ``Host`` block per alias:
``IdentitiesOnly``, its own ``UserKnownHostsFile`` and ``StrictHostKeyChecking`` per alias, so tests can
build an unknown, a changed or an accepted-on-first-use host key, a wrong client key, or a closed port.

Use (the session fixture ``ssh_fleet`` in tests/conftest.py builds one; tests/test_remote.py)::

    fleet = Fleet(tmp_path)                 # keys, config, control dir, the wheelhouse
    fleet.add("box1", scenario="healthy-8xh100")                     # sshd if installed, else asyncssh
    fleet.add("box2", scenario="ecc-dbe", server="asyncssh", login=LoginEnv(env_file={"NCCL_SOCKET_IFNAME": "eth9"}))
    fleet.add_closed("deadbox")              # an alias whose port has no listener
    with fleet.environment():                # RGT_SSH_CONFIG / RGT_SSH_CONTROL_DIR set for this block
        fleet.install_runtime("box1")        # the real `box install --wheels` once; later boxes link to it
        spec.call({"host": "box1", ...})
        spec.call({"host": "box1", "argv": [str(fleet.boxes["box1"].train_python), "train.py"], ...})
    fleet.close()

Only loopback addresses are ever contacted; the one network access is the wheelhouse's first download
from the package index (none once it is cached).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

from .box_imports import requirement_closure

#: The only .pth file the test boxes have: in the user's training venv (``~/venvs/pt``), pointing at the torch
#: stack (:func:`torch_stack`). Nothing is added to the box's system python.
TRAIN_STACK_PTH = "_train_stack.pth"
SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
#: Names a fresh box's system python must not import: the runtime's dependencies, the MCP SDK, torch, us.
_NOT_ON_A_FRESH_BOX = ("pydantic", "psutil", "pynvml", "jinja2", "hostlist", "mcp", "torch", "remote_gpu_trainer")
_PROBE = f"""
import importlib.util, json, sys, sysconfig
print(json.dumps({{"version": list(sys.version_info[:2]), "in_venv": sys.prefix != sys.base_prefix,
    "venv": all(importlib.util.find_spec(m) for m in ("venv", "ensurepip")), "platform": sysconfig.get_platform(),
    "sees": [m for m in {list(_NOT_ON_A_FRESH_BOX)!r} if importlib.util.find_spec(m)]}}))
"""


needs_torch_in_runtime = pytest.mark.xfail(strict=True, reason=(
    "needs torch in the python the box runtime runs tools with; a clean box's runtime has none, the user's torch "
    "is in box.train_python, which tools cannot be given yet (issue 25 item 2: python=)"))
"""For a remote test that needs torch where the tool runs it. Strict: once tools take or find the user's training
environment, such a test passes, and the mark must go (or the test pass ``python=box.train_python``)."""


def have_asyncssh() -> bool:
    try:
        import asyncssh  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def clean_python() -> tuple[str | None, str]:
    """(path, "") of a python that can be a fresh box's system python: 3.11 or newer, not a venv, with
    ``venv``/``ensurepip``, and none of the test venv's packages; or (None, why none was found).
    ``RGT_TEST_BOX_PYTHON`` names one; else ``/usr/bin/python3`` and ``/usr/bin/python3.N``."""
    named = os.environ.get("RGT_TEST_BOX_PYTHON")
    candidates = [named] if named else ["/usr/bin/python3", *sorted(map(str, Path("/usr/bin").glob("python3.1[1-9]")))]
    refused = []
    for candidate in candidates:
        try:
            facts = _python_facts(candidate)
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            refused.append(f"{candidate}: {err}")
            continue
        problems = [text for bad, text in (
            (tuple(facts["version"]) < (3, 11), f"python {facts['version']} < 3.11"),
            (facts["in_venv"], "a venv"), (not facts["venv"], "no venv/ensurepip (Debian: apt install python3-venv)"),
            (bool(facts["sees"]), f"sees {', '.join(facts['sees'])}")) if bad]
        if not problems:
            return candidate, ""
        refused.append(f"{candidate}: {'; '.join(problems)}")
    return None, ("no clean system python 3.11+ for the test boxes (" + "; ".join(refused or ["none found"])
                  + "): on Debian `apt install python3 python3-venv`, or set RGT_TEST_BOX_PYTHON")


@cache
def _python_facts(python: str) -> dict:
    """What :data:`_PROBE` reads from ``python`` (isolated: not this venv, not the user's site)."""
    return json.loads(subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=30,
                                     check=True).stdout)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (pytest-xdist workers, concurrent test runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wheelhouse_root() -> Path:
    """Where downloaded wheelhouses are kept across test runs: ``$RGT_TEST_WHEELHOUSE``, else
    ``$XDG_CACHE_HOME`` or ``~/.cache``, then ``remote-gpu-trainer-tests/wheelhouse``."""
    if override := os.environ.get("RGT_TEST_WHEELHOUSE"):
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "remote-gpu-trainer-tests" / "wheelhouse"


def wheelhouse(python_version: str, platform: str) -> Path:
    """The runtime's dependency wheels for a box python (``3.11``, ``manylinux2014_x86_64``), downloaded as
    ``rgt box install --wheels`` does (``download_wheels``) once per requirement set and kept across runs."""
    from remote_gpu_trainer.remote.box import download_wheels
    from remote_gpu_trainer.remote.runtime import box_requirements

    key = hashlib.sha256(json.dumps([box_requirements(), python_version, platform]).encode()).hexdigest()[:16]
    root = wheelhouse_root()
    target = root / f"py{python_version}-{platform}-{key}"
    if (target / ".complete").is_file():
        return target
    with _locked(root / ".lock"):
        if (target / ".complete").is_file():
            return target
        shutil.rmtree(target, ignore_errors=True)
        partial = Path(tempfile.mkdtemp(prefix=".download-", dir=root))
        try:
            download_wheels(python_version, platform, partial)
        except RuntimeError as err:
            shutil.rmtree(partial, ignore_errors=True)
            raise RuntimeError(f"could not download the runtime's wheels into {root} (the package index must be "
                               f"reachable once; later runs use the cache): {err}") from err
        (partial / ".complete").write_text(json.dumps(box_requirements()) + "\n")
        partial.rename(target)
    return target


def torch_stack(into: Path) -> Path | None:
    """A folder of symlinks to this venv's torch, numpy where installed (torch warns at import without it) and
    the distributions they require (their packages and dist-info), or None without torch. The user's venv on
    a test box sees exactly this, not the test venv."""
    try:
        metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return None
    into.mkdir(parents=True, exist_ok=True)
    for name in requirement_closure("torch", "numpy"):
        dist = metadata.distribution(name)
        for top in {Path(f).parts[0] for f in dist.files or [] if Path(f).parts[0] not in ("..", "__pycache__")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (into / top).exists():
                (into / top).symlink_to(source)
    return into


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
class LoginEnv:
    """A box user's shell start-up files. Values are shell text inside double quotes (``$HOME`` expands).

    Everything here lies after Debian's ``.bashrc`` line that stops a non-interactive shell, so a plain
    ``ssh box cmd`` sees none of it; an interactive or login shell on the box (a person's terminal, a
    launch script they run there) sees all of it, ``profile`` first.
    """

    env_file: dict[str, str] = field(default_factory=lambda: {"NCCL_DEBUG": "WARN"})
    """``~/.config/train/env``, sourced by ``~/.bashrc``."""
    bashrc: dict[str, str] = field(default_factory=dict)
    """Exported at the end of ``~/.bashrc``."""
    profile: dict[str, str] = field(default_factory=dict)
    """Exported by ``~/.profile`` (login shells), before it sources ``~/.bashrc``."""
    activate_venv: bool = True
    """``~/.bashrc`` ends with ``. ~/venvs/pt/bin/activate``, as many users' do."""


def _exports(values: dict[str, str]) -> str:
    return "".join(f'export {name}="{value}"\n' for name, value in values.items())


@dataclass
class Box:
    alias: str
    port: int
    home: Path
    env: dict[str, str]
    server: str
    stop: object = None
    extra_config: list[str] = field(default_factory=list)
    train_python: Path | None = None
    """The user's training interpreter on the box (``~/venvs/pt/bin/python``, torch importable); None when the
    box has no training venv or this machine has no torch."""
    login: LoginEnv = field(default_factory=LoginEnv)


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
    """Keys, a client config and any number of loopback boxes under one directory.

    ``shared`` is a directory every pytest-xdist worker of one test run sees (the runtime is installed there
    once); it defaults to ``root``. Raises RuntimeError when this machine has no clean python for the boxes
    (:func:`clean_python` says why).
    """

    def __init__(self, root: Path, shared: Path | None = None):
        from remote_gpu_trainer.remote.box import wheel_platform

        python, why = clean_python()
        if python is None:
            raise RuntimeError(why)
        self.root = root
        self.shared = shared or root
        root.mkdir(parents=True, exist_ok=True)
        self.box_python = python
        facts = _python_facts(python)
        version = "{}.{}".format(*facts["version"])
        self.wheelhouse = wheelhouse(version, wheel_platform(facts["platform"]))
        # the box's system bin: python3 and python3.N are the clean python, whatever else /usr/local/bin holds
        self.system_bin = root / "system-bin"
        self.system_bin.mkdir(exist_ok=True)
        for name in ("python3", f"python{version}"):
            with contextlib.suppress(FileExistsError):
                (self.system_bin / name).symlink_to(python)
        # the user's training venv needs torch's ABI: same python minor as this venv, else this venv's base python
        same_minor = tuple(facts["version"]) == sys.version_info[:2]
        self.train_base = python if same_minor else sys._base_executable  # type: ignore[attr-defined]
        self.torch_stack = torch_stack(root / "torch-stack")
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
        self._write_config()

    # -- boxes ---------------------------------------------------------------------------------------
    def path_for(self, home: Path, bin_dirs: Sequence[str | Path] = ()) -> str:
        """The PATH a non-interactive ``ssh box cmd`` gets: ``bin_dirs``, ``~/.local/bin``, the system's."""
        return ":".join([*map(str, bin_dirs), f"{home}/.local/bin", str(self.system_bin), "/usr/local/bin",
                         "/usr/bin", "/bin"])

    def _home(self, home: Path, login: LoginEnv, pip_index: bool, train_venv: bool) -> Path | None:
        """Write a fresh box user's home; returns the training venv's python (None: no venv, or no torch)."""
        (home / ".local" / "bin").mkdir(parents=True, exist_ok=True)
        (home / ".profile").write_text(
            "# ~/.profile: executed by the command interpreter for login shells (Debian's, abbreviated).\n"
            + _exports(login.profile)
            + 'if [ -n "$BASH_VERSION" ] && [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi\n'
            'if [ -d "$HOME/bin" ]; then PATH="$HOME/bin:$PATH"; fi\n'
            'if [ -d "$HOME/.local/bin" ]; then PATH="$HOME/.local/bin:$PATH"; fi\n')
        (home / ".config" / "train").mkdir(parents=True, exist_ok=True)
        (home / ".config" / "train" / "env").write_text(_exports(login.env_file))
        activate = '. "$HOME/venvs/pt/bin/activate"\n' if login.activate_venv and train_venv else ""
        (home / ".bashrc").write_text(
            "# ~/.bashrc: executed by bash(1) for non-login shells (Debian's, abbreviated).\n"
            "# If not running interactively, don't do anything\n"
            "case $- in\n    *i*) ;;\n      *) return;;\nesac\nHISTCONTROL=ignoreboth\n"
            '# the user\'s additions\n[ -f "$HOME/.config/train/env" ] && . "$HOME/.config/train/env"\n'
            + _exports(login.bashrc) + activate)
        if pip_index:  # the box's package index: a local mirror, as boxes behind a mirror have it
            (home / ".config" / "pip").mkdir(parents=True, exist_ok=True)
            (home / ".config" / "pip" / "pip.conf").write_text(
                f"[global]\nno-index = true\nfind-links = {self.wheelhouse}\n")
        if not train_venv:
            return None
        venv = home / "venvs" / "pt"
        subprocess.run([self.train_base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        if self.torch_stack is None:
            return None
        # The one .pth of the test boxes (TRAIN_STACK_PTH), and it is inside the user's training venv on the
        # box: the box's system python, which the runtime uses, sees nothing of this machine's packages.
        user_venv_packages = next((venv / "lib").glob("python3.*/site-packages"))
        (user_venv_packages / TRAIN_STACK_PTH).write_text(f"{self.torch_stack}\n")
        torchrun = venv / "bin" / "torchrun"
        torchrun.write_text(f"#!{venv}/bin/python\nimport sys\nfrom torch.distributed.run import main\n"
                            "sys.exit(main())\n")
        torchrun.chmod(0o755)
        return venv / "bin" / "python"

    def add(self, alias: str, scenario: str | None = None, server: str | None = None,
            env: dict[str, str] | None = None, known: bool = True, interactive_only: bool = False,
            login: LoginEnv | None = None, bin_dirs: Sequence[str | Path] = (), pip_index: bool = True,
            train_venv: bool = True, home: Path | None = None) -> Box:
        """Start a box (see the module docstring for what its home holds).

        ``env``: the sshd session's environment (what ``ssh box cmd`` sees), over HOME/PATH/LANG;
        ``bin_dirs``: put first on that PATH; ``login``: the shell start-up files' exports;
        ``pip_index=False``: the box has no package index; ``train_venv=False``: no ``~/venvs/pt``;
        ``known=False`` leaves its host key out of known_hosts (accept-new applies); ``interactive_only``
        (asyncssh) answers every command with a banner, like a shell-only proxy.
        """
        if interactive_only:
            server = "asyncssh"
        server = server or ("sshd" if SSHD else "asyncssh")
        login = login or LoginEnv()
        home = home or self.root / "homes" / alias
        train_python = self._home(home, login, pip_index, train_venv)
        box_env = {"HOME": str(home), "PATH": self.path_for(home, bin_dirs), "LANG": "C.UTF-8",
                   **({"RGT_HEALTH_FAKE": scenario} if scenario else {}), **(env or {})}
        port = free_port()
        if server == "sshd":
            stop = self._start_sshd(alias, port, box_env)
        else:
            stop = _AsyncsshServer(port, self.host_key, self.authorized, box_env, interactive_only)
        _wait_listening(port)
        box = Box(alias, port, home, box_env, server, stop, train_python=train_python, login=login)
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
        """RGT_SSH_CONFIG / RGT_SSH_CONTROL_DIR for the fleet, and pip here reads the wheelhouse instead of the
        package index (``rgt box install --wheels`` downloads the boxes' wheels with pip)."""
        values = {"RGT_SSH_CONFIG": str(self.config), "RGT_SSH_CONTROL_DIR": str(self.control_dir),
                  "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(self.wheelhouse)}
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def install_runtime(self, alias: str):
        """Give a box this checkout's runtime. Once per test run (under a lock in ``shared``), the real
        ``rgt box install --wheels`` builds it on a box of its own (``runtime-installer``, its HOME in
        ``shared``); every box then gets a symlink to it, so its own python stays clean. Returns the install's
        report when this call ran it, else None."""
        from remote_gpu_trainer.remote.box import install
        from remote_gpu_trainer.remote.hosts import parse_host
        from remote_gpu_trainer.remote.runtime import runtime_version

        version = runtime_version()
        installer_home = self.shared / "runtime-home"
        runtime = installer_home / ".cache" / "remote-gpu-trainer" / version
        report = None
        with _locked(self.shared / "runtime.lock"):
            if not (runtime / "ready").is_file():
                installer = f"runtime-installer-{len(self.boxes)}"
                self.add(installer, home=installer_home, train_venv=False)
                with self.environment():
                    report = install(parse_host(installer), wheels=True)
        target = self.boxes[alias].home / ".cache" / "remote-gpu-trainer"
        target.mkdir(parents=True, exist_ok=True)
        if not (target / version).exists() and target / version != runtime:
            (target / version).symlink_to(runtime)
        return report

    def ssh(self, alias: str, command: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
        """``ssh alias command`` with the fleet's config, text in and out (the remote shell parses ``command``)."""
        return subprocess.run(["ssh", "-F", str(self.config), "-o", "BatchMode=yes", alias, command], input=stdin,
                              capture_output=True, text=True, timeout=timeout)

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
