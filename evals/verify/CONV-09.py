"""CONV-09: a linear decay whose length was computed in micro-batches (20) while the optimizer steps once
per 4 of them (5 steps), so the LR never reaches its end, vs the Fix's
``num_training_steps = ceil(len(train_loader) / grad_accum) * epochs``. The Verify logs
``scheduler.get_last_lr()[0]`` at the last optimizer step."""

from __future__ import annotations


def run(case) -> str:
    import math

    import torch

    train_loader, grad_accum, epochs = list(range(20)), 4, 1
    namespace = {"train_loader": train_loader, "grad_accum": grad_accum, "epochs": epochs, "ceil": math.ceil}
    if case.fixed:
        case.exec(case.code("Fix", "num_training_steps = ceil(", role="fix"), namespace)
    else:
        namespace["num_training_steps"] = len(train_loader) * epochs
    total = namespace["num_training_steps"]
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / total))
    for i, _ in enumerate(train_loader):
        if (i + 1) % grad_accum == 0:
            optimizer.step()
            scheduler.step()
    return case.exec(f"print('last lr', round({case.code('Verify', 'scheduler.get_last_lr()[0]')}, 4))",
                     {"scheduler": scheduler})


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "last lr 0.0" for out in outputs)
