"""Torch-only re-implementations of the supported architectures, for measured mode and the tests.

Each model follows the Hugging Face implementation's parameter names and op sequence (the ops decide
what autograd saves, so they decide activation memory): GPT-2 (pre-LN, fused qkv, tanh GELU, tied
head), BERT (post-LN, sequence classification), T5 (RMS-style norm with fp32 variance, relative
position bias, fp32 softmax) and Llama/Mistral/Qwen2 (RMSNorm with fp32 upcast, RoPE, GQA with
``repeat_kv``, SwiGLU). No transformers dependency: models are built on the meta device and never
allocate. The module imports torch, so only the measurement worker and tests import it.

Every model's ``forward(batch)`` returns the training loss, computed as HF does for that head
(causal LM / seq2seq: cross-entropy over ``logits.float()``; BERT: cross-entropy over labels).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .architecture import Architecture, Linear

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LoRALinear(nn.Module):
    """PEFT's ``lora.Linear`` forward: frozen base + ``lora_B(lora_A(x.to(adapter dtype))) * scaling``.

    Parameter names mirror the frozen base (``weight``/``bias``) so the model's names stay HF's; the
    adapters are ``lora_A.weight`` (r × in) and ``lora_B.weight`` (out × r).
    """

    def __init__(self, lin: Linear, rank: int, adapter_dtype: torch.dtype, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(lin.out_features, lin.in_features, dtype=dtype), requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(lin.out_features, dtype=dtype), requires_grad=False)
                     if lin.bias else None)
        self.lora_A = nn.Linear(lin.in_features, rank, bias=False, dtype=adapter_dtype)
        self.lora_B = nn.Linear(rank, lin.out_features, bias=False, dtype=adapter_dtype)
        self.scaling = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, self.weight, self.bias)
        out_dtype = result.dtype
        adapter_in = x if x.dtype == self.lora_A.weight.dtype else x.to(self.lora_A.weight.dtype)
        result = result + self.lora_B(self.lora_A(adapter_in)) * self.scaling
        return result.to(out_dtype)


class Builder:
    """Creates the linears of a model, swapping LoRA targets in and freezing what LoRA freezes."""

    def __init__(self, dtype: torch.dtype, lora_rank: int | None, lora_targets: set[str], adapter_dtype: torch.dtype):
        self.dtype, self.rank, self.targets, self.adapter_dtype = dtype, lora_rank, lora_targets, adapter_dtype

    def linear(self, lin: Linear) -> nn.Module:
        if self.rank and lin.name in self.targets:
            return LoRALinear(lin, self.rank, self.adapter_dtype, self.dtype)
        return nn.Linear(lin.in_features, lin.out_features, bias=lin.bias, dtype=self.dtype)

    def finish(self, model: nn.Module) -> nn.Module:
        if self.rank:
            for name, param in model.named_parameters():
                param.requires_grad_(".lora_A." in name or ".lora_B." in name)
        return model


def _set(root: nn.Module, path: str, module: nn.Module) -> None:
    """Attach ``module`` at dotted ``path`` (creating plain containers on the way)."""
    parts = path.split(".")
    for part in parts[:-1]:
        if not hasattr(root, part):
            root.add_module(part, nn.Module())
        root = getattr(root, part)
    root.add_module(parts[-1], module)


def _get(root: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _add_linears(block: nn.Module, lins: list[Linear], build: Builder) -> None:
    for lin in lins:
        _set(block, lin.name, build.linear(lin))


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return F.dropout(x, p, training) if p > 0 else x


def _heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    b, s, _ = x.shape
    return x.view(b, s, heads, head_dim).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    b, a, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, a * d)


def eager_attention(q, k, v, *, scale: float | None, bias=None, causal: bool, dropout: float, training: bool):
    """Math attention as HF's eager path: fp32 softmax, cast back, dropout, ``probs @ v``."""
    scores = torch.matmul(q, k.transpose(-1, -2))
    if scale is not None:
        scores = scores * scale
    if bias is not None:
        scores = scores + bias
    if causal:
        s_q, s_k = scores.shape[-2:]
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    probs = _dropout(probs, dropout, training)
    return torch.matmul(probs, v)


