"""Notifications that reach a person: the user's own command, run once per event with the event's words.

The run supervisor (a run ended, failed, was OOM-killed, stalled) and the idle guard (a warning before it stops
the box, the stop, a refused stop) both run the same kind of command, so a person configures it once:

* **argv, never a shell.** ``["notify-me", "{message}"]``, or one string split like a shell line
  (``"notify-me {message}"``, :mod:`commandline`). A user who wants a shell says so (``bash -c '…'``).
* **Placeholders** ``{message}``, ``{state}``, ``{run_id}``, ``{host}``, ``{step}`` are replaced inside each argv
  word, per event; anything else in braces (a JSON body) stays as written, an unknown ``{name}`` is refused.
  The message can hold any text of a log (a diagnosis line), so a placeholder inside a shell's or an
  interpreter's ``-c``/``-e`` script is refused: there it would become code. Pass it as an argument instead
  (``bash -c 'notify-me "$1"' _ {message}``) or read ``$RGT_MESSAGE``.
* **The environment** carries the same values (``RGT_MESSAGE``, ``RGT_STATE``, ``RGT_HOST``, ``RGT_STEP``) plus
  what the caller adds (``RGT_RUN_ID``, ``RGT_RUN_STATE``, ``RGT_RUN_DIAGNOSIS``, ``RGT_RUN_DIR`` for runs).
* **Bounded and detached**: stdin is /dev/null, at most 30 s, in its own session (a notifier that forks a daemon
  does not become part of a run), output kept for the record.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import AfterValidator

from .commandline import shell_words

PLACEHOLDERS = ("message", "state", "run_id", "host", "step")
NOTIFY_TIMEOUT_S = 30.0
MESSAGE_CHARS = 1000
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_INTERPRETER = re.compile(r"^(sh|bash|dash|zsh|ksh|mksh|ash|fish|busybox|python[0-9.]*|perl|ruby|node|php|lua)$")
ENV_NAMES = {"message": "RGT_MESSAGE", "state": "RGT_STATE", "host": "RGT_HOST", "step": "RGT_STEP"}
HELP = ("A command to reach a person, run once per event (argv words, or one string split like a shell line, never "
        "run by a shell): {message}, {state}, {run_id}, {host} and {step} are filled in per event, e.g. "
        "['notify-me', '{message}'] or 'curl -fsS -d {message} https://ntfy.sh/mytopic'; the same values are in "
        "RGT_MESSAGE, RGT_STATE, RGT_HOST, RGT_STEP. CLI: --notify notify-me {message} (dashes allowed; ends at the "
        "next option of this command or --)")


def check_notify(words: list[str]) -> list[str]:
    """The notify argv to store: one string split like a shell line, placeholders checked. Raises ValueError."""
    if len(words) == 1 and any(ch.isspace() for ch in words[0]):
        words = shell_words(words[0])
    if not words or not words[0]:
        raise ValueError("holds no program to run")
    for word in words:
        if "\0" in word:
            raise ValueError("a word holds a NUL byte")
        unknown = [name for name in _PLACEHOLDER.findall(word) if name not in PLACEHOLDERS]
        if unknown:
            raise ValueError(f"unknown placeholder {{{unknown[0]}}}; the placeholders are "
                             + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))
    _refuse_placeholders_in_code(words)
    return words


def _refuse_placeholders_in_code(words: list[str]) -> None:
    program = PurePosixPath(words[0]).name
    if program == "env":  # env [NAME=value...] bash -c ...
        rest = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
        program = PurePosixPath(rest[0]).name if rest else program
    if not _INTERPRETER.match(program):
        return
    for i, word in enumerate(words[:-1]):
        if re.fullmatch(r"-[A-Za-z]*[ce]", word) and _PLACEHOLDER.search(words[i + 1]):
            raise ValueError(f"a placeholder inside the {program} script {words[i + 1]!r} would become shell code "
                             f"(the message can hold any text of a log): pass it as an argument, e.g. "
                             f"[{program!r}, '-c', 'notify-me \"$1\"', '_', '{{message}}'], or read $RGT_MESSAGE")


def box_name() -> str:
    """How the person knows this box: the ssh alias the caller used (set per request on a box), else its hostname."""
    from .toolspec import BOX_HOST_ENV

    return os.environ.get(BOX_HOST_ENV) or socket.gethostname()


def fill(argv: list[str], values: Mapping[str, str]) -> list[str]:
    """``argv`` with each known placeholder replaced by its value (missing values become empty)."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        return str(values.get(name, "")).replace("\0", "") if name in PLACEHOLDERS else match.group(0)

    return [_PLACEHOLDER.sub(one, word) for word in argv]


def send(argv: list[str], values: Mapping[str, str], *, env: Mapping[str, str] | None = None,
         cwd: Path | str | None = None) -> dict[str, Any]:
    """Run the notify command once for an event; the record of what happened (never raises)."""
    values = {**values, "message": str(values.get("message", ""))[:MESSAGE_CHARS]}
    record: dict[str, Any] = {"at": time.time(), "argv0": argv[0] if argv else None, "state": values.get("state")}
    full_env = {**os.environ, **(env or {}), **{ENV_NAMES[k]: str(v) for k, v in values.items() if k in ENV_NAMES}}
    try:
        done = subprocess.run(fill(argv, values), env=full_env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=NOTIFY_TIMEOUT_S, cwd=cwd, start_new_session=True)
        record.update(exit_code=done.returncode, output=(done.stdout + done.stderr).decode(errors="replace")[-500:])
    except subprocess.TimeoutExpired:
        record.update(exit_code=None, error=f"timed out after {NOTIFY_TIMEOUT_S:g} s")
    except OSError as err:
        record.update(exit_code=None, error=f"could not run: {err}")
    return record


NotifyCommand = Annotated[list[str], AfterValidator(check_notify)]
"""The type of every ``notify`` input field (run_start, run_adopt, idle_guard): validated by :func:`check_notify`."""
