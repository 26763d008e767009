"""The OpenSSH command line, built in one place, and ssh's failures turned into RemoteErrors.

The user's own ``ssh`` runs as a subprocess so that ``~/.ssh/config``, agents, keys, ``ProxyJump`` and
``known_hosts`` behave exactly as in their terminal. We add only what an unattended caller needs:
never prompt, bounded connect, keep-alives, connection sharing in a private directory, and new host
keys accepted (a changed one still refused) where the user configured nothing stricter.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import tempfile
from pathlib import Path

from .errors import RemoteError
from .hosts import Host, config_args, resolve

CONNECT_TIMEOUT_S = 10
CONTROL_PERSIST_S = 300


def control_dir() -> Path:
    """A private (0700) directory for ControlPath sockets: whoever can open one can run commands as the user.

    Short on purpose: a Unix socket path is limited to ~104 (macOS) or 108 (Linux) bytes.
    """
    base = os.environ.get("RGT_SSH_CONTROL_DIR") or os.path.join(tempfile.gettempdir(), f"rgt-ssh-{os.getuid()}")
    path = Path(base)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise RemoteError("-", "ssh_failed", f"the ssh control directory {path} is not a private directory of "
                          "this user", "remove it or set RGT_SSH_CONTROL_DIR to a 0700 directory you own")
    return path


def ssh_options(host: Host) -> list[str]:
    """Every option we add to ssh, for a command and for rsync's ``-e`` alike."""
    options = [*config_args(), "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
               "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3",
               "-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir()}/%C",
               "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
    # `-o` wins over the user's config (ssh keeps the first value), so only fill in what they left at the
    # default: "ask" would make BatchMode refuse every new pod; accept-new records it, refuses a change.
    try:
        checking = resolve(host).options.get("stricthostkeychecking", "ask")
    except (OSError, ValueError):
        checking = "ask"
    if checking in ("ask", ""):
        options += ["-o", "StrictHostKeyChecking=accept-new"]
    return options


def ssh_argv(host: Host, remote_command: str) -> list[str]:
    """``ssh <options> [-p PORT] -- DEST REMOTE_COMMAND``; ``remote_command`` is always a fixed string of ours."""
    return ["ssh", *ssh_options(host), *host.ssh_target(), remote_command]


#: (pattern, kind, message, next step); a next step of None is written by :func:`host_key_steps`.
_CAUSES: list[tuple[re.Pattern[str], str, str, str | None]] = [
    (re.compile(r"Could not resolve hostname|Name or service not known|nodename nor servname"), "unknown_host",
     "ssh could not resolve the host name",
     "check the spelling, or add a Host entry with HostName to ~/.ssh/config (see the provider profile's SSH "
     "section for the address to use)"),
    (re.compile(r"Connection refused"), "connection_refused", "nothing accepts ssh connections on that port",
     "check the port (rented boxes often use a custom one), and that the box is running (a stopped pod refuses "
     "connections); the provider's console shows the current SSH command"),
    (re.compile(r"timed out|Connection timed out|Operation timed out"), "timeout",
     "the connection timed out", "the box may be stopped, preempted or behind a firewall; check it in the "
     "provider's console, then retry"),
    (re.compile(r"No route to host|Network is unreachable"), "unreachable", "the network has no route to the box",
     "check the address and your network/VPN, and whether the box still exists"),
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|has changed and you have requested strict checking"),
     "host_key_changed", "the box's host key changed since it was recorded in known_hosts", None),
    (re.compile(r"No \S+ host key is known for|Host key verification failed"), "host_key_unknown",
     "the box's host key is not known and your ssh config refuses new keys", None),
    (re.compile(r"Permission denied|Too many authentication failures|no such identity"), "auth_refused",
     "the box refused authentication (no usable key; passwords cannot be typed by an agent)",
     "add your public key to the box (the provider's console or ~/.ssh/authorized_keys), check IdentityFile in "
     "~/.ssh/config, or load the key into ssh-agent; `ssh -v HOST true` shows which keys were offered"),
]