def attention(q, k, v, *, impl: str, causal: bool, dropout: float, training: bool):
    if impl == "eager":
        return eager_attention(q, k, v, scale=1 / math.sqrt(q.shape[-1]), causal=causal, dropout=dropout,
                               training=training)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout if training else 0.0)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's loss: cross-entropy over ``logits.float()`` (labels already aligned)."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


# ---- GPT-2 ----------------------------------------------------------------------------------------
class GPT2Block(nn.Module):
    def __init__(self, arch: Architecture, build: Builder, attn_impl: str, dropout: bool):
        super().__init__()
        h = arch.hidden_size
        self.ln_1 = nn.LayerNorm(h, dtype=build.dtype)
        self.ln_2 = nn.LayerNorm(h, dtype=build.dtype)
        _add_linears(self, arch.block_linears(), build)
        self.arch, self.impl = arch, attn_impl
        self.p_hidden = arch.hidden_dropout if dropout else 0.0
        self.p_attn = arch.attention_dropout if dropout else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.arch
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(a.hidden_size, dim=2)
        o = attention(_heads(q, a.num_heads, a.head_dim), _heads(k, a.num_heads, a.head_dim),
                      _heads(v, a.num_heads, a.head_dim), impl=self.impl, causal=True, dropout=self.p_attn,
                      training=self.training)
        x = x + _dropout(self.attn.c_proj(_merge(o)), self.p_hidden, self.training)
        f = self.mlp.c_fc(self.ln_2(x))
        if self.arch.activation == "gelu_new":  # HF's NewGELUActivation, op by op (it keeps four tensors)
            f = 0.5 * f * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (f + 0.044715 * torch.pow(f, 3.0))))
        else:
            f = F.gelu(f, approximate="tanh")
        m = self.mlp.c_proj(f)
        return x + _dropout(m, self.p_hidden, self.training)


class GPT2LM(nn.Module):
    def __init__(self, arch: Architecture, build: Builder, attn_impl: str, dropout: bool):
        super().__init__()
        t = nn.Module()
        t.wte = nn.Embedding(arch.vocab_size, arch.hidden_size, dtype=build.dtype)
        t.wpe = nn.Embedding(arch.max_positions, arch.hidden_size, dtype=build.dtype)
        t.h = nn.ModuleList(GPT2Block(arch, build, attn_impl, dropout) for _ in range(arch.num_layers))
        t.ln_f = nn.LayerNorm(arch.hidden_size, dtype=build.dtype)
        self.transformer = t
        if not arch.tie_word_embeddings:
            self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False, dtype=build.dtype)
        self.p = arch.hidden_dropout if dropout else 0.0

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.h)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        t = self.transformer
        x = t.wte(ids) + t.wpe(torch.arange(ids.shape[1], device=ids.device))
        x = _dropout(x, self.p, self.training)
        for block in t.h:
            x = block(x)
        head = t.wte.weight if not hasattr(self, "lm_head") else self.lm_head.weight
        return causal_lm_loss(F.linear(t.ln_f(x), head), batch["labels"])


# ---- BERT -----------------------------------------------------------------------------------------
class BertBlock(nn.Module):
    def __init__(self, arch: Architecture, build: Builder, attn_impl: str, dropout: bool):
        super().__init__()
        _add_linears(self, arch.block_linears(), build)
        self.attention.output.LayerNorm = nn.LayerNorm(arch.hidden_size, eps=1e-12, dtype=build.dtype)
        self.output.LayerNorm = nn.LayerNorm(arch.hidden_size, eps=1e-12, dtype=build.dtype)
        self.arch, self.impl = arch, attn_impl
        self.p_hidden = arch.hidden_dropout if dropout else 0.0
        self.p_attn = arch.attention_dropout if dropout else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, sa = self.arch, self.attention.self
        q, k, v = (_heads(proj(x), a.num_heads, a.head_dim) for proj in (sa.query, sa.key, sa.value))
        o = attention(q, k, v, impl=self.impl, causal=False, dropout=self.p_attn, training=self.training)
        attn = _dropout(self.attention.output.dense(_merge(o)), self.p_hidden, self.training)
        x = self.attention.output.LayerNorm(attn + x)
        m = _dropout(self.output.dense(F.gelu(self.intermediate.dense(x))), self.p_hidden, self.training)
        return self.output.LayerNorm(m + x)


