"""``run_evals.py verify``: the catalog's Verify steps run and can fail; its figures come from the tools.

Three checks over the parsed catalog (``remote_gpu_trainer.catalog``, the only reader of the markdown):

* **scenarios** — every entry whose **Verify on:** is ``cpu`` has a scenario (``evals/verify/<ID>.py``)
  that builds the failure and the fix; the entry's own Verify code must report them differently
  (:mod:`.scenarios`). Scenario files no entry names fail too.
* **numbers** — every **Numbers:** bullet is a tool call with literal arguments and the figures the
  entry states for it (``total_bytes ≈ 41.8 GiB``, ``fits = false``); the call runs through the tool's
  ToolSpec (the same validation as MCP and the CLI) and each figure must hold for its structured
  result. A figure with a unit must also appear in the entry's text, so prose and claim cannot drift.
* **needs** — what the other entries' Verify needs (GPU, several nodes, a provider, the network, …),
  listed by kind; an entry that does not say fails the check (listed as unclassified).
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .scenarios import REPO_ROOT, SCENARIO_DIR, Outcome, run_scenarios


@dataclass(frozen=True)
class Line:
    ok: bool
    text: str

    def __str__(self) -> str:
        return f"[{'PASS' if self.ok else 'FAIL'}] {self.text}"


def _catalog() -> Any:
    if str(REPO_ROOT / "tools") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "tools"))
    from remote_gpu_trainer import catalog

    return catalog


def load_entries(root: Path, only: Iterable[str] = ()) -> list[Any]:
    catalog = _catalog()
    entries = list(catalog.load_catalog(root).entries)
    wanted = set(only)
    if wanted:
        unknown = wanted - {e.id for e in entries}
        if unknown:
            raise ValueError(f"unknown entry id(s): {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e.id in wanted]
    return entries


# ------------------------------------------------------------------------------------------------
# numbers


def _lookup(data: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(data, list) and part.isdigit():
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            raise KeyError(path)
    return data


def _stated(entry: Any, claim: Any) -> bool:
    """Whether the figure of ``claim`` (``41.8 GiB``) appears in the entry's text outside **Numbers:**."""
    if not claim.unit or not isinstance(claim.value, float):
        return True
    catalog = _catalog()
    shown = claim.text.split(claim.op, 1)[1].split("\u00b1")[0].strip()  # "41.8 GiB" as written
    number, _, unit = shown.partition(" ")
    text = catalog.plain_text("\n".join([entry.symptom, entry.root_cause, entry.fix, entry.verify]))
    return re.search(rf"(?<![\d.]){re.escape(number)}\s?{re.escape(unit or claim.unit)}\b", text) is not None


def check_numbers(entries: Iterable[Any]) -> list[Line]:
    """One line per claim: the tool's value against the figure the entry states."""
    catalog = _catalog()
    tools = catalog.registered_tools()
    lines: list[Line] = []
    for entry in entries:
        for index, numbers in enumerate(entry.numbers, 1):
            head = f"{entry.id} numbers #{index} {numbers.tool}"
            spec = tools.get(numbers.tool)
            if spec is None:
                lines.append(Line(False, f"{head}: no such tool"))
                continue
            try:
                result = spec.call(dict(numbers.arguments)).model_dump(mode="json")
            except Exception as exc:  # an invalid call is a failing claim, reported with the tool's words
                lines.append(Line(False, f"{head}: the call fails: {exc}"))
                continue
            for claim in numbers.claims:
                try:
                    actual = _lookup(result, claim.path)
                except (KeyError, IndexError):
                    lines.append(Line(False, f"{head}: {claim.path} is not in the result"))
                    continue
                ok, stated = claim.holds(actual), _stated(entry, claim)
                why = "" if stated else "; the entry's text does not state this figure"
                lines.append(Line(ok and stated, f"{head}: `{claim.text}`, tool: {claim.show(actual)}{why}"))
    return lines


# ------------------------------------------------------------------------------------------------
# needs (classification) and orphans


def needs(entries: Iterable[Any]) -> dict[str, list[str]]:
    """Entry ids by what their Verify needs (``unclassified`` when the entry does not say)."""
    by_kind: dict[str, list[str]] = defaultdict(list)
    for e in entries:
        by_kind[e.verify_on or "unclassified"].append(e.id)
    return dict(by_kind)


def unclassified(entries: Iterable[Any]) -> list[Line]:
    """A FAIL line per entry without **Verify on:**: every Verify is either run here or listed by what it needs."""
    kinds = ", ".join(_catalog().VERIFY_ON)
    return [Line(False, f"{e.id}: no **Verify on:** (the first word is one of {kinds})") for e in entries
            if not e.verify_on]


def orphan_scenarios(all_entries: Iterable[Any]) -> list[Line]:
    named = {e.verify_scenario for e in all_entries if e.verify_scenario}
    lines = []
    for path in sorted(SCENARIO_DIR.glob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if not path.name.startswith("_") and rel not in named:
            lines.append(Line(False, f"{rel}: no entry's **Verify on:** names this scenario"))
    return lines


@dataclass
class Report:
    scenarios: list[Outcome]
    numbers: list[Line]
    orphans: list[Line]
    needs: dict[str, list[str]]
    unclassified: list[Line]

    @property
    def lines(self) -> list[Line]:
        return [Line(o.ok, o.line()[7:]) for o in self.scenarios] + self.numbers + self.orphans + self.unclassified

    @property
    def passed(self) -> int:
        return sum(1 for ln in self.lines if ln.ok)

    @property
    def failed(self) -> int:
        return sum(1 for ln in self.lines if not ln.ok)

    def counts(self) -> dict[str, int]:
        """The figures evals/README.md reports."""
        ok = [o for o in self.scenarios if o.ok]
        return {
            "entries with an executable Verify": len(self.scenarios),
            "scenarios that pass": len(ok),
            "Verify steps that report the failure before the fix": sum(1 for o in self.scenarios if o.reports_failure),
            "fixes applied from the entry's own text": sum(1 for o in ok if o.fix_from_entry),
            "numbers recomputed": len(self.numbers),
            "numbers that hold": sum(1 for ln in self.numbers if ln.ok),
        }


def run_verify(root: Path, only: Iterable[str] = (), jobs: int = 2, scenarios: bool = True,
               progress: Any = None) -> Report:
    all_entries = load_entries(root)
    entries = load_entries(root, only)
    cpu = [e.id for e in entries if e.verify_on == "cpu"]
    outcomes = run_scenarios(root, cpu, jobs=jobs, progress=progress) if scenarios and cpu else []
    return Report(outcomes, check_numbers(entries), [] if only else orphan_scenarios(all_entries),
                  needs(entries), unclassified(entries))
