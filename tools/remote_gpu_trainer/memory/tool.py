"""fsdp_memory_estimate / ``rgt mem``: will this training job fit, per GPU, and what to change if not.

Thin glue: resolve the input into an ``analytic.Setup`` (clear errors for impossible combinations),
run the estimate, explain it (notes), climb the advice ladder, optionally run the measured check in a
child process, and render GiB tables for the CLI. Nothing heavy is imported here.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from ..errors import InputError
from ..models import EntryRef, StrictModel, Verdict
from ..tables import GIB, format_table, gib
from ..toolspec import Progress, ToolSpec
from ..torch_hint import no_training_torch, torch_missing
from ..trainenv.child import child_environ
from ..trainenv.find import ActivateText, PythonPath, TrainingEnv, activate_field, find_training_env
from . import advice as ladder
from .analytic import BYTES, FSDP, ZERO, Breakdown, Setup, estimate
from .architecture import Architecture, load_architecture, load_config, presets
from .deepspeed_compat import header, zero2_table, zero3_table

Strategy = Literal["ddp", "no_shard", "zero1", "zero2", "zero3", "full_shard", "shard_grad_op", "hybrid_shard"]
Precision = Literal["fp32", "fp16_mixed", "bf16_mixed", "bf16_pure", "fp16_pure"]
Optimizer = Literal["adamw", "adam", "sgd", "sgd_momentum", "adam8bit", "adafactor"]
Offload = Literal["none", "optimizer", "params_and_optimizer"]
DEFAULT_SEQ_LEN = 2048
MAX_MEASURED_WORLD = 1024
MAX_MEASURED_BLOCKS = 256


def _count_as_text(value: object) -> object:
    """A JSON number (7000000000, 7e9) becomes text, so one parser (``parse_count``) reads every spelling."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(int(value)) if float(value).is_integer() else repr(value)
    return value


#: num_params as the caller wrote it: 7000000000, 7e9, "7B", "70b", "1.5M" (parsed in ``parse_count``).
CountText = Annotated[str | None, BeforeValidator(_count_as_text)]


class MemoryInput(StrictModel):
    model: str | None = Field(None, description="A preset by key or Hugging Face id in any usual spelling "
                              "(meta-llama/Llama-3.1-8B, Qwen2.5-7B, llama3-70b; families: Llama 2/3.x, Qwen2.5/3 "
                              "incl. MoE, Mistral/Mixtral, Gemma 2/3, Phi-3/4, DeepSeek-V2/V3, GPT-OSS, GPT-2, BERT, "
                              "T5), "
                              "a path to a Hugging Face config.json or the model folder, or an org/name id in the "
                              "local Hugging Face cache. Gives exact parameter counts, layer sizes and activations. "
                              "Give exactly one of model, num_params, weights_gb.", examples=["llama-3.1-8b"])
    num_params: CountText = Field(None, description="Total parameters, when there is no config "
                                                 "(states only: activations need model): an integer, 7e9, 7B, "
                                                 "70b, 1.5M, 350k or 1.2T.", examples=["7B"])
    weights_gb: float | None = Field(None, gt=0, le=1e6, description="Size of the model's weights as the user states "
                                     "it, decimal GB (e.g. the safetensors files), read with weights_dtype.")
    weights_dtype: Literal["fp32", "bf16", "fp16"] = Field("bf16", description="dtype of weights_gb.")
    largest_layer_params: int | None = Field(None, ge=1, le=10**13, description="Largest module's own parameters "
                                             "(DeepSpeed ZeRO-3 working set). Derived from model when known.")
    world_size: int = Field(1, ge=1, le=65536, description="GPUs in the job.")
    gpus_per_node: int | None = Field(None, ge=1, le=64, description="GPUs the job uses per node (default: "
                                      "world_size up to 8). HYBRID_SHARD shards within a node.")
    strategy: Strategy = Field("full_shard", description="ddp, no_shard (FSDP replicate), zero1/zero2/zero3 "
                               "(DeepSpeed), full_shard, shard_grad_op, hybrid_shard (FSDP).")
    precision: Precision = Field("bf16_mixed", description="fp32; *_mixed = fp32 master params with 16-bit compute "
                                 "(FSDP MixedPrecision, DeepSpeed bf16/fp16, or autocast under DDP); *_pure = "
                                 "params, grads and optimizer state in 16-bit.")
    optimizer: Optimizer = Field("adamw", description="Optimizer (adam8bit = bitsandbytes AdamW8bit; adafactor = "
                                 "torch.optim.Adafactor, factored second moment).")
    optimizer_impl: Literal["foreach", "fused", "single_tensor"] = Field(
        "foreach", description="torch optimizer implementation: foreach is the CUDA default and keeps a sqrt(v) "
        "copy of all states during step(); fused keeps none.")
    cpu_offload: Offload = Field("none", description="none; optimizer (DeepSpeed ZeRO-Offload); "
                                 "params_and_optimizer (FSDP CPUOffloadPolicy or ZeRO-3 offload_param).")
    seq_len: int | None = Field(None, ge=1, le=10_000_000, description=f"Tokens per sample (default "
                                f"{DEFAULT_SEQ_LEN}, capped at the model's learned positions).")
    micro_batch_size: int = Field(1, ge=1, le=1_000_000, description="Samples per GPU per forward pass.")
    activation_checkpointing: bool = Field(False, description="Full activation checkpointing of every block.")
    attention: Literal["sdpa", "eager"] = Field("sdpa", description="sdpa = torch's scaled_dot_product_attention "
                                                "as transformers calls it: on CUDA flash/cuDNN (fp16/bf16), "
                                                "memory-efficient, or the math fallback (fp32 grouped-query "
                                                "attention; keeps seq² scores); eager = math attention (keeps seq² "
                                                "scores).")
    lora_rank: int | None = Field(None, ge=1, le=4096, description="LoRA rank: base frozen, adapters trained.")
    lora_targets: list[str] = Field(default_factory=list, description="Linear layers to adapt, PEFT-style "
                                    "suffixes (e.g. q_proj k_proj v_proj o_proj) or all-linear. Default: PEFT's "
                                    "default for the architecture.")
    lora_base_dtype: Literal["auto", "fp32", "bf16", "fp16", "nf4"] = Field(
        "auto", description="Storage of the frozen base under LoRA (auto = the precision's parameter dtype; nf4 = "
        "QLoRA 4-bit).")
    gradient_accumulation_steps: int = Field(1, ge=1, le=1_000_000, description="Micro-batches per optimizer step "
                                             "(>1 keeps gradients resident through forward).")
    gradient_as_bucket_view: bool = Field(False, description="DDP only: gradients are views into the all-reduce "
                                          "buckets (saves one gradient copy).")
    ep: int = Field(1, ge=1, le=65536, description="Mixture-of-experts only: expert-parallel group size. Each "
                    "GPU holds num_experts/ep routed experts; FSDP/ZeRO shards each expert over world_size/ep GPUs "
                    "and every other weight over all of them. 1 = experts sharded like any weight (FSDP then "
                    "gathers all experts of a block at once).")
    capacity_factor: float | None = Field(None, gt=0, le=64, description="Mixture-of-experts routing: unset = "
                                          "dropless (every top-k choice runs); a number = fixed per-expert buffers "
                                          "of ceil(cf × tokens × top_k / num_experts) rows (GShard/Switch style): "
                                          "expert activations and dispatch buffers scale with it.")
    gpu_memory_gib: float | None = Field(None, gt=0, le=4096, description="Memory per GPU in GiB (80 GB A100/H100 "
                                         "≈ 79.3, H200 ≈ 139.8): answers 'fits?'.")
    measure: bool = Field(False, description="Also run one real training step under FakeTensorMode with torch's "
                          "memory tracker (child process, any world size) and compare: the real Hugging Face class "
                          "when transformers is installed (PEFT for LoRA), CUDA's attention kernel, dropout and "
                          "autocast emulated. Seconds for small models, minutes for 7B+.")
    measure_timeout_s: float = Field(600, ge=10, le=3600, description="Time limit for measure=true, seconds.")
    python: PythonPath = Field(None, min_length=1, max_length=4096, description="measure=true: the training "
                               "interpreter to measure with (absolute or ~ path); default: found (the result's "
                               "training_env says which and how)")
    activate: ActivateText = activate_field()


