"""CONV-06: labels 1..5 for a 5-class head (off by one) vs the labels remapped to 0..4 (the Fix's remap,
done here). The instrument is the Fix's label-range print over the loader and the Verify's condition."""

from __future__ import annotations


def run(case) -> str:
    import torch

    labels = torch.arange(1, 6).repeat(4)
    if case.fixed:
        labels = labels - 1  # remap to 0..C-1
    loader = [{"labels": chunk} for chunk in labels.split(4)]
    namespace = {"torch": torch, "loader": loader, "num_classes": 5}
    shown = case.exec(case.code("Fix", "ys = torch.cat("), namespace)
    fits = case.code("Verify", "ys.max() < num_classes")
    return shown + case.exec(f"print('labels fit the head:', bool({fits}))", namespace)


def passed(outputs: list[str]) -> bool:
    return all("labels fit the head: True" in out for out in outputs)
