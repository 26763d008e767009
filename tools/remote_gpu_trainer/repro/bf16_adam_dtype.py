"""bf16_adam_dtype: ``RuntimeError: expected dtype float for `end` but got dtype c10::BFloat16``.

Adam's ``exp_avg`` is created with the param's dtype (fp32); ``exp_avg.lerp_(grad, ...)`` needs the
grad in the same dtype. A bf16 grad on an fp32 param (FSDP ``keep_low_precision_grads=True`` sets
one through ``.grad.data``), or fp32 state after ``model.to(bfloat16)``, breaks that. It is a state
/ grad dtype mismatch, not a foreach bug: ``foreach=False`` raises the same text.

The foreach path (the default on CUDA) first groups params, grads and states by the params' device
and dtype and refuses a tensor of another dtype, with its own text (``FOREACH`` below), before any
``lerp_``. Which of the two texts a user sees depends on the release: torch 2.11 on CUDA refuses bf16
grads there (issue 27, H100); torch 2.13 lets bf16 through that check (it allows bf16 optimizer
states), so bf16 grads reach ``lerp_`` (reproduced on CPU), while fp16 grads still fail the
check (the ``fp16_grads_foreach`` variant, reproduced on CPU). Both texts are this failure.
"""

from __future__ import annotations

from .base import Case, CatalogRef, Expect, Observed, Variant

LERP = r"expected dtype \w+ for `end` but got dtype"
FOREACH = r"Tensors of the same index must be on the same device and the same dtype except `step` tensors"
EXPECT = Expect(("RuntimeError",), LERP)
EXPECT_FOREACH_PATH = Expect(("RuntimeError",), f"{LERP}|{FOREACH}")
"""A foreach optimizer meets the mismatch in its grouping check or in ``lerp_``, by torch release."""

_LOWPREC_DIFF = """\
 # FSDP(mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, keep_low_precision_grads=True))
 with torch.autocast(device, dtype=torch.bfloat16):
     loss = loss_fn(model(x), y)
 loss.backward()                               # p.grad is bf16, p and exp_avg are fp32
+for p in model.parameters():                  # or keep_low_precision_grads=False
+    p.grad = p.grad.to(p.dtype)
 opt.step()"""


CASE = Case(
    name="bf16_adam_dtype",
    title="expected dtype float for `end` but got dtype c10::BFloat16",
    why="Adam/AdamW state (exp_avg) has the param's dtype; lerp_ with a grad of another dtype fails. "
        "The grad and the optimizer state must share one dtype.",
    entry=CatalogRef(file="references/training/precision-stability.md", id="AMP-03"),
    variants=(
        Variant(
            name="lowprec_grads",
            summary="fp32 params with bf16 grads (what FSDP keep_low_precision_grads=True produces), "
                    "AdamW(foreach=True): the `end` text, or on torch 2.11 (CUDA) the foreach check's",
            expect=EXPECT_FOREACH_PATH,
            fix="Give the optimizer grads in the param dtype: keep_low_precision_grads=False, or cast "
                "p.grad to p.dtype before step().",
            diff=_LOWPREC_DIFF,
        ),
        Variant(
            name="lowprec_grads_single_tensor",
            summary="the same with AdamW(foreach=False): the single-tensor path raises the same error",
            expect=EXPECT,
            fix="Same fix; foreach=False does not help because the mismatch is in the data, not the kernel.",
            diff=_LOWPREC_DIFF,
        ),
        Variant(
            name="fp16_grads_foreach",
            summary="fp32 params with fp16 grads (FSDP param_dtype=float16, keep_low_precision_grads=True), "
                    "AdamW(foreach=True): refused by the foreach grouping check before any lerp_",
            expect=Expect(("RuntimeError",), FOREACH),
            fix="Give the optimizer grads in the param dtype: keep_low_precision_grads=False, or cast "
                "p.grad to p.dtype before step().",
            diff=_LOWPREC_DIFF.replace("bfloat16", "float16").replace("is bf16", "is fp16"),
        ),
        Variant(
            name="cast_after_state",
            summary="one AdamW step in fp32 (state created fp32), then model.to(torch.bfloat16) and train on",
            expect=EXPECT_FOREACH_PATH,
            fix="Cast the model before building the optimizer (or rebuild it / cast its state after a cast).",
            diff="""\
 model = build_model()
+model.to(torch.bfloat16)                      # cast first ...
 opt = torch.optim.AdamW(model.parameters())  # ... then build the optimizer
 train_one_step(model, opt)
-model.to(torch.bfloat16)                      # exp_avg stays fp32
 train_one_step(model, opt)""",
        ),
    ),
)


def _grad_dtype(variant: str):
    import torch

    return torch.float16 if variant == "fp16_grads_foreach" else torch.bfloat16


def _step(model, opt, device: str, lowprec_grads: bool, cast_back: bool = False, grad_dtype=None) -> float:
    import torch

    from . import toy

    x, y = toy.batch(device, dtype=next(model.parameters()).dtype)
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = toy.mse(model(x), y)
    loss.backward()
    for p in model.parameters():
        if lowprec_grads:  # the assignment FSDP makes (_flat_param.py), which bypasses autograd's dtype check
            p.grad.data = p.grad.data.to(grad_dtype or torch.bfloat16)
        if cast_back:
            p.grad = p.grad.to(p.dtype)
    opt.step()
    return loss.item()


def _observed(losses: list[float], model) -> Observed:
    from . import toy

    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    return Observed(detail=f"{len(losses)} AdamW steps, {toy.losses_summary(losses)}, params {'/'.join(dtypes)}",
                    metrics={"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]})


def bug(variant: str, device: str) -> Observed:
    import torch

    from . import toy

    model = toy.mlp(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=variant != "lowprec_grads_single_tensor")
    if variant == "cast_after_state":
        losses = [_step(model, opt, device, lowprec_grads=False)]
        model.to(torch.bfloat16)
        losses.append(_step(model, opt, device, lowprec_grads=False))
    else:
        losses = [_step(model, opt, device, lowprec_grads=True, grad_dtype=_grad_dtype(variant)) for _ in range(3)]
    return _observed(losses, model)


def fix(variant: str, device: str) -> Observed:
    import torch

    from . import toy

    model = toy.mlp(device)
    if variant == "cast_after_state":
        model.to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = [_step(model, opt, device, lowprec_grads=False) for _ in range(2)]
        return _observed(losses, model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=variant != "lowprec_grads_single_tensor")
    losses = [_step(model, opt, device, lowprec_grads=True, cast_back=True, grad_dtype=_grad_dtype(variant))
              for _ in range(3)]
    return _observed(losses, model)
