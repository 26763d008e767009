"""Mixture of experts, parameter counts typed as text, the advice ladder's two modes, compact text, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.memory.architecture import load_architecture, presets
from remote_gpu_trainer.memory.tool import SPECS, exit_code
from remote_gpu_trainer.tables import GIB

SPEC = SPECS[0]


def call(**arguments):
    return SPEC.call(arguments)


# ---- num_params as people write it ----------------------------------------------------------------
@pytest.mark.parametrize(("typed", "count"), [
    (7_000_000_000, 7_000_000_000), (7e9, 7_000_000_000), ("7e9", 7_000_000_000), ("7B", 7_000_000_000),
    ("70b", 70_000_000_000), ("1.5M", 1_500_000), ("350k", 350_000), ("1.2T", 1_200_000_000_000),
    ("7_000_000", 7_000_000), ("8030261248", 8_030_261_248),
])
def test_num_params_accepts_suffixes_and_exponents(typed, count):
    assert call(num_params=typed).num_params == count


@pytest.mark.parametrize("typed", ["seven billion", "7X", "", "-5", "0", "1e20"])
def test_bad_num_params_names_the_field_with_examples(typed):
    with pytest.raises(InputError) as err:
        call(num_params=typed)
    assert err.value.field == "num_params" and "7B" in err.value.allowed


def test_cli_takes_num_params_with_a_suffix(capsys):
    from remote_gpu_trainer import cli

    assert cli.main(["mem", "--num-params", "7B", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_params"] == 7_000_000_000


# ---- mixture of experts ---------------------------------------------------------------------------
def test_fsdp_with_expert_parallelism_for_mixtral_and_deepseek_v3():
    """States follow the total count (every expert is trained), shard over all GPUs either way; expert
    parallelism shrinks what FSDP gathers per block to the local experts."""
    flat = call(model="mixtral-8x7b", world_size=8, ep=1, precision="bf16_mixed")
    ep = call(model="mixtral-8x7b", world_size=8, ep=8, precision="bf16_mixed")
    states = 16 * 46.7e9 / 8  # fp32 params + grads + Adam, sharded over 8
    for out in (flat, ep):
        assert out.params_bytes + out.grads_bytes + out.optimizer_bytes == pytest.approx(states, rel=0.15)
    assert ep.experts_per_gpu == 1 and flat.experts_per_gpu == 8
    assert ep.working_set_bytes < flat.working_set_bytes / 3
    assert any("Expert parallelism ep=8" in n.text for n in ep.notes)
    v3 = call(model="deepseek-v3", world_size=256, gpus_per_node=8, ep=64, activation_checkpointing=True)
    assert v3.num_params == pytest.approx(671e9, rel=0.15) and v3.active_params == pytest.approx(37e9, rel=0.15)
    assert v3.params_bytes + v3.grads_bytes + v3.optimizer_bytes == pytest.approx(16 * 671e9 / 256, rel=0.15)
    assert v3.experts_per_gpu == 4 and v3.total_bytes < 80 * GIB


def test_expert_parallelism_without_fsdp_divides_the_experts_only():
    dense_part = call(model="mixtral-8x7b", world_size=8, strategy="ddp", ep=1)
    split = call(model="mixtral-8x7b", world_size=8, strategy="ddp", ep=8)
    arch = load_architecture("mixtral-8x7b")
    experts = arch.routed_expert_params()
    saved = dense_part.params_bytes - split.params_bytes
    assert saved == pytest.approx(4 * experts * 7 / 8, rel=0.01)  # fp32 params: 7 of 8 experts leave each GPU


def test_capacity_factor_scales_expert_activations():
    base = dict(model="qwen3-30b-a3b", world_size=8, seq_len=4096)
    dropless = call(**base)
    one = call(**base, capacity_factor=1.0)
    loose = call(**base, capacity_factor=2.0)
    assert one.activations_bytes == pytest.approx(dropless.activations_bytes, rel=0.001)
    assert loose.activations_bytes > 1.5 * one.activations_bytes
    assert any("Capacity factor 2" in n.text for n in loose.notes)


@pytest.mark.parametrize(("arguments", "field"), [
    ({"model": "llama-3.1-8b", "world_size": 8, "ep": 8}, "ep"),
    ({"model": "llama-3.1-8b", "capacity_factor": 1.25}, "capacity_factor"),
    ({"model": "mixtral-8x7b", "world_size": 8, "ep": 3}, "ep"),
    ({"model": "mixtral-8x7b", "world_size": 4, "ep": 8}, "ep"),
])
def test_moe_arguments_are_checked(arguments, field):
    with pytest.raises(InputError) as err:
        call(**arguments)
    assert err.value.field == field


def test_every_moe_type_reads_from_a_local_config(tmp_path):
    small = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
    configs = {
        "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
        "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                      "shared_expert_intermediate_size": 64, "mlp_only_layers": [0]},
        "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16},
        "deepseek_v2": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                        "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 32,
                        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16},
        "deepseek_v3": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                        "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 48, "kv_lora_rank": 32,
                        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16},
        "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16},
    }
    for model_type, extra in configs.items():
        path = tmp_path / f"{model_type}.json"
        path.write_text(json.dumps({**small, "model_type": model_type, **extra}))
        out = call(model=str(path), world_size=2, ep=2, micro_batch_size=2, seq_len=64)
        assert out.experts_per_gpu == 2 and out.active_params < out.num_params, model_type
        assert out.activations_bytes > 0 and out.total_bytes > out.allocated_peak_bytes


def test_torch_modules_have_exactly_the_listed_tensors_for_the_new_families():
    torch = pytest.importorskip("torch")
    from remote_gpu_trainer.memory.torch_models import build_model

    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "gemma-2-2b", "gemma-3-1b", "phi-3-mini", "qwen3-0.6b",
                 "qwen2.5-0.5b", "llama-3.2-1b"):
        arch = load_architecture(name)
        with torch.device("meta"):
            model = build_model(arch)
        assert {n: tuple(p.shape) for n, p in model.named_parameters()} == {t.name: t.shape for t in arch.tensors()}


# ---- advice ladder: stacked or alternatives ----------------------------------------------------------
def test_advice_says_whether_rungs_stack_in_both_forms():
    alone = call(model="llama-3.1-8b")
    assert alone.advice_mode == "alternatives" and alone.fits is None
    assert "do not add up" in alone.advice_note and "gpu_memory_gib" in alone.advice_note
    text = SPEC.render_text(alone)
    assert "alternatives" in text and "No fits/does-not-fit line: no GPU size was given" in text
    plan = call(model="llama-3.1-8b", gpu_memory_gib=40)
    assert plan.advice_mode == "cumulative" and "cumulative plan" in SPEC.render_text(plan)
    fits = call(model="gpt2", gpu_memory_gib=79.3)
    assert fits.advice_mode == "none" and not fits.advice


def test_text_output_is_a_compact_summary():
    for arguments in ({"model": "deepseek-v3", "world_size": 256, "ep": 64, "gpu_memory_gib": 79.3},
                      {"model": "llama-3.1-8b"}, {"model": "t5-3b", "world_size": 8, "strategy": "zero3"},
                      {"num_params": "70B", "world_size": 8, "gpu_memory_gib": 79.3}):
        out = SPEC.call(arguments)
        size = len(SPEC.render_text(out).encode())
        assert 300 <= size <= 2200, (arguments, size)
        assert len(out.model_dump_json()) > size  # the full data stays in the structured result


def test_the_estimate_is_machine_facing():
    assert SPEC.remote is True
    assert "host" not in SPEC.input_model.model_fields and "host" not in SPEC.output_model.model_fields


# ---- measured mode without torch -------------------------------------------------------------------
def _no_torch_env(tmp_path) -> dict[str, str]:
    """A directory first on PYTHONPATH whose ``torch`` raises what a missing torch raises: the measurement child
    (the training interpreter, here this venv's python) really cannot import torch."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'torch\'")\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH"))
                                                         if p)}


