"""SKILL.md and the README agree with the tools: every `tool(args)` example validates against the tool's MCP
input model, every `rgt …` line parses with the real CLI parser, every tool is in SKILL.md's tool table, and
every MCP argument has a CLI flag. Checked generically, so a tool added later is held to the same rules."""

from __future__ import annotations

import argparse
import ast
import re

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.registry import all_specs

from .conftest import ROOT

SPECS = {spec.name: spec for spec in all_specs()}
PUBLIC = {name: spec for name, spec in SPECS.items() if not spec.internal}
DOCS = {name: (ROOT / name).read_text() for name in ("SKILL.md", "README.md")}

# --- tool(args) examples ---------------------------------------------------------------------------------

CALL = re.compile(r"`(?P<name>[a-z_]+)\((?P<args>[^`]*)\)`")
LITERALS = {"true": True, "false": False, "null": None}


def _examples() -> list[tuple[str, str, str]]:
    found = [(doc, m["name"], m["args"].replace("\\|", "|")) for doc, text in DOCS.items()
             for m in CALL.finditer(text) if m["name"] in SPECS]
    return sorted(set(found))


def _literal(node: ast.expr) -> tuple[bool, object]:
    """(is a literal, value): ``true``/``false``/``null`` as JSON spells them; ``...`` and names are placeholders."""
    if isinstance(node, ast.Name):
        return (True, LITERALS[node.id]) if node.id in LITERALS else (False, None)
    if any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(node)):
        return False, None
    return True, ast.literal_eval(node)


