"""Which kernel ``F.scaled_dot_product_attention`` runs on an NVIDIA GPU, and how Hugging Face calls it.

The kernel decides activation memory: flash attention and cuDNN keep q, k, v, the output and an
fp32 logsumexp per query row; memory-efficient attention keeps the same (logsumexp padded to a
multiple of 32 rows) plus its additive mask; the math fallback keeps the (batch × heads × s × s)
softmax in fp32 (fp16/bf16 inputs are upcast) and, with dropout, a 1-byte mask and the dropped
probabilities. A wrong guess is a 2× error at long sequences (GPT-2 fp32 at 1024 × 8: 11.9 GiB
forward with SDPA against 22.3 GiB with eager attention on an H100).

The rules below are torch's own (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``,
``attention.cpp``; unchanged in what they decide here from torch 2.5 through 2.13), for sm80/sm90
GPUs (A100, H100, H200) and dense inputs; the backends are tried in priority order:

* **cuDNN** (first on sm90/sm100 when cuDNN > 9.15) and **flash**: fp16/bf16 only
  (``check_dtypes_low_precision``), no explicit ``attn_mask`` for flash (``check_for_attn_mask``),
  q/k/v head dims equal and ≤ 256, causal only with seq_q == seq_k, grouped-query attention native
  (``enable_gqa``). Both save the same tensors; this module calls them ``flash``.
* **memory-efficient**: fp32, fp16 or bf16; head dims divisible by 4 (fp32) or 8 (fp16/bf16) on
  sm80+ (``minimum_gemm_alignment``); masks and dropout allowed; **no grouped-query attention**
  (the installed torch 2.13 documents GQA for "Flash_attention and math kernel" only).
* **math**: everything else — in particular every fp32 grouped-query model (Llama 3, Qwen, Mistral,
  TinyLlama in fp32: an H100 measured the same peak with SDPA as with eager attention).

Hugging Face (``integrations/sdpa_attention.py``, transformers 5.x) passes ``enable_gqa=True`` when
there is no mask and the head dim is ≤ 256; otherwise it materialises full-width keys and values with
``repeat_kv`` first. A causal model without padding passes no mask (``is_causal=True``).

Pure Python: the analytic model and the measured mode's CUDA emulation share these rules.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

Kernel = Literal["flash", "efficient", "math"]
HALF = ("bf16", "fp16")


@dataclass(frozen=True)
class SdpaCall:
    """What reaches ``F.scaled_dot_product_attention`` for one attention layer."""

    dtype: str
    """dtype of q, k, v after autocast: fp32, bf16 or fp16."""
    q_heads: int
    kv_heads: int
    """Key/value heads as passed (after ``repeat_kv`` if Hugging Face repeated them)."""
    head_dim: int
    v_head_dim: int
    mask: bool
    """An explicit ``attn_mask`` tensor is passed (padding, sliding window, T5 position bias)."""
    causal: bool
    seq_q: int
    seq_k: int
    dropout: float = 0.0
    enable_gqa: bool = False
    mask_stride_one: bool = True
    """The mask's last dimension has stride 1. Every fused GPU kernel needs it (``sdp_utils_cpp.h``: "All fused
    kernels require the last dimension of the input to have stride 1 ... GPU backends require attn_mask's last
    dimension to have stride 1 while the CPU does not"). T5's relative position bias is permuted from
    (q, k, heads) to (1, heads, q, k), stride(-1) = heads, and elementwise ops on it keep that layout: its
    self-attention layers run the math kernel on a GPU (an H200 measured t5-base fp32 512 × 8 at 16.2 GiB,
    the 24 self-attention layers in math and the 12 cross-attention ones efficient)."""


def cuda_sdpa_kernel(call: SdpaCall) -> Kernel:
    """The backend torch selects on an sm80/sm90 GPU for ``call`` (see the module docstring)."""
    if call.mask and not call.mask_stride_one:
        return "math"
    same_heads = call.q_heads == call.kv_heads
    gqa_ok = same_heads or (call.enable_gqa and call.q_heads % call.kv_heads == 0)
    if (call.dtype in HALF and not call.mask and call.head_dim == call.v_head_dim <= 256
            and (not call.causal or call.seq_q == call.seq_k) and gqa_ok):
        return "flash"
    align = 8 if call.dtype in HALF else 4
    if same_heads and call.head_dim % align == 0 and call.v_head_dim % align == 0:
        return "efficient"
    return "math"


T5_CONTIGUOUS_MASK_SINCE = (5, 20)
"""transformers 5.20.0 ends ``create_position_bias_mask`` (integrations/sdpa_attention.py) with ``.contiguous()``;
5.19 and older pass T5's position bias in the layout it was permuted to, which no fused GPU kernel takes (read in
the 5.17.0-5.24.0 wheels; measured on an H200 with 5.17: t5-base fp32 512 × 8 peaks at 16.2 GiB, against 11.0 GiB
with every layer on the efficient kernel)."""


@functools.cache
def hf_t5_mask_contiguous() -> tuple[bool, str]:
    """(the installed transformers hands SDPA a contiguous T5 position-bias mask, why). Read from the package's
    metadata, without importing it; without transformers here, the newest releases' behaviour (contiguous)."""
    from importlib import metadata

    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return True, "transformers is not installed here: assumed ≥ 5.20, whose T5 position-bias mask is contiguous"
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    if numbers >= T5_CONTIGUOUS_MASK_SINCE:
        return True, f"transformers {version} (≥ 5.20) passes T5's position-bias mask contiguous: fused kernels"
    return False, (f"transformers {version} (< 5.20) passes T5's position bias in its permuted layout: its "
                   "self-attention runs the math kernel on a GPU (upgrading to ≥ 5.20 lowers the peak)")


def hf_sdpa_heads(q_heads: int, kv_heads: int, head_dim: int, v_head_dim: int, mask: bool) -> tuple[int, bool]:
    """(kv heads SDPA sees, enable_gqa) for Hugging Face's ``sdpa_attention_forward``."""
    if kv_heads == q_heads:
        return kv_heads, False
    if not mask and head_dim == v_head_dim <= 256:
        return kv_heads, True
    return q_heads, False  # repeat_kv materialised the keys and values at full width


def efficient_lse_rows(seq_q: int) -> int:
    """Memory-efficient attention pads its logsumexp to a multiple of 32 query rows."""
    return -(-seq_q // 32) * 32
