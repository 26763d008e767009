"""CONV-11: an ``evaluate`` that switches the model to eval mode and leaves it there vs the Fix's
``evaluate``, which restores the previous mode. The Verify is the entry's ``assert model.training`` at
the top of every training step (three steps, evaluation after the first)."""

from __future__ import annotations

LEAKY = '''
def evaluate(model, loader):
    model.eval()
    with torch.inference_mode():
        ...
'''


def run(case) -> str:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    model.train()
    namespace = {"torch": torch, "model": model, "loader": []}
    case.exec(case.code("Fix", "def evaluate(model, loader):", role="fix") if case.fixed else LEAKY, namespace)
    check = case.code("Verify", "assert model.training")
    steps = []
    for step in range(3):
        said = case.exec(f"{check}\nprint('step {step} in train mode')", namespace)
        steps.append(said.strip())
        if step == 0:
            namespace["evaluate"](model, [])
    return "\n".join(steps) + "\n"


def passed(outputs: list[str]) -> bool:
    return all(out.count("in train mode") == 3 for out in outputs)
