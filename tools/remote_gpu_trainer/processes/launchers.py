"""Recognise distributed launchers (torchrun and friends) and the worker tree under each.

Why it matters for a kill: the process holding torchrun's port is usually the elastic agent
(it hosts the rendezvous TCPStore) or rank 0. Killing only that one leaves the other workers
holding GPU memory, or lets an agent with ``--max-restarts`` respawn them. So a holder inside a
launcher tree brings the whole tree with it: the outermost launcher plus all of its descendants,
signalled children first (see terminate.py).

Recognised launchers (first words of the command line, never arbitrary substrings):
``torchrun``, ``python -m torch.distributed.run``, ``python -m torch.distributed.launch``,
``accelerate launch`` (runs torch's elastic agent in-process), ``deepspeed`` and
``python -m deepspeed.launcher.launch``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

from .snapshot import ProcessTable, read_cmdline

LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torch.distributed.launch",
    "deepspeed.launcher.launch": "deepspeed",
    "deepspeed.launcher.runner": "deepspeed",
    "accelerate.commands.launch": "accelerate",
    "accelerate.commands.accelerate_cli": "accelerate",
}
LAUNCHER_SCRIPTS = {"torchrun": "torchrun", "deepspeed": "deepspeed"}


def launcher_kind(cmdline: tuple[str, ...] | list[str]) -> str | None:
    """``torchrun`` / ``torch.distributed.launch`` / ``accelerate`` / ``deepspeed`` or ``None``."""
    argv = list(cmdline)
    # The script is argv[0] (``torchrun ...``) or argv[1] (``python /venv/bin/torchrun ...``).
    for position, arg in enumerate(argv[:2]):
        base = PurePosixPath(arg).name
        if base in LAUNCHER_SCRIPTS:
            return LAUNCHER_SCRIPTS[base]
        if base == "accelerate" and position + 1 < len(argv) and argv[position + 1] == "launch":
            return "accelerate"
    for index, arg in enumerate(argv[:4]):
        if arg == "-m" and index + 1 < len(argv) and argv[index + 1] in LAUNCHER_MODULES:
            module = argv[index + 1]
            if module == "accelerate.commands.accelerate_cli" and "launch" not in argv[index + 2:index + 3]:
                return None
            return LAUNCHER_MODULES[module]
    return None


def find_launcher(pid: int, table: ProcessTable,
                  cmdline_of: Callable[[int], tuple[str, ...]] = read_cmdline) -> int | None:
    """The outermost launcher among ``pid`` and its ancestors (``deepspeed`` → its
    ``deepspeed.launcher.launch`` → workers: the group is the outer one), or ``None``."""
    outermost = None
    for candidate in [pid, *table.ancestors(pid)]:
        if candidate <= 1:
            break
        if launcher_kind(cmdline_of(candidate)):
            outermost = candidate
    return outermost