def test_measure_without_torch_says_so_once_and_exits_with_the_environment_status(tmp_path):
    env = _no_torch_env(tmp_path)
    rgt = [sys.executable, "-m", "remote_gpu_trainer.cli", "mem", "--model", "gpt2", "--measure"]
    run = subprocess.run(rgt, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 4, run.stderr
    assert run.stdout.count("torch is not installed") == 1
    assert "pip install 'remote-gpu-trainer[torch]'" in run.stdout
    assert "ModuleNotFoundError" not in run.stdout + run.stderr
    run = subprocess.run([*rgt, "--json"], capture_output=True, text=True, timeout=120, env=env)
    data = json.loads(run.stdout)
    assert run.returncode == 4 and data["measured"] is None and "torch is not installed" in data["measured_skipped"]
    assert data["training_env"]["python"] == sys.executable  # it says which interpreter it tried
    assert data["total_bytes"] > 0  # the analytic estimate is still there


def test_exit_status_prefers_a_real_failure_over_a_skipped_measurement():
    out = call(model="llama-3.1-8b", gpu_memory_gib=10)
    assert exit_code(out) == 1
    assert exit_code(out.model_copy(update={"verdict": "UNKNOWN", "measured_skipped": "torch missing"})) == 4


def test_every_preset_has_a_source_and_says_how_it_was_checked():
    for name, cfg in presets().items():
        assert cfg["_source"].startswith("https://huggingface.co/") and cfg["_checked"], name
