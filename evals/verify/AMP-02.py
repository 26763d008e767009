"""AMP-02: an optimizer built before the model was wrapped (it holds parameters the loss never reaches)
vs the Fix's optimizer built afterwards from the trainable parameters. The Verify is the entry's count
of optimizer parameters with a gradient after ``loss.backward()``."""

from __future__ import annotations


def run(case) -> str:
    import copy

    import torch

    torch.manual_seed(0)
    base = torch.nn.Linear(4, 1)
    namespace = {"torch": torch}
    stale = torch.optim.AdamW(base.parameters(), lr=1e-3)  # built before wrapping
    model = copy.deepcopy(base)  # the wrapper's own copy (what FSDP flattening or adapter injection does)
    namespace["model"] = model
    if case.fixed:
        fix = case.code("Fix", "optimizer = torch.optim.AdamW([p for p", role="fix").replace("lr=...", "lr=1e-3")
        case.exec(fix, namespace)
    else:
        namespace["optimizer"] = stale
    model(torch.randn(2, 4)).sum().backward()
    return case.exec(f"print({case.code('Verify', 'p.grad is not None for g')})", namespace)


def passed(outputs: list[str]) -> bool:
    return all(out.strip().isdigit() and int(out.strip()) > 0 for out in outputs)
