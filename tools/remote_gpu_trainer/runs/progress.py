"""Training progress from the tail of a run's log: step, total, loss, throughput, ETA.

Why only the tail: a week-long run writes hundreds of megabytes of log, and ``run_status`` is called
over ssh by an agent that wants an answer in milliseconds. The newest progress line is at the end,
so :func:`read_tail` seeks to the last ``TAIL_BYTES`` and never reads more (``bench/run_status.py``
holds it to ``tail -c 64k``).

Why patterns as data: every framework prints progress its own way (HF Trainer's ``{'loss': …}``
dicts, tqdm bars from HF/Accelerate/Lightning, torchtitan's ``step: N  loss: X``, plain prints), and
a new format should be a JSON edit, not a code change. ``progress_patterns.json`` documents the
fields; each regex's named groups are the fields it fills. Lines are split on ``\\n`` and on tqdm's
``\\r`` redraws and stripped of colour codes, as ``diagnose_error`` reads logs. Scanning goes from the
newest line back; each field keeps its newest value, step and total only from the same match.

A limit worth knowing: when an evaluation bar is printed after the training bar, the newest bar is
the evaluation's, so step/total describe it until training resumes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import Field

from ..models import StrictModel

TAIL_BYTES = 64 * 1024
LOOKBACK_LINES = 200
"""After the newest progress line, how many older lines may still fill missing fields (a loss printed
every 50 steps, an HF log dict between bars); bounds the parse on a log full of progress lines."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_NUMBER_FIELDS = ("step", "total", "loss", "epoch", "learning_rate", "throughput")
_FIELDS = (*_NUMBER_FIELDS, "throughput_unit", "eta_s")


class Progress(StrictModel):
    """What the log tail says about training progress; every field null when it says nothing."""

    step: int | None = Field(None, description="Newest step (iteration) number seen")
    total: int | None = Field(None, description="Total steps of the bar or the 'step N/M' line that gave step")
    percent: float | None = Field(None, description="step / total × 100")
    loss: float | None = Field(None, description="Newest training loss")
    epoch: float | None = None
    learning_rate: float | None = None
    throughput: float | None = Field(None, description="Newest throughput, in throughput_unit")
    throughput_unit: str | None = Field(None, description="e.g. it/s, samples/s, tokens/s")
    eta_s: float | None = Field(None, description="Seconds to the end: tqdm's own estimate, else "
                                "(total - step) / rate when the rate is in steps per second")
    formats: list[str] = Field(default_factory=list, description="Which log formats were recognised")
    last_line: str | None = Field(None, description="The newest line that gave a field (300 characters at most)")
    bytes_read: int = Field(0, description="How much of the log's end was read (at most 64 KiB)")


@dataclass(frozen=True)
class Pattern:
    name: str
    format: str
    needs: str
    regex: re.Pattern[str]
    constants: dict[str, str]

    @property
    def fields(self) -> frozenset[str]:
        """Fields this pattern can fill (``rate`` fills throughput, ``remaining`` fills eta_s)."""
        names = set(self.regex.groupindex) | set(self.constants)
        names |= {"throughput", "throughput_unit"} if "rate" in names else set()
        names |= {"eta_s"} if "remaining" in names else set()
        return frozenset(names & set(_FIELDS))


@cache
def patterns() -> tuple[Pattern, ...]:
    data = json.loads((Path(__file__).with_name("progress_patterns.json")).read_text())
    return tuple(Pattern(p["name"], p["format"], p["needs"], re.compile(p["regex"]), p.get("constants", {}))
                 for p in data["patterns"])


def read_tail(path: Path, max_bytes: int = TAIL_BYTES) -> tuple[str, int]:
    """The last ``max_bytes`` of ``path`` as text and the file size. A partial first line is dropped
    when the read started mid-file. Missing file: ("", 0)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            start = max(0, size - max_bytes)
            handle.seek(start)
            data = handle.read(max_bytes)
    except OSError:
        return "", 0
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else data
    return data.decode("utf-8", errors="replace"), size


def logical_lines(text: str) -> list[str]:
    """Lines split on newlines and on tqdm's carriage-return redraws, colour codes removed."""
    return [part for line in _ANSI.sub("", text).split("\n") for part in line.split("\r") if part.strip()]


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _clock(text: str) -> float | None:
    """tqdm's ``01:40`` or ``1:02:03`` in seconds; ``?`` is unknown."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + part
    return float(seconds)


def _fields_of(match: re.Match[str], pattern: Pattern) -> dict[str, object]:
    found: dict[str, object] = dict(pattern.constants)
    groups = {k: v for k, v in match.groupdict().items() if v not in (None, "", "?")}
    for name in _NUMBER_FIELDS:
        if name in groups and (value := _number(groups[name])) is not None:
            found[name] = value
    if "throughput_unit" in groups:
        found["throughput_unit"] = groups["throughput_unit"]
    if "rate" in groups and (rate := _number(groups["rate"])):
        unit = groups.get("rate_unit", "it/s")
        if unit.startswith("s/"):  # tqdm prints slow loops as seconds per iteration
            rate, unit = 1.0 / rate, unit[2:] + "/s"
        found["throughput"], found["throughput_unit"] = rate, unit
    if "remaining" in groups and (eta := _clock(groups["remaining"])) is not None:
        found["eta_s"] = eta
    return found


def parse_progress(text: str) -> Progress:
    """Progress from log text (already the tail). Newest value per field; see the module docstring."""
    found: dict[str, object] = {}
    formats: list[str] = []
    last_line: str | None = None
    budget: int | None = None  # once something was found, look only this many lines further back
    for line in reversed(logical_lines(text)):
        if budget is not None:
            budget -= 1
            if budget < 0:
                break
        for pattern in patterns():
            if pattern.needs not in line or pattern.fields <= found.keys():
                continue
            match = pattern.regex.search(line)
            if not match:
                continue
            fields = _fields_of(match, pattern)
            if "step" in found:  # step and total belong together: never mix two lines' numbers
                fields.pop("step", None)
                fields.pop("total", None)
            if "throughput" in found:
                fields.pop("throughput_unit", None)
            new = {k: v for k, v in fields.items() if k not in found}
            if new:
                found.update(new)
                last_line = last_line or line.strip()[:300]
                if pattern.format not in formats:
                    formats.append(pattern.format)
                budget = LOOKBACK_LINES if budget is None else budget
        if all(name in found for name in _FIELDS):
            break
    step = int(found["step"]) if "step" in found else None  # type: ignore[call-overload]
    total = int(found["total"]) if "total" in found else None  # type: ignore[call-overload]
    eta = found.get("eta_s")
    rate, unit = found.get("throughput"), found.get("throughput_unit")
    if eta is None and step is not None and total and rate and unit in ("it/s", "steps/s"):
        eta = max(0.0, (total - step) / float(rate))  # type: ignore[arg-type]
    return Progress(step=step, total=total, percent=round(100.0 * step / total, 1) if step is not None and total
                    else None, loss=found.get("loss"), epoch=found.get("epoch"),  # type: ignore[arg-type]
                    learning_rate=found.get("learning_rate"), throughput=rate,  # type: ignore[arg-type]
                    throughput_unit=unit, eta_s=eta, formats=formats, last_line=last_line)  # type: ignore[arg-type]


def progress_of(log: Path) -> Progress:
    text, size = read_tail(log)
    return parse_progress(text).model_copy(update={"bytes_read": min(size, TAIL_BYTES)})
