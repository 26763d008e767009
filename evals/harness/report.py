"""Score mode's results: per-answer records, the summary, baseline deltas, and three renderings.

- JSON (``--json``): ``{meta, summary, cases}``; ``cases`` holds one object per answer in input
  order. Point records use the field names of Anthropic's skill-creator grader (``text``,
  ``passed``, ``evidence``), so its viewer can load them with a thin adapter.
- Markdown (``--md``): what a person reads in a PR or ``$GITHUB_STEP_SUMMARY``.
- JUnit XML (``--junit``): one ``<testcase>`` per answer for CI test tabs; a missing answer is an
  ``<error>``, a failed rubric a ``<failure>``.
"""

from __future__ import annotations

import hashlib
import math
import platform
import statistics
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import HARNESS_VERSION
from .schema import Answer, Case
from .scoring import CaseResult, SemanticScorer, score_answer


@dataclass
class Scored:
    answer: Answer
    case: Case
    result: CaseResult | None
    """None when the agent produced no answer (``answer.error``)."""

    @property
    def status(self) -> str:
        if self.result is None:
            return "error"
        return "pass" if self.result.passed else "fail"

    def label(self) -> str:
        run = f" run {self.answer.run}" if self.answer.run is not None else ""
        config = f" [{self.answer.config}]" if self.answer.config else ""
        return f"{self.case.id}{config}{run}"

    def line(self) -> str:
        """The stdout line: ``[PASS] id 0.83`` / ``[FAIL] id 0.42: reasons`` / ``[ERROR] id: why``."""
        if self.result is None:
            return f"[ERROR] {self.label()}: {self.answer.error}"
        if self.result.passed:
            return f"[PASS] {self.label()} {self.result.score:.2f}"
        return f"[FAIL] {self.label()} {self.result.score:.2f}: " + "; ".join(self.result.reasons())

    def as_dict(self) -> dict[str, Any]:
        a, r = self.answer, self.result
        record: dict[str, Any] = {
            "id": a.id, "line": a.line, "config": a.config, "run": a.run, "tags": self.case.tags,
            "status": self.status, "error": a.error,
            "score": r.score if r else None, "raw": r.raw if r else None, "passed": r.passed if r else False,
            "threshold": self.case.pass_threshold,
            "critical_missed": r.critical_missed if r else [], "gate": r.gate if r else False,
            "expectations": [p.as_dict() for p in r.points] if r else [],
            "violations": [v.as_dict() for v in r.violations] if r else [],
            "skipped_forbids": r.skipped_forbids if r else [],
        }
        if a.label is not None:
            record["label"] = a.label
            record["label_agrees"] = (self.status == "pass") == (a.label == "pass") if r else False
        if a.meta:
            record["meta"] = a.meta
        return record


def score_all(cases: dict[str, Case], answers: list[Answer], semantic: SemanticScorer | None = None) -> list[Scored]:
    return [Scored(a, cases[a.id], None if a.error is not None and not a.answer.strip()
                   else score_answer(cases[a.id], a.answer, semantic)) for a in answers]


