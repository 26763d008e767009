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
import time

import pytest

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


@pytest.mark.slow
def test_the_installed_runtime_on_a_clean_box_imports_every_box_side_module(ssh_fleet):
    """In the venv that `rgt box install --wheels` built on a clean box: every box-side module and every
    third-party name box-side code imports (the training stack aside) import; the MCP SDK and torch do not
    (the box's system python sees neither, so the test would notice a box that leaks the test venv)."""
    from remote_gpu_trainer.remote.runtime import runtime_version

    modules = [m for m in box_side_modules() if m not in training_side_modules()]
    names = sorted(set(box_third_party_imports()) - TRAINING_STACK)
    python = f'"$HOME/.cache/remote-gpu-trainer/{runtime_version()}/venv/bin/python"'
    for alias in ("box-a", "box-b"):
        done = ssh_fleet.ssh(alias, f"{python} -", import_check_script(modules, names))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1])["failed"] == {}, alias
        assert _runtime_lacks(ssh_fleet, alias) == {"mcp", "torch"}, alias


def _runtime_lacks(fleet, alias: str) -> set[str]:
    """Which of the MCP SDK and torch the runtime's python on the box cannot import."""
    from remote_gpu_trainer.remote.runtime import runtime_version

    python = f'"$HOME/.cache/remote-gpu-trainer/{runtime_version()}/venv/bin/python"'
    done = fleet.ssh(alias, f"{python} -", import_check_script([], ["mcp", "torch"]))
    return set(json.loads(done.stdout.splitlines()[-1])["failed"])


TRAIN = """import time
for step in range(1, 100001):
    print(f"step {step}/100000 loss 1.0", flush=True)
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_every_run_and_idle_tool_works_through_host_on_a_clean_box(ssh_fleet):
    """The issue's bar: a box whose runtime has no MCP SDK runs the run tools and the idle tools, and the
    armed guard's loop runs there until it fires (its checks read the run ledger)."""
    from remote_gpu_trainer.registry import all_specs

    specs = {spec.name: spec for spec in all_specs()}

    def call(tool: str, **arguments):
        return specs[tool].call({"host": "clean-runs", **arguments})

    box = ssh_fleet.add("clean-runs", scenario="idle-8xh100")
    ssh_fleet.install_runtime("clean-runs")
    assert _runtime_lacks(ssh_fleet, "clean-runs") == {"mcp", "torch"}
    (box.home / "train.py").write_text(TRAIN)
    started = call("run_start", argv=[str(box.train_python), "train.py"], cwd=str(box.home), name="clean")
    assert started.host == "clean-runs" and started.run_id
    deadline = time.monotonic() + 60
    status = call("run_status", run_id=started.run_id)
    while ((status.progress and status.progress.step) or 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.3)
        status = call("run_status", run_id=started.run_id)
    assert status.state == "running" and status.progress.step >= 3 and status.progress.total == 100000, status
    assert "step" in call("run_logs", run_id=started.run_id, lines=5).text
    assert started.run_id in [r.run_id for r in call("run_list").runs]
    dry = call("run_stop", run_id=started.run_id)
    assert dry.dry_run and dry.confirm_token
    stopped = call("run_stop", run_id=started.run_id, dry_run=False, confirm_token=dry.confirm_token, grace_s=5)
    assert stopped.verified, stopped.summary

    idle = call("box_idle", window_s=0)
    assert idle.host == "clean-runs" and idle.verdict == "idle", idle.summary
    plan = call("idle_guard", action="notify", idle_minutes=0.01, interval_s=0.2)
    assert plan.mode == "dry_run" and plan.confirm_token
    try:
        armed = call("idle_guard", action="notify", idle_minutes=0.01, interval_s=0.2, dry_run=False,
                     confirm_token=plan.confirm_token)
        assert armed.mode == "armed" and armed.pid
        deadline = time.monotonic() + 30
        shown = call("box_idle", window_s=0)
        while not (shown.guard and shown.guard.notice) and time.monotonic() < deadline:
            time.sleep(0.3)
            shown = call("box_idle", window_s=0)
        log = (box.home / ".cache" / "remote-gpu-trainer" / "guard" / "guard.log").read_text()
        assert shown.guard.notice and shown.guard.state == "fired", log  # the loop checked, then acted
        assert "Traceback" not in log
    finally:
        assert call("idle_guard", remove=True).mode in ("removed", "nothing_to_remove")
