"""Activation memory from first principles: what autograd saves for each op of a transformer block.

Instead of one fitted coefficient per model ("34·sbh"), the block is replayed symbolically, op by op,
with PyTorch's backward-formula rules (``derivatives.yaml``): a linear saves its input when its weight
trains and its weight when its input needs a gradient; LayerNorm saves input, mean and rstd; GELU and
SiLU save their input, ReLU and softmax their output; an elementwise product saves each operand the
other's gradient needs; adds, views, slices and casts save nothing; flash/memory-efficient SDPA saves
q, k, v, the output and an fp32 logsumexp. Tensors are deduplicated by identity, so a tensor saved by
three ops counts once, exactly as the CUDA caching allocator sees it.

The same rules give LoRA for free (frozen linears save no input; nothing upstream of the first adapter
in layer 0 saves anything), dtype effects (fp32 upcasts in RMSNorm, softmax and the loss; autocast's
cached low-precision weight copies) and checkpointing (one block's saved set, recomputed). The op
sequences mirror ``torch_models`` (and the Hugging Face code it follows); measured mode checks them
independently with torch's own tracker. Pure Python: no torch import.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from .architecture import Architecture, Linear

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int64": 8, "bool": 1}


@dataclass(eq=False)
class Sym:
    """A symbolic tensor: element count, dtype, whether autograd tracks it, and what it is."""

    numel: int
    dtype: str
    rg: bool
    kind: str = "act"
    """act (activation), param, param_copy (autocast's cached low-precision weight) or const."""
    serial: int = field(default_factory=itertools.count().__next__)
    """Identity for deduplication (``id()`` is reused once a symbol is garbage collected)."""

    @property
    def nbytes(self) -> int:
        return self.numel * BYTES[self.dtype]


@dataclass(frozen=True)
class Numerics:
    """How a step computes: the dtype ops run in and where casts happen."""

    param_dtype: str
    """dtype of the parameters the ops see (fp32, or bf16/fp16 for pure and FSDP mixed precision)."""
    half: str = "bf16"
    autocast: bool = False
    """torch.autocast over fp32 parameters (DDP / single GPU mixed precision)."""
    adapter_dtype: str = "fp32"
    """dtype of LoRA adapter weights (PEFT keeps them in fp32 by default)."""
    dropout_mask_bytes: int = 1
    """Bytes saved per element by dropout: CUDA keeps a 1-byte mask; CPU saves a dtype-sized tensor (0 = use dtype)."""
    dropout: bool = True
    attention: str = "sdpa"


@dataclass
class Trace:
    """Records the tensors autograd saves while the ops of one region run."""

    num: Numerics
    lora_rank: int = 0
    lora_targets: frozenset[str] = frozenset()
    frozen_base: bool = False
    """LoRA: every base parameter is frozen; only adapters train."""
    owners: dict[int, int] = field(default_factory=dict)
    """Shared across the traces of one forward: a tensor saved by several regions counts once."""
    saved: dict[int, Sym] = field(default_factory=dict)
    largest_act: int = 0
    _cast_cache: dict[int, Sym] = field(default_factory=dict)
    serial: int = field(default_factory=itertools.count().__next__)

    @property
    def trains(self) -> bool:
        return not self.frozen_base

    # ---- bookkeeping ----------------------------------------------------------------------------
    def new(self, numel: int, dtype: str, rg: bool, kind: str = "act") -> Sym:
        t = Sym(numel, dtype, rg, kind)
        if kind == "act":
            self.largest_act = max(self.largest_act, t.nbytes)
        return t

    def save(self, *tensors: Sym) -> None:
        for t in tensors:
            if t.kind == "param":  # parameters are counted as model states, not activations
                continue
            if self.owners.setdefault(t.serial, self.serial) == self.serial:
                self.saved[t.serial] = t

    def saved_bytes(self, kind: str | None = None) -> int:
        return sum(t.nbytes for t in self.saved.values() if kind is None or t.kind == kind)

    def param(self, numel: int, trainable: bool, dtype: str | None = None) -> Sym:
        return Sym(numel, dtype or self.num.param_dtype, trainable, "param")

    @property
    def compute(self) -> str:
        return self.num.half if self.num.autocast else self.num.param_dtype

    # ---- casts --------------------------------------------------------------------------------------
    def to(self, x: Sym, dtype: str) -> Sym:
        """``x.to(dtype)``: a new tensor when the dtype changes; saves nothing."""
        return x if x.dtype == dtype else self.new(x.numel, dtype, x.rg)

    def autocast_in(self, x: Sym) -> Sym:
        """autocast casts the inputs of low-precision ops (linear, matmul, SDPA); weights are cached."""
        if not self.num.autocast or x.dtype == self.num.half:
            return x
        if x.kind == "param":
            if x.serial not in self._cast_cache:
                self._cast_cache[x.serial] = Sym(x.numel, self.num.half, x.rg, "param_copy")
            return self._cast_cache[x.serial]
        return self.new(x.numel, self.num.half, x.rg)

    # ---- ops ------------------------------------------------------------------------------------------
    def linear(self, x: Sym, lin: Linear, tokens: int) -> Sym:
        """``F.linear``, or PEFT's LoRA linear when ``lin`` is a target."""
        lora = bool(self.lora_rank) and lin.name in self.lora_targets
        w = self.param(lin.in_features * lin.out_features, self.trains)
        out = self._matmul_linear(x, w, tokens * lin.out_features)
        if not lora:
            return out
        adapter_in = x
        if not self.num.autocast and x.dtype != self.num.adapter_dtype:
            adapter_in = self.to(x, self.num.adapter_dtype)
        a = self.param(lin.in_features * self.lora_rank, True, self.num.adapter_dtype)
        b = self.param(self.lora_rank * lin.out_features, True, self.num.adapter_dtype)
        mid = self._matmul_linear(adapter_in, a, tokens * self.lora_rank)
        delta = self._matmul_linear(mid, b, tokens * lin.out_features)
        result = self.new(out.numel, _promote(out.dtype, delta.dtype), True)
        return self.to(result, out.dtype)

    def _matmul_linear(self, x: Sym, w: Sym, out_numel: int) -> Sym:
        xc, wc = self.autocast_in(x), self.autocast_in(w)
        if w.rg:
            self.save(xc)
        if xc.rg:
            self.save(wc)
        return self.new(out_numel, xc.dtype if self.num.autocast else _promote(x.dtype, w.dtype), x.rg or w.rg)

    def layernorm(self, x: Sym, rows: int) -> Sym:
        """``native_layer_norm`` saves input, mean and rstd (autocast runs it in fp32)."""
        xin = self.to(x, "fp32") if self.num.autocast else x
        rg = x.rg or self.trains
        if rg:
            self.save(xin, self.new(rows, "fp32", True), self.new(rows, "fp32", True))
        return self.new(x.numel, xin.dtype, rg)

    def rmsnorm_llama(self, x: Sym, rows: int) -> Sym:
        """HF ``LlamaRMSNorm``: x.float(); x * rsqrt(x.pow(2).mean() + eps); weight * x.to(dtype)."""
        x32 = self.to(x, "fp32")
        rstd = self.new(rows, "fp32", x.rg)
        if x.rg:
            self.save(x32, rstd)  # pow saves x32; rsqrt saves its output; the product saves both
        normed = self.new(x.numel, "fp32", x.rg)
        cast = self.to(normed, x.dtype)
        if self.trains:
            self.save(cast)
        return self.new(x.numel, _promote(cast.dtype, self.num.param_dtype), x.rg or self.trains)

    def rmsnorm_t5(self, x: Sym, rows: int) -> Sym:
        """HF ``T5LayerNorm``: fp32 variance, ``x * rsqrt`` (promotes to fp32), cast to half weights."""
        x32 = self.to(x, "fp32")
        rstd = self.new(rows, "fp32", x.rg)
        if x.rg:
            self.save(x32, x, rstd)
        normed = self.new(x.numel, "fp32", x.rg)
        if self.num.param_dtype != "fp32":
            normed = self.to(normed, self.num.param_dtype)
        if self.trains:
            self.save(normed)
        return self.new(x.numel, _promote(normed.dtype, self.num.param_dtype), x.rg or self.trains)

    def unary(self, x: Sym, saves: str) -> Sym:
        """Elementwise activation: ``saves`` is ``input`` (GELU, SiLU) or ``output`` (ReLU, tanh)."""
        out = self.new(x.numel, x.dtype, x.rg)
        if x.rg:
            self.save(x if saves == "input" else out)
        return out

    def mul(self, a: Sym, b: Sym) -> Sym:
        if a.rg:
            self.save(b)
        if b.rg:
            self.save(a)
        return self.new(max(a.numel, b.numel), _promote(a.dtype, b.dtype), a.rg or b.rg)

    def add(self, a: Sym, b: Sym) -> Sym:
        return self.new(max(a.numel, b.numel), _promote(a.dtype, b.dtype), a.rg or b.rg)

    def dropout(self, x: Sym, p: float) -> Sym:
        if p <= 0 or not self.num.dropout:
            return x
        out = self.new(x.numel, x.dtype, x.rg)
        if x.rg:
            per = self.num.dropout_mask_bytes or BYTES[x.dtype]
            self.save(Sym(x.numel * per, "bool", True))
        return out

    def copy(self, x: Sym) -> Sym:
        """A materialising reshape/contiguous/expand copy: new storage, nothing saved."""
        return self.new(x.numel, x.dtype, x.rg)

    def sdpa(self, q: Sym, k: Sym, v: Sym, out_numel: int, query_rows: int) -> Sym:
        """Flash / memory-efficient SDPA saves q, k, v, out and an fp32 logsumexp per query row.
        Attention-probability dropout is regenerated from the RNG seed, so no mask is kept."""
        q, k, v = self.autocast_in(q), self.autocast_in(k), self.autocast_in(v)
        rg = q.rg or k.rg or v.rg
        out = self.new(out_numel, q.dtype, rg)
        if rg:
            self.save(q, k, v, out, self.new(query_rows, "fp32", True))
        return out

    def eager_attention(self, q: Sym, k: Sym, v: Sym, out_numel: int, scores_numel: int, mask_numel: int,
                        dropout: float, bias: Sym | None = None) -> Sym:
        """Math attention as HF's eager path: q @ kᵀ (+bias, causal mask), fp32 softmax, cast, dropout, @ v."""
        qc, kc, vc = self.autocast_in(q), self.autocast_in(k), self.autocast_in(v)
        if qc.rg or kc.rg:
            self.save(qc, kc)
        scores = self.new(scores_numel, qc.dtype, qc.rg or kc.rg)
        if bias is not None:
            scores = self.add(scores, bias)
        if mask_numel:  # masked_fill keeps its boolean mask
            mask = Sym(mask_numel, "bool", False, "const")
            scores = self.new(scores.numel, scores.dtype, scores.rg)
            if scores.rg:
                self.save(mask)
        probs32 = self.new(scores_numel, "fp32", scores.rg)
        if scores.rg:
            self.save(probs32)
        probs = self.dropout(self.to(probs32, qc.dtype), dropout)
        if probs.rg:
            self.save(vc)
        if vc.rg:
            self.save(probs)
        return self.new(out_numel, qc.dtype, probs.rg or vc.rg)


def _promote(a: str, b: str) -> str:
    if "fp32" in (a, b):
        return "fp32"
    return a


# ---- blocks ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    batch: int
    seq: int


def _lin(arch: Architecture, kind: str) -> dict[str, Linear]:
    return {lin.name: lin for lin in arch.block_linears(kind)}


def gpt2_block(tr: Trace, arch: Architecture, x: Sym, sh: Shape) -> Sym:
    tokens, h = sh.batch * sh.seq, arch.hidden_size
    lin = _lin(arch, "block")
    qkv = tr.linear(tr.layernorm(x, tokens), lin["attn.c_attn"], tokens)
    third = tokens * h
    q, k, v = (Sym(third, qkv.dtype, qkv.rg, qkv.kind) for _ in range(3))
    if qkv.rg:  # q, k and v are views of one qkv storage: saving any keeps all of it
        q = k = v = qkv
    o = _attend(tr, arch, q, k, v, sh, causal=True, dropout=arch.attention_dropout)
    x = tr.add(x, tr.dropout(tr.linear(o, lin["attn.c_proj"], tokens), arch.hidden_dropout))
    f = tr.linear(tr.layernorm(x, tokens), lin["mlp.c_fc"], tokens)
    m = tr.linear(tr.unary(f, "input"), lin["mlp.c_proj"], tokens)
    return tr.add(x, tr.dropout(m, arch.hidden_dropout))


def _attend(tr: Trace, arch: Architecture, q: Sym, k: Sym, v: Sym, sh: Shape, causal: bool, dropout: float) -> Sym:
    rows = sh.batch * arch.num_heads * sh.seq
    out_numel = sh.batch * sh.seq * arch.inner_size
    if tr.num.attention == "eager":
        out = tr.eager_attention(q, k, v, out_numel, rows * sh.seq, sh.seq * sh.seq if causal else 0, dropout)
        return tr.copy(out)  # (b, a, s, d) → (b, s, a·d) is a transpose: reshape copies
    return tr.sdpa(q, k, v, out_numel, rows)


def bert_block(tr: Trace, arch: Architecture, x: Sym, sh: Shape) -> Sym:
    tokens = sh.batch * sh.seq
    lin = _lin(arch, "block")
    q, k, v = (tr.linear(x, lin[f"attention.self.{n}"], tokens) for n in ("query", "key", "value"))
    o = _attend(tr, arch, q, k, v, sh, causal=False, dropout=arch.attention_dropout)
    a = tr.dropout(tr.linear(o, lin["attention.output.dense"], tokens), arch.hidden_dropout)
    x = tr.layernorm(tr.add(a, x), tokens)
    i = tr.unary(tr.linear(x, lin["intermediate.dense"], tokens), "input")
    m = tr.dropout(tr.linear(i, lin["output.dense"], tokens), arch.hidden_dropout)
    return tr.layernorm(tr.add(m, x), tokens)


@dataclass(frozen=True)
class Routing:
    """How routed experts see tokens: ``capacity_factor`` None = dropless (every top-k choice runs);
    a number = GShard/Switch-style fixed buffers of ceil(cf · tokens · k / E) rows per expert, padded or
    dropping. ``ep`` > 1 adds the all-to-all dispatch and combine buffers (backward temporaries)."""

    capacity_factor: float | None = None
    ep: int = 1

    def rows(self, arch: Architecture, tokens: int) -> int:
        """Token-expert rows that run through the routed experts on one rank (balanced routing)."""
        k, e = arch.experts_per_token, arch.num_experts
        if self.capacity_factor is None:
            return tokens * k
        return e * math.ceil(self.capacity_factor * tokens * k / e)


def _gated_mlp(tr: Trace, n: Sym, lins: list[Linear], tokens: int) -> Sym:
    """SwiGLU / GeGLU: down(act(gate(n)) * up(n)); a fused gate_up is one linear whose halves are views."""
    if len(lins) == 2:  # Phi-3 gate_up_proj: act saves the gate half, mul the up half (views of one output)
        gate_up = tr.linear(n, lins[0], tokens)
        act = tr.new(gate_up.numel // 2, gate_up.dtype, gate_up.rg)
        if gate_up.rg:
            tr.save(gate_up, act)
        return tr.linear(tr.new(act.numel, act.dtype, act.rg), lins[1], tokens)
    gate = tr.unary(tr.linear(n, lins[0], tokens), "input")
    up = tr.linear(n, lins[1], tokens)
    return tr.linear(tr.mul(gate, up), lins[2], tokens)


def _moe(tr: Trace, arch: Architecture, n: Sym, tokens: int, routing: Routing, shared: list[Linear]) -> Sym:
    """Router, top-k, static dispatch to the experts, weighted combine (mirrors ``torch_models.MoE``)."""
    e, k, i = arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size
    rows = routing.rows(arch, tokens)
    logits = tr.linear(n, Linear("router", arch.hidden_size, e, arch.moe_style == "gpt_oss"), tokens)
    probs = tr.new(tokens * e, "fp32", logits.rg)  # softmax(logits, dtype=float32) keeps its fp32 output
    if logits.rg:
        tr.save(probs)
    tr.save(Sym(tokens * k, "int64", False, "const"))  # topk keeps the chosen indices
    weights = tr.new(tokens * k, "fp32", probs.rg)
    if weights.rg:  # top-k weights renormalised to sum to 1: the division keeps both operands
        tr.save(weights, tr.new(tokens, "fp32", True))
    weights = tr.new(tokens * k, "fp32", weights.rg)
    weights = tr.to(weights, n.dtype)
    order = Sym(tokens * k, "int64", False, "const")
    token_of = Sym(rows, "int64", False, "const")
    tr.save(order, token_of)  # the gather of the routing weights and index_select/index_add keep indices
    xs = tr.new(rows * arch.hidden_size, n.dtype, n.rg)  # one dispatch buffer; each expert's input is a view
    expert = [Linear("gate", arch.hidden_size, i, False), Linear("up", arch.hidden_size, i, False),
              Linear("down", i, arch.hidden_size, False)]
    ys = _gated_mlp(tr, xs, expert, rows)
    ws = tr.new(rows, weights.dtype, weights.rg)
    out = tr.mul(ys, ws)
    if out.rg:  # index_add's backward formula expands to the source's shape: autograd keeps the source
        tr.save(out)
    combined = tr.new(tokens * arch.hidden_size, out.dtype, out.rg)
    if shared:
        gated = [lin for lin in shared if lin.name.endswith("shared_expert_gate")]
        s_out = _gated_mlp(tr, n, [lin for lin in shared if lin not in gated], tokens)
        if gated:
            sig = tr.unary(tr.linear(n, gated[0], tokens), "output")
            s_out = tr.mul(s_out, sig)
        combined = tr.add(combined, s_out)
    return combined


def _mla(tr: Trace, arch: Architecture, n: Sym, sh: Shape, lin: dict[str, Linear]) -> Sym:
    """DeepSeek multi-head latent attention: low-rank q and kv, RMSNorm on the latents, split rope part."""
    tokens, a = sh.batch * sh.seq, arch.num_heads
    if arch.q_lora_rank:
        q = tr.linear(tr.rmsnorm_llama(tr.linear(n, lin["self_attn.q_a_proj"], tokens), tokens),
                      lin["self_attn.q_b_proj"], tokens)
    else:
        q = tr.linear(n, lin["self_attn.q_proj"], tokens)
    ckv = tr.linear(n, lin["self_attn.kv_a_proj_with_mqa"], tokens)
    latent = tr.rmsnorm_llama(tr.new(tokens * arch.kv_lora_rank, ckv.dtype, ckv.rg), tokens)
    kv = tr.linear(latent, lin["self_attn.kv_b_proj"], tokens)
    rope = Sym(sh.seq * arch.qk_rope_head_dim, q.dtype, False, "const")
    q_pe = tr.add(tr.mul(tr.new(tokens * a * arch.qk_rope_head_dim, q.dtype, q.rg), rope),
                  tr.mul(tr.new(tokens * a * arch.qk_rope_head_dim, q.dtype, q.rg), rope))
    k_pe = tr.add(tr.mul(tr.new(tokens * arch.qk_rope_head_dim, ckv.dtype, ckv.rg), rope),
                  tr.mul(tr.new(tokens * arch.qk_rope_head_dim, ckv.dtype, ckv.rg), rope))
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    q_full = tr.new(tokens * a * qk, q.dtype, q.rg or q_pe.rg)  # cat(q_nope, q_pe) copies
    k_full = tr.new(tokens * a * qk, kv.dtype, kv.rg or k_pe.rg)  # cat(k_nope, k_pe expanded)
    v = tr.copy(tr.new(tokens * a * arch.v_head_dim, kv.dtype, kv.rg))
    rows = sh.batch * a * sh.seq
    o = tr.sdpa(q_full, k_full, v, tokens * a * arch.v_head_dim, rows)
    return tr.linear(o, lin["self_attn.o_proj"], tokens)


def llama_block(tr: Trace, arch: Architecture, x: Sym, sh: Shape, rope: Sym, kind: str = "block",
                routing: Routing | None = None) -> Sym:
    tokens = sh.batch * sh.seq
    lin = _lin(arch, kind)
    n = tr.rmsnorm_llama(x, tokens)
    if arch.kv_lora_rank:
        attn_out = _mla(tr, arch, n, sh, lin)
    else:
        if arch.fused_projections:  # one qkv output; q, k, v are views (rope makes new q and k)
            qkv = tr.linear(n, lin["self_attn.qkv_proj"], tokens)
            q = tr.new(tokens * arch.inner_size, qkv.dtype, qkv.rg)
            k = tr.new(tokens * arch.kv_size, qkv.dtype, qkv.rg)
            v = qkv
        else:
            q = tr.linear(n, lin["self_attn.q_proj"], tokens)
            k = tr.linear(n, lin["self_attn.k_proj"], tokens)
            v = tr.linear(n, lin["self_attn.v_proj"], tokens)
        if arch.qk_norm:  # RMSNorm over head_dim on q and k
            q = tr.rmsnorm_llama(q, tokens * arch.num_heads)
            k = tr.rmsnorm_llama(k, tokens * arch.num_kv_heads)
        q = tr.add(tr.mul(q, rope), tr.mul(tr.copy(q), rope))  # q·cos + rotate_half(q)·sin (cat copies)
        k = tr.add(tr.mul(k, rope), tr.mul(tr.copy(k), rope))
        if arch.num_kv_heads != arch.num_heads:  # repeat_kv materialises full-width keys and values
            rep = arch.num_heads // arch.num_kv_heads
            k = tr.new(k.numel * rep, k.dtype, k.rg)
            v = tr.new(tokens * arch.inner_size, v.dtype, v.rg)
        o = _attend(tr, arch, q, k, v, sh, causal=True, dropout=arch.attention_dropout)
        attn_out = tr.linear(o, lin["self_attn.o_proj"], tokens)
    if arch.sandwich_norms:
        attn_out = tr.rmsnorm_llama(attn_out, tokens)
    x = tr.add(x, attn_out)
    n = tr.rmsnorm_llama(x, tokens)
    if kind == "moe":
        shared = arch.block_linears("moe")[len(arch._attention_linears()):]
        m = _moe(tr, arch, n, tokens, routing or Routing(), shared)
    else:
        m = _gated_mlp(tr, n, arch.block_linears("block")[len(arch._attention_linears()):], tokens)
    if arch.sandwich_norms:
        m = tr.rmsnorm_llama(m, tokens)
    return tr.add(x, m)


def t5_block(tr: Trace, arch: Architecture, kind: str, x: Sym, sh: Shape, bias: Sym, enc: Sym | None) -> Sym:
    tokens = sh.batch * sh.seq
    lin = _lin(arch, kind)
    p = arch.hidden_dropout

    def attention(prefix: str, src: Sym, kv_src: Sym, causal: bool, b: Sym | None) -> Sym:
        q = tr.linear(src, lin[f"{prefix}.q"], tokens)
        k = tr.linear(kv_src, lin[f"{prefix}.k"], tokens)
        v = tr.linear(kv_src, lin[f"{prefix}.v"], tokens)
        rows = sh.batch * arch.num_heads * sh.seq
        o = tr.copy(tr.eager_attention(q, k, v, tokens * arch.inner_size, rows * sh.seq,
                                       sh.seq * sh.seq if causal else 0, p, bias=b))
        return tr.linear(o, lin[f"{prefix}.o"], tokens)

    n = tr.rmsnorm_t5(x, tokens)
    x = tr.add(x, tr.dropout(attention("layer.0.SelfAttention", n, n, kind == "decoder", bias), p))
    if kind == "decoder":
        n = tr.rmsnorm_t5(x, tokens)
        x = tr.add(x, tr.dropout(attention("layer.1.EncDecAttention", n, enc, False, None), p))
    ff = "layer.2" if kind == "decoder" else "layer.1"
    n = tr.rmsnorm_t5(x, tokens)
    if arch.activation == "gelu_gated":
        hidden = tr.mul(tr.unary(tr.linear(n, lin[f"{ff}.DenseReluDense.wi_0"], tokens), "input"),
                        tr.linear(n, lin[f"{ff}.DenseReluDense.wi_1"], tokens))
    else:
        hidden = tr.unary(tr.linear(n, lin[f"{ff}.DenseReluDense.wi"], tokens), "output")
    out = tr.linear(tr.dropout(hidden, p), lin[f"{ff}.DenseReluDense.wo"], tokens)
    return tr.add(x, tr.dropout(out, p))


# ---- whole model ------------------------------------------------------------------------------------
@dataclass
class ActivationProfile:
    """Saved bytes of one forward, split the way the peak timeline needs them."""

    per_block: list[int]
    """Activations saved by each block (forward order)."""
    block_param_copies: list[int]
    """autocast's low-precision weight copies saved by each block (working set, not activations)."""
    root_saved: int
    """Saved outside the blocks: embeddings, final norm, the head's input (not the loss)."""
    root_saved_before_head: int
    """The part of ``root_saved`` on the embedding side (alive until the end of backward)."""
    root_param_copies: int
    loss_saved: int
    """What the loss keeps: the fp32 log-softmax of the logits."""
    loss_backward_extra: int
    """Extra at the start of backward: grad of the log-softmax output and its input (fp32 each)."""
    logits_bytes: int
    """The logits tensor itself (compute dtype), alive while the loss is computed."""
    block_inputs: list[int]
    """Bytes of each block's input (what full activation checkpointing keeps per block)."""
    block_backward_temp: list[int]
    """Gradient temporaries while a block runs backward: about two of its largest activations."""
    root_largest: int = 0


def profile(arch: Architecture, num: Numerics, shape: Shape, lora_rank: int = 0,
            lora_targets: frozenset[str] = frozenset(), routing: Routing | None = None) -> ActivationProfile:
    """Replay one forward symbolically and collect saved bytes per block and outside the blocks.

    With ``lora_rank`` every base parameter is frozen and only the adapters on ``lora_targets`` train.
    """
    frozen = bool(lora_rank)
    owners: dict[int, int] = {}

    def trace() -> Trace:
        return Trace(num, lora_rank, lora_targets, frozen_base=frozen, owners=owners)

    tokens, h = shape.batch * shape.seq, arch.hidden_size
    root = trace()
    embed_dtype = num.param_dtype  # embedding lookups are not autocast ops: they keep the weight dtype
    x = root.new(tokens * h, embed_dtype, root.trains)
    if arch.family in ("gpt2", "bert"):
        for _ in range(2 if arch.family == "bert" else 1):  # position (+ token type) embeddings, summed
            x = root.add(x, root.new(tokens * h, embed_dtype, root.trains))
        if arch.family == "bert":
            x = root.layernorm(x, tokens)
    x = root.dropout(x, arch.hidden_dropout)
    rope = Sym(shape.seq * arch.head_dim, x.dtype, False, "const")
    per_block: list[int] = []
    copies: list[int] = []
    inputs: list[int] = []
    temps: list[int] = []
    enc_out: Sym | None = None
    bias: Sym | None = None
    for _prefix, kind in arch.blocks():
        if kind == "decoder" and enc_out is None:  # T5: close the encoder, embed the decoder input
            enc_out = root.dropout(root.rmsnorm_t5(x, tokens), arch.hidden_dropout)
            x = root.dropout(root.new(tokens * h, embed_dtype, root.trains), arch.hidden_dropout)
            bias = None
        if arch.family == "t5" and bias is None:  # first block of a stack: relative position bias
            bias = root.new(arch.num_heads * shape.seq * shape.seq, num.param_dtype, root.trains)
            if root.trains:  # the bias embedding keeps its (s × s) int64 bucket ids
                root.save(Sym(shape.seq * shape.seq, "int64", False, "const"))
        tr = trace()
        inputs.append(x.nbytes)
        if arch.family == "gpt2":
            x = gpt2_block(tr, arch, x, shape)
        elif arch.family == "bert":
            x = bert_block(tr, arch, x, shape)
        elif arch.family == "llama":
            x = llama_block(tr, arch, x, shape, rope, kind, routing)
            if kind == "moe" and routing is not None and routing.ep > 1:  # all-to-all send + receive buffers
                rows = routing.rows(arch, shape.batch * shape.seq)
                tr.largest_act = max(tr.largest_act, rows * arch.hidden_size * BYTES[x.dtype])
        else:
            x = t5_block(tr, arch, kind, x, shape, bias, enc_out)
        per_block.append(tr.saved_bytes("act") + tr.saved_bytes("const"))
        copies.append(tr.saved_bytes("param_copy"))
        temps.append(2 * tr.largest_act)
    # Final norm, head and loss (freed as soon as backward has passed them).
    before_head = root.saved_bytes("act") + root.saved_bytes("const")
    if arch.family == "gpt2":
        x = root.layernorm(x, tokens)
    elif arch.family == "llama":
        x = root.rmsnorm_llama(x, tokens)
    elif arch.family == "t5":
        x = root.dropout(root.rmsnorm_t5(x, tokens), arch.hidden_dropout)
        if arch.tie_word_embeddings:  # sequence_output * d_model ** -0.5: a scalar product saves nothing
            x = root.new(x.numel, x.dtype, x.rg)
    if arch.family == "bert":
        if root.trains:  # the pooler reads x[:, 0], a view: saving it keeps the whole last hidden state
            root.save(root.autocast_in(x))
        pooled = root.unary(root.new(shape.batch * h, root.compute, True), "output")  # tanh(dense(x[:, 0]))
        logits = root.linear(root.dropout(pooled, arch.hidden_dropout), Linear("classifier", h, arch.num_labels,
                                                                                True), shape.batch)
        rows, vocab = shape.batch, arch.num_labels
    else:
        logits = root.linear(x, Linear("lm_head", h, arch.vocab_size, False), tokens)
        if arch.final_logit_softcap:  # Gemma 2: tanh(logits / cap) * cap — tanh keeps its output
            logits = root.unary(logits, "output")
        rows, vocab = tokens, arch.vocab_size
    logits32 = rows * vocab * 4  # loss = cross_entropy(logits.float()): log_softmax keeps an fp32 copy
    return ActivationProfile(
        per_block=per_block, block_param_copies=copies,
        root_saved=root.saved_bytes("act") + root.saved_bytes("const"), root_saved_before_head=before_head,
        root_param_copies=root.saved_bytes("param_copy"), loss_saved=logits32, loss_backward_extra=2 * logits32,
        logits_bytes=logits.nbytes, block_inputs=inputs, block_backward_temp=temps, root_largest=root.largest_act)
