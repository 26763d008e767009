"""CONV-10: one AdamW group with weight decay on everything vs the Fix's two groups (no decay for 1-D
tensors: biases and norm gains). The Verify prints the entry's (size, weight_decay) per group."""

from __future__ import annotations


def run(case) -> str:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    namespace = {"model": model, "torch": torch, "lr": 1e-3}
    if case.fixed:
        case.exec(case.code("Fix", "no_decay = [p for n, p", role="fix"), namespace)
    else:
        namespace["optimizer"] = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    groups = case.code("Verify", '"weight_decay"]) for g in')
    return case.exec(f"print({groups})", namespace)


def passed(outputs: list[str]) -> bool:
    """The 1-D tensors (3 biases + the LayerNorm weight = 4 here) sit in a group with weight decay 0."""
    import ast

    for out in outputs:
        try:
            groups = ast.literal_eval(out.strip())
        except (SyntaxError, ValueError):
            return False
        if (4, 0.0) not in groups and not any(size >= 4 and wd == 0.0 for size, wd in groups):
            return False
    return True
