"""Run a CPU fake-tensor training step the way CUDA would run it, where that changes what is kept.

Measured mode runs on CPU under ``FakeTensorMode``; a few CPU code paths keep different tensors than
the CUDA ones users train with. This context manager switches them to CUDA's behaviour, each through
the op CUDA itself runs, so autograd's own saving rules (``derivatives.yaml``) decide the bytes:

* **Attention kernel.** ``F.scaled_dot_product_attention`` picks CUDA's backend with
  ``attention_kernels.cuda_sdpa_kernel`` and calls that backend's aten op
  (``_scaled_dot_product_flash_attention`` / ``_efficient_attention`` / ``_attention_math``), with
  the same mask conversion and padding as ``attention.cpp``. On CPU torch would pick its own flash
  kernel, or the math path whenever there is dropout or grouped-query attention.
* **Dropout.** CUDA's ``F.dropout`` is the fused ``native_dropout`` that keeps a 1-byte mask; CPU's
  keeps a noise tensor of the input's dtype. ``native_dropout`` is used.
* **Autocast.** CUDA autocast runs ``pow``, ``rsqrt``, ``exp``, ``log``, ``layer_norm`` in fp32 and
  ``softmax``, ``log_softmax``, ``sum``, ``cumsum`` with an fp32 result (``autocast_mode.cpp``
  ``AT_FORALL_FP32`` / ``_SET_OPT_DTYPE``); CPU autocast does not. The ones the models call from
  Python on 16-bit tensors get CUDA's policy (GPT-2's ``gelu_new`` calls ``pow`` on a bf16 tensor).
  Patched functions, not a function mode: recomputation under checkpointing must see them too.
* **Hugging Face's causal mask.** transformers treats fake tensors as "tracing" and then builds an
  explicit (batch, 1, s, s) mask instead of ``is_causal=True`` (``find_packed_sequence_indices``);
  on a GPU with unpacked rows there is no mask. The check is answered as on a GPU.

What stays invisible is listed in ``CANNOT_SHOW``. Imports torch: worker process and tests only.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from .attention_kernels import SdpaCall, cuda_sdpa_kernel

aten = torch.ops.aten
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp32"}

#: What a CPU fake-tensor step cannot show of a CUDA step (measured mode states these).
CANNOT_SHOW = (
    "caching-allocator block rounding and fragmentation (reserved above allocated; "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lowers it)",
    "kernel workspaces inside attention backward (flash/cuDNN dq accumulator in fp32, expanded grouped-query "
    "dk/dv): transient, about 2 × q bytes per layer",
    "cuBLAS/cuBLASLt workspaces: one per thread and stream, 32 MiB each on sm90 (H100/H200) by default — "
    "added as a correction",
    "CUDA context, NCCL buffers and other memory outside PyTorch's allocator (not in max_memory_allocated)",
)


def _cast(x, dtype):
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype else x


def emulated_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, kernels: list[str] | None = None):
    """``F.scaled_dot_product_attention`` as CUDA dispatches it (``attention.cpp``)."""
    if torch.is_autocast_enabled("cpu"):  # SDPA is on autocast's lower-precision list (CUDA and CPU)
        low = torch.get_autocast_dtype("cpu")
        query, key, value = (_cast(t, low) for t in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = _cast(attn_mask, low)
    call = SdpaCall(dtype=DTYPE_NAMES.get(query.dtype, "fp32"), q_heads=query.shape[-3], kv_heads=key.shape[-3],
                    head_dim=query.shape[-1], v_head_dim=value.shape[-1], mask=attn_mask is not None,
                    causal=bool(is_causal), seq_q=query.shape[-2], seq_k=key.shape[-2], dropout=dropout_p,
                    enable_gqa=enable_gqa, mask_stride_one=attn_mask is None or attn_mask.stride(-1) == 1)
    kernel = cuda_sdpa_kernel(call)
    if kernels is not None:
        kernels.append(kernel)
    with torch.autocast("cpu", enabled=False):
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # convert_boolean_attn_mask
            attn_mask = torch.where(attn_mask.logical_not(), -math.inf,
                                    torch.scalar_tensor(0.0, dtype=query.dtype, device=query.device))
        if kernel == "flash":
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                            scale=scale)[0]
        if kernel == "efficient":
            if attn_mask is not None:  # preprocess_mask: pad the last dim to a multiple of 8, expand
                aligned = attn_mask.stride(-1) == 1 and all(attn_mask.stride(i) % 8 == 0
                                                            for i in range(attn_mask.dim() - 1))
                if not aligned:
                    last = attn_mask.shape[-1]
                    attn_mask = F.pad(attn_mask, (0, 8 - last % 8))[..., :last]
                attn_mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, grad, dropout_p,
                                                                is_causal, scale=scale)[0]
        drop_mask = None
        if dropout_p > 0:  # CUDA's fused dropout keeps a bool mask; the math op keeps what it is given
            drop_mask = torch.empty(*query.shape[:-2], query.shape[-2], key.shape[-2], dtype=torch.bool,
                                    device=query.device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal,
                                                           drop_mask, scale=scale, enable_gqa=enable_gqa)[0]


def cuda_dropout(input, p=0.5, training=True, inplace=False):
    """CUDA's ``F.dropout``: the fused ``native_dropout`` (keeps a bool mask)."""
    if not training or p == 0 or input.numel() == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


