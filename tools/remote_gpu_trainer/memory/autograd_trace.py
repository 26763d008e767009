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
from .attention_kernels import (
    HALF,
    SdpaCall,
    cuda_sdpa_kernel,
    efficient_lse_rows,
    hf_sdpa_heads,
    hf_t5_mask_contiguous,
)

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
    base: Sym | None = None
    """A view (a slice or chunk of ``base``): no storage of its own; saving it keeps ``base``."""

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
    checkpointing: bool = False
    """Hugging Face gradient checkpointing is on (T5 then makes its cross-attention bias require grad)."""


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
    softcap: bool = False
    """Gemma 2's attention logit soft-capping (eager only): tanh keeps its (b × heads × s × s) output."""
    softmax_fp32: bool = False
    """Eager attention's softmax runs in fp32 whatever the input (HF decoders pass ``dtype=torch.float32``;
    GPT-2 and BERT do not)."""
    q_heads_major: bool = False
    """q is laid out (batch, heads, s, d) — made by ``cat`` (Phi-3's partial RoPE, MLA) — rather than a
    (batch, s, heads, d) projection view: flash attention writes its output in q's layout, so Hugging
    Face's ``transpose(1, 2).contiguous()`` then copies it."""
    mask_stride_one: bool = True
    """False for T5's self-attention: its position bias keeps the (q, k, heads) layout it was permuted from, which
    no fused GPU kernel accepts (``attention_kernels.SdpaCall.mask_stride_one``)."""


@dataclass(eq=False)
class Op:
    """One recorded op: the tensors its backward produces gradients for, and the one it made."""

    inputs: tuple[Sym, ...]
    out: Sym
    extra: int = 0
    """Bytes its backward allocates beyond the gradients of its inputs (kernel buffers)."""


