"""Presets and config.json parsing: exact parameter counts, checked against real torch modules on meta."""

from __future__ import annotations

import json

import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.memory.architecture import from_hf_config, load_architecture, presets

PUBLISHED = {  # parameter counts of the HF classes named in presets.json
    "gpt2": 124_439_808, "gpt2-xl": 1_557_611_200, "bert-base-uncased": 109_483_778,
    "bert-large-uncased": 335_143_938, "t5-3b": 2_851_598_336, "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320, "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
}


def test_the_issue_presets_are_all_shipped():
    assert set(PUBLISHED) <= set(presets())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_count_is_exact(name):
    arch = load_architecture(name)
    assert arch.num_params == PUBLISHED[name] == presets()[name]["_params"]
    assert presets()[name]["_source"].startswith("https://huggingface.co/")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_torch_module_on_meta_has_exactly_the_listed_tensors(name):
    torch = pytest.importorskip("torch")
    from remote_gpu_trainer.memory.torch_models import build_model

    arch = load_architecture(name)
    with torch.device("meta"):
        model = build_model(arch)
    built = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert built == {t.name: t.shape for t in arch.tensors()}
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]


def test_bert_backbone_matches_the_published_bertmodel_count():
    arch = load_architecture("bert-base-uncased")
    head = sum(t.numel for t in arch.tensors() if t.name.startswith("classifier."))
    assert arch.num_params - head == 109_482_240  # BertModel with pooler


def test_tied_embeddings_are_counted_once_and_largest_layer_is_deepspeeds():
    gpt2 = load_architecture("gpt2")
    assert gpt2.tie_word_embeddings and not any(t.name.startswith("lm_head") for t in gpt2.tensors())
    assert gpt2.largest_layer_params() == 50257 * 768  # the embedding (and tied head) module
    llama = load_architecture("llama-2-7b")
    assert llama.largest_layer_params() == 32000 * 4096
    assert llama.unit_params()["model.layers.0"] == 202_383_360


def test_config_json_path_and_folder(tmp_path):
    cfg = dict(presets()["mistral-7b"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_architecture(str(tmp_path)).num_params == PUBLISHED["mistral-7b"]
    assert load_architecture(str(tmp_path / "config.json")).num_kv_heads == 8


def test_qwen2_has_qkv_bias_only():
    arch = from_hf_config({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "vocab_size": 100, "tie_word_embeddings": True})
    names = {t.name for t in arch.tensors()}
    assert "model.layers.0.self_attn.q_proj.bias" in names
    assert "model.layers.0.self_attn.o_proj.bias" not in names


def test_unknown_preset_and_model_type_list_what_is_allowed(tmp_path):
    with pytest.raises(InputError) as err:
        load_architecture("llama-9-9000b")
    assert err.value.field == "model" and "did you mean" in str(err.value)
    assert any(name.startswith("llama") for name in err.value.allowed)
    with pytest.raises(InputError) as err:
        load_architecture("zzzz")  # nothing near: every preset is listed
    assert "gpt2" in err.value.allowed and "llama-3-70b" in err.value.allowed
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(InputError) as err:
        load_architecture(str(tmp_path))
    assert "llama" in err.value.allowed and "mamba" in str(err.value)


def test_lora_target_matching_is_peft_style():
    gpt2 = load_architecture("gpt2")
    assert {lin.name for _, lin in gpt2.lora_linears(["c_proj"])} == {"attn.c_proj", "mlp.c_proj"}
    assert len(gpt2.lora_linears(["all-linear"])) == 4 * 12
    with pytest.raises(InputError) as err:
        gpt2.lora_linears(["q_proj"])
    assert err.value.field == "lora_targets" and "c_attn" in err.value.allowed
