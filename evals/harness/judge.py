"""``judge`` mode: an LLM grades answers point by point, *beside* the deterministic score.

Why beside and not instead: judges are non-deterministic, cost money, and have lenient defaults
(promptfoo's ``llm-rubric`` passes when the judge omits ``pass``). Their value here is as a second
opinion that finds rubric gaps: where the judge says *pass* with a real quote and the regexes say
*miss*, the quote is a candidate synonym for the point (``suggestions`` in the report).

Guards:

- the judge must return JSON ``{"points": [{id, verdict, evidence}], "violations": [{id, evidence}]}``
  with verdicts ``pass``/``partial``/``fail``; anything else is recorded as a judge error;
- every ``pass``/``partial`` verdict and every violation must quote the answer **verbatim** (compared
  after the harness's normalisation: quotes, dashes, emphasis, runs of spaces). A quote that is not
  in the answer downgrades the verdict to ``unsupported`` (no credit) and drops the violation;
- a point the judge does not mention is a ``fail``; a critical point needs ``pass``;
- results are cached in a JSONL file keyed by the judge command, :data:`TEMPLATE_VERSION`, the case
  and the answer, so re-running only pays for new answers.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .agents import build_argv, extract_answer, invoke
from .schema import Answer, Case
from .scoring import EPSILON, score_answer
from .text import normalise

TEMPLATE_VERSION = "1"
VERDICTS = {"pass": 1.0, "partial": 0.5, "fail": 0.0}

PROMPT = """You are grading one answer that an AI assistant gave to a user. Grade only what the answer \
itself says; do not use your own knowledge to fill gaps.

[Task the assistant was given]
{prompt}

[Answer to grade]
<<<ANSWER
{answer}
ANSWER>>>

[Rubric points] A point is met only if the answer asserts or recommends it. Mentioning a thing in \
order to warn against it does not meet a point that needs it.
{points}

[Forbidden advice] A rule is violated only if the answer recommends or performs it. Quoting it in a \
warning ("never do X") is not a violation.
{forbids}

Reply with only this JSON object and nothing else:
{{"points": [{{"id": "<point id>", "verdict": "pass" | "partial" | "fail", "evidence": "<exact quote from \
the answer, empty for fail>"}}], "violations": [{{"id": "<rule id>", "evidence": "<exact quote from the answer>"}}]}}
Give one entry per rubric point. Every pass or partial verdict and every violation must quote the \
answer word for word."""


@dataclass
class Verdict:
    id: str
    verdict: str
    evidence: str
    verified: bool


@dataclass
class JudgeResult:
    points: list[Verdict] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    score: float | None = None
    passed: bool | None = None
    error: str | None = None


def build_prompt(case: Case, answer: str) -> str:
    points = "\n".join(f"- {p.id}{' (critical)' if p.critical else ''}: {p.text}" for p in case.rubric)
    forbids = "\n".join(f"- {f.id}: {f.text}" for f in case.forbid) or "- (none)"
    return PROMPT.format(prompt=case.prompt, answer=answer, points=points, forbids=forbids)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", normalise(text)).strip()


def parse_reply(text: str) -> dict[str, Any]:
    """The JSON object in the judge's reply (bare, or inside a ```json fence)."""
    candidates = [text.strip()]
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.S)
    if fenced:
        candidates.append(fenced.group(1))
    first, last = text.find("{"), text.rfind("}")
    if first != -1 and last > first:
        candidates.append(text[first:last + 1])
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    raise ValueError("the judge's reply holds no JSON object")


def grade(case: Case, answer: str, reply: dict[str, Any]) -> JudgeResult:
    """Check the judge's reply against the answer and the rubric, and score it like the regexes do."""
    result = JudgeResult()
    flat_answer = _flat(answer)
    known_points = {p.id for p in case.rubric}
    got: dict[str, Verdict] = {}
    for item in reply.get("points", []) if isinstance(reply.get("points"), list) else []:
        if not isinstance(item, dict) or item.get("id") not in known_points:
            result.problems.append(f"unknown or malformed point verdict: {str(item)[:80]}")
            continue
        verdict = item.get("verdict")
        evidence = item.get("evidence") if isinstance(item.get("evidence"), str) else ""
        if verdict not in VERDICTS:
            result.problems.append(f"point {item['id']}: verdict {verdict!r} is not pass/partial/fail")
            verdict = "fail"
        verified = bool(evidence.strip()) and _flat(evidence) in flat_answer
        if verdict != "fail" and not verified:
            result.problems.append(f"point {item['id']}: evidence is not a verbatim quote of the answer")
            verdict = "unsupported"
        got[item["id"]] = Verdict(item["id"], verdict, evidence, verified)
    for p in case.rubric:
        result.points.append(got.get(p.id, Verdict(p.id, "fail", "", False)))
    forbids = {f.id: f for f in case.forbid}
    for item in reply.get("violations", []) if isinstance(reply.get("violations"), list) else []:
        if not isinstance(item, dict) or item.get("id") not in forbids:
            result.problems.append(f"unknown or malformed violation: {str(item)[:80]}")
            continue
        evidence = item.get("evidence") if isinstance(item.get("evidence"), str) else ""
        if not evidence.strip() or _flat(evidence) not in flat_answer:
            result.problems.append(f"violation {item['id']}: evidence is not a verbatim quote; ignored")
            continue
        rule = forbids[item["id"]]
        result.violations.append({"id": rule.id, "evidence": evidence, "penalty": rule.penalty, "gate": rule.gate})
    weights = {p.id: p.weight for p in case.rubric}
    total = sum(weights.values()) or 1.0
    raw = sum(weights[v.id] * VERDICTS.get(v.verdict, 0.0) for v in result.points) / total
    result.score = round(max(0.0, min(1.0, raw - sum(v["penalty"] for v in result.violations))), 4)
    critical_missed = any(p.critical and got.get(p.id, Verdict(p.id, "fail", "", False)).verdict != "pass"
                          for p in case.rubric)
    gate = any(v["gate"] for v in result.violations)
    result.passed = result.score + EPSILON >= case.pass_threshold and not critical_missed and not gate
    return result


