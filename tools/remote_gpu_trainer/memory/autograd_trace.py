"""Activation memory from first principles: what autograd saves for each op of a Hugging Face block.

Instead of one fitted coefficient per model ("34·sbh"), each block is replayed symbolically, op by op,
in the order the Hugging Face class runs them (transformers 5.x modeling files), with PyTorch's
backward-formula rules (``derivatives.yaml``): a linear saves its input when its weight trains and its
weight when its input needs a gradient; LayerNorm saves input, mean and rstd; GELU and SiLU save their
input, ReLU, tanh and softmax their output; an elementwise product saves each operand the other's
gradient needs; adds, views, slices and casts save nothing. Tensors are deduplicated by identity, so a
tensor saved by three ops counts once, exactly as the CUDA caching allocator sees it.

What the real classes keep, beyond a textbook block (each checked against the class on fake tensors):

* **Attention kernel** (``attention_kernels``): flash/cuDNN and memory-efficient SDPA keep q, k, v,
  the output and an fp32 logsumexp (memory-efficient also its additive mask); the math fallback —
  every fp32 grouped-query model — keeps the fp32 (b × heads × s × s) softmax and, with dropout, a
  1-byte mask and the dropped probabilities; its output is copied by Hugging Face's
  ``transpose(1, 2).contiguous()``, the fused kernels' is not (they write (b, s, heads, d)).
* **GPT-2's ``gelu_new``** is a Python composite: ``pow`` keeps its input, ``tanh`` its output and
  the final product both factors — four 4h-wide tensors where ``F.gelu`` keeps one.
* **Dtypes**: RMSNorm's fp32 upcast; RoPE's cos/sin in the residual stream's dtype (fp32 under
  autocast, so q and k leave RoPE in fp32 and SDPA casts them back); CUDA autocast's fp32 ops
  (``pow``, ``layer_norm``); PEFT casting LoRA inputs to the adapter dtype.
* **Dropout** on CUDA keeps a 1-byte mask (``native_dropout``).

The same rules give LoRA (frozen linears save no input), checkpointing (one block's saved set,
recomputed) and autocast's cached low-precision weight copies. Measured mode checks them independently
with torch's tracker on the real classes. Pure Python: no torch import.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from .architecture import Architecture, Linear
from .attention_kernels import SdpaCall, cuda_sdpa_kernel, efficient_lse_rows, hf_sdpa_heads

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int64": 8, "bool": 1}
HALF = ("bf16", "fp16")


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
    """Bytes saved per element by dropout: CUDA keeps a 1-byte mask (0 = a tensor of the input's dtype)."""
    dropout: bool = True
    attention: str = "sdpa"


@dataclass(frozen=True)
class Attn:
    """One attention call: shapes, masking and dropout as the model passes them."""

    batch: int
    seq_q: int
    seq_k: int
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    causal: bool
    mask: bool = False
    """An explicit mask reaches SDPA (sliding window shorter than the sequence, T5's position bias)."""
    dropout: float = 0.0
    bias: Sym | None = None
    """T5: the float position-bias mask this layer passes (made per layer, requires grad)."""


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

    # ---- casts --------------------------------------------------------------------------------------
    def to(self, x: Sym, dtype: str) -> Sym:
        """``x.to(dtype)``: a new tensor when the dtype changes; saves nothing."""
        return x if x.dtype == dtype else self.new(x.numel, dtype, x.rg)

    def autocast_in(self, x: Sym) -> Sym:
        """autocast casts the inputs of low-precision ops (linear, matmul, SDPA); weights are cached."""
        if not self.num.autocast or x.dtype != "fp32":
            return x
        if x.kind == "param":
            if x.serial not in self._cast_cache:
                self._cast_cache[x.serial] = Sym(x.numel, self.num.half, x.rg, "param_copy")
            return self._cast_cache[x.serial]
        return self.new(x.numel, self.num.half, x.rg)

    def fp32_op_in(self, x: Sym) -> Sym:
        """CUDA autocast runs ``pow``, ``rsqrt``, ``layer_norm``… in fp32: a 16-bit input is cast up."""
        return self.to(x, "fp32") if self.num.autocast and x.dtype in HALF else x

    # ---- ops ------------------------------------------------------------------------------------------
    def linear(self, x: Sym, lin: Linear, tokens: int) -> Sym:
        """``F.linear``, or PEFT's LoRA linear when ``lin`` is a target: base(x) + B(A(x.to(adapter))) · s."""
        lora = bool(self.lora_rank) and lin.name in self.lora_targets
        w = self.param(lin.in_features * lin.out_features, self.trains)
        out = self._matmul(x, w, tokens * lin.out_features)
        if not lora:
            return out
        a = self.param(lin.in_features * self.lora_rank, True, self.num.adapter_dtype)
        b = self.param(self.lora_rank * lin.out_features, True, self.num.adapter_dtype)
        adapter_in = self.to(x, self.num.adapter_dtype)
        if self.num.autocast and adapter_in is x and x.dtype != "fp32":
            adapter_in = self.new(x.numel, "fp32", x.rg)  # PEFT's cast up, then autocast's cast down (new)
        mid = self._matmul(adapter_in, a, tokens * self.lora_rank)
        delta = self._matmul(mid, b, tokens * lin.out_features)
        result = self.new(out.numel, _promote(out.dtype, delta.dtype), True)
        return self.to(result, out.dtype)

    def _matmul(self, x: Sym, w: Sym, out_numel: int) -> Sym:
        xc, wc = self.autocast_in(x), self.autocast_in(w)
        if w.rg:
            self.save(xc)
        if xc.rg:
            self.save(wc)
        dtype = xc.dtype if self.num.autocast else _promote(x.dtype, w.dtype)
        return self.new(out_numel, dtype, x.rg or w.rg)

    def layernorm(self, x: Sym, rows: int) -> Sym:
        """``native_layer_norm`` saves input, mean and rstd (CUDA autocast runs it in fp32)."""
        xin = self.fp32_op_in(x)
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

    def rmsnorm_gemma(self, x: Sym, rows: int) -> Sym:
        """HF ``Gemma3RMSNorm``: out = norm(x.float()) * (1 + weight.float()); ``type_as(x)``."""
        x32 = self.to(x, "fp32")
        rstd = self.new(rows, "fp32", x.rg)
        if x.rg:
            self.save(x32, rstd)
        normed = self.new(x.numel, "fp32", x.rg)
        if self.trains:
            self.save(normed)
        return self.to(self.new(x.numel, "fp32", x.rg or self.trains), x.dtype)

    def rmsnorm_t5(self, x: Sym, rows: int) -> Sym:
        """HF ``T5LayerNorm``: fp32 variance, ``x * rsqrt`` (promotes to fp32), cast to 16-bit weights."""
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

    def gelu_new(self, x: Sym) -> Sym:
        """HF ``NewGELUActivation``: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), op by op."""
        if not x.rg:
            return self.new(x.numel, x.dtype, False)
        xp = self.fp32_op_in(x)  # pow is an fp32 op under CUDA autocast
        self.save(xp)
        inner = _promote(x.dtype, xp.dtype)
        t = self.new(x.numel, inner, True)  # tanh keeps its output
        half_x = self.new(x.numel, x.dtype, True)  # 0.5 * x
        one_plus = self.new(x.numel, inner, True)  # 1.0 + tanh(...)
        self.save(t, half_x, one_plus)
        return self.new(x.numel, _promote(x.dtype, inner), True)

    def act(self, x: Sym, name: str) -> Sym:
        if name == "gelu_new":
            return self.gelu_new(x)
        return self.unary(x, "output" if name == "relu" else "input")

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

    # ---- attention ------------------------------------------------------------------------------------
    def attention(self, q: Sym, k: Sym, v: Sym, spec: Attn) -> Sym:
        """The attention core as the model calls it; returns the tensor the output projection reads."""
        if self.num.attention == "eager":
            return self._eager(q, k, v, spec)
        kv_heads, gqa = hf_sdpa_heads(spec.heads, spec.kv_heads, spec.head_dim, spec.v_head_dim, spec.mask)
        full_k = spec.batch * spec.heads * spec.seq_k
        if kv_heads != spec.kv_heads:  # HF's repeat_kv materialises full-width keys and values
            k, v = self.new(full_k * spec.head_dim, k.dtype, k.rg), self.new(full_k * spec.v_head_dim, v.dtype, v.rg)
        q, k, v = self.autocast_in(q), self.autocast_in(k), self.autocast_in(v)
        mask = spec.bias
        if mask is not None and self.num.autocast and mask.dtype == "fp32":
            mask = self.new(mask.numel, q.dtype, mask.rg)  # autocast casts a float mask too
        call = SdpaCall(dtype=q.dtype, q_heads=spec.heads, kv_heads=kv_heads, head_dim=spec.head_dim,
                        v_head_dim=spec.v_head_dim, mask=spec.mask, causal=spec.causal and not spec.mask,
                        seq_q=spec.seq_q, seq_k=spec.seq_k, dropout=spec.dropout, enable_gqa=gqa)
        kernel = cuda_sdpa_kernel(call)
        rg = q.rg or k.rg or v.rg
        out_numel = spec.batch * spec.heads * spec.seq_q * spec.v_head_dim
        if kernel in ("flash", "efficient"):
            out = self.new(out_numel, q.dtype, rg)
            if not rg:
                return out
            rows = spec.seq_q if kernel == "flash" else efficient_lse_rows(spec.seq_q)
            self.save(q, k, v, out, self.new(spec.batch * spec.heads * rows, "fp32", True))
            if kernel == "efficient" and spec.mask:  # the converted (and padded) additive mask
                if mask is None:
                    mask = Sym(spec.batch * spec.seq_q * _ceil8(spec.seq_k), q.dtype, False, "const")
                elif spec.seq_k % 8:
                    mask = self.new(mask.numel // spec.seq_k * _ceil8(spec.seq_k), mask.dtype, mask.rg)
                self.save(mask)
            return out  # written as (b, s, heads, d): HF's transpose(1, 2).contiguous() is free
        # math: inputs upcast to fp32, q and k scaled, GQA repeated, the softmax kept in fp32
        acc = "fp32" if q.dtype in HALF else q.dtype
        scores = spec.batch * spec.heads * spec.seq_q * spec.seq_k
        qs = self.new(q.numel, acc, q.rg)
        ks = self.new(full_k * spec.head_dim, acc, k.rg)
        probs = self.new(scores, acc, rg)
        vv = v if (v.dtype == acc and not gqa) else self.new(full_k * spec.v_head_dim, acc, v.rg)
        if rg:
            self.save(qs, ks, probs, vv)
            if spec.dropout > 0 and self.num.dropout:
                probs = self.new(scores, acc, True)
                self.save(Sym(scores, "bool", True), probs)
        out = self.to(self.new(out_numel, acc, rg), q.dtype)
        return self.copy(out)

    def _eager(self, q: Sym, k: Sym, v: Sym, spec: Attn) -> Sym:
        """HF ``eager_attention_forward``: repeat_kv, q·kᵀ·scale (+mask), softmax (fp32 for decoders), ·v."""
        full_k = spec.batch * spec.heads * spec.seq_k
        if spec.kv_heads != spec.heads:
            k, v = self.new(full_k * spec.head_dim, k.dtype, k.rg), self.new(full_k * spec.v_head_dim, v.dtype, v.rg)
        qc, kc = self.autocast_in(q), self.autocast_in(k)
        rg = qc.rg or kc.rg
        if rg:
            self.save(qc, kc)
        scores = spec.batch * spec.heads * spec.seq_q * spec.seq_k
        dtype = qc.dtype
        if spec.bias is not None or spec.mask or spec.causal:  # + additive mask in the model's dtype
            dtype = _promote(dtype, spec.bias.dtype if spec.bias is not None else self.num.param_dtype)
        probs32 = self.new(scores, "fp32" if self.num.autocast else dtype, rg)
        if rg:
            self.save(probs32)
        probs = self.to(probs32, q.dtype)
        probs = self.dropout(probs, spec.dropout)
        pc, vc = self.autocast_in(probs), self.autocast_in(v)
        if pc.rg:
            self.save(vc)
        if vc.rg:
            self.save(pc)
        return self.copy(self.new(spec.batch * spec.heads * spec.seq_q * spec.v_head_dim, pc.dtype, pc.rg or vc.rg))


def _promote(a: str, b: str) -> str:
    if "fp32" in (a, b):
        return "fp32"
    return a


def _ceil8(n: int) -> int:
    return -(-n // 8) * 8


# ---- blocks ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    batch: int
    seq: int


def _lin(arch: Architecture, kind: str) -> dict[str, Linear]:
    return {lin.name: lin for lin in arch.block_linears(kind)}


def _spec(arch: Architecture, sh: Shape, causal: bool, mask: bool = False, bias: Sym | None = None,
          kv_heads: int | None = None, head_dim: int | None = None, v_head_dim: int | None = None) -> Attn:
    return Attn(sh.batch, sh.seq, sh.seq, arch.num_heads, kv_heads or arch.num_kv_heads, head_dim or arch.head_dim,
                v_head_dim or head_dim or arch.head_dim, causal, mask, arch.attention_dropout, bias)


def gpt2_block(tr: Trace, arch: Architecture, x: Sym, sh: Shape) -> Sym:
    """HF ``GPT2Block``: ln_1, c_attn (q/k/v are views of one output), SDPA, c_proj, dropout; ln_2, MLP."""
    tokens = sh.batch * sh.seq
    lin = _lin(arch, "block")
    qkv = tr.linear(tr.layernorm(x, tokens), lin["attn.c_attn"], tokens)
    if qkv.rg:  # q, k and v are views of one qkv storage: saving any keeps all of it
        q = k = v = qkv
    else:
        q, k, v = (Sym(tokens * arch.hidden_size, qkv.dtype, False) for _ in range(3))
    o = tr.attention(q, k, v, _spec(arch, sh, causal=True))
    x = tr.add(x, tr.dropout(tr.linear(o, lin["attn.c_proj"], tokens), arch.hidden_dropout))
    f = tr.linear(tr.layernorm(x, tokens), lin["mlp.c_fc"], tokens)
    m = tr.linear(tr.act(f, arch.activation), lin["mlp.c_proj"], tokens)
    return tr.add(x, tr.dropout(m, arch.hidden_dropout))


def bert_block(tr: Trace, arch: Architecture, x: Sym, sh: Shape) -> Sym:
    """HF ``BertLayer``: q, k, v linears, SDPA (no mask, not causal), dense + dropout + LayerNorm(· + x), MLP."""
    tokens = sh.batch * sh.seq
    lin = _lin(arch, "block")
    q, k, v = (tr.linear(x, lin[f"attention.self.{n}"], tokens) for n in ("query", "key", "value"))
    o = tr.attention(q, k, v, _spec(arch, sh, causal=False))
    a = tr.dropout(tr.linear(o, lin["attention.output.dense"], tokens), arch.hidden_dropout)
    x = tr.layernorm(tr.add(a, x), tokens)
    i = tr.act(tr.linear(x, lin["intermediate.dense"], tokens), arch.activation)
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


def _gated_mlp(tr: Trace, n: Sym, lins: list[Linear], tokens: int, act: str) -> Sym:
    """SwiGLU / GeGLU: down(act(gate(n)) * up(n)); a fused gate_up is one linear whose halves are views."""
    if len(lins) == 2:  # Phi-3 gate_up_proj: act saves the gate half, mul the up half (views of one output)
        gate_up = tr.linear(n, lins[0], tokens)
        a = tr.new(gate_up.numel // 2, gate_up.dtype, gate_up.rg)
        if gate_up.rg:
            tr.save(gate_up, a)
        return tr.linear(tr.new(a.numel, a.dtype, a.rg), lins[1], tokens)
    gate = tr.act(tr.linear(n, lins[0], tokens), act)
    up = tr.linear(n, lins[1], tokens)
    return tr.linear(tr.mul(gate, up), lins[2], tokens)


def _moe(tr: Trace, arch: Architecture, n: Sym, tokens: int, routing: Routing, shared: list[Linear]) -> Sym:
    """Router, top-k, grouped experts, weighted combine: transformers 5.x ``grouped_mm`` experts.

    The router keeps the fp32 softmax; tokens are gathered into one (tokens·k × h) buffer sorted by
    expert; the grouped matmuls run in the experts' weight dtype (HF casts the input: under autocast
    with fp32 master weights the experts compute in fp32); the gated activation keeps both halves of
    the up projection; the routing weights multiply the down projection before the per-token sum.
    """
    e, i = arch.num_experts, arch.moe_intermediate_size
    rows = routing.rows(arch, tokens)
    logits = tr.linear(n, Linear("router", arch.hidden_size, e, arch.moe_style == "gpt_oss"), tokens)
    probs = tr.new(tokens * e, "fp32", logits.rg)  # softmax(logits.float()) keeps its fp32 output
    if logits.rg:
        tr.save(probs)
    tr.save(Sym(tokens * arch.experts_per_token, "int64", False, "const"))  # topk keeps the chosen indices
    weights = tr.new(rows, "fp32", probs.rg)
    if weights.rg:  # top-k values renormalised in place; the gather by the sort order keeps its indices
        tr.save(weights, tr.new(tokens, "fp32", True))
    order = Sym(rows, "int64", False, "const")
    tr.save(order, Sym(rows, "int64", False, "const"))  # token gather and restoring permutation
    expert_dtype = tr.num.param_dtype
    xs = tr.new(rows * arch.hidden_size, n.dtype, n.rg)  # hidden_states[perm // k]
    xs = tr.to(xs, expert_dtype)
    w_up = tr.param(e * 2 * i * arch.hidden_size, tr.trains, expert_dtype)
    if w_up.rg:
        tr.save(xs)
    gate_up = tr.new(rows * 2 * i, expert_dtype, xs.rg or w_up.rg)
    a = tr.new(rows * i, expert_dtype, gate_up.rg)
    if gate_up.rg:
        tr.save(gate_up, a)  # act keeps the gate half, the product the up half and act's output
    h = tr.new(rows * i, expert_dtype, a.rg)
    if tr.trains:
        tr.save(h)
    down = tr.new(rows * arch.hidden_size, expert_dtype, h.rg or tr.trains)
    out = tr.mul(down, weights)
    combined = tr.to(tr.new(tokens * arch.hidden_size, out.dtype, out.rg), n.dtype)
    if shared:
        gated = [lin for lin in shared if lin.name.endswith("shared_expert_gate")]
        s_out = _gated_mlp(tr, n, [lin for lin in shared if lin not in gated], tokens, arch.activation)
        if gated:
            sig = tr.unary(tr.linear(n, gated[0], tokens), "output")
            s_out = tr.mul(sig, s_out)
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
    q_full = tr.new(tokens * a * qk, _promote(q.dtype, q_pe.dtype), q.rg or q_pe.rg)  # cat(q_nope, q_pe)
    k_full = tr.new(tokens * a * qk, _promote(kv.dtype, k_pe.dtype), kv.rg or k_pe.rg)  # cat(k_nope, k_pe)
    v = tr.new(tokens * a * arch.v_head_dim, kv.dtype, kv.rg)
    o = tr.attention(q_full, k_full, v, _spec(arch, sh, True, kv_heads=a, head_dim=qk, v_head_dim=arch.v_head_dim))
    return tr.linear(o, lin["self_attn.o_proj"], tokens)


def llama_block(tr: Trace, arch: Architecture, x: Sym, sh: Shape, rope: Sym, kind: str = "block",
                routing: Routing | None = None, index: int = 0) -> Sym:
    """HF decoder layer (Llama, Mistral, Qwen2/3, Gemma 3, Phi-3, Mixtral, Qwen-MoE): RMSNorm, q/k/v (Phi-3:
    one qkv), q/k norms (Qwen3, Gemma 3), RoPE, SDPA, o_proj; Gemma's sandwich norms; MLP or MoE."""
    tokens = sh.batch * sh.seq
    lin = _lin(arch, kind)
    gemma = arch.model_type.startswith("gemma")
    norm = tr.rmsnorm_gemma if gemma else tr.rmsnorm_llama
    n = norm(x, tokens)
    if arch.kv_lora_rank:
        attn_out = _mla(tr, arch, n, sh, lin)
    else:
        if arch.fused_projections:  # one qkv output; q, k, v are views (RoPE makes new q and k)
            qkv = tr.linear(n, lin["self_attn.qkv_proj"], tokens)
            q = tr.new(tokens * arch.inner_size, qkv.dtype, qkv.rg)
            k = tr.new(tokens * arch.kv_size, qkv.dtype, qkv.rg)
            v = qkv
        else:
            q = tr.linear(n, lin["self_attn.q_proj"], tokens)
            k = tr.linear(n, lin["self_attn.k_proj"], tokens)
            v = tr.linear(n, lin["self_attn.v_proj"], tokens)
        if arch.qk_norm:  # RMSNorm over head_dim on q and k
            q = norm(q, tokens * arch.num_heads)
            k = norm(k, tokens * arch.num_kv_heads)
        q = tr.add(tr.mul(q, rope), tr.mul(tr.copy(q), rope))  # q·cos + rotate_half(q)·sin (cat copies)
        k = tr.add(tr.mul(k, rope), tr.mul(tr.copy(k), rope))
        o = tr.attention(q, k, v, _spec(arch, sh, causal=True, mask=arch.window_masked(index, sh.seq)))
        attn_out = tr.linear(o, lin["self_attn.o_proj"], tokens)
    if arch.sandwich_norms:
        attn_out = norm(attn_out, tokens)
    x = tr.add(x, attn_out)
    n = norm(x, tokens)
    if kind == "moe":
        shared = arch.block_linears("moe")[len(arch._attention_linears()):]
        m = _moe(tr, arch, n, tokens, routing or Routing(), shared)
    else:
        m = _gated_mlp(tr, n, arch.block_linears("block")[len(arch._attention_linears()):], tokens, arch.activation)
    if arch.sandwich_norms:
        m = norm(m, tokens)
    return tr.add(x, m)


def t5_block(tr: Trace, arch: Architecture, kind: str, x: Sym, sh: Shape, bias: Sym, enc: Sym | None) -> Sym:
    """HF ``T5Block``: T5LayerNorm, attention with the position bias as a float mask (a per-layer copy,
    or for the causal decoder ``where(causal, bias, min)``), cross-attention in the decoder, FF."""
    tokens = sh.batch * sh.seq
    lin = _lin(arch, kind)
    p = arch.hidden_dropout

    def attention(prefix: str, src: Sym, kv_src: Sym, causal: bool, b: Sym | None) -> Sym:
        q = tr.linear(src, lin[f"{prefix}.q"], tokens)
        k = tr.linear(kv_src, lin[f"{prefix}.k"], tokens)
        v = tr.linear(kv_src, lin[f"{prefix}.v"], tokens)
        layer_bias = None
        if b is not None:  # sdpa_attention_forward: create_position_bias_mask(...).contiguous() per layer
            layer_bias = tr.new(b.numel, b.dtype, b.rg)
        o = tr.attention(q, k, v, Attn(sh.batch, sh.seq, sh.seq, arch.num_heads, arch.num_heads, arch.head_dim,
                                       arch.head_dim, causal, b is not None, p, layer_bias))
        return tr.linear(o, lin[f"{prefix}.o"], tokens)

    n = tr.rmsnorm_t5(x, tokens)
    x = tr.add(x, tr.dropout(attention("layer.0.SelfAttention", n, n, kind == "decoder", bias), p))
    if kind == "decoder":
        n = tr.rmsnorm_t5(x, tokens)
        cross_bias = Sym(arch.num_heads * sh.seq * sh.seq, bias.dtype, False, "const")  # zeros, no grad
        x = tr.add(x, tr.dropout(attention("layer.1.EncDecAttention", n, enc, False, cross_bias), p))
    ff = "layer.2" if kind == "decoder" else "layer.1"
    n = tr.rmsnorm_t5(x, tokens)
    if arch.activation == "gelu_gated":
        hidden = tr.mul(tr.gelu_new(tr.linear(n, lin[f"{ff}.DenseReluDense.wi_0"], tokens)),
                        tr.linear(n, lin[f"{ff}.DenseReluDense.wi_1"], tokens))
    else:
        hidden = tr.unary(tr.linear(n, lin[f"{ff}.DenseReluDense.wi"], tokens), "output")
    hidden = tr.dropout(hidden, p)
    if hidden.dtype != tr.num.param_dtype:  # T5 casts to wo's weight dtype before the last linear
        hidden = tr.to(hidden, tr.num.param_dtype)
    out = tr.linear(hidden, lin[f"{ff}.DenseReluDense.wo"], tokens)
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
    """What the loss keeps: the log-softmax of the logits (fp32 for causal LMs)."""
    loss_backward_extra: int
    """Extra at the start of backward: the gradients of the log-softmax output and of its input."""
    logits_bytes: int
    """The logits tensor itself (compute dtype), alive while the loss is computed."""
    block_inputs: list[int]
    """Bytes of each block's input (what full activation checkpointing keeps per block)."""
    block_backward_temp: list[int]
    """Gradient temporaries while a block runs backward: about two of its largest activations."""
    root_largest: int = 0
    logits_upcast_bytes: int = 0
    """``logits.float()`` in HF's causal-LM loss: a second, fp32 copy while the loss is computed (none when
    the logits are fp32 already)."""


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
    rope = Sym(shape.seq * arch.head_dim, x.dtype, False, "const")  # cos/sin in the hidden states' dtype
    per_block: list[int] = []
    copies: list[int] = []
    inputs: list[int] = []
    temps: list[int] = []
    enc_out: Sym | None = None
    bias: Sym | None = None
    for index, (_prefix, kind) in enumerate(arch.blocks()):
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
            x = llama_block(tr, arch, x, shape, rope, kind, routing, index)
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
        x = (root.rmsnorm_gemma if arch.model_type.startswith("gemma") else root.rmsnorm_llama)(x, tokens)
    elif arch.family == "t5":
        x = root.dropout(root.rmsnorm_t5(x, tokens), arch.hidden_dropout)
        if arch.tie_word_embeddings:  # sequence_output * d_model ** -0.5: a scalar product saves nothing
            x = root.new(x.numel, x.dtype, x.rg)
    upcast = 0
    if arch.family == "bert":
        first = root.new(shape.batch * h, num.half, True) if num.autocast else x  # x[:, 0] (autocast: a copy)
        if root.trains:  # a view of the last hidden state keeps all of it
            root.save(first)
        pooled = root.unary(root.new(shape.batch * h, first.dtype, True), "output")  # tanh(dense(x[:, 0]))
        logits = root.linear(root.dropout(pooled, arch.hidden_dropout), Linear("classifier", h, arch.num_labels,
                                                                                True), shape.batch)
        lsm_bytes = shape.batch * arch.num_labels * BYTES["fp32" if num.autocast else logits.dtype]
        extra = 2 * lsm_bytes
    else:
        logits = root.linear(x, Linear("lm_head", h, arch.vocab_size, False), tokens)
        if arch.final_logit_softcap:  # Gemma 2: tanh(logits / cap) * cap — tanh keeps its output
            root.save(root.new(logits.numel, logits.dtype, logits.rg))
            logits = root.new(logits.numel, logits.dtype, logits.rg)
        rows_v = tokens * arch.vocab_size
        if arch.family == "t5":  # CrossEntropyLoss(lm_logits): log_softmax in fp32 under autocast, else as is
            lsm_dtype = "fp32" if num.autocast else logits.dtype
            lsm_bytes = rows_v * BYTES[lsm_dtype]
            extra = lsm_bytes + rows_v * BYTES[logits.dtype]  # grad of the log-softmax output + of its input
        else:  # ForCausalLMLoss: logits.float(), then cross_entropy
            lsm_bytes = rows_v * 4
            upcast = rows_v * 4 if logits.dtype != "fp32" else 0
            extra = 2 * lsm_bytes
    return ActivationProfile(
        per_block=per_block, block_param_copies=copies,
        root_saved=root.saved_bytes("act") + root.saved_bytes("const"), root_saved_before_head=before_head,
        root_param_copies=root.saved_bytes("param_copy"), loss_saved=lsm_bytes, loss_backward_extra=extra,
        logits_bytes=logits.nbytes, block_inputs=inputs, block_backward_temp=temps, root_largest=root.largest_act,
        logits_upcast_bytes=upcast)