class BertClassifier(nn.Module):
    def __init__(self, arch: Architecture, build: Builder, attn_impl: str, dropout: bool):
        super().__init__()
        h, dt = arch.hidden_size, build.dtype
        emb = nn.Module()
        emb.word_embeddings = nn.Embedding(arch.vocab_size, h, dtype=dt)
        emb.position_embeddings = nn.Embedding(arch.max_positions, h, dtype=dt)
        emb.token_type_embeddings = nn.Embedding(arch.type_vocab_size, h, dtype=dt)
        emb.LayerNorm = nn.LayerNorm(h, eps=1e-12, dtype=dt)
        bert = nn.Module()
        bert.embeddings = emb
        bert.encoder = nn.Module()
        bert.encoder.layer = nn.ModuleList(BertBlock(arch, build, attn_impl, dropout) for _ in range(arch.num_layers))
        bert.pooler = nn.Module()
        bert.pooler.dense = nn.Linear(h, h, dtype=dt)
        self.bert = bert
        self.classifier = nn.Linear(h, arch.num_labels, dtype=dt)
        self.p = arch.hidden_dropout if dropout else 0.0

    def blocks(self) -> list[nn.Module]:
        return list(self.bert.encoder.layer)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids, e = batch["input_ids"], self.bert.embeddings
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = e.word_embeddings(ids) + e.token_type_embeddings(torch.zeros_like(ids)) + e.position_embeddings(positions)
        x = _dropout(e.LayerNorm(x), self.p, self.training)
        for block in self.bert.encoder.layer:
            x = block(x)
        pooled = torch.tanh(self.bert.pooler.dense(x[:, 0]))
        logits = self.classifier(_dropout(pooled, self.p, self.training))
        return F.cross_entropy(logits.float(), batch["class_labels"])


# ---- T5 -------------------------------------------------------------------------------------------
class T5Norm(nn.Module):
    """HF ``T5LayerNorm``: no mean, no bias; fp32 variance; cast to the weight dtype before scaling."""

    def __init__(self, hidden: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + 1e-6)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


def _relative_buckets(s_q: int, s_k: int, bidirectional: bool, buckets: int, device) -> torch.Tensor:
    """HF ``T5Attention._relative_position_bucket`` (max_distance 128)."""
    rel = torch.arange(s_k, device=device)[None, :] - torch.arange(s_q, device=device)[:, None]
    out = torch.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out = out + (rel > 0).to(torch.long) * buckets
        rel = rel.abs()
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    exact = buckets // 2
    large = exact + (torch.log(rel.float().clamp(min=1) / exact) / math.log(128 / exact) * (buckets - exact)).long()
    large = torch.min(large, torch.full_like(large, buckets - 1))
    return out + torch.where(rel < exact, rel, large)


