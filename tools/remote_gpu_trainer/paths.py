"""Where the skill's files and the package's cache live.

The package sits at ``tools/remote_gpu_trainer`` inside the skill, so the skill root is two levels
up. ``RGT_SKILL_ROOT`` overrides that for unusual installs (e.g. a wheel installed without the repo).
The runtime a box gets (remote/runtime.py) carries the skill's files inside the package as ``_skill/``.

This module imports only the standard library: the box runtime (remote/runtime.py) has no MCP SDK, and
everything a box-side tool needs from here must import there.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

#: Top-level markdown the skill exposes (as MCP resources and to the catalog parser).
SKILL_FILE = "SKILL.md"
MARKDOWN_DIRS = ("references", "profiles")


@cache
def skill_root() -> Path:
    override = os.environ.get("RGT_SKILL_ROOT")
    bundled = Path(__file__).resolve().parent / "_skill"
    root = Path(override) if override else bundled if bundled.is_dir() else Path(__file__).resolve().parents[2]
    return root.resolve()


def skill_markdown_files(root: Path | None = None) -> list[Path]:
    """SKILL.md plus every markdown file under references/ and profiles/, sorted, as relative paths.

    A symlink whose target lies outside the skill is left out, so it can never be served.
    """
    root = (root or skill_root()).resolve()
    candidates = [root / SKILL_FILE]
    for top in MARKDOWN_DIRS:
        candidates.extend(sorted((root / top).rglob("*.md")))
    return [p.relative_to(root) for p in candidates if p.is_file() and p.resolve().is_relative_to(root)]


def cache_dir() -> Path:
    """The package's cache directory: ``$RGT_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or ``~/.cache``, then
    ``remote-gpu-trainer``. On a laptop it holds the server's tool-list cache; on a box the runtime
    versions, the run ledger (``runs/``) and the per-boot NVML facts. The idle guard and custody records stay at
    ``~/.cache/remote-gpu-trainer/`` whatever these variables say (``idle/guard.py``, ``idle/custody.py``), so a
    guard armed from one environment is found again from another."""
    if override := os.environ.get("RGT_CACHE_DIR"):
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "remote-gpu-trainer"
