"""Plain-text tables for the CLI. Results carry bytes as integers; people read GiB."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum

from pydantic import BaseModel

GIB = 1024**3


def gib(n: int | float | None, digits: int = 2) -> str:
    return "-" if n is None else f"{n / GIB:.{digits}f} GiB"


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


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, with a rule under the header."""
    text_rows = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in text_rows]
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
