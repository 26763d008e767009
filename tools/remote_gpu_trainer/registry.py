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
    "remote_gpu_trainer.idle.tool",
    "remote_gpu_trainer.remote.box",
    "remote_gpu_trainer.fleet.facts",
    "remote_gpu_trainer.fleet.tool",
)


def all_specs() -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for name in TOOL_MODULES:
        specs.extend(import_module(name).SPECS)
    names = [s.name for s in specs]
    clis = [s.cli for s in specs]
    if len(set(names)) != len(names) or len(set(clis)) != len(clis):
        raise RuntimeError(f"duplicate tool or CLI names in registry: {names} / {clis}")
    return specs
