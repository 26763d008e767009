"""The analytic per-GPU memory model: states, sharding, working set, activations, peak, overheads.

Accounting, per GPU (bytes, ints):

* **States** per tensor: parameters in their storage dtype, gradients and optimizer state for trainable
  tensors only, divided by the shard group N the way each framework shards — FSDP pads every tensor's
  dim 0 to a multiple of N (ceil per tensor), DeepSpeed partitions flat buffers (ceil of the total).
  ZeRO-2/3 with mixed precision and Adam take DeepSpeed's own estimator figures, to the byte.
* **Working set**: what is unsharded while it runs — FSDP's root unit (kept after forward), the current
  and prefetched block and the current block's unsharded gradients plus the fp32 reduce-scatter buffer;
  SHARD_GRAD_OP the whole model's low-precision copy; ZeRO-3 DeepSpeed's 4 × largest layer; DDP under
  autocast the cached low-precision weight copies.
* **Activations** from ``autograd_trace`` (op-by-op saved tensors), the loss's fp32 log-softmax and the
  backward transient of the cross-entropy (two more fp32 logits-sized tensors).
* **Peak** = max over a step's timeline: end of forward, start of backward (loss), each block's backward
  (activations freed, gradients arriving, one block recomputed under checkpointing) and the optimizer
  step (all states + the optimizer's temporaries: foreach Adam materialises a sqrt(v) copy).
* **Overheads** the trackers cannot see: CUDA context, NCCL, allocator reserve.

Pure Python (no torch). ``measured`` checks this model against a real fake-tensor step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from .architecture import Architecture
from .autograd_trace import ActivationProfile, Numerics, Routing, Shape, profile
from .deepspeed_compat import zero2_model_states, zero3_model_states

Strategy = Literal["ddp", "no_shard", "zero1", "zero2", "zero3", "full_shard", "shard_grad_op", "hybrid_shard"]
Precision = Literal["fp32", "fp16_mixed", "bf16_mixed", "bf16_pure", "fp16_pure"]
Optimizer = Literal["adamw", "adam", "sgd", "sgd_momentum", "adam8bit", "adafactor"]
Offload = Literal["none", "optimizer", "params_and_optimizer"]
OptimizerImpl = Literal["foreach", "fused", "single_tensor"]
BaseDtype = Literal["auto", "fp32", "bf16", "fp16", "nf4"]

STRATEGIES: tuple[str, ...] = Strategy.__args__  # type: ignore[attr-defined]
FSDP = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")
ZERO = ("zero1", "zero2", "zero3")
GIB = 1024**3
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
NF4_BYTES_PER_PARAM = 0.5 + 4 / 64
"""bitsandbytes NF4: 4-bit codes plus one fp32 absmax per 64 weights (no double quantisation)."""
BNB_BLOCK = 256
"""bitsandbytes 8-bit optimizers quantise state in blocks of 256 with one fp32 absmax per block."""
BNB_MIN_8BIT_SIZE = 4096
"""Tensors smaller than this keep 32-bit optimizer state in bitsandbytes (``min_8bit_size``)."""
DS_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``allgather_bucket_size``/``reduce_bucket_size`` (5e8 elements, 16-bit)."""


@dataclass(frozen=True)
class Overheads:
    """What tensor trackers cannot see. Defaults from published GPU measurements (facts §9)."""

    cuda_context_bytes: int = GIB
    """CUDA context + cuBLAS/cuDNN workspaces: 0.3–2 GiB reported (torch 2.x lazy loading ~0.5–0.9)."""
    nccl_bytes: int = GIB
    """NCCL communicators and buffers per GPU when world_size > 1: ~0.5–2 GiB reported."""
    allocator_fraction: float = 0.15
    """Caching-allocator reserve above allocated tensors: 10–35 % observed (lower with expandable_segments)."""
    cublas_workspace_bytes: int = 2 * 32 * 2**20
    """cuBLAS/cuBLASLt workspaces, allocated through the caching allocator and so inside the allocated peak:
    one per thread and stream — a training step has two (the forward thread and autograd's device thread)
    — of 32 MiB each on sm90 (H100/H200; torch ``CublasHandlePool.cpp``: 4096 KiB × 8; 8.125 MiB before
    Hopper). The five H100 rows of issue 28 sit 65–100 MiB above their fake-tensor peaks."""


