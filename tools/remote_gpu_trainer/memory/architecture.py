"""Model architectures from a Hugging Face ``config.json`` (or a shipped preset): every parameter tensor.

The memory model needs more than a parameter count: FSDP shards each tensor separately (ceil per
tensor), DeepSpeed's ZeRO-3 estimator needs the largest module, the working set needs the largest
wrap unit, LoRA needs the shapes of the adapted linears and activations need hidden size, heads and
vocabulary. So a config becomes the full list of parameter tensors, named as Hugging Face names them,
which ``torch_models`` rebuilds for real on the meta device (tests check the two agree tensor by tensor).

Pure Python: no torch, no network. Supported families: GPT-2, BERT (sequence classification head),
T5 (conditional generation) and Llama-style decoders: Llama, Mistral, Qwen2/Qwen3, Gemma 2/3 (text),
Phi-3/Phi-4, and the mixture-of-experts decoders Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V2/V3 (MLA
attention, shared experts, first dense layers) and GPT-OSS. A preset is named by its key, its Hugging
Face id or a usual spelling (``names``); a model can also be a local ``config.json``, a folder holding
one, or the Hugging Face cache entry of an id.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from ..errors import InputError
from .names import cached_config, find_preset, hub_cache, nearest

Family = Literal["gpt2", "bert", "t5", "llama"]

#: HF ``model_type`` → family this module knows how to lay out.
MODEL_TYPES: dict[str, Family] = {
    "gpt2": "gpt2", "bert": "bert", "t5": "t5", "llama": "llama", "mistral": "llama", "qwen2": "llama",
    "qwen3": "llama", "gemma2": "llama", "gemma3": "llama", "gemma3_text": "llama", "phi3": "llama",
    "mixtral": "llama", "qwen2_moe": "llama", "qwen3_moe": "llama", "deepseek_v2": "llama", "deepseek_v3": "llama",
    "gpt_oss": "llama"}


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor, shaped as ``torch.nn`` stores it (Linear weights are ``(out, in)``)."""

    name: str
    shape: tuple[int, ...]
    unit: str
    """FSDP wrap unit: ``root`` or a block prefix such as ``model.layers.3``."""
    module: str
    """Owning module path (DeepSpeed's largest layer sums parameters per module, not recursively)."""
    expert: int | None = None
    """Routed-expert index of an expert weight; -1 for a tensor stacking all experts on dim 0 (GPT-OSS);
    None for everything else. Expert parallelism splits these over the ``ep`` group."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Linear:
    """A linear layer inside a block (a LoRA target candidate)."""

    name: str
    """Path inside the block, e.g. ``self_attn.q_proj``."""
    in_features: int
    out_features: int
    bias: bool


@dataclass(frozen=True)
class Architecture:
    family: Family
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    tie_word_embeddings: bool
    activation: str
    """gelu_new (tanh), gelu (erf), relu, silu (SwiGLU gate) or gelu_gated (T5 v1.1)."""
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    num_decoder_layers: int = 0
    """T5 only; the encoder has ``num_layers``."""
    attention_bias: bool = False
    qkv_bias_only: bool = False
    """Qwen2: q/k/v carry a bias, o_proj does not."""
    mlp_bias: bool = False
    type_vocab_size: int = 0
    num_labels: int = 0
    relative_attention_buckets: int = 0
    # ---- decoder variants (Llama family) ----
    qk_norm: bool = False
    """Qwen3 / Gemma 3: RMSNorm over head_dim on queries and keys (``self_attn.q_norm``/``k_norm``)."""
    sandwich_norms: bool = False
    """Gemma 2/3: extra ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` per block."""
    fused_projections: bool = False
    """Phi-3/Phi-4: one ``qkv_proj`` and one ``gate_up_proj`` instead of separate linears."""
    attention_sinks: bool = False
    """GPT-OSS: one learned sink logit per head (``self_attn.sinks``)."""
    final_logit_softcap: bool = False
    """Gemma 2: ``tanh(logits / cap) * cap`` before the loss (keeps one more logits-sized tensor)."""
    attention_softcap: bool = False
    """Gemma 2: ``tanh(scores / cap) * cap`` inside attention — transformers then has no SDPA path
    (``Gemma2PreTrainedModel._supports_sdpa = False``): attention runs eager and keeps the s × s tanh."""
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    """DeepSeek multi-head latent attention (MLA): low-rank query and key/value projections."""
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # ---- mixture of experts ----
    num_experts: int = 0
    """Routed experts per MoE layer (0 = dense model)."""
    experts_per_token: int = 0
    """Top-k: routed experts each token runs through."""
    moe_intermediate_size: int = 0
    shared_expert_size: int = 0
    """Intermediate size of the always-on shared expert MLP (DeepSeek: n_shared × moe size; Qwen2-MoE)."""
    shared_expert_gate: bool = False
    """Qwen2-MoE: a sigmoid gate (Linear h→1) scales the shared expert."""
    dense_layer_ids: tuple[int, ...] = ()
    """Layers of an MoE model that keep a dense MLP (DeepSeek first_k_dense_replace, Qwen mlp_only_layers)."""
    moe_style: str = ""
    """Parameter layout of the MoE block: mixtral, qwen, deepseek or gpt_oss."""
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    """Layers with local attention of ``sliding_window`` tokens (Mistral, Phi-3, Gemma 2/3): once the
    sequence reaches the window, transformers passes SDPA an explicit mask on these layers."""
    source: str = ""
    expected_params: int | None = field(default=None, compare=False)

    # ---- block layout -------------------------------------------------------------------------
    @property
    def inner_size(self) -> int:
        """Width of the attention projections (heads × head_dim; differs from hidden for T5)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def block_linears(self, kind: str = "block") -> list[Linear]:
        """Linears of one block. ``kind`` is ``block``, or ``encoder``/``decoder`` for T5."""
        h, inner, ffn = self.hidden_size, self.inner_size, self.intermediate_size
        if self.family == "gpt2":
            return [Linear("attn.c_attn", h, 3 * h, True), Linear("attn.c_proj", h, h, True),
                    Linear("mlp.c_fc", h, ffn, True), Linear("mlp.c_proj", ffn, h, True)]
        if self.family == "bert":
            return [Linear("attention.self.query", h, h, True), Linear("attention.self.key", h, h, True),
                    Linear("attention.self.value", h, h, True), Linear("attention.output.dense", h, h, True),
                    Linear("intermediate.dense", h, ffn, True), Linear("output.dense", ffn, h, True)]
        if self.family == "llama":
            return self._attention_linears() + self._mlp_linears(kind)
        # T5: attention without biases; decoder blocks add cross-attention.
        def attention(prefix: str) -> list[Linear]:
            return [Linear(f"{prefix}.{p}", h, inner, False) for p in ("q", "k", "v")] + [
                Linear(f"{prefix}.o", inner, h, False)]

        ff_layer = "layer.2" if kind == "decoder" else "layer.1"
        if self.activation == "gelu_gated":
            ff = [Linear(f"{ff_layer}.DenseReluDense.wi_0", h, ffn, False),
                  Linear(f"{ff_layer}.DenseReluDense.wi_1", h, ffn, False)]
        else:
            ff = [Linear(f"{ff_layer}.DenseReluDense.wi", h, ffn, False)]
        ff.append(Linear(f"{ff_layer}.DenseReluDense.wo", ffn, h, False))
        cross = attention("layer.1.EncDecAttention") if kind == "decoder" else []
        return [*attention("layer.0.SelfAttention"), *cross, *ff]

    def _attention_linears(self) -> list[Linear]:
        h, inner = self.hidden_size, self.inner_size
        if self.kv_lora_rank:  # DeepSeek MLA
            a, qk = self.num_heads, self.qk_nope_head_dim + self.qk_rope_head_dim
            q = ([Linear("self_attn.q_a_proj", h, self.q_lora_rank, False),
                  Linear("self_attn.q_b_proj", self.q_lora_rank, a * qk, False)] if self.q_lora_rank
                 else [Linear("self_attn.q_proj", h, a * qk, False)])
            return [*q, Linear("self_attn.kv_a_proj_with_mqa", h, self.kv_lora_rank + self.qk_rope_head_dim, False),
                    Linear("self_attn.kv_b_proj", self.kv_lora_rank,
                           a * (self.qk_nope_head_dim + self.v_head_dim), False),
                    Linear("self_attn.o_proj", a * self.v_head_dim, h, False)]
        qkv_bias = self.attention_bias or self.qkv_bias_only
        if self.fused_projections:
            return [Linear("self_attn.qkv_proj", h, inner + 2 * self.kv_size, qkv_bias),
                    Linear("self_attn.o_proj", inner, h, self.attention_bias)]
        return [Linear("self_attn.q_proj", h, inner, qkv_bias),
                Linear("self_attn.k_proj", h, self.kv_size, qkv_bias),
                Linear("self_attn.v_proj", h, self.kv_size, qkv_bias),
                Linear("self_attn.o_proj", inner, h, self.attention_bias)]

    def _mlp_linears(self, kind: str) -> list[Linear]:
        """The dense MLP of a block, or the shared expert (and its gate) of an MoE block."""
        h, b = self.hidden_size, self.mlp_bias
        if kind == "moe":
            if not self.shared_expert_size:
                return []
            prefix = "mlp.shared_experts" if self.moe_style == "deepseek" else "mlp.shared_expert"
            out = [Linear(f"{prefix}.{n}", h, self.shared_expert_size, False) for n in ("gate_proj", "up_proj")]
            out.append(Linear(f"{prefix}.down_proj", self.shared_expert_size, h, False))
            if self.shared_expert_gate:
                out.append(Linear("mlp.shared_expert_gate", h, 1, False))
            return out
        ffn = self.intermediate_size
        if self.fused_projections:
            return [Linear("mlp.gate_up_proj", h, 2 * ffn, b), Linear("mlp.down_proj", ffn, h, b)]
        return [Linear("mlp.gate_proj", h, ffn, b), Linear("mlp.up_proj", h, ffn, b),
                Linear("mlp.down_proj", ffn, h, b)]

    def window_masked(self, layer: int, seq_len: int) -> bool:
        """Whether layer ``layer`` attends through an explicit mask at ``seq_len`` (transformers skips the
        mask, using ``is_causal``, only while no sliding window is reached: ``_ignore_causal_mask_sdpa``)."""
        return bool(self.sliding_window) and layer in self.sliding_layers and seq_len >= self.sliding_window

    # ---- mixture of experts -----------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_prefix(self) -> str:
        return "block_sparse_moe" if self.moe_style == "mixtral" else "mlp"

    def expert_linears(self) -> list[Linear]:
        """One routed expert's linears, named inside ``<moe_prefix>.experts.<e>`` (not GPT-OSS's stacks)."""
        h, i = self.hidden_size, self.moe_intermediate_size
        if self.moe_style == "mixtral":
            return [Linear("w1", h, i, False), Linear("w3", h, i, False), Linear("w2", i, h, False)]
        return [Linear("gate_proj", h, i, False), Linear("up_proj", h, i, False), Linear("down_proj", i, h, False)]

    def _moe_tensors(self, add) -> None:
        """Router and routed experts of one MoE block, through ``add(local name, *shape, expert=...)``."""
        h, e, i, m = self.hidden_size, self.num_experts, self.moe_intermediate_size, self.moe_prefix
        if self.moe_style == "gpt_oss":
            add("mlp.router.weight", e, h), add("mlp.router.bias", e)
            add("mlp.experts.gate_up_proj", e, h, 2 * i, expert=-1)
            add("mlp.experts.gate_up_proj_bias", e, 2 * i, expert=-1)
            add("mlp.experts.down_proj", e, i, h, expert=-1), add("mlp.experts.down_proj_bias", e, h, expert=-1)
            return
        add(f"{m}.gate.weight", e, h)
        if self.model_type == "deepseek_v3":  # aux-loss-free balancing bias, stored with the checkpoint
            add(f"{m}.gate.e_score_correction_bias", e)
        for x in range(e):
            for lin in self.expert_linears():
                add(f"{m}.experts.{x}.{lin.name}.weight", lin.out_features, lin.in_features, expert=x)

    def routed_expert_params(self) -> int:
        return sum(t.numel for t in self.tensors() if t.expert is not None)

    @property
    def active_params(self) -> int:
        """Parameters one token's forward runs through: everything but the routed experts, plus top-k of
        them, without the input embedding (a lookup, not a matmul) unless it is tied to the head — the
        convention of the published active counts (DeepSeek-V3 37B, GPT-OSS-20B 3.6B)."""
        total = self.num_params
        if self.is_moe:
            routed = self.routed_expert_params()
            total -= routed - routed * self.experts_per_token // self.num_experts
        if not self.tie_word_embeddings and self.family in ("llama", "gpt2"):
            total -= next(t.numel for t in self.tensors() if t.name == self.word_embedding)
        return total

    def linear_names(self) -> list[str]:
        """Every distinct block-linear path (the values ``lora_targets`` may match)."""
        kinds = ("encoder", "decoder") if self.family == "t5" else ("block",)
        names: list[str] = []
        for kind in kinds:
            names += [lin.name for lin in self.block_linears(kind) if lin.name not in names]
        return names

    def blocks(self) -> list[tuple[str, str]]:
        """(unit prefix, kind) for every transformer block, in forward order."""
        if self.family == "gpt2":
            return [(f"transformer.h.{i}", "block") for i in range(self.num_layers)]
        if self.family == "bert":
            return [(f"bert.encoder.layer.{i}", "block") for i in range(self.num_layers)]
        if self.family == "llama":
            return [(f"model.layers.{i}", "moe" if self.is_moe and i not in self.dense_layer_ids else "block")
                    for i in range(self.num_layers)]
        return ([(f"encoder.block.{i}", "encoder") for i in range(self.num_layers)]
                + [(f"decoder.block.{i}", "decoder") for i in range(self.num_decoder_layers)])

    # ---- parameter tensors --------------------------------------------------------------------
    def _block_tensors(self, prefix: str, kind: str, index: int) -> list[ParamTensor]:
        h = self.hidden_size
        out: list[ParamTensor] = []

        def add(local: str, *shape: int, expert: int | None = None) -> None:
            module = f"{prefix}.{local.rsplit('.', 1)[0]}"
            out.append(ParamTensor(f"{prefix}.{local}", tuple(shape), prefix, module, expert))

        def linear(lin: Linear) -> None:
            add(f"{lin.name}.weight", lin.out_features, lin.in_features)
            if lin.bias:
                add(f"{lin.name}.bias", lin.out_features)

        linears = {lin.name: lin for lin in self.block_linears(kind)}
        if self.family == "gpt2":
            add("ln_1.weight", h), add("ln_1.bias", h)
            linear(linears["attn.c_attn"]), linear(linears["attn.c_proj"])
            add("ln_2.weight", h), add("ln_2.bias", h)
            linear(linears["mlp.c_fc"]), linear(linears["mlp.c_proj"])
        elif self.family == "bert":
            for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                         "attention.output.dense"):
                linear(linears[name])
            add("attention.output.LayerNorm.weight", h), add("attention.output.LayerNorm.bias", h)
            linear(linears["intermediate.dense"]), linear(linears["output.dense"])
            add("output.LayerNorm.weight", h), add("output.LayerNorm.bias", h)
        elif self.family == "llama":
            for lin in self.block_linears(kind):
                linear(lin)
            if self.qk_norm:
                add("self_attn.q_norm.weight", self.head_dim), add("self_attn.k_norm.weight", self.head_dim)
            if self.kv_lora_rank:
                if self.q_lora_rank:
                    add("self_attn.q_a_layernorm.weight", self.q_lora_rank)
                add("self_attn.kv_a_layernorm.weight", self.kv_lora_rank)
            if self.attention_sinks:
                add("self_attn.sinks", self.num_heads)
            if kind == "moe":
                self._moe_tensors(add)
            add("input_layernorm.weight", h), add("post_attention_layernorm.weight", h)
            if self.sandwich_norms:
                add("pre_feedforward_layernorm.weight", h), add("post_feedforward_layernorm.weight", h)
        else:
            for lin in self.block_linears(kind):
                if lin.name.startswith("layer.0.") and lin.name.endswith(".q") and index == 0:
                    linear(lin)
                    add("layer.0.SelfAttention.relative_attention_bias.weight",
                        self.relative_attention_buckets, self.num_heads)
                else:
                    linear(lin)
            norms = ("layer.0", "layer.1", "layer.2") if kind == "decoder" else ("layer.0", "layer.1")
            for norm in norms:
                add(f"{norm}.layer_norm.weight", h)
        return out

    def tensors(self) -> list[ParamTensor]:
        """Every parameter tensor once (a tied head shares the embedding and is not listed twice)."""
        h, v = self.hidden_size, self.vocab_size
        root: list[ParamTensor] = []

        def add(name: str, *shape: int) -> None:
            root.append(ParamTensor(name, tuple(shape), "root", name.rsplit(".", 1)[0]))

        if self.family == "gpt2":
            add("transformer.wte.weight", v, h), add("transformer.wpe.weight", self.max_positions, h)
        elif self.family == "bert":
            add("bert.embeddings.word_embeddings.weight", v, h)
            add("bert.embeddings.position_embeddings.weight", self.max_positions, h)
            add("bert.embeddings.token_type_embeddings.weight", self.type_vocab_size, h)
            add("bert.embeddings.LayerNorm.weight", h), add("bert.embeddings.LayerNorm.bias", h)
        elif self.family == "llama":
            add("model.embed_tokens.weight", v, h)
        else:
            add("shared.weight", v, h)
        blocks: list[ParamTensor] = []
        per_kind_index: dict[str, int] = {}
        for prefix, kind in self.blocks():
            index = per_kind_index.get(kind, 0)
            per_kind_index[kind] = index + 1
            blocks += self._block_tensors(prefix, kind, index)
        tail: list[ParamTensor] = []
        root_before = len(root)
        if self.family == "gpt2":
            add("transformer.ln_f.weight", h), add("transformer.ln_f.bias", h)
        elif self.family == "bert":
            add("bert.pooler.dense.weight", h, h), add("bert.pooler.dense.bias", h)
            add("classifier.weight", self.num_labels, h), add("classifier.bias", self.num_labels)
        elif self.family == "llama":
            add("model.norm.weight", h)
        else:
            add("encoder.final_layer_norm.weight", h), add("decoder.final_layer_norm.weight", h)
        if not self.tie_word_embeddings and self.family in ("gpt2", "llama", "t5"):
            add("lm_head.weight", v, h)
        tail, root = root[root_before:], root[:root_before]
        return [*root, *blocks, *tail]

    # ---- derived sizes --------------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.tensors())

    @property
    def word_embedding(self) -> str:
        """Name of the token embedding table."""
        return {"gpt2": "transformer.wte.weight", "bert": "bert.embeddings.word_embeddings.weight",
                "llama": "model.embed_tokens.weight", "t5": "shared.weight"}[self.family]

    def input_embeddings(self) -> set[str]:
        """Root tensors used only at the start of forward: their gradients arrive at the end of backward.
        A tied embedding is also the head, so its gradient exists from the start of backward."""
        names = {"gpt2": ["transformer.wte.weight", "transformer.wpe.weight"],
                 "bert": [t.name for t in self.tensors() if t.name.startswith("bert.embeddings.")],
                 "llama": ["model.embed_tokens.weight"], "t5": ["shared.weight"]}[self.family]
        tied = {"transformer.wte.weight", "model.embed_tokens.weight", "shared.weight"} \
            if self.tie_word_embeddings else set()
        return set(names) - tied

    def largest_layer_params(self) -> int:
        """DeepSpeed's ``largest_layer_params``: max over modules of their own (non-recursive) params.

        A tied head is its own module holding the shared weight, so it counts like the embedding.
        """
        per_module: dict[str, int] = {}
        for t in self.tensors():
            per_module[t.module] = per_module.get(t.module, 0) + t.numel
        return max(per_module.values())

    def unit_params(self) -> dict[str, int]:
        """Parameters per FSDP wrap unit (one unit per block, plus ``root`` for everything else)."""
        units: dict[str, int] = {}
        for t in self.tensors():
            units[t.unit] = units.get(t.unit, 0) + t.numel
        return units

    def lora_linears(self, targets: list[str]) -> list[tuple[str, Linear]]:
        """(block prefix, linear) for every block linear a LoRA target matches, PEFT-style.

        A target matches a module whose path equals it or ends with ``.target`` (``c_proj`` matches
        both GPT-2 projections); ``all-linear`` matches every block linear. Heads stay frozen.
        """
        known = self.linear_names()
        wanted = set(known) if targets == ["all-linear"] else set()
        for target in targets:
            if target == "all-linear":
                continue
            hits = [n for n in known if n == target or n.endswith("." + target)]
            if not hits:
                short = sorted({n.rsplit(".", 1)[-1] for n in known})
                raise InputError("lora_targets", f"{target!r} matches no linear layer of this {self.model_type} "
                                 "model", allowed=[*short, "all-linear"])
            wanted.update(hits)
        return [(prefix, lin) for prefix, kind in self.blocks() for lin in self.block_linears(kind)
                if lin.name in wanted]

    def describe(self) -> str:
        kv = f", {self.num_kv_heads} kv heads" if self.num_kv_heads != self.num_heads else ""
        if self.kv_lora_rank:
            kv = f", MLA (kv rank {self.kv_lora_rank})"
        layers = (f"{self.num_layers}+{self.num_decoder_layers} layers" if self.family == "t5"
                  else f"{self.num_layers} layers")
        ffn = f"FFN {self.intermediate_size}"
        if self.is_moe:
            dense = f", {len(self.dense_layer_ids)} dense layers" if self.dense_layer_ids else ""
            shared = f" + shared {self.shared_expert_size}" if self.shared_expert_size else ""
            ffn = (f"MoE {self.num_experts} experts × {self.moe_intermediate_size}, top-{self.experts_per_token}"
                   f"{shared}{dense}")
        return (f"{self.model_type}: {layers}, hidden {self.hidden_size}, {self.num_heads} heads{kv}, "
                f"{ffn}, vocab {self.vocab_size}{', tied embeddings' if self.tie_word_embeddings else ''}")


# ---- parsing ------------------------------------------------------------------------------------
def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _positive(cfg: dict[str, Any], where: str, *keys: str, default: Any = None) -> int:
    value = _get(cfg, *keys, default=default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputError("model", f"{where}: {keys[0]} must be a positive integer, got {value!r}")
    return value


def from_hf_config(cfg: dict[str, Any], where: str = "config.json") -> Architecture:
    """Read the architecture fields of a Hugging Face ``config.json`` dict."""
    model_type = cfg.get("model_type")
    if model_type not in MODEL_TYPES:
        raise InputError("model", f"{where}: model_type {model_type!r} is not supported (pass num_params for "
                         "a parameter-only estimate)", allowed=sorted(MODEL_TYPES))
    family = MODEL_TYPES[model_type]
    common = {"source": cfg.get("_source", where), "expected_params": cfg.get("_params")}
    if family == "gpt2":
        h = _positive(cfg, where, "n_embd", "hidden_size")
        heads = _positive(cfg, where, "n_head", "num_attention_heads")
        return Architecture(
            family, model_type, hidden_size=h, num_layers=_positive(cfg, where, "n_layer", "num_hidden_layers"),
            num_heads=heads, num_kv_heads=heads, head_dim=h // heads,
            intermediate_size=_positive(cfg, where, "n_inner", default=4 * h),
            vocab_size=_positive(cfg, where, "vocab_size"), max_positions=_positive(cfg, where, "n_positions"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            activation=str(cfg.get("activation_function", "gelu_new")),
            hidden_dropout=float(_get(cfg, "resid_pdrop", default=0.1)),
            attention_dropout=float(_get(cfg, "attn_pdrop", default=0.1)), **common)
    if family == "bert":
        h = _positive(cfg, where, "hidden_size")
        heads = _positive(cfg, where, "num_attention_heads")
        labels = len(cfg["id2label"]) if isinstance(cfg.get("id2label"), dict) else cfg.get("num_labels", 2)
        return Architecture(
            family, model_type, hidden_size=h, num_layers=_positive(cfg, where, "num_hidden_layers"),
            num_heads=heads, num_kv_heads=heads, head_dim=h // heads,
            intermediate_size=_positive(cfg, where, "intermediate_size"),
            vocab_size=_positive(cfg, where, "vocab_size"),
            max_positions=_positive(cfg, where, "max_position_embeddings"), tie_word_embeddings=False,
            activation=str(cfg.get("hidden_act", "gelu")),
            hidden_dropout=float(_get(cfg, "hidden_dropout_prob", default=0.1)),
            attention_dropout=float(_get(cfg, "attention_probs_dropout_prob", default=0.1)),
            type_vocab_size=_positive(cfg, where, "type_vocab_size", default=2), num_labels=int(labels), **common)
    if family == "t5":
        proj = str(cfg.get("feed_forward_proj", "relu"))
        if proj not in ("relu", "gated-gelu"):
            raise InputError("model", f"{where}: feed_forward_proj {proj!r} is not supported",
                             allowed=["relu", "gated-gelu"])
        layers = _positive(cfg, where, "num_layers")
        heads = _positive(cfg, where, "num_heads")
        return Architecture(
            family, model_type, hidden_size=_positive(cfg, where, "d_model"), num_layers=layers,
            num_heads=heads, num_kv_heads=heads, head_dim=_positive(cfg, where, "d_kv"),
            intermediate_size=_positive(cfg, where, "d_ff"), vocab_size=_positive(cfg, where, "vocab_size"),
            max_positions=512, tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            activation="gelu_gated" if proj == "gated-gelu" else "relu",
            hidden_dropout=float(_get(cfg, "dropout_rate", default=0.1)),
            attention_dropout=float(_get(cfg, "dropout_rate", default=0.1)),
            num_decoder_layers=_positive(cfg, where, "num_decoder_layers", default=layers),
            relative_attention_buckets=_positive(cfg, where, "relative_attention_num_buckets", default=32),
            **common)
    return _decoder(cfg, where, model_type, common)


#: Activations of the gated MLP each decoder may use (the op saves its input either way).
GATED_ACTS = ("silu", "gelu_pytorch_tanh", "gelu")


def _decoder(cfg: dict[str, Any], where: str, model_type: str, common: dict[str, Any]) -> Architecture:
    """Every Llama-style decoder: dense (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3/4) and MoE."""
    if model_type == "gemma3" and isinstance(cfg.get("text_config"), dict):
        # Gemma 3 4B/12B/27B are image-text models: the text decoder is in text_config; the SigLIP vision
        # tower (~0.4B) is not modelled.
        cfg = {**cfg["text_config"], "tie_word_embeddings": cfg.get("tie_word_embeddings", True)}
    h = _positive(cfg, where, "hidden_size")
    heads = _positive(cfg, where, "num_attention_heads")
    gemma = model_type.startswith("gemma")
    act = str(_get(cfg, "hidden_activation", "hidden_act", default="silu"))
    if act not in GATED_ACTS:
        raise InputError("model", f"{where}: hidden_act {act!r} is not supported for {model_type}",
                         allowed=list(GATED_ACTS))
    layers = _positive(cfg, where, "num_hidden_layers")
    moe: dict[str, Any] = {}
    experts = _get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0
    if model_type in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss") and experts:
        style = {"mixtral": "mixtral", "gpt_oss": "gpt_oss"}.get(model_type, "deepseek" if "deepseek" in model_type
                                                                   else "qwen")
        if style == "deepseek":
            first = int(cfg.get("first_k_dense_replace", 0) or 0)
            freq = int(cfg.get("moe_layer_freq", 1) or 1)
            dense = tuple(i for i in range(layers) if i < first or i % freq)
            shared = int(cfg.get("n_shared_experts") or 0) * _positive(cfg, where, "moe_intermediate_size")
        elif style == "qwen":
            step = int(cfg.get("decoder_sparse_step", 1) or 1)
            only = set(cfg.get("mlp_only_layers") or [])
            dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
            shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        else:
            dense, shared = (), 0
        moe_size = (_positive(cfg, where, "intermediate_size") if style in ("mixtral", "gpt_oss")
                    else _positive(cfg, where, "moe_intermediate_size"))
        moe = {"num_experts": _positive(cfg, where, "num_local_experts", "num_experts", "n_routed_experts"),
               "experts_per_token": _positive(cfg, where, "num_experts_per_tok", "experts_per_token"),
               "moe_intermediate_size": moe_size, "shared_expert_size": shared,
               "shared_expert_gate": model_type == "qwen2_moe" and bool(shared), "dense_layer_ids": dense,
               "moe_style": style}
    mla: dict[str, Any] = {}
    if model_type.startswith("deepseek"):
        mla = {"q_lora_rank": int(cfg.get("q_lora_rank") or 0),
               "kv_lora_rank": _positive(cfg, where, "kv_lora_rank"),
               "qk_nope_head_dim": _positive(cfg, where, "qk_nope_head_dim"),
               "qk_rope_head_dim": _positive(cfg, where, "qk_rope_head_dim"),
               "v_head_dim": _positive(cfg, where, "v_head_dim")}
    head_dim = (mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]) if mla else \
        _positive(cfg, where, "head_dim", default=h // heads)
    window, windowed = _sliding_window(cfg, model_type, layers)
    intermediate = _get(cfg, "intermediate_size", default=0) or 0
    if not intermediate and not (moe and not moe.get("dense_layer_ids")):
        _positive(cfg, where, "intermediate_size")  # raises: a dense MLP needs its size
    return Architecture(
        "llama", model_type, hidden_size=h, num_layers=layers, num_heads=heads,
        num_kv_heads=heads if mla else _positive(cfg, where, "num_key_value_heads", default=heads),
        head_dim=head_dim, intermediate_size=int(intermediate), vocab_size=_positive(cfg, where, "vocab_size"),
        max_positions=_positive(cfg, where, "max_position_embeddings", default=4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)), activation=act,
        attention_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        attention_bias=bool(cfg.get("attention_bias", model_type == "gpt_oss")),
        qkv_bias_only=model_type in ("qwen2", "qwen2_moe"), mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"), sandwich_norms=gemma,
        fused_projections=model_type == "phi3", attention_sinks=model_type == "gpt_oss",
        final_logit_softcap=bool(cfg.get("final_logit_softcapping")),
        attention_softcap=bool(cfg.get("attn_logit_softcapping", 50.0 if model_type == "gemma2" else None)),
        sliding_window=window, sliding_layers=windowed,
        **mla, **moe, **common)


#: transformers 5.x defaults for configs that leave the window out (MistralConfig 4096, Gemma 2/3 4096).
_DEFAULT_WINDOW = {"mistral": 4096, "gemma2": 4096, "gemma3": 4096, "gemma3_text": 4096}


def _sliding_window(cfg: dict[str, Any], model_type: str, layers: int) -> tuple[int, tuple[int, ...]]:
    """(window, layers that use it) as transformers 5.x reads them: ``layer_types`` when given; Qwen only
    with ``use_sliding_window``; Gemma 2 every other layer, Gemma 3 five of every six; Mistral, Mixtral and
    Phi-3 every layer."""
    window = cfg.get("sliding_window", _DEFAULT_WINDOW.get(model_type))
    if not isinstance(window, int) or window <= 0:
        return 0, ()
    if model_type.startswith("qwen") and not cfg.get("use_sliding_window"):
        return 0, ()
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return window, tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if model_type == "gemma2":
        return window, tuple(range(0, layers, 2))
    if model_type.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern", 6) or 6)
        return window, tuple(i for i in range(layers) if (i + 1) % pattern)
    if model_type.startswith("qwen"):
        first = int(cfg.get("max_window_layers", layers) or layers)
        return window, tuple(range(first, layers))
    return window, tuple(range(layers))


@cache
def presets() -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath("presets.json").read_text(encoding="utf-8")
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def load_config(model: str) -> tuple[dict[str, Any], str]:
    """The ``config.json`` fields of ``model`` and where they came from: a preset (key, Hugging Face id or
    usual spelling), a path to a ``config.json`` or a folder holding one, or an ``org/name`` id in the
    local Hugging Face cache. Nothing is downloaded."""
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        key = find_preset(model, presets())
        if key is not None:
            return presets()[key], f"preset {key}"
        cached = cached_config(model)
        if cached is None:
            near = nearest(model, presets())
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            fetch = (f" To use it, fetch only its config (no weights): `hf download {model} config.json` (or copy "
                     "config.json from the model page) and pass that file or folder." if model.count("/") == 1
                     else "")
            raise InputError("model", f"{model!r} is neither a known model, a config.json file or folder, nor a "
                             f"Hugging Face id in the local cache ({hub_cache()}){hint}.{fetch}",
                             allowed=[*near, "<path to config.json>", "<org/name in the HF cache>"] if near
                             else [*sorted(presets()), "<path to config.json>", "<org/name in the HF cache>"])
        path = cached
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError("model", f"cannot read {path}: {err}") from None
    if not isinstance(cfg, dict):
        raise InputError("model", f"{path} is not a JSON object")
    return cfg, str(path)


def load_architecture(model: str) -> Architecture:
    """The architecture of ``model`` (see ``load_config`` for what ``model`` may be)."""
    cfg, where = load_config(model)
    return from_hf_config(cfg, where=where)
