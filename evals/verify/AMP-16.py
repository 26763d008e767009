"""AMP-16: TF32 left off. A training script's start-up without and with the Fix's
``torch.set_float32_matmul_precision("high")``; the Verify prints the precision the script runs with.
Runs in the worker, so it restores the process-wide setting afterwards."""

from __future__ import annotations


def run(case) -> str:
    import torch

    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")  # a fresh process's default
        startup = case.code("Fix", 'set_float32_matmul_precision("high")', role="fix") if case.fixed else "pass"
        return case.exec(f"{startup}\n{case.code('Verify', 'print(torch.get_float32_matmul_precision())')}",
                         {"torch": torch})
    finally:
        torch.set_float32_matmul_precision(saved)


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "high" for out in outputs)
