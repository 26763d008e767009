"""The one list of tools. Server and CLI both read it, so a tool added here appears in both.

Each module named here exposes ``SPECS: list[ToolSpec]`` and must import nothing heavy at module
level (no torch, no pynvml): the server imports all of them at start-up.
"""

from __future__ import annotations

from importlib import import_module

from .toolspec import ToolSpec

TOOL_MODULES = (
    "remote_gpu_trainer.info",
    "remote_gpu_trainer.processes.tool",
    "remote_gpu_trainer.repro.tool",
    "remote_gpu_trainer.health.tool",
    "remote_gpu_trainer.diagnose",
    "remote_gpu_trainer.providers",
    "remote_gpu_trainer.memory.tool",
    "remote_gpu_trainer.render.tool",
    "remote_gpu_trainer.runs.tool",
    "remote_gpu_trainer.runs.hang",
    "remote_gpu_trainer.idle.tool",
    "remote_gpu_trainer.remote.box",
    "remote_gpu_trainer.fleet.facts",
    "remote_gpu_trainer.fleet.tool",
    "remote_gpu_trainer.fleet.allreduce",
)


#: The first word of every CLI command → the module that defines it, so ``rgt health`` imports one tool
#: module instead of all of them (building every tool's pydantic models costs ~0.4 s, most of a cold
#: ``rgt health``). tests/test_cli.py holds it to the specs.
CLI_HOMES: dict[str, tuple[str, ...]] = {
    "info": ("remote_gpu_trainer.info",),
    "ports": ("remote_gpu_trainer.processes.tool",), "port-status": ("remote_gpu_trainer.processes.tool",),
    "repro": ("remote_gpu_trainer.repro.tool",), "amp-check": ("remote_gpu_trainer.repro.tool",),
    "health": ("remote_gpu_trainer.health.tool",), "zombies": ("remote_gpu_trainer.health.tool",),
    "diagnose": ("remote_gpu_trainer.diagnose",),
    "provider": ("remote_gpu_trainer.providers",),
    "mem": ("remote_gpu_trainer.memory.tool",),
    "render": ("remote_gpu_trainer.render.tool",), "render-template": ("remote_gpu_trainer.render.tool",),
    "run": ("remote_gpu_trainer.runs.tool", "remote_gpu_trainer.runs.hang"),
    "guard": ("remote_gpu_trainer.idle.tool",), "idle": ("remote_gpu_trainer.idle.tool",),
    "pull": ("remote_gpu_trainer.idle.tool",),
    "box": ("remote_gpu_trainer.remote.box",),
    "preflight": ("remote_gpu_trainer.fleet.tool",),
}


def cli_specs(word: str) -> list[ToolSpec] | None:
    """The specs behind ``rgt <word> ...``, importing only their module; None for a word not listed."""
    modules = CLI_HOMES.get(word)
    if modules is None:
        return None
    return [s for module in modules for s in import_module(module).SPECS
            if not s.internal and s.cli.split()[0] == word]


_HOMES: dict[str, str] = {}
"""Tool name → the module that defines it, filled by :func:`all_specs`."""


def home_of(tool: str) -> str | None:
    """The module defining ``tool``, sent to the box so that it imports only that one (:func:`find_spec`)."""
    if tool not in _HOMES:
        all_specs()
    return _HOMES.get(tool)


def find_spec(tool: str, module: str | None = None) -> ToolSpec | None:
    """The spec named ``tool``, importing only ``module`` when it is one of ours.

    The box's runtime answers a session's first call this way: importing every tool module (pydantic
    schemas for all of them) would cost most of a second on a cold session.
    """
    if module in TOOL_MODULES:
        found = next((s for s in import_module(module).SPECS if s.name == tool), None)
        if found is not None:
            return found
    return next((s for s in all_specs() if s.name == tool), None)


def all_specs() -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for name in TOOL_MODULES:
        module_specs = import_module(name).SPECS
        _HOMES.update((spec.name, name) for spec in module_specs)
        specs.extend(module_specs)
    names = [s.name for s in specs]
    clis = [s.cli for s in specs]
    if len(set(names)) != len(names) or len(set(clis)) != len(clis):
        raise RuntimeError(f"duplicate tool or CLI names in registry: {names} / {clis}")
    return specs
