"""amp_config_check: predictions per setup, consistency with the repro cases, and confirm runs."""

from __future__ import annotations

import random
import typing

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.models import Verdict
from remote_gpu_trainer.repro import cases
from remote_gpu_trainer.repro.amp_check import AmpCheckInput, check, resolve
from remote_gpu_trainer.repro.tool import SPECS, amp_config_check
from remote_gpu_trainer.toolspec import no_progress

from .conftest import call_error, call_ok

# setup → {(repro case, variant, confidence)}; every rule fires in at least one row.
TABLE = [
    ({}, set()),
    ({"precision": "bf16"}, set()),
    ({"precision": "fp16"}, set()),
    ({"precision": "fp16", "clip_grad": "at_step", "grad_accum_steps": 8}, set()),
    ({"model_dtype": "fp16", "precision": "fp16"}, {("fp16_unscale", "half_model", "certain")}),
    ({"model_dtype": "fp16", "precision": "fp16", "lora": True, "clip_grad": "at_step"},
     {("fp16_unscale", "lora_clip", "certain")}),
    ({"model_dtype": "fp16", "trainable_dtype": "fp32", "precision": "fp16", "lora": True}, set()),
    ({"model_dtype": "fp16", "precision": "fp16", "optimizer": "adamw_fused"},
     {("fp16_unscale", "fused_adamw_clip", "likely")}),
    ({"model_dtype": "fp16", "precision": "fp16", "optimizer": "adamw_fused", "clip_grad": "at_step"},
     {("fp16_unscale", "fused_adamw_clip", "certain")}),
    ({"model_dtype": "bf16", "precision": "fp16", "lora": True},
     {("bf16_scaler", "bf16_lora_fp16_amp", "certain"), ("fp16_overflow", "act_overflow", "likely")}),
    ({"model_dtype": "bf16", "grad_scaler": "GradScaler"}, {("bf16_scaler", "bf16_model", "certain")}),
    ({"model_dtype": "bf16", "grad_scaler": "GradScaler", "device": "cpu"},
     {("bf16_scaler", "bf16_model", "possible")}),
    ({"model_dtype": "bf16", "precision": "bf16"}, set()),
    ({"fsdp": "fsdp1", "fsdp_param_dtype": "bf16", "keep_low_precision_grads": True, "precision": "bf16"},
     {("fsdp_ddp_double_wrap", "fsdp_lowprec_adam", "certain")}),
    ({"fsdp": "fsdp1", "fsdp_param_dtype": "bf16", "keep_low_precision_grads": True, "optimizer": "sgd"}, set()),
    ({"fsdp": "fsdp1", "fsdp_param_dtype": "bf16", "keep_low_precision_grads": True, "optimizer": "adam",
      "weight_decay": 0.01}, {("bf16_adam_dtype", None, "possible")}),
    ({"fsdp": "fsdp2", "fsdp_param_dtype": "bf16", "keep_low_precision_grads": True}, set()),
    ({"cast_after_optimizer": "bf16"}, {("bf16_adam_dtype", "cast_after_state", "certain")}),
    ({"model_dtype": "bf16", "cast_after_optimizer": "bf16"}, set()),
    ({"lora": True, "optimizer_created": "before_wrapping", "precision": "fp16"},
     {("no_inf_checks", "stale_optimizer", "certain")}),
    ({"fsdp": "fsdp1", "optimizer_created": "before_wrapping"},
     {("fsdp_ddp_double_wrap", "fsdp_opt_before_wrap", "certain")}),
    ({"any_trainable": False, "precision": "fp16", "inputs_require_grad": True},
     {("no_inf_checks", "all_frozen", "certain")}),
    ({"precision": "fp16", "clip_grad": "twice"}, {("double_unscale", "double_clip", "certain")}),
    ({"precision": "fp16", "clip_grad": "every_micro_step", "grad_accum_steps": 4},
     {("double_unscale", "grad_accum", "certain")}),
    ({"precision": "fp16", "clip_grad": "every_micro_step"}, set()),
    ({"precision": "fp16", "clip_grad": "at_step", "skip_on_nonfinite": True},
     {("double_unscale", "skip_update", "likely")}),
    ({"precision": "bf16", "clip_grad": "twice"}, set()),  # no scaler, no unscale_
    ({"precision": "fp16", "clip_grad": "before_unscale"}, {("double_unscale", "clip_before_unscale", "certain")}),
    ({"precision": "bf16", "clip_grad": "before_unscale"}, set()),
    ({"model_dtype": "fp16", "optimizer": "adam"}, {("fp16_overflow", "pure_fp16_adam", "certain")}),
    ({"precision": "fp16", "grad_scaler": "none"}, {("fp16_overflow", None, "possible")}),
    ({"fsdp": "fsdp1", "ddp_wrap": True}, {("fsdp_ddp_double_wrap", "ddp_over_fsdp", "certain")}),
    ({"fsdp": "fsdp1", "model_dtype": "fp16", "grad_scaler": "GradScaler"},
     {("fsdp_ddp_double_wrap", "fsdp_half_plain_scaler", "certain")}),
    ({"fsdp": "fsdp1", "fsdp_param_dtype": "fp16", "precision": "fp16"}, set()),  # auto: ShardedGradScaler
    ({"fsdp": "fsdp1", "fsdp_param_dtype": "fp16", "precision": "fp16", "grad_scaler": "GradScaler"},
     {("fsdp_ddp_double_wrap", "fsdp_empty_shard", "possible")}),
]


