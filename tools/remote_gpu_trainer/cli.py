"""``rgt``: the same tools for humans. Subcommands and flags are generated from each ToolSpec's input
model, so the CLI and the MCP server can never disagree about a tool's parameters or validation.

Exit status: 0 success, 1 the check found a failure (per tool, see README), 2 bad input, 5 the host
could not be reached or the remote call failed (the message names the cause and the next step).
Machine-facing commands take ``--host`` (default ``$RGT_HOST``) and then run on that box over ssh.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import textwrap
import types
import typing
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .errors import InputError
from .registry import all_specs, cli_specs
from .toolspec import ToolSpec

EXIT_INPUT_ERROR = 2
EXIT_REMOTE_ERROR = 5
HEALTH_COMMAND = "health"
"""``healthd.COMMAND``: healthd (socket, selectors) is imported only where ``rgt health`` needs it."""
GROUP_HELP = {"run": "Training runs on a box: start, status, logs, stop, list",
              "box": "The runtime on a box: install, status, remove"}


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, wrapped at spaces only: ``--no-dry-run`` and paths stay whole on one line."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _choices(annotation: Any) -> list[str] | None:
    if typing.get_origin(annotation) is Literal:
        return [str(v) for v in typing.get_args(annotation)]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [str(m.value) for m in annotation]
    return None


def _is_scalar(annotation: Any) -> bool:
    if _choices(annotation) is not None:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return all(_is_scalar(a) for a in typing.get_args(annotation))
    return annotation in (str, int, float)


def _json_argument(name: str) -> Any:
    """json.loads with an error in plain words: where the text stopped being JSON, and an example."""
    def parse(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as err:
            where = f" at char {err.pos}" if isinstance(err, json.JSONDecodeError) else ""
            raise argparse.ArgumentTypeError(f"not valid JSON{where}: {getattr(err, 'msg', err)}; example: "
                                             f"--{name.replace('_', '-')} '{{\"key\": 1}}'") from None
    return parse


POSITIONAL = "positional:"
"""Namespace prefix of a positional argument, kept apart from its ``--name`` flag (see :func:`arguments_of`)."""


def _default_text(field: FieldInfo, annotation: Any, flag: str) -> str:
    """`` (default: …)`` for --help, in the form the flag takes; empty for required fields and null defaults."""
    if field.is_required():
        return ""
    default = field.get_default(call_default_factory=True)
    if annotation is bool:
        return f" (default: --{'' if default else 'no-'}{flag})"
    if default is None or default == [] or default == {}:
        return ""
    if isinstance(default, Enum):
        default = default.value
    if isinstance(default, list):
        return " (default: " + " ".join(str(getattr(v, "value", v)) for v in default) + ")"
    if isinstance(default, dict):
        return f" (default: {json.dumps(default)})"
    return f" (default: {default:g})" if isinstance(default, float) else f" (default: {default})"


def _add_field(parser: argparse.ArgumentParser, name: str, field: FieldInfo, positional: bool,
               command: bool = False) -> None:
    """``--name`` for every input field; the spec's positional field is also accepted bare (``rgt ports 29500``).
    ``command``: a command field (``--notify``) whose words :func:`_join_command_words` joined into one."""
    annotation = _unwrap_optional(field.annotation)
    flag = name.replace("_", "-")
    help_text = ((field.description or "") + _default_text(field, annotation, flag)).replace("%", "%%")
    kwargs: dict[str, Any] = {"help": help_text, "default": argparse.SUPPRESS}
    if command:  # the words were joined into one by _join_command_words; the model splits them again
        kwargs.update(type=lambda text: [text], metavar="CMD")
    elif annotation is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(annotation) is list and all(_is_scalar(a) for a in typing.get_args(annotation)):
        kwargs["nargs"] = "+"
        kwargs["choices"] = _choices(typing.get_args(annotation)[0])
    elif _is_scalar(annotation):
        kwargs["choices"] = _choices(annotation)
    else:  # dicts, nested models, lists of models: JSON text
        kwargs["type"] = _json_argument(name)
        kwargs["metavar"] = "JSON"
    if positional:
        bare = {k: v for k, v in kwargs.items() if k != "default"}
        bare["nargs"] = "*" if kwargs.get("nargs") == "+" else "?"
        bare["help"] = f"{help_text.rstrip('.')}. Also --{flag}."
        parser.add_argument(POSITIONAL + name, metavar=name.upper() if "metavar" not in bare else bare.pop("metavar"),
                            **bare)
    elif field.is_required():
        kwargs["required"] = True
    flags = [f"--{flag}"] + ([f"--{name}"] if "_" in name else [])
    parser.add_argument(*flags, dest=name, **kwargs)


def _subparsers_for(subparsers: Any, groups: dict[str, Any], words: list[str]) -> Any:
    """``rgt run start``: the spec's ``cli`` split on spaces, one parser per group word."""
    for depth in range(len(words) - 1):
        key = " ".join(words[: depth + 1])
        if key not in groups:
            group = subparsers.add_parser(words[depth], help=GROUP_HELP.get(key, f"{key} commands"))
            groups[key] = group.add_subparsers(dest=f"_cmd_{depth + 1}", required=True, metavar="COMMAND")
        subparsers = groups[key]
    return subparsers


