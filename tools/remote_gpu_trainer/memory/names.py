"""Which model a user means: preset keys, Hugging Face ids and the usual spellings, and the HF cache.

People type ``Qwen2.5-7B``, ``meta-llama/Llama-3.1-8B``, ``llama3-70b`` or ``Llama-3.1-70B-Instruct``.
All of them name a preset once case, separators (``-``, ``_``, ``.``, space), the org prefix and the
fine-tuning suffix (Instruct, it, chat, hf, base — the architecture is the same) are set aside. A miss
suggests the nearest names (difflib). An id that is not a preset may still be in the local Hugging
Face cache (``models--org--name/snapshots/*/config.json``), which is read exactly like a config file.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

#: Fine-tuning suffixes that do not change the architecture, stripped from the end of a name.
_SUFFIX = re.compile(r"[-_. ](instruct|it|chat|hf|base|pt)$")
_MISTRAL_VERSION = re.compile(r"[-_. ]v0[._]\d+$")


def normalize(name: str) -> str:
    """``meta-llama/Meta-Llama-3.1-70B-Instruct`` → ``llama3170b``: the comparable core of a name."""
    s = name.strip().lower().rsplit("/", 1)[-1]
    previous = None
    while previous != s:
        previous = s
        s = _SUFFIX.sub("", s)
        s = _MISTRAL_VERSION.sub("", s)
    s = re.sub(r"[-_. ]", "", s)
    return s.removeprefix("meta") if s.startswith("metallama") else s


def index(presets: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Normalised spelling → preset key, from each key, its ``_hf_id`` and its ``_aliases``."""
    out: dict[str, str] = {}
    for key, cfg in presets.items():
        for spelling in (key, cfg.get("_hf_id", ""), *cfg.get("_aliases", [])):
            if spelling:
                out.setdefault(normalize(spelling), key)
    return out


def find_preset(name: str, presets: dict[str, dict[str, Any]]) -> str | None:
    if name in presets:
        return name
    return index(presets).get(normalize(name))


def nearest(name: str, presets: dict[str, dict[str, Any]], n: int = 3) -> list[str]:
    """Preset keys closest to ``name`` (for "did you mean"), best first."""
    idx = index(presets)
    hits = difflib.get_close_matches(normalize(name), list(idx), n=n * 3, cutoff=0.6)
    out: list[str] = []
    for hit in hits:
        if idx[hit] not in out:
            out.append(idx[hit])
    return out[:n]


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_config(model_id: str) -> Path | None:
    """``config.json`` of ``org/name`` in the local HF cache: the snapshot ``refs/main`` names, else the newest."""
    if model_id.count("/") != 1 or model_id.startswith(("/", ".", "~")):
        return None
    entry = hub_cache() / ("models--" + model_id.replace("/", "--"))
    if not entry.is_dir():
        return None
    ref = entry / "refs" / "main"
    if ref.is_file():
        pinned = entry / "snapshots" / ref.read_text(encoding="utf-8").strip() / "config.json"
        if pinned.is_file():
            return pinned
    found = sorted((entry / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0] if found else None
