"""The next rung on the memory ladder: each candidate change is re-estimated, so every piece of advice
carries the bytes it saves and whether the job then fits, ordered by what it costs.

Cost order (cheapest first): free switches (fused optimizer step, DDP bucket views), a sharding change
(more communication, same math), activation checkpointing (~1/3 more compute), a smaller micro-batch
with gradient accumulation (same math, lower GPU efficiency), lower-precision states (numerics risk),
CPU offload (PCIe-bound, often several times slower), LoRA (a different method), more GPUs (money).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .analytic import ZERO, Breakdown, Setup, estimate
from .architecture import Architecture

#: Catalog entries the advice and notes point to: key -> (file, id). Tests check every one exists.
OOM = "references/training/oom-memory.md"
DIST = "references/training/distributed-launch.md"
REFS: dict[str, tuple[str, str]] = {
    "ladder": (OOM, "OOM-02"),
    "step2": (OOM, "OOM-03"),
    "foreach": (OOM, "OOM-04"),
    "fragmentation": (OOM, "OOM-05"),
    "naive_split": (OOM, "OOM-07"),
    "checkpointing": (OOM, "OOM-08"),
    "logits": (OOM, "OOM-09"),
    "offload": (OOM, "OOM-10"),
    "lora": (OOM, "OOM-11"),
    "autocast": (OOM, "OOM-16"),
    "deepspeed": (OOM, "OOM-17"),
    "sharding": (DIST, "DIST-19"),
    "wrap": (DIST, "DIST-18"),
}


@dataclass(frozen=True)
class Rung:
    action: str
    cost: str
    rank: int
    ref: str | None
    saves_bytes: int | None
    total_after_bytes: int | None
    fits_after: bool | None


def _fits(b: Breakdown) -> bool | None:
    gpu = b.setup.gpu_memory_bytes
    return None if gpu is None else b.total_bytes <= gpu


def _candidates(s: Setup) -> list[tuple[int, str, str, str | None, Callable[[Setup], Setup] | None]]:
    """(rank, action, cost, ref key, change) for every rung that applies to ``s``."""
    out: list[tuple[int, str, str, str | None, Callable[[Setup], Setup] | None]] = []
    torch_opt = s.strategy not in ZERO and s.optimizer in ("adam", "adamw") and s.cpu_offload == "none"
    if torch_opt and s.optimizer_impl == "foreach":
        out.append((0, "Use the fused optimizer step: torch.optim.AdamW(..., fused=True) (foreach=True, the CUDA "
                    "default, materialises a sqrt(v) copy of every trainable state)", "free", "foreach",
                    lambda x: replace(x, optimizer_impl="fused")))
    if s.strategy == "ddp" and s.world_size > 1 and not s.gradient_as_bucket_view:
        out.append((0, "DDP(..., gradient_as_bucket_view=True): gradients become views of the all-reduce "
                    "buckets instead of a second copy", "free", "sharding",
                    lambda x: replace(x, gradient_as_bucket_view=True)))
    if s.world_size > 1:
        if s.strategy in ("ddp", "no_shard", "zero1", "zero2"):
            target = "zero3" if s.strategy in ZERO else "full_shard"
            out.append((1, f"Shard parameters, gradients and optimizer state: strategy={target}", "communication "
                        "(~1.5× DDP's volume; overlapped with compute on a good interconnect)", "sharding",
                        lambda x, t=target: replace(x, strategy=t, cpu_offload="none" if t == "full_shard"
                                                    else x.cpu_offload)))
        if s.strategy == "shard_grad_op":
            out.append((1, "strategy=full_shard: SHARD_GRAD_OP keeps every block's 16-bit weights gathered "
                        "from forward to backward; FULL_SHARD re-gathers them", "one extra all-gather per block "
                        "in backward", "sharding", lambda x: replace(x, strategy="full_shard")))
        if s.strategy == "hybrid_shard" and s.num_nodes > 1:
            out.append((1, "strategy=full_shard: shard across all nodes instead of within each node",
                        "inter-node all-gathers", "sharding", lambda x: replace(x, strategy="full_shard")))
    if s.arch is not None and not s.activation_checkpointing:
        out.append((2, "Activation checkpointing on every block (model.gradient_checkpointing_enable(), or "
                    "checkpoint_wrapper / torch.utils.checkpoint per block)",
                    "one extra forward pass: up to ~1/3 more compute per step", "checkpointing",
                    lambda x: replace(x, activation_checkpointing=True)))
    if s.arch is not None and s.micro_batch_size > 1:
        half = max(1, s.micro_batch_size // 2)
        out.append((3, f"micro_batch_size={half} with twice the gradient accumulation steps (same effective "
                    "batch)", "lower GPU efficiency per step", "ladder",
                    lambda x, h=half: replace(x, micro_batch_size=h, grad_accumulation=True)))
    if s.optimizer in ("adam", "adamw"):
        out.append((4, "8-bit AdamW (bitsandbytes.optim.AdamW8bit): 2 bytes of state per parameter instead of 8",
                    "small numerics risk; needs bitsandbytes", "ladder",
                    lambda x: replace(x, optimizer="adam8bit")))
    if s.precision in ("bf16_mixed", "fp32"):
        out.append((4, "Pure bf16 (parameters, gradients and Adam state in bf16: 8 B/param); use Kahan summation "
                    "or stochastic rounding for long runs", "numerics risk", "autocast",
                    lambda x: replace(x, precision="bf16_pure")))
    if s.cpu_offload == "none" and s.strategy != "ddp":
        mode = "optimizer" if s.strategy in ("zero1", "zero2") else "params_and_optimizer"
        out.append((5, f"CPU offload ({mode}): states in pinned host RAM, the optimizer steps on the CPU",
                    "PCIe-bound: often 2–5× slower steps; needs host RAM", "offload",
                    lambda x, m=mode: replace(x, cpu_offload=m)))
    if s.arch is not None and not s.lora_rank:
        targets = tuple(lin for lin in _default_lora_targets(s))
        out.append((6, f"LoRA (r=16 on {', '.join(targets)}): train adapters only, base weights frozen",
                    "a different method: fewer trainable parameters", "lora",
                    lambda x, t=targets: replace(x, lora_rank=16, lora_targets=t)))
    return out


def _default_lora_targets(s: Setup) -> list[str]:
    return default_lora_targets(s.arch) if s.arch else ["q_proj", "v_proj"]


def default_lora_targets(arch: Architecture) -> list[str]:
    """PEFT's default targets for the family, adapted to the decoder variants' projection names."""
    names = {n.rsplit(".", 1)[-1] for n in arch.linear_names()}
    if "kv_b_proj" in names:  # DeepSeek MLA
        return ["q_b_proj" if "q_b_proj" in names else "q_proj", "kv_b_proj"]
    if "qkv_proj" in names:  # Phi-3
        return ["qkv_proj"]
    return PEFT_DEFAULT_TARGETS[arch.family]


#: PEFT's default ``target_modules`` per architecture (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
PEFT_DEFAULT_TARGETS: dict[str, list[str]] = {"gpt2": ["c_attn"], "bert": ["query", "value"], "t5": ["q", "v"],
                                              "llama": ["q_proj", "v_proj"]}


def more_gpus(s: Setup, b: Breakdown) -> Rung | None:
    """The smallest world size (same GPUs per node) at which a sharded job fits, if any up to 1024."""
    gpu = s.gpu_memory_bytes
    if gpu is None or b.total_bytes <= gpu or s.strategy in ("ddp", "no_shard"):
        return None
    per_node = s.gpus_per_node
    for nodes in range(1, 1025 // per_node + 1):
        world = nodes * per_node
        if world <= s.world_size:
            continue
        trial = estimate(replace(s, world_size=world))
        if trial.total_bytes <= gpu:
            return Rung(f"world_size={world} ({nodes} node{'s' if nodes > 1 else ''} × {per_node} GPUs)",
                        "more GPUs", 7, "ladder", b.total_bytes - trial.total_bytes, trial.total_bytes, True)
    return None


def ladder(s: Setup, b: Breakdown) -> list[Rung]:
    """The rungs to climb, cheapest first.

    With a GPU size: a cumulative plan — take the cheapest change that lowers the total, apply it, and
    repeat from the new setup until the job fits (each rung's saving is relative to the previous one).
    Without one: every applicable change on its own, cheapest first, then by bytes saved.
    """
    if s.gpu_memory_bytes is None:
        rungs = [r for r in (_try(s, b, c) for c in _candidates(s)) if r is not None]
        return sorted(rungs, key=lambda r: (r.rank, -(r.saves_bytes or 0)))
    plan: list[Rung] = []
    current, current_b = s, b
    for _ in range(12):
        if current_b.total_bytes <= s.gpu_memory_bytes:
            break
        options = [(r, c) for c in _candidates(current) if (r := _try(current, current_b, c)) is not None]
        if not options:
            break
        rung, change = min(options, key=lambda rc: (rc[0].rank, -(rc[0].saves_bytes or 0)))
        plan.append(rung)
        current = change[4](current)  # type: ignore[misc]
        current_b = estimate(current)
    if current_b.total_bytes > s.gpu_memory_bytes:
        extra = more_gpus(current, current_b)
        if extra is not None:
            plan.append(extra)
    return plan


def advice_mode(s: Setup, rungs: list[Rung]) -> tuple[str, str]:
    """Whether the rungs stack or are alternatives, in words for both output forms."""
    no_gpu = ("No fits/does-not-fit line: no GPU size was given — pass gpu_memory_gib (e.g. 79.3 for an 80 GB "
              "H100) and the advice becomes a cumulative plan.")
    if not rungs:
        return "none", "advice: none needed (it fits)." if s.gpu_memory_bytes else f"advice: nothing applies. {no_gpu}"
    if s.gpu_memory_bytes is None:
        return "alternatives", ("advice — alternatives, cheapest first: each line is one change on its own from this "
                                f"setup (the savings do not add up). {no_gpu}")
    return "cumulative", ("advice — a cumulative plan, cheapest first: apply the rungs in order; each total "
                          "already includes the rungs above it.")


def _try(s: Setup, b: Breakdown, candidate) -> Rung | None:
    rank, action, cost, ref, change = candidate
    trial = estimate(change(s))
    saved = b.total_bytes - trial.total_bytes
    return Rung(action, cost, rank, ref, saved, trial.total_bytes, _fits(trial)) if saved > 0 else None


def largest_micro_batch(s: Setup, limit: int = 4096) -> int | None:
    """The largest micro-batch that still fits (``None`` without an architecture or GPU size)."""
    gpu = s.gpu_memory_bytes
    if s.arch is None or gpu is None or estimate(replace(s, micro_batch_size=1)).total_bytes > gpu:
        return None
    lo, hi = 1, 2
    while hi <= limit and estimate(replace(s, micro_batch_size=hi)).total_bytes <= gpu:
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate(replace(s, micro_batch_size=mid)).total_bytes <= gpu:
            lo = mid
        else:
            hi = mid
    return lo
