"""The `rgt` CLI: generated from the same specs, same validation, tables by default, --json."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Literal

import pytest
from pydantic import Field

from remote_gpu_trainer import cli
from remote_gpu_trainer.models import StrictModel
from remote_gpu_trainer.toolspec import ToolSpec


class DemoInput(StrictModel):
    ports: list[int | str] = Field(description="ports or ranges")
    strategy: Literal["ddp", "zero3"] = Field("ddp", description="how to shard")
    dry_run: bool = Field(True, description="only report")
    world_size: int = Field(1, ge=1, description="GPUs")
    extra: dict[str, int] = Field(default_factory=dict, description="JSON object")


class DemoOutput(StrictModel):
    seen: DemoInput


DEMO = ToolSpec(name="demo", cli="demo", title="Demo", description="Demo.", input_model=DemoInput,
                output_model=DemoOutput, run=lambda a, p: DemoOutput(seen=a), read_only=True,
                cli_positional="ports", exit_code=lambda out: 0 if out.seen.dry_run else 1)


@pytest.fixture
def demo_cli(monkeypatch):
    monkeypatch.setattr(cli, "all_specs", lambda: [DEMO])


def _run_json(capsys, argv):
    rc = cli.main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_flags_are_generated_from_the_input_model(demo_cli, capsys):
    rc, data = _run_json(capsys, ["demo", "29500", "29501-29510", "--strategy", "zero3", "--no-dry-run",
                                  "--world-size", "7", "--extra", '{"a": 1}'])
    assert rc == 1  # exit_code hook
    assert data["seen"] == {"ports": ["29500", "29501-29510"], "strategy": "zero3", "dry_run": False,
                            "world_size": 7, "extra": {"a": 1}}


def test_underscore_flag_spelling_is_accepted(demo_cli, capsys):
    rc, data = _run_json(capsys, ["demo", "1", "--world_size", "2"])
    assert rc == 0 and data["seen"]["world_size"] == 2


def test_bad_choice_is_rejected_by_argparse(demo_cli, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "1", "--strategy", "fsdp9"])
    assert exc.value.code == 2
    assert "invalid choice: 'fsdp9'" in capsys.readouterr().err


def test_model_validation_error_exits_2_and_names_the_field(demo_cli, capsys):
    assert cli.main(["demo", "1", "--world-size", "0"]) == 2
    assert "world_size: Input should be greater than or equal to 1" in capsys.readouterr().err


def test_default_output_is_a_readable_view(demo_cli, capsys):
    assert cli.main(["demo", "1"]) == 0
    out = capsys.readouterr().out
    assert "strategy: ddp" in out and "{" not in out.splitlines()[0]


def test_rgt_console_script_runs_info():
    out = subprocess.run([sys.executable, "-m", "remote_gpu_trainer", "info", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["name"] == "remote-gpu-trainer"


class _ClosedPipe:
    """A stdout whose reader went away (`rgt ... | head`)."""

    def __init__(self, fd: int):
        self._fd = fd

    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._fd


def test_broken_pipe_exits_quietly_with_141(demo_cli, monkeypatch, tmp_path):
    import os

    fd = os.open(tmp_path / "sink", os.O_WRONLY | os.O_CREAT)
    monkeypatch.setattr(sys, "stdout", _ClosedPipe(fd))
    assert cli.main(["demo", "1"]) == 141


def test_file_input_keeps_carriage_returns_so_line_numbers_match_grep(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"step 1\rstep 2\rstep 3\nValueError: Attempting to unscale FP16 gradients.\n")
    assert cli._read_text(str(log)) == "step 1\rstep 2\rstep 3\nValueError: Attempting to unscale FP16 gradients.\n"


def test_cli_homes_name_the_module_of_every_command():
    """`rgt <word>` imports only registry.CLI_HOMES[word]: they must be the modules that define its commands."""
    from remote_gpu_trainer import registry

    words: dict[str, set[str]] = {}
    for spec in registry.all_specs():
        if not spec.internal:
            words.setdefault(spec.cli.split()[0], set()).add(registry.home_of(spec.name))
    assert {word: set(modules) for word, modules in registry.CLI_HOMES.items()} == words
    for word in registry.CLI_HOMES:
        fast = {s.cli for s in registry.cli_specs(word)}
        assert fast == {s.cli for s in registry.all_specs() if not s.internal and s.cli.split()[0] == word}


def test_a_command_other_than_health_does_not_import_the_health_daemon_client():
    """healthd (its socket protocol, codestamp) serves only `rgt health`: another command's start-up skips it."""
    code = ("import sys; from remote_gpu_trainer import cli; cli.build_parser(cli.cli_specs('diagnose')); "
            "print('remote_gpu_trainer.healthd' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
    code = ("import sys; from remote_gpu_trainer import cli; cli.build_parser(cli.cli_specs('health')); "
            "print('remote_gpu_trainer.healthd' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stdout + done.stderr  # --no-daemon's help comes from it


def test_one_command_imports_only_its_own_tool_module():
    code = ("import sys; from remote_gpu_trainer import cli; cli.build_parser(cli.cli_specs('health'))"
            ".parse_args(['health', '--help'])")
    done = subprocess.run([sys.executable, "-c", code + "\n"], capture_output=True, text=True, timeout=60)
    assert "--expect-gpus" in done.stdout
    code = ("import sys; from remote_gpu_trainer import cli; cli.build_parser(cli.cli_specs('health')); "
            "print(sorted(m for m in sys.modules if m.startswith('remote_gpu_trainer.') and m.endswith('tool')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "['remote_gpu_trainer.health.tool']", done.stdout + done.stderr