@dataclass
class Trace:
    """Records the ops of one region (a block, or everything outside the blocks) and what they save."""

    num: Numerics
    lora_rank: int = 0
    lora_targets: frozenset[str] = frozenset()
    frozen_base: bool = False
    """LoRA: every base parameter is frozen; only adapters train."""
    owners: dict[int, int] = field(default_factory=dict)
    """Shared across the traces of one forward: a tensor saved by several regions counts once."""
    kernels: dict[str, int] = field(default_factory=dict)
    """Shared: the attention kernel of each attention call (CUDA SDPA's choice, or eager)."""
    saved: dict[int, Sym] = field(default_factory=dict)
    largest_act: int = 0
    _cast_cache: dict[int, Sym] = field(default_factory=dict)
    serial: int = field(default_factory=itertools.count().__next__)
    ops: list[Op] = field(default_factory=list)
    held: list[Sym] = field(default_factory=list)
    """Tensors Python keeps referenced until the region returns (its input, held by the caller's loop
    variable; a block's named intermediates), whatever their last op."""
    _first_saver: dict[int, int] = field(default_factory=dict)
    """Saved tensor → index of the first op that saved it (autograd frees it after that op's backward)."""

    @property
    def trains(self) -> bool:
        return not self.frozen_base

    # ---- bookkeeping ----------------------------------------------------------------------------
    def new(self, numel: int, dtype: str, rg: bool, kind: str = "act", src: tuple[Sym, ...] = (),
            extra: int = 0) -> Sym:
        """The output of an op reading ``src`` (autograd passes its gradient back to them)."""
        t = Sym(numel, dtype, rg, kind)
        if kind == "act":
            self.largest_act = max(self.largest_act, t.nbytes)
            self.ops.append(Op(src, t, extra))
        return t

    def save(self, *tensors: Sym, by_last: bool = False) -> None:
        """Tensors the op being recorded keeps for its backward: the next ``new``, or with ``by_last`` the
        op just recorded (an op that keeps its own output)."""
        for t in tensors:
            t = t.base or t
            if t.kind == "param":  # parameters are counted as model states, not activations
                continue
            if self.owners.setdefault(t.serial, self.serial) == self.serial and t.serial not in self.saved:
                self.saved[t.serial] = t
                self._first_saver[t.serial] = len(self.ops) - (1 if by_last else 0)

    def backward_peak(self) -> int:
        """Activation and gradient bytes of this region at its costliest moment of backward.

        Ops run backward in reverse order. When op i runs, alive are: every tensor the region saved whose
        first saver is op i or earlier (autograd frees a saved tensor after its saver's backward), the
        gradients already computed and not yet consumed (a tensor's gradient lives from its last
        consumer's backward to its producer's), the new gradients of op i's inputs and op i's own
        buffers. Parameter gradients are model states, counted elsewhere.
        """
        last = len(self.ops) - 1
        free_after: dict[int, int] = {}
        for serial, index in self._first_saver.items():
            t = self.saved[serial]
            if t.kind != "param_copy":
                free_after[min(index, last)] = free_after.get(min(index, last), 0) + t.nbytes
        alive = sum(free_after.values())
        grads: dict[int, int] = {}
        peak = 0
        for index in range(last, -1, -1):
            op = self.ops[index]
            if op.out.rg:
                grads.setdefault(op.out.serial, op.out.nbytes)
            inputs = {x.serial: x.nbytes for x in op.inputs if x.rg and x.kind == "act"}
            peak = max(peak, alive + sum(grads.values()) + sum(inputs.values()) + op.extra)
            grads.update(inputs)
            grads.pop(op.out.serial, None)
            alive -= free_after.get(index, 0)
        return peak

    def forward_peak(self, keeps: bool = True) -> int:
        """Activation bytes of this region at its costliest moment of forward: what it has saved so far
        (``keeps``; nothing under checkpointing) and the tensors made but still to be read by a later op."""
        last_use: dict[int, int] = {}
        for index, op in enumerate(self.ops):
            for x in op.inputs:
                last_use[x.serial] = index
        for x in self.held:
            last_use[x.serial] = len(self.ops)
        saved_at: dict[int, int] = {}
        for serial, index in self._first_saver.items():
            if self.saved[serial].kind != "param_copy":
                saved_at[index] = saved_at.get(index, 0) + self.saved[serial].nbytes
        outside = sum(x.nbytes for x in self.held if all(x is not op.out for op in self.ops))
        kept, live, peak = 0, outside, 0
        ending: dict[int, int] = {}
        for index, op in enumerate(self.ops):
            kept += saved_at.get(index, 0) if keeps else 0
            if op.out.base is None and (op.out.serial not in self.saved or not keeps):
                live += op.out.nbytes
                end = last_use.get(op.out.serial, index)
                ending[end] = ending.get(end, 0) + op.out.nbytes
            peak = max(peak, kept + live)
            live -= ending.pop(index, 0)
        return peak

    def saved_bytes(self, kind: str | None = None) -> int:
        return sum(t.nbytes for t in self.saved.values() if kind is None or t.kind == kind)

    def param(self, numel: int, trainable: bool, dtype: str | None = None) -> Sym:
        return Sym(numel, dtype or self.num.param_dtype, trainable, "param")

    # ---- casts --------------------------------------------------------------------------------------
    def to(self, x: Sym, dtype: str) -> Sym:
        """``x.to(dtype)``: a new tensor when the dtype changes; saves nothing."""
        return x if x.dtype == dtype else self.new(x.numel, dtype, x.rg, src=(x,))

    def autocast_in(self, x: Sym) -> Sym:
        """autocast casts the inputs of low-precision ops (linear, matmul, SDPA); weights are cached."""
        if not self.num.autocast or x.dtype != "fp32":
            return x
        if x.kind == "param":
            if x.serial not in self._cast_cache:
                self._cast_cache[x.serial] = Sym(x.numel, self.num.half, x.rg, "param_copy")
            return self._cast_cache[x.serial]
        return self.new(x.numel, self.num.half, x.rg, src=(x,))

    def fp32_op_in(self, x: Sym) -> Sym:
        """CUDA autocast runs ``pow``, ``rsqrt``, ``layer_norm``… in fp32: a 16-bit input is cast up."""
        return self.to(x, "fp32") if self.num.autocast and x.dtype in HALF else x

    def view(self, x: Sym, numel: int) -> Sym:
        """A slice of ``x`` (``chunk``, ``split``): its gradient is ``numel`` wide, its storage is ``x``'s."""
        t = self.new(numel, x.dtype, x.rg, src=(x,))
        t.base = x.base or x
        return t

    def derive(self, numel: int, dtype: str, *src: Sym) -> Sym:
        """A tensor computed from ``src`` by ops that save nothing (slices, cat, reshape copies)."""
        return self.new(numel, dtype, any(t.rg for t in src), src=src)

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
            adapter_in = self.new(x.numel, "fp32", x.rg, src=(x,))  # PEFT's cast up (autocast casts down again)
        mid = self._matmul(adapter_in, a, tokens * self.lora_rank)
        delta = self._matmul(mid, b, tokens * lin.out_features)
        result = self.new(out.numel, _promote(out.dtype, delta.dtype), True, src=(out, delta))
        return self.to(result, out.dtype)

    def _matmul(self, x: Sym, w: Sym, out_numel: int) -> Sym:
        xc, wc = self.autocast_in(x), self.autocast_in(w)
        if w.rg:
            self.save(xc)
        if xc.rg:
            self.save(wc)
        dtype = xc.dtype if self.num.autocast else _promote(x.dtype, w.dtype)
        return self.new(out_numel, dtype, x.rg or w.rg, src=(xc,))

    def layernorm(self, x: Sym, rows: int) -> Sym:
        """``native_layer_norm`` saves input, mean and rstd (CUDA autocast runs it in fp32)."""
        xin = self.fp32_op_in(x)
        rg = x.rg or self.trains
        if rg:
            self.save(xin, Sym(rows, "fp32", True), Sym(rows, "fp32", True))
        return self.new(x.numel, xin.dtype, rg, src=(xin,))

    def _rms(self, x: Sym, rows: int) -> Sym:
        """``x32 * rsqrt(x32.pow(2).mean(-1) + eps)``: pow keeps x32, rsqrt its output, the product both."""
        x32 = self.to(x, "fp32")
        rstd = self.new(rows, "fp32", x.rg, src=(x32,))
        if x.rg:
            self.save(x32, rstd)
        return self.new(x.numel, "fp32", x.rg, src=(x32, rstd))

    def rmsnorm_llama(self, x: Sym, rows: int) -> Sym:
        """HF ``LlamaRMSNorm``: x.float(); x * rsqrt(x.pow(2).mean() + eps); weight * x.to(dtype)."""
        cast = self.to(self._rms(x, rows), x.dtype)
        if self.trains:
            self.save(cast)
        return self.new(x.numel, _promote(cast.dtype, self.num.param_dtype), x.rg or self.trains, src=(cast,))

    def rmsnorm_gemma(self, x: Sym, rows: int) -> Sym:
        """HF ``Gemma3RMSNorm``: out = norm(x.float()) * (1 + weight.float()); ``type_as(x)``."""
        normed = self._rms(x, rows)
        if self.trains:
            self.save(normed)
        return self.to(self.new(x.numel, "fp32", x.rg or self.trains, src=(normed,)), x.dtype)

    def rmsnorm_t5(self, x: Sym, rows: int) -> Sym:
        """HF ``T5LayerNorm``: fp32 variance, ``x * rsqrt`` (promotes to fp32), cast to 16-bit weights."""
        x32 = self.to(x, "fp32")
        rstd = self.new(rows, "fp32", x.rg, src=(x32,))
        if x.rg:
            self.save(x32, x, rstd)
        normed = self.new(x.numel, "fp32", x.rg, src=(x, rstd))
        if self.num.param_dtype != "fp32":
            normed = self.to(normed, self.num.param_dtype)
        if self.trains:
            self.save(normed)
        return self.new(x.numel, _promote(normed.dtype, self.num.param_dtype), x.rg or self.trains, src=(normed,))

    def unary(self, x: Sym, saves: str) -> Sym:
        """Elementwise activation: ``saves`` is ``input`` (GELU, SiLU) or ``output`` (ReLU, tanh)."""
        if x.rg and saves == "input":
            self.save(x)
        out = self.new(x.numel, x.dtype, x.rg, src=(x,))
        if x.rg and saves == "output":
            self.save(out, by_last=True)
        return out

    def gelu_new(self, x: Sym) -> Sym:
        """HF ``NewGELUActivation``: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), op by op."""
        xp = self.fp32_op_in(x)  # pow is an fp32 op under CUDA autocast
        if x.rg:
            self.save(xp)
        cube = self.new(x.numel, xp.dtype, x.rg, src=(xp,))
        inner = self.derive(x.numel, _promote(x.dtype, xp.dtype), x, cube)  # √(2/π)·(x + 0.044715·x³)
        t = self.unary(inner, "output")
        one_plus = self.derive(x.numel, t.dtype, t)
        half_x = self.derive(x.numel, x.dtype, x)
        return self.mul(half_x, one_plus)

    def act(self, x: Sym, name: str) -> Sym:
        if name == "gelu_new":
            return self.gelu_new(x)
        return self.unary(x, "output" if name == "relu" else "input")

    def mul(self, a: Sym, b: Sym) -> Sym:
        if a.rg:
            self.save(b)
        if b.rg:
            self.save(a)
        return self.new(max(a.numel, b.numel), _promote(a.dtype, b.dtype), a.rg or b.rg, src=(a, b))

    def add(self, a: Sym, b: Sym) -> Sym:
        return self.new(max(a.numel, b.numel), _promote(a.dtype, b.dtype), a.rg or b.rg, src=(a, b))

    def dropout(self, x: Sym, p: float) -> Sym:
        if p <= 0 or not self.num.dropout:
            return x
        if x.rg:
            per = self.num.dropout_mask_bytes or BYTES[x.dtype]
            self.save(Sym(x.numel * per, "bool", True))
        return self.new(x.numel, x.dtype, x.rg, src=(x,))

    def copy(self, x: Sym) -> Sym:
        """A materialising reshape/contiguous/expand copy: new storage, nothing saved."""
        return self.new(x.numel, x.dtype, x.rg, src=(x,))

    # ---- attention ------------------------------------------------------------------------------------
    def attention(self, q: Sym, k: Sym, v: Sym, spec: Attn) -> Sym:
        """The attention core as the model calls it; returns the tensor the output projection reads."""
        if self.num.attention == "eager":
            self.kernels["eager"] = self.kernels.get("eager", 0) + 1
            return self._eager(q, k, v, spec)
        kv_heads, gqa = hf_sdpa_heads(spec.heads, spec.kv_heads, spec.head_dim, spec.v_head_dim, spec.mask)
        full_k = spec.batch * spec.heads * spec.seq_k
        if kv_heads != spec.kv_heads:
            k, v = self._repeat_kv(k, v, spec)
            if spec.kv_heads == 1:  # expanded views: autocast's cast materialises every head
                k, v = (self.new(full_k * d, self.num.half, t.rg, src=(t,)) if self.num.autocast and t.dtype == "fp32"
                        else t for t, d in ((k, spec.head_dim), (v, spec.v_head_dim)))
        q, k, v = self.autocast_in(q), self.autocast_in(k), self.autocast_in(v)
        mask = spec.bias
        if mask is not None and self.num.autocast and mask.dtype == "fp32":
            mask = self.new(mask.numel, q.dtype, mask.rg, src=(mask,))  # autocast casts a float mask too
        call = SdpaCall(dtype=q.dtype, q_heads=spec.heads, kv_heads=kv_heads, head_dim=spec.head_dim,
                        v_head_dim=spec.v_head_dim, mask=spec.mask, causal=spec.causal and not spec.mask,
                        seq_q=spec.seq_q, seq_k=spec.seq_k, dropout=spec.dropout, enable_gqa=gqa,
                        mask_stride_one=spec.mask_stride_one)
        kernel = cuda_sdpa_kernel(call)
        self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
        rg = q.rg or k.rg or v.rg
        out_numel = spec.batch * spec.heads * spec.seq_q * spec.v_head_dim
        if kernel in ("flash", "efficient"):
            src = (q, k, v)
            extra = 0
            if kernel == "efficient" and spec.mask:  # the converted (and padded) additive mask
                if mask is None:
                    mask = Sym(spec.batch * spec.seq_q * _ceil8(spec.seq_k), q.dtype, False, "const")
                elif spec.seq_k % 8:
                    mask = self.new(mask.numel // spec.seq_k * _ceil8(spec.seq_k), mask.dtype, mask.rg, src=(mask,))
                if mask.rg:  # its gradient is computed at the expanded (b, heads, s, ceil16(s)) size, then summed
                    src = (*src, mask)
                    extra = spec.batch * spec.heads * spec.seq_q * -(-spec.seq_k // 16) * 16 * BYTES[mask.dtype]
                if rg:
                    self.save(mask)
            if rg:
                rows = spec.seq_q if kernel == "flash" else efficient_lse_rows(spec.seq_q)
                self.save(q, k, v, Sym(spec.batch * spec.heads * rows, "fp32", True))
            out = self.new(out_numel, q.dtype, rg, src=src, extra=extra)
            if rg:
                self.save(out, by_last=True)
            if kernel == "flash" and spec.q_heads_major:
                return self.copy(out)
            return out  # written as (b, s, heads, d): HF's transpose(1, 2).contiguous() is free
        # math: inputs upcast to fp32, q and k scaled, GQA repeated, the softmax kept in fp32
        acc = "fp32" if q.dtype in HALF else q.dtype
        n_scores = spec.batch * spec.heads * spec.seq_q * spec.seq_k
        qs = self.new(q.numel, acc, q.rg, src=(q,))
        ks = self.new(full_k * spec.head_dim, acc, k.rg, src=(k,))
        vv = v if (v.dtype == acc and not gqa) else self.new(full_k * spec.v_head_dim, acc, v.rg, src=(v,))
        if rg:
            self.save(qs, ks)
        scores = self.new(n_scores, acc, rg, src=(qs, ks))
        probs = self.new(n_scores, acc, rg, src=(scores,))  # _safe_softmax keeps its output
        if rg:
            self.save(probs, by_last=True)
        if rg and spec.dropout > 0 and self.num.dropout:
            self.save(Sym(n_scores, "bool", True))
            probs = self.new(n_scores, acc, True, src=(probs,))
        if rg:
            self.save(probs, vv)
        out = self.to(self.new(out_numel, acc, rg, src=(probs, vv)), q.dtype)
        return self.copy(out)

    def _repeat_kv(self, k: Sym, v: Sym, spec: Attn) -> tuple[Sym, Sym]:
        """HF ``repeat_kv``: expand + reshape copies full-width keys and values; with one key/value head
        (multi-query) the reshape is a view and copies nothing."""
        if spec.kv_heads == 1:
            return k, v
        full = spec.batch * spec.heads * spec.seq_k
        return (self.new(full * spec.head_dim, k.dtype, k.rg, src=(k,)),
                self.new(full * spec.v_head_dim, v.dtype, v.rg, src=(v,)))

    def _eager(self, q: Sym, k: Sym, v: Sym, spec: Attn) -> Sym:
        """HF ``eager_attention_forward``: repeat_kv, q·kᵀ·scale (+mask), softmax (fp32 for decoders), ·v."""
        if spec.kv_heads != spec.heads:
            k, v = self._repeat_kv(k, v, spec)
        qc, kc = self.autocast_in(q), self.autocast_in(k)
        rg = qc.rg or kc.rg
        if rg:
            self.save(qc, kc)
        n_scores = spec.batch * spec.heads * spec.seq_q * spec.seq_k
        scores = self.new(n_scores, qc.dtype, rg, src=(qc, kc))
        if spec.softcap:  # scores / cap, tanh (keeps its output), * cap
            capped = self.unary(self.derive(n_scores, scores.dtype, scores), "output")
            scores = self.derive(n_scores, capped.dtype, capped)
        if spec.bias is not None or spec.mask or spec.causal:  # + additive mask in the model's dtype
            mask_dtype = spec.bias.dtype if spec.bias is not None else self.num.param_dtype
            scores = self.new(n_scores, _promote(scores.dtype, mask_dtype), rg, src=(scores,))
        fp32 = self.num.autocast or spec.softmax_fp32
        probs32 = self.new(n_scores, "fp32" if fp32 else scores.dtype, rg, src=(scores,))
        if rg:
            self.save(probs32, by_last=True)
        probs = self.dropout(self.to(probs32, q.dtype), spec.dropout)
        pc, vc = self.autocast_in(probs), self.autocast_in(v)
        if pc.rg:
            self.save(vc)
        if vc.rg:
            self.save(pc)
        out = self.new(spec.batch * spec.heads * spec.seq_q * spec.v_head_dim, pc.dtype, pc.rg or vc.rg, src=(pc, vc))
        return self.copy(out)


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
          kv_heads: int | None = None, head_dim: int | None = None, v_head_dim: int | None = None,
          q_heads_major: bool = False) -> Attn:
    return Attn(sh.batch, sh.seq, sh.seq, arch.num_heads, kv_heads or arch.num_kv_heads, head_dim or arch.head_dim,
                v_head_dim or head_dim or arch.head_dim, causal, mask, arch.attention_dropout, bias,
                arch.attention_softcap, arch.family == "llama", q_heads_major)


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
    tr.held.append(x)  # BertLayer's attention_output: referenced until the layer returns
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
        gate, up = tr.view(gate_up, gate_up.numel // 2), tr.view(gate_up, gate_up.numel // 2)
        return tr.linear(tr.mul(tr.unary(gate, "input"), up), lins[1], tokens)
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
    probs = tr.new(tokens * e, "fp32", logits.rg, src=(logits,))  # softmax(logits.float()) keeps its output
    if logits.rg:
        tr.save(probs, by_last=True)
    tr.save(Sym(tokens * arch.experts_per_token, "int64", False, "const"))  # topk keeps the chosen indices
    top = tr.new(tokens * arch.experts_per_token, "fp32", probs.rg, src=(probs,))
    if top.rg:  # top-k values renormalised in place: the division keeps both operands
        tr.save(top, Sym(tokens, "fp32", True))
    order = Sym(rows, "int64", False, "const")
    tr.save(order)  # the gathers by the sort order keep their indices
    weights = tr.new(rows, "fp32", top.rg, src=(top,))
    expert_dtype = tr.num.param_dtype
    xs = tr.to(tr.derive(rows * arch.hidden_size, n.dtype, n), expert_dtype)  # hidden_states[perm // k]
    # torch's grouped_mm (bf16 only) keeps its input for the weight gradient; transformers' fallback loop for
    # other dtypes keeps input and weight whatever needs a gradient
    keeps = tr.trains or expert_dtype != "bf16"
    if keeps:
        tr.save(xs)
    gate_up = tr.new(rows * 2 * i, expert_dtype, xs.rg or tr.trains, src=(xs,))
    gate, up = tr.view(gate_up, rows * i), tr.view(gate_up, rows * i)
    h = tr.mul(tr.unary(gate, "input"), up)  # act(gate) keeps gate; the product keeps act's output and up
    if keeps:
        tr.save(h)
    down = tr.new(rows * arch.hidden_size, expert_dtype, h.rg or tr.trains, src=(h,))
    out = tr.mul(down, weights)
    tr.save(Sym(rows, "int64", False, "const"))  # weighted_out[inv_perm]
    restored = tr.derive(rows * arch.hidden_size, out.dtype, out)
    combined = tr.to(tr.derive(tokens * arch.hidden_size, out.dtype, restored), n.dtype)  # sum over the k choices
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
    latent = tr.rmsnorm_llama(tr.derive(tokens * arch.kv_lora_rank, ckv.dtype, ckv), tokens)
    kv = tr.linear(latent, lin["self_attn.kv_b_proj"], tokens)
    rope = Sym(sh.seq * arch.qk_rope_head_dim, q.dtype, False, "const")
    q_rot = tr.derive(tokens * a * arch.qk_rope_head_dim, q.dtype, q)
    k_rot = tr.derive(tokens * arch.qk_rope_head_dim, ckv.dtype, ckv)
    q_pe = tr.add(tr.mul(q_rot, rope), tr.mul(tr.copy(q_rot), rope))
    k_pe = tr.add(tr.mul(k_rot, rope), tr.mul(tr.copy(k_rot), rope))
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    q_full = tr.derive(tokens * a * qk, _promote(q.dtype, q_pe.dtype), q, q_pe)  # cat(q_nope, q_pe)
    k_full = tr.derive(tokens * a * qk, _promote(kv.dtype, k_pe.dtype), kv, k_pe)  # cat(k_nope, k_pe expanded)
    v = tr.derive(tokens * a * arch.v_head_dim, kv.dtype, kv)
    o = tr.attention(q_full, k_full, v, _spec(arch, sh, True, kv_heads=a, head_dim=qk, v_head_dim=arch.v_head_dim,
                                              q_heads_major=True))
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
            q = tr.view(qkv, tokens * arch.inner_size)
            k = tr.view(qkv, tokens * arch.kv_size)
            v = tr.view(qkv, tokens * arch.kv_size)
        else:
            q = tr.linear(n, lin["self_attn.q_proj"], tokens)
            k = tr.linear(n, lin["self_attn.k_proj"], tokens)
            v = tr.linear(n, lin["self_attn.v_proj"], tokens)
        if arch.qk_norm:  # RMSNorm over head_dim on q and k
            q = norm(q, tokens * arch.num_heads)
            k = norm(k, tokens * arch.num_kv_heads)
        q = tr.add(tr.mul(q, rope), tr.mul(tr.copy(q), rope))  # q·cos + rotate_half(q)·sin (cat copies)
        k = tr.add(tr.mul(k, rope), tr.mul(tr.copy(k), rope))
        o = tr.attention(q, k, v, _spec(arch, sh, causal=True, mask=arch.window_masked(index, sh.seq),
                                        q_heads_major=arch.fused_projections))  # Phi-3's partial RoPE: cat
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


def t5_block(tr: Trace, arch: Architecture, kind: str, x: Sym, sh: Shape, bias: Sym, enc: Sym | None,
             cross_bias: Sym | None = None) -> Sym:
    """HF ``T5Block``: T5LayerNorm, attention with the position bias as a float mask (a per-layer copy, or for the
    causal decoder ``where(causal, bias, min)``; before transformers 5.20 in the bias's permuted layout, which runs
    math on a GPU: ``hf_t5_mask_contiguous``), cross-attention in the decoder (its zero bias is made once per
    stack, contiguous, passed as is), FF."""
    tokens = sh.batch * sh.seq
    lin = _lin(arch, kind)
    p = arch.hidden_dropout

    def attention(prefix: str, src: Sym, kv_src: Sym, causal: bool, b: Sym, permuted_bias: bool) -> Sym:
        q = tr.linear(src, lin[f"{prefix}.q"], tokens)
        k = tr.linear(kv_src, lin[f"{prefix}.k"], tokens)
        v = tr.linear(kv_src, lin[f"{prefix}.v"], tokens)
        o = tr.attention(q, k, v, Attn(sh.batch, sh.seq, sh.seq, arch.num_heads, arch.num_heads, arch.head_dim,
                                       arch.head_dim, causal, True, p, b, mask_stride_one=not permuted_bias))
        return tr.linear(o, lin[f"{prefix}.o"], tokens)

    n = tr.rmsnorm_t5(x, tokens)
    layer_bias = tr.derive(bias.numel, bias.dtype, bias)  # create_position_bias_mask(...)
    permuted = not hf_t5_mask_contiguous()[0]
    x = tr.add(x, tr.dropout(attention("layer.0.SelfAttention", n, n, kind == "decoder", layer_bias, permuted), p))
    if kind == "decoder" and cross_bias is not None:
        n = tr.rmsnorm_t5(x, tokens)
        x = tr.add(x, tr.dropout(attention("layer.1.EncDecAttention", n, enc, False, cross_bias, False), p))
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
    """While a block runs backward, its peak above its saved activations (``Trace.backward_peak``)."""
    block_forward_temp: list[int] = field(default_factory=list)
    """While a block runs forward, its peak above what it has saved by then (``Trace.forward_peak``)."""
    block_forward_temp_checkpointed: list[int] = field(default_factory=list)
    """The same when the block is checkpointed (its forward saves nothing)."""
    block_recompute_temp: list[int] = field(default_factory=list)
    """Checkpointed: the block's peak above its saved activations from its recomputation through its backward."""
    attention_kernels: dict[str, int] = field(default_factory=dict)
    """Attention calls per kernel: flash, efficient, math (CUDA SDPA's choice) or eager."""
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
    kernels: dict[str, int] = {}

    def trace() -> Trace:
        return Trace(num, lora_rank, lora_targets, frozen_base=frozen, owners=owners, kernels=kernels)

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
    fwd_temps: list[int] = []
    fwd_temps_ckpt: list[int] = []
    recompute_temps: list[int] = []
    enc_out: Sym | None = None
    bias: Sym | None = None
    cross_bias: Sym | None = None
    for index, (_prefix, kind) in enumerate(arch.blocks()):
        if kind == "decoder" and enc_out is None:  # T5: close the encoder, embed the decoder input
            enc_out = root.dropout(root.rmsnorm_t5(x, tokens), arch.hidden_dropout)
            x = root.dropout(root.new(tokens * h, embed_dtype, root.trains), arch.hidden_dropout)
            bias = None
            # zeros (1, heads, s, s); HF makes it require grad under gradient checkpointing
            cross_bias = Sym(arch.num_heads * shape.seq * shape.seq, embed_dtype, num.checkpointing,
                             "act" if num.checkpointing else "const")
        tr = trace()
        tr.held.append(x)
        inputs.append(x.nbytes)
        carried = 0
        if arch.family == "t5":
            if bias is None:  # the first block of a stack computes the relative position bias, (1, heads, s, s)
                if tr.trains:  # the bias embedding keeps its (s × s) int64 bucket ids
                    tr.save(Sym(shape.seq * shape.seq, "int64", False, "const"))
                bias = tr.new(arch.num_heads * shape.seq * shape.seq, num.param_dtype, tr.trains)
            # gradients that cross blocks while a stack runs backward: the position bias's (every layer adds
            # to it), the cross-attention bias's and the encoder output's (every decoder layer adds to them)
            carried = bias.nbytes if bias.rg else 0
            if kind == "decoder":
                carried += enc_out.nbytes + (cross_bias.nbytes if cross_bias.rg else 0)
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
            x = t5_block(tr, arch, kind, x, shape, bias, enc_out, cross_bias)
        per_block.append(tr.saved_bytes("act") + tr.saved_bytes("const"))
        copies.append(tr.saved_bytes("param_copy"))
        all_to_all = 2 * tr.largest_act if kind == "moe" and routing is not None and routing.ep > 1 else 0
        temps.append(max(tr.backward_peak() - per_block[-1], all_to_all) + carried)
        fwd_temps.append(max(0, tr.forward_peak() - per_block[-1]))
        fwd_temps_ckpt.append(tr.forward_peak(keeps=False))
        # checkpointing recomputes the block's forward while the gradient of its output waits
        recompute_temps.append(max(temps[-1], tr.forward_peak() + x.nbytes - per_block[-1]))
    # Final norm, head and loss (freed as soon as backward has passed them).
    before_head = root.saved_bytes("act") + root.saved_bytes("const")
    if arch.family == "gpt2":
        x = root.layernorm(x, tokens)
    elif arch.family == "llama":
        x = (root.rmsnorm_gemma if arch.model_type.startswith("gemma") else root.rmsnorm_llama)(x, tokens)
    elif arch.family == "t5":
        x = root.dropout(root.rmsnorm_t5(x, tokens), arch.hidden_dropout)
        if arch.tie_word_embeddings:  # sequence_output * d_model ** -0.5: a scalar product saves nothing
            x = root.derive(x.numel, x.dtype, x)
    upcast = 0
    if arch.family == "bert":
        first = root.derive(shape.batch * h, num.half, x) if num.autocast else x  # x[:, 0] (autocast: a copy)
        if root.trains:  # a view of the last hidden state keeps all of it
            root.save(first)
        pooled = root.unary(root.new(shape.batch * h, first.dtype, True, src=(first,)), "output")  # tanh(dense)
        logits = root.linear(root.dropout(pooled, arch.hidden_dropout), Linear("classifier", h, arch.num_labels,
                                                                                True), shape.batch)
        lsm_bytes = shape.batch * arch.num_labels * BYTES["fp32" if num.autocast else logits.dtype]
        extra = 2 * lsm_bytes
    else:
        logits = root.linear(x, Linear("lm_head", h, arch.vocab_size, False), tokens)
        if arch.final_logit_softcap:  # Gemma 2: tanh(logits / cap) * cap — tanh keeps its output
            capped = root.unary(root.derive(logits.numel, logits.dtype, logits), "output")
            logits = root.derive(logits.numel, logits.dtype, capped)
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
        logits_upcast_bytes=upcast, block_forward_temp=fwd_temps, block_forward_temp_checkpointed=fwd_temps_ckpt,
        block_recompute_temp=recompute_temps, attention_kernels=kernels)
