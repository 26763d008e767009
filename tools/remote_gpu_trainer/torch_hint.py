"""One sentence for "torch is not installed here", shared by every tool that needs torch.

torch is optional at run time (health, ports, diagnosis and estimates work without it), so a
missing torch is an environment fact, not a failure of the check: tools report it once, mark the
work they could not do as not run (SKIP), and the CLI exits with the "environment" status 4 that
``rgt health`` uses for "no NVIDIA GPU here".
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .trainenv.find import TrainingEnv

EXIT_ENVIRONMENT = 4
"""CLI status for "this machine cannot run the check" (no torch; ``rgt health``: no NVIDIA GPU)."""

INSTALL_HINT = ("add it with `pip install 'remote-gpu-trainer[torch]'` (on Linux the torch wheel from PyPI is the "
                "CUDA build; on a GPU box keep the torch you already have), or the CPU-only build: "
                "`pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`")


def torch_missing(reason: str, python: str | None = None) -> str:
    """``torch is not installed for <python> (<reason>): add it with ...``; on a box, into that python's own
    environment (the skill's runtime venv is never the job's)."""
    from .hostinfo import is_box_runtime

    if is_box_runtime():
        return (f"torch is not installed for {python or sys.executable} ({reason}): install it into that training "
                "environment, or pass python=/activate= for the one that has it")
    return f"torch is not installed for {python or sys.executable} ({reason}): {INSTALL_HINT}"


def no_training_torch(env: TrainingEnv) -> str:
    """Why a torch tool cannot run: which interpreters were looked at, and what to pass. On a box it never
    suggests installing torch into the skill's runtime (a private venv the job never uses)."""
    from .hostinfo import is_box_runtime
    from .trainenv.find import tilde

    if env.source in ("python", "activate", "launch_script"):
        why = "; ".join(env.errors.values()) or f"torch is not installed for {tilde(env.python)}"
        return (f"{why} ({env.found_by}): install torch into that environment, or pass the python/activate of "
                "the environment that has it")
    looked = ", ".join(f"{tilde(c.python)} ({c.where})" for c in env.candidates) or "no interpreter"
    fix = ("pass python= (the interpreter your training runs with, e.g. ~/venvs/pt/bin/python) or activate= "
           "('source ~/venvs/pt/bin/activate', 'conda activate NAME')")
    if is_box_runtime():
        return f"torch is not installed in any python found on this box (looked at {looked}): {fix}"
    return f"torch is not installed in any python found here (looked at {looked}): {fix}, or {INSTALL_HINT}"
