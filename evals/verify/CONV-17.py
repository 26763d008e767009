"""CONV-17: a trainable layer that the forward never uses (its gradient stays None) vs the same layer
frozen, as the Verify demands ("zero/None gradients are exactly the ones you froze"). The instrument is
the Fix's per-parameter dict of (grad is None, grad norm)."""

from __future__ import annotations


def run(case) -> str:
    import torch

    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 4), "unused": torch.nn.Linear(4, 4)})
    if case.fixed:
        model["unused"].requires_grad_(False)  # frozen on purpose
    model["used"](torch.randn(2, 4)).sum().backward()
    flow = case.code("Fix", "p.grad.norm().item() if p.grad is not None")
    return case.exec(f"import math\nflow = {flow}\n"
                     "print('trainable without a finite non-zero gradient:', [n for n, p in model.named_parameters()"
                     " if p.requires_grad and (flow[n][0] or not math.isfinite(flow[n][1]) or flow[n][1] == 0)])",
                     {"model": model})


def passed(outputs: list[str]) -> bool:
    return all(out.strip().endswith(": []") for out in outputs)
