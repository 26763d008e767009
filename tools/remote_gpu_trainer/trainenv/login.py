"""The environment of a login shell on this machine, read by a fixed script of ours.

``ssh box cmd`` runs ``$SHELL -c cmd``: Debian's ``~/.bashrc`` stops at once for a non-interactive shell, so
what it (or a file it sources) exports is not in our own environment, but it is what a person's terminal on
the box, and every launch started from it, gets. So we start the user's shell as a login, interactive one
(``bash --login -i -c``, what a terminal runs) with a fixed command that prints a marker and ``env -0``: no tty
(stdin is /dev/null, a new session), a timeout, and nothing the caller passed ever reaches it. Start-up files
that print (a banner, ``conda init``'s messages) cannot corrupt the reading, which starts after the marker.

Sourcing a file a caller named (``activate=source ~/venvs/pt/bin/activate``) is the same fixed script with the
path as ``$1``: it is data, quoted by the shell, never shell code.
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
from dataclasses import dataclass

from .bounded import run_bounded

MARKER = "\0RGT-ENV\0"
_DUMP = 'printf "\\000RGT-ENV\\000"; env -0'
#: Set by the shell itself or by every start-up, not by the user: never reported as a difference.
SHELL_NOISE = frozenset({"_", "SHLVL", "PWD", "OLDPWD", "PS1", "PS2", "PS4", "COLUMNS", "LINES", "HISTFILE",
                         "HISTSIZE", "HISTFILESIZE", "HISTCONTROL", "BASH_ENV", "ENV", "TERM"})


@dataclass
class ShellRead:
    """One run of the fixed script: the environment it printed, or why there is none."""

    env: dict[str, str] | None
    how: str
    """The shell and mode, e.g. ``bash --login -i`` (what a terminal on the box runs)."""
    error: str | None = None
    seconds: float = 0.0


def login_shell() -> list[str]:
    """The user's shell as a terminal starts it: login and interactive. bash or zsh from the passwd entry; else
    bash where installed (launch scripts are bash scripts), else sh."""
    try:
        configured = pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        configured = ""
    name = os.path.basename(configured)
    if name in ("bash", "zsh") and os.access(configured, os.X_OK):
        return [configured, "-l", "-i"]
    bash = shutil.which("bash")
    return [bash, "-l", "-i"] if bash else ["sh", "-l", "-i"]


def _run(argv: list[str], timeout_s: float, how: str, environ: dict[str, str] | None = None) -> ShellRead:
    started = time.monotonic()
    try:
        done = run_bounded(argv, timeout_s, environ, os.path.expanduser("~"))
    except OSError as err:
        return ShellRead(None, how, f"{argv[0]} does not start: {err.strerror or err}")
    seconds = round(time.monotonic() - started, 3)
    if done.returncode is None:
        return ShellRead(None, how, f"the shell's start-up files did not finish in {timeout_s:g} s (something in "
                         "them waits: a prompt, a network call)", seconds)
    out, err = done.out, done.err
    text = out.decode("utf-8", "replace")
    if MARKER not in text:
        last = (err.decode("utf-8", "replace").strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return ShellRead(None, how, "the start-up files never reached our command (an `exec` or `exit` in them?): "
                         f"{last[:300]}", seconds)
    env = {}
    for item in text.split(MARKER, 1)[1].split("\0"):
        name, sep, value = item.partition("=")
        if sep and name:
            env[name] = value
    return ShellRead(env, how, None, seconds)


def read_login_env(timeout_s: float = 20.0) -> ShellRead:
    """The environment a login, interactive shell on this machine has (see the module docstring)."""
    argv = login_shell()
    return _run([*argv, "-c", _DUMP], timeout_s, f"{os.path.basename(argv[0])} {' '.join(argv[1:])}")


def read_sourced_env(path: str, timeout_s: float = 20.0) -> ShellRead:
    """The environment after sourcing ``path`` (an activation script) in a plain shell: ``. "$1"``, the path an
    argument of our fixed script, its output discarded."""
    script = '. "$1" >/dev/null 2>&1 </dev/null || { echo "sourcing $1 failed (status $?)" >&2; exit 3; }; ' + _DUMP
    bash = shutil.which("bash")
    shell = [bash, "--noprofile", "--norc"] if bash else ["sh"]
    return _run([*shell, "-c", script, "rgt-activate", path], timeout_s,
                f"{os.path.basename(shell[0])} -c '. \"$1\"' with $1={path}")


def changed(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """Variables ``after`` sets or changes compared with ``before`` (shell bookkeeping left out)."""
    return {k: v for k, v in after.items() if before.get(k) != v and k not in SHELL_NOISE}
