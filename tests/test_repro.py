"""repro_scaler_bug: every variant reproduces torch's exact failure on CPU and every fix runs clean.

All variants run once, in one worker, through the real tool function (module fixture); the tests
below read that one report. The expected texts live here only: the tool reports torch's own text.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
from mcp import Client

from remote_gpu_trainer import cli
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.repro import cases
from remote_gpu_trainer.repro.runner import Job, run_jobs
from remote_gpu_trainer.repro.tool import SPECS, ReproInput, plan, render_case, repro
from remote_gpu_trainer.repro.worker import TEST_HOOKS_ENV, _test_hook
from remote_gpu_trainer.toolspec import no_progress

from .conftest import call_error, call_ok

FP16 = ("ValueError", "Attempting to unscale FP16 gradients.", "torch/amp/grad_scaler.py")
NO_INF = ("AssertionError", "No inf checks were recorded for this optimizer.", "torch/amp/grad_scaler.py")
LERP = ("RuntimeError", "expected dtype float for `end` but got dtype c10::BFloat16", "torch/optim/adam.py")
TWICE = ("RuntimeError", "unscale_() has already been called on this optimizer since the last update().",
         "torch/amp/grad_scaler.py")
FOREACH = ("RuntimeError", "Tensors of the same index must be on the same device and the same dtype except `step`",
           "torch/utils/_foreach_utils.py")
EXPECTED = {
    "lora_clip": FP16, "half_model": FP16, "fused_adamw_clip": FP16,
    "stale_optimizer": NO_INF, "all_frozen": NO_INF,
    "lowprec_grads": LERP, "lowprec_grads_single_tensor": LERP, "cast_after_state": LERP,
    "fp16_grads_foreach": FOREACH,
    "complex_grads": ("NotImplementedError",
                      "\"_amp_foreach_non_finite_check_and_unscale_cpu\" not implemented for 'ComplexFloat'",
                      "torch/amp/grad_scaler.py"),
    "double_clip": TWICE, "grad_accum": TWICE, "skip_update": TWICE,
    "ddp_over_fsdp": ("RuntimeError", "appears not to match sizes of the same param in process 0",
                      "torch/distributed/utils.py"),
    "ddp_over_fsdp_flat": ("RuntimeError", "Function SplitWithSizesBackward0 returned an invalid gradient at index 0",
                           "torch/autograd/graph.py"),
    "fsdp_half_plain_scaler": FP16, "fsdp_empty_shard": NO_INF, "fsdp_lowprec_adam": LERP,
    "fsdp_opt_before_wrap": NO_INF,
}
CUDA_ONLY = {"bf16_model", "bf16_lora_fp16_amp"}
OVERFLOW = {"act_overflow", "diverge", "pure_fp16_adam"}
SYMPTOM = OVERFLOW | {"clip_before_unscale"}
CUDA_BF16_TEXT = "\"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'"

# What the torch source line that raised must contain (checked in the installed torch's file).
SOURCE_HINTS = {
    "torch/amp/grad_scaler.py": ("raise", "assert", "_amp_foreach_non_finite_check_and_unscale_"),
    "torch/optim/adam.py": ("lerp",),
    "torch/distributed/utils.py": ("_verify_params_across_processes",),
    "torch/autograd/graph.py": ("run_backward",),
    "torch/utils/_foreach_utils.py": ("_group_tensors_by_device_and_dtype",),
}
# Foreach variants whose text depends on the release: torch 2.11 on CUDA refuses bf16 grads in the
# foreach grouping check (issue 27, H100); torch 2.13 lets bf16 through to lerp_.
EITHER_ON_CUDA = {"lowprec_grads": FOREACH, "cast_after_state": FOREACH}


@pytest.fixture(scope="module")
def report():
    return repro(ReproInput(case="all", variant="all", device="cpu"), no_progress)


@pytest.fixture(scope="module")
def by_variant(report):
    return {r.variant: r for r in report.results}


def test_every_variant_is_covered_by_these_tests():
    assert set(EXPECTED) | CUDA_ONLY | SYMPTOM == set(cases.variant_names())
    assert len(cases.variant_names()) == len(set(cases.variant_names())), "variant names must be unique"


def test_report_header(report):
    assert report.torch_version and report.torch_version.split("+")[0].count(".") == 2
    assert report.device == "cpu"
    assert report.problems == 0, [(r.variant, r.status, r.note, r.fixed_error) for r in report.results
                                  if r.status != "reproduced"]
    assert report.reproduced == len(EXPECTED) + len(SYMPTOM)
    assert report.cuda_only == len(CUDA_ONLY)
    assert report.fixed_ok == len(report.results)


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_exception_variants_reproduce_exactly(by_variant, variant):
    r = by_variant[variant]
    exc_type, text, torch_file = EXPECTED[variant]
    assert r.status == "reproduced" and r.reproduced, (r.status, r.message, r.note)
    assert r.exception_type == exc_type
    assert text in r.message
    assert r.raised_at.startswith(torch_file + ":"), r.raised_at
    assert r.raised_in
    assert r.fixed_ok, r.fixed_error
    assert r.torch_version and r.seconds is not None and r.seconds >= 0


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_reported_frame_is_a_real_torch_line(by_variant, variant):
    r = by_variant[variant]
    path, line = r.raised_at.rsplit(":", 1)
    torch_parent = Path(importlib.util.find_spec("torch").origin).parents[1]
    source = (torch_parent / path).read_text().splitlines()
    window = " ".join(source[int(line) - 1:int(line) + 2])
    assert any(hint in window for hint in SOURCE_HINTS[path]), (r.raised_at, window)


@pytest.mark.parametrize("variant", sorted(CUDA_ONLY))
def test_bf16_scaler_is_cuda_only_on_cpu(by_variant, variant):
    r = by_variant[variant]
    assert r.status == "cuda_only" and r.cuda_only and not r.reproduced
    assert r.message is None and r.exception_type is None
    assert CUDA_BF16_TEXT in r.note and "CPU" in r.note
    assert "bfloat16 grads" in r.observed  # the bf16 grads really reached the scaler
    assert r.fixed_ok


@pytest.mark.parametrize("variant", sorted(OVERFLOW))
def test_fp16_overflow_shows_nonfinite_loss_and_skipped_steps(by_variant, variant):
    r = by_variant[variant]
    assert r.status == "reproduced" and r.exception_type is None
    assert r.metrics["nonfinite_steps"] > 0
    if variant != "pure_fp16_adam":  # the scaler variants: skipped steps and a collapsing scale
        assert r.metrics["skipped_steps"] > r.metrics["steps"] // 2
        assert r.metrics["scale_end"] < 1e-3 * r.metrics["scale_start"]
    assert r.fixed_ok and "non-finite" not in r.fixed_detail


def test_clipping_scaled_grads_is_measured_not_asserted(by_variant):
    r = by_variant["clip_before_unscale"]
    assert r.status == "reproduced" and r.exception_type is None
    assert r.metrics["clip_saw_norm"] / r.metrics["true_norm"] == pytest.approx(65536, rel=1e-3)
    assert r.metrics["last_loss"] > 0.99 * r.metrics["first_loss"]  # the bug: SGD barely moves
    assert r.fixed_ok and "(true norm" in r.fixed_detail and ", 1x)" in r.fixed_detail


def test_act_overflow_skips_every_step(by_variant):
    m = by_variant["act_overflow"].metrics
    assert m["skipped_steps"] == m["steps"] == m["nonfinite_steps"]
    assert m["scale_end"] == m["scale_start"] * 0.5 ** m["steps"]


def test_distributed_case_reports_each_rank(by_variant):
    r = by_variant["ddp_over_fsdp"]
    assert r.device == "cpu" and len(r.ranks) == 2
    assert r.root_cause_rank == 1  # rank 0 passes DDP's check and dies in the next collective
    assert not r.ranks[1].ok and r.ranks[1].message == r.message
    empty = by_variant["fsdp_empty_shard"]
    assert empty.root_cause_rank == 1 and empty.ranks[1].exception_type == "AssertionError"
    assert all(rank.ok is False for rank in by_variant["fsdp_opt_before_wrap"].ranks)


def test_each_result_points_to_a_catalog_entry_and_diff(report):
    for r in report.results:
        assert r.entry.file.startswith("references/") and r.entry.id
        assert any(line.startswith(("-", "+")) for line in r.fix_diff.splitlines()), r.variant


def test_plan_validates_variants():
    assert [v.name for _, v in plan("all", None)] == [c.default.name for c in cases.all_cases()]
    assert [v.name for _, v in plan("double_unscale", "all")] == ["double_clip", "grad_accum", "skip_update",
                                                                  "clip_before_unscale"]
    with pytest.raises(InputError) as err:
        plan("fp16_unscale", "grad_accum")
    assert err.value.field == "variant" and "half_model" in err.value.allowed
    with pytest.raises(InputError):
        plan("all", "grad_accum")


def test_hidden_test_cases_are_not_in_the_input_model():
    with pytest.raises(InputError) as err:
        SPECS[0].validate({"case": "_hang"})
    assert err.value.field == "case"
    assert "_hang" not in json.dumps(ReproInput.model_json_schema())


def test_hung_and_crashed_cases_are_killed_and_the_rest_still_run():
    start = time.monotonic()
    run = run_jobs([Job("_hang", "x"), Job("_crash", "x"), Job("fp16_unscale", "half_model")], device="cpu",
                   timeout_s=2, extra_env={TEST_HOOKS_ENV: "1"})
    elapsed = time.monotonic() - start
    hung, crashed, good = run.results
    assert hung["status"] == "timeout" and "killed after 2 s" in hung["detail"]
    assert crashed["status"] == "crashed" and "SIGSEGV" in crashed["detail"]
    assert good["bug"]["raised"]["type"] == "ValueError" and good["fix"]["raised"] is None
    assert run.workers == 3
    assert elapsed < 90  # generous: three torch imports on a busy box; a missed kill would hang far longer


def test_hooks_are_off_without_the_env_var(monkeypatch):
    monkeypatch.delenv(TEST_HOOKS_ENV, raising=False)
    assert _test_hook("_hang") is None and _test_hook("_crash") is None
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    assert _test_hook("_hang") is not None and _test_hook("fp16_unscale") is None


@pytest.mark.anyio
async def test_mcp_call_returns_structured_result_and_progress(server):
    seen = []

    async def on_progress(progress, total, message):
        seen.append(message)

    async with Client(server, mode="legacy") as client:  # one mode: each call starts a torch worker
        result = await client.call_tool("repro_scaler_bug", {"case": "double_unscale", "variant": "grad_accum",
                                                             "device": "cpu", "timeout_s": 60},
                                        progress_callback=on_progress)
    assert not result.is_error
    data = result.structured_content
    [r] = data["results"]
    assert r["status"] == "reproduced" and r["fixed_ok"] is True
    assert "unscale_() has already been called" in r["message"]
    assert any("double_unscale/grad_accum" in (m or "") for m in seen)


@pytest.mark.anyio
async def test_mcp_bad_variant_names_the_field_and_allowed_values(client):
    text = await call_error(client, "repro_scaler_bug", {"case": "fp16_unscale", "variant": "grad_accum"})
    assert "variant" in text and "lora_clip" in text and "all" in text
    text = await call_error(client, "repro_scaler_bug", {"case": "fp17_unscale"})
    assert "case" in text and "fp16_unscale" in text


@pytest.mark.anyio
async def test_mcp_timeout_bounds(client):
    text = await call_error(client, "repro_scaler_bug", {"case": "all", "timeout_s": 0})
    assert "timeout_s" in text
    data = await call_ok(client, "skill_info")
    assert "repro_scaler_bug" in data["tools"] and "amp_config_check" in data["tools"]


def test_cli_repro_prints_the_real_error_and_diff(capsys):
    rc = cli.main(["repro", "fp16_unscale", "--variant", "half_model", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Attempting to unscale FP16 gradients." in out and "torch/amp/grad_scaler.py:" in out
    assert "+model = build_model()" in out


def test_cuda_request_runs_on_cuda_or_is_an_input_error():
    try:
        report = repro(ReproInput(case="fp16_unscale", device="cuda"), no_progress)
    except InputError as err:  # no CUDA here: the error names the field and what works instead
        assert err.field == "device" and "cpu" in err.allowed and "cuda" in err.message
    else:
        assert report.device == "cuda" and report.results[0].reproduced


@pytest.mark.gpu
def test_all_variants_on_cuda():
    report = repro(ReproInput(case="all", variant="all", device="cuda"), no_progress)
    results = {r.variant: r for r in report.results}
    assert report.device == "cuda"
    for variant in CUDA_ONLY:
        r = results[variant]
        assert r.status == "reproduced" and r.device == "cuda", (r.status, r.note)
        assert r.exception_type in ("NotImplementedError", "RuntimeError")
        assert CUDA_BF16_TEXT in r.message
        assert r.raised_at.startswith("torch/amp/grad_scaler.py:")
        assert r.fixed_ok, r.fixed_error
    for variant, (exc_type, text, _) in EXPECTED.items():
        r = results[variant]
        text = text.replace("_cpu\"", "_cuda\"") if r.device == "cuda" else text
        texts = [text, EITHER_ON_CUDA[variant][1]] if variant in EITHER_ON_CUDA else [text]
        assert r.status == "reproduced" and r.exception_type == exc_type, (variant, r.status, r.message)
        assert any(t in r.message for t in texts), (variant, r.message)
        assert r.fixed_ok, (variant, r.fixed_error)
    for variant in SYMPTOM:
        assert results[variant].status == "reproduced" and results[variant].fixed_ok
    for r in report.results:  # the gloo cases never touch the GPU, and say so
        if r.case == "fsdp_ddp_double_wrap":
            assert r.device == "cpu" and "not on cuda" in r.device_note


def test_distributed_cases_say_they_ran_on_gloo_and_cpu(by_variant):
    r = by_variant["ddp_over_fsdp"]
    assert r.process_group == "gloo, 2 ranks on CPU" and r.device == "cpu" and r.device_note is None
    assert by_variant["lowprec_grads"].process_group is None


def test_a_distributed_case_asked_for_cuda_says_it_ran_on_cpu(by_variant):
    """device='cuda' reaches the single-process cases; the gloo ranks stay on CPU, and the result says so."""
    from remote_gpu_trainer.repro.results import judge

    case = cases.case("fsdp_ddp_double_wrap")
    variant = next(v for v in case.variants if v.name == "ddp_over_fsdp")
    r = by_variant["ddp_over_fsdp"]
    outcome = {"raised": {"type": r.exception_type, "message": r.message, "raised_at": r.raised_at,
                          "function": r.raised_in, "rank": r.root_cause_rank},
               "symptom": False, "detail": r.observed, "metrics": {}, "ranks": []}
    clean = {"raised": None, "symptom": False, "detail": "ok", "metrics": {}, "ranks": []}
    raw = {"case": case.name, "variant": variant.name, "device": "cpu", "requested_device": "cuda",
           "process_group": "gloo, 2 ranks on CPU", "bug": outcome, "bug_s": 1.0, "fix": clean, "fix_s": 1.0}
    result = judge(case, variant, raw, "2.13.0+cpu")
    assert result.status == "reproduced" and result.device == "cpu"
    assert "not on cuda" in result.device_note and "gloo" in result.device_note
    assert "ran on:  ran on gloo, 2 ranks on CPU, not on cuda" in render_case(result)
