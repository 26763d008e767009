"""DIST-23 on 2 gloo ranks: FSDP1 with parameters stored in bf16 (``model.bfloat16()`` before wrapping)
vs fp32 storage with the Fix's ``MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
…)``. The Verify prints the parameter and gradient dtypes after one step; both must be fp32."""

from __future__ import annotations

RANKS = 2


def run(case) -> str:
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    if case.fixed:
        policy = eval(case.code("Fix", "MixedPrecision(param_dtype=torch.bfloat16", role="fix"),
                      {"MixedPrecision": MixedPrecision, "torch": torch})
        model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), mixed_precision=policy)
    else:
        model = FullyShardedDataParallel(model.bfloat16(), device_id=torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    params = case.code("Verify", "{p.dtype for p in model.parameters()}")
    grads = case.code("Verify", "{p.grad.dtype for p in model.parameters() if p.grad is not None}")
    return case.exec(f"print('params', {params}, 'grads', {grads})", {"model": model})


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "params {torch.float32} grads {torch.float32}" for out in outputs)
