"""CONV-03: a loss computed through ``torch.no_grad()`` (the graph is cut) vs the same loss with the
``no_grad`` removed (the Fix). The Verify prints ``loss.grad_fn`` and, after ``backward()``, the entry's
list of trainable parameters without a gradient."""

from __future__ import annotations


def run(case) -> str:
    import contextlib

    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    guard = contextlib.nullcontext() if case.fixed else torch.no_grad()
    with guard:
        out = model(torch.randn(3, 4))
    loss = out.pow(2).mean().requires_grad_(True)  # the "fix" the entry warns against, as users apply it
    loss.backward()
    missing = case.code("Verify", "p.requires_grad and p.grad is None")
    return case.exec(f"print('grad_fn:', loss.grad_fn)\nprint('without grad:', {missing})",
                     {"loss": loss, "model": model})


def passed(outputs: list[str]) -> bool:
    return all("grad_fn: None" not in out and "without grad: []" in out for out in outputs)