def _add_spec(subparsers: Any, spec: ToolSpec, groups: dict[str, Any]) -> None:
    words = spec.cli.split()
    parser = _subparsers_for(subparsers, groups, words).add_parser(words[-1], help=spec.title,
                                                                   description=spec.description,
                                                                   formatter_class=_HelpFormatter)
    fixed = dict(spec.cli_fixed)
    for name, field in spec.input_model.model_fields.items():
        if name in fixed:
            continue
        if name == spec.cli_file_field:
            parser.add_argument("file", nargs="?", default="-", help=f"file to read into {name}, or - for stdin "
                                f"(default); or give it as --{name.replace('_', '-')}")
        _add_field(parser, name, field, positional=name == spec.cli_positional, command=name in spec.cli_command_flags)
    if spec.remote:
        parser.add_argument("--host", default=os.environ.get("RGT_HOST") or None,
                            help="run on this box over ssh (an ssh alias or user@name[:port]); "
                            "default $RGT_HOST, else this machine")
    if spec.cli_write_files is not None:  # multi-file results (DeepSpeed: 3 files)
        parser.add_argument("--out", metavar="DIR", dest="_out", help="also write the rendered files into DIR")
    parser.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON")
    if spec.cli == HEALTH_COMMAND:
        from . import healthd

        healthd.add_flag(parser)
    parser.set_defaults(spec=spec)
    _OPTIONS[spec.cli] = frozenset(parser._option_string_actions)


_OPTIONS: dict[str, frozenset[str]] = {}
"""Each command's own option strings, filled by build_parser: where a command flag's words end."""


def _join_command_words(argv: list[str], specs: list[ToolSpec]) -> list[str]:
    """``--notify bash -c 'x' --cwd d`` → ``--notify=<the words as one shell line>`` ``--cwd d``.

    argparse would take ``-c`` for an option of its own and stop; a command's words run up to the next option of
    *this* command or ``--``. One word is passed as it is (``--notify "notify-me {message}"``): the model splits it
    like a shell line, never with a shell."""
    spec = next((s for s in specs if s.cli_command_flags and argv[:len(s.cli.split())] == s.cli.split()), None)
    if spec is None:
        return argv
    known = _OPTIONS.get(spec.cli, frozenset())
    flags = {f"--{name.replace('_', '-')}" for name in spec.cli_command_flags} | {f"--{n}" for n in
                                                                                   spec.cli_command_flags}
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            out += argv[i:]
            break
        if word in flags:
            j = i + 1
            while j < len(argv) and argv[j] != "--" and argv[j] not in known and argv[j].split("=", 1)[0] not in known:
                j += 1
            words = argv[i + 1:j]
            if words:
                out.append(f"{word}={words[0] if len(words) == 1 else shlex.join(words)}")
            else:
                out.append(word)
            i = j
            continue
        out.append(word)
        i += 1
    return out


def _read_text(path: str) -> str:
    """Read a log as-is: ``newline=""`` keeps tqdm's ``\r`` redraws, so line numbers match ``grep -n``."""
    if path == "-":
        raw = getattr(sys.stdin, "buffer", None)  # a StringIO stand-in (tests, embedding) has none
        return raw.read().decode("utf-8", errors="replace") if raw else sys.stdin.read()
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        return handle.read()


def _progress(done: float, total: float | None = None, message: str = "") -> None:
    step = f"{done:g}/{total:g}" if total else f"{done:g}"
    print(f"[{step}] {message}", file=sys.stderr, flush=True)


def arguments_of(spec: ToolSpec, namespace: argparse.Namespace) -> dict[str, Any]:
    """The tool's arguments from parsed flags (before reading a FILE): a positional given bare or as ``--name``,
    ``--host`` when given, and the spec's fixed values. Raises :class:`InputError` when both forms are given."""
    values = vars(namespace)
    arguments = {k: v for k, v in values.items()
                 if k not in ("spec", "as_json", "file") and not k.startswith(("_", POSITIONAL))}
    for key, value in values.items():
        if not key.startswith(POSITIONAL) or value in (None, []):  # not given bare: the flag or the default applies
            continue
        name = key.removeprefix(POSITIONAL)
        if name in arguments:
            flag = name.replace("_", "-")
            raise InputError(name, f"given twice: as {name.upper()} and as --{flag}; give one of them")
        arguments[name] = value
    if arguments.get("host") is None:
        arguments.pop("host", None)
    arguments.update(spec.cli_fixed)
    return arguments


