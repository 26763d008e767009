"""DIST-06 on 3 gloo ranks: does the entry's sharding report tell a replicated job from a sharded one?

Failure: the model is wrapped in DDP (every rank holds all of it) while the user believes it is sharded.
Fix: FSDP2, ``fully_shard`` on every layer and the root. The report is the ``report_shards`` snippet
from the entry's Fix, run as written; the criterion is the entry's Verify: a ratio near 1/N on every rank.
"""

from __future__ import annotations

import inspect
import os
import re

RANKS = 3
TIMEOUT = 90


def run(case) -> str:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    os.environ["LOCAL_RANK"] = str(case.rank)  # what torchrun sets; the report prints it
    namespace: dict = {}
    case.exec(case.code("Fix", "def report_shards"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    if case.fixed:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    else:
        model = DistributedDataParallel(model)
    report = namespace["report_shards"]
    # The report takes the whole model's size when it asks for it (an older one divided by a sum instead).
    args = (model, full) if len(inspect.signature(report).parameters) > 1 else (model,)
    return case.exec("report(*args)", {"report": report, "args": args})


def passed(outputs: list[str]) -> bool:
    """The Verify: every rank's ratio is near 1/N (within 10 % of it)."""
    ratios = [re.search(r"ratio (\d+\.\d+)", out) for out in outputs]
    if not all(ratios):
        return False
    ideal = 1 / len(outputs)
    return all(abs(float(m.group(1)) - ideal) <= 0.1 * ideal for m in ratios if m)
