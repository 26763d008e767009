"""CONV-02: ``scheduler.step()`` called before ``optimizer.step()`` (the first value of the schedule is
skipped, and torch warns) vs the Fix's order. The Verify logs the LR each update uses,
``optimizer.param_groups[0]["lr"]`` right before ``optimizer.step()``, over five steps of a warmup whose
formula from step 0 is lr × (step + 1) / 5."""

from __future__ import annotations


def run(case) -> str:
    import warnings

    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
    used = case.code("Verify", 'optimizer.param_groups[0]["lr"]')
    lines = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            model(torch.ones(1, 2)).sum().backward()
            if not case.fixed:
                scheduler.step()
            lines.append(case.exec(f"print(round({used}, 4))", {"optimizer": optimizer}).strip())
            optimizer.step()
            if case.fixed:
                scheduler.step()
            optimizer.zero_grad()
    warned = sum("lr_scheduler.step()" in str(w.message) for w in caught)
    return f"lr {' '.join(lines)}\nwarnings {warned}\n"


def passed(outputs: list[str]) -> bool:
    """The Verify: the first five updates use 0.02, 0.04, …, 0.1, and the warning is gone."""
    return all(out.startswith("lr 0.02 0.04 0.06 0.08 0.1\n") and out.strip().endswith("warnings 0")
               for out in outputs)
