"""AMP-01: trainable parameters in fp16 (the cause of "Attempting to unscale FP16 gradients") vs the Fix's
cast of every trainable parameter to fp32. The Verify is the entry's dtype Counter; the scenario also
takes one scaled step on CPU, which fails exactly when the Verify says fp16."""

from __future__ import annotations

import collections


def run(case) -> str:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)).half()  # model.half(), as reported
    model[0].weight.requires_grad_(False)  # a frozen part may stay fp16
    namespace = {"model": model, "torch": torch, "collections": collections}
    if case.fixed:
        case.exec(case.code("Fix", "p.data = p.data.float()", role="fix"), namespace)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    verify = case.exec(case.code('Verify', 'collections.Counter'), namespace)
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(2, 4)).float().sum()
    scaler.scale(loss).backward()
    step = case.exec("scaler.unscale_(optimizer); scaler.step(optimizer); print('scaled step ok')",
                     {"scaler": scaler, "optimizer": optimizer})
    return verify + step


def passed(outputs: list[str]) -> bool:
    return all("torch.float32" in out and "torch.float16" not in out.split("\n")[0] for out in outputs)
