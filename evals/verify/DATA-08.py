"""DATA-08: an ``IterableDataset`` read by two workers without sharding (every sample twice) vs with the
Fix's ``__iter__``, which shards by worker (and rank). The Verify counts the samples of one epoch."""

from __future__ import annotations


class Source:
    """Ten samples from one stream; subclasses decide how workers split it."""

    def source(self):
        import torch

        return (torch.tensor([i]) for i in range(10))

    def __iter__(self):
        return iter(self.source())


def run(case) -> str:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, IterableDataset

    methods = {}
    if case.fixed:
        namespace = {"torch": torch, "dist": dist}
        case.exec(case.code("Fix", "def __iter__(self):", role="fix"), namespace)
        methods["__iter__"] = namespace["__iter__"]
    dataset = type("Stream", (Source, IterableDataset), methods)()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context="fork")
    check = case.code("Verify", "sum(len(b) for b in loader) == dataset_size")
    return case.exec(f"print({check})", {"loader": loader, "dataset_size": 10})


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "True" for out in outputs)
