"""Structure mode, the default command and the CI guard: it needs no agent, no network and no
third-party package, and fails when the skill and its eval cases drift apart.

Per case (one ``[PASS]``/``[FAIL]`` line each):

- the case follows the schema (``schema.parse_case``: keys, types, compiling regexes, weights > 0,
  ``only_if_missing`` names real points, ≥ 1 critical point or ≥ 2 points);
- every ``refs`` file exists, every ``refs.ids`` entry is a ``### <ID> — …`` heading in that file and
  every ``refs.grep`` term occurs in it (case-insensitive, on normalised text);
- every ``cite`` target names an existing entry in the named file;
- every ``tools`` name is one of the MCP tools (the names are a contract);
- no rubric or forbid regex matches the case's own prompt ("bleeding": a rubric the prompt already
  satisfies measures nothing); for ``near`` the pair must not co-occur in the prompt;
- calibration: the case has at least one ``pass`` and one ``fail`` answer in ``calibration.jsonl``,
  and each gets its label (and the point verdicts it lists under ``points``).

Then whole-skill checks, also as lines: entry IDs unique with one prefix per file, and every
relative link in SKILL.md, references/ and profiles/ resolves (file and anchor); calibration
answers name existing cases. ``note:`` lines list catalog files and tools no case covers yet.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .schema import Answer, Case, load_calibration, load_cases
from .scoring import cite_regex, near_pair, score_answer
from .skill import Skill, load_skill
from .text import Doc, compile_regex, normalise

#: The MCP tool names: a public contract (SKILL.md, the catalog's **Tool:** fields and these cases
#: name them). ``tests/test_evals_structure.py`` compares this list with the server's registry.
KNOWN_TOOLS = (
    "skill_info", "gpu_health", "reap_vram_zombies", "kill_port_holders", "port_status", "fsdp_memory_estimate",
    "repro_scaler_bug", "amp_config_check", "diagnose_error", "provider_info", "render_launch", "render_template",
    "box_install", "box_status", "box_remove", "preflight", "run_start", "run_status", "run_logs", "run_stop",
    "run_list", "box_idle", "run_pull", "idle_guard", "run_stacks", "run_adopt",
)


@dataclass
class Line:
    name: str
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def __str__(self) -> str:
        return f"[PASS] {self.name}" if self.ok else f"[FAIL] {self.name}: " + "; ".join(self.reasons)


@dataclass
class StructureReport:
    lines: list[Line]
    notes: list[str]

    @property
    def failed(self) -> int:
        return sum(not line.ok for line in self.lines)

    @property
    def passed(self) -> int:
        return len(self.lines) - self.failed


def check_case(case: Case, skill: Skill, calibration: list[Answer]) -> list[str]:
    """Every reason ``case`` fails structure mode (empty when it holds)."""
    reasons = list(case.problems)
    if not case.refs:
        reasons.append("refs: at least one {file, ids, grep} is needed")
    for ref in case.refs:
        if not ref.file:
            continue
        if not (skill.root / ref.file).is_file():
            reasons.append(f"refs: {ref.file} does not exist")
            continue
        entries = skill.entries.get(ref.file, {})
        for entry_id in ref.ids:
            if entry_id not in entries:
                where = skill.owner.get(entry_id)
                hint = f" (it is in {where})" if where else ""
                reasons.append(f"refs: {ref.file} has no entry {entry_id}{hint}")
        text = skill.text(ref.file).lower()
        for term in ref.grep:
            if normalise(term).lower() not in text:
                reasons.append(f"refs: {term!r} does not occur in {ref.file}")
    for point in case.rubric:
        for cite in point.cite:
            rel = skill.resolve(cite.file) if cite.file else None
            if rel is None:
                reasons.append(f"cite {point.id}: no single skill file matches {cite.file!r}")
            elif cite.id and cite.id not in skill.entries.get(rel, {}):
                reasons.append(f"cite {point.id}: {rel} has no entry {cite.id}")
    for tool in case.tools:
        if tool not in KNOWN_TOOLS:
            reasons.append(f"tools: {tool!r} is not an MCP tool")
    reasons += bleeding(case)
    reasons += check_calibration(case, calibration)
    return reasons


def bleeding(case: Case) -> list[str]:
    """Rubric and forbid regexes that already match the case's prompt (schema-valid cases only)."""
    if case.problems or not case.prompt:
        return []
    prompt = Doc(case.prompt)
    found = []

    def check(pattern: str, where: str) -> None:
        m = compile_regex(pattern).search(prompt.text)
        if m:
            found.append(f"bleeding: {where} regex {pattern!r} matches the prompt ({m.group(0)!r})")

    for point in case.rubric:
        for pattern in [*point.any, *point.all, *point.deny]:
            check(pattern, f"point {point.id}")
        for near in point.near:
            pair = near_pair(prompt.find(compile_regex(near.a)), prompt.find(compile_regex(near.b)), near.max_chars)
            if pair:
                found.append(f"bleeding: point {point.id} near [{near.a!r}, {near.b!r}] holds in the prompt")
        for cite in point.cite:
            if cite.id:
                check(cite_regex(cite.id), f"point {point.id} cite")
    for rule in case.forbid:
        for pattern in rule.any:
            check(pattern, f"forbid {rule.id}")
    return found