class T5Block(nn.Module):
    def __init__(self, arch: Architecture, build: Builder, kind: str, first: bool, dropout: bool):
        super().__init__()
        _add_linears(self, arch.block_linears(kind), build)
        norms = ("layer.0", "layer.1", "layer.2") if kind == "decoder" else ("layer.0", "layer.1")
        for norm in norms:
            _set(self, f"{norm}.layer_norm", T5Norm(arch.hidden_size, build.dtype))
        if first:
            _get(self, "layer.0.SelfAttention").relative_attention_bias = nn.Embedding(
                arch.relative_attention_buckets, arch.num_heads, dtype=build.dtype)
        self.arch, self.kind = arch, kind
        self.p = arch.hidden_dropout if dropout else 0.0

    def _attend(self, attn: nn.Module, x: torch.Tensor, kv: torch.Tensor, bias, causal: bool) -> torch.Tensor:
        a = self.arch
        pairs = ((attn.q, x), (attn.k, kv), (attn.v, kv))
        q, k, v = (_heads(proj(src), a.num_heads, a.head_dim) for proj, src in pairs)
        # transformers' T5 under SDPA: the position bias becomes a float mask (causal: where(tril, bias, min)),
        # made contiguous per layer; cross-attention gets a zero bias
        if bias is None:
            bias = torch.zeros(1, a.num_heads, q.shape[2], k.shape[2], dtype=q.dtype, device=q.device)
        if causal:
            keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
            bias = torch.where(keep, bias, torch.finfo(bias.dtype).min)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.contiguous(), scale=1.0,
                                           dropout_p=self.p if self.training else 0.0)
        return attn.o(_merge(o))

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, enc: torch.Tensor | None = None):
        sa = _get(self, "layer.0.SelfAttention")
        if bias is None:  # first block of the stack computes the shared position bias
            s = x.shape[1]
            buckets = _relative_buckets(s, s, self.kind == "encoder", self.arch.relative_attention_buckets, x.device)
            bias = sa.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)
        decoder = self.kind == "decoder"
        x = x + _dropout(self._self_attn(x, bias), self.p, self.training)
        if decoder:
            n = _get(self, "layer.1.layer_norm")(x)
            cross = self._attend(_get(self, "layer.1.EncDecAttention"), n, enc, None, False)
            x = x + _dropout(cross, self.p, self.training)
        ff = _get(self, f"layer.{2 if decoder else 1}")
        n = ff.layer_norm(x)
        d = ff.DenseReluDense
        gated = hasattr(d, "wi_0")  # T5 v1.1 gated-gelu, else the original ReLU
        hidden = F.gelu(d.wi_0(n), approximate="tanh") * d.wi_1(n) if gated else F.relu(d.wi(n))
        x = x + _dropout(d.wo(_dropout(hidden, self.p, self.training)), self.p, self.training)
        return x, bias

    def _self_attn(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        n = _get(self, "layer.0.layer_norm")(x)
        return self._attend(_get(self, "layer.0.SelfAttention"), n, n, bias, self.kind == "decoder")


class T5Seq2Seq(nn.Module):
    def __init__(self, arch: Architecture, build: Builder, attn_impl: str, dropout: bool):
        super().__init__()
        self.shared = nn.Embedding(arch.vocab_size, arch.hidden_size, dtype=build.dtype)
        for stack, count in (("encoder", arch.num_layers), ("decoder", arch.num_decoder_layers)):
            module = nn.Module()
            module.block = nn.ModuleList(T5Block(arch, build, stack, i == 0, dropout) for i in range(count))
            module.final_layer_norm = T5Norm(arch.hidden_size, build.dtype)
            setattr(self, stack, module)
        if not arch.tie_word_embeddings:
            self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False, dtype=build.dtype)
        self.arch = arch
        self.p = arch.hidden_dropout if dropout else 0.0

    def blocks(self) -> list[nn.Module]:
        return [*self.encoder.block, *self.decoder.block]

    def _stack(self, stack: nn.Module, x: torch.Tensor, enc: torch.Tensor | None = None) -> torch.Tensor:
        x, bias = _dropout(x, self.p, self.training), None
        for block in stack.block:
            x, bias = block(x, bias, enc)
        return _dropout(stack.final_layer_norm(x), self.p, self.training)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        enc = self._stack(self.encoder, self.shared(batch["input_ids"]))
        out = self._stack(self.decoder, self.shared(batch["decoder_input_ids"]), enc)
        if self.arch.tie_word_embeddings:
            out = out * self.arch.hidden_size**-0.5
        head = self.shared.weight if self.arch.tie_word_embeddings else self.lm_head.weight
        return causal_lm_loss(F.linear(out, head), batch["labels"])


