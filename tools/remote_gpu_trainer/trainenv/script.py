"""A launch script on a node, read as text (never run): its hash, how it picks its python, what it exports for
the launch, and the rendezvous endpoint its launcher is given.

Best effort by design: a shell script can compute anything, so this reads the common shapes: ``export
NAME=value`` (or ``NAME=value`` with the name exported before or after: a plain assignment alone is no export),
``NAME=value cmd`` prefixes on the launch line (on any other line they are that command's alone), ``source
…/bin/activate``, ``conda activate NAME``, an interpreter
called by its path, and the flags of a launcher as processes/launchers.py recognises one (torchrun,
``python -m torch.distributed.run``, ``accelerate launch``, deepspeed).
``$NAME`` and ``${NAME}`` in a value are filled from what the script set before and then from the login
environment; anything else stays as written and is marked unresolved.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from pathlib import Path

from pydantic import Field

from ..models import StrictModel
from ..processes.launchers import launcher_kind

MAX_SCRIPT_BYTES = 1 << 20
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", ";;"})
_WRAPPERS = frozenset({"exec", "nohup", "env", "time", "stdbuf", "nice", "setsid", "srun", "mpirun", "command"})
_INTERPRETER = re.compile(r"^/.+/bin/(python[0-9.]*|torchrun|accelerate|deepspeed)$")


def flag_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` in ``argv`` (``--flag value`` or ``--flag=value``)."""
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


class ScriptLine(StrictModel):
    line: int
    text: str


class Endpoint(StrictModel):
    launcher: str = Field(description="torchrun, accelerate, deepspeed or python")
    line: int
    master_addr: str | None = Field(None, description="--master-addr / --main_process_ip (or MASTER_ADDR)")
    master_port: int | None = Field(None, description="--master-port / --main_process_port (or MASTER_PORT), or the "
                                    "port of --rdzv-endpoint")
    rdzv_endpoint: str | None = None
    nnodes: str | None = None
    nproc_per_node: str | None = None
    unresolved: list[str] = Field(default_factory=list, description="Values that name variables we could not fill")


class LaunchScript(StrictModel):
    path: str
    sha256: str | None = Field(description="Hash of the file's bytes: the same script on every node, or not")
    size_bytes: int | None = None
    error: str | None = Field(None, description="Why it could not be read")
    activation: ScriptLine | None = Field(None, description="Its first `source …/activate` or `conda activate …`")
    interpreter: ScriptLine | None = Field(None, description="Its first interpreter called by path "
                                           "(/…/bin/python, /…/bin/torchrun)")
    exports: dict[str, ScriptLine] = Field(default_factory=dict, description="NAME → the line that exports it (the "
                                           "value as the launch gets it, variables filled where known)")
    endpoint: Endpoint | None = None


def expand_home(path: str) -> str:
    """``~`` and a leading ``$HOME``/``${HOME}`` become this user's home; nothing else is expanded."""
    for prefix in ("${HOME}", "$HOME"):
        if path == prefix or path.startswith(prefix + "/"):
            path = "~" + path[len(prefix):]
    return os.path.expanduser(path)


