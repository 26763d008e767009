"""MCP tools ``repro_scaler_bug`` (``rgt repro``) and ``amp_config_check`` (``rgt amp-check``).

Thin glue: validate the request against the case list, run the variants through the worker
(:mod:`.runner`), judge each observation (:mod:`.results`), render. The server process never
imports torch; every run happens in a worker subprocess with a time limit.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from ..errors import InputError
from ..models import StrictModel, Verdict
from ..tables import format_table
from ..toolspec import Progress, ToolSpec
from ..torch_hint import EXIT_ENVIRONMENT
from ..trainenv.find import ActivateText, PythonPath, TrainingEnv, activate_field, find_training_env, python_field
from . import cases
from .amp_check import AmpCheckInput, AmpCheckResult, check
from .base import Case, Variant
from .results import CaseResult, judge
from .runner import Job, WorkerRun, run_jobs

CaseChoice = Literal[(*cases.CASE_NAMES, "all")]  # type: ignore[valid-type]
VariantChoice = Literal[(*cases.variant_names(), "all")]  # type: ignore[valid-type]


def _variants_help() -> str:
    return "; ".join(f"{c.name}: " + ", ".join(v.name + (" (default)" if v is c.default else "") for v in c.variants)
                     for c in cases.all_cases())


class ReproInput(StrictModel):
    case: CaseChoice = Field(description="Failure class to reproduce, or 'all' (each case's default variant)")
    variant: VariantChoice | None = Field(
        None, description="Variant of the case (default: the case's first); 'all' runs every variant. "
                          "Variants by case — " + _variants_help())
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto = cuda when torch sees a GPU, else cpu. On CPU the scaler is GradScaler('cpu'); "
                            "the distributed case always runs 2 CPU ranks over gloo")
    timeout_s: float = Field(120.0, ge=1, le=1800, description="Time limit per variant (bug run + fix run), "
                                                               "seconds; starting torch has its own limit")
    python: PythonPath = python_field()
    activate: ActivateText = activate_field()


class ReproReport(StrictModel):
    verdict: Verdict = Field(Verdict.PASS, description="PASS: every variant behaved as documented and its fix ran "
                             "clean; FAIL: a variant timed out, crashed, failed differently or its fix failed; SKIP: "
                             "nothing ran (torch_missing says why)")
    torch_missing: str | None = Field(None, description="Set when torch cannot be imported here: why, and how to "
                                                        "add it; every result is then not_run")
    torch_version: str | None = Field(description="torch in the worker, e.g. 2.13.0+cpu; null if it did not start")
    device: str | None = Field(description="Device the single-process cases ran on")
    cuda_available: bool | None
    results: list[CaseResult]
    reproduced: int = Field(description="Variants whose failure reproduced exactly")
    cuda_only: int = Field(description="Variants whose error is CUDA-only and which ran on CPU")
    fixed_ok: int = Field(description="Variants whose fix ran clean")
    problems: int = Field(description="Variants that timed out, crashed, failed differently, or whose fix failed")
    worker_start_s: float | None = Field(description="Interpreter + import torch + first optimizer, seconds")
    seconds: float = Field(description="Wall time of the whole call")
    notes: list[str]
    training_env: TrainingEnv | None = Field(None, description="The interpreter the cases ran under and how it was "
                                             "found (python=, activate=, the login shell's PATH, ~/venvs/*, …)")


def plan(case: str, variant: str | None) -> list[tuple[Case, Variant]]:
    """The (case, variant) pairs a request names; InputError for a variant of another case."""
    if case == "all":
        if variant not in (None, "all"):
            raise InputError("variant", f"{variant!r} needs a single case, not case='all'", allowed=["all"])
        return [(c, v) for c in cases.all_cases() for v in (c.variants if variant == "all" else (c.default,))]
    chosen = cases.case(case)
    if variant is None:
        return [(chosen, chosen.default)]
    if variant == "all":
        return [(chosen, v) for v in chosen.variants]
    try:
        return [(chosen, chosen.variant(variant))]
    except KeyError:
        raise InputError("variant", f"{variant!r} is not a variant of {case}",
                         allowed=[v.name for v in chosen.variants] + ["all"]) from None


def run_pairs(pairs: list[tuple[Case, Variant]], device: str, timeout_s: float, progress: Progress,
              training: TrainingEnv | None = None) -> tuple[list[CaseResult], WorkerRun]:
    run = run_jobs([Job(c.name, v.name) for c, v in pairs], device=device, timeout_s=timeout_s, progress=progress,
                   training=training)
    return [judge(c, v, raw, run.torch_version) for (c, v), raw in zip(pairs, run.results, strict=True)], run


def repro(args: ReproInput, progress: Progress) -> ReproReport:
    start = time.perf_counter()
    pairs = plan(args.case, args.variant)
    training = find_training_env(args.python, args.activate)
    results, run = run_pairs(pairs, args.device, args.timeout_s, progress, training)
    notes = list(run.notes)
    if run.device == "cpu":
        notes.append("Ran on CPU with torch.amp.GradScaler('cpu'): the default GradScaler() targets CUDA and "
                     "disables itself without it, which would hide these bugs.")
    problems = [r for r in results if r.status in ("timeout", "crashed", "different_error") or r.fixed_ok is False]
    verdict = Verdict.SKIP if run.torch_missing else Verdict.FAIL if problems else Verdict.PASS
    return ReproReport(
        verdict=verdict, torch_missing=run.torch_missing,
        torch_version=run.torch_version, device=run.device, cuda_available=run.cuda_available, results=results,
        reproduced=sum(r.reproduced for r in results), cuda_only=sum(r.status == "cuda_only" for r in results),
        fixed_ok=sum(bool(r.fixed_ok) for r in results), problems=len(problems),
        worker_start_s=None if run.worker_start_s is None else round(run.worker_start_s, 3),
        seconds=round(time.perf_counter() - start, 3), notes=notes, training_env=training)


def _yes(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "-"}[value]


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def render_case(r: CaseResult, brief: bool = False) -> str:
    """One variant; ``brief`` (several variants) leaves out the why and the diff, which are the catalog's
    fixed text (in the result and the entry), and keeps what this run observed."""
    lines = [f"{r.case} / {r.variant} — {r.status}", f"  what:    {r.summary}"]
    if not brief:
        lines.append(f"  why:     {r.why}")
    if r.message is not None:
        rank = f" (rank {r.root_cause_rank})" if r.root_cause_rank is not None else ""
        lines.append(f"  error:   {r.exception_type}: {r.message}{rank}")
        lines.append(f"  raised:  {r.raised_at or '-'}" + (f" in {r.raised_in}" if r.raised_in else ""))
    if r.observed and not r.ranks:
        lines.append(f"  seen:    {r.observed}")
    if r.note:
        lines.append(f"  note:    {r.note}")
    if r.device_note:
        lines.append(f"  ran on:  {r.device_note}")
    for rank in r.ranks:
        what = f"{rank.exception_type}: {rank.message}" if rank.exception_type else rank.detail
        lines.append(f"  rank {rank.rank}:  {what}")
    lines.append(f"  fix:     {r.fix}")
    fixed = r.fixed_detail if r.fixed_ok else (r.fixed_error or "")
    lines.append(f"  fixed:   {_yes(r.fixed_ok)}" + (f" — {fixed}" if fixed else ""))
    lines.append(f"  entry:   {r.entry.file} {r.entry.id}")
    if not brief:
        lines.append("  diff:\n" + _indent(r.fix_diff))
    return "\n".join(lines)


def _not_run(torch_problem: str, results: list[CaseResult]) -> str:
    names = ", ".join(f"{r.case}/{r.variant}" for r in results)
    return f"SKIP — {len(results)} variant(s) not run ({names}).\n{torch_problem}"


def render_repro(report: ReproReport) -> str:
    if report.torch_missing:
        return _not_run(report.torch_missing, report.results)
    head = (f"torch {report.torch_version or '?'} ({report.training_env.brief() if report.training_env else '?'})\n"
            f"device {report.device or '?'} · {len(report.results)} variant(s) "
            f"in {report.seconds:.1f} s (worker start {report.worker_start_s or 0:.1f} s) · reproduced "
            f"{report.reproduced}, cuda-only {report.cuda_only}, fixes ok {report.fixed_ok}/{len(report.results)}")
    rows = [[r.case, r.variant, r.status, r.exception_type, r.raised_at, _yes(r.fixed_ok), r.seconds]
            for r in report.results]
    table = format_table(["case", "variant", "status", "exception", "raised at", "fix ok", "s"], rows)
    brief = len(report.results) > 2
    blocks = "\n\n".join(render_case(r, brief) for r in report.results)
    if brief:
        blocks += "\n\n(why and the fix diff of each variant: results[].why / fix_diff, or `rgt repro CASE`)"
    notes = "\n".join(f"note: {n}" for n in report.notes)
    return "\n\n".join(part for part in (head, table, blocks, notes) if part)


def amp_config_check(args: AmpCheckInput, progress: Progress) -> AmpCheckResult:
    result = check(args)
    variants = [p for p in result.predictions if p.repro_variant]
    if args.confirm and variants:
        pairs = [cases.find_variant(p.repro_variant) for p in variants]  # type: ignore[arg-type]
        training = find_training_env(args.python, args.activate)
        confirmations, run = run_pairs(pairs, args.device if args.device == "cpu" else "auto", args.timeout_s,
                                       progress, training)
        result.confirmations, result.torch_version = confirmations, run.torch_version
        result.torch_missing, result.training_env = run.torch_missing, training
    elif args.confirm:
        result.notes.append("confirm: no prediction has a repro variant, nothing to run")
    return result


def render_amp(result: AmpCheckResult) -> str:
    r = result.resolved
    lines = [f"verdict: {result.verdict.value} · trainable {r.trainable_dtype} · grads {r.grad_dtype} · "
             f"optimizer state {r.optimizer_state_dtype} · scaler {r.scaler}"]
    if not result.predictions:
        lines.append("no known AMP failure predicted for this setup")
    for p in result.predictions:
        lines += ["", f"{p.confidence.upper()}: {p.failure}  [{p.case}" + (f"/{p.repro_variant}]" if p.repro_variant
                                                                              else "]"),
                  f"  why:   {p.why}", f"  when:  {p.condition}", f"  fix:   {p.fix}",
                  f"  entry: {p.entry.file} {p.entry.id}"]
    lines += [f"advice: {a.text} ({a.entry.file} {a.entry.id})" for a in result.advice]
    lines += [f"note: {n}" for n in result.notes]
    if result.torch_missing:
        lines += ["", "confirm: " + _not_run(result.torch_missing, result.confirmations)]
    elif result.confirmations:
        where = f" ({result.training_env.brief()})" if result.training_env else ""
        lines += ["", f"confirmed on torch {result.torch_version}{where}:"]
        rows = [[c.case, c.variant, c.status, c.exception_type, c.message or c.observed, _yes(c.fixed_ok)]
                for c in result.confirmations]
        lines.append(format_table(["case", "variant", "status", "exception", "message / seen", "fix ok"], rows))
    return "\n".join(lines)


def _repro_exit(report: ReproReport) -> int:
    if report.torch_missing:
        return EXIT_ENVIRONMENT
    return 1 if report.problems else 0


def _amp_exit(result: AmpCheckResult) -> int:
    """The confirmation that was asked for could not run: an environment status, like a missing GPU."""
    if result.torch_missing:
        return EXIT_ENVIRONMENT
    return 1 if result.verdict.value == "FAIL" else 0


SPECS = [
    ToolSpec(
        name="repro_scaler_bug",
        remote=True,
        cli="repro",
        title="Reproduce an AMP/GradScaler failure and its fix",
        description=(
            "Run a known mixed-precision failure for real on this machine's torch (in a worker subprocess with a "
            "time limit), report torch's exact exception text and the torch file:line that raised it, then run the "
            "minimal fix and report whether it trains clean, with the code diff and the catalog entry. Cases: "
            "fp16_unscale, no_inf_checks, bf16_adam_dtype, bf16_scaler (CUDA-only error; on CPU reported as "
            "cuda_only), double_unscale, fp16_overflow (NaN loss / skipped steps / scale collapse), "
            "fsdp_ddp_double_wrap (2 gloo ranks), or all. Use it to show a user their error is the known one and "
            "that the fix works on their torch. Read-only: it runs toy models only, never the user's code. "
            "Runs in the training environment: python= or activate= as given, else found (training_env says "
            "which). Needs torch there: without it every case is not_run, verdict SKIP, and torch_missing says "
            "which interpreters were looked at and what to pass (CLI exit 4)."
        ),
        input_model=ReproInput,
        output_model=ReproReport,
        run=repro,
        read_only=True,
        render_text=render_repro,
        exit_code=_repro_exit,
        cli_positional="case",
    ),
    ToolSpec(
        name="amp_config_check",
        remote=True,
        cli="amp-check",
        title="Predict AMP/GradScaler failures from a training setup",
        description=(
            "Given a training setup (model and trainable dtypes, fp16/bf16, GradScaler, clipping and accumulation, "
            "gradient checkpointing, LoRA, optimizer, FSDP mixed precision and keep_low_precision_grads, DDP), "
            "predict which known mixed-precision failures it will hit, why, when, and the fix, each pointing to "
            "its catalog entry. confirm=true runs the matching repro_scaler_bug variants on this machine's torch. "
            "Call it before launching a run, or when a user describes their AMP config."
        ),
        input_model=AmpCheckInput,
        output_model=AmpCheckResult,
        run=amp_config_check,
        read_only=True,
        render_text=render_amp,
        exit_code=_amp_exit,
    ),
]
