"""Command line of ``evals/run_evals.py``. Exit codes: 0 all good, 1 a check or answer failed,
2 unusable input (a missing or malformed file, a bad option; the message names file and line)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .schema import Case, InputError, load_answers, load_cases

EVALS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = EVALS_DIR.parent
COMMANDS = ("structure", "score", "run", "judge", "facts", "verify")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_evals.py",
        description="Eval harness for the remote-gpu-trainer skill. With no command: structure mode (CI).")
    sub = parser.add_subparsers(dest="command")

    def cases_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--cases", type=Path, default=EVALS_DIR / "cases.jsonl",
                       help="cases file (default: %(default)s)")

    p = sub.add_parser("structure", help="check refs, cites, links, lints and calibration (default)")
    cases_option(p)
    p.add_argument("--calibration", type=Path, default=EVALS_DIR / "calibration.jsonl",
                   help="labelled answers every case must reproduce (default: %(default)s)")
    p.add_argument("--root", type=Path, default=REPO_ROOT, help="skill root (default: this checkout)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only failing lines and the summary")

    p = sub.add_parser("score", help="score answers offline")
    p.add_argument("answers", type=Path, help="JSONL with {id, answer} per line (several per case allowed)")
    cases_option(p)
    p.add_argument("--json", type=Path, help="write the JSON report here")
    p.add_argument("--md", type=Path, help="write the Markdown report here")
    p.add_argument("--junit", type=Path, help="write JUnit XML here")
    p.add_argument("--baseline", type=Path, help="answers without the skill, for per-case deltas")
    p.add_argument("--semantic", action="store_true", help="half-credit embedding fallback (optional package)")

    p = sub.add_parser("run", help="run an agent CLI on every case, save answers for scoring")
    cases_option(p)
    p.add_argument("--agent-cmd", required=True,
                   help="argv template, e.g. \"claude -p {prompt} --output-format json\" (no shell; "
                        "without {prompt} the prompt goes to stdin)")
    p.add_argument("--runs", type=int, default=1, help="answers per case (default 1)")
    p.add_argument("--cwd", type=Path, help="directory the agent runs in (with or without the skill)")
    p.add_argument("--config", default="with-skill", help="name of this configuration (default: %(default)s)")
    p.add_argument("--out", type=Path, default=EVALS_DIR / "runs", help="runs folder (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per call (default 600)")
    p.add_argument("--jobs", type=int, default=1, help="calls in parallel (default 1)")
    p.add_argument("--only", nargs="+", metavar="ID", help="only these case ids")
    p.add_argument("--tag", action="append", help="only cases with this tag (repeatable)")

    p = sub.add_parser("facts", help="check catalog strings, commands and version claims against real packages")
    p.add_argument("--root", type=Path, default=REPO_ROOT, help="skill root (default: this checkout)")
    p.add_argument("--download", action="store_true",
                   help="pip download the current wheels of the packages not installed (cached) and check them too")
    p.add_argument("--installed-only", action="store_true",
                   help="ignore wheels an earlier --download left in the cache (what CI checks)")
    p.add_argument("--json", type=Path, default=None,
                   help="JSON report (default: ~/.cache/remote-gpu-trainer/facts/report.json)")
    p.add_argument("--record", action="store_true",
                   help="write **Verified with:** lines for entries checked against a package without a FAIL")
    p.add_argument("--only", nargs="+", metavar="ID", help="only these entry IDs")
    p.add_argument("-q", "--quiet", action="store_true", help="print only FAIL lines and the summary")

    p = sub.add_parser("verify", help="run each cpu entry's Verify on its failure and its fix; recompute the "
                       "entries' figures with the tools; list what the other Verify steps need")
    p.add_argument("--root", type=Path, default=REPO_ROOT, help="skill root (default: this checkout)")
    p.add_argument("--only", nargs="+", metavar="ID", help="only these entry IDs")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (at least the widest scenario's ranks)")
    p.add_argument("--numbers-only", action="store_true", help="skip the scenarios (seconds instead of minutes)")
    p.add_argument("--list", action="store_true", help="also print every entry id under what its Verify needs")
    p.add_argument("-q", "--quiet", action="store_true", help="print only FAIL lines and the summary")

    p = sub.add_parser("judge", help="LLM judge beside the deterministic score")
    p.add_argument("answers", type=Path)
    cases_option(p)
    p.add_argument("--judge-cmd", required=True, help="argv template for the judge, e.g. \"claude -p {prompt} "
                   "--output-format json\"")
    p.add_argument("--json", type=Path, help="write the judge report here")
    p.add_argument("--cache", type=Path, help="judge cache (default: judge.jsonl beside the answers)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per judge call (default 300)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "structure")
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: 2 for bad usage, 0 for --help
        return int(exc.code or 0)
    try:
        return {"structure": _structure, "score": _score, "run": _run, "judge": _judge,
                "facts": _facts, "verify": _verify}[args.command](args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _structure(args: argparse.Namespace) -> int:
    from .structure import run_structure

    calibration = args.calibration if args.calibration.is_file() else None
    if calibration is None:
        print(f"note: no calibration file at {args.calibration}: every case will fail its calibration check")
    report = run_structure(args.root.resolve(), _existing(args.cases), calibration)
    for line in report.lines:
        if not (args.quiet and line.ok):
            print(line)
    for note in report.notes:
        print(note)
    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return path


def _cases_by_id(path: Path) -> dict[str, Case]:
    cases = load_cases(_existing(path))
    broken = [f"{c.id} (line {c.line}): {'; '.join(c.problems)}" for c in cases if c.problems]
    if broken:
        raise InputError(f"{path} has invalid cases (run structure mode): " + " | ".join(broken))
    return {c.id: c for c in cases}


def _answers_for(path: Path, cases: dict[str, Case]) -> list[Any]:
    answers = load_answers(_existing(path))
    for a in answers:
        if a.id not in cases:
            raise InputError(f"{path}:{a.line}: unknown case id {a.id!r}")
    return answers


def _score(args: argparse.Namespace) -> int:
    from .report import build_report, render_junit, render_markdown, score_all

    cases = _cases_by_id(args.cases)
    answers = _answers_for(args.answers, cases)
    baseline_answers = _answers_for(args.baseline, cases) if args.baseline else None
    semantic = None
    if args.semantic:
        from .semantic import MiniLM

        semantic = MiniLM()
    scored = score_all(cases, answers, semantic)
    baseline = score_all(cases, baseline_answers, semantic) if baseline_answers is not None else None
    report = build_report(scored, cases, cases_path=args.cases, answers_path=args.answers, baseline=baseline,
                          baseline_path=args.baseline, semantic=semantic.info if semantic else None)
    for s in scored:
        print(s.line())
    summary = report["summary"]
    if baseline is not None:
        d = summary["delta"]
        print(f"baseline: pass rate {summary['baseline']['pass_rate']} → {summary['pass_rate']} "
              f"(Δ {d['pass_rate']}), mean score Δ {d['mean_score']}")
    if summary.get("labels"):
        labels = summary["labels"]
        print(f"labels: {labels['agree']}/{labels['labelled']} answers scored as labelled")
    if summary["errors"]:
        print(f"{summary['errors']} answer(s) missing (agent error); counted as failed below")
    for flag, render in ((args.json, lambda r: json.dumps(r, indent=2, ensure_ascii=False) + "\n"),
                         (args.md, render_markdown), (args.junit, render_junit)):
        if flag:
            flag.parent.mkdir(parents=True, exist_ok=True)
            flag.write_text(render(report), encoding="utf-8")
    failed = summary["failed"] + summary["errors"]
    labels = summary.get("labels")
    if labels and labels["labelled"] == len(scored):
        # A calibration file: fail-labelled answers are meant to fail; what matters is agreement with the labels.
        print(f"{summary['passed']} passed, {failed} failed, as labelled for {labels['agree']} of "
              f"{labels['labelled']}: " + ("the scorer agrees with every label" if not labels["disagree"] else
                                          f"{len(labels['disagree'])} disagree: {'; '.join(labels['disagree'][:5])}"))
        return 1 if labels["disagree"] or summary["errors"] else 0
    print(f"{summary['passed']} passed, {failed} failed")
    return 1 if failed else 0


def _run(args: argparse.Namespace) -> int:
    from .runner import run_agent

    cases = list(_cases_by_id(args.cases).values())
    if args.only:
        unknown = sorted(set(args.only) - {c.id for c in cases})
        if unknown:
            raise InputError("unknown case id(s): " + ", ".join(unknown))
        cases = [c for c in cases if c.id in args.only]
    if args.tag:
        cases = [c for c in cases if set(args.tag) & set(c.tags)]
    if not cases:
        raise InputError("no case selected")
    if args.runs < 1 or args.jobs < 1 or args.timeout <= 0:
        raise InputError("--runs and --jobs must be ≥ 1 and --timeout > 0")
    if args.cwd is not None and not args.cwd.is_dir():
        raise InputError(f"--cwd {args.cwd}: not a directory")
    try:
        folder, errors = run_agent(cases, args.agent_cmd, runs=args.runs, cwd=args.cwd, out_root=args.out,
                                   timeout=args.timeout, config=args.config, jobs=args.jobs)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    calls = len(cases) * args.runs
    print(f"answers: {folder / 'answers.jsonl'}")
    print(f"score them: python evals/run_evals.py score {folder / 'answers.jsonl'} --md {folder / 'results.md'}")
    print(f"{calls - errors} answered, {errors} errors")
    return 1 if errors else 0


def _judge(args: argparse.Namespace) -> int:
    from .judge import judge_answers

    cases = _cases_by_id(args.cases)
    answers = _answers_for(args.answers, cases)
    cache = args.cache or args.answers.with_name("judge.jsonl")
    try:
        report = judge_answers(cases, answers, args.judge_cmd, cache_path=cache, timeout=args.timeout)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    s = report["summary"]
    print(f"judge: {s['judged']} judged, {s['errors']} errors; case agreement {s['case_agreement']}, "
          f"point agreement {s['point_agreement']} (kappa {s['point_kappa']})")
    for hint in report["suggestions"][:20]:
        print(f"suggestion: {hint['case']}/{hint['point']} judge found {hint['quote']!r}")
    agree = sum(1 for r in report["records"] if "judge" in r and r["judge"]["passed"] == r["deterministic"]["passed"]
                and r["judge"]["error"] is None)
    print(f"{agree} passed, {len(report['records']) - agree} failed")
    return 1 if s["errors"] else 0


def _facts(args: argparse.Namespace) -> int:
    from .facts import CACHE_DIR, available_packages, record_versions, run_facts

    packages = available_packages(download=args.download, use_cache=not args.installed_only)
    print("packages: " + ", ".join(f"{p.label} ({p.origin})" for p in packages.values()))
    report, entries = run_facts(args.root.resolve(), packages, only=args.only or ())
    for result in report.results:
        if not (args.quiet and result.verdict != "FAIL"):
            print(result.line())
    table = report.table(entries)
    print("table: " + ", ".join(f"{k} {v}" for k, v in table.items() if not isinstance(v, dict)))
    out = args.json or CACHE_DIR / "report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.to_json(entries), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"report: {out}")
    if args.record:
        changed = record_versions(args.root.resolve(), report)
        print(f"recorded versions in {len(changed)} entries" + (f": {' '.join(changed)}" if changed else ""))
    print(f"{report.count('PASS')} passed, {report.count('FAIL')} failed, {report.count('SKIP')} skipped")
    return 1 if report.count("FAIL") else 0


def _verify(args: argparse.Namespace) -> int:
    import time

    from .verify import run_verify

    start = time.monotonic()

    def progress(outcome: object) -> None:
        if not (args.quiet and getattr(outcome, "ok", False)):
            print(outcome.line(), flush=True)  # type: ignore[attr-defined]

    try:
        report = run_verify(args.root.resolve(), only=args.only or (), jobs=max(1, args.jobs),
                            scenarios=not args.numbers_only, progress=progress)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    for line in report.numbers + report.orphans:
        if not (args.quiet and line.ok):
            print(line)
    print("needs: " + ", ".join(f"{kind} {len(ids)}" for kind, ids in sorted(report.needs.items())))
    if args.list:
        for kind, ids in sorted(report.needs.items()):
            print(f"  {kind}: {' '.join(ids)}")
    print("counts: " + ", ".join(f"{k} {v}" for k, v in report.counts().items()))
    print(f"time: {time.monotonic() - start:.0f} s")
    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0
