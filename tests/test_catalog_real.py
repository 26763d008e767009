"""Lint of the REAL skill markdown (SKILL.md, references/, profiles/) and of the code's pointers into it.

Failures print one line per problem (``file:line ID: rule: detail``) and a count per file and rule.
Writers can run the same report with ``python -m remote_gpu_trainer.catalog [FILE...]``.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from remote_gpu_trainer.catalog import Problem, lint, load_catalog, registered_tools
from remote_gpu_trainer.paths import skill_markdown_files

from .conftest import ROOT

PACKAGE = ROOT / "tools" / "remote_gpu_trainer"
_ENTRY_REF = re.compile(r"EntryRef\((?P<args>[^()]*)\)")
_ARG = re.compile(r"\b(?P<name>file|id)\s*=\s*(?P<q>[\"'])(?P<value>[^\"']*)(?P=q)")


def report(problems: list[Problem]) -> str:
    by_file = Counter(p.file for p in problems)
    by_rule = Counter(p.rule for p in problems)
    summary = [f"{len(problems)} problem(s)",
               "per file: " + ", ".join(f"{f} {n}" for f, n in sorted(by_file.items())),
               "per rule: " + ", ".join(f"{r} {n}" for r, n in by_rule.most_common())]
    return "\n".join([*map(str, problems), *summary])


def test_real_catalog_entries_are_well_formed():
    """Headings, fields, signatures, IDs, links (everything but the Tool field)."""
    problems = [p for p in lint() if not p.rule.startswith("tool-")]
    assert not problems, report(problems)


def test_real_tool_fields_name_registered_tools_or_existing_scripts():
    problems = [p for p in lint(tools=registered_tools()) if p.rule.startswith("tool-")]
    assert not problems, report(problems)


def test_lint_covers_skill_md_references_and_profiles():
    files = set(load_catalog().files)
    assert files == {p.as_posix() for p in skill_markdown_files()}
    assert "SKILL.md" in files and any(f.startswith("references/") for f in files)


def entry_refs(package: Path, base: Path = ROOT) -> list[tuple[str, int, str, str]]:
    """(path relative to ``base``, line, file, id) for every ``EntryRef(file="…", id="…")`` literal,
    in either argument order; calls with non-literal arguments are not pointers we can check."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for m in _ENTRY_REF.finditer(text):
            args = {a.group("name"): a.group("value") for a in _ARG.finditer(m.group("args"))}
            if set(args) == {"file", "id"}:
                line = text.count("\n", 0, m.start()) + 1
                found.append((path.relative_to(base).as_posix(), line, args["file"], args["id"]))
    return found


def test_entry_ref_scanner_reads_both_argument_orders(tmp_path):
    (tmp_path / "a.py").write_text('X = EntryRef(file="references/x.md", id="X-01")\n'
                                   "Y = EntryRef(\n    id='Y-02',\n    file='references/y.md',\n)\n"
                                   "Z = EntryRef(file=name, id=other)\n")
    assert entry_refs(tmp_path, tmp_path) == [("a.py", 1, "references/x.md", "X-01"),
                                              ("a.py", 2, "references/y.md", "Y-02")]


def test_every_entry_ref_in_the_code_resolves_to_a_real_entry():
    refs = entry_refs(PACKAGE)
    assert len(refs) >= 5, "the scanner found almost no EntryRef literals: is the pattern still right?"
    catalog = load_catalog()
    bad = []
    for path, line, file, entry_id in refs:
        if entry_id not in catalog:
            bad.append(f"{path}:{line}: EntryRef(file={file!r}, id={entry_id!r}): no such entry")
        elif catalog.entry(entry_id).file != file:
            bad.append(f"{path}:{line}: EntryRef(file={file!r}, id={entry_id!r}): {entry_id} is in "
                       f"{catalog.entry(entry_id).file}")
    assert not bad, "\n".join(bad) + f"\n{len(bad)} of {len(refs)} EntryRef literals do not resolve"
