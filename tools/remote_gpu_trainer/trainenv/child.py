"""Run one of our torch-side modules (``python -m remote_gpu_trainer.…``) under the training interpreter.

The user's interpreter has torch but none of the runtime's packages, and may be another Python version: the
runtime venv's site-packages (pydantic-core, psutil) are built for the runtime's python and must not leak into
it. So the child gets a ``PYTHONPATH`` entry that holds our package and nothing else: a directory with one
symlink to the package (``<cache>/torch-side/<key>/remote_gpu_trainer``). The modules it runs (the torch-side
modules, tests/box_imports.py: ``TORCH_ENTRY_POINTS``) import only the standard library, torch and each other,
and a test holds them to that.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..paths import cache_dir
from .find import TrainingEnv

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def package_only_path() -> str:
    """A directory whose only entry is a symlink to our package (made once per package location)."""
    key = hashlib.sha256(str(PACKAGE_DIR).encode()).hexdigest()[:12]
    folder = cache_dir() / "torch-side" / key
    link = folder / PACKAGE_DIR.name
    if not (link.is_symlink() and link.resolve() == PACKAGE_DIR):
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{PACKAGE_DIR.name}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(PACKAGE_DIR)
        os.replace(temporary, link)  # atomic: a concurrent call sees the old link or the new one
    return str(folder)


def child_environ(env: TrainingEnv, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for ``[env.python, "-m", "remote_gpu_trainer.<module>"]``: ours, the activation, our
    package first on PYTHONPATH (the activation's own PYTHONPATH after it), then ``extra``."""
    environ = env.environ()
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (package_only_path(), environ.get("PYTHONPATH")) if p)
    environ.update(extra or {})
    return environ
