"""amp_config_check: predict which AMP failures a training setup will hit, before it runs.

The rules mirror torch's own conditions (documented per case module): which dtype the gradients
have when they reach the GradScaler and the optimizer, who calls ``unscale_`` how often, and how
FSDP/DDP are stacked. Each prediction names the repro variant that exercises the same condition,
so ``confirm=true`` can run it on this machine's torch through the repro worker.

Resolution first (:func:`resolve`): "auto" scaler = what HF Trainer / accelerate create (GradScaler
for fp16, ShardedGradScaler under FSDP1 fp16, none for bf16), and the grad dtype that results from
the param dtypes, FSDP flat params and ``keep_low_precision_grads``. Then every rule reads the
resolved setup and either predicts a failure or stays silent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from ..models import EntryRef, StrictModel, Verdict
from ..trainenv.find import ActivateText, PythonPath, TrainingEnv, activate_field, python_field
from . import cases
from .results import CaseResult, entry_ref

Dtype = Literal["fp32", "fp16", "bf16"]
Confidence = Literal["certain", "likely", "possible"]


class AmpCheckInput(StrictModel):
    model_dtype: Dtype = Field("fp32", description="dtype the model weights are loaded/kept in "
                                                   "(from_pretrained torch_dtype, model.half(), model.to(...))")
    trainable_dtype: Literal["same", "fp32", "fp16", "bf16"] = Field(
        "same", description="dtype of the params the optimizer trains (LoRA adapters, or the whole model); "
                            "'same' = model_dtype")
    precision: Literal["none", "fp16", "bf16"] = Field(
        "none", description="Mixed-precision mode: autocast dtype / Trainer fp16 or bf16 flag / accelerate "
                            "mixed_precision")
    grad_scaler: Literal["auto", "none", "GradScaler", "ShardedGradScaler"] = Field(
        "auto", description="Loss scaler in use; 'auto' = what HF Trainer/accelerate create (GradScaler for fp16, "
                            "ShardedGradScaler for fp16 under FSDP1, none for bf16)")
    clip_grad: Literal["none", "at_step", "every_micro_step", "twice", "before_unscale"] = Field(
        "none", description="Gradient clipping: once per optimizer step after scaler.unscale_ (at_step), on every "
                            "micro-step of gradient accumulation, twice (your code and the trainer/library both "
                            "unscale and clip), or on the still-scaled grads without scaler.unscale_ (before_unscale)")
    grad_accum_steps: int = Field(1, ge=1, le=100000, description="Gradient accumulation steps")
    skip_on_nonfinite: bool = Field(False, description="The loop skips scaler.step()/update() (e.g. `continue`) "
                                                       "when the grad norm is inf/NaN")
    gradient_checkpointing: Literal["off", "reentrant", "non_reentrant"] = Field(
        "off", description="Activation checkpointing mode (HF default use_reentrant=True is 'reentrant')")
    inputs_require_grad: bool = Field(False, description="enable_input_require_grads() was called (or the "
                                                         "embedding output requires grad)")
    lora: bool = Field(False, description="Base frozen, adapters trained (LoRA/peft-style)")
    any_trainable: bool = Field(True, description="At least one param has requires_grad=True")
    optimizer: Literal["adamw", "adam", "adamw_fused", "sgd", "other"] = Field(
        "adamw", description="torch optimizer (adamw_fused = AdamW(fused=True); 'other' = custom/8-bit)")
    weight_decay: float = Field(0.0, ge=0, le=10, description="Optimizer weight decay")
    optimizer_created: Literal["after_wrapping", "before_wrapping"] = Field(
        "after_wrapping", description="Whether the optimizer was built before or after LoRA/FSDP wrapping")
    cast_after_optimizer: Literal["none", "fp16", "bf16"] = Field(
        "none", description="Model cast to this dtype after the optimizer already had state (after a step, or "
                            "after loading an optimizer checkpoint)")
    fsdp: Literal["none", "fsdp1", "fsdp2"] = Field(
        "none", description="FSDP version: fsdp1 = FullyShardedDataParallel, fsdp2 = fully_shard")
    fsdp_param_dtype: Literal["none", "fp32", "fp16", "bf16"] = Field(
        "none", description="FSDP mixed-precision param_dtype (MixedPrecision / MixedPrecisionPolicy); "
                            "none = no FSDP mixed precision")
    keep_low_precision_grads: bool = Field(False, description="FSDP1 MixedPrecision(keep_low_precision_grads=True)")
    ddp_wrap: bool = Field(False, description="The model is (also) wrapped in DistributedDataParallel, by you or "
                                              "by a trainer/accelerate")
    device: Literal["cuda", "cpu"] = Field("cuda", description="Where the training runs (some errors are CUDA-only)")
    confirm: bool = Field(False, description="Run the matching repro variant of every prediction on this "
                                             "machine's torch (seconds; uses the repro worker)")
    timeout_s: float = Field(120.0, ge=1, le=1800, description="Per-variant time limit for confirm runs, seconds")
    python: PythonPath = python_field()
    activate: ActivateText = activate_field()


class Prediction(StrictModel):
    case: str = Field(description="repro_scaler_bug case holding repro_variant (else the failure class)")
    repro_variant: str | None = Field(description="Variant that exercises the same condition (confirm runs it); "
                                                  "null when no repro covers this exact shape")
    confidence: Confidence = Field(description="certain: fails on the first step; likely: fails under the stated "
                                               "common condition; possible: depends on data/scale")
    failure: str = Field(description="The error or symptom to expect")
    why: str
    condition: str = Field(description="When it triggers")
    fix: str
    entry: EntryRef


class Advice(StrictModel):
    """Not a failure this setup will hit, but a setting worth changing, with where to read more."""

    text: str
    entry: EntryRef


class ResolvedSetup(StrictModel):
    trainable_dtype: Dtype
    scaler: Literal["none", "GradScaler", "ShardedGradScaler"]
    grad_dtype: Dtype = Field(description="dtype of the gradients the scaler and optimizer see")
    optimizer_state_dtype: Dtype = Field(description="dtype of Adam's exp_avg (created like the param)")


class AmpCheckResult(StrictModel):
    verdict: Verdict = Field(description="FAIL: a certain failure; WARN: likely/possible ones; PASS: none predicted")
    resolved: ResolvedSetup
    predictions: list[Prediction]
    advice: list[Advice] = Field(description="Settings worth changing that do not fail by themselves")
    notes: list[str]
    confirmations: list[CaseResult] = Field(default_factory=list, description="repro_scaler_bug results for "
                                                                           "the predicted variants (confirm=true)")
    torch_version: str | None = None
    torch_missing: str | None = Field(None, description="confirm=true could not run because torch does not import "
                                                        "here: why, and how to add it (confirmations are not_run)")
    training_env: TrainingEnv | None = Field(None, description="confirm=true: the interpreter the variants ran "
                                             "under and how it was found")


@dataclass(frozen=True)
class Setup:
    """The input plus the resolved facts the rules need."""

    cfg: AmpCheckInput
    trainable: str
    scaler: str
    grad: str
    state: str


def resolve(cfg: AmpCheckInput) -> Setup:
    trainable = cfg.model_dtype if cfg.trainable_dtype == "same" else cfg.trainable_dtype
    if cfg.grad_scaler != "auto":
        scaler = cfg.grad_scaler
    elif cfg.precision == "fp16":
        scaler = "ShardedGradScaler" if cfg.fsdp == "fsdp1" else "GradScaler"
    else:
        scaler = "none"
    grad = trainable  # autograd gives a param a grad of its own dtype ...
    lowprec = cfg.fsdp == "fsdp1" and cfg.keep_low_precision_grads and cfg.fsdp_param_dtype in ("fp16", "bf16")
    if lowprec and trainable == "fp32":
        grad = cfg.fsdp_param_dtype  # ... except FSDP1 keep_low_precision_grads, which sets it through .data
    state = trainable  # Adam's exp_avg is created like the param, at the first step
    if cfg.cast_after_optimizer != "none":
        trainable = grad = cfg.cast_after_optimizer
    return Setup(cfg=cfg, trainable=trainable, scaler=scaler, grad=grad, state=state)


def _predict(failure: str, variant: str | None, confidence: Confidence, why: str, condition: str,
             fix: str | None = None, failure_text: str | None = None) -> Prediction:
    """A prediction of failure class ``failure``; ``variant`` may live in another case (the FSDP ones do)."""
    failure_class = cases.case(failure)
    repro_case, chosen = cases.find_variant(variant) if variant else (failure_class, None)
    return Prediction(case=repro_case.name, repro_variant=variant, confidence=confidence,
                      failure=failure_text or failure_class.title, why=why, condition=condition,
                      fix=fix or (chosen.fix if chosen else failure_class.default.fix),
                      entry=entry_ref(repro_case.entry_for(chosen) if chosen else failure_class.entry))


def _fp16_unscale(s: Setup) -> Prediction | None:
    c = s.cfg
    if s.scaler != "GradScaler" or s.grad != "fp16":
        return None
    why = (f"trainable params are {s.trainable}, so their grads are fp16, and torch.amp.GradScaler refuses to "
           "unscale fp16 grads")
    if c.fsdp == "fsdp1":
        return _predict("fp16_unscale", "fsdp_half_plain_scaler", "certain", why + " (FSDP1 flat params too)",
                        "first scaler.step()/unscale_()")
    if c.optimizer == "adamw_fused" and c.clip_grad == "none":
        return _predict("fp16_unscale", "fused_adamw_clip", "likely",
                        why + "; fused AdamW's own fp16 path hides it until unscale_() is called",
                        "as soon as gradient clipping (scaler.unscale_) is added")
    variant = "lora_clip" if c.lora else ("fused_adamw_clip" if c.optimizer == "adamw_fused" else "half_model")
    return _predict("fp16_unscale", variant, "certain", why, "first scaler.step() or scaler.unscale_()")


def _bf16_scaler(s: Setup) -> Prediction | None:
    if s.scaler == "none" or s.grad != "bf16":
        return None
    variant = "bf16_lora_fp16_amp" if s.cfg.lora or s.cfg.precision == "fp16" else "bf16_model"
    if s.cfg.device == "cpu":
        return _predict("bf16_scaler", variant, "possible",
                        f"bf16 grads reach a {s.scaler}; the CPU kernel accepts them, so this runs on CPU but "
                        "does nothing useful (bf16 needs no loss scaling)",
                        "raises as soon as the same code runs on CUDA")
    return _predict("bf16_scaler", variant, "certain" if s.scaler == "GradScaler" else "likely",
                    f"bf16 grads reach a {s.scaler}, whose CUDA inf-check kernel has no BFloat16 implementation",
                    "first scaler.step()/unscale_() on CUDA")


def _bf16_adam_dtype(s: Setup) -> Prediction | None:
    c = s.cfg
    if c.optimizer not in ("adam", "adamw", "adamw_fused") or s.grad == s.state:
        return None
    if c.optimizer == "adam" and c.weight_decay > 0:
        return _predict("bf16_adam_dtype", None, "possible",
                        "grad and Adam state dtypes differ, but Adam's coupled weight decay (grad + wd*param) "
                        "promotes the grad to fp32 and masks the error",
                        "raises once weight_decay is 0 or the optimizer becomes AdamW")
    if c.cast_after_optimizer != "none":
        return _predict("bf16_adam_dtype", "cast_after_state", "certain",
                        f"the model was cast to {c.cast_after_optimizer} after Adam created {s.state} state (exp_avg)",
                        "first optimizer.step() after the cast")
    variant = "fsdp_lowprec_adam" if c.fsdp == "fsdp1" else "lowprec_grads"
    return _predict("bf16_adam_dtype", variant, "certain",
                    f"keep_low_precision_grads leaves {s.grad} grads on {s.state} params; stock Adam/AdamW state is "
                    f"{s.state}, so exp_avg.lerp_(grad) fails", "first optimizer.step()")


def _no_inf_checks(s: Setup) -> Prediction | None:
    c = s.cfg
    if c.optimizer_created == "before_wrapping" and (c.lora or c.fsdp != "none"):
        variant = "fsdp_opt_before_wrap" if c.fsdp == "fsdp1" else "stale_optimizer"
        wrapper = "FSDP replaced the params with flat/sharded ones" if c.fsdp != "none" else \
            "LoRA wrapping froze the base params and added new adapter params"
        confidence: Confidence = "likely" if c.fsdp == "fsdp2" else "certain"
        why = f"the optimizer was built before wrapping: {wrapper}, so none of its params get grads"
        if s.scaler == "none":
            return _predict("no_inf_checks", variant, confidence, why + "; optimizer.step() updates nothing",
                            "silently from the first step: the loss never changes",
                            failure_text="training updates nothing (with a GradScaler: No inf checks were recorded "
                                    "for this optimizer)")
        return _predict("no_inf_checks", variant, confidence, why, "first scaler.step()")
    if s.scaler == "none":
        return None
    if not c.any_trainable:
        why = "no param requires grad, so no param in the optimizer gets a .grad"
        if not c.inputs_require_grad:
            why += ("; without inputs that require grad the backward fails even earlier ('element 0 of tensors "
                    "does not require grad and does not have a grad_fn')")
        return _predict("no_inf_checks", "all_frozen", "certain", why, "first scaler.step()")
    if c.fsdp == "fsdp1" and s.scaler == "GradScaler" and s.grad != "fp16":  # fp16 grads: fp16_unscale says it
        return _predict("no_inf_checks", "fsdp_empty_shard", "possible",
                        "a plain GradScaler under FSDP1 checks only the local shard: a rank whose shard of an "
                        "optimizer's params is empty records no inf check, and ranks can disagree on skipping a step",
                        "an FSDP unit/optimizer with fewer elements than ranks, or an overflow in one rank's shard",
                        fix="Use ShardedGradScaler with FSDP1 (it all-reduces found_inf and seeds it on ranks "
                            "without grads).")
    return None


def _double_unscale(s: Setup) -> Prediction | None:
    c = s.cfg
    if s.scaler == "none":
        return None
    if c.clip_grad == "before_unscale":
        return _predict("double_unscale", "clip_before_unscale", "certain",
                        "the grads are still multiplied by the loss scale (65536 at start) when clipped, so the real "
                        "threshold is max_norm / scale and every step is clipped to almost nothing",
                        "every step, silently: clip_grad_norm_ returns norms ~65536x the fp32 ones and the loss "
                        "barely moves", failure_text="clipping scaled gradients (no error: training crawls)")
    if c.clip_grad == "twice":
        return _predict("double_unscale", "double_clip", "certain",
                        "two clipping sites each call scaler.unscale_() before one update()",
                        "first optimizer step")
    if c.clip_grad == "every_micro_step" and c.grad_accum_steps > 1:
        return _predict("double_unscale", "grad_accum", "certain",
                        f"unscale_() runs on each of {c.grad_accum_steps} micro-steps but update() once per step",
                        "second micro-step of the first accumulation window")
    if c.skip_on_nonfinite and c.clip_grad != "none":
        return _predict("double_unscale", "skip_update", "likely",
                        "skipping scaler.step()/update() after unscale_() leaves the optimizer in the UNSCALED "
                        "stage; the next unscale_() raises",
                        "the first step with a non-finite grad norm (common while the scale calibrates)")
    return None


def _fp16_overflow(s: Setup) -> Prediction | None:
    c = s.cfg
    if c.precision == "fp16" and c.model_dtype == "bf16":
        return _predict("fp16_overflow", "act_overflow", "likely",
                        "bf16-pretrained weights/activations routinely exceed fp16's 65504; the overflow is in the "
                        "forward, so the scaler skips every step and the scale collapses",
                        "first steps: NaN/inf loss, scaler.get_scale() halving every step")
    if s.trainable == "fp16" and s.scaler == "none" and c.optimizer in ("adam", "adamw", "adamw_fused"):
        return _predict("fp16_overflow", "pure_fp16_adam", "certain",
                        "fp16 params trained by Adam without fp32 master weights: eps=1e-8 is 0 in fp16 and tiny "
                        "second moments divide by zero", "NaN loss within the first steps")
    if c.precision == "fp16" and s.scaler == "none":
        return _predict("fp16_overflow", None, "possible",
                        "fp16 autocast without loss scaling: small gradients underflow to zero and large ones "
                        "overflow with nothing to skip the step", "silently slower or diverging training",
                        fix="Use a GradScaler with fp16 autocast, or switch to bf16 (no scaler needed).")
    return None


def _double_wrap(s: Setup) -> Prediction | None:
    if s.cfg.ddp_wrap and s.cfg.fsdp != "none":
        return _predict("fsdp_ddp_double_wrap", "ddp_over_fsdp", "certain",
                        "DDP on top of FSDP sees a different shard on each rank", "DDP construction or the first "
                        "backward")
    return None


RULES: tuple[Callable[[Setup], Prediction | None], ...] = (
    _double_wrap, _fp16_unscale, _bf16_scaler, _bf16_adam_dtype, _no_inf_checks, _double_unscale, _fp16_overflow,
)


def _advice(s: Setup) -> list[Advice]:
    c = s.cfg
    advice = []
    if c.precision == "bf16" and s.scaler != "none":
        advice.append(Advice(text="bf16 has fp32's exponent range: the loss scaler does nothing useful with bf16 "
                                  "(and with bf16 grads it fails on CUDA); drop it.",
                             entry=EntryRef(file="references/training/precision-stability.md", id="AMP-04")))
    if c.gradient_checkpointing == "reentrant" and c.lora and not c.inputs_require_grad:
        advice.append(Advice(text="Reentrant checkpointing with a frozen base: adapters inside checkpointed blocks "
                                  "get no grads unless the inputs require grad (enable_input_require_grads(), or "
                                  "use_reentrant=False); if nothing else trains, backward fails with 'element 0 of "
                                  "tensors does not require grad'.",
                             entry=EntryRef(file="references/training/oom-memory.md", id="OOM-08")))
    if c.fsdp == "fsdp2" and s.scaler == "ShardedGradScaler":
        advice.append(Advice(text="ShardedGradScaler is the FSDP1 scaler; with FSDP2 (fully_shard) and fp32 params "
                                  "use the regular torch.amp.GradScaler.",
                             entry=EntryRef(file="references/training/precision-stability.md", id="AMP-07")))
    if c.optimizer == "other" and s.grad != s.state:
        advice.append(Advice(text="Grads and optimizer state differ in dtype: fine only for an optimizer built for "
                                  "low-precision grads (what keep_low_precision_grads is for); stock Adam/AdamW "
                                  "fail.",
                             entry=EntryRef(file="references/training/distributed-launch.md", id="DIST-23")))
    return advice


def check(cfg: AmpCheckInput) -> AmpCheckResult:
    """Predictions only (no torch, no subprocess); ``confirm`` is handled by the tool."""
    s = resolve(cfg)
    predictions = [p for p in (rule(s) for rule in RULES) if p is not None]
    if any(p.confidence == "certain" for p in predictions):
        verdict = Verdict.FAIL
    elif predictions:
        verdict = Verdict.WARN
    else:
        verdict = Verdict.PASS
    resolved = ResolvedSetup(trainable_dtype=s.trainable, scaler=s.scaler, grad_dtype=s.grad,
                             optimizer_state_dtype=s.state)
    return AmpCheckResult(verdict=verdict, resolved=resolved, predictions=predictions, advice=_advice(s), notes=[])