# ---- Llama / Mistral / Qwen2 ----------------------------------------------------------------------
class RMSNorm(nn.Module):
    """HF ``LlamaRMSNorm``: upcast to fp32, normalise, cast back, scale."""

    def __init__(self, hidden: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """HF ``repeat_kv``: materialises GQA keys/values at full head count."""
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


_ACTS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}


class Expert(nn.Module):
    """One gated MLP expert: ``down(act(gate(x)) * up(x))`` under the family's names."""

    def __init__(self, arch: Architecture, build: Builder):
        super().__init__()
        self.names = [lin.name for lin in arch.expert_linears()]
        for lin in arch.expert_linears():
            setattr(self, lin.name, build.linear(lin))
        self.act = _ACTS[arch.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(self.act(gate(x)) * up(x))


class MoE(nn.Module):
    """Router, top-k, dispatch, experts, weighted combine (the op sequence ``autograd_trace._moe`` replays).

    Hugging Face loops over experts with ``torch.where`` — data-dependent shapes that fake tensors cannot
    run. Here tokens are sorted by expert and cut into equal chunks: exact for balanced routing, the
    average case the analytic model assumes, with the same tensors saved for backward.
    """

    def __init__(self, arch: Architecture, build: Builder):
        super().__init__()
        self.gate = nn.Linear(arch.hidden_size, arch.num_experts, bias=False, dtype=build.dtype)
        self.experts = nn.ModuleList(Expert(arch, build) for _ in range(arch.num_experts))
        self.k, self.e = arch.experts_per_token, arch.num_experts

    def forward(self, n: torch.Tensor) -> torch.Tensor:
        b, s, h = n.shape
        flat = n.reshape(-1, h)
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(n.dtype)
        order = chosen.reshape(-1).argsort(stable=True)
        token_of = order // self.k
        chunks = flat.index_select(0, token_of).view(self.e, -1, h)
        ys = torch.cat([expert(chunks[i]) for i, expert in enumerate(self.experts)])
        ys = ys * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(flat).index_add(0, token_of, ys).view(b, s, h)


class LlamaBlock(nn.Module):
    """Llama-style decoder block, with the variants of the other decoders: Qwen2 q/k/v biases, Qwen3 and
    Gemma 3 q/k norms, Gemma sandwich norms and GeGLU, Phi-3 fused projections, MoE (Mixtral, Qwen-MoE)."""

    def __init__(self, arch: Architecture, build: Builder, attn_impl: str, dropout: bool, kind: str = "block"):
        super().__init__()
        if kind == "moe":
            _set(self, arch.moe_prefix, MoE(arch, build))
        _add_linears(self, arch.block_linears(kind), build)
        h, dt = arch.hidden_size, build.dtype
        self.input_layernorm = RMSNorm(h, dt)
        self.post_attention_layernorm = RMSNorm(h, dt)
        if arch.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(h, dt)
            self.post_feedforward_layernorm = RMSNorm(h, dt)
        if arch.qk_norm:
            self.self_attn.q_norm = RMSNorm(arch.head_dim, dt)
            self.self_attn.k_norm = RMSNorm(arch.head_dim, dt)
        self.arch, self.impl, self.kind = arch, attn_impl, kind
        self.act = _ACTS[arch.activation]
        self.p_attn = arch.attention_dropout if dropout else 0.0

    def _qkv(self, n: torch.Tensor):
        a, at = self.arch, self.self_attn
        b, s, _ = n.shape
        if a.fused_projections:
            q, k, v = at.qkv_proj(n).split([a.inner_size, a.kv_size, a.kv_size], dim=-1)
        else:
            q, k, v = at.q_proj(n), at.k_proj(n), at.v_proj(n)
        q, k = q.view(b, s, a.num_heads, a.head_dim), k.view(b, s, a.num_kv_heads, a.head_dim)
        if a.qk_norm:
            q, k = at.q_norm(q), at.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), _heads(v, a.num_kv_heads, a.head_dim)

    def _mlp(self, n: torch.Tensor) -> torch.Tensor:
        a = self.arch
        if self.kind == "moe":
            moe = _get(self, a.moe_prefix)
            out = moe(n)
            if a.shared_expert_size:
                sh = moe.shared_experts if a.moe_style == "deepseek" else moe.shared_expert
                shared = sh.down_proj(self.act(sh.gate_proj(n)) * sh.up_proj(n))
                if a.shared_expert_gate:
                    shared = shared * torch.sigmoid(moe.shared_expert_gate(n))
                out = out + shared
            return out
        if a.fused_projections:
            gate, up = self.mlp.gate_up_proj(n).chunk(2, dim=-1)
            return self.mlp.down_proj(self.act(gate) * up)
        return self.mlp.down_proj(self.act(self.mlp.gate_proj(n)) * self.mlp.up_proj(n))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a, at = self.arch, self.self_attn
        q, k, v = self._qkv(self.input_layernorm(x))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = a.num_heads // a.num_kv_heads
        o = attention(q, _repeat_kv(k, rep), _repeat_kv(v, rep), impl=self.impl, causal=True,
                      dropout=self.p_attn, training=self.training)
        attn = at.o_proj(_merge(o))
        if a.sandwich_norms:  # Gemma: post_attention_layernorm on the attention output
            x = x + self.post_attention_layernorm(attn)
            return x + self.post_feedforward_layernorm(self._mlp(self.pre_feedforward_layernorm(x)))
        x = x + attn
        return x + self._mlp(self.post_attention_layernorm(x))