@dataclass(frozen=True)
class Setup:
    """A fully resolved question: which model, how it is sharded, computed and optimised."""

    num_params: int
    arch: Architecture | None = None
    largest_layer_params: int | None = None
    world_size: int = 1
    gpus_per_node: int = 1
    strategy: str = "full_shard"
    precision: str = "bf16_mixed"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    cpu_offload: str = "none"
    seq_len: int = 2048
    micro_batch_size: int = 1
    activation_checkpointing: bool = False
    attention: str = "sdpa"
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = ()
    lora_base_dtype: str = "auto"
    grad_accumulation: bool = False
    gradient_as_bucket_view: bool = False
    gpu_memory_bytes: int | None = None
    ep: int = 1
    """Expert parallelism: routed experts split over groups of ``ep`` ranks; each expert's weights are
    then FSDP/ZeRO-sharded over the remaining ``shard_group / ep`` ranks (torchtitan/Megatron layout)."""
    capacity_factor: float | None = None
    """None = dropless routing; a number = fixed per-expert buffers of ceil(cf · tokens · k / E) rows."""
    dropout: bool = True
    dropout_mask_bytes: int = 1
    """1 on CUDA; 0 means "dtype-sized" (CPU fake tensors) — used by the measured comparison."""
    overheads: Overheads = field(default_factory=Overheads)

    @property
    def shard_group(self) -> int:
        if self.strategy in ("ddp", "no_shard"):
            return 1
        if self.strategy == "hybrid_shard":
            return self.gpus_per_node
        return self.world_size

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.gpus_per_node

    @property
    def half(self) -> str:
        return "fp16" if self.precision.startswith("fp16") else "bf16"

    @property
    def mixed(self) -> bool:
        return self.precision.endswith("_mixed")

    @property
    def pure(self) -> bool:
        return self.precision.endswith("_pure")


@dataclass(frozen=True)
class TensorInfo:
    numel: int
    dim0: int
    unit: str
    trainable: bool
    role: str
    """base (model weight), adapter (LoRA), or quantized (NF4 block linear)."""
    rows: int = 1
    cols: int = 1
    """Last two dims (Adafactor factors the second moment over them); 1-D tensors have rows=1."""
    input_side: bool = False
    """An input embedding: its gradient arrives only at the end of backward."""
    word_embedding: bool = False
    """The token embedding table (its gradient is the last one autograd computes)."""
    expert: bool = False
    """A routed expert's weight: with ``ep`` > 1 only this rank's experts are listed, sharded over N/ep."""


@dataclass
class Phase:
    name: str
    bytes: int
    parts: dict[str, int]


@dataclass
class Breakdown:
    """Per-GPU result of :func:`estimate` (bytes)."""

    setup: Setup
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    working_set_bytes: int
    model_states_bytes: int
    activations_bytes: int | None
    logits_bytes: int | None
    temporaries_bytes: int
    forward_backward_peak_bytes: int
    optimizer_step_peak_bytes: int
    allocated_peak_bytes: int
    peak_phase: str
    overhead_bytes: int
    total_bytes: int
    cpu_bytes_per_node: int
    trainable_params: int
    phases: list[Phase]
    notes: list[tuple[str, str]]
    """(text, topic) explanations found while estimating; topics are ``advice.REFS`` keys."""
    deepspeed_exact: bool = False
    naive_split_bytes: int = 0
    attention_kernels: dict[str, int] = field(default_factory=dict)
    """Attention calls per kernel in one forward (CUDA SDPA's choice: flash, efficient, math; or eager)."""


