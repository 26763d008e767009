"""The skill's markdown as the structure checks see it: which entries each file holds, the link and
ID problems, and each file's text for ``grep`` terms.

It reuses the package's own parser, ``tools/remote_gpu_trainer/catalog.py``, instead of a second
reader of the same format: that module imports only the standard library at module level
(pydantic is imported inside the one function that validates tool arguments, which this harness
never calls), so ``python3 evals/run_evals.py`` still runs with no install. Two parsers of one
format would drift (fences, front matter, GitHub anchor slugs); one cannot. A test
(``tests/test_evals_cli.py::test_structure_mode_imports_only_stdlib``) fails if the catalog ever
starts importing a third-party module at import time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from .schema import InputError
from .text import normalise

#: Catalog problems that break an eval contract (a ref or cite target, or a link an agent follows).
ID_RULES = ("duplicate-id", "id-prefix", "entry-heading")
LINK_RULES = ("link-target", "link-anchor")


#: The checkout this harness lives in: the catalog parser is imported from here, whatever skill
#: root is being checked (tests check fixture skills with the real parser).
HARNESS_ROOT = Path(__file__).resolve().parents[2]


def _catalog_modules() -> tuple[ModuleType, ModuleType]:
    tools = str(HARNESS_ROOT / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    try:
        from remote_gpu_trainer import catalog, paths
    except ImportError as exc:  # pragma: no cover - depends on the checkout
        raise InputError(
            f"cannot import the catalog parser from {tools}/remote_gpu_trainer ({exc}); structure mode needs "
            "catalog.py and paths.py to stay importable with the standard library only") from exc
    return catalog, paths


@dataclass
class Skill:
    root: Path
    files: list[str]
    entries: dict[str, dict[str, int]]
    """file → {entry ID → heading line}"""
    owner: dict[str, str]
    """entry ID → file (first definition)"""
    id_problems: list[str] = field(default_factory=list)
    link_problems: list[str] = field(default_factory=list)
    _texts: dict[str, str] = field(default_factory=dict, repr=False)

    def text(self, rel: str) -> str:
        """The file's normalised text (what ``grep`` terms are looked up in)."""
        if rel not in self._texts:
            self._texts[rel] = normalise((self.root / rel).read_text(encoding="utf-8", errors="replace"))
        return self._texts[rel]

    def resolve(self, name: str) -> str | None:
        """A skill-relative path for ``name``: as given if it exists, else the one catalog file whose
        path ends with ``/name`` (so a cite may say ``gotchas_universal.md``). None if absent or
        ambiguous."""
        name = name.strip().lstrip("./")
        if (self.root / name).is_file():
            return name
        found = [f for f in self.files if f.endswith("/" + name)]
        return found[0] if len(found) == 1 else None

    def catalog_files(self) -> list[str]:
        """Files that hold entries or could: everything under references/ and profiles/ except the
        profile schema."""
        return [f for f in self.files if f.startswith(("references/", "profiles/")) and not f.endswith("/_schema.md")]


def load_skill(root: Path) -> Skill:
    catalog, paths = _catalog_modules()
    rels = [p.as_posix() for p in paths.skill_markdown_files(root)]
    built = catalog.build_catalog(root, rels)
    entries: dict[str, dict[str, int]] = {rel: {} for rel in rels}
    owner: dict[str, str] = {}
    for e in built.entries:
        entries.setdefault(e.file, {})[e.id] = e.line
        owner.setdefault(e.id, e.file)
    skill = Skill(root, rels, entries, owner)
    for p in built.problems:
        if p.rule in ID_RULES:
            skill.id_problems.append(str(p))
        elif p.rule in LINK_RULES:
            skill.link_problems.append(str(p))
    return skill
