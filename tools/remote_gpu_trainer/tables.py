"""Plain-text tables for the CLI. Results carry bytes as integers; people read GiB."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from enum import Enum

from pydantic import BaseModel

GIB = 1024**3


def gib(n: int | float | None, digits: int = 2) -> str:
    return "-" if n is None else f"{n / GIB:.{digits}f} GiB"


def where(result: object) -> str:
    """``on HOST`` for a result stamped with the box it came from (ToolSpec.call), else ``here``."""
    host = getattr(result, "host", None)
    return f"on {host}" if host else "here"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(_cell(v) for v in value)
    return str(value)


TABLE_WIDTH = 120
"""Tables wrap their ``wrap`` columns to keep lines about this wide; nothing is ever cut."""
MIN_WRAP = 30
MAX_WORD = 100


def _wrapped(text: str, width: int) -> list[str]:
    """``text`` on lines of at most ``width`` characters, broken at spaces where it can (never at hyphens, so
    ``--flags`` stay whole), with every character kept."""
    lines: list[str] = []
    for part in text.split("\n"):
        lines += textwrap.wrap(part, width, break_on_hyphens=False, drop_whitespace=True) or [""]
    return lines


def _fit(widths: list[int], wrapped: list[int], rows: list[list[str]], budget: int, floors: list[int]) -> None:
    """Share ``budget`` characters among the ``wrapped`` columns: narrow ones keep their natural width, the rest
    split what is left evenly. A column never gets narrower than its header, ``MIN_WRAP`` or its longest word
    (up to ``MAX_WORD``), so a run name or a path is never broken across lines."""
    left = sorted(wrapped, key=lambda i: widths[i])
    while left:
        share = max(0, budget) // len(left)
        i = left.pop(0)
        longest = max((len(word) for row in rows for word in row[i].split()), default=0)
        floor = max(floors[i], MIN_WRAP, min(longest, MAX_WORD))
        widths[i] = min(widths[i], max(share, floor))
        budget -= widths[i]


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]], wrap: Sequence[str] = (),
                 width: int = TABLE_WIDTH) -> str:
    """Left-aligned columns separated by two spaces, with a rule under the header.

    Columns named in ``wrap`` (long command lines, findings) are wrapped onto continuation lines so that a row
    stays about ``width`` wide; a cell with a newline always spans lines. Cells are never truncated: a command
    line or a finding is the fact that identifies a target.
    """
    text_rows = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, *(len(line) for line in c.split("\n"))) for w, c in zip(widths, row, strict=True)]
    wrapped = [i for i, h in enumerate(headers) if h in wrap]
    if wrapped:
        _fit(widths, wrapped, text_rows, width - sum(w for i, w in enumerate(widths) if i not in wrapped)
             - 2 * (len(widths) - 1), [len(h) for h in headers])
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in text_rows:
        cells = [_wrapped(c, widths[i]) if i in wrapped else c.split("\n") for i, c in enumerate(row)]
        for k in range(max(len(c) for c in cells)):
            parts = [(c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)]
            lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def render_model(model: BaseModel) -> str:
    """Generic view: scalars as ``key: value``, lists of models as tables, nested models indented."""
    scalars: list[str] = []
    blocks: list[str] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            headers = list(type(value[0]).model_fields)
            rows = [[getattr(v, h) for h in headers] for v in value]
            blocks.append(f"{name}:\n{format_table(headers, rows)}")
        elif isinstance(value, BaseModel):
            inner = render_model(value).replace("\n", "\n  ")
            blocks.append(f"{name}:\n  {inner}")
        else:
            scalars.append(f"{name}: {_cell(value)}")
    return "\n\n".join(part for part in ["\n".join(scalars), *blocks] if part)