# ---- tensors and dtypes ----------------------------------------------------------------------------
def model_tensors(setup: Setup) -> list[TensorInfo]:
    """Every parameter tensor with its unit and trainability (LoRA adapters added, base frozen)."""
    arch = setup.arch
    if arch is None:
        return [TensorInfo(setup.num_params, setup.num_params, "model", True, "base", 1, setup.num_params)]
    lora = bool(setup.lora_rank)
    quantized = setup.lora_base_dtype == "nf4"
    linear_weights = {f"{prefix}.{lin.name}.weight" for prefix, kind in arch.blocks()
                      for lin in arch.block_linears(kind)}
    out = []
    inputs = arch.input_embeddings()
    local_experts = math.ceil(arch.num_experts / setup.ep) if arch.is_moe else 0
    for t in arch.tensors():
        rows, cols = (t.shape[-2], t.shape[-1]) if len(t.shape) >= 2 else (1, t.shape[0])
        role = "quantized" if quantized and t.name in linear_weights else "base"
        numel, dim0 = t.numel, t.shape[0]
        if t.expert is not None and t.expert >= local_experts:
            continue  # another expert-parallel rank's expert
        if t.expert == -1:  # experts stacked on dim 0 (GPT-OSS): this rank's slice of them
            numel, dim0 = numel // dim0 * local_experts, local_experts
        out.append(TensorInfo(numel, dim0, t.unit, not lora, role, rows, cols, t.name in inputs,
                              t.name == arch.word_embedding, t.expert is not None))
    if lora:
        r = setup.lora_rank or 0
        for prefix, lin in arch.lora_linears(list(setup.lora_targets)):
            out.append(TensorInfo(r * lin.in_features, r, prefix, True, "adapter", r, lin.in_features))
            out.append(TensorInfo(lin.out_features * r, lin.out_features, prefix, True, "adapter",
                                  lin.out_features, r))
    return out


def _dtypes(setup: Setup) -> dict[str, str]:
    """Storage/compute dtypes: param (storage), compute, grad, state, adapter, base (frozen)."""
    ds, fsdp = setup.strategy in ZERO, setup.strategy in FSDP
    if setup.precision == "fp32":
        d = {"param": "fp32", "compute": "fp32", "grad": "fp32", "state": "fp32"}
    elif setup.pure:
        d = {"param": setup.half, "compute": setup.half, "grad": setup.half, "state": setup.half}
    elif ds:  # DeepSpeed: 16-bit model and grads, fp32 master weights and states in the optimizer
        d = {"param": setup.half, "compute": setup.half, "grad": setup.half, "state": "fp32"}
    else:  # FSDP MixedPrecision / autocast: fp32 params, grads and states; 16-bit compute
        d = {"param": "fp32", "compute": setup.half, "grad": "fp32", "state": "fp32"}
    # LoRA adapters: PEFT keeps them in fp32 (autocast_adapter_dtype=True); FSDP mixed precision stores
    # them fp32 like every sharded parameter; DeepSpeed and sharded pure-16-bit runs cast them with the model.
    keeps_fp32 = setup.precision == "fp32" or (setup.pure and not (ds or fsdp)) or (setup.mixed and not ds)
    d["adapter"] = "fp32" if keeps_fp32 else setup.half
    base = setup.lora_base_dtype
    d["base"] = d["param"] if base in ("auto", "nf4") else base
    return d


def _store_bytes(t: TensorInfo, d: dict[str, str]) -> float:
    if t.role == "quantized":
        return NF4_BYTES_PER_PARAM
    if t.role == "adapter":
        return BYTES[d["adapter"]]
    return BYTES[d["base"]] if not t.trainable else BYTES[d["param"]]


