"""CONV-04: an optimizer built from the model before it was replaced (the new module's parameters are
never stepped) vs built last, from the final module (the Fix). The Verify is the entry's before/after
comparison around one training step."""

from __future__ import annotations


def run(case) -> str:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model[1] = torch.nn.Linear(4, 1)  # a new head after the optimizer was built
    if case.fixed:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built last
    for p in model[0].parameters():
        p.requires_grad_(False)  # only the head trains
    namespace = {"model": model, "torch": torch}
    before = case.code("Verify", "before = {n: p.detach().clone()")
    changed = case.code("Verify", "max((p - before[n]).abs().max().item()")
    case.exec(before, namespace)
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    return case.exec(f"print('largest change:', {changed})", namespace)


def passed(outputs: list[str]) -> bool:
    import re

    values = [re.search(r"largest change: (\S+)", out) for out in outputs]
    return all(m and float(m.group(1)) > 0 for m in values)