def _autocast_fp32(fn, cast_inputs: bool):
    """``fn`` as CUDA autocast runs it: 16-bit inputs cast to fp32 (``AT_FORALL_FP32``) or, for reductions and
    softmax, an fp32 result (``AT_FORALL_FP32_SET_OPT_DTYPE``). Outside autocast, ``fn`` unchanged."""

    def wrapper(*args, **kwargs):
        if torch.is_autocast_enabled("cpu") and any(
                isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16) for a in args):
            if cast_inputs:
                args = tuple(_cast(a, torch.float32) for a in args)
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return fn(*args, **kwargs)

    return wrapper


#: (owner, name, cast inputs?) of the CUDA-autocast fp32 ops the models reach from Python with 16-bit
#: inputs (GPT-2/T5 ``gelu_new`` → ``torch.pow``; eager attention's ``softmax``; ``layer_norm``).
_FP32_FUNCTIONS = ((torch, "pow", True), (torch.Tensor, "pow", True), (torch.Tensor, "__pow__", True),
                   (F, "layer_norm", True), (F, "softmax", False), (F, "log_softmax", False),
                   (torch, "softmax", False), (torch.Tensor, "softmax", False))


def _grouped_mm(fn):
    """``F.grouped_mm`` takes bf16 only (its meta kernel checks it, as CUDA's does); other dtypes go through
    transformers' fallback loop, whose autograd keeps the same tensors (input and weight)."""

    def wrapper(mat_a, mat_b, *args, offs=None, **kwargs):
        if mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16:
            return fn(mat_a, mat_b, *args, offs=offs, **kwargs)
        return torch.ops.transformers.grouped_mm_fallback(mat_a, mat_b, offs=offs)

    return wrapper


@contextlib.contextmanager
def cuda_semantics(kernels: list[str] | None = None) -> Iterator[None]:
    """Within the block, SDPA, dropout, autocast and HF's mask creation behave as on CUDA."""
    patches = [(F, "scaled_dot_product_attention",
                lambda *a, **k: emulated_sdpa(*a, **k, kernels=kernels)), (F, "dropout", cuda_dropout)]
    patches += [(owner, name, _autocast_fp32(getattr(owner, name), cast)) for owner, name, cast in _FP32_FUNCTIONS]
    if hasattr(F, "grouped_mm") and "transformers.integrations.moe" in sys.modules:  # HF MoE experts
        patches.append((F, "grouped_mm", _grouped_mm(F.grouped_mm)))
    masking = sys.modules.get("transformers.masking_utils")  # loaded by any HF model that builds masks
    if masking is not None and hasattr(masking, "find_packed_sequence_indices"):
        patches.append((masking, "find_packed_sequence_indices", lambda position_ids: None))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
