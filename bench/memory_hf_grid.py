"""The analytic memory model against the real Hugging Face classes, architecture by architecture.

For each small config in ``tests/fixtures/hf_configs/small.json`` (GPT-2, Llama, Qwen2, Mistral with a
sliding window, Gemma 3, Gemma 2 (eager), Phi-3, Mixtral, Qwen2-MoE, BERT, T5, T5 v1.1) and each setting
(fp32, bf16 autocast, pure bf16; checkpointing; LoRA; FSDP over 4 ranks; 128/256/512 tokens), it prints the
analytic allocated peak, the peak of the real class's training step measured in the same run on fake tensors
(CPU, CUDA's kernel choice emulated — the baseline) and their ratio. ``tests/test_memory_hf.py`` holds a
subset to ±5 %; this prints all of it, the wider gaps included.

    python bench/memory_hf_grid.py            # the full grid (~3–6 min on 2 cores)
    python bench/memory_hf_grid.py --quick    # one setting per architecture
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from remote_gpu_trainer.memory.measured import compare_with_analytic  # noqa: E402
from remote_gpu_trainer.tables import format_table  # noqa: E402

CONFIGS = json.loads((ROOT / "tests" / "fixtures" / "hf_configs" / "small.json").read_text())
MIB = 2**20
SETTINGS = [
    {"precision": "fp32"}, {"precision": "bf16_mixed"}, {"precision": "bf16_pure"},
    {"precision": "fp32", "checkpointing": True}, {"precision": "bf16_mixed", "checkpointing": True},
    {"precision": "fp32", "lora": True}, {"precision": "bf16_mixed", "lora": True},
    {"precision": "bf16_mixed", "strategy": "full_shard", "world_size": 4},
    {"precision": "bf16_pure", "seq_len": 128}, {"precision": "bf16_mixed", "seq_len": 512},
]


def label(setting: dict) -> str:
    parts = [setting["precision"]]
    if setting.get("checkpointing"):
        parts.append("ckpt")
    if setting.get("lora"):
        parts.append("LoRA r8")
    if setting.get("strategy"):
        parts.append(f"{setting['strategy']} W={setting['world_size']}")
    parts.append(f"S{setting.get('seq_len', 256)}")
    return " ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one setting per architecture")
    args = parser.parse_args()
    rows, ratios = [], []
    for name, config in CONFIGS.items():
        for setting in SETTINGS[:1] if args.quick else SETTINGS:
            started = time.monotonic()
            try:
                analytic, result = compare_with_analytic(config, **setting)
            except Exception as err:  # print the row and go on: one architecture's failure is a finding
                rows.append([name, label(setting), "-", "-", f"error: {type(err).__name__}: {str(err)[:60]}", "-"])
                continue
            ratio = analytic / result.tracked_bytes
            ratios.append(ratio)
            kernels = ",".join(f"{k}×{v}" for k, v in result.attention_kernels.items()) or "eager"
            rows.append([name, label(setting), f"{analytic / MIB:.2f}", f"{result.tracked_bytes / MIB:.2f}",
                         f"{ratio:.4f}", kernels, f"{time.monotonic() - started:.1f}"])
            print(f"  {name} {label(setting)}: {ratio:.4f}", file=sys.stderr, flush=True)
    import torch
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}; analytic vs the real class on fake "
          "tensors (cuBLAS workspaces left out of both)")
    print(format_table(["architecture", "setting", "analytic MiB", "measured MiB", "analytic/measured",
                        "CUDA SDPA kernel", "s"], rows))
    worst = max(ratios, key=lambda r: abs(r - 1))
    inside = sum(0.95 <= r <= 1.05 for r in ratios)
    print(f"\n{len(ratios)} cases; worst ratio {worst:.4f}; within ±5 %: {inside}/{len(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
