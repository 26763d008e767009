"""Every box-side module imports with only what a box runtime has (tests/box_imports.py decides which).

Two depths: here, in seconds and without ssh, a child python whose imports are limited to the standard
library, our package and the runtime's dependencies (``box_requirements()``: no MCP SDK, no torch); and on
a clean loopback box, the runtime's own venv python that ``rgt box install --wheels`` built there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .box_imports import (
    PACKAGE,
    TRAINING_STACK,
    box_installed_imports,
    box_side_modules,
    box_third_party_imports,
    import_check_script,
    training_side_modules,
)

# Prepended to an import check: any import outside the standard library, our package and the names in
# $RGT_TEST_ALLOWED_IMPORTS fails as it would in a box runtime that lacks the package.
ONLY_RUNTIME_IMPORTS = """
import importlib.abc, os, sys
_allowed = set(os.environ["RGT_TEST_ALLOWED_IMPORTS"].split(","))

class _NotInTheRuntime(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        stdlib = top in sys.stdlib_module_names or top.startswith("_sysconfigdata")  # sysconfig's, per platform
        if top in _allowed or stdlib or top == "remote_gpu_trainer":
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (a box runtime does not have it)", name=name)

sys.meta_path.insert(0, _NotInTheRuntime())
"""


def _import_in_runtime_only(modules: list[str], names: list[str] = ()) -> dict[str, str]:
    """What fails to import in this interpreter limited to what a box runtime installs."""
    env = {**os.environ, "RGT_TEST_ALLOWED_IMPORTS": ",".join(sorted(box_installed_imports()))}
    done = subprocess.run([sys.executable, "-c", ONLY_RUNTIME_IMPORTS + import_check_script(modules, names)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])["failed"]


def test_the_box_side_is_every_module_but_the_mcp_server():
    modules = set(box_side_modules())
    for module in ("remote.serve", "runs.ledger", "runs.supervisor", "idle.guard", "idle.tool", "fleet.allreduce",
                   "repro.worker", "repro.fp16_unscale", "memory.measured", "cli"):
        assert f"{PACKAGE}.{module}" in modules, module
    assert f"{PACKAGE}.server" not in modules and f"{PACKAGE}.tool_cache" not in modules


def test_every_box_side_module_imports_without_the_mcp_sdk_or_torch():
    """The 2026-11-27 bug: runs/ledger.py → tool_cache → mcp.types failed on every box."""
    modules = [m for m in box_side_modules() if m not in training_side_modules()]
    assert _import_in_runtime_only(modules) == {}


def test_the_import_blocker_catches_what_a_box_lacks():
    failed = _import_in_runtime_only([f"{PACKAGE}.server", f"{PACKAGE}.tool_cache"], ["torch"])
    assert set(failed) == {f"{PACKAGE}.server", f"{PACKAGE}.tool_cache", "torch"}
    assert "'mcp" in failed[f"{PACKAGE}.tool_cache"]


def test_box_side_code_imports_only_the_runtime_and_the_training_stack():
    """Function-level imports too: a lazy ``import mcp`` in a box-side function fails there on first call."""
    allowed = box_installed_imports() | TRAINING_STACK
    stray = {name: modules for name, modules in box_third_party_imports().items() if name not in allowed}
    assert stray == {}, f"box-side code imports what `rgt box install` does not install: {stray}"
