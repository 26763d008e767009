"""render_launch: torchrun / accelerate / deepspeed launches rendered, parsed back and checked; torchrun
commands parsed by the installed torch's own argument parser; the host checks (port, GPU count,
precision) against real sockets and stand-in GPU lists; contradictory input refused by field; and the
two tools through MCP and the `rgt` CLI."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys

import pytest
import yaml

from remote_gpu_trainer import cli
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.render import keys
from remote_gpu_trainer.render import launch as launch_module
from remote_gpu_trainer.render.gpus import LocalGpus, capability_of, parse_visible
from remote_gpu_trainer.render.launch import RenderLaunchInput, render_launch

from .conftest import call_error, call_ok, file_text


def render(**fields):
    fields.setdefault("script", "train.py")
    return render_launch(RenderLaunchInput(**fields))


def by_name(result) -> dict:
    return {c.name: c for c in result.checks}


@pytest.fixture
def no_local_gpu(monkeypatch):
    monkeypatch.setattr(launch_module, "local_gpus", lambda: LocalGpus("none", None, detail="no NVIDIA GPU here"))


@pytest.fixture
def four_a100(monkeypatch):
    gpus = LocalGpus("nvml", 4, ["NVIDIA A100-SXM4-80GB"] * 4, [(8, 0)] * 4, "NVML: 4 GPU(s)")
    monkeypatch.setattr(launch_module, "local_gpus", lambda: gpus)


# --------------------------------------------------------------------------------------- torchrun


@pytest.fixture(scope="module")
def torch_parser():
    from torch.distributed.run import get_args_parser

    return get_args_parser()


def parse_with_torch(parser, command: str):
    values = {"$NODE_RANK": "1", "$SLURM_NNODES": "2", "$RDZV_HOST": "10.0.0.1", "$SLURM_JOB_ID": "42"}
    for name, value in values.items():
        command = command.replace(name, value)
    argv = shlex.split(command)
    assert argv[0] == "torchrun"
    return parser.parse_args(argv[1:])


def test_our_torchrun_flag_list_matches_the_installed_torch(torch_parser):
    options = {s for a in torch_parser._actions for s in a.option_strings if s.startswith("--") and "_" not in s}
    assert options - {"--help"} == keys.TORCHRUN_FLAGS


@pytest.mark.parametrize(("fields", "expect"), [
    ({"nproc_per_node": 8}, {"standalone": True, "nproc_per_node": "8", "nnodes": "1:1"}),
    ({"nproc_per_node": 4, "port": 29601}, {"rdzv_backend": "c10d", "rdzv_endpoint": "localhost:29601"}),
    ({"nproc_per_node": 8, "nnodes": 2, "master_addr": "10.0.0.1", "max_restarts": 3, "join_timeout_s": 1800},
     {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "10.0.0.1:29400", "max_restarts": 3,
      "rdzv_conf": "join_timeout=1800"}),
    ({"nproc_per_node": 8, "nnodes": 2, "master_addr": "10.0.0.1", "rdzv_backend": "static"},
     {"master_addr": "10.0.0.1", "master_port": 29500, "node_rank": 1, "rdzv_backend": "static"}),
    ({"nproc_per_node": 8, "nnodes": 2, "scheduler": "slurm"},
     {"nnodes": "2", "rdzv_endpoint": "10.0.0.1:29400", "rdzv_id": "42"}),
])
def test_torchrun_commands_parse_with_torchs_own_parser(torch_parser, no_local_gpu, fields, expect):
    result = render(launcher="torchrun", script_args="--lr 3e-4 --name \"it's a test\"", **fields)
    parsed = parse_with_torch(torch_parser, result.command)
    for key, value in expect.items():
        assert getattr(parsed, key) == value, (key, result.command)
    assert parsed.training_script == "train.py"
    assert parsed.training_script_args == ["--lr", "3e-4", "--name", "it's a test"]
    checks = by_name(result)
    assert checks["launcher_flags"].verdict == "PASS" and checks["bash_syntax"].verdict == "PASS"
    assert checks["shellcheck"].verdict == "PASS", checks["shellcheck"].observed


def test_multi_node_c10d_renders_the_same_command_on_every_node(no_local_gpu):
    first = render(launcher="torchrun", nproc_per_node=8, nnodes=2, master_addr="10.0.0.1")
    second = render(launcher="torchrun", nproc_per_node=8, nnodes=2, master_addr="10.0.0.1")
    assert first.command == second.command and "--rdzv-id=train-" in first.command
    assert "$NODE_RANK" not in first.command  # c10d assigns ranks itself


def test_static_rendezvous_refuses_to_run_without_a_node_rank(tmp_path, no_local_gpu):
    result = render(launcher="torchrun", nproc_per_node=2, nnodes=2, master_addr="10.0.0.1", rdzv_backend="static")
    script = tmp_path / "launch.sh"
    script.write_text(file_text(result, "launch.sh"))
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode != 0 and "set NODE_RANK" in out.stderr
    bad = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "NODE_RANK": "5"})
    assert bad.returncode == 2 and "NODE_RANK must be 0..1" in bad.stderr


def test_slurm_script_has_one_task_per_node_and_forwards_usr1(no_local_gpu):
    result = render(launcher="torchrun", nproc_per_node=8, nnodes=4, scheduler="slurm", max_restarts=2)
    text = file_text(result, "launch.sbatch")
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --signal=B:USR1@180", "trap 'kill -USR1 \"$child\" 2>/dev/null' USR1"):
        assert line in text
    assert "srun torchrun" in text and by_name(result)["port_free"].verdict == "SKIP"


# ------------------------------------------------------------------------------------- accelerate


@pytest.mark.parametrize(("strategy", "distributed", "section"), [
    ("ddp", "MULTI_GPU", None), ("fsdp", "FSDP", "fsdp_config"), ("zero3", "DEEPSPEED", "deepspeed_config"),
])
def test_accelerate_config_uses_real_keys_per_distributed_type(no_local_gpu, strategy, distributed, section):
    result = render(launcher="accelerate", nproc_per_node=4, strategy=strategy, gpu="A100",
                    offload="optimizer_and_params" if strategy != "ddp" else "none")
    config = yaml.safe_load(file_text(result, "accelerate_config.yaml"))
    assert config["distributed_type"] == distributed and config["mixed_precision"] == "bf16"
    assert config["num_processes"] == 4 and config["main_process_port"] == 0
    assert set(config) <= keys.ACCELERATE_TOP_KEYS
    for other in ("fsdp_config", "deepspeed_config"):
        assert (other in config) == (other == section)
    if section == "fsdp_config":
        assert config[section]["fsdp_version"] == 2 and config[section]["fsdp_offload_params"] is True
        assert config[section]["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    if section == "deepspeed_config":
        assert config[section]["zero_stage"] == 3 and config[section]["offload_param_device"] == "cpu"
        assert set(config[section]) <= keys.ACCELERATE_DEEPSPEED_KEYS
    checks = by_name(result)
    assert checks["config_parses"].verdict == checks["config_keys"].verdict == "PASS"
    assert result.command.startswith('accelerate launch --config_file "$HERE/accelerate_config.yaml" train.py')


def test_accelerate_multi_node_counts_processes_across_machines(no_local_gpu):
    result = render(launcher="accelerate", nproc_per_node=8, nnodes=2, master_addr="10.0.0.1", rdzv_backend="static",
                    gpu="H100")
    config = yaml.safe_load(file_text(result, "accelerate_config.yaml"))
    assert config["num_processes"] == 16 and config["num_machines"] == 2  # accelerate's num_processes is the total
    assert config["main_process_ip"] == "10.0.0.1" and config["same_network"] is True
    assert '--machine_rank "$NODE_RANK"' in result.command


def test_single_process_accelerate_is_not_multi_gpu(no_local_gpu):
    config = yaml.safe_load(file_text(render(launcher="accelerate", nproc_per_node=1, gpu="A10"),
                                      "accelerate_config.yaml"))
    assert config["distributed_type"] == "NO"


# -------------------------------------------------------------------------------------- deepspeed


def test_deepspeed_json_batch_offload_and_precision(no_local_gpu):
    result = render(launcher="deepspeed", nproc_per_node=4, strategy="zero3", offload="optimizer_and_params",
                    micro_batch_size=2, gradient_accumulation_steps=8, gradient_clipping=1.0, gpu="A100",
                    gpus="0,1,2,3")
    config = json.loads(file_text(result, "ds_config.json"))
    assert config["train_batch_size"] == 2 * 8 * 4
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["bf16"] == {"enabled": True} and config["fp16"]["enabled"] is False
    assert set(config) <= keys.DEEPSPEED_TOP_KEYS and set(config["zero_optimization"]) <= keys.DEEPSPEED_ZERO_KEYS
    checks = by_name(result)
    assert checks["batch_sizes"].verdict == "PASS" and checks["batch_sizes"].observed == "64 = 2 x 8 x 4"
    assert "--include localhost:0,1,2,3" in result.command
    assert "export CUDA_VISIBLE_DEVICES" not in file_text(result, "launch.sh")  # deepspeed ignores it (DIST-09)
    assert result.command.endswith('--deepspeed_config "$HERE/ds_config.json"')


def test_deepspeed_auto_precision_follows_the_gpu(no_local_gpu):
    t4 = render(launcher="deepspeed", nproc_per_node=1, gpu="Tesla T4")
    config = json.loads(file_text(t4, "ds_config.json"))
    assert t4.precision == "fp16" and config["fp16"]["enabled"] is True and config["fp16"]["loss_scale"] == 0
    assert by_name(t4)["precision"].verdict == "PASS"


def test_deepspeed_for_the_hf_trainer_uses_auto(no_local_gpu):
    result = render(launcher="deepspeed", nproc_per_node=2, hf_trainer=True, gpu="H100")
    config = json.loads(file_text(result, "ds_config.json"))
    assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] == "auto"
    assert config["bf16"] == {"enabled": "auto"} and config["fp16"] == {"enabled": "auto"}
    assert by_name(result)["batch_sizes"].verdict == "SKIP"
    assert result.command.endswith('--deepspeed "$HERE/ds_config.json"')


def test_deepspeed_multi_node_uses_a_hostfile_and_no_ssh(no_local_gpu):
    result = render(launcher="deepspeed", nproc_per_node=8, nnodes=2, master_addr="10.0.0.1", gpu="H100")
    assert file_text(result, "hostfile") == "10.0.0.1 slots=8\nnode1 slots=8\n"
    assert '--no_ssh --node_rank "$NODE_RANK" --master_addr 10.0.0.1' in result.command
    assert json.loads(file_text(result, "ds_config.json"))["train_batch_size"] == 16


def test_extra_config_merges_and_is_key_checked(no_local_gpu):
    result = render(launcher="deepspeed", nproc_per_node=2, strategy="zero3",
                    extra_config={"zero_optimization": {"stage3_max_live_parameters": 100000000},
                                  "wall_clock_breakdown": True})
    config = json.loads(file_text(result, "ds_config.json"))
    assert config["zero_optimization"]["stage3_max_live_parameters"] == 100000000
    assert config["zero_optimization"]["stage"] == 3 and config["wall_clock_breakdown"] is True


def test_a_batch_that_does_not_multiply_out_fails_and_points_at_dist_29(no_local_gpu):
    result = render(launcher="deepspeed", nproc_per_node=4, micro_batch_size=2, extra_config={"train_batch_size": 100})
    check = by_name(result)["batch_sizes"]
    assert result.verdict == "FAIL" and check.verdict == "FAIL" and check.observed == "100 != 2 x 1 x 4"
    assert check.entry.id == "DIST-29"
    assert by_name(render(launcher="deepspeed", nproc_per_node=4))["batch_sizes"].entry is None


def test_extra_config_with_a_key_deepspeed_removed_is_refused_with_the_replacement(no_local_gpu):
    """DeepSpeed 0.19.8 refuses to start with these (tests/test_render_deepspeed_real.py shows it)."""
    with pytest.raises(InputError) as caught:
        render(launcher="deepspeed", nproc_per_node=1, extra_config={"amp": {"enabled": True}})
    assert caught.value.field == "extra_config" and "removed in DeepSpeed 0.19.8" in str(caught.value)
    assert "bf16" in str(caught.value)
    config = json.loads(file_text(render(launcher="deepspeed", nproc_per_node=1, extra_config={"compile": {}}),
                                  "ds_config.json"))
    assert config["compile"] == {}  # a current key the first key list missed


# --------------------------------------------------------------------------------- precision / GPUs


@pytest.mark.parametrize(("name", "cc"), [
    ("T4", (7, 5)), ("Tesla V100-SXM2-16GB", (7, 0)), ("NVIDIA A100-SXM4-80GB", (8, 0)), ("A10G", (8, 6)),
    ("NVIDIA H100 80GB HBM3", (9, 0)), ("GH200", (9, 0)), ("L40S", (8, 9)), ("NVIDIA GeForce RTX 4090", (8, 9)),
    ("NVIDIA RTX A6000", (8, 6)), ("NVIDIA RTX 6000 Ada Generation", (8, 9)), ("Quadro RTX 8000", (7, 5)),
    ("8.6", (8, 6)), ("sm_90", (9, 0)), ("B200", (10, 0)),
])
def test_compute_capability_by_model(name, cc):
    assert capability_of(name) == cc


def test_unknown_gpu_model_lists_the_known_ones():
    with pytest.raises(InputError) as caught:
        capability_of("Voodoo 3")
    assert caught.value.field == "gpu" and "A100" in caught.value.allowed


def test_bf16_on_a_pre_ampere_gpu_fails(no_local_gpu):
    result = render(launcher="accelerate", nproc_per_node=2, precision="bf16", gpu="V100")
    assert result.verdict == "FAIL" and by_name(result)["precision"].entry.id == "AMP-10"


def test_precision_without_any_gpu_information_is_unknown(no_local_gpu):
    result = render(launcher="accelerate", nproc_per_node=2)
    check = by_name(result)["precision"]
    assert check.verdict == "UNKNOWN" and "gpu=" in check.explanation and result.verdict == "UNKNOWN"


def test_detected_gpus_decide_precision_and_count(four_a100):
    fits = render(launcher="accelerate", nproc_per_node=4)
    assert fits.precision == "bf16" and by_name(fits)["gpu_count"].verdict == "PASS"
    assert by_name(fits)["precision"].observed.startswith("bf16 on compute capability 8.0 (detected here")
    too_many = render(launcher="torchrun", nproc_per_node=8)
    check = by_name(too_many)["gpu_count"]
    assert check.verdict == "FAIL" and check.entry.id == "DIST-05" and too_many.verdict == "FAIL"
    ordinal = render(launcher="torchrun", nproc_per_node=2, gpus="3,7")
    assert by_name(ordinal)["gpu_count"].verdict == "FAIL"


def test_no_gpu_here_is_skip_not_pass(no_local_gpu):
    check = by_name(render(launcher="torchrun", nproc_per_node=8))["gpu_count"]
    assert check.verdict == "SKIP" and "no NVIDIA GPU" in check.observed


def test_unconfirmed_cuda_visible_devices_is_unknown(monkeypatch):
    monkeypatch.setattr(launch_module, "local_gpus",
                        lambda: LocalGpus("cuda_visible_devices", 2, detail="NVML unavailable; names 2"))
    assert by_name(render(launcher="torchrun", nproc_per_node=2))["gpu_count"].verdict == "UNKNOWN"
    assert by_name(render(launcher="torchrun", nproc_per_node=4))["gpu_count"].verdict == "FAIL"


def test_check_host_false_skips_every_host_check(four_a100):
    result = render(launcher="torchrun", nproc_per_node=8, check_host=False, port=29500)
    checks = by_name(result)
    assert checks["gpu_count"].verdict == checks["port_free"].verdict == checks["precision"].verdict == "SKIP"


@pytest.mark.parametrize(("value", "physical", "uuids", "expect"), [
    ("0,1,7", 4, None, [0, 1]), ("2,0", 4, None, [2, 0]), ("", 4, None, []), ("1,1", 4, None, [1]),
    ("GPU-5b1e", 2, ["GPU-aaaa", "GPU-5b1e6c2a"], [1]), ("0,x,1", 4, None, [0]), ("0,1", None, None, 2),
    ("GPU-aaaa,3", None, None, 2),
])
def test_cuda_visible_devices_parsing_follows_cuda(value, physical, uuids, expect):
    assert parse_visible(value, uuids, physical) == expect


# ------------------------------------------------------------------------------------------ ports


def test_a_busy_port_fails_and_a_free_one_passes(no_local_gpu):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        result = render(launcher="deepspeed", nproc_per_node=1, port=busy)
        check = by_name(result)["port_free"]
        assert check.verdict == "FAIL" and f"Port {busy} is held" in check.observed and check.entry.id == "DIST-02"
    freed = by_name(render(launcher="deepspeed", nproc_per_node=1, port=busy))["port_free"]
    assert freed.verdict in ("PASS", "WARN") and "free" in freed.observed


def test_head_node_port_is_checked_only_on_the_head_node(no_local_gpu):
    check = by_name(render(launcher="torchrun", nproc_per_node=2, nnodes=2, master_addr="10.255.255.1"))["port_free"]
    assert check.verdict == "SKIP" and "another machine" in check.observed


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("fields", "field", "fragment"), [
    ({"launcher": "torchrun", "strategy": "fsdp"}, "strategy", "the script chooses"),
    ({"launcher": "deepspeed", "strategy": "fsdp"}, "strategy", "ZeRO"),
    ({"launcher": "accelerate", "offload": "optimizer"}, "offload", "needs ZeRO or FSDP"),
    ({"launcher": "accelerate", "strategy": "fsdp", "offload": "optimizer"}, "offload", "together"),
    ({"launcher": "deepspeed", "strategy": "zero2", "offload": "optimizer_and_params"}, "offload", "ZeRO-3"),
    ({"launcher": "torchrun", "nnodes": 2}, "master_addr", "needs the head node"),
    ({"launcher": "torchrun", "master_addr": "10.0.0.1"}, "master_addr", "multi-node"),
    ({"launcher": "torchrun", "nnodes": 2, "master_addr": "127.0.0.1"}, "master_addr", "loopback"),
    ({"launcher": "torchrun", "nnodes": 2, "master_addr": "localhost"}, "master_addr", "loopback"),
    ({"launcher": "torchrun", "nnodes": 2, "master_addr": "10.0.0.1", "node_rank": 1}, "node_rank", "c10d"),
    ({"launcher": "torchrun", "nnodes": 2, "master_addr": "10.0.0.1", "rdzv_backend": "static", "node_rank": 2},
     "node_rank", "below nnodes"),
    ({"launcher": "torchrun", "gpus": "0,1,2"}, "gpus", "nproc_per_node=2"),
    ({"launcher": "torchrun", "gpus": "0;reboot"}, "gpus", "CUDA_VISIBLE_DEVICES"),
    ({"launcher": "accelerate", "micro_batch_size": 4}, "micro_batch_size", "DeepSpeed JSON"),
    ({"launcher": "accelerate", "hf_trainer": True}, "hf_trainer", "deepspeed only"),
    ({"launcher": "accelerate", "scheduler": "slurm"}, "scheduler", "torchrun"),
    ({"launcher": "deepspeed", "train_batch_size": 5}, "train_batch_size", "DeepSpeed asserts"),
    ({"launcher": "deepspeed", "extra_config": {"zero_optimisation": {}}}, "extra_config", "not a deepspeed"),
    ({"launcher": "accelerate", "extra_config": {"fsdp_config": {"fsdp_versoin": 2}}}, "extra_config", "unknown"),
    ({"launcher": "accelerate", "strategy": "ddp", "extra_config": {"fsdp_config": {"fsdp_version": 2}}},
     "extra_config", "ignored unless distributed_type is FSDP"),
    ({"launcher": "deepspeed", "extra_config": {"bf16": {"enabled": True}, "fp16": {"enabled": True}}},
     "extra_config", "both enabled"),
    ({"launcher": "torchrun", "extra_config": {"x": 1}}, "extra_config", "no config file"),
    ({"launcher": "accelerate", "rdzv_id": "job"}, "rdzv_id", "torchrun"),
    ({"launcher": "torchrun", "rdzv_backend": "static"}, "rdzv_backend", "multi-node"),
    ({"launcher": "torchrun", "script_args": "--name 'unclosed"}, "script_args", "shell command line"),
    ({"launcher": "torchrun", "env": {"BAD-NAME": "1"}}, "env", "environment variable name"),
    ({"launcher": "torchrun", "gpu": "Voodoo 3"}, "gpu", "unknown GPU"),
    ({"launcher": "torchrun", "provider": "nowhere"}, "provider", "unknown provider"),
])
def test_contradictory_input_is_refused_by_field(no_local_gpu, fields, field, fragment):
    with pytest.raises(InputError) as caught:
        render(nproc_per_node=2, **fields)
    assert caught.value.field == field and fragment in str(caught.value), str(caught.value)


def test_provider_environment_is_exported(no_local_gpu):
    text = file_text(render(launcher="torchrun", nproc_per_node=1, provider="autodl", env={"WANDB_MODE": "offline"}),
                     "launch.sh")
    assert 'export HF_HOME="/root/autodl-tmp/.cache/huggingface"' in text
    assert 'export PIP_CACHE_DIR="/root/autodl-tmp/.cache/pip"' in text and "export WANDB_MODE=offline" in text


# ----------------------------------------------------------------------------------- MCP and CLI


@pytest.mark.anyio
async def test_render_launch_through_mcp(client, no_local_gpu):
    data = await call_ok(client, "render_launch", {"launcher": "torchrun", "nnodes": 2, "nproc_per_node": 8,
                                                   "script": "train.py", "master_addr": "10.0.0.1", "gpu": "H100"})
    assert data["verdict"] == "PASS" and data["world_size"] == 16
    assert [f["name"] for f in data["files"]] == ["launch.sh"]
    error = await call_error(client, "render_launch", {"launcher": "torchrun", "nnodes": 2, "nproc_per_node": 8,
                                                       "script": "train.py"})
    assert "master_addr" in error


@pytest.mark.anyio
async def test_render_template_through_mcp(client):
    data = await call_ok(client, "render_template", {"name": "run_one", "provider": "runpod",
                                                     "variables": {"run_name": "exp1", "command": "python train.py"}})
    assert data["verdict"] == "PASS" and data["file"]["name"] == "run_one-exp1.sh"
    assert data["variables"]["max_restarts"] == 0 and "/workspace" in data["file"]["text"]
    error = await call_error(client, "render_template", {"name": "run_one", "variables": {"run_name": "x"}})
    assert "missing required variable(s) command, run_dir" in error


def test_rgt_render_template_writes_a_runnable_script(tmp_path, capsys):
    code = cli.main(["render-template", "run_one", "--provider", "vast", "--variables",
                     json.dumps({"run_name": "exp1", "command": "python train.py"}), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    path = tmp_path / "run_one-exp1.sh"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0 and os.access(path, os.X_OK)
    assert path.read_text().splitlines()[0] == "#!/usr/bin/env bash" and out.startswith("PASS  run_one:")


def test_rgt_variables_that_are_not_json_are_said_plainly(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render-template", "run_one", "--variables", '{"run_name": x}'])
    assert exit_.value.code == 2
    assert "--variables: not valid JSON at char 13: Expecting value; example: --variables '{\"key\": 1}'" in \
        capsys.readouterr().err


def test_rgt_render_takes_script_args_as_one_shell_string(capsys, no_local_gpu):
    assert cli.main(["render", "--launcher", "torchrun", "--nproc-per-node", "2", "--script", "train.py",
                     "--script-args", "--lr 3e-4 --tag 'a b'", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["command"].endswith("train.py --lr 3e-4 --tag 'a b'")


def test_rgt_render_exit_codes(capsys, no_local_gpu):
    assert cli.main(["render", "--launcher", "accelerate", "--nproc-per-node", "2", "--script", "train.py",
                     "--gpu", "A100"]) == 0
    out = capsys.readouterr().out
    assert "  accelerate_config.yaml  (yaml, " in out and "  launch.sh  (bash, executable, " in out
    assert cli.main(["render", "--launcher", "accelerate", "--nproc-per-node", "2", "--script", "train.py",
                     "--gpu", "T4", "--precision", "bf16"]) == 1
    capsys.readouterr()
    assert cli.main(["render", "--launcher", "torchrun", "--nproc-per-node", "2", "--script", "train.py",
                     "--strategy", "fsdp"]) == 2
    assert "strategy" in capsys.readouterr().err


def test_rgt_render_json_output_is_machine_readable(capsys, no_local_gpu):
    assert cli.main(["render", "--launcher", "deepspeed", "--nproc-per-node", "2", "--script", "train.py", "--gpu",
                     "A100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert json.loads(next(f["text"] for f in data["files"] if f["name"] == "ds_config.json"))["train_batch_size"] == 2


def test_server_start_does_not_import_jinja2_or_yaml():
    code = ("import sys; sys.path.insert(0, 'tools'); import server; "
            "print([m for m in ('jinja2', 'yaml', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(launch_module.engine.skill_root()))
    assert out.stdout.strip() == "[]", out.stderr
