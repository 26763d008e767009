"""OOM-08: reentrant activation checkpointing of a block whose input does not require grad (the block's
parameters get no gradient) vs the Fix's ``use_reentrant=False``. The Verify is the entry's list of
trainable parameters without a gradient after ``backward()``."""

from __future__ import annotations


def run(case) -> str:
    import warnings

    import torch
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(block)
    x = torch.randn(2, 4)  # embeddings frozen / inputs without requires_grad, as with LoRA
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "None of the inputs have requires_grad=True" is the other symptom
        if case.fixed:
            fix = case.code("Fix", "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)", role="fix")
            out = eval(fix, {"torch": torch, "block": block, "x": x})
        else:
            out = checkpoint(block, x, use_reentrant=True)
        out.sum().backward() if out.requires_grad else None
    return case.exec(f"print({case.code('Verify', 'p.requires_grad and p.grad is None')})", {"model": model})


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "[]" for out in outputs)
