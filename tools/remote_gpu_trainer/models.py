"""Types shared by every tool: verdicts, catalog references, the strict base model."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """Base for tool inputs and outputs: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class Verdict(StrEnum):
    """One verdict scale everywhere. A signal that could not be read is UNKNOWN or SKIP, never PASS."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"
    SKIP = "SKIP"


# FAIL dominates; UNKNOWN outranks WARN because "we could not check" must not read as "mostly fine".
_SEVERITY = {Verdict.SKIP: 0, Verdict.PASS: 1, Verdict.WARN: 2, Verdict.UNKNOWN: 3, Verdict.FAIL: 4}


def worst(verdicts: list[Verdict] | tuple[Verdict, ...]) -> Verdict:
    """Combine verdicts: the most severe wins; nothing checked at all is UNKNOWN."""
    checked = [v for v in verdicts if v is not Verdict.SKIP]
    if not checked:
        return Verdict.UNKNOWN
    return max(checked, key=_SEVERITY.__getitem__)


class EntryRef(StrictModel):
    """A pointer to a catalog entry, so every finding tells the reader where to learn more."""

    file: str = Field(description="Path relative to the skill root, e.g. references/training/oom-memory.md")
    id: str = Field(description="Entry ID inside that file, e.g. OOM-03")
