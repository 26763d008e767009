"""DIST-25 on 2 gloo ranks: an optimizer built from the model before FSDP1 wrapped it (it steps the
replaced parameters; the sharded flat parameters never change) vs the Fix's optimizer built from the
wrapped module. The Verify is the entry's one-liner around ``train_one_step()``, on each rank's shard."""

from __future__ import annotations

RANKS = 2
TIMEOUT = 90


def run(case) -> str:
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    namespace = {"torch": torch}
    if not case.fixed:
        namespace["optimizer"] = torch.optim.AdamW(model.parameters(), lr=1e-2)  # before wrapping
    model = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
    namespace["model"] = model
    if case.fixed:
        fix = case.code("Fix", "optimizer = torch.optim.AdamW(model.parameters()", role="fix")
        case.exec(fix.replace("lr=...", "lr=1e-2"), namespace)

    def train_one_step() -> None:
        namespace["optimizer"].zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        namespace["optimizer"].step()

    namespace["train_one_step"] = train_one_step
    return case.exec(case.code("Verify", "train_one_step()"), namespace)


def passed(outputs: list[str]) -> bool:
    import re

    values = [re.search(r"tensor\(([-\d.e]+)", out) for out in outputs]
    return all(m and float(m.group(1)) > 0 for m in values)
