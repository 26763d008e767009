"""fsdp_memory_estimate through MCP (both protocol modes) and `rgt mem`: outputs, fits, advice, bad input."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.memory.advice import REFS
from remote_gpu_trainer.memory.tool import SPECS
from remote_gpu_trainer.paths import skill_root

from .conftest import call_error, call_ok

SPEC = SPECS[0]


def call(**arguments):
    return SPEC.call(arguments)


@pytest.mark.anyio
async def test_mcp_tool_returns_bytes_and_a_verdict(client):
    out = await call_ok(client, "fsdp_memory_estimate", {"model": "llama-3-8b", "world_size": 7,
                                                          "strategy": "full_shard", "gpu_memory_gib": 79.3})
    assert out["num_params"] == 8_030_261_248 and out["shard_group"] == 7
    parts = ("params_bytes", "grads_bytes", "optimizer_bytes", "working_set_bytes")
    assert out["model_states_bytes"] == sum(out[k] for k in parts)
    assert out["total_bytes"] == out["allocated_peak_bytes"] + out["overhead_bytes"]
    assert out["allocated_peak_bytes"] == max(out["forward_backward_peak_bytes"], out["optimizer_step_peak_bytes"])
    assert out["fits"] is True and out["verdict"] == "PASS" and out["max_micro_batch_size"] >= 1


@pytest.mark.anyio
async def test_mcp_bad_input_is_a_tool_error_naming_field_and_allowed_values(client):
    text = await call_error(client, "fsdp_memory_estimate", {"model": "llama-9b", "world_size": 2})
    assert "model" in text and "llama-3-8b" in text
    text = await call_error(client, "fsdp_memory_estimate", {"model": "gpt2", "strategy": "zero4"})
    assert "strategy" in text and "full_shard" in text and "zero3" in text


@pytest.mark.parametrize(("arguments", "field", "allowed"), [
    ({"num_params": -5}, "num_params", None),
    ({"num_params": 10**9, "world_size": 0}, "world_size", None),
    ({"model": "gpt3"}, "model", "gpt2"),
    ({"model": "gpt2", "strategy": "fsdp"}, "strategy", "shard_grad_op"),
    ({"model": "gpt2", "precision": "int8"}, "precision", "bf16_mixed"),
    ({"model": "gpt2", "num_params": 5}, "model", None),
    ({}, "model", "num_params=<int>"),
    ({"model": "gpt2", "world_size": 12}, "world_size", None),
    ({"model": "gpt2", "world_size": 4, "gpus_per_node": 8}, "gpus_per_node", None),
    ({"model": "gpt2", "world_size": 2, "strategy": "ddp", "cpu_offload": "optimizer"}, "cpu_offload", "none"),
    ({"model": "gpt2", "world_size": 2, "cpu_offload": "optimizer"}, "cpu_offload", "params_and_optimizer"),
    ({"model": "gpt2", "world_size": 2, "strategy": "zero2", "cpu_offload": "params_and_optimizer"},
     "cpu_offload", "optimizer"),
    ({"model": "gpt2", "seq_len": 4096}, "seq_len", "1..1024"),
    ({"model": "llama-2-7b", "lora_rank": 8, "lora_targets": ["c_attn"]}, "lora_targets", "q_proj"),
    ({"num_params": 10**9, "lora_rank": 8}, "model", "llama-2-7b"),
    ({"model": "gpt2", "lora_targets": ["c_attn"]}, "lora_rank", None),
])
def test_bad_input_names_the_field_and_allowed_values(arguments, field, allowed):
    with pytest.raises(InputError) as err:
        call(**arguments)
    assert err.value.field == field or str(err.value).startswith(field)
    if allowed:
        assert allowed in str(err.value)


def test_measure_refuses_what_fake_tensors_cannot_run():
    with pytest.raises(InputError) as err:
        call(model="gpt2", strategy="zero3", world_size=2, measure=True)
    assert err.value.field == "strategy" and "full_shard" in err.value.allowed
    with pytest.raises(InputError) as err:
        call(model="gpt2", optimizer="adam8bit", measure=True)
    assert err.value.field == "optimizer" and "adamw" in err.value.allowed
    with pytest.raises(InputError) as err:
        call(num_params=10**9, measure=True)
    assert err.value.field == "measure"


def test_does_not_fit_gives_ordered_advice_with_savings_and_catalog_refs():
    out = call(model="llama-2-7b", world_size=2, strategy="ddp", precision="bf16_mixed", seq_len=4096,
               micro_batch_size=4, gpu_memory_gib=79.3)
    assert out.verdict == "FAIL" and out.fits is False and out.headroom_bytes < 0
    assert out.advice and all(a.saves_bytes > 0 for a in out.advice)
    # A cumulative plan: shard first (no extra compute), then checkpointing, until it fits.
    first = out.advice[0]
    assert "strategy=full_shard" in first.action and first.ref.id == "DIST-19" and first.fits_after is False
    assert [a.fits_after for a in out.advice][-1] is True
    totals = [out.total_bytes] + [a.total_after_bytes for a in out.advice]
    assert all(a > b for a, b in itertools.pairwise(totals))


def test_without_a_gpu_size_each_rung_is_shown_on_its_own():
    out = call(model="llama-2-7b", world_size=2, strategy="ddp", seq_len=4096)
    assert out.verdict == "UNKNOWN" and len(out.advice) >= 5
    assert all(a.total_after_bytes == out.total_bytes - a.saves_bytes for a in out.advice)


def test_every_catalog_reference_exists():
    for file, entry in REFS.values():
        text = (skill_root() / file).read_text(encoding="utf-8")
        assert re.search(rf"^### {re.escape(entry)} — ", text, re.M), f"{file}#{entry} missing"


def test_cli_prints_a_gib_table_and_json_prints_bytes(capsys):
    assert cli.main(["mem", "--model", "gpt2", "--world-size", "2", "--seq-len", "1024"]) == 0
    text = capsys.readouterr().out
    assert "per GPU" in text and "GiB" in text and "total per GPU (≈ nvidia-smi)" in text
    assert cli.main(["mem", "--model", "gpt2", "--world-size", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data["total_bytes"], int) and data["strategy"] == "full_shard"


def test_cli_exit_code_is_1_when_it_does_not_fit(capsys):
    assert cli.main(["mem", "--model", "llama-3-8b", "--strategy", "ddp", "--gpu-memory-gib", "24"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: does NOT fit" in out and "advice — a cumulative plan" in out
    assert cli.main(["mem", "--model", "llama-9b"]) == 2
    assert "did you mean llama" in capsys.readouterr().err


def test_zero3_output_prints_deepspeeds_own_table():
    out = call(model="t5-3b", world_size=8, strategy="zero3")
    assert out.deepspeed.exact
    assert "SW: Model with 2851M total params, 32M largest layer params." in out.deepspeed.printed
    assert out.deepspeed.matched_options == "offload_param=none, offload_optimizer=none, zero_init=1"
    # facts §10: a live t5-3b (2,851,598,336 params) prints slightly more than memory.rst's rounded 2851e6
    assert "  127.48GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=0" in out.deepspeed.printed


def _catalog_examples() -> list[str]:
    calls = []
    for path in sorted((skill_root() / "references").rglob("*.md")):
        calls += re.findall(r"`(fsdp_memory_estimate\([^`]*\))`", path.read_text(encoding="utf-8"))
    return [c for c in calls if c != "fsdp_memory_estimate(...)"]  # prose placeholders


def test_every_fsdp_memory_estimate_example_in_the_catalog_runs():
    """The catalog's **Tool:** lines are the contract agents copy: each must validate and run."""
    import ast

    examples = _catalog_examples()
    assert len(examples) >= 10
    for example in examples:
        call_node = ast.parse(example.replace("=true", "=True").replace("=false", "=False"), mode="eval").body
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in call_node.keywords}
        arguments["measure"] = False  # the measured variants are covered by test_memory_measured
        out = call(**arguments)
        assert out.total_bytes > out.allocated_peak_bytes > 0, example
