"""Result models for repro runs, and the judge that turns a worker's raw observation into one.

The judge is the only place that decides "reproduced": the exception must have the variant's
class and match its pattern (the message reported is torch's own text either way), a numeric case
must show its symptom, and a CUDA-only error that did not happen on CPU is ``cuda_only``, not a
silent pass. Anything else is reported as what it is (``different_error``, ``not_reproduced``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..models import EntryRef, StrictModel
from .base import Case, CatalogRef, Variant

Status = Literal["reproduced", "cuda_only", "not_reproduced", "different_error", "timeout", "crashed", "not_run"]

STATUS_HELP = (
    "reproduced: the bug run failed exactly as described; cuda_only: the error comes from a CUDA kernel and "
    "this run was on CPU, where the same code runs clean; not_reproduced: the bug run finished without the "
    "failure on this torch; different_error: it failed with another error; timeout / crashed: the run was "
    "killed or its worker died (the other cases still ran); not_run: this machine cannot run it (torch is not "
    "installed), which says nothing about the case."
)


class RankOutcome(StrictModel):
    rank: int
    ok: bool
    exception_type: str | None = None
    message: str | None = None
    raised_at: str | None = None
    detail: str | None = Field(None, description="What the rank measured, or why it stopped without an exception")


class CaseResult(StrictModel):
    case: str
    variant: str
    summary: str = Field(description="What the buggy code does")
    why: str = Field(description="The mechanism: why torch raises (or misbehaves) here")
    status: Status = Field(description=STATUS_HELP)
    reproduced: bool
    cuda_only: bool = Field(description="The exact error is raised only by a CUDA kernel")
    exception_type: str | None = Field(None, description="Class of the exception the bug run raised")
    message: str | None = Field(None, description="torch's exact exception text from this run (never canned)")
    raised_at: str | None = Field(None, description="Innermost torch frame that raised, relative to site-packages, "
                                                    "e.g. torch/amp/grad_scaler.py:275")
    raised_in: str | None = Field(None, description="Function of that frame")
    root_cause_rank: int | None = Field(None, description="Distributed cases: the rank whose error is the cause")
    observed: str = Field("", description="What the bug run measured (numeric symptoms, or what ran clean)")
    note: str | None = Field(None, description="Why a result is not a plain reproduction (CPU vs CUDA, timeouts)")
    fix: str
    fix_diff: str = Field(description="User-level change, unified-diff style: '-' bug lines, '+' fix lines")
    fixed_ok: bool | None = Field(description="The fixed code ran clean; null when it could not run")
    fixed_detail: str = Field("", description="What the fixed run measured (steps, loss, scale)")
    fixed_error: str | None = None
    metrics: dict[str, float | int | str] = Field(default_factory=dict, description="Numbers from the bug run")
    ranks: list[RankOutcome] = Field(default_factory=list, description="Per-rank outcome of a distributed bug run")
    torch_version: str | None
    device: str | None = Field(description="Where it ran: cpu or cuda (distributed cases: cpu with gloo)")
    process_group: str | None = Field(None, description="Distributed cases: how their ranks ran ('gloo, 2 ranks on "
                                      "CPU'). They never use a GPU, even when device='cuda' was asked for")
    device_note: str | None = Field(None, description="Set when the case ran elsewhere than the device asked for, "
                                    "and why")
    seconds: float | None = Field(description="Bug run + fix run, excluding worker start")
    entry: EntryRef


def _rank_outcomes(ranks: list[dict[str, Any]]) -> list[RankOutcome]:
    out = []
    for r in ranks:
        raised = r.get("raised")
        out.append(RankOutcome(rank=r["rank"], ok="detail" in r,
                               exception_type=raised["type"] if raised else None,
                               message=raised["message"] if raised else None,
                               raised_at=raised["raised_at"] if raised else None,
                               detail=r.get("detail") or r.get("exit")))
    return out


def _error_text(raised: dict[str, Any]) -> str:
    where = f" at {raised['raised_at']}" if raised.get("raised_at") else ""
    rank = f" (rank {raised['rank']})" if raised.get("rank") is not None else ""
    return f"{raised['type']}: {raised['message']}{where}{rank}"


def _bug_status(case: Case, variant: Variant, raw: dict[str, Any]) -> tuple[Status, str | None]:
    bug = raw["bug"]
    raised = bug["raised"]
    expect = variant.expect
    killed = [r for r in bug["ranks"] if "exit" in r]
    if raised is None and killed:
        status: Status = "timeout" if any("killed" in r["exit"] for r in killed) else "crashed"
        return status, "; ".join(f"rank {r['rank']}: {r['exit']}" for r in killed)
    if expect is None:
        if raised is not None:
            return "different_error", "expected a numeric symptom, got an exception"
        if bug["symptom"]:
            return "reproduced", None
        return "not_reproduced", "the run finished without the symptom on this torch/device"
    if raised is not None:
        if expect.matches(raised["type"], raised["message"]):
            return "reproduced", None
        return "different_error", (f"expected {' or '.join(expect.types)} matching /{expect.pattern}/; "
                                   "this torch may word or route the failure differently")
    if variant.cuda_only and raw["device"] != "cuda":
        return "cuda_only", variant.cuda_note
    return "not_reproduced", "the bug code ran clean on this torch/device: it may have changed this behaviour"


def entry_ref(ref: CatalogRef) -> EntryRef:
    """A case module's plain catalog reference as the result models carry it."""
    return EntryRef(file=ref.file, id=ref.id)


def judge(case: Case, variant: Variant, raw: dict[str, Any], torch_version: str | None) -> CaseResult:
    """One :class:`CaseResult` from a raw worker result or a runner failure record."""
    common = {"case": case.name, "variant": variant.name, "summary": variant.summary, "why": case.why,
              "cuda_only": variant.cuda_only, "fix": variant.fix, "fix_diff": variant.diff,
              "torch_version": torch_version, "entry": entry_ref(case.entry_for(variant))}
    if "status" in raw:  # timeout / crashed before the worker could report
        return CaseResult(**common, status=raw["status"], reproduced=False, note=raw["detail"], fixed_ok=None,
                          device=None, seconds=None)
    status, note = _bug_status(case, variant, raw)
    bug, fixed = raw["bug"], raw["fix"]
    raised = bug["raised"] or {}
    fixed_ok = fixed["raised"] is None and not fixed["symptom"] and not any("exit" in r for r in fixed["ranks"])
    fixed_error = _error_text(fixed["raised"]) if fixed["raised"] else None
    if not fixed_ok and fixed_error is None:
        fixed_error = "the fixed run still showed the symptom: " + fixed["detail"]
    asked = raw.get("requested_device")
    device_note = (f"ran on {raw['process_group']}, not on {asked}: this case's ranks use gloo on CPU, so it shows "
                   "the failure's logic, not CUDA/NCCL behaviour" if raw.get("process_group") and asked != "cpu"
                   else None)
    return CaseResult(
        **common,
        status=status,
        reproduced=status == "reproduced",
        exception_type=raised.get("type"),
        message=raised.get("message"),
        raised_at=raised.get("raised_at"),
        raised_in=raised.get("function"),
        root_cause_rank=raised.get("rank"),
        observed=bug["detail"],
        note=note,
        fixed_ok=fixed_ok,
        fixed_detail=fixed["detail"],
        fixed_error=fixed_error,
        metrics=bug["metrics"],
        ranks=_rank_outcomes(bug["ranks"]),
        device=raw["device"],
        process_group=raw.get("process_group"),
        device_note=device_note,
        seconds=round(raw["bug_s"] + raw["fix_s"], 4),
    )
