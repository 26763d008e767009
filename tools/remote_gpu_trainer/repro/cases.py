"""The list of cases, in display order, and lookups by name. Importing it loads no torch."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from .base import Case, Variant

CASE_NAMES = (
    "fp16_unscale",
    "no_inf_checks",
    "bf16_adam_dtype",
    "bf16_scaler",
    "double_unscale",
    "fp16_overflow",
    "fsdp_ddp_double_wrap",
)


def case_module(name: str) -> ModuleType:
    """The module holding ``CASE``, ``bug`` and ``fix`` for ``name`` (a KeyError for unknown names)."""
    if name not in CASE_NAMES:
        raise KeyError(name)
    return import_module(f"{__package__}.{name}")


def case(name: str) -> Case:
    return case_module(name).CASE


def all_cases() -> list[Case]:
    return [case(name) for name in CASE_NAMES]


def variant_names() -> tuple[str, ...]:
    """Every variant name; unique across cases, so a variant alone says which case it belongs to."""
    return tuple(v.name for c in all_cases() for v in c.variants)


def find_variant(name: str) -> tuple[Case, Variant]:
    for c in all_cases():
        for v in c.variants:
            if v.name == name:
                return c, v
    raise KeyError(name)