def _predicted(config: dict) -> set[tuple[str, str | None, str]]:
    result = check(AmpCheckInput(**config))
    return {(p.case, p.repro_variant, p.confidence) for p in result.predictions}


@pytest.mark.parametrize(("config", "expected"), TABLE, ids=[str(i) for i in range(len(TABLE))])
def test_predictions(config, expected):
    assert _predicted(config) == expected


def test_verdict_follows_the_strongest_prediction():
    assert check(AmpCheckInput()).verdict is Verdict.PASS
    assert check(AmpCheckInput(precision="fp16", clip_grad="twice")).verdict is Verdict.FAIL
    assert check(AmpCheckInput(precision="fp16", clip_grad="at_step", skip_on_nonfinite=True)).verdict is Verdict.WARN


def test_advice_for_settings_that_do_not_fail_by_themselves():
    ids = {a.entry.id for a in check(AmpCheckInput(precision="bf16", grad_scaler="GradScaler", lora=True,
                                                   gradient_checkpointing="reentrant")).advice}
    assert ids == {"AMP-04", "OOM-08"}
    assert not check(AmpCheckInput(lora=True, gradient_checkpointing="reentrant", inputs_require_grad=True)).advice
    fsdp2 = check(AmpCheckInput(fsdp="fsdp2", precision="fp16", grad_scaler="ShardedGradScaler"))
    assert [a.entry.id for a in fsdp2.advice] == ["AMP-07"]


def test_auto_scaler_matches_what_trainers_create():
    assert resolve(AmpCheckInput(precision="fp16")).scaler == "GradScaler"
    assert resolve(AmpCheckInput(precision="fp16", fsdp="fsdp1")).scaler == "ShardedGradScaler"
    assert resolve(AmpCheckInput(precision="bf16")).scaler == "none"
    lowprec = resolve(AmpCheckInput(fsdp="fsdp1", fsdp_param_dtype="fp16", keep_low_precision_grads=True))
    assert (lowprec.grad, lowprec.state) == ("fp16", "fp32")


def _random_configs(n: int, seed: int = 0) -> list[dict]:
    """Random setups over every enum/bool field, to prove no combination breaks a rule."""
    rng = random.Random(seed)
    choices = {}
    for name, field in AmpCheckInput.model_fields.items():
        if name in ("confirm", "timeout_s"):
            continue
        if field.annotation is bool:
            choices[name] = [False, True]
        elif typing.get_origin(field.annotation) is typing.Literal:
            choices[name] = list(typing.get_args(field.annotation))
    choices["grad_accum_steps"], choices["weight_decay"] = [1, 4], [0.0, 0.1]
    return [{k: rng.choice(v) for k, v in choices.items()} for _ in range(n)]


def test_every_prediction_points_at_a_real_variant_of_its_case():
    seen_variants = set()
    for config in _random_configs(3000):
        for p in check(AmpCheckInput(**config)).predictions:
            if p.repro_variant:
                case, variant = cases.find_variant(p.repro_variant)
                assert case.name == p.case
                ref = case.entry_for(variant)
                assert (p.entry.file, p.entry.id) == (ref.file, ref.id)
                seen_variants.add(p.repro_variant)
            assert p.fix and p.why and p.condition and p.entry.id
    # the rules reach most repro variants (the rest are CPU-only siblings or alternative shapes)
    assert len(seen_variants) >= 14, sorted(seen_variants)


def test_bad_input_names_the_field():
    spec = next(s for s in SPECS if s.name == "amp_config_check")
    with pytest.raises(InputError) as err:
        spec.validate({"precision": "fp8"})
    assert err.value.field == "precision" and "bf16" in str(err.value)
    with pytest.raises(InputError) as err:
        spec.validate({"grad_accum_steps": 0})
    assert err.value.field == "grad_accum_steps"


def test_confirm_runs_the_predicted_variants():
    result = amp_config_check(AmpCheckInput(model_dtype="bf16", precision="fp16", lora=True, clip_grad="twice",
                                            device="cpu", confirm=True), no_progress)
    assert result.torch_version
    by_variant = {c.variant: c for c in result.confirmations}
    assert set(by_variant) == {p.repro_variant for p in result.predictions}
    assert by_variant["double_clip"].status == "reproduced"
    assert "unscale_() has already been called" in by_variant["double_clip"].message
    assert by_variant["bf16_lora_fp16_amp"].status == "cuda_only"  # CPU here
    assert by_variant["act_overflow"].status == "reproduced"
    assert all(c.fixed_ok for c in result.confirmations)


@pytest.mark.anyio
async def test_mcp_amp_config_check(client):
    data = await call_ok(client, "amp_config_check", {"model_dtype": "fp16", "precision": "fp16", "lora": True})
    assert data["verdict"] == "FAIL"
    [p] = data["predictions"]
    assert (p["case"], p["repro_variant"]) == ("fp16_unscale", "lora_clip")
    assert p["entry"]["file"].startswith("references/")
    text = await call_error(client, "amp_config_check", {"fsdp": "fsdp3"})
    assert "fsdp" in text and "fsdp2" in text


def test_cli_amp_check(capsys):
    rc = cli.main(["amp-check", "--model-dtype", "fp16", "--precision", "fp16"])
    out = capsys.readouterr().out
    assert rc == 1 and "CERTAIN" in out and "fp16_unscale/half_model" in out
    assert cli.main(["amp-check", "--precision", "bf16"]) == 0
    assert "no known AMP failure predicted" in capsys.readouterr().out
