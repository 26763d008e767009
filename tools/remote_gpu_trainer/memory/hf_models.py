"""The Hugging Face class a user trains, built from its config on the meta device for measured mode.

``AutoModelForCausalLM`` (GPT-2, Llama, Qwen, Mistral, Gemma, Phi, Mixtral, Qwen-MoE, DeepSeek,
GPT-OSS), ``AutoModelForSequenceClassification`` (BERT) or ``AutoModelForSeq2SeqLM`` (T5) from the
config dict — ``from_config`` allocates nothing under ``torch.device("meta")``, downloads nothing
and needs no network. Training follows what users run: ``model.train()``, ``use_cache=False``,
``labels`` passed so the model computes its own loss, ``gradient_checkpointing_enable()`` for
checkpointing, and PEFT's ``get_peft_model`` for LoRA. Imports torch and transformers: worker only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: ModuleList names that hold the transformer blocks (GPT-2 ``h``, decoders ``layers``, BERT ``layer``,
#: T5 ``block``).
BLOCK_LISTS = ("h", "layers", "layer", "block")


@dataclass
class HFModel:
    model: nn.Module
    blocks: list[nn.Module]
    class_name: str

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's own loss (``labels`` passed), as Trainer and most scripts compute it."""
        return self.model(**batch).loss


def batch(family: str, micro_batch: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Token ids and labels as a training step passes them (values do not matter to memory)."""
    ids = torch.zeros(micro_batch, seq_len, dtype=torch.long)
    if family == "bert":
        return {"input_ids": ids, "labels": torch.zeros(micro_batch, dtype=torch.long)}
    return {"input_ids": ids, "labels": ids.clone()}


def hf_config(config: dict[str, Any]):
    """A transformers config object from a ``config.json`` dict (Gemma 3 image-text: its text decoder)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("architectures",
                                                                                     "transformers_version")}
    model_type = fields.pop("model_type")
    if model_type == "gemma3" and isinstance(fields.get("text_config"), dict):
        fields = {**fields["text_config"], "tie_word_embeddings": fields.get("tie_word_embeddings", True)}
        fields.pop("model_type", None)
        model_type = "gemma3_text"
    cfg = AutoConfig.for_model(model_type, **fields)
    vocab = getattr(cfg, "vocab_size", None)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):  # a shrunk test vocabulary: ids are irrelevant
        value = getattr(cfg, name, None)
        if isinstance(vocab, int) and isinstance(value, int) and value >= vocab:
            setattr(cfg, name, None)
    if getattr(cfg, "is_encoder_decoder", False):  # labels are shifted right into decoder inputs: needs a start id
        for name in ("decoder_start_token_id", "pad_token_id"):
            if getattr(cfg, name, None) is None:
                setattr(cfg, name, 0)
    return cfg


def build(config: dict[str, Any], family: str, *, dtype: str, attention: str, checkpointing: bool,
          lora_rank: int | None = None, lora_targets: list[str] | None = None, device: str = "meta") -> HFModel:
    """The HF model in training configuration, built on ``device``: ``meta`` (nothing allocated, for the fake
    step) or ``cuda`` (weights initialised on the GPU, for ``bench/hf_memory_gpu.py``)."""
    import transformers

    cfg = hf_config(config)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    auto = {"bert": transformers.AutoModelForSequenceClassification,
            "t5": transformers.AutoModelForSeq2SeqLM}.get(family, transformers.AutoModelForCausalLM)
    with torch.device(device):
        model = auto.from_config(cfg, attn_implementation=attention, dtype=DTYPES[dtype])
    model.train()
    class_name = type(model).__name__
    if checkpointing:
        with warnings.catch_warnings():  # 5.2x renames it activation_checkpointing_enable; 5.1x has only this
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable()
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0,
                                                 target_modules=list(lora_targets or []), bias="none"))
        if checkpointing:  # PEFT's documented recipe: reentrant checkpointing needs inputs that require grad
            model.enable_input_require_grads()
        class_name = f"{class_name} + PEFT LoRA r={lora_rank}"
    blocks: list[nn.Module] = []
    lists: list[str] = []
    for name, module in model.named_modules():  # outermost block lists only (T5 blocks hold a ``layer`` list)
        if (isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in BLOCK_LISTS
                and not any(name.startswith(f"{outer}.") for outer in lists)):
            lists.append(name)
            blocks += list(module)
    return HFModel(model, blocks, class_name)


def materialize(hf: HFModel) -> None:
    """Inside ``FakeTensorMode``: storage for every parameter, tied weights tied again, training mode."""
    hf.model.to_empty(device="cpu")
    hf.model.tie_weights()  # to_empty gives each module its own tensor; re-tie lm_head to the embedding
    hf.model.train()
