"""AMP-07 on 2 gloo ranks: FSDP1 with fp16 mixed precision, a plain GradScaler vs the Fix's ShardedGradScaler.

Failure: ``torch.amp.GradScaler`` under FSDP1 (fp16 parameters and reduction, default fp32 gradients):
no error, but each rank finds the overflows of its own shard only, so the ranks skip different steps and
their loss scales drift apart. Fix: the entry's ``ShardedGradScaler(device)`` snippet, run as written with
``device = "cpu"``. The Verify is the entry's all-gather of ``scaler.get_scale()`` after six steps.
"""

from __future__ import annotations

RANKS = 2
TIMEOUT = 90


def run(case) -> str:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

    torch.manual_seed(0)
    fp16 = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16)
    model = FullyShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)),
                                     device_id=torch.device("cpu"), mixed_precision=fp16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    namespace = {"device": "cpu", "dist": dist}
    if case.fixed:
        case.exec(case.code("Fix", "ShardedGradScaler(", role="fix"), namespace)
    else:
        namespace["scaler"] = torch.amp.GradScaler("cpu")
    scaler = namespace["scaler"]
    for step in range(6):
        torch.manual_seed(100 + step)  # the same batch on every rank: any difference is the scaler's
        loss = model(torch.randn(4, 8)).float().sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    return case.exec(case.code("Verify", "all_gather_object"), namespace)


def passed(outputs: list[str]) -> bool:
    """The Verify: every rank reports the scales equal."""
    return all("equal" in out and "DIFFERENT" not in out for out in outputs)
