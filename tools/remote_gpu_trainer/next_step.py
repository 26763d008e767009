"""The next step a diagnosis offers: an entry's tool call, with the arguments the log supports.

A catalog entry's **Tool:** field holds example calls written for the entry, e.g. OOM-01's
``fsdp_memory_estimate(model="llama-3-8b", world_size=8, ...)``. Printed as-is after a diagnosis,
such a call reads as advice about the user's run, which it is not: the model, world size and port
in it are the author's example. So the call offered after a diagnosis is rebuilt:

- ``diagnose_error`` is never offered: it is the tool that was just run;
- arguments that describe the user's run (:data:`FROM_LOG`: model, world size, port, GPU count,
  script) take the value the log names; when the log names none they become ``...`` and are listed
  in ``needs``, so the caller knows what to supply (an optional one is dropped: the tool's default
  beats a stranger's number);
- arguments that state the condition the entry is about (``case="fp16_unscale"``,
  ``precision="fp16"``, ``strategy="full_shard"``) are kept, because that is the check.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

PLACEHOLDER = "..."

FROM_LOG: dict[str, dict[str, tuple[str | None, bool]]] = {
    # tool -> argument -> (context field with the log's value or None when the log never says,
    #                      the caller must supply it when the log does not)
    "fsdp_memory_estimate": {"model": ("model", True), "world_size": ("world_size", True),
                             "gpu_memory_gib": ("gpu_memory_gib", False), "seq_len": (None, False),
                             "micro_batch_size": (None, False)},
    "gpu_health": {"expect_gpus": ("gpus_per_node", False)},
    "port_status": {"port": ("port", True)},
    "kill_port_holders": {"ports": ("ports", True)},
    "render_launch": {"nproc_per_node": ("gpus_per_node", True), "script": (None, True)},
}
ADDED_WHEN_KNOWN = {"fsdp_memory_estimate": ("world_size", "gpu_memory_gib")}
"""Arguments worth adding from the log even when the entry's example leaves them out."""


@dataclass(frozen=True)
class NextStep:
    call: str | None
    """The call to make next, or None when the entry names no check besides diagnose_error."""
    needs: tuple[str, ...] = ()
    """Arguments left as ``...`` because the log does not name them: the caller must supply these."""


def _split_call(span: str) -> tuple[str, list[tuple[str, str]]] | None:
    """``name(a=1, b="x")`` → ("name", [("a", "1"), ("b", '"x"')]) with each value's source text."""
    try:
        node = ast.parse(span, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Name):
        return node.id, []
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    if any(kw.arg is None for kw in node.keywords):
        return None
    return node.func.id, [(kw.arg, ast.get_source_segment(span, kw.value) or PLACEHOLDER)
                          for kw in node.keywords if kw.arg]


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def next_step(tool_calls: tuple[str, ...] | list[str], known: dict[str, Any], just_ran: str) -> NextStep:
    """The first of an entry's ``tool_calls`` that is not ``just_ran``, with arguments from ``known``
    (context values read from the log, by field name; None or [] means the log did not say)."""
    for span in tool_calls:
        if span.startswith("scripts/") or " scripts/" in span:
            return NextStep(span)
        parsed = _split_call(span)
        if parsed is None:
            continue
        name, arguments = parsed
        if name == just_ran:
            continue
        from_log = FROM_LOG.get(name, {})
        out: list[str] = []
        needs: list[str] = []
        given = {arg for arg, _ in arguments}
        extra = [(arg, PLACEHOLDER) for arg in ADDED_WHEN_KNOWN.get(name, ()) if arg not in given]
        for arg, text in arguments + extra:
            source = from_log.get(arg)
            value = known.get(source[0]) if source and source[0] else None
            if source is None and text != PLACEHOLDER:
                out.append(f"{arg}={text}")  # the condition this entry is about
            elif value not in (None, []):
                out.append(f"{arg}={_literal(value)}")
            elif (source and source[1]) or (source is None and text == PLACEHOLDER):
                out.append(f"{arg}={PLACEHOLDER}")
                needs.append(arg)
            # else: an optional example value the log does not support: the tool's default applies
        return NextStep(f"{name}({', '.join(out)})", tuple(needs))
    return NextStep(None)
