"""Rendered Accelerate configs, read by the real accelerate (pinned in the dev extra to the release
render/keys.py names), not by our own idea of it.

keys.py lists Accelerate's keys by hand because the MCP server must not import accelerate. These
tests keep that list honest: the sets must equal what the installed accelerate defines, and every
config render_launch writes must pass accelerate's own YAML loader (which raises on an unknown
top-level key) and ``accelerate launch``'s own validation, arriving at the environment the training
processes would get."""

from __future__ import annotations

import dataclasses
import shlex
from importlib import metadata

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from accelerate.utils.launch import prepare_multi_gpu_env

from remote_gpu_trainer.render import installed, keys
from remote_gpu_trainer.render.installed import accelerate_loads
from remote_gpu_trainer.render.launch import RenderLaunchInput, render_launch

from .conftest import file_text


def test_the_installed_accelerate_is_the_release_keys_py_was_read_from():
    assert metadata.version("accelerate") == keys.ACCELERATE_VERSION


def test_top_level_keys_equal_accelerates_config_fields():
    assert {f.name for f in dataclasses.fields(ClusterConfig)} == keys.ACCELERATE_TOP_KEYS


@pytest.mark.parametrize(("group", "ours"), [("FSDP Arguments", keys.ACCELERATE_FSDP_KEYS),
                                             ("DeepSpeed Arguments", keys.ACCELERATE_DEEPSPEED_KEYS)])
def test_nested_keys_equal_accelerates_launch_argument_groups(group, ours):
    groups = {g.title: g for g in launch_command_parser()._action_groups}
    assert ours == {action.dest for action in groups[group]._group_actions}


def test_launch_flags_and_distributed_types_exist_in_accelerate():
    flags = {o for a in launch_command_parser()._actions for o in a.option_strings if o.startswith("--")}
    assert flags >= keys.ACCELERATE_LAUNCH_FLAGS
    assert set(keys.ACCELERATE_DISTRIBUTED_TYPES) <= set(DistributedType.__members__)


def accelerate_launch(tmp_path, **fields):
    """Render, write the YAML, and run `accelerate launch`'s own parsing and validation on the rendered
    command line: what accelerate would hand to its process launcher."""
    fields.setdefault("nproc_per_node", 4)
    result = render_launch(RenderLaunchInput(launcher="accelerate", script="train.py", gpu="A100",
                                             check_host=False, **fields))
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(file_text(result, "accelerate_config.yaml"))
    argv = shlex.split(result.command.replace('"$HERE/accelerate_config.yaml"', str(path)))
    assert argv[:2] == ["accelerate", "launch"] and argv[-1] == "train.py"
    config = load_config_from_file(str(path))
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv[2:]))
    return config, args


def test_ddp_config_becomes_a_bf16_multi_gpu_launch(tmp_path):
    config, args = accelerate_launch(tmp_path, strategy="ddp", precision="bf16")
    assert config.distributed_type == DistributedType.MULTI_GPU and args.multi_gpu and args.num_processes == 4
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and "ACCELERATE_USE_FSDP" not in env


def test_fsdp_config_reaches_the_processes_as_fsdp2_with_our_wrap_class(tmp_path):
    _, args = accelerate_launch(tmp_path, strategy="fsdp", fsdp_transformer_layer="LlamaDecoderLayer")
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"
    assert env["FSDP_STATE_DICT_TYPE"] == "SHARDED_STATE_DICT"


@pytest.mark.parametrize(("strategy", "offload", "stage", "optimizer_device", "param_device"), [
    ("zero1", "none", 1, "none", "none"), ("zero2", "optimizer", 2, "cpu", "none"),
    ("zero3", "optimizer_and_params", 3, "cpu", "cpu")])
def test_zero_configs_become_deepspeed_launches(tmp_path, strategy, offload, stage, optimizer_device, param_device):
    config, args = accelerate_launch(tmp_path, strategy=strategy, offload=offload)
    assert config.distributed_type == DistributedType.DEEPSPEED and args.use_deepspeed
    assert (args.zero_stage, args.offload_optimizer_device or "none", args.offload_param_device or "none") == \
        (stage, optimizer_device, param_device)


def test_single_process_config_is_not_distributed(tmp_path):
    config, args = accelerate_launch(tmp_path, nproc_per_node=1)
    assert config.distributed_type == DistributedType.NO and args.num_processes == 1 and not args.multi_gpu


def test_multi_node_config_counts_all_processes_and_takes_the_nodes_rank(tmp_path):
    _, args = accelerate_launch(tmp_path, nnodes=2, master_addr="10.0.0.1", rdzv_backend="static", node_rank=1)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (8, 2, 1)
    assert (args.main_process_ip, args.main_process_port) == ("10.0.0.1", 29500)


def test_a_misspelt_nested_key_passes_accelerate_silently_so_we_refuse_it(tmp_path):
    """Why keys.py exists: accelerate validates top-level keys but copies fsdp_config keys onto its
    namespace unchecked, so a typo there launches fine and changes nothing."""
    accelerate_launch(tmp_path, strategy="fsdp")
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(path.read_text().replace("fsdp_offload_params: false", "fsdp_ofload_params: true"))
    argv = ["--config_file", str(path), "train.py"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    assert args.fsdp_ofload_params is True  # the typo rode along without a word
    assert prepare_multi_gpu_env(args)["FSDP_OFFLOAD_PARAMS"] == "false"  # and offload stayed off

    from remote_gpu_trainer.errors import InputError

    with pytest.raises(InputError) as caught:
        render_launch(RenderLaunchInput(launcher="accelerate", script="train.py", nproc_per_node=2, strategy="fsdp",
                                        check_host=False, extra_config={"fsdp_config": {"fsdp_ofload_params": True}}))
    assert "fsdp_ofload_params" in str(caught.value)


# ----------------------------------------------------------------- render_launch's accelerate_here check


def test_render_launch_loads_its_yaml_with_this_hosts_accelerate():
    result = render_launch(RenderLaunchInput(launcher="accelerate", script="train.py", nproc_per_node=2, gpu="A100",
                                             strategy="fsdp"))
    (check,) = [c for c in result.checks if c.name == "accelerate_here"]
    assert check.verdict == "PASS" and check.observed == f"accelerate {keys.ACCELERATE_VERSION} loads it as FSDP"


def test_a_key_this_hosts_accelerate_does_not_know_fails_with_its_own_message():
    """What a host with an older accelerate sees for a key added later, shown with a key 1.15 lacks."""
    check = accelerate_loads("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
                             "mixed_percision: bf16\n", check_host=True)
    assert check.verdict == "FAIL" and check.entry.id == "DIST-30"
    assert "had unknown keys (['mixed_percision'])" in check.observed and "/tmp" not in check.observed


def test_accelerate_here_skips_without_accelerate_or_without_host_checks(monkeypatch):
    assert accelerate_loads("distributed_type: NO\n", check_host=False).verdict == "SKIP"
    monkeypatch.setattr(installed.importlib.util, "find_spec", lambda name: None)
    check = accelerate_loads("distributed_type: NO\n", check_host=True)
    assert check.verdict == "SKIP" and check.observed == "accelerate is not installed here"
