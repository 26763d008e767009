"""fp16_overflow: NaN/inf loss, skipped steps and a collapsing loss scale with fp16 — no exception.

fp16 tops out at 65504. GradScaler skips ``optimizer.step()`` when it finds inf/NaN grads and halves
the scale. If the overflow is in the *forward* (activations of a bf16-pretrained model, or weights
driven large by a too-high LR), it recurs whatever the scale: every step is skipped, the params
freeze and the scale falls towards 0. ``model.half()`` + Adam without a scaler goes NaN at once
(Adam's eps=1e-8 is 0 in fp16). Nothing raises; the run reports the symptom it measured.
"""

from __future__ import annotations

import math

from .base import Case, CatalogRef, Observed, Variant

STEPS = 40

CASE = Case(
    name="fp16_overflow",
    title="fp16 overflow: NaN/inf loss, skipped steps, collapsing loss scale",
    why="Values above 65504 become inf in fp16; GradScaler skips every step whose grads are non-finite and "
        "halves the scale, so a forward-pass overflow freezes training while the scale collapses.",
    entry=CatalogRef(file="references/training/precision-stability.md", id="AMP-06"),
    variants=(
        Variant(
            name="act_overflow",
            summary="activations above 65504 in the forward (like a bf16-pretrained model) under "
                    "autocast(float16) + GradScaler",
            expect=None,
            fix="Train in bf16 (same exponent range as fp32): autocast(bfloat16) and no GradScaler.",
            diff="""\
-scaler = torch.amp.GradScaler(device)
-with torch.autocast(device, dtype=torch.float16):
+with torch.autocast(device, dtype=torch.bfloat16):
     loss = loss_fn(model(x), y)
-scaler.scale(loss).backward()
-scaler.step(opt)
-scaler.update()
+loss.backward()
+opt.step()""",
        ),
        Variant(
            name="diverge",
            summary="learning rate too high: the weights grow until fp16 activations overflow, then every "
                    "step is skipped",
            expect=None,
            fix="Lower the learning rate and clip the *unscaled* grads (scaler.unscale_ before clip_grad_norm_).",
            diff="""\
-opt = torch.optim.SGD(model.parameters(), lr=3.0)
+opt = torch.optim.SGD(model.parameters(), lr=0.05)
 scaler.scale(loss).backward()
+scaler.unscale_(opt)
+torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
 scaler.step(opt)
 scaler.update()""",
        ),
        Variant(
            name="pure_fp16_adam",
            summary="model.half() trained with Adam and no scaler (eps=1e-8 underflows to 0 in fp16)",
            expect=None,
            fix="Keep fp32 master weights: fp32 model, autocast(float16) and a GradScaler.",
            entry=CatalogRef(file="references/training/precision-stability.md", id="AMP-08"),
            diff="""\
-model = build_model().half()
+model = build_model()                        # fp32 master weights
 opt = torch.optim.Adam(model.parameters())
-loss = loss_fn(model(x.half()), y)
-loss.backward()
-opt.step()
+scaler = torch.amp.GradScaler(device)
+with torch.autocast(device, dtype=torch.float16):
+    loss = loss_fn(model(x), y)
+scaler.scale(loss).backward()
+scaler.step(opt)
+scaler.update()""",
        ),
    ),
)


def _big_activation_model(device: str):
    """Linear → ReLU → LayerNorm → Linear whose first-layer outputs reach ~1e5 (weights ×2e4, inputs ×10).

    Like a T5/bf16-pretrained FFN: fine in fp32/bf16 thanks to the norm, inf in fp16 before it.
    """
    import torch
    from torch import nn

    from . import toy

    toy.seed()
    model = nn.Sequential(nn.Linear(toy.IN, toy.HIDDEN), nn.ReLU(), nn.LayerNorm(toy.HIDDEN),
                          nn.Linear(toy.HIDDEN, toy.OUT)).to(device)
    with torch.no_grad():
        model[0].weight.mul_(2e4)  # |w| <= 5000: the weights fit in fp16
    return model


def _summary(losses: list[float], scales: list[float], skipped: int) -> Observed:
    nonfinite = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    finite = [v for v in losses if math.isfinite(v)]
    parts = [f"{len(losses)} steps"]
    if nonfinite:
        parts.append(f"loss non-finite from step {nonfinite[0]} ({len(nonfinite)}/{len(losses)} steps)")
    if finite:
        parts.append(f"finite loss {finite[0]:.4g} → {finite[-1]:.4g}")
    if scales:
        parts.append(f"{skipped}/{len(losses)} steps skipped by GradScaler, scale {scales[0]:g} → {scales[-1]:.3g}")
    metrics: dict[str, float | int | str] = {"steps": len(losses), "nonfinite_steps": len(nonfinite),
                                             "skipped_steps": skipped}
    if nonfinite:
        metrics["first_nonfinite_step"] = nonfinite[0]
    if finite:
        metrics["last_finite_loss"] = finite[-1]
    if scales:
        metrics["scale_start"], metrics["scale_end"] = scales[0], scales[-1]
    return Observed(symptom=bool(nonfinite) or skipped > len(losses) // 2, detail=", ".join(parts),
                    metrics=metrics)


def _scaled_loop(model, opt, device: str, *, dtype, scaled: bool, clip: bool = False, x_scale: float = 1.0) -> Observed:
    import torch

    from . import toy

    scaler = toy.scaler(device, enabled=scaled)
    x, y = toy.batch(device, scale=x_scale)
    losses: list[float] = []
    scales: list[float] = [scaler.get_scale()] if scaled else []
    skipped = 0
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype):
            loss = toy.mse(model(x), y)
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        if scaled:
            scales.append(scaler.get_scale())
            skipped += scales[-1] < scales[-2]
    return _summary(losses, scales, skipped)


def _pure_half(model, device: str) -> Observed:
    import torch

    from . import toy

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = toy.batch(device, dtype=torch.float16)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = toy.mse(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return _summary(losses, [], 0)


def _run(variant: str, device: str, fixed: bool) -> Observed:
    import torch

    from . import toy

    if variant == "pure_fp16_adam" and not fixed:
        return _pure_half(toy.mlp(device).half(), device)
    if variant == "act_overflow":  # fix: same model and optimizer, bf16 autocast without a scaler
        model = _big_activation_model(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return _scaled_loop(model, opt, device, dtype=torch.bfloat16 if fixed else torch.float16,
                            scaled=not fixed, x_scale=10.0)
    model = toy.mlp(device)
    if variant == "diverge":  # fix: lower LR and clip the unscaled grads
        opt = torch.optim.SGD(model.parameters(), lr=0.05 if fixed else 3.0)
        return _scaled_loop(model, opt, device, dtype=torch.float16, scaled=True, clip=fixed)
    # pure_fp16_adam fixed: fp32 master weights, fp16 autocast, GradScaler
    return _scaled_loop(model, torch.optim.Adam(model.parameters(), lr=1e-3), device, dtype=torch.float16,
                        scaled=True)


def bug(variant: str, device: str) -> Observed:
    return _run(variant, device, fixed=False)


def fix(variant: str, device: str) -> Observed:
    return _run(variant, device, fixed=True)
