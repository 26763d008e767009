"""DATA-05: a ``DistributedSampler`` iterated for two epochs without and with the Fix's
``sampler.set_epoch(epoch)``. The Verify logs ``list(sampler)[:5]`` at the start of each epoch (rank 0
of 2; the sampler is given its rank, no process group needed)."""

from __future__ import annotations


def run(case) -> str:
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(100), num_replicas=2, rank=0, shuffle=True, seed=0)
    log = case.code("Verify", "list(sampler)[:5]")
    lines = []
    for epoch in range(2):
        if case.fixed:
            case.exec(case.code("Fix", "sampler.set_epoch(epoch)", role="fix"), {"sampler": sampler, "epoch": epoch})
        lines.append(case.exec(f"print({log})", {"sampler": sampler}).strip())
    return "\n".join(lines) + "\n"


def passed(outputs: list[str]) -> bool:
    """The Verify: the two epochs' first indices differ."""
    return all(len(set(out.split("\n")[:2])) == 2 for out in outputs)
