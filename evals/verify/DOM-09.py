"""DOM-09: 17 samples in batches of 4 leave a last batch of 1, which BatchNorm cannot train on, vs the
Fix's ``drop_last=True``. The Verify's remainder check (or ``drop_last``) and its "a full epoch runs"."""

from __future__ import annotations


def run(case) -> str:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    dataset = TensorDataset(torch.randn(17, 4))
    batch_size, world_size = 4, 1
    fix = case.code("Fix", "drop_last=True", role="fix") if case.fixed else "drop_last=False"
    loader = eval(f"DataLoader(dataset, batch_size=batch_size, {fix})",
                  {"DataLoader": DataLoader, "dataset": dataset, "batch_size": batch_size})
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    remainder = case.exec(f"print('remainder', {case.code('Verify', 'len(dataset) % (batch_size * world_size)')})",
                          {"dataset": dataset, "batch_size": batch_size, "world_size": world_size})
    epoch = case.exec("for (x,) in loader:\n    model(x).sum().backward()\nprint('full epoch ran')",
                      {"loader": loader, "model": model})
    return f"{remainder.strip()} drop_last={loader.drop_last}\n{epoch}"


def passed(outputs: list[str]) -> bool:
    return all(("remainder 1 " not in out or "drop_last=True" in out) and "full epoch ran" in out for out in outputs)
