"""Which of our modules run on a box, and which third-party names they may import there.

A box's runtime (remote/runtime.py) holds our wheel and the project's dependencies minus those only the
local MCP side needs (``box_requirements()``: no ``mcp``). Everything the box may execute must import with
exactly that, plus the standard library; the user's training stack (torch and friends) is the box's own and
may be missing, so it may only be imported lazily and with a fallback (the tools report "torch missing").

The box executes:

* ``remote.serve``, the session server, and every module it can dispatch to: ``registry.find_spec`` imports
  the named tool module and falls back to every module of ``registry.TOOL_MODULES``;
* ``cli`` (the runtime installs ``rgt`` in its venv, to rerun a tool by hand on the box);
* whatever those start with ``python -m remote_gpu_trainer.…`` (the run supervisor, the idle guard, the repro
  worker, the all-reduce ranks, the measured-memory child), named in the code as strings, and the modules a
  module loads by name with ``import_module`` (the repro cases);

and, transitively, every module of ours that any of these imports, at module level or inside a function
(a function-level import runs on the box as soon as the tool does). :func:`box_side_modules` follows exactly
that from the sources, so a new tool or a new import is covered without editing a list here. The one stop is
the MCP server (``rgt serve`` in cli.py imports it): a box never serves MCP, and it is the only module that
needs the MCP SDK.

Some box-side modules import torch at module level on purpose (``repro/toy.py``, ``memory/torch_models.py``):
they run only inside a child process of the training environment. :func:`training_side_modules` names them
from their top-level statements.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

PACKAGE = "remote_gpu_trainer"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / "tools" / PACKAGE
#: Where the box starts executing our code.
ENTRY_POINTS = (f"{PACKAGE}.remote.serve", f"{PACKAGE}.cli")
#: Never run on a box (the MCP server, reached from ``rgt serve``); the walk stops there.
LOCAL_ONLY = frozenset({f"{PACKAGE}.server"})
#: The user's training stack: the box's own environment, never installed by ``rgt box install``; our code
#: imports these only inside functions and reports them missing.
TRAINING_STACK = frozenset({"torch", "accelerate", "transformers", "deepspeed", "numpy"})
_MODULE_STRING = re.compile(rf"^{PACKAGE}(\.[a-z_][a-z0-9_]*)+$")


def _source(module: str) -> Path | None:
    """The file of one of our modules (a package's ``__init__.py``), None for a name that is not a module."""
    if module == PACKAGE:
        return PACKAGE_DIR / "__init__.py"
    relative = Path(*module.split(".")[1:])
    for candidate in (PACKAGE_DIR / relative.with_suffix(".py"), PACKAGE_DIR / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_module(name: str) -> bool:
    return (name == PACKAGE or name.startswith(PACKAGE + ".")) and _source(name) is not None


def _is_package(module: str) -> bool:
    return _source(module).name == "__init__.py"


@cache
def _tree(module: str) -> ast.Module:
    path = _source(module)
    assert path is not None, module
    return ast.parse(path.read_text(), str(path))


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if _is_package(module) else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imported_names(module: str, nodes) -> list[str]:
    """Dotted names the import statements among ``nodes`` import (``from a import b`` gives a and a.b)."""
    names: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            names += [target, *(f"{target}.{alias.name}" for alias in node.names)]
    return names


def _by_name(module: str) -> list[str]:
    """Our modules named as strings: ``"remote_gpu_trainer.x.y"`` (for ``-m``), and, in a module that calls
    ``import_module``, a bare string naming a sibling module (``import_module(f"{__package__}.{name}")``)."""
    package = module if _is_package(module) else module.rpartition(".")[0]
    loads_by_name = "import_module(" in _source(module).read_text()
    names = []
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _MODULE_STRING.match(node.value):
                names.append(node.value)
            elif loads_by_name and node.value.isidentifier() and _is_module(f"{package}.{node.value}"):
                names.append(f"{package}.{node.value}")
    return names


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(our modules, third-party top-level names) that ``module`` imports anywhere, or names as a string."""
    ours: set[str] = set()
    third: set[str] = set()
    for name in _imported_names(module, ast.walk(_tree(module))) + _by_name(module):
        top = name.split(".")[0]
        if top == PACKAGE:
            # a parent package is imported first: `from .a.b import c` runs a/__init__.py and a/b.py
            parts = name.split(".")
            ours.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if _is_module(".".join(parts[:i])))
        elif top and top not in sys.stdlib_module_names and top != "__future__":
            third.add(top)
    return ours, third


@cache
def box_side_modules() -> tuple[str, ...]:
    """Every module of ours the box can execute, sorted (see the module docstring)."""
    seen: set[str] = set()
    todo = list(ENTRY_POINTS)
    while todo:
        module = todo.pop()
        if module in seen or module in LOCAL_ONLY:
            continue
        seen.add(module)
        todo.extend(_imports(module)[0] - seen)
    return tuple(sorted(seen))


def _top_level_statements(body: list[ast.stmt]):
    """Statements that run when the module is imported: not the bodies of functions."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _top_level_statements(getattr(node, field, []))


def training_side_modules() -> tuple[str, ...]:
    """Box-side modules that import the training stack when imported: only a training child loads them."""
    return tuple(m for m in box_side_modules()
                 if {n.split(".")[0] for n in _imported_names(m, _top_level_statements(_tree(m).body))}
                 & TRAINING_STACK)


def box_third_party_imports() -> dict[str, list[str]]:
    """Third-party top-level name → the box-side modules that import it (anywhere in the module)."""
    found: dict[str, list[str]] = {}
    for module in box_side_modules():
        for name in _imports(module)[1]:
            found.setdefault(name, []).append(module)
    return found


def _import_names(distribution: str) -> set[str]:
    return {name for name, dists in metadata.packages_distributions().items()
            if distribution.lower().replace("_", "-") in (d.lower().replace("_", "-") for d in dists)}


def requirement_closure(*requirements: str) -> list[str]:
    """The distributions installed here that ``requirements`` name, and those they require (no extras)."""
    from packaging.requirements import Requirement

    seen: dict[str, str] = {}
    todo = list(requirements)
    while todo:
        requirement = Requirement(todo.pop())
        key = requirement.name.lower().replace("_", "-")
        if key in seen or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        try:
            todo.extend(metadata.requires(requirement.name) or [])
        except metadata.PackageNotFoundError:
            continue
        seen[key] = requirement.name
    return list(seen.values())


def box_installed_imports() -> set[str]:
    """Top-level names the runtime's dependencies provide (``box_requirements()`` and what they require)."""
    from remote_gpu_trainer.remote.runtime import box_requirements

    return {name for dist in requirement_closure(*box_requirements()) for name in _import_names(dist)}


def import_check_script(modules: list[str], names: list[str] = ()) -> str:
    """A standard-library-only script for ``python -``: imports ``modules`` and the top-level ``names``, then
    prints one JSON line ``{"failed": {name: "ModuleNotFoundError: … | where"}}``."""
    return f"""
import importlib, json, traceback
failed = {{}}
for name in {json.dumps([*modules, *names])}:
    try:
        importlib.import_module(name)
    except BaseException as err:
        where = traceback.format_exc(limit=-3).replace(chr(10), " ")[-600:]
        failed[name] = f"{{type(err).__name__}}: {{err}} | {{where}}"
print(json.dumps({{"failed": failed}}))
"""