class PhaseOut(StrictModel):
    name: str
    bytes: int


class DeepSpeedOut(StrictModel):
    exact: bool = Field(description="true when model_states_bytes is DeepSpeed's own estimate, to the byte")
    printed: str = Field(description="DeepSpeed's estimate_zero*_model_states_mem_needs_all_cold output")
    matched_options: str = Field(description="The printed row this configuration corresponds to")


class NoteOut(StrictModel):
    text: str
    ref: EntryRef | None


class AdviceOut(StrictModel):
    """One rung. ``advice_mode`` on the result says whether rungs stack or are alternatives."""

    action: str
    cost: str
    saves_bytes: int | None
    total_after_bytes: int | None
    fits_after: bool | None
    ref: EntryRef | None


class MeasuredOut(StrictModel):
    peak_bytes: int = Field(description="Peak of a real training step on fake tensors (CPU, torch's memory tracker) "
                            "plus the corrections a CPU step cannot show: comparable with "
                            "torch.cuda.max_memory_allocated")
    analytic_peak_bytes: int = Field(description="The analytic allocated peak for exactly the measured setup")
    ratio: float = Field(description="analytic / measured")
    engine: Literal["transformers", "builtin"] = Field(description="transformers: the real Hugging Face class built "
                                                       "from the config; builtin: the project's plain-torch "
                                                       "re-implementation (transformers not installed, or no config)")
    model_class: str = Field(description="The class that ran, e.g. GPT2LMHeadModel")
    transformers_version: str | None
    attention_kernels: dict[str, int] = Field(description="CUDA SDPA kernel per attention call of one step, chosen by "
                                              "torch's rules for this dtype, head dim, mask and dropout")
    corrections: dict[str, int] = Field(description="Bytes a CUDA step allocates that a CPU step cannot, included in "
                                        "peak_bytes")
    cannot_show: list[str] = Field(description="What a CPU fake-tensor step cannot show of a CUDA step")
    categories: dict[str, int] = Field(description="Tracker categories at the measured peak, bytes")
    analytic_breakdown: dict[str, int] = Field(description="The analytic peak's parts for the same setup, bytes")
    analytic_peak_phase: str
    peak_phase: str
    seconds: float
    tracker: str
    compared_setup: str = Field(description="How the measured setup differs from the question, and which engine ran "
                                "and why")


class MemoryOutput(StrictModel):
    model: str
    num_params: int = Field(description="Parameters stored (all experts of a mixture-of-experts model)")
    active_params: int | None = Field(description="Parameters one token runs through: all but the routed "
                                      "experts, plus top-k of them, without the input embedding lookup (null "
                                      "without model)")
    ep: int = Field(description="Expert-parallel group size (1 for dense models)")
    experts_per_gpu: int | None = Field(description="Routed experts each GPU holds (mixture-of-experts only)")
    capacity_factor: float | None
    trainable_params: int
    largest_layer_params: int | None
    world_size: int
    gpus_per_node: int
    shard_group: int = Field(description="GPUs that share one copy of the states (N)")
    strategy: str
    precision: str
    optimizer: str
    seq_len: int | None
    micro_batch_size: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    working_set_bytes: int = Field(description="Gathered FSDP units / resident unsharded 16-bit params / ZeRO-3 "
                                   "gathered layer / autocast weight copies, at their largest")
    model_states_bytes: int = Field(description="params + grads + optimizer + working set (DeepSpeed's definition)")
    activations_bytes: int | None
    logits_bytes: int | None = Field(description="Cross-entropy: fp32 log-softmax kept + its backward transient")
    temporaries_bytes: int = Field(description="Optimizer-step temporaries (foreach) and DeepSpeed buckets")
    forward_backward_peak_bytes: int
    optimizer_step_peak_bytes: int
    allocated_peak_bytes: int = Field(description="Tensor bytes at the peak (≈ torch.cuda.max_memory_allocated)")
    peak_phase: str
    attention_kernels: dict[str, int] = Field(description="Attention calls per kernel in one forward: the CUDA SDPA "
                                              "kernel torch picks (flash, efficient, math) or eager")
    overhead_bytes: int = Field(description="CUDA context, NCCL, allocator reserve (invisible to trackers)")
    total_bytes: int = Field(description="Expected per-GPU usage as nvidia-smi shows it")
    cpu_bytes_per_node: int = Field(description="Host RAM per node for offloaded states (pinned)")
    naive_split_bytes: int = Field(description="Weights alone divided by world_size (the common first guess)")
    gpu_memory_bytes: int | None
    fits: bool | None
    verdict: Verdict
    headroom_bytes: int | None
    max_micro_batch_size: int | None = Field(description="Largest micro-batch that fits (when it fits)")
    phases: list[PhaseOut]
    deepspeed: DeepSpeedOut | None
    notes: list[NoteOut]
    assumptions: list[str]
    advice_mode: Literal["cumulative", "alternatives", "none"] = Field(
        description="cumulative: with a GPU size the rungs are a plan — apply them in order, each saving and "
        "total assumes the rungs above it; alternatives: without a GPU size each rung is one change on its own "
        "from the current setup (savings do not add up); none: no advice (it fits)")
    advice_note: str = Field(description="The advice_mode in words, and why there is no fits line without a GPU size")
    advice: list[AdviceOut]
    measured: MeasuredOut | None
    measured_skipped: str | None = Field(None, description="Why measure=true did not run (e.g. torch is not "
                                         "installed here) and how to enable it; the CLI exits 4 in that case")
    training_env: TrainingEnv | None = Field(None, description="measure=true: the interpreter measured with and how "
                                             "it was found")


