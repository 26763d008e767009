"""DIST-22 on 2 gloo ranks: an FSDP1 unit holding fp32 and bf16 parameters (one layer loaded in bf16)
vs the whole model cast to one storage dtype first (the Fix, done here). The Verify prints the entry's
dtype set before wrapping and whether construction succeeds."""

from __future__ import annotations

RANKS = 2


def run(case) -> str:
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model[1].to(torch.bfloat16)  # e.g. a head loaded from a bf16 checkpoint
    if case.fixed:
        model.float()
    namespace = {"model": model, "torch": torch}
    dtypes = case.code("Verify", "p.dtype for p in model.parameters()")
    dtypes = case.exec(f"print('dtypes before wrapping:', {dtypes})", namespace)
    build = case.exec("FullyShardedDataParallel(model, device_id=torch.device('cpu')); print('construction ok')",
                      {**namespace, "FullyShardedDataParallel": FullyShardedDataParallel})
    return dtypes + build


def passed(outputs: list[str]) -> bool:
    return all("construction ok" in out and out.count("torch.") == 1 for out in outputs)
