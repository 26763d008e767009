"""DATA-07: a dataset that creates its numpy generator in ``__init__`` (every worker inherits the same
state, every epoch starts it again) vs the Fix's ``worker_init_fn``, which gives each worker and epoch
its own generator. The Verify logs the first six draws of two epochs read by two workers."""

from __future__ import annotations


class Draws:
    """Six samples; each returns one draw from ``self.rng``."""

    def __init__(self) -> None:
        import numpy as np

        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> float:
        return float(self.rng.random())


def run(case) -> str:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    namespace = {"torch": torch, "np": np}
    init = None
    if case.fixed:
        case.exec(case.code("Fix", "def worker_init_fn(worker_id):", role="fix"), namespace)
        init = namespace["worker_init_fn"]
    namespace["loader"] = DataLoader(Draws(), batch_size=1, num_workers=2, worker_init_fn=init,
                                     multiprocessing_context="fork")
    return case.exec(case.code("Verify", "for epoch in range(2):"), namespace)


def passed(outputs: list[str]) -> bool:
    """All twelve logged draws (two epochs of six) are different."""
    import re

    for out in outputs:
        values = re.findall(r"\d\.\d+", out)
        if len(values) != 12 or len(set(values)) != 12:
            return False
    return True
