"""One sentence for "torch is not installed here", shared by every tool that needs torch.

torch is optional at run time (health, ports, diagnosis and estimates work without it), so a
missing torch is an environment fact, not a failure of the check: tools report it once, mark the
work they could not do as not run (SKIP), and the CLI exits with the "environment" status 4 that
``rgt health`` uses for "no NVIDIA GPU here".
"""

from __future__ import annotations

import sys

EXIT_ENVIRONMENT = 4
"""CLI status for "this machine cannot run the check" (no torch; ``rgt health``: no NVIDIA GPU)."""

INSTALL_HINT = ("add it with `pip install 'remote-gpu-trainer[torch]'` (on Linux the torch wheel from PyPI is the "
                "CUDA build; on a GPU box keep the torch you already have), or the CPU-only build: "
                "`pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`")


def torch_missing(reason: str, python: str | None = None) -> str:
    """``torch is not installed for <python> (<reason>): add it with ...``."""
    return f"torch is not installed for {python or sys.executable} ({reason}): {INSTALL_HINT}"
