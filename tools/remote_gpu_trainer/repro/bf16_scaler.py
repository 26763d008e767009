"""bf16_scaler: a GradScaler fed bf16 gradients.

On CUDA, ``_amp_foreach_non_finite_check_and_unscale_cuda`` dispatches only float/double/half, so
bf16 grads raise ``NotImplementedError: "..._cuda" not implemented for 'BFloat16'`` (a RuntimeError
in older torch). The CPU kernel accepts BFloat16, so the same code runs clean on CPU: a CPU run can
only show that bf16 grads reached the scaler. bf16 has fp32's exponent range and needs no loss
scaling at all; the fix is autocast(bfloat16) without a scaler.
"""

from __future__ import annotations

from .base import Case, CatalogRef, Expect, Observed, Variant

EXPECT_CUDA = Expect(("NotImplementedError", "RuntimeError"),
                     r"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'")
CUDA_NOTE = ("The CPU kernel _amp_foreach_non_finite_check_and_unscale_cpu accepts BFloat16, so this runs clean "
             "on CPU. On CUDA the same call raises NotImplementedError: "
             "\"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16' (the CUDA kernel "
             "dispatches float, double and half only). Run with device=cuda on a GPU to see it for real.")

CASE = Case(
    name="bf16_scaler",
    title="GradScaler with bf16 gradients (_amp_foreach_non_finite_check_and_unscale_cuda not implemented for "
          "'BFloat16')",
    why="GradScaler's inf check/unscale kernel on CUDA has no BFloat16 implementation, and bf16 needs no loss "
        "scaling: a scaler with bf16 grads is a config error (often fp16=True with a bf16 model or adapters).",
    entry=CatalogRef(file="references/training/precision-stability.md", id="AMP-04"),
    variants=(
        Variant(
            name="bf16_model",
            summary="model in bf16 (bf16 checkpoint) trained with a GradScaler",
            expect=EXPECT_CUDA,
            fix="bf16 needs no GradScaler: fp32 params with autocast(bfloat16), plain loss.backward() and "
                "opt.step().",
            diff="""\
-model = load_model(torch_dtype=torch.bfloat16)
-scaler = torch.amp.GradScaler(device)
-loss = loss_fn(model(x.bfloat16()), y)
-scaler.scale(loss).backward()
-scaler.step(opt)
-scaler.update()
+model = load_model()                         # fp32 params
+with torch.autocast(device, dtype=torch.bfloat16):
+    loss = loss_fn(model(x), y)
+loss.backward()                              # no scaler with bf16
+opt.step()""",
            cuda_only=True,
            cuda_note=CUDA_NOTE,
        ),
        Variant(
            name="bf16_lora_fp16_amp",
            summary="fp16 AMP intended (Trainer fp16=True creates a GradScaler) but the base and LoRA adapters "
                    "are bf16",
            expect=EXPECT_CUDA,
            fix="For fp16 AMP, make the trainable adapters fp32 (the scaler then sees fp32 grads); or switch "
                "the run to bf16 (bf16=True) and drop the scaler.",
            diff="""\
 model = add_lora(load_model(torch_dtype=torch.bfloat16))   # adapters inherit bf16
+for p in model.parameters():
+    if p.requires_grad:
+        p.data = p.data.float()
 with torch.autocast(device, dtype=torch.float16):
     loss = loss_fn(model(x), y)
 scaler.scale(loss).backward()
 scaler.step(opt)""",
            cuda_only=True,
            cuda_note=CUDA_NOTE,
        ),
        Variant(
            name="complex_grads",
            summary="CPU-visible sibling: complex params through a GradScaler hit the same kernel dispatch check "
                    "on CPU (the path bf16 takes on CUDA)",
            expect=Expect(("NotImplementedError", "RuntimeError"),
                          r"_amp_foreach_non_finite_check_and_unscale_\w+\" not implemented for"),
            fix="Only fp16 training needs a GradScaler; step grads of other dtypes without one.",
            diff="""\
-scaler.scale(loss).backward()
-scaler.step(opt)
-scaler.update()
+loss.backward()
+opt.step()""",
        ),
    ),
)


def _with_scaler(model, params, device: str, x_dtype, autocast_dtype, steps: int = 3) -> Observed:
    import torch

    from . import toy

    opt = torch.optim.AdamW(params, lr=1e-2)
    scaler = toy.scaler(device)
    x, y = toy.batch(device, dtype=x_dtype)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = toy.mse(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    grad_dtypes = sorted({str(p.grad.dtype).removeprefix("torch.") for p in params if p.grad is not None})
    return Observed(detail=f"GradScaler stepped {steps} times with {'/'.join(grad_dtypes)} grads on {device}, "
                           f"{toy.losses_summary(losses)}",
                    metrics={"steps": steps, "grad_dtype": "/".join(grad_dtypes), "last_loss": losses[-1]})


def _complex(device: str, scaled: bool) -> Observed:
    import torch

    from . import toy

    toy.seed()
    w = torch.randn(4, 4, dtype=torch.complex64, device=device, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-2)
    scaler = toy.scaler(device)
    x = torch.randn(8, 4, dtype=torch.complex64, device=device)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = (x @ w).abs().pow(2).mean()
        if scaled:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
    return Observed(detail=f"3 SGD steps on complex64 params, loss {loss.item():.4g}",
                    metrics={"steps": 3, "last_loss": loss.item()})


def bug(variant: str, device: str) -> Observed:
    import torch

    from . import toy

    if variant == "complex_grads":
        return _complex(device, scaled=True)
    if variant == "bf16_model":
        model = toy.mlp(device, torch.bfloat16)
        return _with_scaler(model, list(model.parameters()), device, torch.bfloat16, None)
    model = toy.add_lora(toy.mlp(device, torch.bfloat16))
    return _with_scaler(model, toy.trainable(model), device, torch.float32, torch.float16)


def fix(variant: str, device: str) -> Observed:
    import torch

    from . import toy

    if variant == "complex_grads":
        return _complex(device, scaled=False)
    if variant == "bf16_lora_fp16_amp":
        model = toy.add_lora(toy.mlp(device, torch.bfloat16))
        for p in toy.trainable(model):
            p.data = p.data.float()
        return _with_scaler(model, toy.trainable(model), device, torch.float32, torch.float16)
    model = toy.mlp(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = toy.batch(device)
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = toy.mse(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return Observed(detail=f"3 steps with autocast(bfloat16), no scaler, {toy.losses_summary(losses)}",
                    metrics={"steps": 3, "first_loss": losses[0], "last_loss": losses[-1]})
