"""Data shapes shared by the case modules, the worker and the runner. No torch here.

A case is a failure class (one catalog entry); a variant is one concrete way user code reaches
it. Variants carry what to expect (exception class and a pattern of its message) so the *server*
can judge a run, while the worker only observes: the real exception text always comes from torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CatalogRef:
    """A catalog entry (file, ID). Plain data, not the pydantic ``EntryRef``: the case modules also import in the
    training interpreter, which has torch and the standard library only (trainenv/child.py); the judging side
    turns it into an ``EntryRef`` (``results.entry_ref``)."""

    file: str
    id: str


@dataclass(frozen=True)
class Expect:
    """The exception a variant must raise: class name(s) and a regex searched in ``str(exc)``.

    The pattern only *recognises* the failure; the message reported is always torch's own text, so
    a torch release that rewords it shows up as ``different_error`` instead of a false match.
    """

    types: tuple[str, ...]
    pattern: str

    def matches(self, exc_type: str | None, message: str | None) -> bool:
        return exc_type in self.types and message is not None and re.search(self.pattern, message) is not None


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    """What the buggy code does, in one sentence a user recognises."""
    expect: Expect | None
    """The exception; ``None`` for a numeric symptom (NaN loss, skipped steps) with no exception."""
    fix: str
    """What the fix changes, in one sentence."""
    diff: str
    """User-level change as a short unified-diff-style snippet (bug lines ``-``, fix lines ``+``)."""
    cuda_only: bool = False
    """The exact error comes from a CUDA kernel; on CPU the same code runs without it."""
    cuda_note: str = ""
    """For ``cuda_only``: what happens on CPU and what CUDA raises instead."""
    entry: CatalogRef | None = None
    """Catalog entry when it differs from the case's (e.g. an FSDP variant of an AMP failure)."""


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    why: str
    """The mechanism in two sentences: why torch raises (or misbehaves) here."""
    entry: CatalogRef
    variants: tuple[Variant, ...]
    distributed: bool = False
    """Runs its own ranks (forked from the worker), always on CPU with gloo."""

    @property
    def default(self) -> Variant:
        return self.variants[0]

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def entry_for(self, variant: Variant) -> CatalogRef:
        return variant.entry or self.entry


@dataclass
class Raised:
    """An exception as observed: class name, torch's message, and where inside torch it was raised."""

    type: str
    message: str
    raised_at: str | None = None
    """Innermost traceback frame inside the torch package, e.g. ``torch/amp/grad_scaler.py:275``."""
    function: str | None = None
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "raised_at": self.raised_at,
                "function": self.function, "rank": self.rank}


@dataclass
class Observed:
    """What a bug or fix run returned when it did not raise (or, distributed, what its ranks did)."""

    symptom: bool = False
    """The failure showed up without an exception (non-finite loss, every step skipped)."""
    detail: str = ""
    """Measured facts in one line, e.g. ``3 steps, loss 0.94 → 0.87, scale 65536``."""
    metrics: dict[str, float | int | str] = field(default_factory=dict)
    raised: Raised | None = None
    """Distributed runs: the root-cause rank's exception (the ranks cannot re-raise across processes)."""
    ranks: list[dict[str, Any]] = field(default_factory=list)


CaseFunction = Callable[[str, str], Observed]
