"""no_inf_checks: ``AssertionError: No inf checks were recorded for this optimizer.``

``scaler.step(opt)`` unscales the grads of the params *in that optimizer* and records one inf check
per device; a param without ``.grad`` is skipped. When no param in the optimizer has a grad there
is nothing to record, and step() asserts. In practice the optimizer holds the wrong params: built
before LoRA/FSDP wrapping replaced or froze them, or everything is frozen.
"""

from __future__ import annotations

from .base import Case, CatalogRef, Expect, Observed, Variant

EXPECT = Expect(("AssertionError",), r"No inf checks were recorded")

CASE = Case(
    name="no_inf_checks",
    title="No inf checks were recorded for this optimizer",
    why="scaler.step() found no param with a .grad in the optimizer: the optimizer holds params that are not "
        "in the graph (built before wrapping) or nothing trainable produced a gradient.",
    entry=CatalogRef(file="references/training/precision-stability.md", id="AMP-02"),
    variants=(
        Variant(
            name="stale_optimizer",
            summary="optimizer built from model.parameters() before LoRA wrapping froze the base and added adapters",
            expect=EXPECT,
            fix="Build the optimizer after all wrapping (LoRA, FSDP, device moves), from the params that "
                "require grad.",
            diff="""\
 model = load_model()
-opt = torch.optim.AdamW(model.parameters())
 model = add_lora(model)                      # freezes the base, adds new adapter params
+opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
 scaler.scale(loss).backward()
 scaler.step(opt)""",
        ),
        Variant(
            name="all_frozen",
            summary="every param frozen (inputs require grad, so backward runs); the head meant to train "
                    "was never unfrozen",
            expect=EXPECT,
            fix="Unfreeze what should train, fail fast when nothing is trainable, and skip scaler.step/update "
                "for a step in which no param got a grad.",
            diff="""\
 model.requires_grad_(False)
+model[-1].requires_grad_(True)               # the part that should train
+params = [p for p in model.parameters() if p.requires_grad]
+assert params, "nothing to train"
-opt = torch.optim.AdamW(model.parameters())
+opt = torch.optim.AdamW(params)
 scaler.scale(loss).backward()
-scaler.step(opt)
-scaler.update()
+if any(p.grad is not None for g in opt.param_groups for p in g["params"]):
+    scaler.step(opt)
+    scaler.update()""",
        ),
    ),
)


def _train(model, opt, device: str, guard: bool, steps: int = 3) -> Observed:
    import torch

    from . import toy

    scaler = toy.scaler(device)
    x, y = toy.batch(device)
    x.requires_grad_(True)  # HF enable_input_require_grads(): backward runs even with a frozen model
    losses, stepped = [], 0
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16):
            loss = toy.mse(model(x), y)
        scaler.scale(loss).backward()
        if not guard or any(p.grad is not None for g in opt.param_groups for p in g["params"]):
            scaler.step(opt)
            scaler.update()
            stepped += 1
        losses.append(loss.item())
    return Observed(detail=f"{steps} steps ({stepped} optimizer steps), {toy.losses_summary(losses)}",
                    metrics={"steps": steps, "optimizer_steps": stepped, "first_loss": losses[0],
                             "last_loss": losses[-1]})


def bug(variant: str, device: str) -> Observed:
    import torch

    from . import toy

    model = toy.mlp(device)
    if variant == "stale_optimizer":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        toy.add_lora(model)
    else:
        model.requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return _train(model, opt, device, guard=False)


def fix(variant: str, device: str) -> Observed:
    import torch

    from . import toy

    model = toy.mlp(device)
    if variant == "stale_optimizer":
        toy.add_lora(model)
    else:
        model.requires_grad_(False)
        model[-1].requires_grad_(True)
    params = toy.trainable(model)
    assert params, "nothing to train"
    opt = torch.optim.AdamW(params, lr=1e-2)
    observed = _train(model, opt, device, guard=True)
    observed.symptom = observed.metrics["optimizer_steps"] == 0  # the guard alone must not be the "fix"
    return observed
