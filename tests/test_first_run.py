"""What a new user hits first: compact tool text, render files on disk, template and provider errors.

Each test here failed before its fix: the text content of a rendered template was the whole script,
a DeepSpeed launch printed every file body, `$HOME` in script_args vanished into quotes silently,
run_dir was listed optional in the schema, an unknown provider got no hint, and a repeated log
line was printed once per match.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from remote_gpu_trainer.diagnose import diagnose, render
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.providers import ProviderInfoInput, provider_info
from remote_gpu_trainer.render.launch import RenderLaunchInput, render_launch
from remote_gpu_trainer.render.tool import (
    RenderTemplateInput,
    render_launch_text,
    render_template_text,
    run_render_template,
    write_files,
)
from remote_gpu_trainer.toolspec import no_progress

from .test_diagnose_next_step import LOGS

DEEPSPEED = {"launcher": "deepspeed", "nproc_per_node": 8, "nnodes": 2, "script": "train.py", "strategy": "zero3",
             "master_addr": "10.0.0.1", "check_host": False}


@pytest.fixture(scope="module")
def template():
    args = RenderTemplateInput(name="run_one", provider="runpod",
                               variables={"run_name": "llama-sft", "command": "torchrun --nproc-per-node 8 train.py"})
    return run_render_template(args, no_progress)


def test_template_text_names_the_file_and_checks_not_the_script(template):
    text = render_template_text(template)
    assert len(text.encode()) < 2048 < len(template.file.text.encode())
    assert f"{template.file.name}  (bash, executable, {len(template.file.text.encode()):,} bytes" in text
    assert "#!/usr/bin/env bash" not in text and "checks: 2 passed (bash_syntax, shellcheck)" in text


def test_deepspeed_text_lists_three_files_and_write_files_writes_them(tmp_path):
    result = render_launch(RenderLaunchInput(**DEEPSPEED))
    text = render_launch_text(result)
    assert [f.name for f in result.files] == ["launch.sh", "ds_config.json", "hostfile"]
    assert all(f"  {f.name}  ({f.language}" in text for f in result.files)
    assert '"zero_optimization"' not in text and len(text.encode()) < 4096
    written = write_files(result, tmp_path / "out")
    assert [p.name for p in written] == ["launch.sh", "ds_config.json", "hostfile"]
    assert json.loads((tmp_path / "out" / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3
    assert os.stat(tmp_path / "out" / "launch.sh").st_mode & stat.S_IXUSR
    assert not os.stat(tmp_path / "out" / "hostfile").st_mode & stat.S_IXUSR


def test_write_files_writes_a_template_script(template, tmp_path):
    [path] = write_files(template, tmp_path)
    assert path.name == template.file.name and path.read_text() == template.file.text


def test_script_args_with_a_variable_say_it_is_not_expanded():
    result = render_launch(RenderLaunchInput(launcher="torchrun", nproc_per_node=1, script="train.py",
                                             script_args='--out "$HOME/x y" --lr 1', check_host=False))
    assert result.command.endswith("train.py --out '$HOME/x y' --lr 1")
    assert result.notes[0].startswith("script_args: '$HOME/x y' reach the script literally")
    plain = render_launch(RenderLaunchInput(launcher="torchrun", nproc_per_node=1, script="train.py",
                                            script_args="--lr 1", check_host=False))
    assert not any(n.startswith("script_args") for n in plain.notes)


def test_run_dir_is_described_as_required_without_a_provider():
    description = RenderTemplateInput.model_fields["variables"].description
    assert "run_dir (required without a provider)" in description
    assert "queue_dir (required without a provider)" in description
    with pytest.raises(InputError) as err:
        run_render_template(RenderTemplateInput(name="run_one", variables={"run_name": "x", "command": "y"}),
                            no_progress)
    assert "missing required variable(s) run_dir" in str(err.value) and "without a provider" in str(err.value)


def test_unknown_provider_suggests_generic_ssh_and_the_nearest_name():
    with pytest.raises(InputError) as err:
        provider_info(ProviderInfoInput(provider="runpodd"), no_progress)
    assert "did you mean runpod?" in str(err.value) and "'generic-ssh'" in str(err.value)
    with pytest.raises(InputError) as err:
        provider_info(ProviderInfoInput(provider="hetzner"), no_progress)
    assert "did you mean" not in str(err.value) and "use 'generic-ssh'" in str(err.value)


def test_diagnose_text_shows_a_line_several_entries_matched_once():
    out = diagnose((LOGS / "oom_rank3_cascade.log").read_text(), 5)
    text = render(out)
    line = out.matches[0].line.line_number
    assert [m.line.line_number for m in out.matches[:3]] == [line] * 3 == [out.first_error.line_number] * 3
    assert text.count("Tried to allocate 3.91 GiB") == 1  # OOM-01, -05, -06 and first_error share one line
    assert f"matched: line {line}, as #1" in text and f"first error: line {line} (#1 above)" in text
