"""Input errors that name the field and the allowed values, for both MCP and CLI callers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time only the callers hold a ValidationError: the torch-side modules that raise
    from pydantic import ValidationError  # InputError run where pydantic may be missing (trainenv/child.py)


class InputError(ValueError):
    """Bad input that the caller can fix. Never a traceback: server and CLI print ``str(err)``."""

    def __init__(self, field: str, message: str, allowed: Iterable[object] | None = None):
        self.field = field
        self.message = message
        self.allowed = [str(a) for a in allowed] if allowed is not None else None
        text = f"{field}: {message}"
        if self.allowed:
            text += f" (allowed: {', '.join(self.allowed)})"
        super().__init__(text)

    @classmethod
    def from_validation(cls, err: ValidationError) -> InputError:
        """One line per failing field, e.g. ``world_size: Input should be greater than 0``."""
        first = err.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or "input"
        made = cls(field, "")
        made.message = describe_validation_error(err)
        made.args = (made.message,)
        return made


def describe_validation_error(err: ValidationError) -> str:
    """Turn pydantic's multi-line report into one line per field, without URLs or input echoes."""
    lines = []
    for item in err.errors(include_url=False):
        field = ".".join(str(p) for p in item["loc"]) or "input"
        lines.append(f"{field}: {item['msg']}")
    return "; ".join(lines)
