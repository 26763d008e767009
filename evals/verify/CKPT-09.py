"""CKPT-09: an optimizer rebuilt with different parameter groups than the saved one (decay/no-decay split
added) vs rebuilt exactly as when saving (the Fix). The Verify compares the group sizes before loading."""

from __future__ import annotations


def run(case) -> str:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    saved = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = {"optimizer": saved.state_dict()}
    if case.fixed:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the same filter, grouping and order
    else:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    ours = case.code("Verify", "for g in optimizer.param_groups")
    theirs = case.code("Verify", 'for g in ckpt["optimizer"]')
    return case.exec(f"print({ours} == {theirs})", {"optimizer": optimizer, "ckpt": ckpt})


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "True" for out in outputs)
