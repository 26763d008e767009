"""CONV-12: two short training runs without seeding (different initial weights and batches) vs two runs
that each start with the Fix's seeding block. Each run logs its losses one per line; the Verify is the
entry's ``diff run1.log run2.log``. The Fix turns on deterministic algorithms process-wide, so the
scenario turns them off again afterwards (the worker runs other scenarios)."""

from __future__ import annotations


def _train(torch, path: str) -> None:
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with open(path, "w") as log:
        for _ in range(5):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            log.write(f"{loss.item():.8f}\n")


def run(case) -> str:
    import torch

    seeding = case.code("Fix", "torch.manual_seed(seed)", role="fix") if case.fixed else ""
    try:
        for name in ("run1.log", "run2.log"):
            if seeding:
                case.exec(seeding, {})
            _train(torch, name)
    finally:
        torch.use_deterministic_algorithms(False)
    return case.shell(case.code("Verify", "diff run1.log run2.log"))


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "[exit 0]" for out in outputs)