# ---- resolving the input --------------------------------------------------------------------------
def _architecture(args: MemoryInput) -> tuple[Architecture | None, int, str]:
    given = [n for n in ("model", "num_params", "weights_gb") if getattr(args, n) is not None]
    if len(given) != 1:
        raise InputError("model", "give exactly one of model, num_params, weights_gb"
                         + (f" (got {', '.join(given)})" if given else ""),
                         allowed=[*sorted(presets()), "<path to config.json>", "num_params=<int>", "weights_gb=<GB>"])
    if args.model is not None:
        arch = load_architecture(args.model)
        return arch, arch.num_params, f"{args.model} ({arch.describe()})"
    if args.num_params is not None:
        n = parse_count(args.num_params)
        return None, n, f"{n:,} parameters"
    assert args.weights_gb is not None
    n = int(args.weights_gb * 1e9 / BYTES[args.weights_dtype])
    return None, n, f"{args.weights_gb:g} GB of {args.weights_dtype} weights = {n:,} parameters"


_SCALE = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


def parse_count(value: int | float | str) -> int:
    """``7e9``, ``7B``, ``70b``, ``1.5M``, ``350k``, ``1.2T``, ``7_000_000_000`` or an int → parameters."""
    examples = ["7000000000", "7e9", "7B", "70b", "1.5M"]
    if isinstance(value, bool):
        raise InputError("num_params", f"{value!r} is not a parameter count", allowed=examples)
    if isinstance(value, int | float):
        n = value
    else:
        match = _COUNT.match(value)
        if not match:
            raise InputError("num_params", f"{value!r} is not a parameter count (a number with an optional k, M, "
                             "B or T suffix)", allowed=examples)
        n = float(match.group(1).replace(",", "").replace("_", "")) * _SCALE[match.group(2).lower()]
    if not 1 <= n <= 10**14 or n != n:
        raise InputError("num_params", f"{value!r} is outside 1 … 1e14 parameters", allowed=examples)
    return round(n)


