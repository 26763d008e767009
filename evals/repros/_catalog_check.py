"""Shared by the repro scripts: hold the text a reproduction printed against its catalog entry.

A reproduction is only useful if the entry's **Signature:** regexes still fire on what the installed
torch prints. :func:`check` loads the entry with the package's own parser
(``remote_gpu_trainer.catalog``), runs every signature over the captured text and prints one line:
the entry id, which signature matched (or ``NO MATCH``), and the first line of the text. Scripts end
with :func:`summary`, whose exit status is 1 when any case did not match, so a stale entry shows up
as a failing script rather than as a line nobody reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT / "tools"))

from remote_gpu_trainer.catalog import entry  # noqa: E402

_results: list[tuple[str, bool]] = []


def first_line(text: str, needle: str = "") -> str:
    """The first line containing ``needle`` (the first non-empty line without one)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if needle in ln:
            return ln
    return lines[0] if lines else ""


def check(entry_id: str, case: str, text: str, show: str = "") -> bool:
    """Print ``ID case: sig #k | <line>`` and record whether a signature of the entry matched.

    ``show`` picks the line to print (the first line containing it); the whole text is matched.
    An entry without signatures is checked by the caller and passed here as ``text`` non-empty.
    """
    e = entry(entry_id)
    hits = [i for i, s in enumerate(e.signatures, 1) if s.regex.search(text)]
    ok = bool(hits) or (not e.signatures and bool(text))
    label = f"sig #{hits[0]}" if hits else ("no signature" if not e.signatures else "NO MATCH")
    print(f"{entry_id:8} {case:28} {label:9} | {first_line(text, show)[:200]}", flush=True)
    _results.append((f"{entry_id} {case}", ok))
    return ok


def note(case: str, text: str) -> None:
    """Print a line that is context, not a check (the fix working, a variant the entry mentions)."""
    print(f"{'':8} {case:28} {'':9} | {first_line(text)[:200]}", flush=True)


def exception_text(exc: BaseException) -> str:
    """The exception lines of the traceback as Python prints them (``module.Type: message``), with
    the exception it was raised from first, as in a log: a DataLoader's "exited unexpectedly" is
    raised ``from`` the "killed by signal" error, and a user sees both."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    line = f"{name}: {exc}"
    inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return f"{exception_text(inner)}\n{line}" if inner is not None else line


def raised(call) -> str:
    """What ``call()`` raised, as :func:`exception_text` writes it, or ``(no exception)``."""
    try:
        call()
    except Exception as exc:  # the text is what the case is about
        return exception_text(exc)
    return "(no exception)"


def summary() -> int:
    bad = [name for name, ok in _results if not ok]
    print(f"{len(_results) - len(bad)} matched, {len(bad)} did not" + (f": {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0
