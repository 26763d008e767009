"""DATA-04: can the DataLoader's workers start under ``spawn``? The entry's Verify, on both situations.

Failure: ``collate_fn`` is a function defined inside the training function (what works under ``fork``).
Fix (the entry's first advice, done by this file): the same function at module level. The Verify pickles
what a worker receives and starts one ``spawn`` worker; the dataset and the fixed ``collate`` live at
module level here so that the spawned interpreter can import them by name.
"""

from __future__ import annotations

TIMEOUT = 120


class Samples:
    """A map-style dataset of eight small tensors (module level: picklable)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        import torch

        return torch.full((2,), float(index))


def collate(batch):
    """The fix: defined at module level, pickled by its qualified name."""
    import torch

    return torch.stack(batch)


def run(case) -> str:
    import torch

    def local_collate(batch):  # the failure: a local function cannot be pickled by name
        return torch.stack(batch)

    namespace = {"dataset": Samples(), "collate_fn": collate if case.fixed else local_collate}
    return case.exec(case.code("Verify", "pickle.dumps"), namespace)


def passed(outputs: list[str]) -> bool:
    return all("workers start under spawn" in out for out in outputs)