def resolve(args: MemoryInput) -> tuple[Setup, str, list[str]]:
    """Validate combinations and build the Setup; returns it, a model label and the assumptions made."""
    arch, n, label = _architecture(args)
    assumed: list[str] = []
    gpn = args.gpus_per_node or min(args.world_size, 8)
    if gpn > args.world_size:
        raise InputError("gpus_per_node", f"{gpn} is more than world_size {args.world_size}")
    if args.world_size % gpn:
        raise InputError("gpus_per_node" if args.gpus_per_node else "world_size",
                         f"world_size {args.world_size} is not a multiple of gpus_per_node {gpn}: pass the GPUs "
                         "the job uses on each node")
    s = args.strategy
    allowed_offload = {"ddp": ["none"], "no_shard": ["none", "params_and_optimizer"],
                       "zero1": ["none", "optimizer"], "zero2": ["none", "optimizer"]}.get(
        s, ["none", "optimizer", "params_and_optimizer"] if s == "zero3" else ["none", "params_and_optimizer"])
    if args.cpu_offload not in allowed_offload:
        why = {"ddp": "DDP keeps everything on the GPU",
               "zero1": "ZeRO-1/2 offload only the optimizer", "zero2": "ZeRO-1/2 offload only the optimizer"}.get(
            s, "FSDP offloads parameters, gradients and optimizer state together (CPUOffloadPolicy)")
        raise InputError("cpu_offload", f"{args.cpu_offload!r} does not exist for {s}: {why}", allowed=allowed_offload)
    if args.lora_rank is None and (args.lora_targets or args.lora_base_dtype != "auto"):
        raise InputError("lora_rank", "lora_targets/lora_base_dtype need lora_rank")
    if args.lora_rank is not None and arch is None:
        raise InputError("model", "LoRA needs the architecture to size the adapters: pass model (a preset or "
                         "config.json)", allowed=sorted(presets()))
    targets = tuple(args.lora_targets)
    if args.lora_rank and not targets:
        targets = tuple(ladder.default_lora_targets(arch))  # type: ignore[arg-type]
        assumed.append(f"LoRA targets: PEFT's default for {arch.model_type} ({', '.join(targets)}).")  # type: ignore[union-attr]
    if arch is not None and targets:
        arch.lora_linears(list(targets))  # raises InputError for unknown targets
    seq_len = args.seq_len
    if arch is not None:
        learned = arch.family in ("gpt2", "bert")
        if seq_len is None:
            seq_len = min(DEFAULT_SEQ_LEN, arch.max_positions) if learned else DEFAULT_SEQ_LEN
            assumed.append(f"seq_len {seq_len} (not given).")
        elif learned and seq_len > arch.max_positions:
            raise InputError("seq_len", f"{seq_len} exceeds {arch.model_type}'s {arch.max_positions} learned "
                             "position embeddings", allowed=[f"1..{arch.max_positions}"])
    moe = arch is not None and arch.is_moe
    if (args.ep > 1 or args.capacity_factor is not None) and not moe:
        field = "ep" if args.ep > 1 else "capacity_factor"
        raise InputError(field, "applies to mixture-of-experts models only (pass model as an MoE preset or config: "
                         "mixtral, qwen2_moe/qwen3_moe, deepseek_v2/v3, gpt_oss)",
                         allowed=["1"] if field == "ep" else ["unset"])
    if moe and args.ep > 1:
        e = arch.num_experts  # type: ignore[union-attr]
        fitting = [d for d in range(1, min(e, args.world_size) + 1) if e % d == 0 and args.world_size % d == 0]
        if e % args.ep or args.world_size % args.ep:
            raise InputError("ep", f"{args.ep} must divide both num_experts ({e}) and world_size ({args.world_size})",
                             allowed=fitting)
    attention = args.attention
    if arch is not None and (arch.attention_softcap or arch.attention_sinks) and attention == "sdpa":
        attention = "eager"
        why = "attention logit soft-capping" if arch.attention_softcap else "attention sinks"
        assumed.append(f"{arch.model_type}: eager attention — transformers has no SDPA path for {why} (eager keeps "
                       "batch × heads × seq² scores per layer).")
    largest = args.largest_layer_params or (arch.largest_layer_params() if arch else None)
    setup = Setup(
        num_params=n, arch=arch, largest_layer_params=largest, world_size=args.world_size, gpus_per_node=gpn,
        strategy=s, precision=args.precision, optimizer=args.optimizer, optimizer_impl=args.optimizer_impl,
        cpu_offload=args.cpu_offload, seq_len=seq_len or DEFAULT_SEQ_LEN, micro_batch_size=args.micro_batch_size,
        activation_checkpointing=args.activation_checkpointing, attention=attention,
        lora_rank=args.lora_rank, lora_targets=targets, lora_base_dtype=args.lora_base_dtype,
        grad_accumulation=args.gradient_accumulation_steps > 1, gradient_as_bucket_view=args.gradient_as_bucket_view,
        gpu_memory_bytes=int(args.gpu_memory_gib * GIB) if args.gpu_memory_gib else None, ep=args.ep,
        capacity_factor=args.capacity_factor)
    if moe:
        assumed.append("MoE routing " + ("dropless (every top-k choice runs; balanced load assumed)"
                                         if args.capacity_factor is None else
                                         f"with capacity factor {args.capacity_factor:g} (fixed per-expert buffers)")
                       + "; expert activations follow the static-dispatch layout of the measured model.")
    return setup, label, assumed


