"""CKPT-13: resume after 3 of 6 steps of an AdamW run with a warmup schedule and random batches.
Failure: only the model's weights were saved; the optimizer, scheduler and RNG start fresh (the LR
warms up again, Adam's moments are gone, the batches repeat). Fix: the entry's full-state dict, saved
and loaded back. The Verify is the entry's ``diff reference.log resumed.log``."""

from __future__ import annotations


def _setup(torch):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
    return model, optimizer, scheduler


def _steps(torch, model, optimizer, scheduler, start: int, stop: int, log) -> None:
    for step in range(start, stop):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if log is not None:
            log.write(f"{step} {loss.item():.6f} {scheduler.get_last_lr()[0]:.6f}\n")


def run(case) -> str:
    import random

    import numpy as np
    import torch

    torch.manual_seed(0)
    model, optimizer, scheduler = _setup(torch)
    _steps(torch, model, optimizer, scheduler, 0, 3, None)
    if case.fixed:
        namespace = {"model_sd": model.state_dict(), "optimizer": optimizer, "scheduler": scheduler, "scaler": None,
                     "step": 3, "epoch": 0, "random": random, "np": np, "torch": torch}
        case.exec(case.code("Fix", "state = {", role="fix"), namespace)
        torch.save(namespace["state"], "ckpt.pt")
    else:
        torch.save({"model": model.state_dict(), "step": 3}, "ckpt.pt")
    with open("reference.log", "w") as log:
        _steps(torch, model, optimizer, scheduler, 3, 6, log)

    torch.manual_seed(12345)  # a new process: whatever RNG state it starts with
    state = torch.load("ckpt.pt", weights_only=False)
    model, optimizer, scheduler = _setup(torch)
    model.load_state_dict(state["model"])
    if "optimizer" in state:  # restore what was saved, as the Fix says: "load each"
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
    with open("resumed.log", "w") as log:
        _steps(torch, model, optimizer, scheduler, state["step"], 6, log)
    return case.shell(case.code("Verify", "diff reference.log resumed.log"))


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "[exit 0]" for out in outputs)