class LlamaLM(nn.Module):
    def __init__(self, arch: Architecture, build: Builder, attn_impl: str, dropout: bool):
        super().__init__()
        m = nn.Module()
        m.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size, dtype=build.dtype)
        m.layers = nn.ModuleList(LlamaBlock(arch, build, attn_impl, dropout, kind) for _, kind in arch.blocks())
        m.norm = RMSNorm(arch.hidden_size, build.dtype)
        self.model = m
        if not arch.tie_word_embeddings:
            self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False, dtype=build.dtype)
        self.arch = arch

    def blocks(self) -> list[nn.Module]:
        return list(self.model.layers)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        x = self.model.embed_tokens(ids)
        d = self.arch.head_dim
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=ids.device, dtype=torch.float32) / d))
        freqs = torch.arange(ids.shape[1], device=ids.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[None, None], emb.sin().to(x.dtype)[None, None]
        for block in self.model.layers:
            x = block(x, cos, sin)
        head = self.model.embed_tokens.weight if self.arch.tie_word_embeddings else self.lm_head.weight
        logits = F.linear(self.model.norm(x), head)
        if self.arch.final_logit_softcap:  # Gemma 2: tanh(logits / 30) * 30
            logits = torch.tanh(logits / 30.0) * 30.0
        return causal_lm_loss(logits, batch["labels"])


FAMILIES = {"gpt2": GPT2LM, "bert": BertClassifier, "t5": T5Seq2Seq, "llama": LlamaLM}


def build_model(arch: Architecture, *, dtype: str = "fp32", lora_rank: int | None = None,
                lora_targets: list[str] | None = None, adapter_dtype: str = "fp32", attention_impl: str = "sdpa",
                dropout: bool = True) -> nn.Module:
    """The model with parameters in ``dtype``; build it under ``torch.device("meta")`` to allocate nothing."""
    targets = {lin.name for _, lin in arch.lora_linears(lora_targets)} if lora_rank and lora_targets else set()
    build = Builder(DTYPES[dtype], lora_rank, targets, DTYPES[adapter_dtype])
    return build.finish(FAMILIES[arch.family](arch, build, attention_impl, dropout))


def example_batch(arch: Architecture, micro_batch: int, seq_len: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Token ids and labels of the right shapes (values are irrelevant to memory)."""
    ids = torch.zeros(micro_batch, seq_len, dtype=torch.long, device=device)
    if arch.family == "bert":
        return {"input_ids": ids, "class_labels": torch.zeros(micro_batch, dtype=torch.long, device=device)}
    if arch.family == "t5":
        return {"input_ids": ids, "decoder_input_ids": ids.clone(), "labels": ids.clone()}
    return {"input_ids": ids, "labels": ids.clone()}
