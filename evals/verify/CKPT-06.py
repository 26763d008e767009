"""CKPT-06: a state dict saved from a ``torch.compile`` wrapper (``_orig_mod.`` prefix) loaded into the
uncompiled model, without and with the Fix's prefix strip. The Verify prints what ``load_state_dict``
with ``strict=True`` reports."""

from __future__ import annotations


def run(case) -> str:
    import torch

    torch.manual_seed(0)
    sd = torch.compile(torch.nn.Linear(3, 2)).state_dict()  # keys "_orig_mod.weight", "_orig_mod.bias"
    model = torch.nn.Linear(3, 2)
    namespace = {"sd": sd, "model": model}
    if case.fixed:
        strip = case.code("Fix", 'consume_prefix_in_state_dict_if_present(sd, "_orig_mod.")', role="fix")
        case.exec(f"from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present\n{strip}", namespace)
    return case.exec(case.code("Verify", "print(model.load_state_dict(sd))"), namespace)


def passed(outputs: list[str]) -> bool:
    return all("<All keys matched successfully>" in out for out in outputs)