def _names(node: ast.expr) -> list[str]:
    """Field names a signature-style example lists bare: ``run_start(argv or command, cwd)``."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.BoolOp):
        return [name for value in node.values for name in _names(value)]
    raise AssertionError(f"not a field name: {ast.unparse(node)}")


@pytest.mark.parametrize(("doc", "tool", "args"), _examples())
def test_every_tool_example_validates_against_its_input_model(doc, tool, args):
    spec = SPECS[tool]
    rest = args.strip() == "..." or args.rstrip().endswith(", ...")  # "and more arguments"
    args = args.strip().removesuffix("...").rstrip().rstrip(",") if rest else args
    call = ast.parse(f"f({args})", mode="eval").body
    assert isinstance(call, ast.Call)
    fields = set(spec.input_model.model_fields) | ({"host"} if spec.remote else set())
    named = [name for node in call.args for name in _names(node)] + [k.arg for k in call.keywords]
    unknown = sorted(set(named) - fields)
    assert not unknown, f"{doc}: {tool}({args}) names {unknown}; {tool} takes {sorted(fields)}"
    arguments = {}
    for keyword in call.keywords:
        literal, value = _literal(keyword.value)
        if literal:
            arguments[keyword.arg] = value
    partial = rest or bool(call.args) or len(arguments) < len(call.keywords)
    host = arguments.pop("host", None) if spec.remote else None
    if host is not None:
        from remote_gpu_trainer.remote import parse_host

        parse_host(host)
    problems = _problems(spec, arguments)
    if partial:  # placeholders or bare names: only what the example spells out is checked
        problems = [p for p in problems if not p.startswith("input:")]
    assert not problems, f"{doc}: {tool}({args}): {problems}"


def _problems(spec, arguments: dict) -> list[str]:
    """Validation errors about what ``arguments`` says: a wrong value or name, or a rule across fields
    (``input: …``); a required field the text leaves out is not one."""
    try:
        spec.validate(arguments)
    except InputError as err:
        lines = str(err).split("; ")
        return [p for p in lines if "Field required" not in p and p.split(":", 1)[0] in (*arguments, "input")]
    return []


# --- rgt lines --------------------------------------------------------------------------------------------

RGT = re.compile(r"`(rgt [^`<]+)`|^(rgt [^#\n]+?)\s*(?:#.*)?$", re.M)
SAMPLES = {"HOST": ["gpu-box"], "RUN": ["run-1"], "ID": ["run-1"], "DIR": ["out"], "Q": ["what stops billing"],
           "PROVIDER": ["runpod"], "FILE": ["-"], "CASE": ["fp16_unscale"], "A": ["node1"], "B": ["node2"],
           "CMD…": ["python", "train.py"], "HOST…": ["node1", "node2"], "PID": ["4242"]}


def _variants(words: list[str]) -> list[list[str]]:
    """The concrete command lines a metasyntax line stands for: ``a|b`` alternatives, ``[optional]`` groups both
    ways, placeholders (HOST, RUN, CMD…) replaced by sample values."""
    out: list[list[str]] = [[]]
    i = 0
    while i < len(words):
        if words[i].startswith("["):
            j = next(k for k in range(i, len(words)) if words[k].endswith("]"))
            options = [[], *_variants(" ".join(words[i:j + 1])[1:-1].split())]
            i = j + 1
        else:
            options = [SAMPLES.get(alt, [alt]) for alt in words[i].split("|")]
            i += 1
        out = [done + option for done in out for option in options]
    return out


def _rgt_lines() -> list[tuple[str, tuple[str, ...]]]:
    lines = set()
    for doc, text in DOCS.items():
        for match in RGT.finditer(text):
            line = (match[1] or match[2]).replace("\\|", "|").strip()
            for argv in _variants(line.split()[1:]):
                lines.add((doc, tuple(argv)))
    return sorted(lines)


def _command_words(parser: argparse.ArgumentParser, argv: tuple[str, ...]) -> int:
    """How many leading words of ``argv`` name a (sub)command."""
    depth = 0
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or depth >= len(argv) or argv[depth] not in subs[0].choices:
            return depth
        parser = subs[0].choices[argv[depth]]
        depth += 1


@pytest.mark.parametrize(("doc", "argv"), _rgt_lines())
def test_every_rgt_line_parses(doc, argv, monkeypatch):
    parser = cli.build_parser()
    words = _command_words(parser, argv)
    assert words, f"{doc}: `rgt {' '.join(argv)}` names no rgt command"
    if words == len(argv):
        return  # the line names a command (a table cell), not an invocation
    try:
        namespace = parser.parse_args(list(argv))
    except SystemExit as done:  # --help exits 0
        assert done.code == 0, f"{doc}: `rgt {' '.join(argv)}` does not parse"
        return
    spec = getattr(namespace, "spec", None)
    if spec is None:
        return
    arguments = cli.arguments_of(spec, namespace)
    arguments.pop("host", None) if spec.remote else None
    if spec.cli_file_field and spec.cli_file_field not in arguments:
        arguments[spec.cli_file_field] = "text read from FILE"
    problems = [p for p in _problems(spec, arguments) if not p.startswith("input:")]
    assert not problems, f"{doc}: `rgt {' '.join(argv)}`: {problems}"


# --- the tool table and the flags ---------------------------------------------------------------------------

def _tool_table() -> dict[str, str]:
    """SKILL.md's `## Tools` table: tool name → its CLI cell."""
    section = DOCS["SKILL.md"].split("\n## Tools\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) >= 2:
            for name in re.findall(r"`([a-z_]+)\(", cells[0]):
                rows[name] = cells[1].replace("\\|", "|")
    return rows


def test_skill_tool_table_lists_every_tool_with_its_command():
    table = _tool_table()
    assert sorted(set(PUBLIC) - set(table)) == [], "tools missing from SKILL.md's tool table"
    assert sorted(set(table) - set(PUBLIC)) == [], "SKILL.md's tool table names tools that do not exist"
    for name, spec in PUBLIC.items():
        lines = re.findall(r"`rgt ([^`]+)`", table[name])
        commands = {" ".join(argv[:len(spec.cli.split())]) for line in lines for argv in _variants(line.split())}
        assert spec.cli in commands, f"{name}: SKILL.md says {table[name]}, the CLI is `rgt {spec.cli}`"


def _parser_of(spec) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    for word in spec.cli.split():
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_mcp_argument_has_a_cli_flag_with_its_default(name):
    spec = PUBLIC[name]
    parser = _parser_of(spec)
    flags = {option: action for action in parser._actions for option in action.option_strings}
    fixed = dict(spec.cli_fixed)
    for field_name, field in spec.input_model.model_fields.items():
        if field_name in fixed:
            continue  # e.g. preflight's job_id: a CLI process cannot poll a job another process started
        flag = f"--{field_name.replace('_', '-')}"
        assert flag in flags, f"rgt {spec.cli} has no {flag} (MCP argument {field_name})"
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        if default not in (None, [], {}):
            assert "(default: " in (flags[flag].help or ""), f"rgt {spec.cli} {flag}: --help shows no default"
    if spec.remote:
        assert "--host" in flags


def test_positional_and_its_flag_form_are_the_same_argument(capsys):
    parser = cli.build_parser()
    bare = parser.parse_args(["port-status", "29500"])
    named = parser.parse_args(["port-status", "--port", "29500"])
    spec = bare.spec
    assert cli.arguments_of(spec, bare)["port"] == cli.arguments_of(spec, named)["port"] == "29500"
    assert cli.main(["port-status", "29500", "--port", "29501"]) == 2
    assert "given twice" in capsys.readouterr().err


def test_diagnose_takes_text_as_a_flag(capsys):
    assert cli.main(["diagnose", "--text", "ValueError: Attempting to unscale FP16 gradients.", "--json"]) == 0
    assert '"AMP-01"' in capsys.readouterr().out
