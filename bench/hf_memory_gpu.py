"""Real Hugging Face models on a CUDA GPU: ``torch.cuda.max_memory_allocated`` against ``rgt mem``.

The protocol of issue 28: the class is built from its config (random weights, nothing downloaded) with
``attn_implementation="sdpa"``, ``model.train()``, ``use_cache=False``; AdamW(lr=1e-5, fused or
foreach); ``labels=input_ids``; bf16_mixed/fp16_mixed = fp32 weights under ``torch.autocast`` (fp16 with
a GradScaler), bf16_pure = weights in bf16; checkpointing = ``gradient_checkpointing_enable()``; LoRA =
PEFT's ``get_peft_model``. ``reset_peak_memory_stats()`` before step 1, three steps with
``zero_grad(set_to_none=True)``, then ``max_memory_allocated()``. The estimate is the same question
asked of ``rgt mem`` (``--strategy ddp --world-size 1 ...``), field ``allocated_peak_bytes``; with
``--measured`` also the fake-tensor measurement of the same class on CPU.

One JSON line per row, then a markdown table (measured MiB, estimate MiB, ratio). Each row runs in a
try/except with ``empty_cache()`` after it; rows stop when ``--budget-s`` is spent. Needs torch,
transformers (and peft for the LoRA row) and the project on PYTHONPATH (``tools/``).

    PYTHONPATH=tools python bench/hf_memory_gpu.py                 # on a CUDA machine
    PYTHONPATH=tools python bench/hf_memory_gpu.py --dry-run       # anywhere: builds each class on meta
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from remote_gpu_trainer.memory.architecture import load_config  # noqa: E402  (after the path)

FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"
MIB = 2**20
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]
T5_BASE = {  # google-t5/t5-base config.json (architecture fields)
    "model_type": "t5", "vocab_size": 32128, "d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12,
    "num_decoder_layers": 12, "num_heads": 12, "relative_attention_num_buckets": 32, "dropout_rate": 0.1,
    "feed_forward_proj": "relu", "tie_word_embeddings": True, "decoder_start_token_id": 0, "pad_token_id": 0}
GEMMA3_1B_SHAPE = {  # the gemma-3-1b preset's shape with an explicit 512-token window on 5 of every 6 layers
    "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
    "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 512, "tie_word_embeddings": True,
    "max_position_embeddings": 32768}
SMALL_QWEN3_MOE = {  # Qwen3-MoE layout at a size one GPU holds with Adam: 32 experts, top-4
    "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
    "moe_intermediate_size": 512, "num_experts": 32, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "tie_word_embeddings": False}


@dataclass
class Row:
    case: str
    model: str | dict
    """A config.json folder, a preset name, or a config dict (written to a temporary folder)."""
    precision: str
    optimizer_impl: str
    seq_len: int
    micro_batch_size: int
    checkpointing: bool = False
    lora_rank: int | None = None
    lora_targets: list[str] = field(default_factory=list)
    attention: str = "sdpa"
    issue_mib: float | None = None
    """The H100 figure in issue 28 (torch 2.11, transformers 5.17), for the first five rows."""


ROWS = [
    Row("qwen2.5-0.5b-shape bf16_mixed 1024x4", str(FIXTURES / "qwen2.5-0.5b-shape"), "bf16_mixed", "fused", 1024, 4,
        issue_mib=20077.4),
    Row("tinyllama-1.1b-shape bf16_mixed ckpt 2048x4", str(FIXTURES / "tinyllama-1.1b-shape"), "bf16_mixed", "fused",
        2048, 4, checkpointing=True, issue_mib=18760.7),
    Row("gpt2-124m fp32 foreach 1024x8", str(FIXTURES / "gpt2-124m"), "fp32", "foreach", 1024, 8, issue_mib=14469.6),
    Row("qwen2.5-0.5b-shape bf16_pure 1024x4", str(FIXTURES / "qwen2.5-0.5b-shape"), "bf16_pure", "fused", 1024, 4,
        issue_mib=15432.9),
    Row("tinyllama-1.1b-shape fp32 1024x2", str(FIXTURES / "tinyllama-1.1b-shape"), "fp32", "fused", 1024, 2,
        issue_mib=26621.4),
    Row("qwen2.5-0.5b-shape fp16_mixed GradScaler 1024x4", str(FIXTURES / "qwen2.5-0.5b-shape"), "fp16_mixed",
        "fused", 1024, 4),
    Row("tinyllama-1.1b-shape LoRA r16 qkvo bf16 2048x4", str(FIXTURES / "tinyllama-1.1b-shape"), "bf16_pure",
        "fused", 2048, 4, lora_rank=16, lora_targets=QKVO),
    Row("tinyllama-1.1b-shape bf16_mixed ckpt 8192x1", str(FIXTURES / "tinyllama-1.1b-shape"), "bf16_mixed", "fused",
        8192, 1, checkpointing=True),
    Row("gemma-3-1b-shape window 512 bf16_mixed 1024x2", GEMMA3_1B_SHAPE, "bf16_mixed", "fused", 1024, 2),
    Row("gpt2-124m fp32 eager 1024x8", str(FIXTURES / "gpt2-124m"), "fp32", "foreach", 1024, 8, attention="eager"),
    Row("qwen3-moe small (32 experts top-4) bf16_pure 1024x4", SMALL_QWEN3_MOE, "bf16_pure", "fused", 1024, 4),
    Row("phi-3-mini bf16_pure 2048x2", "phi-3-mini", "bf16_pure", "fused", 2048, 2),
    Row("bert-base-uncased bf16_mixed 512x32", "bert-base-uncased", "bf16_mixed", "fused", 512, 32),
    Row("t5-base fp32 512x8", T5_BASE, "fp32", "fused", 512, 8),
]


def model_path(row: Row, scratch: Path) -> str:
    """What ``rgt mem --model`` gets: the folder, preset, or a folder holding the inline config."""
    if isinstance(row.model, dict):
        folder = scratch / row.case.split()[0]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(row.model))
        return str(folder)
    return row.model


def estimate(row: Row, model: str, measured: bool) -> dict:
    """``rgt mem`` for the row (the tool function the CLI calls), optionally with measure=true."""
    from remote_gpu_trainer.memory.tool import MemoryInput, fsdp_memory_estimate
    from remote_gpu_trainer.toolspec import no_progress

    args = {"model": model, "strategy": "ddp", "world_size": 1, "precision": row.precision, "optimizer": "adamw",
            "optimizer_impl": row.optimizer_impl, "seq_len": row.seq_len, "micro_batch_size": row.micro_batch_size,
            "activation_checkpointing": row.checkpointing, "attention": row.attention, "measure": measured}
    if row.lora_rank:
        args.update(lora_rank=row.lora_rank, lora_targets=row.lora_targets)
    out = fsdp_memory_estimate(MemoryInput(**args), no_progress)
    result = {"estimate_mib": round(out.allocated_peak_bytes / MIB, 1), "estimate_phase": out.peak_phase,
              "params": out.num_params}
    if out.measured:
        result.update(fake_mib=round(out.measured.peak_bytes / MIB, 1), fake_class=out.measured.model_class,
                      fake_kernels=out.measured.attention_kernels)
    return result


def run_cuda(row: Row, config: dict, kernel: str | None = None) -> dict:
    """The issue's protocol on this process's GPU; returns the peak and what ran. ``kernel`` (FLASH_ATTENTION,
    EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH) restricts SDPA to that backend, to see which one a peak matches."""
    import torch

    if kernel:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, kernel)]):
            return run_cuda(row, config)

    from remote_gpu_trainer.memory import hf_models
    from remote_gpu_trainer.memory.architecture import from_hf_config

    arch = from_hf_config(config)
    weights = "bf16" if row.precision == "bf16_pure" else "fp32"
    hf = hf_models.build(config, arch.family, dtype=weights, attention=row.attention,
                         checkpointing=row.checkpointing, lora_rank=row.lora_rank, lora_targets=row.lora_targets,
                         device="cuda")
    model = hf.model
    params = [p for p in model.parameters() if p.requires_grad]
    impl = {"fused": True} if row.optimizer_impl == "fused" else {"foreach": True}
    optimizer = torch.optim.AdamW(params, lr=1e-5, **impl)
    vocab = arch.vocab_size
    ids = torch.randint(0, vocab, (row.micro_batch_size, row.seq_len), device="cuda")
    batch = {"input_ids": ids, "labels": ids}
    if arch.family == "bert":
        batch["labels"] = torch.zeros(row.micro_batch_size, dtype=torch.long, device="cuda")
    half = {"bf16_mixed": torch.bfloat16, "fp16_mixed": torch.float16}.get(row.precision)
    scaler = torch.amp.GradScaler("cuda") if row.precision == "fp16_mixed" else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    for _ in range(3):
        with torch.autocast("cuda", dtype=half or torch.bfloat16, enabled=half is not None):
            loss = model(**batch).loss
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    n = sum(p.numel() for p in model.parameters())
    class_name = hf.class_name
    del model, optimizer, params, hf, batch, ids
    return {"measured_mib": round(peak / MIB, 1), "class": class_name, "params_built": n,
            "step_s": round((time.monotonic() - started) / 3, 3)}


def dry_run(row: Row, config: dict) -> dict:
    """Without CUDA: the class builds on the meta device and has the parameters the estimator counts."""
    from remote_gpu_trainer.memory import hf_models
    from remote_gpu_trainer.memory.architecture import from_hf_config

    arch = from_hf_config(config)
    hf = hf_models.build(config, arch.family, dtype="bf16" if row.precision == "bf16_pure" else "fp32",
                         attention=row.attention, checkpointing=row.checkpointing, lora_rank=row.lora_rank,
                         lora_targets=row.lora_targets)
    return {"measured_mib": None, "class": hf.class_name, "params_built": sum(p.numel() for p in hf.model.parameters())}


def environment(cuda: bool) -> dict:
    import torch
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import peft

        env["peft"] = peft.__version__
    except ImportError:
        env["peft"] = None
    if cuda:
        env.update(gpu=torch.cuda.get_device_name(), capability=".".join(map(str, torch.cuda.get_device_capability())),
                   cudnn=torch.backends.cudnn.version())
    return env


def table(rows: list[dict]) -> str:
    lines = ["| case | class | measured MiB | estimate MiB | estimate / measured | H100 issue-28 MiB |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        measured = r.get("measured_mib")
        ratio = f"{r['ratio']:.3f}" if r.get("ratio") else "—"
        lines.append(f"| {r['case']} | {r.get('class', '—')} | {measured if measured is not None else '—'} | "
                     f"{r.get('estimate_mib', '—')} | {ratio} | {r.get('issue_mib') or '—'} |")
    return "\n".join(lines)


def compare_kernels(rows: list[Row]) -> int:
    """One JSON line per (row, kernel): the measured peak with SDPA limited to one backend, and with eager
    attention; a backend that cannot run the row says why (torch raises "No available kernel")."""
    import dataclasses

    import torch

    with tempfile.TemporaryDirectory() as scratch:
        for row in rows:
            config = load_config(model_path(row, Path(scratch)))[0]
            for kernel in (None, "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION", "FLASH_ATTENTION", "eager"):
                line: dict = {"case": row.case, "kernel": kernel or "sdpa (torch's choice)"}
                try:
                    if kernel == "eager":
                        line.update(run_cuda(dataclasses.replace(row, attention="eager"), config))
                    else:
                        line.update(run_cuda(row, config, kernel))
                except Exception as err:
                    line["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                finally:
                    gc.collect()
                    torch.cuda.empty_cache()
                print(json.dumps(line), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no CUDA: build each class on meta, estimate only")
    parser.add_argument("--measured", action="store_true", help="also run measure=true (fake tensors, CPU) per row")
    parser.add_argument("--budget-s", type=float, default=140.0, help="stop starting rows after this many seconds")
    parser.add_argument("--rows", default="", help="comma-separated row numbers (1-based) to run; default all")
    parser.add_argument("--json-out", default="", help="also write the rows as a JSON list to this file")
    parser.add_argument("--kernels", action="store_true", help="for the chosen --rows: the peak under each SDPA "
                        "backend alone and with eager attention, to see which kernel a measured peak matches")
    args = parser.parse_args()
    started = time.monotonic()
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("no CUDA device: run with --dry-run (estimates only) or on a GPU machine", file=sys.stderr)
        return 2
    print(json.dumps({"environment": environment(cuda)}), flush=True)
    wanted = {int(x) for x in args.rows.split(",") if x.strip()}
    if args.kernels:
        return compare_kernels([row for number, row in enumerate(ROWS, 1) if number in wanted])
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        for number, row in enumerate(ROWS, 1):
            if wanted and number not in wanted:
                continue
            result: dict = {"row": number, "case": row.case, "issue_mib": row.issue_mib}
            if time.monotonic() - started > args.budget_s:
                result["skipped"] = f"time budget of {args.budget_s:g} s spent"
                results.append(result)
                print(json.dumps(result), flush=True)
                continue
            t0 = time.monotonic()
            try:
                model = model_path(row, Path(scratch))
                config = load_config(model)[0]
                result.update(run_cuda(row, config) if cuda else dry_run(row, config))
                result.update(estimate(row, model, args.measured))
                if result.get("measured_mib"):
                    result["ratio"] = round(result["estimate_mib"] / result["measured_mib"], 4)
            except Exception as err:  # one row's failure (OOM, an op the GPU lacks) must not end the run
                result["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            finally:
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
            result["row_s"] = round(time.monotonic() - t0, 1)
            results.append(result)
            print(json.dumps(result), flush=True)
    print()
    print(table(results))
    ratios = [r["ratio"] for r in results if r.get("ratio")]
    if ratios:
        worst = max(ratios, key=lambda x: abs(x - 1))
        print(f"\n{len(ratios)} rows measured; worst estimate/measured {worst:.3f}; all within ±5 %: "
              f"{all(0.95 <= r <= 1.05 for r in ratios)}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
