"""Which processes must never be signalled, and why: the refusal rules of every kill in this skill.

``refusal(info, caller, policy)`` returns ``None`` (may be signalled) or a :class:`Refusal` with a
stable ``code`` and a sentence for the user. The rules, in the order they are checked:

``gone``            the process no longer exists.
``pid_le_1``        pid 0/1: the init of the machine or of the container; killing it ends everything.
``self``            this server or CLI process.
``ancestor``        a parent, grandparent, ... of this process: the MCP client (Claude Code, Gemini
                    CLI), the shell that runs ``rgt``, its sshd session.
``session``         the caller's session leader (its login shell or terminal session).
``kernel_thread``   no command line: a kernel thread, or a process we cannot identify.
``zombie``          already dead; it holds no port, memory or GPU. The report names its parent,
                    which must reap it (ending or fixing the parent clears it).
``other_user``      owned by another uid. Allowed only when running as root *and* the caller passed
                    ``allow_other_users``; without root the kernel would refuse anyway.
``protected``       system and access processes: sshd, systemd, init, container runtimes, kubelet,
                    tmux/screen servers, Jupyter and remote-IDE servers, provider proxies. Killing
                    one cuts the user off the machine or breaks the box; no flag overrides this.
``login_shell``     a login shell (argv[0] starts with ``-``, e.g. ``-bash``) or a shell that leads
                    its own session (a terminal or tmux pane): killing it hangs up everything
                    started from it.
``uninterruptible`` D state: blocked in the kernel (driver, NFS, dead GPU). Signals wait until the
                    call returns, which may be never; reported, not signalled.
``no_start_time``   start time unreadable: it could not be told apart from a successor on its pid.

Matching is on the process name and on the first words of the command line, never on substrings
of arguments, so ``python train.py --resume sshd.ckpt`` is not mistaken for sshd.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import psutil

from .snapshot import DISK_SLEEP, ZOMBIE, ProcInfo

PROTECTED_NAMES: frozenset[str] = frozenset({
    # init and service managers
    "init", "systemd", "upstart", "launchd", "tini", "dumb-init", "docker-init", "s6-svscan",
    "s6-supervise", "runit", "runsvdir", "supervisord", "cron", "crond", "atd",
    # remote access and the user's sessions
    "sshd", "sshd-session", "sshd-auth", "dropbear", "mosh-server", "login", "agetty", "getty",
    "su", "sudo", "doas", "tmux", "tmux: server", "screen", "SCREEN", "zellij", "abduco", "dtach",
    "Xvfb", "Xorg", "x11vnc", "vncserver", "Xvnc", "tailscaled", "wireguard", "openvpn",
    # container runtimes and orchestration
    "dockerd", "docker", "docker-proxy", "containerd", "runc", "crun", "conmon", "podman",
    "crio", "kubelet", "kube-proxy", "k3s", "k3s-server", "k3s-agent", "pause",
    # system daemons whose loss breaks the box
    "dbus-daemon", "dbus-broker", "polkitd", "rsyslogd", "journald", "udevd", "chronyd", "ntpd",
    "nvidia-persistenced", "nv-hostengine", "nvidia-fabricmanager", "dcgm-exporter", "nscd",
    "sssd", "nslcd", "NetworkManager", "networkd", "resolved",
    # web/notebook front doors of GPU rentals (RunPod, vast.ai, AutoDL serve the user through these)
    "nginx", "caddy", "jupyter", "jupyter-lab", "jupyter-notebook", "jupyter-server", "jupyterhub",
    "code-server", "ttyd", "filebrowser", "syncthing",
})
PROTECTED_PREFIXES: tuple[str, ...] = ("systemd-", "containerd-", "kube-", "sshd:", "docker-", "runsv")

# Words in the command line (path components of its first two arguments, or a ``-m`` module)
# that mark a protected process even when its name is just "node" or "python".
PROTECTED_MODULES: frozenset[str] = frozenset({
    "jupyter", "jupyterlab", "jupyter_server", "notebook", "jupyterhub", "ipykernel_launcher",
    "ipykernel", "supervisor", "supervisord",
})
PROTECTED_PATH_PARTS: frozenset[str] = frozenset({
    ".vscode-server", ".vscode-server-insiders", ".cursor-server", ".windsurf-server",
    ".vscode-remote", "code-server", ".jetbrains", "JetBrains", ".zed_server",
})

SHELLS: frozenset[str] = frozenset({"bash", "sh", "dash", "zsh", "fish", "ksh", "mksh", "tcsh", "csh", "ash",
                                    "busybox"})


@dataclass(frozen=True)
class Refusal:
    code: str
    detail: str


@dataclass(frozen=True)
class Caller:
    """The process asking for the kill, and what must be spared because of it."""

    pid: int
    uid: int
    ancestors: frozenset[int]
    session_leader: int | None = None

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    @classmethod
    def current(cls) -> Caller:
        me = psutil.Process()
        try:
            leader: int | None = os.getsid(0)
        except OSError:
            leader = None
        return cls(pid=me.pid, uid=os.getuid(), ancestors=frozenset(p.pid for p in me.parents()),
                   session_leader=leader)


@dataclass(frozen=True)
class Policy:
    """What the caller explicitly allowed. Everything else is refused by default."""

    allow_other_users: bool = False
    extra_protected_names: frozenset[str] = field(default_factory=frozenset)


DEFAULT_POLICY = Policy()


def _words(info: ProcInfo) -> set[str]:
    """Basenames of the first two arguments and a ``-m`` module: what the process *is*, not what it
    was told to work on (``python -m jupyter lab`` → {python, jupyter})."""
    words: set[str] = set()
    argv = list(info.cmdline)
    for arg in argv[:2]:
        if arg and not arg.startswith("-"):
            words.add(PurePosixPath(arg).name)
    if "-m" in argv[:3]:
        index = argv.index("-m")
        if index + 1 < len(argv):
            words.add(argv[index + 1].split(".")[0])
    return words


def protected_reason(info: ProcInfo, extra: frozenset[str] = frozenset()) -> str | None:
    """Why this process is protected, or ``None``."""
    name = info.name
    words = _words(info)
    for candidate in (name, *words):
        if candidate in PROTECTED_NAMES or candidate in extra:
            return f"'{candidate}' is a protected system or access process"
        if candidate.startswith(PROTECTED_PREFIXES):
            return f"'{candidate}' is a protected system process"
    if words & PROTECTED_MODULES:
        return f"'{sorted(words & PROTECTED_MODULES)[0]}' is a notebook/supervisor process (restart it from its own UI)"
    for arg in info.cmdline[:2]:
        parts = set(PurePosixPath(arg).parts)
        if parts & PROTECTED_PATH_PARTS:
            return f"remote IDE server ({sorted(parts & PROTECTED_PATH_PARTS)[0]}): killing it disconnects the editor"
    return None


def _is_shell(info: ProcInfo) -> bool:
    return info.name in SHELLS or PurePosixPath(info.cmdline[0].lstrip("-")).name in SHELLS


def refusal(info: ProcInfo | None, caller: Caller, policy: Policy = DEFAULT_POLICY, *,
            parent_name: str | None = None) -> Refusal | None:
    """The first rule that forbids signalling ``info``, or ``None`` if it may be signalled.

    ``parent_name`` (optional) makes the zombie message name the parent that must reap it.
    """
    if info is None:
        return Refusal("gone", "the process no longer exists")
    pid = info.pid
    if pid <= 1:
        return Refusal("pid_le_1", f"pid {pid} is the init of this machine or container; killing it ends everything")
    if pid == caller.pid:
        return Refusal("self", "this is the process running this tool")
    if pid in caller.ancestors:
        return Refusal("ancestor", "an ancestor of this tool (your agent, shell or SSH session)")
    if caller.session_leader is not None and pid == caller.session_leader:
        return Refusal("session", "the session leader of this tool (your login shell or terminal)")
    if info.status == ZOMBIE:
        parent = f"{info.ppid} ({parent_name})" if parent_name else str(info.ppid)
        return Refusal("zombie", f"already exited (zombie): it holds no port or memory; its parent pid {parent} "
                                 "has not reaped it: ending or fixing that parent clears it")
    if not info.cmdline:
        return Refusal("kernel_thread", "no command line: a kernel thread or a process this user cannot identify")
    if info.uid is None or info.uid != caller.uid:
        owner = info.username or (str(info.uid) if info.uid is not None else "unknown")
        if not (caller.is_root and policy.allow_other_users):
            how = ("pass allow_other_users=true to override (you are root)" if caller.is_root
                   else "only its owner or root can signal it")
            return Refusal("other_user", f"owned by another user ({owner}); {how}")
    reason = protected_reason(info, policy.extra_protected_names)
    if reason:
        return Refusal("protected", f"{reason}; never killed by this tool")
    if (info.cmdline and info.cmdline[0].startswith("-")) or (_is_shell(info) and info.sid == pid):
        return Refusal("login_shell", "a login or terminal shell: killing it hangs up everything started from it")
    if info.status == DISK_SLEEP:
        return Refusal("uninterruptible", "in uninterruptible sleep (D state, usually stuck in a driver, NFS or a dead "
                                          "GPU): signals wait until the kernel call returns; check `cat /proc/"
                                          f"{pid}/stack` (root) and dmesg, a reboot may be the only cure")
    if info.start_ticks is None and info.create_time is None:
        return Refusal("no_start_time", "start time unreadable: it could not be told apart from a later process on "
                                        "the same pid")
    return None
