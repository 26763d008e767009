"""Scoring one answer against one case: rubric points, forbid rules, the case score.

Deterministic by construction: the same answer and case always give the same score, so a change
in score means the answer or the rubric changed. The optional semantic fallback (``--semantic``)
is passed in as an object and can only add half credit to points the regexes missed.

Rules (``evals/README.md`` explains them with examples):

- A point passes when **any one** of its matchers passes. ``any``: one regex has an asserted
  (non-negated) match. ``all``: every regex has one. ``near``: for one ``[a, b, max_chars]``, an
  asserted match of ``a`` and one of ``b`` lie within ``max_chars`` characters of each other (the
  gap between them, either order). ``deny``: some regex occurs, and every occurrence of every deny
  regex is negated ("never run ``pkill -u``"). ``cite``: the answer names the entry ID (``AMP-03``,
  also inside a link such as ``precision-stability.md#amp-03``) in an asserted clause.
- A forbid rule is violated when one of its regexes has an asserted match; with
  ``only_if_missing`` only when every named point was missed.
- Score = Σ weight·credit / Σ weight − Σ penalties, clamped to [0, 1]; credit is 1, 0.5 (semantic)
  or 0. Pass = score ≥ threshold, no gate violated, no critical point missed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

from .schema import Case, Forbid, Point
from .text import Doc, Hit, compile_regex

EPSILON = 1e-9
#: A citation counts unless the ID itself is what is negated ("not AMP-03", "rather than DIST-02"):
#: the usual clause rule would drop "(DIST-25)" after "the loss never changes".
_DENIED_CITE = re.compile(r"\b(?:not|isn'?t|rather than|instead of|unlike)\s+(?:\S+\s+){0,2}\W*$", re.IGNORECASE)


class SemanticScorer(Protocol):
    def best(self, gloss: str, doc: Doc) -> tuple[float, str]:
        """Highest cosine between ``gloss`` and a sentence of the answer, and that sentence."""


@dataclass
class PointResult:
    id: str
    text: str
    weight: float
    critical: bool
    passed: bool
    credit: float
    how: str | None = None
    evidence: str | None = None
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "weight": self.weight, "critical": self.critical,
                "passed": self.passed, "score": self.credit, "how": self.how, "evidence": self.evidence,
                "note": self.note}


@dataclass
class Violation:
    id: str
    text: str
    evidence: str
    penalty: float
    gate: bool

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "evidence": self.evidence, "penalty": self.penalty,
                "gate": self.gate}


@dataclass
class CaseResult:
    case_id: str
    score: float
    raw: float
    passed: bool
    threshold: float
    points: list[PointResult]
    violations: list[Violation]
    critical_missed: list[str] = field(default_factory=list)
    gate: bool = False
    skipped_forbids: list[str] = field(default_factory=list)

    def reasons(self) -> list[str]:
        """Why it failed, shortest first: what a ``[FAIL]`` line and a JUnit message say."""
        out = []
        if self.score + EPSILON < self.threshold:
            out.append(f"score {self.score:.2f} < {self.threshold:.2f}")
        if self.critical_missed:
            out.append("missed critical " + ", ".join(self.critical_missed))
        gates = [v.id for v in self.violations if v.gate]
        if gates:
            out.append("gate " + ", ".join(gates))
        missed = [p.id for p in self.points if not p.passed and p.id not in self.critical_missed]
        if missed:
            out.append("missed " + ", ".join(missed))
        penalties = [v.id for v in self.violations if not v.gate]
        if penalties:
            out.append("violation " + ", ".join(penalties))
        return out


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    return compile_regex(pattern)


def cite_regex(entry_id: str) -> str:
    """What counts as citing ``entry_id``: the ID as a token, any case (``AMP-03``, ``#amp-03``)."""
    return rf"(?<![A-Za-z0-9]){re.escape(entry_id)}(?!\d)"


def _asserted(doc: Doc, pattern: str) -> list[Hit]:
    return [h for h in doc.find(_regex(pattern)) if not h.negated]


def match_point(point: Point, doc: Doc) -> PointResult:
    """Try the point's matchers in a fixed order and keep the first that passes, with evidence."""
    result = PointResult(point.id, point.text, point.weight, point.critical, False, 0.0)
    notes: list[str] = []
    for pattern in point.any:
        hits = _asserted(doc, pattern)
        if hits:
            return _passed(result, "any", hits[0].snippet)
        negated = doc.find(_regex(pattern))
        if negated:
            notes.append(f"only negated: {negated[0].snippet}")
    if point.all:
        found = [_asserted(doc, p) for p in point.all]
        if all(found):
            return _passed(result, "all", " … ".join(h[0].snippet for h in found))
        notes.append("all: missing " + ", ".join(p for p, h in zip(point.all, found, strict=True) if not h))
    for near in point.near:
        pair = near_pair(_asserted(doc, near.a), _asserted(doc, near.b), near.max_chars)
        if pair:
            return _passed(result, "near", doc.snippet(min(pair[0].start, pair[1].start),
                                                        max(pair[0].end, pair[1].end), 20))
    if point.deny:
        verdict, evidence = _deny(point.deny, doc)
        if verdict:
            return _passed(result, "deny", evidence)
        if evidence:
            notes.append(evidence)
    for cite in point.cite:
        hits = [h for h in doc.find(_regex(cite_regex(cite.id))) if not _DENIED_CITE.search(doc.text, 0, h.start)]
        if hits:
            return _passed(result, "cite", hits[0].snippet)
    result.note = "; ".join(notes) or None
    return result


def _passed(result: PointResult, how: str, evidence: str) -> PointResult:
    result.passed, result.credit, result.how, result.evidence = True, 1.0, how, evidence
    return result


def near_pair(a_hits: list[Hit], b_hits: list[Hit], max_chars: int) -> tuple[Hit, Hit] | None:
    for a in a_hits:
        for b in b_hits:
            gap = max(a.start, b.start) - min(a.end, b.end)
            if gap <= max_chars:
                return a, b
    return None


def _deny(patterns: list[str], doc: Doc) -> tuple[bool, str | None]:
    """Passes when the answer warns against the thing and never recommends it."""
    negated: list[Hit] = []
    for pattern in patterns:
        for hit in doc.find(_regex(pattern)):
            if not hit.negated:
                return False, f"asserted, not warned against: {hit.snippet}"
            negated.append(hit)
    if negated:
        return True, negated[0].snippet
    return False, None


def check_forbid(rule: Forbid, doc: Doc) -> Hit | None:
    for pattern in rule.any:
        hits = _asserted(doc, pattern)
        if hits:
            return hits[0]
    return None


def score_answer(case: Case, answer: str, semantic: SemanticScorer | None = None) -> CaseResult:
    """Score ``answer`` against ``case``. ``semantic`` adds at most half credit to missed points
    that allow it; it never touches critical, ``deny`` or ``cite``-only points or forbid rules."""
    doc = Doc(answer)
    points = [match_point(p, doc) for p in case.rubric]
    if semantic is not None:
        for point, result in zip(case.rubric, points, strict=True):
            if not result.passed and _semantic_allowed(point):
                cos, sentence = semantic.best(point.gloss or point.text, doc)
                if cos >= point.sem_threshold:
                    result.credit, result.how = 0.5, "semantic"
                    result.evidence = f"cos={cos:.3f} \"{sentence}\""
    missed = {r.id for r in points if not r.passed}
    violations: list[Violation] = []
    skipped: list[str] = []
    for rule in case.forbid:
        hit = check_forbid(rule, doc)
        if hit is None:
            continue
        if rule.only_if_missing and not set(rule.only_if_missing) <= missed:
            skipped.append(rule.id)
            continue
        violations.append(Violation(rule.id, rule.text, hit.snippet, rule.penalty, rule.gate))
    total = sum(p.weight for p in case.rubric) or 1.0
    raw = sum(r.weight * r.credit for r in points) / total
    score = round(min(1.0, max(0.0, raw - sum(v.penalty for v in violations))), 4)
    critical_missed = [r.id for r in points if r.critical and not r.passed]
    gate = any(v.gate for v in violations)
    passed = score + EPSILON >= case.pass_threshold and not critical_missed and not gate
    return CaseResult(case.id, score, round(raw, 4), passed, case.pass_threshold, points, violations,
                      critical_missed, gate, skipped)


def _semantic_allowed(point: Point) -> bool:
    has_positive = bool(point.any or point.all or point.near)
    return point.semantic and not point.critical and has_positive