def classify_ssh_failure(host: Host, stderr: str) -> RemoteError:
    """ssh exited 255: find the cause in its stderr (the verbatim line is kept as detail)."""
    text = stderr.strip()
    for pattern, kind, message, next_step in _CAUSES:
        if pattern.search(text):
            line = next((ln for ln in text.splitlines() if pattern.search(ln)), "").strip().rstrip(".")
            if next_step is None:
                found = _FINGERPRINT.search(text)
                fingerprint = found.group(2) if found else None
                if found:
                    message += f" (the box now presents the {found.group(1)} key {fingerprint})"
                step = host_key_steps(host, kind, text, fingerprint)
            else:
                step = next_step.replace("HOST", host.destination.split("@")[-1])
            return RemoteError(host.given, kind, f"{message}; ssh said: {line[:200]}",  # type: ignore[arg-type]
                               step, detail=text[-2000:])
    tail = text.splitlines()[-1] if text else "no message"
    return RemoteError(host.given, "ssh_failed", f"ssh failed (exit 255: {tail[:200]})",
                       f"run `ssh -v {host.given} true` in a terminal to see where it stops", detail=text[-2000:])


#: ssh's changed-key banner names the key the box presented: keep it, a person checks the new key against it.
_FINGERPRINT = re.compile(r"The fingerprint for the (\S+) key sent by the remote host is\s+(SHA256:[A-Za-z0-9+/=]+)")
_OFFENDING = re.compile(r"Offending \S+ key in (.+):\d+\s*$", re.MULTILINE)


def host_key_steps(host: Host, kind: str, stderr: str = "", fingerprint: str | None = None) -> str:
    """The next step for a changed or unknown host key, written for this host's own ssh configuration.

    The old key is removed from the file that holds it (ssh's "Offending … key in FILE", else the first
    ``UserKnownHostsFile`` of ``ssh -G``): a bare ``ssh-keygen -R`` edits ~/.ssh/known_hosts, which a config
    with its own file never reads. Under ``StrictHostKeyChecking yes`` ssh records no key by itself, so the new
    one is fetched with ssh-keyscan, its fingerprint checked (against ``fingerprint``, the ``SHA256:…`` that ssh's
    banner named, and the provider's), and appended; otherwise the tools' accept-new records it on the next call.
    """
    try:
        resolved = resolve(host)
        address, port, options = resolved.hostname, resolved.port, resolved.options
    except (OSError, ValueError, subprocess.TimeoutExpired):
        address, port, options = host.destination.split("@")[-1], host.port or 22, {}
    name = address if port == 22 else f"[{address}]:{port}"
    files = options.get("userknownhostsfile", "").split() or ["~/.ssh/known_hosts"]
    offending = _OFFENDING.search(stderr)
    known = offending.group(1).strip() if offending else files[0]
    strict = options.get("stricthostkeychecking", "ask") in ("yes", "true")
    hashed = options.get("hashknownhosts") in ("yes", "true")
    remove = f"`ssh-keygen -f {shlex.quote(known)} -R {shlex.quote(name)}`"
    same = (f"lists {fingerprint} (the key ssh was shown) and that the provider's console or the box's own terminal "
            "shows the same" if fingerprint else "lists the fingerprint the provider's console or the box's own "
            "terminal shows")
    scan = (f"`ssh-keyscan {'-H ' if hashed else ''}-p {port} {shlex.quote(address)} > new-box.key`, check that "
            f"`ssh-keygen -lf new-box.key` {same} (there: `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), "
            f"then `cat new-box.key >> {shlex.quote(known)}`")
    if kind == "host_key_changed":
        first = (f"if the provider re-used the address for a new box (common after re-renting), remove the old key "
                 f"with {remove}")
        if strict:
            return (f"{first}; your config has StrictHostKeyChecking yes, so record the new key yourself: {scan}; "
                    "then retry. Otherwise do not connect")
        return f"{first} and retry (the new key is then recorded on first use, accept-new); otherwise do not connect"
    if strict:
        return (f"your config has StrictHostKeyChecking yes for this host, so ssh never records a new key itself: "
                f"{scan}; or set `StrictHostKeyChecking accept-new` in its Host block (new keys recorded, changed "
                "keys still refused)")
    return (f"connect once with `ssh {host.given}` in a terminal and accept the key, or set "
            "`StrictHostKeyChecking accept-new` for this host in ~/.ssh/config")


def run(host: Host, remote_command: str, stdin: bytes = b"", timeout_s: float = 120) -> subprocess.CompletedProcess:
    """One command on the box (a fixed string of ours), data on stdin; ssh's own failures raise RemoteError."""
    try:
        done = subprocess.run(ssh_argv(host, remote_command), input=stdin, capture_output=True, timeout=timeout_s,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        raise RemoteError(host.given, "remote_timeout", f"the command did not finish within {timeout_s:g} s",
                          "check the box's load and network; retry") from None
    if done.returncode == 255:
        raise classify_ssh_failure(host, done.stderr.decode("utf-8", errors="replace"))
    return done
