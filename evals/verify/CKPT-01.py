"""CKPT-01: a checkpoint cut off mid-write (what a full disk or a kill during ``torch.save`` leaves) vs
the previous complete one the Fix resumes from. The Verify is the entry's two one-liners: the zip check,
then a ``torch.load``."""

from __future__ import annotations


def run(case) -> str:
    import torch

    torch.save(torch.nn.Linear(64, 64).state_dict(), "complete.pt")
    data = open("complete.pt", "rb").read()  # noqa: SIM115 - a whole small file
    with open("ckpt.pt", "wb") as f:
        f.write(data if case.fixed else data[: len(data) // 2])
    zip_check = case.python_c(case.code("Verify", "z.testzip()"))
    load_check = case.python_c(case.code("Verify", "torch.load(sys.argv[1]"))
    return zip_check + load_check


def passed(outputs: list[str]) -> bool:
    return all(out.startswith("ok ") and "Error" not in out for out in outputs)
