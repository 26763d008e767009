"""How close is fsdp_memory_estimate's analytic model to a real training step?

For each configuration it prints the analytic allocated peak (pure arithmetic), the peak of a real
training step of the built-in re-implementations measured in the same run under FakeTensorMode with
torch's MemTracker/FSDPMemTracker (the baseline; bench/memory_hf_grid.py does the same with the real
Hugging Face classes), and their ratio. On a machine with CUDA it adds ``torch.cuda.max_memory_allocated``
of the same step on the GPU (single-device rows) and analytic/CUDA. The analytic side never reads a
measurement.

    python bench/memory_accuracy.py            # all rows (two 7B rows take ~1 min each on 2 CPU cores)
    python bench/memory_accuracy.py --quick    # toy models only
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from remote_gpu_trainer.memory.analytic import Setup, estimate
from remote_gpu_trainer.memory.architecture import Architecture, load_architecture
from remote_gpu_trainer.memory.measured import MeasureJob, measure, measure_cuda
from remote_gpu_trainer.tables import format_table

MIB = 2**20
#: The facts file's toy GPT (§15 B): vocab 32000, hidden 1024, 8 layers, 16 heads, untied head.
TOY = dataclasses.replace(load_architecture("gpt2"), vocab_size=32000, hidden_size=1024, num_layers=8,
                          num_heads=16, num_kv_heads=16, head_dim=64, intermediate_size=4096, max_positions=512,
                          tie_word_embeddings=False, expected_params=None)
TINY_LLAMA = dataclasses.replace(load_architecture("llama-3-8b"), hidden_size=512, num_layers=6, num_heads=8,
                                 num_kv_heads=2, head_dim=64, intermediate_size=1376, vocab_size=16000,
                                 expected_params=None)
TINY_T5 = dataclasses.replace(load_architecture("t5-3b"), hidden_size=256, num_layers=3, num_decoder_layers=3,
                              num_heads=8, num_kv_heads=8, head_dim=32, intermediate_size=1024, vocab_size=8000,
                              expected_params=None)
TINY_BERT = dataclasses.replace(load_architecture("bert-base-uncased"), hidden_size=256, num_layers=4, num_heads=8,
                                num_kv_heads=8, head_dim=32, intermediate_size=1024, vocab_size=8000,
                                expected_params=None)
TINY_MIXTRAL = dataclasses.replace(load_architecture("mixtral-8x7b"), hidden_size=256, num_layers=4, num_heads=8,
                                   num_kv_heads=2, head_dim=32, intermediate_size=512, moe_intermediate_size=512,
                                   vocab_size=4000, expected_params=None)
TINY_QWEN3_MOE = dataclasses.replace(load_architecture("qwen3-30b-a3b"), hidden_size=256, num_layers=4, num_heads=8,
                                     num_kv_heads=2, head_dim=32, moe_intermediate_size=128, num_experts=16,
                                     vocab_size=4000, expected_params=None)
ATTN = ["c_attn", "attn.c_proj"]
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]

# (label, architecture, knobs); knobs default to single GPU, fp32, AdamW single-tensor, S512, B2.
QUICK: list[tuple[str, Architecture, dict]] = [
    ("toy fp32 AdamW B2", TOY, {}),
    ("toy fp32 AdamW foreach B2", TOY, {"optimizer_impl": "foreach"}),
    ("toy bf16_pure B2", TOY, {"precision": "bf16_pure"}),
    ("toy fp32 SGD-momentum B2", TOY, {"optimizer": "sgd_momentum"}),
    ("toy fp32 B8", TOY, {"micro_batch_size": 8}),
    ("toy fp32 B8 + checkpointing", TOY, {"micro_batch_size": 8, "activation_checkpointing": True}),
    ("toy bf16_pure B8 + checkpointing", TOY, {"precision": "bf16_pure", "micro_batch_size": 8,
                                               "activation_checkpointing": True}),
    ("toy bf16 autocast B2", TOY, {"precision": "bf16_mixed"}),
    ("toy fp32 eager attention B2", TOY, {"attention": "eager"}),
    ("toy LoRA r8 attn, bf16 base", TOY, {"precision": "bf16_pure", "lora_rank": 8, "lora_targets": ATTN}),
    ("toy LoRA r8 attn + checkpointing", TOY, {"precision": "bf16_pure", "lora_rank": 8, "lora_targets": ATTN,
                                               "activation_checkpointing": True}),
    *[(f"toy FSDP full_shard bf16 W={w}", TOY, {"strategy": "full_shard", "precision": "bf16_mixed",
                                                "world_size": w}) for w in (4, 7, 8, 16)],
    ("toy FSDP shard_grad_op bf16 W=8", TOY, {"strategy": "shard_grad_op", "precision": "bf16_mixed",
                                              "world_size": 8}),
    ("toy FSDP hybrid_shard 2x4 bf16", TOY, {"strategy": "hybrid_shard", "precision": "bf16_mixed",
                                             "world_size": 8, "gpus_per_node": 4}),
    ("toy FSDP full_shard fp32 W=3, S16", TOY, {"strategy": "full_shard", "world_size": 3, "seq_len": 16}),
    ("tiny llama GQA bf16_pure B4 S256", TINY_LLAMA, {"precision": "bf16_pure", "micro_batch_size": 4,
                                                      "seq_len": 256}),
    ("tiny llama LoRA qkvo + ckpt", TINY_LLAMA, {"precision": "bf16_pure", "micro_batch_size": 4, "seq_len": 256,
                                                 "lora_rank": 16, "lora_targets": QKVO,
                                                 "activation_checkpointing": True}),
    ("tiny Mixtral-like MoE (8 experts, top-2) fp32 B4 S256", TINY_MIXTRAL, {"micro_batch_size": 4, "seq_len": 256}),
    ("tiny Mixtral-like MoE FSDP bf16 W=4", TINY_MIXTRAL, {"strategy": "full_shard", "precision": "bf16_mixed",
                                                           "world_size": 4, "micro_batch_size": 4, "seq_len": 256}),
    ("tiny Qwen3-MoE (16 experts, top-8) bf16_pure B4 S256", TINY_QWEN3_MOE, {"precision": "bf16_pure",
                                                                              "micro_batch_size": 4, "seq_len": 256}),
    ("tiny T5 fp32 B4 S128", TINY_T5, {"micro_batch_size": 4, "seq_len": 128}),
    ("tiny BERT fp32 B4 S128", TINY_BERT, {"micro_batch_size": 4, "seq_len": 128}),
]
FULL: list[tuple[str, Architecture, dict]] = [
    ("llama-2-7b FSDP full_shard bf16 W=8 S2048", load_architecture("llama-2-7b"),
     {"strategy": "full_shard", "precision": "bf16_mixed", "world_size": 8, "seq_len": 2048, "micro_batch_size": 1,
      "optimizer_impl": "foreach"}),
    ("llama-2-7b LoRA qkvo bf16 1 GPU S2048", load_architecture("llama-2-7b"),
     {"precision": "bf16_pure", "lora_rank": 16, "lora_targets": QKVO, "seq_len": 2048, "micro_batch_size": 1,
      "optimizer_impl": "foreach"}),
]


def job_and_setup(arch: Architecture, knobs: dict) -> tuple[MeasureJob, Setup]:
    k = {"strategy": "ddp", "precision": "fp32", "optimizer": "adamw", "optimizer_impl": "single_tensor",
         "world_size": 1, "seq_len": 512, "micro_batch_size": 2, "activation_checkpointing": False,
         "attention": "sdpa", "lora_rank": None, "lora_targets": [], **knobs}
    k.setdefault("gpus_per_node", k["world_size"])
    adapter = "fp32" if k["precision"] != "bf16_pure" or k["strategy"] == "ddp" else "bf16"
    job = MeasureJob(arch=dataclasses.asdict(arch), adapter_dtype=adapter, **k)
    setup = Setup(num_params=arch.num_params, arch=arch, **{**k, "lora_targets": tuple(k["lora_targets"])})
    return job, setup


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="toy models only")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    rows = []
    ratios = []
    for label, arch, knobs in QUICK + ([] if args.quick else FULL):
        job, setup = job_and_setup(arch, knobs)
        analytic = estimate(setup).allocated_peak_bytes
        started = time.monotonic()
        measured = measure(job).peak_bytes
        seconds = time.monotonic() - started
        ratio = analytic / measured
        ratios.append(ratio)
        real = measure_cuda(job) if cuda and job.strategy == "ddp" and job.world_size == 1 else None
        rows.append([label, f"{analytic / MIB:.1f}", f"{measured / MIB:.1f}", f"{ratio:.4f}",
                     "-" if real is None else f"{real / MIB:.1f}", "-" if real is None else f"{analytic / real:.4f}",
                     f"{seconds:.1f}"])
        print(f"  {label}: analytic/measured {ratio:.4f}", file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}; CUDA: {torch.cuda.get_device_name() if cuda else 'not available'}")
    print(format_table(["config", "analytic MiB", "measured MiB", "analytic/measured", "cuda max_allocated MiB",
                        "analytic/cuda", "measure s"], rows))
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(f"\n{len(rows)} configs; worst analytic/measured ratio {worst:.4f}; "
          f"all within ±5 %: {all(0.95 <= r <= 1.05 for r in ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
