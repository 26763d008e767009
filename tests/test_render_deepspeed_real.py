"""Rendered DeepSpeed configs and launch lines, read by the real DeepSpeed 0.19.8.

DeepSpeed is not a dependency and is not in the test command: PyPI has only its sdist, whose build
pulls a CUDA torch into pip's isolated build environment. So this module skips unless DeepSpeed is
importable; run it by hand in an environment that has it (CPU is enough):

    pip install torch==2.13.0 -e '.[dev]' && pip install --no-build-isolation deepspeed==0.19.8
    python -m pytest tests/test_render_deepspeed_real.py

What it holds keys.py to: the key sets equal what DeepSpeed's own pydantic models accept, the top
level covers every key DeepSpeedConfig looks up and none it rejects, and every ds_config.json
render_launch writes builds a DeepSpeedConfig for the world size it was rendered for."""

from __future__ import annotations

import argparse
import json
import shlex
from importlib import metadata

import pytest

deepspeed = pytest.importorskip("deepspeed")

from deepspeed.launcher import runner  # noqa: E402
from deepspeed.runtime import config as ds_config  # noqa: E402
from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config  # noqa: E402
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: E402
from deepspeed.runtime.zero.offload_config import (  # noqa: E402
    DeepSpeedZeroOffloadOptimizerConfig,
    DeepSpeedZeroOffloadParamConfig,
)

from remote_gpu_trainer.errors import InputError  # noqa: E402
from remote_gpu_trainer.render import keys  # noqa: E402
from remote_gpu_trainer.render.launch import RenderLaunchInput, render_launch  # noqa: E402

from .conftest import file_text  # noqa: E402

READ_ELSEWHERE = {"optimizer", "scheduler", "activation_checkpointing", "aio", "autotuning", "flops_profiler"}
"""Top-level sections other DeepSpeed modules read (or DeepSpeedConfig reads through .keys())."""


class LookupLog(dict):
    """A config dict that records every key DeepSpeed looks up (copy.copy keeps the class and log)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: set[str] = set()

    def _note(self, key):
        if isinstance(key, str):
            self.seen.add(key)

    def get(self, key, *default):
        self._note(key)
        return super().get(key, *default)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def accepted(model) -> set[str]:
    return {name for name, f in model.model_fields.items()} | {f.alias for f in model.model_fields.values() if f.alias}


def test_the_installed_deepspeed_is_the_release_keys_py_was_read_from():
    assert metadata.version("deepspeed") == keys.DEEPSPEED_VERSION


def test_top_level_keys_are_what_deepspeedconfig_reads_minus_what_it_rejects():
    config = LookupLog({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1})
    ds_config.DeepSpeedConfig(config)
    removed = set(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert set(keys.DEEPSPEED_REMOVED_KEYS) == removed
    assert config.seen - removed <= keys.DEEPSPEED_TOP_KEYS, sorted(config.seen - removed - keys.DEEPSPEED_TOP_KEYS)
    assert keys.DEEPSPEED_TOP_KEYS - config.seen <= READ_ELSEWHERE
    assert not keys.DEEPSPEED_TOP_KEYS & removed


@pytest.mark.parametrize(("path", "model"), [
    ("zero_optimization", DeepSpeedZeroConfig), ("zero_optimization.offload_param", DeepSpeedZeroOffloadParamConfig),
    ("zero_optimization.offload_optimizer", DeepSpeedZeroOffloadOptimizerConfig), ("fp16", DeepSpeedFP16Config),
    ("bf16", DeepSpeedBF16Config)])
def test_nested_keys_equal_deepspeeds_models(path, model):
    assert model.model_config.get("extra") == "forbid"  # a typo here fails at start-up, in DeepSpeed too
    assert keys.DEEPSPEED_NESTED[path] == accepted(model)


def test_launcher_flags_equal_the_deepspeed_launchers(monkeypatch):
    seen = {}
    parse = argparse.ArgumentParser.parse_args

    def keep_parser(self, args=None, namespace=None):
        seen["parser"] = self
        return parse(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", keep_parser)
    runner.parse_args(["train.py"])  # builds its parser inside
    flags = {o for a in seen["parser"]._actions for o in a.option_strings if o.startswith("--")}
    assert flags - {"--help"} == keys.DEEPSPEED_LAUNCH_FLAGS


class DataParallel:
    """The mpu DeepSpeedConfig asks for the data-parallel world size, so a 4-GPU config is checked as
    4 GPUs on this GPU-less machine."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def rendered_json(**fields) -> dict:
    fields.setdefault("gpu", "A100")
    result = render_launch(RenderLaunchInput(launcher="deepspeed", script="train.py", check_host=False, **fields))
    return json.loads(file_text(result, "ds_config.json"))