def run_spec(spec: ToolSpec, namespace: argparse.Namespace) -> int:
    """Run the command, print its answer (text or --json) and return the exit status; the daemon runs it too."""
    from .remote.errors import RemoteError

    try:
        arguments = arguments_of(spec, namespace)
        field = spec.cli_file_field
        if field and field in arguments and namespace.file != "-":
            raise InputError(field, f"given twice: as --{field.replace('_', '-')} and as the file {namespace.file!r}")
        # A log named with --log-path is read by the tool (on the box, with --host), not from stdin.
        if field and field not in arguments and not (namespace.file == "-" and arguments.get("log_path")):
            arguments[field] = _read_text(namespace.file)
        result: BaseModel = spec.call(arguments, _progress)
    except (InputError, OSError) as err:
        print(f"rgt {spec.cli}: error: {err}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except RemoteError as err:
        print(f"rgt {spec.cli}: {err}", file=sys.stderr)
        return EXIT_REMOTE_ERROR
    if getattr(namespace, "_out", None) and spec.cli_write_files is not None:
        for path in spec.cli_write_files(result, namespace._out):
            print(f"wrote {path}", file=sys.stderr)
    if namespace.as_json:
        print(result.model_dump_json(indent=2))
    else:
        print(spec.text(result))
    return spec.exit_code(result) if spec.exit_code else 0


def build_parser(specs: list[ToolSpec] | None = None) -> argparse.ArgumentParser:
    """Every command, or only ``specs`` (the fast path for one known command: see registry.CLI_HOMES)."""
    parser = argparse.ArgumentParser(prog="rgt", description="remote-gpu-trainer: checks for GPU training boxes")
    subparsers = parser.add_subparsers(dest="_cmd", required=True, metavar="COMMAND")
    groups: dict[str, Any] = {}
    for spec in specs if specs is not None else all_specs():
        if not spec.internal:
            _add_spec(subparsers, spec, groups)
    if specs is not None:
        return parser
    serve = subparsers.add_parser("serve", help="start the MCP server on stdio")
    serve.set_defaults(handler=lambda _ns: _serve())
    _add_install(subparsers)
    return parser


def _add_install(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "install", help="link the skill into Claude Code or Gemini CLI and register the MCP server",
        description="Idempotent: re-running changes nothing. Never overwrites a real directory or an "
        "invalid config file; use --dry-run to see what would change.")
    host = parser.add_mutually_exclusive_group(required=True)
    host.add_argument("--claude", dest="host", action="store_const", const="claude", help="Claude Code")
    host.add_argument("--gemini", dest="host", action="store_const", const="gemini", help="Gemini CLI")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--user", dest="scope", action="store_const", const="user", help="for this user (default)")
    scope.add_argument("--project", dest="scope", action="store_const", const="project",
                       help="for one project (see --project-dir)")
    parser.add_argument("--project-dir", default=".", help="project directory for --project (default: .)")
    parser.add_argument("--dry-run", action="store_true", help="show what would change, change nothing")
    parser.add_argument("--force", action="store_true", help="re-point an existing skill link that points elsewhere")
    parser.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON")
    parser.set_defaults(handler=_install, scope="user")


def _install(namespace: argparse.Namespace) -> int:
    from pathlib import Path

    from .install import install, render

    report = install(namespace.host, namespace.scope, project_dir=Path(namespace.project_dir),
                     dry_run=namespace.dry_run, force=namespace.force)
    print(report.model_dump_json(indent=2) if namespace.as_json else render(report))
    return 0 if report.ok else 1


def _serve() -> int:
    from .server import main as serve_main

    serve_main()
    return 0


#: Commands that read NVML on this machine (without --host). Their NVML worker process is started
#: before anything else is imported, so its start (Python, pynvml, nvmlInit) overlaps ours. Only a
#: speed-up: a command missing here starts the worker when it first needs it.
NVML_COMMANDS = frozenset({"health", "zombies", "idle"})


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line as ``rgt`` reads it (exits on --help or a usage error, as argparse does)."""
    specs = cli_specs(argv[0] if argv else "")
    parser = build_parser(specs)  # fills _OPTIONS, which _join_command_words reads
    return parser.parse_args(_join_command_words(argv, specs if specs is not None else all_specs()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    word = argv[0] if argv else ""
    remote = os.environ.get("RGT_HOST") or any(a == "--host" or a.startswith("--host=") for a in argv)
    if word in NVML_COMMANDS and not remote and not os.environ.get("RGT_HEALTH_FAKE"):
        from .nvml_session import session

        session().start()
    namespace = parse(argv)
    try:
        if not hasattr(namespace, "spec"):
            return namespace.handler(namespace)
        code = run_spec(namespace.spec, namespace)
        if namespace.spec.cli == HEALTH_COMMAND:
            from . import healthd

            healthd.after_cli(namespace)  # answered here: start the warm daemon for next time (or stop it)
        return code
    except BrokenPipeError:
        # `rgt diagnose log | head`: the reader left. Point stdout at /dev/null so the interpreter's
        # final flush cannot raise again (the pattern the Python signal docs recommend).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed pipeline member


def entry() -> None:
    """``rgt`` and ``python -m remote_gpu_trainer``: :func:`main`, then exit.

    After an NVML command its answer is printed and nothing of it needs an atexit hook, so the
    interpreter's teardown (finalising pydantic's and our modules: 30-50 ms of a ~250 ms cold
    ``rgt health`` on a 2-core machine) is skipped. The NVML worker sees its pipe close and exits.
    """
    code = main()
    if sys.argv[1:2] and sys.argv[1] in NVML_COMMANDS:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            sys.exit(code)
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
