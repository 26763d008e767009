"""On a real NVIDIA GPU: the analytic peak against ``torch.cuda.max_memory_allocated`` of the same step.

Skipped without a GPU (conftest's ``gpu`` marker). The toy GPT is large enough (~0.6–5 GiB) that
CUDA's 512-byte rounding and the cuBLAS workspace are noise; CUDA's attention kernels (flash for
16-bit, memory-efficient for fp32) keep the same tensors the analytic model counts, give or take
padding of the logsumexp, so ±10 % is the bound (torch's own FSDP tracker tests use ±10 %).
"""

from __future__ import annotations

import dataclasses

import pytest

from remote_gpu_trainer.memory.analytic import Setup, estimate
from remote_gpu_trainer.memory.architecture import load_architecture
from remote_gpu_trainer.memory.measured import MeasureJob, measure_cuda

pytestmark = pytest.mark.gpu

TOY = dataclasses.replace(load_architecture("gpt2"), vocab_size=32000, hidden_size=1024, num_layers=8,
                          num_heads=16, num_kv_heads=16, head_dim=64, intermediate_size=4096, max_positions=512,
                          tie_word_embeddings=False, expected_params=None)


@pytest.mark.parametrize("knobs", [
    {"precision": "fp32"},
    {"precision": "bf16_pure"},
    {"precision": "bf16_mixed"},
    {"precision": "fp32", "activation_checkpointing": True, "micro_batch_size": 8},
    {"precision": "bf16_pure", "lora_rank": 8, "lora_targets": ["c_attn", "attn.c_proj"]},
    {"precision": "fp32", "optimizer_impl": "foreach"},
], ids=["fp32", "bf16_pure", "autocast", "checkpointing", "lora", "foreach"])
def test_analytic_peak_matches_cuda_max_memory_allocated(knobs):
    pytest.importorskip("torch")
    k = {"strategy": "ddp", "precision": "fp32", "optimizer": "adamw", "optimizer_impl": "fused", "world_size": 1,
         "gpus_per_node": 1, "seq_len": 512, "micro_batch_size": 2, "activation_checkpointing": False,
         "attention": "sdpa", "lora_rank": None, "lora_targets": [], **knobs}
    real = measure_cuda(MeasureJob(arch=dataclasses.asdict(TOY), **k))
    analytic = estimate(Setup(num_params=TOY.num_params, arch=TOY, dropout=False,
                              **{**k, "lora_targets": tuple(k["lora_targets"])})).allocated_peak_bytes
    assert 0.90 <= analytic / real <= 1.10, (analytic, real)
