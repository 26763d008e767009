"""CKPT-07: ``strict=False`` hiding a prefix mismatch. The instrument is the Fix's asserted partial load,
run as written; it must refuse a ``module.``-prefixed state dict (nothing would load) and accept the
same weights once the names are fixed (CKPT-05's prefix strip, done here) with only the new head missing."""

from __future__ import annotations


def run(case) -> str:
    import torch

    torch.manual_seed(0)
    backbone = torch.nn.Linear(4, 4)
    sd = {f"module.backbone.{k}": v for k, v in backbone.state_dict().items()}  # saved from a DDP wrapper
    if case.fixed:
        sd = {k.removeprefix("module."): v for k, v in sd.items()}
    model = torch.nn.Module()
    model.backbone = torch.nn.Linear(4, 4)
    model.classifier = torch.nn.Linear(4, 2)  # the intentionally new head
    check = case.code("Fix", "res = model.load_state_dict(sd, strict=False)")
    report = "\nprint('partial load as intended; missing:', res.missing_keys)"
    return case.exec(check + report, {"model": model, "sd": sd})


def passed(outputs: list[str]) -> bool:
    return all("partial load as intended" in out and "AssertionError" not in out for out in outputs)
