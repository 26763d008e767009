"""CKPT-08: loading a checkpoint into a model built with another vocabulary size (the mismatch) vs the
model rebuilt with the checkpoint's configuration (the Fix's first advice, done here). The Verify prints
the entry's dict of mismatched shapes, which must be empty."""

from __future__ import annotations


def _model(vocab: int):
    import torch

    return torch.nn.Sequential(torch.nn.Embedding(vocab, 4), torch.nn.Linear(4, vocab))


def run(case) -> str:
    import torch

    saved_vocab = 12  # the checkpoint was trained after resize_token_embeddings(12)
    sd = _model(saved_vocab).state_dict()
    model = _model(saved_vocab if case.fixed else 10)
    return case.exec(f"print({case.code('Verify', 'v.shape != model.state_dict()[k].shape')})",
                     {"sd": sd, "model": model, "torch": torch})


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "{}" for out in outputs)