def _local(numel: int, dim0: int, n: int, per_tensor: bool) -> int:
    """Elements one rank holds: FSDP pads dim 0 to a multiple of N (ceil per tensor)."""
    if n == 1:
        return numel
    if per_tensor:
        return math.ceil(dim0 / n) * (numel // dim0)
    return math.ceil(numel / n)


def _group(setup: Setup, t: TensorInfo, n: int) -> int:
    """Ranks sharing ``t``: the shard group, or for an expert weight the group left after expert parallelism."""
    return max(1, n // setup.ep) if t.expert else n


def _optimizer_state_bytes(t: TensorInfo, local: int, setup: Setup, d: dict[str, str]) -> float:
    """Optimizer bytes for ``local`` elements of trainable tensor ``t`` (excluding DeepSpeed masters)."""
    state = BYTES[d["adapter"] if t.role == "adapter" else d["state"]]
    opt = setup.optimizer
    if opt in ("adam", "adamw"):
        return 2 * state * local
    if opt == "sgd_momentum":
        return state * local
    if opt == "sgd":
        return 0
    if opt == "adam8bit":
        if t.numel < BNB_MIN_8BIT_SIZE:
            return 2 * 4 * local
        return 2 * local + 2 * 4 * math.ceil(local / BNB_BLOCK)
    # Adafactor (torch.optim.Adafactor): factored second moment, rows + cols per matrix, full for vectors.
    if t.rows > 1:
        share = local / max(1, t.numel)
        return state * (t.rows + t.cols) * share
    return state * local


# ---- the estimate ------------------------------------------------------------------------------------
@dataclass
class _States:
    params: int
    grads: int
    optimizer: int
    working_deepspeed: int
    cpu_per_rank: int
    grads_by_unit: dict[str, int]
    trainable_params: int
    deepspeed_exact: bool
    cpu_per_node_exact: int | None


def _states(setup: Setup, tensors: list[TensorInfo], d: dict[str, str], notes: list[tuple[str, str]]) -> _States:
    n = setup.shard_group
    s = setup.strategy
    fsdp = s in FSDP
    trainable = sum(t.numel for t in tensors if t.trainable)
    params = grads = optimizer = 0.0
    grads_by_unit: dict[str, int] = {}
    ds = s in ZERO
    total = sum(t.numel for t in tensors)
    for t in tensors:
        n = _group(setup, t, setup.shard_group)
        p_div = n if (fsdp or s == "zero3") else 1
        local_p = _local(t.numel, t.dim0, p_div, fsdp)
        params += _store_bytes(t, d) * local_p
        if not t.trainable:
            continue
        g_div = n if (fsdp or s in ("zero2", "zero3")) else 1
        local_g = _local(t.numel, t.dim0, g_div, fsdp)
        grad_bytes = BYTES[d["adapter"]] if t.role == "adapter" else BYTES[d["grad"]]
        g = grad_bytes * local_g
        o_div = n if (fsdp or ds) else 1
        local_o = _local(t.numel, t.dim0, o_div, fsdp)
        o = _optimizer_state_bytes(t, local_o, setup, d)
        if ds and setup.mixed:
            # DeepSpeed keeps fp32 master weights and an fp32 gradient partition for the optimizer.
            o += 4 * local_o
            g += 4 * _local(t.numel, t.dim0, n, False)
        grads += g
        optimizer += o
        unit = "root:input" if t.input_side else t.unit
        grads_by_unit[unit] = grads_by_unit.get(unit, 0) + int(g)
    st = _States(int(params), int(grads), int(optimizer), 0, 0, grads_by_unit, trainable, False, None)
    # DeepSpeed's own figures, to the byte, where its estimator applies.
    moe = setup.arch is not None and setup.arch.is_moe
    exact = (ds and setup.mixed and setup.optimizer in ("adam", "adamw") and not setup.lora_rank and s != "zero1"
             and not moe)
    if exact:
        st.deepspeed_exact = True
        psi, g_all = total, setup.world_size
        if s == "zero2":
            cpu, gpu = zero2_model_states(psi, setup.gpus_per_node, setup.num_nodes,
                                          cpu_offload=setup.cpu_offload == "optimizer")
            st.params = 2 * psi
            st.grads = 0 if setup.cpu_offload == "optimizer" else int(6 * psi / g_all)
            st.optimizer = gpu - st.params - st.grads
        else:
            ll = setup.largest_layer_params or 0
            cpu, gpu, ll_mem = zero3_model_states(psi, ll, setup.gpus_per_node, setup.num_nodes,
                                                  cpu_offload=setup.cpu_offload != "none",
                                                  cpu_offload_params=setup.cpu_offload == "params_and_optimizer")
            st.working_deepspeed = ll_mem
            rest = gpu - ll_mem
            if setup.cpu_offload == "none":
                st.params, st.grads = int(2 * psi / g_all), int(6 * psi / g_all)
                st.optimizer = rest - st.params - st.grads
            else:
                st.params, st.grads, st.optimizer = rest, 0, 0
        st.cpu_per_node_exact = cpu
        scale = st.grads / max(1, sum(grads_by_unit.values()))
        st.grads_by_unit = {k: int(v * scale) for k, v in grads_by_unit.items()}
        return st
    # Offload: what leaves the GPU.
    if setup.cpu_offload != "none":
        if ds and setup.cpu_offload == "optimizer":  # ZeRO-Offload: grads and optimizer step on the host
            st.cpu_per_rank = st.optimizer + st.grads
            st.optimizer = st.grads = 0
        else:  # FSDP CPUOffloadPolicy: params, grads and optimizer state live on the host
            st.cpu_per_rank = st.params + st.grads + st.optimizer
            st.params = st.grads = st.optimizer = 0
        st.grads_by_unit = {k: 0 for k in st.grads_by_unit}
        notes.append(("CPU offload: offloaded states are pinned host memory (FSDP pin_memory=True, DeepSpeed "
                      "pin_memory) — the host needs this much RAM per node, not pageable swap.", "offload"))
    return st


def _unit_sizes(setup: Setup, tensors: list[TensorInfo], d: dict[str, str]) -> tuple[dict[str, int], dict[str, int]]:
    """Per unit: unsharded low-precision param bytes, and unsharded trainable-parameter count (input
    embeddings counted under ``root:input``: their gradients only appear at the end of backward)."""
    compute = BYTES[d["compute"]]
    params: dict[str, int] = {}
    train: dict[str, int] = {}
    for t in tensors:
        per = _store_bytes(t, d) if t.role == "quantized" else compute
        params[t.unit] = params.get(t.unit, 0) + int(per * t.numel)
        if t.trainable:
            unit = "root:input" if t.input_side else t.unit
            train[unit] = train.get(unit, 0) + t.numel
    return params, train


def _numerics(setup: Setup, d: dict[str, str]) -> Numerics:
    autocast = setup.mixed and setup.strategy not in FSDP and setup.strategy not in ZERO
    return Numerics(param_dtype=d["compute"] if not autocast else "fp32", half=setup.half, autocast=autocast,
                    adapter_dtype="fp32" if autocast else (setup.half if setup.strategy in FSDP and setup.mixed
                                                           else d["adapter"]),
                    dropout_mask_bytes=setup.dropout_mask_bytes, dropout=setup.dropout, attention=setup.attention,
                    checkpointing=setup.activation_checkpointing)


def _step_temporaries(setup: Setup, tensors: list[TensorInfo], d: dict[str, str]) -> int:
    """Optimizer-step temporaries on the GPU (torch optimizers; DeepSpeed's fused kernels keep none)."""
    if setup.cpu_offload != "none" or setup.strategy in ZERO or setup.optimizer in ("sgd", "adam8bit"):
        return 0
    fsdp = setup.strategy in FSDP
    locals_ = [(_local(t.numel, t.dim0, _group(setup, t, setup.shard_group) if fsdp else 1, fsdp),
                BYTES[d["adapter"] if t.role == "adapter" else d["state"]]) for t in tensors if t.trainable]
    if not locals_:
        return 0
    if setup.optimizer in ("adam", "adamw"):
        if setup.optimizer_impl == "foreach":  # _foreach_sqrt(exp_avg_sqs): one state-sized copy of everything
            return sum(n * b for n, b in locals_)
        if setup.optimizer_impl == "single_tensor":  # exp_avg_sq.sqrt() / bias_correction: two per tensor
            return 2 * max(n * b for n, b in locals_)
        return 0
    return 0


def estimate(setup: Setup) -> Breakdown:
    """The per-GPU breakdown for ``setup``. Pure arithmetic: milliseconds, no torch."""
    notes: list[tuple[str, str]] = []
    d = _dtypes(setup)
    tensors = model_tensors(setup)
    st = _states(setup, tensors, d, notes)
    s, arch = setup.strategy, setup.arch
    fsdp = s in FSDP
    unit_bytes, unit_train = _unit_sizes(setup, tensors, d)
    compute, reduce = BYTES[d["compute"]], BYTES[d["grad"]]
    blocks = [prefix for prefix, _ in arch.blocks()] if arch else []

    prof: ActivationProfile | None = None
    if arch is not None:
        lora_targets = frozenset(lin.name for _, lin in arch.lora_linears(list(setup.lora_targets))) \
            if setup.lora_rank else frozenset()
        prof = profile(arch, _numerics(setup, d), Shape(setup.micro_batch_size, setup.seq_len),
                       setup.lora_rank or 0, lora_targets, Routing(setup.capacity_factor, setup.ep))

    # Persistent on the GPU through the whole step.
    ddp_bucket = st.trainable_params * BYTES[d["grad"]] if s == "ddp" and setup.world_size > 1 else 0
    ds_buckets = 2 * min(DS_BUCKET_ELEMENTS, setup.num_params) if s in ZERO else 0
    base = st.params + st.optimizer + ddp_bucket + ds_buckets
    grads_always = st.grads if (s in ZERO or setup.grad_accumulation) else 0
    if s == "ddp" and setup.world_size > 1 and setup.gradient_as_bucket_view:
        grads_dynamic_total = 0  # .grad are views into the buckets already counted
    else:
        grads_dynamic_total = 0 if grads_always else st.grads
    grad_unit = {u: (g if grads_dynamic_total else 0) for u, g in st.grads_by_unit.items()}

    # Working set pieces.
    root_low = unit_bytes.get("root", 0) if fsdp else 0
    # FSDP reduce-scatters the root's gradients only at the end of backward: until then the head's
    # gradient (computed first) is held unsharded; the input embeddings' gradients arrive last.
    root_grad_unsharded = unit_train.get("root", 0) * compute if fsdp else 0
    block_low = [unit_bytes.get(b, 0) for b in blocks]
    block_grad_transient = [unit_train.get(b, 0) * (compute + reduce) for b in blocks] if fsdp else [0] * len(blocks)
    all_low = sum(unit_bytes.values())

    phases: list[Phase] = []
    acts = prof.per_block if prof else []
    copies = prof.block_param_copies if prof else []
    root_saved = prof.root_saved + prof.root_param_copies if prof else 0
    root_embed_side = prof.root_saved_before_head if prof else 0
    loss_saved = prof.loss_saved if prof else 0
    loss_extra = prof.loss_backward_extra if prof else 0
    ckpt = setup.activation_checkpointing and prof is not None
    saved_blocks = prof.block_inputs if ckpt and prof else acts
    saved_copies = [0] * len(blocks) if ckpt else copies

    if s == "zero3":
        working = st.working_deepspeed or (setup.largest_layer_params or 0) * (compute + BYTES[d["grad"]])
        if not st.deepspeed_exact and arch is None and not setup.largest_layer_params:
            notes.append(("ZeRO-3 gathered-layer working set unknown: pass largest_layer_params or model.",
                          "deepspeed"))
    else:
        working = 0

    def w_forward_end() -> int:
        if s in ("shard_grad_op", "no_shard"):
            return all_low
        if fsdp:  # FSDP2 keeps the root unsharded after forward; backward prefetches the last block
            return root_low + (block_low[-1] if block_low else 0)
        return working

    def resident(k: int) -> int:
        """Unsharded 16-bit blocks while block k (forward index) runs backward: itself and the prefetched
        block k-1 under FULL_SHARD; every block not yet through backward under SHARD_GRAD_OP/NO_SHARD."""
        if s in ("shard_grad_op", "no_shard"):
            return sum(block_low[: k + 1])
        return block_low[k] + (block_low[k - 1] if k > 0 else 0)

    root_copies = prof.root_param_copies if prof else 0
    # autocast caches its low-precision copy of every trainable weight until the forward ends, also the
    # ones checkpointing does not save (recomputation casts them again, block by block).
    autocast_cache = sum(copies) if ckpt and _numerics(setup, d).autocast and not setup.lora_rank else 0
    fwd_parts = {"states": base + grads_always,
                 "working set": w_forward_end() + sum(saved_copies) + root_copies + autocast_cache,
                 "activations": sum(saved_blocks) + root_saved - root_copies,
                 "logits": loss_saved + (prof.logits_bytes + prof.logits_upcast_bytes if prof else 0)}
    if prof is not None and blocks:  # the costliest block forward: saved so far plus its live intermediates
        # checkpointed: the inputs kept before block k, then everything block k holds while it runs;
        # otherwise: all saved up to and with block k, and its live intermediates beyond that
        fwd_temp = prof.block_forward_temp_checkpointed if ckpt else prof.block_forward_temp
        upto = 0 if ckpt else 1
        k = max(range(len(blocks)), key=lambda i: sum(saved_blocks[:i + upto]) + fwd_temp[i])
        block_parts = {"states": base + grads_always,
                       "working set": w_forward_end() + sum(saved_copies[:k + 1]) + autocast_cache,
                       "activations": sum(saved_blocks[:k + upto]) + root_embed_side, "temporaries": fwd_temp[k]}
        phases.append(Phase(f"forward through block {k + 1}/{len(blocks)}", sum(block_parts.values()),
                            block_parts))
    phases.append(Phase("forward end (loss computed)", sum(fwd_parts.values()), fwd_parts))
    loss_parts = {**fwd_parts, "working set": fwd_parts["working set"] - autocast_cache,
                  "logits": loss_saved + loss_extra}
    phases.append(Phase("backward start (cross-entropy)", sum(loss_parts.values()), loss_parts))
    head_grad = grad_unit.get("root", 0) if not fsdp else 0
    n_blocks = len(blocks)
    for k in reversed(range(n_blocks)):
        below = sum(saved_blocks[:k + 1]) + sum(saved_copies[:k + 1])
        recompute = (acts[k] + copies[k]) if ckpt else 0
        done = sum(grad_unit.get(b, 0) for b in blocks[k + 1:]) + head_grad
        temp = (prof.block_recompute_temp if ckpt else prof.block_backward_temp)[k] if prof else 0
        if not fsdp:  # autocast's cached 16-bit weight copies are freed block by block, like activations
            copies_left = sum(saved_copies[:k + 1]) + (copies[k] if ckpt else 0)
            parts = {"states": base + grads_always + done, "working set": working + copies_left,
                     "activations": below - sum(saved_copies[:k + 1]) + root_embed_side + recompute
                     - (copies[k] if ckpt else 0), "temporaries": temp}
            phases.append(Phase(f"backward through block {k + 1}/{n_blocks}", sum(parts.values()), parts))
            continue
        # (i) block k computes its gradients: its activations are alive and the previous block's
        # reduce-scatter input is still in flight.
        in_flight = unit_train.get(blocks[k + 1], 0) * reduce if k + 1 < n_blocks else 0
        parts = {"states": base + grads_always + done,
                 "working set": root_low + root_grad_unsharded + resident(k) + in_flight,
                 "activations": below + root_embed_side + recompute, "temporaries": temp}
        phases.append(Phase(f"backward through block {k + 1}/{n_blocks}", sum(parts.values()), parts))
        # (i') its gradients are complete: activations freed, the unsharded gradients (compute dtype)
        # held, params still gathered, the previous reduce-scatter still in flight.
        low_grads = unit_train.get(blocks[k], 0) * compute
        parts = {"states": base + grads_always + done,
                 "working set": root_low + root_grad_unsharded + resident(k) + in_flight + low_grads,
                 "activations": below - saved_blocks[k] - saved_copies[k] + root_embed_side}
        phases.append(Phase(f"backward: block {k + 1}/{n_blocks} gradients complete", sum(parts.values()), parts))
        # (ii) its post-backward: params resharded, the previous reduce-scatter buffer reclaimed, the
        # unsharded grads copied into a new reduce-scatter input (reduce dtype) whose output becomes
        # the block's sharded gradients.
        parts = {"states": base + grads_always + done + grad_unit.get(blocks[k], 0),
                 "working set": root_low + root_grad_unsharded + resident(k) - block_low[k]
                 + block_grad_transient[k],
                 "activations": below - saved_blocks[k] - saved_copies[k] + root_embed_side}
        phases.append(Phase(f"backward: block {k + 1}/{n_blocks} reduce-scatter", sum(parts.values()), parts))
    # FSDP2 end of backward. (a) The input embeddings' gradients arrive while the first block's
    # reduce-scatter input is still in flight and the root is still unsharded. (b) The root reshards,
    # then reduce-scatters inside autograd's final callback: the input buffer and the new sharded
    # gradients coexist, and the word embedding's just-computed gradient is still referenced.
    root_sharded_grads = grad_unit.get("root", 0) + grad_unit.get("root:input", 0)
    if fsdp:
        first_rs = unit_train.get(blocks[0], 0) * reduce if blocks else 0
        root_train = unit_train.get("root", 0) + unit_train.get("root:input", 0)
        held = max((t.numel for t in tensors if t.unit == "root" and t.trainable and t.word_embedding), default=0)
        end_working = max(root_low + root_train * compute + first_rs - root_sharded_grads,
                          root_train * reduce + held * compute)
    else:
        end_working = working
    end_parts = {"states": base + grads_always + grads_dynamic_total, "working set": end_working}
    phases.append(Phase("backward end", sum(end_parts.values()), end_parts))
    step_temp = _step_temporaries(setup, tensors, d)
    step_parts = {"states": base + max(grads_always, grads_dynamic_total), "working set": working,
                  "temporaries": step_temp}
    phases.append(Phase("optimizer step", sum(step_parts.values()), step_parts))

    workspaces = setup.overheads.cublas_workspace_bytes
    for phase in phases:  # cuBLAS workspaces live in the allocator from the first matmul on
        phase.parts["cuBLAS workspaces"] = workspaces
        phase.bytes += workspaces
    fb_peak = max(p.bytes for p in phases[:-1])
    step_peak = phases[-1].bytes
    peak_phase = max(phases, key=lambda p: p.bytes)
    allocated = peak_phase.bytes
    working_set = max(p.parts.get("working set", 0) for p in phases)
    ov = setup.overheads
    nccl = ov.nccl_bytes if setup.world_size > 1 else 0
    overhead = ov.cuda_context_bytes + nccl + int(allocated * ov.allocator_fraction)
    cpu_node = st.cpu_per_node_exact if st.cpu_per_node_exact is not None and setup.cpu_offload != "none" \
        else st.cpu_per_rank * setup.gpus_per_node
    activations = None if prof is None else (sum(saved_blocks) + prof.root_saved + (max(acts) if ckpt else 0))
    logits = None if prof is None else loss_saved + loss_extra
    naive = int(setup.num_params * BYTES[d["param"] if not setup.mixed else setup.half] / setup.world_size)
    return Breakdown(
        setup=setup, params_bytes=st.params, grads_bytes=st.grads, optimizer_bytes=st.optimizer,
        working_set_bytes=working_set, model_states_bytes=st.params + st.grads + st.optimizer + working_set,
        activations_bytes=activations, logits_bytes=logits, temporaries_bytes=step_temp + ds_buckets,
        forward_backward_peak_bytes=fb_peak, optimizer_step_peak_bytes=step_peak, allocated_peak_bytes=allocated,
        peak_phase=peak_phase.name, overhead_bytes=overhead, total_bytes=allocated + overhead,
        cpu_bytes_per_node=int(cpu_node), trainable_params=st.trainable_params, phases=phases,
        notes=notes, deepspeed_exact=st.deepspeed_exact, naive_split_bytes=naive,
        attention_kernels=prof.attention_kernels if prof else {})


def with_changes(setup: Setup, **changes) -> Setup:
    """A copy of ``setup`` with some fields changed (used by the advice ladder)."""
    return replace(setup, **changes)
