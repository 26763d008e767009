"""Tiny models and a LoRA adapter in plain torch, so each repro reads like the user's training loop.

Imported only inside ``bug``/``fix`` (it imports torch). The models are small on purpose: every
failure here is about dtypes and scaler state, not size, so a repro costs milliseconds once torch
is loaded. ``LoRALinear`` follows peft's layout (frozen base, ``lora_A``/``lora_B``, B zero-init)
and its old default of creating adapters in the base weight's dtype (peft < 0.11, or
``autocast_adapter_dtype=False``), which is how fp16/bf16 adapters reach a GradScaler.
"""

from __future__ import annotations

import math

import torch
from torch import nn

IN, HIDDEN, OUT, BATCH = 16, 32, 4, 8


def seed() -> None:
    torch.manual_seed(0)


def mlp(device: str, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """A two-layer MLP, as ``from_pretrained(..., torch_dtype=dtype)`` would hand it over."""
    seed()
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)).to(device=device, dtype=dtype)


def batch(device: str, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, IN, generator=gen) * scale
    y = torch.randn(BATCH, OUT, generator=gen)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Loss in fp32 whatever the activation dtype, as HF models compute their loss."""
    return nn.functional.mse_loss(pred.float(), target.float())


class LoRALinear(nn.Module):
    """``base(x) + B(A(x)) * alpha / r`` with the base frozen; adapters take the base's dtype."""

    def __init__(self, base: nn.Linear, r: int = 4, alpha: int = 8, dtype: torch.dtype | None = None):
        super().__init__()
        self.base = base.requires_grad_(False)
        dtype = dtype or base.weight.dtype
        kwargs = {"device": base.weight.device, "dtype": dtype}
        self.lora_A = nn.Linear(base.in_features, r, bias=False, **kwargs)
        self.lora_B = nn.Linear(r, base.out_features, bias=False, **kwargs)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scaling


def add_lora(model: nn.Sequential, dtype: torch.dtype | None = None) -> nn.Sequential:
    """Freeze ``model`` and wrap every Linear in a LoRA adapter (like ``get_peft_model``), in place."""
    model.requires_grad_(False)
    for i, module in enumerate(model):
        if isinstance(module, nn.Linear):
            model[i] = LoRALinear(module, dtype=dtype)
    return model


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def scaler(device: str, **kwargs) -> torch.amp.GradScaler:
    """A GradScaler that is really enabled on ``device``.

    ``torch.amp.GradScaler()`` defaults to CUDA and disables itself (with a warning) on a machine
    without CUDA, which would silently hide every scaler bug on CPU, so the device is explicit.
    """
    return torch.amp.GradScaler(device, **kwargs)


def losses_summary(losses: list[float]) -> str:
    return f"loss {losses[0]:.4g} → {losses[-1]:.4g}" if losses else "no steps"