def cache_key(judge_cmd: str, case: Case, answer: str) -> str:
    payload = json.dumps([judge_cmd, TEMPLATE_VERSION, case.raw, answer], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def judge_answers(cases: dict[str, Case], answers: list[Answer], judge_cmd: str, *, cache_path: Path,
                  timeout: float, cwd: Path | None = None, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Judge every answer (cached), compare with the deterministic scorer, return the report."""
    cache: dict[str, dict[str, Any]] = {}
    if cache_path.is_file():
        for line in cache_path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                cache[row["key"]] = row["reply"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    records = []
    pairs: list[tuple[bool, bool]] = []
    suggestions = []
    build_argv(judge_cmd, "probe")
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    with cache_path.open("a", encoding="utf-8") as cache_out:
        for a in answers:
            case = cases[a.id]
            if a.error is not None and not a.answer.strip():
                records.append({"id": a.id, "line": a.line, "skipped": "no answer"})
                continue
            det = score_answer(case, a.answer)
            key = cache_key(judge_cmd, case, a.answer)
            judged = JudgeResult()
            reply = cache.get(key)
            if reply is None:
                argv, stdin = build_argv(judge_cmd, build_prompt(case, a.answer), id=case.id)
                text, error, _ = extract_answer(invoke(argv, stdin, cwd, timeout))
                if error is not None or text is None:
                    judged.error = error or "no reply"
                else:
                    try:
                        reply = parse_reply(text)
                    except ValueError as exc:
                        judged.error = str(exc)
                if reply is not None:
                    cache[key] = reply
                    cache_out.write(json.dumps({"key": key, "case": case.id, "reply": reply}) + "\n")
                    cache_out.flush()
            if reply is not None:
                judged = grade(case, a.answer, reply)
            agreement = {}
            if judged.error is None:
                for mine, theirs in zip(det.points, judged.points, strict=True):
                    theirs_hit = theirs.verdict in ("pass", "partial")
                    agreement[mine.id] = mine.passed == theirs_hit
                    pairs.append((mine.passed, theirs_hit))
                    if theirs_hit and not mine.passed and theirs.evidence:
                        suggestions.append({"case": case.id, "point": mine.id, "quote": theirs.evidence})
            records.append({
                "id": a.id, "line": a.line,
                "deterministic": {"score": det.score, "passed": det.passed},
                "judge": {"score": judged.score, "passed": judged.passed, "error": judged.error,
                          "points": [vars(v) for v in judged.points], "violations": judged.violations,
                          "problems": judged.problems},
                "point_agreement": agreement,
            })
            tag = "ERROR" if judged.error else ("AGREE" if judged.passed == det.passed else "DISAGREE")
            echo(f"[{tag}] {a.id} deterministic={'pass' if det.passed else 'fail'} {det.score:.2f} "
                 f"judge={'–' if judged.passed is None else ('pass' if judged.passed else 'fail')}"
                 + (f" {judged.score:.2f}" if judged.score is not None else "")
                 + (f": {judged.error}" if judged.error else ""))
    judged_records = [r for r in records if "judge" in r and r["judge"]["error"] is None]
    agree = sum(r["judge"]["passed"] == r["deterministic"]["passed"] for r in judged_records)
    return {"judge_cmd": judge_cmd, "template_version": TEMPLATE_VERSION,
            "summary": {"answers": len(answers), "judged": len(judged_records),
                        "errors": sum(1 for r in records if "judge" in r and r["judge"]["error"]),
                        "case_agreement": round(agree / len(judged_records), 4) if judged_records else None,
                        "point_agreement": round(sum(a == b for a, b in pairs) / len(pairs), 4) if pairs else None,
                        "point_kappa": cohen_kappa(pairs)},
            "suggestions": suggestions, "records": records}


def cohen_kappa(pairs: list[tuple[bool, bool]]) -> float | None:
    """Agreement beyond chance between two binary raters (None when undefined)."""
    n = len(pairs)
    if not n:
        return None
    observed = sum(a == b for a, b in pairs) / n
    pa = sum(a for a, _ in pairs) / n
    pb = sum(b for _, b in pairs) / n
    expected = pa * pb + (1 - pa) * (1 - pb)
    if expected >= 1:
        return None
    return round((observed - expected) / (1 - expected), 4)