def check_calibration(case: Case, answers: list[Answer]) -> list[str]:
    """The case's labelled answers must each get their label: the rubric is tested, not trusted."""
    if case.problems:
        return []
    labels = {a.label for a in answers}
    reasons = [f"calibration: no {label!r} answer" for label in ("pass", "fail") if label not in labels]
    for a in answers:
        result = score_answer(case, a.answer)
        got = "pass" if result.passed else "fail"
        name = f"calibration line {a.line}" + (f" ({a.note})" if a.note else "")
        if got != a.label:
            why = "; ".join(result.reasons()) if not result.passed else f"score {result.score:.2f}"
            reasons.append(f"{name} labelled {a.label} but scored {got}: {why}")
        verdicts = {p.id: p.passed for p in result.points}
        for point_id, expected in a.points.items():
            if point_id not in verdicts:
                reasons.append(f"{name}: 'points' names unknown point {point_id!r}")
            elif verdicts[point_id] != expected:
                reasons.append(f"{name}: point {point_id} expected {'hit' if expected else 'miss'}")
    return reasons


def run_structure(root: Path, cases_path: Path, calibration_path: Path | None) -> StructureReport:
    """All structure checks; :class:`~harness.schema.InputError` for unusable files (exit 2)."""
    cases = load_cases(cases_path)
    calibration = load_calibration(calibration_path) if calibration_path is not None else []
    skill = load_skill(root)
    by_case: dict[str, list[Answer]] = defaultdict(list)
    for a in calibration:
        by_case[a.id].append(a)
    lines = [Line(case.id, check_case(case, skill, by_case.get(case.id, []))) for case in cases]
    known = {c.id for c in cases}
    orphans = [f"line {a.line} names unknown case {a.id!r}" for a in calibration if a.id not in known]
    if calibration_path is not None:
        lines.append(Line(f"structure:calibration ({len(calibration)} answers)", orphans))
    lines.append(Line(f"structure:entry-ids ({sum(len(v) for v in skill.entries.values())} entries)",
                      skill.id_problems))
    lines.append(Line("structure:links (SKILL.md, references/, profiles/)", skill.link_problems))
    return StructureReport(lines, coverage_notes(cases, skill))


def coverage_notes(cases: list[Case], skill: Skill) -> list[str]:
    """What no case covers yet: a catalog file without a ``refs`` entry, a tool no case names."""
    referenced = {r.file for c in cases for r in c.refs}
    notes = [f"note: no case refs {f}" for f in skill.catalog_files() if f not in referenced]
    named = {t for c in cases for t in c.tools}
    notes += [f"note: no case names the tool {t}" for t in KNOWN_TOOLS if t not in named]
    return notes
