"""Model architectures from a Hugging Face ``config.json`` (or a shipped preset): every parameter tensor.

The memory model needs more than a parameter count: FSDP shards each tensor separately (ceil per
tensor), DeepSpeed's ZeRO-3 estimator needs the largest module, the working set needs the largest
wrap unit, LoRA needs the shapes of the adapted linears and activations need hidden size, heads and
vocabulary. So a config becomes the full list of parameter tensors, named as Hugging Face names them,
which ``torch_models`` rebuilds for real on the meta device (tests check the two agree tensor by tensor).

Pure Python: no torch, no network. Supported families: GPT-2, BERT (sequence classification head),
T5 (conditional generation) and Llama-style decoders (Llama, Mistral, Qwen2).
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

Family = Literal["gpt2", "bert", "t5", "llama"]

#: HF ``model_type`` → family this module knows how to lay out.
MODEL_TYPES: dict[str, Family] = {"gpt2": "gpt2", "bert": "bert", "t5": "t5", "llama": "llama",
                                  "mistral": "llama", "qwen2": "llama"}


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor, shaped as ``torch.nn`` stores it (Linear weights are ``(out, in)``)."""

    name: str
    shape: tuple[int, ...]
    unit: str
    """FSDP wrap unit: ``root`` or a block prefix such as ``model.layers.3``."""
    module: str
    """Owning module path (DeepSpeed's largest layer sums parameters per module, not recursively)."""

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
            qkv_bias = self.attention_bias or self.qkv_bias_only
            return [Linear("self_attn.q_proj", h, inner, qkv_bias),
                    Linear("self_attn.k_proj", h, self.kv_size, qkv_bias),
                    Linear("self_attn.v_proj", h, self.kv_size, qkv_bias),
                    Linear("self_attn.o_proj", inner, h, self.attention_bias),
                    Linear("mlp.gate_proj", h, ffn, self.mlp_bias), Linear("mlp.up_proj", h, ffn, self.mlp_bias),
                    Linear("mlp.down_proj", ffn, h, self.mlp_bias)]
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
            return [(f"model.layers.{i}", "block") for i in range(self.num_layers)]
        return ([(f"encoder.block.{i}", "encoder") for i in range(self.num_layers)]
                + [(f"decoder.block.{i}", "decoder") for i in range(self.num_decoder_layers)])

    # ---- parameter tensors --------------------------------------------------------------------
    def _block_tensors(self, prefix: str, kind: str, index: int) -> list[ParamTensor]:
        h = self.hidden_size
        out: list[ParamTensor] = []

        def add(local: str, *shape: int) -> None:
            module = f"{prefix}.{local.rsplit('.', 1)[0]}"
            out.append(ParamTensor(f"{prefix}.{local}", tuple(shape), prefix, module))

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
            for lin in self.block_linears():
                linear(lin)
            add("input_layernorm.weight", h), add("post_attention_layernorm.weight", h)
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
        layers = (f"{self.num_layers}+{self.num_decoder_layers} layers" if self.family == "t5"
                  else f"{self.num_layers} layers")
        return (f"{self.model_type}: {layers}, hidden {self.hidden_size}, {self.num_heads} heads{kv}, "
                f"FFN {self.intermediate_size}, vocab {self.vocab_size}"
                f"{', tied embeddings' if self.tie_word_embeddings else ''}")


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
    h = _positive(cfg, where, "hidden_size")
    heads = _positive(cfg, where, "num_attention_heads")
    act = str(cfg.get("hidden_act", "silu"))
    if act != "silu":
        raise InputError("model", f"{where}: hidden_act {act!r} is not supported for {model_type}", allowed=["silu"])
    return Architecture(
        family, model_type, hidden_size=h, num_layers=_positive(cfg, where, "num_hidden_layers"),
        num_heads=heads, num_kv_heads=_positive(cfg, where, "num_key_value_heads", default=heads),
        head_dim=_positive(cfg, where, "head_dim", default=h // heads),
        intermediate_size=_positive(cfg, where, "intermediate_size"), vocab_size=_positive(cfg, where, "vocab_size"),
        max_positions=_positive(cfg, where, "max_position_embeddings", default=4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), activation="silu",
        attention_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        attention_bias=bool(cfg.get("attention_bias", False)), qkv_bias_only=model_type == "qwen2",
        mlp_bias=bool(cfg.get("mlp_bias", False)), **common)


@cache
def presets() -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath("presets.json").read_text(encoding="utf-8")
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def load_architecture(model: str) -> Architecture:
    """A preset name, or a path to a Hugging Face ``config.json`` (or a model folder holding one)."""
    if model in presets():
        return from_hf_config(presets()[model], where=f"preset {model}")
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError("model", f"{model!r} is neither a preset nor a config.json file",
                         allowed=[*sorted(presets()), "<path to config.json>"])
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError("model", f"cannot read {path}: {err}") from None
    if not isinstance(cfg, dict):
        raise InputError("model", f"{path} is not a JSON object")
    return from_hf_config(cfg, where=str(path))