# ---- explaining ---------------------------------------------------------------------------------------
def _g(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def notes_for(b: Breakdown, verdict: Verdict) -> list[tuple[str, str | None]]:
    """Explanations of this result, each with the catalog entry (``advice.REFS`` key) that goes deeper."""
    s = b.setup
    out: list[tuple[str, str | None]] = list(b.notes)
    w_dtype = "bf16" if s.precision in ("bf16_mixed", "bf16_pure") else ("fp16" if "fp16" in s.precision else "fp32")
    weights = s.num_params * BYTES[w_dtype]
    if s.world_size > 1:
        out.append((
            f"Naive split: the {w_dtype} weights ({weights / 1e9:.1f} GB) divided by {s.world_size} GPUs is "
            f"{b.naive_split_bytes / 1e9:.2f} GB ({_g(b.naive_split_bytes)}) each. Training needs "
            f"{_g(b.total_bytes)} per GPU here: that figure leaves out gradients ({_g(b.grads_bytes)}), optimizer "
            f"state ({_g(b.optimizer_bytes)}), "
            + ("fp32 master weights (the sharded params are fp32: "
               f"{_g(b.params_bytes)}), " if s.mixed and s.strategy in FSDP else "")
            + (f"the gathered working set ({_g(b.working_set_bytes)}), activations and logits "
               f"({_g((b.activations_bytes or 0) + (b.logits_bytes or 0))}, never sharded), "
               if s.arch is not None else "the gathered working set, activations and logits (never sharded; not "
               "estimated without model), ")
            + f"and CUDA context, NCCL and allocator reserve ({_g(b.overhead_bytes)}).", "naive_split"))
    if b.optimizer_bytes and s.cpu_offload == "none":
        out.append((f"Optimizer state ({_g(b.optimizer_bytes)}) is created lazily by the first optimizer.step(): "
                    "step 1's forward/backward runs without it, so a job that survives step 1 can still run out of "
                    "memory at step 2. Judge a configuration by step 2 onward.", "step2"))
    if s.arch is not None and s.arch.is_moe:
        a = s.arch
        out.append((f"Mixture of experts: all {a.num_params / 1e9:.1f}B parameters are stored and trained — every "
                    f"expert has weights, gradients and optimizer state — while a token runs through "
                    f"{a.active_params / 1e9:.1f}B (top-{a.experts_per_token} of {a.num_experts} experts): states "
                    "scale with the total, compute and activations with the active count.", "naive_split"))
        if s.ep > 1:
            out.append((f"Expert parallelism ep={s.ep}: each GPU holds {a.num_experts // s.ep} of {a.num_experts} "
                        f"experts, sharded over {max(1, s.shard_group // s.ep)} GPUs; tokens reach their experts "
                        "by all-to-all (dispatch and combine buffers are transient). FSDP then gathers only the "
                        "local experts of a block.", "sharding"))
        elif s.strategy in FSDP and s.world_size > 1:
            out.append(("ep=1: FSDP gathers all experts of a block at once (a large working set); expert "
                        "parallelism (ep > 1) gathers only the local ones.", "sharding"))
        cf = s.capacity_factor
        out.append((("Dropless routing: expert activations assume balanced top-k load; an unbalanced batch sends "
                     "more rows to the busiest expert." if cf is None else
                     f"Capacity factor {cf:g}: each expert's buffer holds ceil({cf:g} × tokens × top-k / experts) "
                     "rows — expert activations and dispatch buffers scale with it; tokens over capacity are "
                     "dropped."), "checkpointing"))
    if s.strategy == "shard_grad_op":
        fs = estimate(replace(s, strategy="full_shard"))
        out.append((f"SHARD_GRAD_OP keeps every block's 16-bit weights gathered from forward to backward "
                    f"(working set {_g(b.working_set_bytes)}); it saves all-gathers, not memory. FULL_SHARD needs "
                    f"{_g(fs.total_bytes)} per GPU ({_g(b.total_bytes - fs.total_bytes)} less).", "sharding"))
    if s.strategy == "hybrid_shard":
        out.append((f"HYBRID_SHARD shards over the {s.gpus_per_node} GPUs of a node (N = {s.shard_group}) and "
                    "replicates across nodes: per-GPU states shrink with GPUs per node, not with nodes.", "sharding"))
    if s.strategy in FSDP and s.arch is not None:
        out.append(("This assumes one FSDP unit per transformer block; without an auto-wrap policy (FSDP1) or "
                    "per-block fully_shard (FSDP2) the whole model is gathered at once.", "wrap"))
    if s.strategy == "ddp" and s.world_size > 1:
        out.append(("DDP replicates everything on every GPU and keeps its gradient buckets beside the .grad "
                    "tensors" + ("" if s.gradient_as_bucket_view else " (+1× gradients; gradient_as_bucket_view="
                                 "True removes the copy)") + ".", "sharding"))
    if s.strategy == "ddp" and s.mixed:
        out.append(("Mixed precision under DDP is autocast: parameters, gradients and Adam state stay fp32 (16 "
                    "B/param) and autocast caches 16-bit weight copies; only activations shrink.", "autocast"))
    if b.logits_bytes and b.logits_bytes > 0.25 * b.allocated_peak_bytes:
        v = s.arch.vocab_size if s.arch else 0
        out.append((f"The loss dominates: cross_entropy(logits.float()) keeps an fp32 log-softmax of "
                    f"{s.micro_batch_size}×{s.seq_len}×{v} and adds two more fp32 copies at the start of backward "
                    f"({_g(b.logits_bytes)}). A fused/chunked linear-cross-entropy kernel avoids materialising "
                    "them.", "logits"))
    if b.attention_kernels.get("math") and s.attention == "sdpa" and s.arch is not None:
        a = s.arch
        scores = s.micro_batch_size * a.num_heads * s.seq_len**2 * 4
        why = ("fp32 grouped-query attention has no fused CUDA kernel (flash and cuDNN take fp16/bf16 only; "
               "memory-efficient attention takes no grouped keys)" if s.precision == "fp32" and
               a.num_kv_heads != a.num_heads else "no fused CUDA kernel accepts this dtype, head size and mask")
        out.append((f"Attention runs SDPA's math fallback on {b.attention_kernels['math']} layers: {why}, so each "
                    f"keeps a batch × heads × seq² fp32 softmax ({_g(scores)} per layer here), as eager attention "
                    "does. bf16 mixed precision runs flash attention instead.", None))
    if b.peak_phase == "optimizer step" and b.temporaries_bytes:
        out.append((f"The peak is the optimizer step: states plus {_g(b.temporaries_bytes)} of step temporaries "
                    f"(optimizer_impl={s.optimizer_impl}).", "foreach"))
    if verdict is Verdict.WARN:
        out.append(("It fits only if the caching allocator's reserve stays small: set PYTORCH_CUDA_ALLOC_CONF="
                    "expandable_segments:True and keep headroom.", "fragmentation"))
    if s.strategy == "zero3" and b.deepspeed_exact:
        out.append(("model_states_bytes reproduces DeepSpeed's estimate_zero3_model_states_mem_needs (4 × "
                    "largest_layer_params + 18 B/param ÷ GPUs): DeepSpeed's figure has no activations, buckets, "
                    "CUDA context or NCCL.", "deepspeed"))
    if s.strategy == "zero2" and b.deepspeed_exact:
        out.append(("model_states_bytes reproduces DeepSpeed's estimate_zero2_model_states_mem_needs (2 B/param "
                    "replicated + 18 B/param ÷ GPUs, current DeepSpeed; docs printed before PR #5099 show 4 + "
                    "16/N).", "deepspeed"))
    return out


def assumptions_for(b: Breakdown) -> list[str]:
    s = b.setup
    ov = s.overheads
    out = [f"Overheads: CUDA context {_g(ov.cuda_context_bytes)}"
           + (f", NCCL {_g(ov.nccl_bytes)}" if s.world_size > 1 else "")
           + f", allocator reserve {ov.allocator_fraction:.0%} of the allocated peak (10–35 % observed; "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lowers it)."]
    if s.strategy in FSDP:
        out.append("FSDP2 (fully_shard) per transformer block plus the root: the root (embeddings, head) stays "
                   "unsharded from forward to the end of backward; one block is prefetched; FSDP1 with "
                   "limit_all_gathers=True behaves alike (FSDP1 pads flat parameters, a few bytes more).")
        if s.mixed:
            out.append("FSDP MixedPrecision: fp32 sharded params, grads and optimizer state; 16-bit compute; fp32 "
                       "gradient reduction.")
    if s.strategy in ZERO:
        out.append("DeepSpeed: 16-bit model and gradients, fp32 master weights + optimizer state + fp32 gradient "
                   "partition (its 18 B/param accounting); FusedAdam keeps no step temporaries; a 5e8-element "
                   "16-bit bucket buffer (EleutherAI's accounting) is counted in temporaries.")
    if s.strategy == "ddp" and s.world_size == 1:
        out.append("ddp with world_size 1 = plain single-GPU training (no DDP wrapper, no gradient buckets).")
    if s.strategy == "ddp" and s.mixed:
        out.append("DDP mixed precision = torch.autocast over fp32 parameters: autocast's cached 16-bit weight "
                   "copies live from forward to backward (working set).")
    if s.arch is not None:
        kernels = ", ".join(f"{k} ×{n}" for k, n in sorted(b.attention_kernels.items()))
        out.append("Activations: what the Hugging Face class's autograd saves, op by op (PyTorch backward formulas); "
                   f"attention kernel per layer on a CUDA GPU: {kernels or 'none'} (torch's SDPA rules for sm80/sm90)"
                   + (", dropout masks 1 byte/element (CUDA)" if s.dropout and s.arch.hidden_dropout else "")
                   + "; loss = cross_entropy(logits.float()) as Hugging Face computes it: the logits, their fp32 "
                   "copy and the log-softmax coexist at the end of forward.")
        if s.arch.family == "t5" and s.attention == "sdpa":
            from .attention_kernels import hf_t5_mask_contiguous

            out.append(f"T5 self-attention kernel: {hf_t5_mask_contiguous()[1]}.")
    else:
        out.append("No architecture: activations, logits and FSDP gathered units are not estimated (pass model "
                   "as a preset or config.json for them).")
    if s.lora_rank:
        out.append(f"LoRA r={s.lora_rank}: frozen base stored as {s.lora_base_dtype if s.lora_base_dtype != 'auto' else 'the parameter dtype'}; "  # noqa: E501
                   "adapters trained (PEFT keeps them fp32 unless a sharded engine casts them).")
    return out


def _deepspeed(b: Breakdown) -> DeepSpeedOut | None:
    s = b.setup
    if s.strategy not in ("zero2", "zero3"):
        return None
    ll = s.largest_layer_params
    if s.strategy == "zero2":
        rows = zero2_table(s.num_params, s.gpus_per_node, s.num_nodes)
        match = next(r for r in rows if r.offload_optimizer == (s.cpu_offload == "optimizer"))
        text = header(s.num_params, s.gpus_per_node, s.num_nodes, None)
    elif ll:
        rows = zero3_table(s.num_params, ll, s.gpus_per_node, s.num_nodes)
        match = next(r for r in rows if r.offload_optimizer == (s.cpu_offload != "none")
                     and r.offload_param == (s.cpu_offload == "params_and_optimizer") and r.zero_init)
        text = header(s.num_params, s.gpus_per_node, s.num_nodes, ll)
    else:
        return None
    printed = "\n".join([text, *(r.printed() for r in rows)])
    return DeepSpeedOut(exact=b.deepspeed_exact, printed=printed, matched_options=match.options)


# ---- measured mode ---------------------------------------------------------------------------------------
def _measure(setup: Setup, args: MemoryInput, progress: Progress, training: TrainingEnv) -> MeasuredOut:
    from dataclasses import asdict

    from .measured import (
        MEASURABLE_OPTIMIZERS,
        MEASURABLE_STRATEGIES,
        MeasureError,
        MeasureJob,
        TorchMissing,
        measured_unsupported,
        run_measurement,
    )

    if setup.arch is None:
        raise InputError("measure", "measured mode builds the model: pass model (a preset or config.json)",
                         allowed=sorted(presets()))
    if setup.strategy not in MEASURABLE_STRATEGIES:
        raise InputError("strategy", f"measure=true runs PyTorch's own DDP/FSDP2 code; DeepSpeed {setup.strategy} "
                         "cannot run under fake tensors (its analytic figure is DeepSpeed's own estimator)",
                         allowed=MEASURABLE_STRATEGIES)
    if setup.optimizer not in MEASURABLE_OPTIMIZERS:
        raise InputError("optimizer", f"{setup.optimizer} cannot run under fake tensors (bitsandbytes kernels / "
                         "Adafactor's .item())", allowed=MEASURABLE_OPTIMIZERS)
    if setup.cpu_offload != "none" or setup.lora_base_dtype == "nf4":
        field = "cpu_offload" if setup.cpu_offload != "none" else "lora_base_dtype"
        raise InputError(field, "on a CPU-only fake-tensor run host and device memory are the same and NF4 needs "
                         "bitsandbytes: measure without it", allowed=["none"] if field == "cpu_offload" else
                         ["auto", "fp32", "bf16", "fp16"])
    if setup.ep > 1:
        raise InputError("ep", "measured mode shards experts with FSDP2 like every weight (no expert-parallel "
                         "all-to-all under fake tensors): measure with ep=1", allowed=["1"])
    if setup.capacity_factor is not None:
        raise InputError("capacity_factor", "measured mode runs dropless routing (balanced top-k rows): measure "
                         "without capacity_factor", allowed=["unset"])
    twin = replace(setup, world_size=1 if setup.strategy == "ddp" else setup.world_size,
                   gpus_per_node=1 if setup.strategy == "ddp" else setup.gpus_per_node)
    # Size guard. Fake tensors allocate nothing, but the step's Python cost grows with the number of
    # blocks and, under FSDP, with the ranks each parameter is chunked into (Llama-3-70B, 64 ranks:
    # ~80 s on 2 cores). Past these bounds, measure a smaller world size: states scale as 1/N, the rest
    # does not depend on N.
    blocks = len(setup.arch.blocks())
    if twin.world_size > MAX_MEASURED_WORLD:
        raise InputError("world_size", f"measure=true simulates every rank's shard bookkeeping; measure at "
                         f"≤ {MAX_MEASURED_WORLD} GPUs and scale the states by N", allowed=[f"1..{MAX_MEASURED_WORLD}"])
    if blocks > MAX_MEASURED_BLOCKS:
        raise InputError("measure", f"{blocks} blocks is beyond the measured mode's {MAX_MEASURED_BLOCKS}-block "
                         "limit; use the analytic figure (it matches measured steps within ~1 %)")
    engine, why = measure_engine(setup, args.model)
    if engine == "builtin":
        unsupported = measured_unsupported(setup.arch)
        if unsupported:
            raise InputError("measure", f"{why}; the built-in re-implementation does not implement {unsupported} "
                             "(install transformers to measure the real class); the analytic figure covers it",
                             allowed=["false"])
        if setup.arch.is_moe:
            tokens = setup.micro_batch_size * setup.seq_len * setup.arch.experts_per_token
            if tokens % setup.arch.num_experts:
                raise InputError("seq_len", f"the built-in MoE runs a balanced static dispatch: micro_batch_size × "
                                 f"seq_len × top-k ({tokens}) must be a multiple of num_experts "
                                 f"({setup.arch.num_experts})")
    differences = [why]
    if setup.strategy == "ddp" and setup.world_size > 1:
        differences.append("one DDP replica without the DDP wrapper (gradient buckets are analytic only)")
    base_dtype = setup.lora_base_dtype if setup.lora_base_dtype != "auto" else None
    if base_dtype and setup.lora_rank:
        differences.append(f"frozen base in the model dtype instead of {base_dtype}")
        twin = replace(twin, lora_base_dtype="auto")
    adapter = "fp32" if (setup.precision == "fp32" or (setup.pure and setup.strategy not in FSDP)
                         or setup.mixed) else setup.half
    job = MeasureJob(arch=asdict(setup.arch), strategy=setup.strategy, precision=setup.precision,
                     optimizer=setup.optimizer, optimizer_impl=setup.optimizer_impl, world_size=twin.world_size,
                     gpus_per_node=twin.gpus_per_node, seq_len=setup.seq_len,
                     micro_batch_size=setup.micro_batch_size, activation_checkpointing=setup.activation_checkpointing,
                     attention=setup.attention, lora_rank=setup.lora_rank, lora_targets=list(setup.lora_targets),
                     adapter_dtype=adapter, engine=engine,
                     hf_config=load_config(args.model)[0] if engine == "transformers" and args.model else None)
    try:
        result = run_measurement(job, args.measure_timeout_s, progress, training.python, child_environ(training))
    except TorchMissing:
        raise  # an environment fact: the caller reports it as measured_skipped
    except MeasureError as err:
        raise InputError("measure", str(err)) from None
    twin_b = estimate(twin)
    analytic = twin_b.allocated_peak_bytes
    parts = next(p for p in twin_b.phases if p.name == twin_b.peak_phase).parts
    return MeasuredOut(peak_bytes=result.peak_bytes, analytic_peak_bytes=analytic,
                       ratio=round(analytic / result.peak_bytes, 4), engine=result.engine,  # type: ignore[arg-type]
                       model_class=result.model_class, transformers_version=result.transformers_version,
                       attention_kernels=result.attention_kernels, corrections=result.corrections,
                       cannot_show=result.cannot_show, categories=result.categories,
                       analytic_breakdown={k: v for k, v in parts.items() if v}, analytic_peak_phase=twin_b.peak_phase,
                       peak_phase=result.peak_phase, seconds=result.seconds,
                       tracker=f"{result.tracker} (torch {result.torch_version}, FakeTensorMode on CPU, CUDA kernel "
                       "choice, fused dropout and autocast policy emulated)",
                       compared_setup="; ".join(differences))


def measure_engine(setup: Setup, model: str | None) -> tuple[str, str]:
    """Which model measured mode runs, and the reason in words: the real Hugging Face class when
    transformers (and peft, for LoRA) can be imported and the model comes from a config, else the
    built-in re-implementation."""
    from .measured import module_found

    if model is None:
        return "builtin", "built-in re-implementation (no config.json to build a Hugging Face class from)"
    if not module_found("transformers"):
        return "builtin", ("built-in re-implementation (transformers is not installed here: pip install transformers "
                           "to measure the real Hugging Face class)")
    if setup.lora_rank and not module_found("peft"):
        return "builtin", "built-in LoRA re-implementation (peft is not installed here: pip install peft)"
    return "transformers", "the real Hugging Face class (transformers)"


# ---- the tool -----------------------------------------------------------------------------------------------
def _ref(key: str | None) -> EntryRef | None:
    if key is None or key not in ladder.REFS:
        return None
    file, entry = ladder.REFS[key]
    return EntryRef(file=file, id=entry)


def fsdp_memory_estimate(args: MemoryInput, progress: Progress) -> MemoryOutput:
    setup, label, assumed = resolve(args)
    progress(0, 3 if args.measure else 2, "analytic estimate")
    b = estimate(setup)
    gpu = setup.gpu_memory_bytes
    fits = None if gpu is None else b.total_bytes <= gpu
    if gpu is None:
        verdict = Verdict.UNKNOWN
    elif fits:
        verdict = Verdict.PASS
    elif b.allocated_peak_bytes + b.overhead_bytes - int(b.allocated_peak_bytes * setup.overheads.allocator_fraction) \
            <= gpu:
        verdict = Verdict.WARN  # fits only if the allocator reserve stays small
    else:
        verdict = Verdict.FAIL
    progress(1, 3 if args.measure else 2, "advice")
    rungs = ladder.ladder(setup, b) if verdict is not Verdict.PASS else []
    measured, skipped, training = None, None, None
    if args.measure:
        from .measured import TorchMissing

        training = find_training_env(args.python, args.activate)
        skipped = None if training.python and training.has_torch else no_training_torch(training)
        try:
            measured = None if skipped else _measure(setup, args, progress, training)
        except TorchMissing as err:
            skipped = torch_missing(err.reason, err.python)
    arch = setup.arch
    mode, advice_note = ladder.advice_mode(setup, rungs)
    return MemoryOutput(
        model=label, num_params=setup.num_params, active_params=arch.active_params if arch else None,
        ep=setup.ep, experts_per_gpu=arch.num_experts // setup.ep if arch and arch.is_moe else None,
        capacity_factor=setup.capacity_factor,
        trainable_params=b.trainable_params if setup.lora_rank else setup.num_params,
        largest_layer_params=setup.largest_layer_params, world_size=setup.world_size,
        gpus_per_node=setup.gpus_per_node, shard_group=setup.shard_group, strategy=setup.strategy,
        precision=setup.precision, optimizer=setup.optimizer,
        seq_len=setup.seq_len if setup.arch else None, micro_batch_size=setup.micro_batch_size,
        params_bytes=b.params_bytes, grads_bytes=b.grads_bytes, optimizer_bytes=b.optimizer_bytes,
        working_set_bytes=b.working_set_bytes, model_states_bytes=b.model_states_bytes,
        activations_bytes=b.activations_bytes, logits_bytes=b.logits_bytes, temporaries_bytes=b.temporaries_bytes,
        forward_backward_peak_bytes=b.forward_backward_peak_bytes,
        optimizer_step_peak_bytes=b.optimizer_step_peak_bytes,
        allocated_peak_bytes=b.allocated_peak_bytes, peak_phase=b.peak_phase,
        attention_kernels=b.attention_kernels, overhead_bytes=b.overhead_bytes,
        total_bytes=b.total_bytes, cpu_bytes_per_node=b.cpu_bytes_per_node, naive_split_bytes=b.naive_split_bytes,
        gpu_memory_bytes=gpu, fits=fits, verdict=verdict,
        headroom_bytes=None if gpu is None else gpu - b.total_bytes,
        max_micro_batch_size=ladder.largest_micro_batch(setup) if fits else None,
        phases=[PhaseOut(name=p.name, bytes=p.bytes) for p in b.phases], deepspeed=_deepspeed(b),
        notes=[NoteOut(text=text, ref=_ref(key)) for text, key in notes_for(b, verdict)],
        assumptions=[*assumed, *assumptions_for(b)],
        advice=[AdviceOut(action=r.action, cost=r.cost, saves_bytes=r.saves_bytes,
                          total_after_bytes=r.total_after_bytes, fits_after=r.fits_after, ref=_ref(r.ref))
                for r in rungs],
        advice_mode=mode, advice_note=advice_note, measured=measured, measured_skipped=skipped,
        training_env=training)


#: CLI exit status when measure=true cannot run because torch is missing: the "environment" status that
#: ``rgt health`` uses for "no NVIDIA GPU here" (health/probe.py EXIT_CODES_DOC).
EXIT_ENVIRONMENT = 4


def exit_code(out: MemoryOutput) -> int:
    """1 when it does not fit, 4 when a requested measurement could not run here (torch missing), else 0."""
    if out.verdict is Verdict.FAIL:
        return 1
    return EXIT_ENVIRONMENT if out.measured_skipped else 0


def _short(n: int | None) -> str:
    return "—" if n is None else f"{n / GIB:.1f}"


def render(out: MemoryOutput) -> str:
    """The CLI/MCP text: a compact summary (about 1–2 KB). Every figure, phase, note and assumption is in
    the structured result; this keeps what decides the question."""
    moe = (f"; {out.active_params / 1e9:.1f}B active, {out.experts_per_gpu} experts per GPU (ep={out.ep})"
           if out.experts_per_gpu else "")
    head = (f"{out.model}\n{out.num_params / 1e9:.2f}B params{moe}; {out.strategy} over {out.world_size} GPU(s), "
            f"shard group {out.shard_group}, {out.precision}, {out.optimizer}"
            + (f", seq {out.seq_len} × micro-batch {out.micro_batch_size}" if out.seq_len else ""))
    rows = [["params / grads / optimizer", f"{_short(out.params_bytes)} / {_short(out.grads_bytes)} / "
             f"{_short(out.optimizer_bytes)}"],
            ["working set (gathered)", _short(out.working_set_bytes)],
            ["activations / logits", f"{_short(out.activations_bytes)} / {_short(out.logits_bytes)}"],
            [f"allocated peak ({out.peak_phase})", _short(out.allocated_peak_bytes)],
            ["+ CUDA ctx, NCCL, allocator", _short(out.overhead_bytes)],
            ["total per GPU (≈ nvidia-smi)", _short(out.total_bytes)]]
    if out.cpu_bytes_per_node:
        rows.append(["host RAM per node (offload)", _short(out.cpu_bytes_per_node)])
    parts = [head, format_table(["per GPU", "GiB"], rows)]
    if out.gpu_memory_bytes is not None:
        state = {Verdict.PASS: "fits", Verdict.WARN: "tight: fits only with little allocator fragmentation",
                 Verdict.FAIL: "does NOT fit"}[out.verdict]
        more = f"; micro-batch up to {out.max_micro_batch_size} fits" if out.max_micro_batch_size else ""
        parts.append(f"{out.verdict.value}: {state} in {gib(out.gpu_memory_bytes)} "
                     f"(headroom {gib(out.headroom_bytes)}){more}")
    if out.measured:
        m = out.measured
        where = f" with {out.training_env.brief()}" if out.training_env else ""
        parts.append(f"measured {m.model_class} ({m.seconds:.0f} s, fake tensors{where}): peak {gib(m.peak_bytes)}; "
                     f"analytic {gib(m.analytic_peak_bytes)}; analytic/measured {m.ratio:.3f}")
    if out.measured_skipped:
        parts.append(f"measure: not run — {out.measured_skipped}")
    lines = [out.advice_note]
    for i, a in enumerate(out.advice[:5], 1):
        fits = {True: ", fits", False: ", still too big", None: ""}[a.fits_after]
        ref = f" ({a.ref.id})" if a.ref else ""
        lines.append(f"{i}. {a.action} → {gib(a.total_after_bytes)}{fits}{ref}")
    if len(out.advice) > 5:
        lines.append(f"   … {len(out.advice) - 5} more in the structured result")
    parts.append("\n".join(lines))
    refs = sorted({n.ref.id for n in out.notes if n.ref})
    parts.append(f"{len(out.notes)} notes ({', '.join(refs)}) and {len(out.assumptions)} assumptions in the "
                 "structured result" + ("; DeepSpeed's own estimator table too" if out.deepspeed else "") + ".")
    return "\n\n".join(parts)


SPECS = [
    ToolSpec(
        name="fsdp_memory_estimate",
        cli="mem",
        title="Per-GPU training memory (DDP / FSDP / ZeRO)",
        description=(
            "Estimate per-GPU memory of a training step — parameters, gradients, optimizer state, FSDP working set, "
            "activations, logits, optimizer temporaries, CUDA/NCCL overhead — for DDP, FSDP (full_shard, "
            "shard_grad_op, hybrid_shard, no_shard) and DeepSpeed ZeRO-1/2/3 (its own estimators, to the byte), "
            "and say whether it fits and what to change first (each rung re-estimated). Use it for 'will this fit "
            "on N GPUs?', 'why does SHARD_GRAD_OP not save memory?', 'why OOM at step 2?'. measure=true runs a real "
            "training step of the real Hugging Face class on fake tensors with torch's memory tracker and reports "
            "the ratio. Read-only."
        ),
        input_model=MemoryInput,
        output_model=MemoryOutput,
        run=fsdp_memory_estimate,
        read_only=True,
        render_text=render,
        exit_code=exit_code,
        remote=True,
    )
]
