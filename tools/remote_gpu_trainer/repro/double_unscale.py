"""double_unscale: ``RuntimeError: unscale_() has already been called on this optimizer since the last update().``

GradScaler keeps a per-optimizer stage (READY → UNSCALED → STEPPED); only ``update()`` resets it.
(``clip_before_unscale`` is the silent opposite: no ``unscale_`` at all before clipping.)
A second ``unscale_()`` before ``update()`` would divide the grads by the scale twice, so it raises.
It happens with two clipping sites (user code and a trainer/accelerate), with clipping on every
micro-step of gradient accumulation, and when a loop ``continue``s past step/update after a
non-finite grad norm.
"""

from __future__ import annotations

from .base import Case, CatalogRef, Expect, Observed, Variant

EXPECT = Expect(("RuntimeError",), r"unscale_\(\) has already been called on this optimizer since the last update")

CASE = Case(
    name="double_unscale",
    title="unscale_() has already been called on this optimizer since the last update()",
    why="Only scaler.update() resets the per-optimizer UNSCALED stage, so two unscale_() calls per optimizer "
        "step (two clipping sites, clipping every micro-step, or skipping update()) raise.",
    entry=CatalogRef(file="references/training/precision-stability.md", id="AMP-05"),
    variants=(
        Variant(
            name="double_clip",
            summary="the user unscales and clips, then a trainer/library helper unscales and clips again",
            expect=EXPECT,
            fix="Clip in exactly one place per optimizer step (leave it to the trainer, or do it yourself "
                "and turn the trainer's off).",
            diff="""\
 scaler.scale(loss).backward()
-scaler.unscale_(opt)
-torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
 trainer_clip_grad_norm(model, opt, scaler, 1.0)   # unscale_ + clip inside the library
 scaler.step(opt)
 scaler.update()""",
        ),
        Variant(
            name="grad_accum",
            summary="gradient accumulation over 4 micro-steps with unscale_ + clipping on every micro-step",
            expect=EXPECT,
            fix="Unscale and clip once, at the accumulation boundary, right before scaler.step() "
                "(with accelerate: only when accelerator.sync_gradients).",
            diff="""\
 for i, (x, y) in enumerate(loader):
     scaler.scale(loss_fn(model(x), y) / accum).backward()
-    scaler.unscale_(opt)
-    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
     if (i + 1) % accum == 0:
+        scaler.unscale_(opt)
+        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
         scaler.step(opt)
         scaler.update()
         opt.zero_grad()""",
        ),
        Variant(
            name="skip_update",
            summary="the loop `continue`s past scaler.step/update when the grad norm is non-finite; the next "
                    "unscale_ raises",
            expect=EXPECT,
            fix="Always call scaler.step() and scaler.update(): the scaler already skips the optimizer step "
                "on inf/NaN grads and lowers the scale.",
            diff="""\
 scaler.scale(loss).backward()
 scaler.unscale_(opt)
 norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
-if not torch.isfinite(norm):
-    opt.zero_grad()
-    continue                                  # stage stays UNSCALED
 scaler.step(opt)                              # skips the step itself on inf/NaN
 scaler.update()                               # and halves the scale""",
        ),
        Variant(
            name="clip_before_unscale",
            summary="the opposite mistake, silent: clip_grad_norm_ on the still-scaled grads (no unscale_ at all), "
                    "so the real threshold is max_norm / scale and SGD barely moves",
            expect=None,
            fix="Call scaler.unscale_(opt) once, right before clipping, so clipping sees the real gradient norm.",
            diff="""\
 scaler.scale(loss).backward()
+scaler.unscale_(opt)
 torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
 scaler.step(opt)
 scaler.update()""",
            entry=CatalogRef(file="references/training/precision-stability.md", id="AMP-12"),
        ),
    ),
)


def _library_clip(model, opt, scaler, max_norm: float):
    """What a trainer/accelerate ``clip_grad_norm_`` does under fp16: unscale, then clip."""
    import torch

    scaler.unscale_(opt)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _run(variant: str, device: str, fixed: bool) -> Observed:
    import torch

    from . import toy

    model = toy.mlp(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = toy.scaler(device)
    accum = 4 if variant == "grad_accum" else 1
    losses, steps, skipped = [], 0, 0
    for i in range(8):
        # skip_update: the first batch overflows fp16 (inputs 1e6), the rest are normal.
        x, y = toy.batch(device, scale=1e6 if variant == "skip_update" and i == 0 else 1.0)
        with torch.autocast(device, dtype=torch.float16):
            loss = toy.mse(model(x), y)
        scaler.scale(loss / accum).backward()
        boundary = (i + 1) % accum == 0
        if variant == "double_clip":
            if not fixed:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            _library_clip(model, opt, scaler, 1.0)
        elif variant == "grad_accum" and (boundary or not fixed):
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        elif variant == "skip_update":
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if not fixed and not torch.isfinite(norm):
                opt.zero_grad(set_to_none=True)
                continue
        losses.append(loss.item())
        if boundary:
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            steps += 1
            skipped += scaler.get_scale() < before
    finite = [v for v in losses if v == v and abs(v) != float("inf")]
    return Observed(detail=f"{steps} optimizer steps ({skipped} skipped by the scaler on inf/NaN), "
                           f"{toy.losses_summary(finite)}, scale {scaler.get_scale():g}",
                    metrics={"optimizer_steps": steps, "skipped_steps": skipped, "scale": scaler.get_scale()})


def _clip_order(device: str, fixed: bool, steps: int = 20) -> Observed:
    """SGD under fp16 autocast with clipping; the norm clip_grad_norm_ sees vs the true (unscaled) norm."""
    import statistics

    import torch

    from . import toy

    model = toy.mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = toy.scaler(device)
    x, y = toy.batch(device)
    losses, seen, true = [], [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16):
            loss = toy.mse(model(x), y)
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        if fixed:
            scaler.unscale_(opt)
            scale = 1.0
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        seen.append(norm)
        true.append(norm / scale)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    ratio = statistics.median(s / t for s, t in zip(seen, true, strict=True) if t > 0)
    return Observed(symptom=ratio > 100,
                    detail=f"{steps} SGD steps, clip_grad_norm_ saw median norm {statistics.median(seen):.4g} "
                           f"(true norm {statistics.median(true):.4g}, {ratio:g}x), {toy.losses_summary(losses)}",
                    metrics={"steps": steps, "clip_saw_norm": statistics.median(seen),
                             "true_norm": statistics.median(true), "first_loss": losses[0], "last_loss": losses[-1]})


def bug(variant: str, device: str) -> Observed:
    if variant == "clip_before_unscale":
        return _clip_order(device, fixed=False)
    return _run(variant, device, fixed=False)


def fix(variant: str, device: str) -> Observed:
    if variant == "clip_before_unscale":
        return _clip_order(device, fixed=True)
    return _run(variant, device, fixed=True)