def deepspeed_reads(monkeypatch, data: dict, world: int):
    """DeepSpeedConfig built from ``data`` as on ``world`` data-parallel GPUs."""
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    return ds_config.DeepSpeedConfig(data, mpu=DataParallel(world))


@pytest.mark.parametrize(("strategy", "offload", "stage", "optimizer_device", "param_device"), [
    ("zero1", "none", 1, None, None), ("zero2", "optimizer", 2, "cpu", None),
    ("zero3", "optimizer_and_params", 3, "cpu", "cpu")])
def test_rendered_zero_configs_build_in_deepspeed(monkeypatch, strategy, offload, stage, optimizer_device,
                                                  param_device):
    data = rendered_json(nproc_per_node=4, strategy=strategy, offload=offload, micro_batch_size=2,
                         gradient_accumulation_steps=8, gradient_clipping=1.0)
    ds = deepspeed_reads(monkeypatch, data, 4)
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (64, 2, 8)
    assert ds.zero_config.stage == stage and ds.gradient_clipping == 1.0 and ds.bfloat16_config.enabled
    offloads = (ds.zero_config.offload_optimizer, ds.zero_config.offload_param)
    assert tuple(getattr(o.device, "value", o.device) if o else None for o in offloads) == \
        (optimizer_device, param_device)


def test_rendered_fp16_config_builds_with_dynamic_loss_scaling(monkeypatch):
    ds = deepspeed_reads(monkeypatch, rendered_json(nproc_per_node=1, gpu="Tesla T4"), 1)
    assert ds.float16_config.enabled and ds.float16_config.loss_scale == 0 and not ds.bfloat16_config.enabled


def test_a_world_size_other_than_the_rendered_one_fails_deepspeeds_batch_check(monkeypatch):
    """The check is live: the same JSON on 3 GPUs breaks DeepSpeed's own batch assertion."""
    data = rendered_json(nproc_per_node=4, micro_batch_size=2, gradient_accumulation_steps=8)
    with pytest.raises(AssertionError, match="Check batch related parameters"):
        deepspeed_reads(monkeypatch, data, 3)


def test_removed_keys_stop_deepspeed_and_we_refuse_them_first():
    with pytest.raises(ds_config.DeepSpeedConfigError, match="Apex AMP"):
        ds_config.DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "amp": {"enabled": True}})
    with pytest.raises(InputError) as caught:
        render_launch(RenderLaunchInput(launcher="deepspeed", script="train.py", nproc_per_node=1, check_host=False,
                                        extra_config={"amp": {"enabled": True}}))
    assert caught.value.field == "extra_config" and "removed in DeepSpeed 0.19.8" in str(caught.value)


def test_rendered_launch_lines_parse_with_the_deepspeed_launcher(monkeypatch):
    for fields in ({"nproc_per_node": 4, "gpus": "0,1,2,3"},
                   {"nproc_per_node": 8, "nnodes": 2, "master_addr": "10.0.0.1", "node_rank": 1}):
        result = render_launch(RenderLaunchInput(launcher="deepspeed", script="train.py", check_host=False, **fields))
        argv = shlex.split(result.command.replace('"$NODE_RANK"', "1").replace('"$HERE/', '"/tmp/'))
        assert argv[0] == "deepspeed"
        args = runner.parse_args(argv[1:])
        assert args.user_script == "train.py"
        assert args.user_args[-2:] == ["--deepspeed_config", "/tmp/ds_config.json"]
