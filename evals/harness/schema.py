"""Reading the harness's JSONL inputs into typed objects.

Two kinds of trouble are kept apart, because they call for different exit codes:

- :class:`InputError` — the file cannot be used at all (missing, not JSON, a line that is not an
  object or has no usable ``id``). The command stops with exit 2 and names ``file:line``.
- *problems* — a case that parses but breaks the schema (unknown key, wrong type, bad regex,
  weight ≤ 0 …). They are collected on the :class:`Case` and reported as that case's ``[FAIL]``,
  so one bad case does not hide the others.

The schema is the public contract described in ``references/self-improvement.md`` §7 and
``evals/README.md``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .text import compile_regex

DEFAULT_WEIGHT = 1.0
DEFAULT_PENALTY = 0.25
DEFAULT_THRESHOLD = 0.7
DEFAULT_SEM_THRESHOLD = 0.6
CASE_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")

CASE_KEYS = {"id", "prompt", "tags", "refs", "tools", "rubric", "forbid", "pass_threshold", "notes"}
REF_KEYS = {"file", "ids", "grep"}
POINT_KEYS = {"id", "weight", "critical", "text", "any", "all", "near", "deny", "cite", "gloss", "semantic",
              "sem_threshold"}
FORBID_KEYS = {"id", "text", "any", "penalty", "gate", "only_if_missing"}
CITE_KEYS = {"file", "id"}
ANSWER_KEYS = {"id", "answer", "error", "config", "run", "agent", "model", "duration_s", "cost_usd", "transcript",
               "label", "note", "points", "case_sha256"}
CALIBRATION_KEYS = {"id", "label", "answer", "note", "points"}


class InputError(Exception):
    """Unusable input: the command exits 2 with this message (which names file and line)."""


@dataclass
class Ref:
    file: str
    ids: list[str]
    grep: list[str]


@dataclass
class Cite:
    file: str
    id: str


@dataclass
class Near:
    a: str
    b: str
    max_chars: int


@dataclass
class Point:
    id: str
    text: str
    weight: float = DEFAULT_WEIGHT
    critical: bool = False
    any: list[str] = field(default_factory=list)
    all: list[str] = field(default_factory=list)
    near: list[Near] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    cite: list[Cite] = field(default_factory=list)
    gloss: str = ""
    semantic: bool = True
    sem_threshold: float = DEFAULT_SEM_THRESHOLD

    def regexes(self) -> list[str]:
        return [*self.any, *self.all, *self.deny, *(n.a for n in self.near), *(n.b for n in self.near)]


@dataclass
class Forbid:
    id: str
    text: str
    any: list[str]
    penalty: float = DEFAULT_PENALTY
    gate: bool = False
    only_if_missing: list[str] = field(default_factory=list)


@dataclass
class Case:
    id: str
    prompt: str
    tags: list[str]
    refs: list[Ref]
    tools: list[str]
    rubric: list[Point]
    forbid: list[Forbid]
    pass_threshold: float = DEFAULT_THRESHOLD
    notes: str = ""
    line: int = 0
    problems: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Answer:
    """One answer to score. ``error`` is set when the agent produced none (timeout, crash)."""

    id: str
    answer: str
    line: int
    error: str | None = None
    config: str | None = None
    run: int | None = None
    label: str | None = None
    note: str = ""
    points: dict[str, bool] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line; :class:`InputError` on anything else."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from exc
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not valid JSON: {exc.msg} (column {exc.colno})") from exc
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        if not isinstance(obj.get("id"), str) or not obj["id"].strip():
            raise InputError(f"{path}:{number}: missing or empty \"id\"")
        rows.append((number, obj))
    return rows


class _Checker:
    """Collects problems while pulling typed fields out of a dict."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def keys(self, obj: dict[str, Any], allowed: set[str], where: str) -> None:
        for key in sorted(set(obj) - allowed):
            self.problems.append(f"{where}: unknown key {key!r}")

    def string(self, obj: dict[str, Any], key: str, where: str, required: bool = True) -> str:
        value = obj.get(key)
        if value is None and not required:
            return ""
        if not isinstance(value, str) or (required and not value.strip()):
            self.problems.append(f"{where}: {key!r} must be a non-empty string")
            return ""
        return value

    def strings(self, obj: dict[str, Any], key: str, where: str, required: bool = False) -> list[str]:
        value = obj.get(key, [] if not required else None)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.problems.append(f"{where}: {key!r} must be a list of non-empty strings")
            return []
        if required and not value:
            self.problems.append(f"{where}: {key!r} must not be empty")
        return value

    def number(self, obj: dict[str, Any], key: str, where: str, default: float, low: float, high: float,
               low_open: bool = True) -> float:
        value = obj.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problems.append(f"{where}: {key!r} must be a number")
            return default
        if value > high or value < low or (low_open and value == low):
            bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
            self.problems.append(f"{where}: {key!r} = {value} is outside {bound}")
        return float(value)

    def boolean(self, obj: dict[str, Any], key: str, where: str, default: bool) -> bool:
        value = obj.get(key, default)
        if not isinstance(value, bool):
            self.problems.append(f"{where}: {key!r} must be true or false")
            return default
        return value

    def objects(self, obj: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
        value = obj.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.problems.append(f"{where}: {key!r} must be a list of objects")
            return []
        return value

    def regexes(self, patterns: list[str], where: str) -> None:
        for pattern in patterns:
            if not pattern.strip():
                self.problems.append(f"{where}: empty regex")
                continue
            try:
                compiled = compile_regex(pattern)
            except re.error as exc:
                self.problems.append(f"{where}: regex {pattern!r} does not compile: {exc}")
                continue
            if compiled.search(""):
                self.problems.append(f"{where}: regex {pattern!r} matches the empty string")


def parse_case(obj: dict[str, Any], line: int = 0) -> Case:
    """A :class:`Case` with every schema problem listed in ``case.problems`` (never raises)."""
    c = _Checker()
    cid = obj["id"]
    c.keys(obj, CASE_KEYS, "case")
    if not CASE_ID.match(cid):
        c.problems.append(f"case id {cid!r} is not kebab-case")
    prompt = c.string(obj, "prompt", "case")
    tags = c.strings(obj, "tags", "case", required=True)
    tools = c.strings(obj, "tools", "case")
    refs = []
    for i, r in enumerate(c.objects(obj, "refs", "case")):
        where = f"refs[{i}]"
        c.keys(r, REF_KEYS, where)
        refs.append(Ref(c.string(r, "file", where), c.strings(r, "ids", where), c.strings(r, "grep", where)))
    rubric = [_parse_point(c, p, i) for i, p in enumerate(c.objects(obj, "rubric", "case"))]
    forbid = [_parse_forbid(c, f, i) for i, f in enumerate(c.objects(obj, "forbid", "case"))]
    threshold = c.number(obj, "pass_threshold", "case", DEFAULT_THRESHOLD, 0.0, 1.0)
    notes = c.string(obj, "notes", "case", required=False)
    _check_ids(c, [p.id for p in rubric], "rubric")
    _check_ids(c, [f.id for f in forbid], "forbid")
    point_ids = {p.id for p in rubric}
    for f in forbid:
        for missing in f.only_if_missing:
            if missing not in point_ids:
                c.problems.append(f"forbid {f.id}: only_if_missing names unknown point {missing!r}")
    if not rubric:
        c.problems.append("case: 'rubric' must have at least one point")
    elif len(rubric) < 2 and not any(p.critical for p in rubric):
        c.problems.append("case: needs at least one critical point or two points")
    return Case(cid, prompt, tags, refs, tools, rubric, forbid, threshold, notes, line, c.problems, obj)


def _parse_point(c: _Checker, p: dict[str, Any], index: int) -> Point:
    where = f"rubric[{index}]" + (f" ({p['id']})" if isinstance(p.get("id"), str) else "")
    c.keys(p, POINT_KEYS, where)
    point = Point(
        id=c.string(p, "id", where),
        text=c.string(p, "text", where),
        weight=c.number(p, "weight", where, DEFAULT_WEIGHT, 0.0, 100.0),
        critical=c.boolean(p, "critical", where, False),
        any=c.strings(p, "any", where),
        all=c.strings(p, "all", where),
        deny=c.strings(p, "deny", where),
        gloss=c.string(p, "gloss", where, required=False),
        semantic=c.boolean(p, "semantic", where, True),
        sem_threshold=c.number(p, "sem_threshold", where, DEFAULT_SEM_THRESHOLD, 0.0, 1.0),
    )
    near = p.get("near", [])
    if not isinstance(near, list):
        near = [None]
    for triple in near:
        if (isinstance(triple, list) and len(triple) == 3 and all(isinstance(x, str) and x for x in triple[:2])
                and isinstance(triple[2], int) and not isinstance(triple[2], bool) and triple[2] > 0):
            point.near.append(Near(triple[0], triple[1], triple[2]))
        else:
            c.problems.append(f"{where}: 'near' entries must be [regex_a, regex_b, max_chars > 0]")
    for i, cite in enumerate(c.objects(p, "cite", where)):
        at = f"{where}.cite[{i}]"
        c.keys(cite, CITE_KEYS, at)
        point.cite.append(Cite(c.string(cite, "file", at), c.string(cite, "id", at)))
    if not (point.any or point.all or point.near or point.deny or point.cite):
        c.problems.append(f"{where}: needs a matcher (any, all, near, deny or cite)")
    c.regexes(point.regexes(), where)
    return point


def _parse_forbid(c: _Checker, f: dict[str, Any], index: int) -> Forbid:
    where = f"forbid[{index}]" + (f" ({f['id']})" if isinstance(f.get("id"), str) else "")
    c.keys(f, FORBID_KEYS, where)
    rule = Forbid(
        id=c.string(f, "id", where),
        text=c.string(f, "text", where),
        any=c.strings(f, "any", where, required=True),
        penalty=c.number(f, "penalty", where, DEFAULT_PENALTY, 0.0, 1.0, low_open=False),
        gate=c.boolean(f, "gate", where, False),
        only_if_missing=c.strings(f, "only_if_missing", where),
    )
    c.regexes(rule.any, where)
    return rule


def _check_ids(c: _Checker, ids: list[str], what: str) -> None:
    seen: set[str] = set()
    for i in ids:
        if i and i in seen:
            c.problems.append(f"{what}: duplicate id {i!r}")
        seen.add(i)


def load_cases(path: Path) -> list[Case]:
    """Every case in ``path`` (schema problems attached, not raised). Duplicate case ids are a
    problem of the later line."""
    cases = []
    seen: dict[str, int] = {}
    for line, obj in read_jsonl(path):
        case = parse_case(obj, line)
        if case.id in seen:
            case.problems.append(f"duplicate case id (first on line {seen[case.id]})")
        seen.setdefault(case.id, line)
        cases.append(case)
    return cases


def load_answers(path: Path, allowed: set[str] = ANSWER_KEYS) -> list[Answer]:
    """Answers (or calibration answers) to score. Each needs ``answer`` text or an ``error``;
    anything else malformed is unusable input."""
    answers = []
    for line, obj in read_jsonl(path):
        where = f"{path}:{line}"
        unknown = sorted(set(obj) - allowed)
        if unknown:
            raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}")
        text, error = obj.get("answer"), obj.get("error")
        if error is not None and not isinstance(error, str):
            raise InputError(f"{where}: \"error\" must be a string")
        if not isinstance(text, str) and error is None:
            raise InputError(f"{where}: \"answer\" must be a string (or give \"error\" when the agent failed)")
        label = obj.get("label")
        if label is not None and label not in ("pass", "fail"):
            raise InputError(f"{where}: \"label\" must be \"pass\" or \"fail\"")
        points = obj.get("points", {})
        if not isinstance(points, dict) or not all(isinstance(v, bool) for v in points.values()):
            raise InputError(f"{where}: \"points\" must map point ids to true/false")
        run = obj.get("run")
        if run is not None and (isinstance(run, bool) or not isinstance(run, int)):
            raise InputError(f"{where}: \"run\" must be an integer")
        meta = {k: v for k, v in obj.items() if k in {"agent", "model", "duration_s", "cost_usd", "transcript",
                                                        "case_sha256"}}
        answers.append(Answer(obj["id"], text if isinstance(text, str) else "", line, error,
                              obj.get("config") if isinstance(obj.get("config"), str) else None, run, label,
                              obj.get("note", "") if isinstance(obj.get("note"), str) else "", points, meta))
    return answers


def load_calibration(path: Path) -> list[Answer]:
    """Calibration answers: like answers, but ``label`` is required and nothing else is allowed."""
    answers = load_answers(path, CALIBRATION_KEYS)
    for a in answers:
        if a.label is None:
            raise InputError(f"{path}:{a.line}: calibration answers need \"label\": \"pass\" or \"fail\"")
        if a.error is not None:
            raise InputError(f"{path}:{a.line}: calibration answers cannot carry \"error\"")
    return answers