def _fill(value: str, known: dict[str, str]) -> tuple[str, bool]:
    """Variables in ``value`` from ``known``; (filled text, whether every one was known)."""
    complete = True

    def one(match: re.Match) -> str:
        nonlocal complete
        name = match.group(1) or match.group(2)
        if name in known:
            return known[name]
        complete = False
        return match.group(0)

    return _VAR.sub(one, value), complete


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with backslash continuations joined."""
    lines, buffer, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not buffer:
            start = number
        if raw.rstrip().endswith("\\"):
            buffer += raw.rstrip()[:-1] + " "
            continue
        lines.append((start, buffer + raw))
        buffer = ""
    if buffer:
        lines.append((start, buffer))
    return lines


def _commands(line: str) -> list[list[str]]:
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError:
        return []
    commands, current = [], []
    for token in tokens:
        if token in _SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [c for c in [*commands, current] if c]


def _launcher(words: list[str]) -> str | None:
    """The launcher this command line starts, as the process tools recognise one (``accelerate launch``, not any
    ``accelerate`` command such as ``accelerate config``); ``torch.distributed.launch`` reads as torchrun (the same
    rendezvous flags)."""
    kind = launcher_kind(words)
    return "torchrun" if kind == "torch.distributed.launch" else kind


def _endpoint(launcher: str, words: list[str], line: int, known: dict[str, str],
              environ: dict[str, str]) -> Endpoint:
    """The endpoint from the launcher's flags (``$NAME`` filled from ``known``, the shell's variables), else from
    MASTER_ADDR/MASTER_PORT in ``environ``, the environment the launcher itself gets."""
    unresolved: list[str] = []

    def get(names: tuple[str, ...]) -> str | None:
        raw = flag_value(words, names)
        if raw is None:
            return None
        value, complete = _fill(raw, known)
        if not complete:
            unresolved.append(raw)
        return value

    addr = get(("--master-addr", "--master_addr", "--main_process_ip"))
    port_text = get(("--master-port", "--master_port", "--main_process_port"))
    rdzv = get(("--rdzv-endpoint", "--rdzv_endpoint"))
    if rdzv and ":" in rdzv:
        host, _, rdzv_port = rdzv.rpartition(":")
        addr = addr or host
        port_text = port_text or rdzv_port
    addr = addr or environ.get("MASTER_ADDR")
    port_text = port_text or environ.get("MASTER_PORT")
    port = int(port_text) if port_text and port_text.isdecimal() and 0 < int(port_text) < 65536 else None
    return Endpoint(launcher=launcher, line=line, master_addr=addr, master_port=port, rdzv_endpoint=rdzv,
                    nnodes=get(("--nnodes", "--num_machines")), unresolved=unresolved,
                    nproc_per_node=get(("--nproc-per-node", "--nproc_per_node", "--num_processes", "--num_gpus")))


def read_launch_script(path: str, login_env: dict[str, str] | None = None) -> LaunchScript:
    """Read ``path`` on this machine (``~`` and ``$HOME`` expanded) and parse it; never runs it."""
    real = Path(expand_home(path))
    try:
        data = real.read_bytes()[:MAX_SCRIPT_BYTES + 1]
    except OSError as err:
        return LaunchScript(path=str(real), sha256=None, error=f"cannot read {real}: {err.strerror or err}")
    script = LaunchScript(path=str(real), sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data))
    if len(data) > MAX_SCRIPT_BYTES:
        script.error = f"larger than {MAX_SCRIPT_BYTES} bytes: hashed, not parsed"
        return script
    # ``known``: every variable set so far (what ``$NAME`` expands to); ``exported``: the names a child process
    # gets. The login environment is the environment, so all its names are exported already; a plain
    # ``NAME=value`` of the script is a shell variable until the name is exported.
    known = dict(login_env or {})
    exported = set(known)
    assigned: set[str] = set()
    for number, text in _logical_lines(data.decode("utf-8", "replace")):
        for words in _commands(text):
            prefix: list[tuple[str, str]] = []
            while words and "=" in words[0] and _NAME.match(words[0].split("=", 1)[0]):
                name, value = words.pop(0).split("=", 1)
                prefix.append((name, _fill(value, known)[0]))
            if words and words[0] == "export":
                for word in words[1:]:
                    name, sep, value = word.partition("=")
                    if not _NAME.match(name):
                        continue  # an option (-n, -p) or something we do not read
                    if sep:
                        known[name] = _fill(value, known)[0]
                        assigned.add(name)
                    exported.add(name)
                    if name in assigned:
                        script.exports[name] = ScriptLine(line=number, text=known[name])
                continue
            if not words:  # plain assignments: they stay in the shell unless the name is exported
                for name, value in prefix:
                    known[name] = value
                    assigned.add(name)
                    if name in exported:
                        script.exports[name] = ScriptLine(line=number, text=value)
                continue
            while words and words[0] in _WRAPPERS:
                words = words[1:]
            if not words:
                continue
            head = words[0]
            if script.activation is None and (
                    (head in ("source", ".") and len(words) >= 2 and (words[1] == "activate"
                                                                      or words[1].endswith("/activate")))
                    or (head in ("conda", "mamba", "micromamba") and words[1:2] == ["activate"])):
                script.activation = ScriptLine(line=number, text=shlex.join(words))
            if script.interpreter is None and _INTERPRETER.match(expand_home(_fill(head, known)[0])):
                script.interpreter = ScriptLine(line=number, text=expand_home(_fill(head, known)[0]))
            launcher = _launcher(words)
            if script.endpoint is None and launcher:
                # ``NAME=value cmd`` is cmd's alone: it counts only here, on the launch line, which the launch gets
                for name, value in prefix:
                    script.exports[name] = ScriptLine(line=number, text=value)
                environ = {**{n: v for n, v in known.items() if n in exported}, **dict(prefix)}
                script.endpoint = _endpoint(launcher, words, number, known, environ)
    return script
