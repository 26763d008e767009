"""CKPT-05: a state dict saved from a DDP/DataParallel wrapper (``module.`` prefix) loaded into the bare
model, without and with the Fix's ``consume_prefix_in_state_dict_if_present``. The Verify prints what
``model.load_state_dict(sd)`` returns with the default ``strict=True``."""

from __future__ import annotations


def run(case) -> str:
    import torch

    torch.manual_seed(0)
    wrapped = torch.nn.DataParallel(torch.nn.Linear(3, 2))  # keys "module.weight", "module.bias"
    path = "ckpt.pt"
    torch.save(wrapped.state_dict(), path)
    model = torch.nn.Linear(3, 2)
    namespace = {"torch": torch, "model": model, "path": path,
                 "sd": torch.load(path, map_location="cpu", weights_only=True)}
    if case.fixed:
        case.exec(case.code("Fix", "consume_prefix_in_state_dict_if_present(sd", role="fix"), namespace)
    return case.exec(f"print({case.code('Verify', 'model.load_state_dict(sd)')})", namespace)


def passed(outputs: list[str]) -> bool:
    return all("<All keys matched successfully>" in out for out in outputs)
