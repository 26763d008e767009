"""AMP-04: fp16 AMP (a GradScaler) on a model whose trainable parameters are bf16 (a bf16 checkpoint)
vs the Fix's fp16 path: trainable parameters cast to fp32. The Verify is the entry's dtype set of the
trainable parameters (with fp16 AMP it must be ``{torch.float32}``)."""

from __future__ import annotations


def run(case) -> str:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)).to(torch.bfloat16)
    model[0].requires_grad_(False)  # the frozen base may stay low precision
    if case.fixed:
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()  # "cast trainable parameters/adapters to fp32"
    return case.exec(f"print({case.code('Verify', '{p.dtype for p in model.parameters() if p.requires_grad}')})",
                     {"model": model})


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "{torch.float32}" for out in outputs)
