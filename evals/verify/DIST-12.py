"""DIST-12 on 2 gloo ranks: each rank loading its own uneven slice of the data (11 samples: 6 and 5, so
one rank has a batch more and waits in a collective at the epoch end) vs the Fix's ``DistributedSampler``,
which pads to equal length. The Verify logs ``len(loader)`` on every rank; they must be equal."""

from __future__ import annotations

RANKS = 2


def run(case) -> str:
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    data = list(range(11))
    rank, world = dist.get_rank(), dist.get_world_size()
    if case.fixed:
        loader = DataLoader(data, batch_size=1, sampler=DistributedSampler(data))
    else:
        loader = DataLoader(data[rank::world], batch_size=1)
    return case.exec(f"print('rank', {rank}, 'len(loader) =', {case.code('Verify', 'len(loader)')})",
                     {"loader": loader})


def passed(outputs: list[str]) -> bool:
    lengths = {out.strip().rsplit("=", 1)[-1].strip() for out in outputs}
    return len(lengths) == 1 and all("len(loader)" in out for out in outputs)
