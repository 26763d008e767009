"""Model names people type, presets for the current open families, local config.json and the HF cache."""

from __future__ import annotations

import json

import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.memory.architecture import from_hf_config, load_architecture, presets
from remote_gpu_trainer.memory.tool import SPECS

SPEC = SPECS[0]


@pytest.mark.parametrize(("typed", "preset"), [
    ("Qwen2.5-7B", "qwen2.5-7b"), ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"), ("llama-3.1-70b", "llama-3.1-70b"),
    ("Llama-3.1-70B-Instruct", "llama-3.1-70b"), ("llama3-70b", "llama-3-70b"), ("LLAMA 3 70B", "llama-3-70b"),
    ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"), ("llama_3.2_1b", "llama-3.2-1b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"), ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"), ("openai/gpt-oss-20b", "gpt-oss-20b"),
    ("google/gemma-2-9b-it", "gemma-2-9b"), ("microsoft/phi-4", "phi-4"), ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
])
def test_hugging_face_ids_and_usual_spellings_name_a_preset(typed, preset):
    out = SPEC.call({"model": typed})
    assert out.num_params == load_architecture(preset).num_params
    assert out.model.startswith(typed)


def test_a_miss_suggests_the_nearest_names():
    with pytest.raises(InputError) as err:
        SPEC.call({"model": "qwen-2.5-7"})
    assert "did you mean" in str(err.value) and err.value.allowed[0] == "qwen2.5-7b"


FAMILIES = ["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
            *[f"qwen2.5-{s}" for s in ("0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b")],
            *[f"qwen3-{s}" for s in ("0.6b", "1.7b", "4b", "8b", "14b", "32b")], "qwen3-30b-a3b", "qwen3-235b-a22b",
            "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "gemma-3-1b",
            "gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "phi-3-mini", "phi-3-medium", "phi-4", "deepseek-v2",
            "deepseek-v2-lite", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b"]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_preset_rebuilds_to_its_published_size(name):
    """Rebuilt from config.json fields alone, each count lands within 1.5 % of the model card's figure
    (a wrong layout — a missing norm, bias or shared expert — moves it by more)."""
    cfg = presets()[name]
    arch = load_architecture(name)
    assert cfg["_source"].startswith("https://huggingface.co/") and cfg["_source"].endswith("/config.json")
    assert cfg["_checked"]
    published = cfg["_published"]["total"] if "_published" in cfg else cfg["_params"]
    assert arch.num_params == pytest.approx(published, rel=0.015)


MOE = {"mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9), "deepseek-v3": (671e9, 37e9),
       "deepseek-v2": (236e9, 21e9), "deepseek-v2-lite": (15.7e9, 2.4e9), "qwen3-30b-a3b": (30.5e9, 3.3e9),
       "qwen3-235b-a22b": (235e9, 22e9), "gpt-oss-20b": (20.9e9, 3.6e9), "gpt-oss-120b": (116.8e9, 5.1e9)}


@pytest.mark.parametrize("name", sorted(MOE))
def test_moe_total_and_active_parameters_match_published_figures(name):
    total, active = MOE[name]
    out = SPEC.call({"model": name})
    assert out.num_params == pytest.approx(total, rel=0.15)
    assert out.active_params == pytest.approx(active, rel=0.15)
    assert out.active_params < out.num_params / 3


def test_dense_models_report_active_params_too():
    out = SPEC.call({"model": "llama-3.1-8b"})
    assert out.active_params == out.num_params - 128256 * 4096  # the input embedding is a lookup


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "gemma-3-1b", "phi-3-mini",
                                  "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gpt-oss-20b"])
def test_a_local_config_json_file_folder_and_hf_cache_entry_read_like_the_preset(name, tmp_path, monkeypatch):
    cfg = {k: v for k, v in presets()[name].items() if not k.startswith("_")}
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    want = load_architecture(name).num_params
    assert load_architecture(str(folder)).num_params == want
    assert load_architecture(str(folder / "config.json")).num_params == want
    hub = tmp_path / "hub"
    snap = hub / "models--someorg--private-model" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))
    (hub / "models--someorg--private-model" / "refs").mkdir()
    (hub / "models--someorg--private-model" / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert load_architecture("someorg/private-model").num_params == want


def test_a_missing_hf_cache_entry_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(InputError) as err:
        load_architecture("someorg/not-downloaded")
    assert str(tmp_path) in str(err.value)


def test_gemma3_multimodal_config_reads_its_text_decoder():
    text = {k: v for k, v in presets()["gemma-3-12b"].items() if not k.startswith("_")}
    arch = from_hf_config({"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 1152}})
    assert arch.num_params == load_architecture("gemma-3-12b").num_params and arch.qk_norm


def test_deepseek_layout_has_mla_shared_experts_and_first_dense_layers():
    arch = load_architecture("deepseek-v3")
    names = {t.name for t in arch.tensors()}
    assert "model.layers.0.mlp.gate_proj.weight" in names  # first_k_dense_replace = 3
    assert "model.layers.2.mlp.experts.0.gate_proj.weight" not in names
    assert "model.layers.3.mlp.experts.255.down_proj.weight" in names
    assert "model.layers.3.mlp.shared_experts.gate_proj.weight" in names
    assert "model.layers.3.self_attn.kv_a_proj_with_mqa.weight" in names
    assert "model.layers.3.self_attn.q_a_layernorm.weight" in names
    assert arch.dense_layer_ids == (0, 1, 2)
