"""fp16_unscale: ``ValueError: Attempting to unscale FP16 gradients.``

GradScaler unscales fp16-*computed* gradients that land on fp32 master weights; when the trainable
parameters themselves are fp16 (``model.half()``, a ``torch_dtype=float16`` load with adapters in
the same dtype) their grads are fp16 and ``_unscale_grads_`` refuses them. The fix keeps trainable
parameters in fp32 and lets autocast run the matmuls in fp16.
"""

from __future__ import annotations

from .base import Case, CatalogRef, Expect, Observed, Variant

EXPECT = Expect(("ValueError",), r"Attempting to unscale FP16 gradients")

CASE = Case(
    name="fp16_unscale",
    title="Attempting to unscale FP16 gradients",
    why="GradScaler only unscales grads of fp32 (master) params; fp16 trainable params give fp16 grads, "
        "which unscale_() rejects (also when step() calls unscale_() for you).",
    entry=CatalogRef(file="references/training/precision-stability.md", id="AMP-01"),
    variants=(
        Variant(
            name="lora_clip",
            summary="fp16-loaded base + LoRA adapters created in fp16; scaler.unscale_() before clip_grad_norm_",
            expect=EXPECT,
            fix="Cast the trainable (adapter) params to fp32; the frozen base stays fp16 and autocast(fp16) "
                "runs the forward (peft >= 0.11 does this by default: autocast_adapter_dtype=True).",
            diff="""\
 model = load_model(torch_dtype=torch.float16)
 model = add_lora(model)                      # adapters inherit fp16
+for p in model.parameters():
+    if p.requires_grad:
+        p.data = p.data.float()              # trainable params in fp32
 opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
 with torch.autocast(device, dtype=torch.float16):
     loss = loss_fn(model(x), y)
 scaler.scale(loss).backward()
 scaler.unscale_(opt)
 torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)""",
        ),
        Variant(
            name="half_model",
            summary="model.half() for full fine-tuning, plain scaler.step(opt) (step calls unscale_)",
            expect=EXPECT,
            fix="Keep the model in fp32 and run the forward under autocast(fp16); the scaler then sees fp32 grads.",
            diff="""\
-model = build_model().half()
+model = build_model()                        # fp32 master weights
 opt = torch.optim.AdamW(model.parameters())
-loss = loss_fn(model(x.half()), y)
+with torch.autocast(device, dtype=torch.float16):
+    loss = loss_fn(model(x), y)
 scaler.scale(loss).backward()
 scaler.step(opt)
 scaler.update()""",
        ),
        Variant(
            name="fused_adamw_clip",
            summary="model.half() with AdamW(fused=True): scaler.step works alone, adding unscale_() + clipping "
                    "raises",
            expect=EXPECT,
            fix="fp32 params + autocast(fp16); fused AdamW's own fp16 path only hides the problem until "
                "someone clips.",
            diff="""\
-model = build_model().half()
+model = build_model()                        # fp32 master weights
 opt = torch.optim.AdamW(model.parameters(), fused=True)
-loss = loss_fn(model(x.half()), y)
+with torch.autocast(device, dtype=torch.float16):
+    loss = loss_fn(model(x), y)
 scaler.scale(loss).backward()
 scaler.unscale_(opt)                         # added for clipping
 torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
 scaler.step(opt)""",
        ),
    ),
)


def _train(model, opt, device: str, *, autocast: bool, clip: bool, steps: int = 3) -> Observed:
    import torch

    from . import toy

    scaler = toy.scaler(device)
    x, y = toy.batch(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if autocast:
            with torch.autocast(device, dtype=torch.float16):
                loss = toy.mse(model(x), y)
        else:
            loss = toy.mse(model(x.half()), y)
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return Observed(detail=f"{steps} steps, {toy.losses_summary(losses)}, scale {scaler.get_scale():g}",
                    metrics={"steps": steps, "first_loss": losses[0], "last_loss": losses[-1],
                             "scale": scaler.get_scale()})


def _model(variant: str, device: str, fixed: bool):
    import torch

    from . import toy

    if variant == "lora_clip":
        model = toy.add_lora(toy.mlp(device, torch.float16))
        if fixed:
            for p in toy.trainable(model):
                p.data = p.data.float()
        return model, torch.optim.AdamW(toy.trainable(model), lr=1e-2)
    model = toy.mlp(device) if fixed else toy.mlp(device).half()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=variant == "fused_adamw_clip")


def bug(variant: str, device: str) -> Observed:
    model, opt = _model(variant, device, fixed=False)
    return _train(model, opt, device, autocast=variant == "lora_clip", clip=variant != "half_model")


def fix(variant: str, device: str) -> Observed:
    model, opt = _model(variant, device, fixed=True)
    return _train(model, opt, device, autocast=True, clip=variant != "half_model")
