"""CKPT-03: a checkpoint that pickles an ``argparse.Namespace`` (refused by ``torch.load``'s default
``weights_only=True``) vs one written as the Fix says, with plain types (``vars(args)``). The Verify is
the entry's ``python -c "…torch.load('ckpt.pt'…)"``, run in the scenario's directory."""

from __future__ import annotations


def run(case) -> str:
    import argparse

    import torch

    args = argparse.Namespace(lr=1e-3, epochs=3)
    state = {"model": torch.nn.Linear(2, 2).state_dict(), "args": vars(args) if case.fixed else args}
    torch.save(state, "ckpt.pt")
    return case.python_c(case.code("Verify", "torch.load('ckpt.pt'")) or "(loaded, nothing printed)\n"


def passed(outputs: list[str]) -> bool:
    return all("Error" not in out for out in outputs)