def wilson(passed: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """95% Wilson score interval for a pass rate (sane at 0/n and n/n, unlike the normal one)."""
    if n == 0:
        return None
    p = passed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


def summarise(scored: list[Scored], cases: dict[str, Case]) -> dict[str, Any]:
    done = [s for s in scored if s.result is not None]
    passed = sum(s.result.passed for s in done if s.result)
    by_tag: dict[str, list[Scored]] = defaultdict(list)
    by_case: dict[str, list[Scored]] = defaultdict(list)
    for s in done:
        by_case[s.case.id].append(s)
        for tag in s.case.tags:
            by_tag[tag].append(s)
    answered = {s.case.id for s in scored}
    summary: dict[str, Any] = {
        "answers": len(scored), "scored": len(done), "passed": passed, "failed": len(done) - passed,
        "errors": len(scored) - len(done),
        "pass_rate": _rate(passed, len(done)), "pass_rate_ci95": wilson(passed, len(done)),
        "mean_score": _mean([s.result.score for s in done if s.result]),
        "cases_answered": len(answered), "unanswered": [c for c in cases if c not in answered],
        "per_tag": {tag: _group(items) for tag, items in sorted(by_tag.items())},
        "per_case": {cid: _case_stats(items) for cid, items in by_case.items()},
    }
    labelled = [s for s in scored if s.answer.label is not None]
    if labelled:
        disagree = [f"{s.case.id} (line {s.answer.line}): labelled {s.answer.label}, scored {s.status}"
                    for s in labelled if (s.status == "pass") != (s.answer.label == "pass")]
        summary["labels"] = {"labelled": len(labelled), "agree": len(labelled) - len(disagree), "disagree": disagree}
    return summary


def _rate(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def _group(items: list[Scored]) -> dict[str, Any]:
    passed = sum(bool(s.result and s.result.passed) for s in items)
    return {"answers": len(items), "passed": passed, "pass_rate": _rate(passed, len(items)),
            "mean_score": _mean([s.result.score for s in items if s.result])}


def _case_stats(items: list[Scored]) -> dict[str, Any]:
    """Per case: runs, pass rate (= pass@1), whether every run passed (pass^k), score spread, and
    each point's hit rate and each forbid's violation count across runs."""
    stats = _group(items)
    scores = [s.result.score for s in items if s.result]
    stats["score_sd"] = round(statistics.stdev(scores), 4) if len(scores) > 1 else 0.0
    stats["all_runs_passed"] = stats["passed"] == len(items)
    points: dict[str, list[bool]] = defaultdict(list)
    violations: dict[str, int] = defaultdict(int)
    for s in items:
        assert s.result is not None
        for p in s.result.points:
            points[p.id].append(p.passed)
        for v in s.result.violations:
            violations[v.id] += 1
    stats["points"] = {pid: _rate(sum(hits), len(hits)) for pid, hits in points.items()}
    stats["violations"] = dict(violations)
    return stats


def compare(with_summary: dict[str, Any], without_summary: dict[str, Any]) -> dict[str, Any]:
    """Per-case deltas, with-skill minus without-skill (SkillsBench-style paired comparison), and
    the points that do not discriminate (hit ≥ 90% of the time either way: they test general
    knowledge, not the skill)."""
    rows = []
    flat: list[str] = []
    with_cases, without_cases = with_summary["per_case"], without_summary["per_case"]
    for cid in sorted(set(with_cases) | set(without_cases)):
        w, wo = with_cases.get(cid), without_cases.get(cid)
        rows.append({
            "id": cid,
            "with_score": w and w["mean_score"], "without_score": wo and wo["mean_score"],
            "delta": round(w["mean_score"] - wo["mean_score"], 4) if w and wo else None,
            "with_pass_rate": w and w["pass_rate"], "without_pass_rate": wo and wo["pass_rate"],
        })
        if w and wo:
            for pid, rate in w["points"].items():
                other = wo["points"].get(pid)
                if rate is not None and other is not None and rate >= 0.9 and other >= 0.9:
                    flat.append(f"{cid}/{pid}")

    def diff(key: str) -> float | None:
        a, b = with_summary.get(key), without_summary.get(key)
        return round(a - b, 4) if a is not None and b is not None else None

    return {"pass_rate": diff("pass_rate"), "mean_score": diff("mean_score"), "cases": rows,
            "worse_with_skill": [r["id"] for r in rows if r["delta"] is not None and r["delta"] < 0],
            "non_discriminating_points": flat}


def sha256(path: Path | None) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path and path.is_file() else None


def build_report(scored: list[Scored], cases: dict[str, Case], *, cases_path: Path, answers_path: Path,
                 baseline: list[Scored] | None = None, baseline_path: Path | None = None,
                 semantic: dict[str, Any] | None = None) -> dict[str, Any]:
    summary = summarise(scored, cases)
    if baseline is not None:
        summary["baseline"] = summarise(baseline, cases)
        summary["delta"] = compare(summary, summary["baseline"])
    meta = {
        "harness_version": HARNESS_VERSION, "cases_file": str(cases_path), "cases_sha256": sha256(cases_path),
        "answers_file": str(answers_path), "answers_sha256": sha256(answers_path),
        "baseline_file": str(baseline_path) if baseline_path else None, "semantic": semantic,
        "python": platform.python_version(), "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    report: dict[str, Any] = {"meta": meta, "summary": summary, "cases": [s.as_dict() for s in scored]}
    if baseline is not None:
        report["baseline_cases"] = [s.as_dict() for s in baseline]
    return report


# --- renderings ----------------------------------------------------------------------------------

def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: dict[str, Any]) -> str:
    s, meta = report["summary"], report["meta"]
    ci = s["pass_rate_ci95"]
    out = [
        "# Eval results", "",
        f"Answers `{meta['answers_file']}` scored against `{meta['cases_file']}` "
        f"(harness {meta['harness_version']}, {meta['timestamp']}).", "",
        "| answers | passed | failed | errors | pass rate (95% CI) | mean score |",
        "|---|---|---|---|---|---|",
        f"| {s['answers']} | {s['passed']} | {s['failed']} | {s['errors']} | {_pct(s['pass_rate'])}"
        + (f" ({_pct(ci[0])}–{_pct(ci[1])})" if ci else "") + f" | {_fmt(s['mean_score'])} |", "",
        "## Answers", "",
        "| case | run | score | result | missed points | violations |",
        "|---|---|---|---|---|---|",
    ]
    for c in report["cases"]:
        missed = ", ".join(("**" + p["id"] + "**") if p["critical"] else p["id"]
                           for p in c["expectations"] if not p["passed"])
        violations = ", ".join(v["id"] + (" (gate)" if v["gate"] else "") for v in c["violations"])
        run = "" if c["run"] is None else str(c["run"])
        result = "error: " + _cell(c["error"] or "") if c["status"] == "error" else c["status"]
        out.append(f"| {c['id']} | {run} | {_fmt(c['score'])} | {result} | {missed} | {violations} |")
    weak = [(cid, pid, rate) for cid, st in s["per_case"].items() for pid, rate in st["points"].items()
            if rate is not None and rate < 1]
    if weak:
        out += ["", "## Points not always hit", "", "| case | point | hit rate |", "|---|---|---|"]
        out += [f"| {cid} | {pid} | {_pct(rate)} |" for cid, pid, rate in weak]
    if s["per_tag"]:
        out += ["", "## By tag", "", "| tag | answers | pass rate | mean score |", "|---|---|---|---|"]
        out += [f"| {t} | {g['answers']} | {_pct(g['pass_rate'])} | {_fmt(g['mean_score'])} |"
                for t, g in s["per_tag"].items()]
    if "delta" in s:
        d, b = s["delta"], s["baseline"]
        out += ["", "## With vs without the skill", "",
                f"Pass rate {_pct(s['pass_rate'])} vs {_pct(b['pass_rate'])} (Δ {_signed(d['pass_rate'])}); "
                f"mean score {_fmt(s['mean_score'])} vs {_fmt(b['mean_score'])} (Δ {_signed(d['mean_score'])}).", "",
                "| case | with | without | Δ |", "|---|---|---|---|"]
        out += [f"| {r['id']} | {_fmt(r['with_score'])} | {_fmt(r['without_score'])} | {_signed(r['delta'])} |"
                for r in d["cases"]]
        if d["non_discriminating_points"]:
            out += ["", "Points hit ≥ 90% with and without the skill (they test general knowledge): "
                    + ", ".join(f"`{p}`" for p in d["non_discriminating_points"])]
    if s["unanswered"]:
        out += ["", "Cases with no answer: " + ", ".join(s["unanswered"])]
    return "\n".join(out) + "\n"


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def render_junit(report: dict[str, Any], suite: str = "skill-evals") -> str:
    records = report["cases"]
    root = ET.Element("testsuites")
    s = report["summary"]
    el = ET.SubElement(root, "testsuite", name=suite, tests=str(len(records)), failures=str(s["failed"]),
                       errors=str(s["errors"]), skipped="0")
    for c in records:
        name = c["id"] + ("" if c["run"] is None else f"#{c['run']}") + (f"[{c['config']}]" if c["config"] else "")
        tc = ET.SubElement(el, "testcase", classname="evals." + (c["tags"][0] if c["tags"] else "case"), name=name)
        if c["status"] == "error":
            ET.SubElement(tc, "error", type="NoAnswer", message=c["error"] or "no answer")
            continue
        evidence = [f"{p['id']}: {'hit' if p['passed'] else 'missed'}"
                    + (f" ({p['how']}) {p['evidence']}" if p["evidence"] else "") for p in c["expectations"]]
        evidence += [f"violation {v['id']}: {v['evidence']}" for v in c["violations"]]
        if not c["passed"]:
            reasons = [f"score {c['score']:.2f} (threshold {c['threshold']:.2f})"]
            if c["critical_missed"]:
                reasons.append("missed critical: " + ", ".join(c["critical_missed"]))
            if c["violations"]:
                reasons.append("violations: " + ", ".join(v["id"] for v in c["violations"]))
            ET.SubElement(tc, "failure", type="RubricFailure", message="; ".join(reasons))
        ET.SubElement(tc, "system-out").text = "\n".join(evidence)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
