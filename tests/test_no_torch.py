"""Without torch: the torch-backed tools say once how to add it, report SKIP / not_run and exit 4.

The CLI runs in a subprocess whose ``import torch`` really fails: a directory first on PYTHONPATH
holds a ``torch`` package that raises exactly what a missing torch raises. The repro worker inherits
that environment, so the whole no-torch path runs, not a simulation of its result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote_gpu_trainer.torch_hint import EXIT_ENVIRONMENT


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory) -> dict[str, str]:
    shadow = tmp_path_factory.mktemp("no-torch")
    (shadow / "torch").mkdir()
    (shadow / "torch" / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'torch\'")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shadow), env.get("PYTHONPATH")) if p)
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "No module named 'torch'" in check.stderr  # the shadow really hides torch
    return env


def rgt(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remote_gpu_trainer.cli", *argv], env=env, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parent)


def assert_says_how_to_add_torch_once(text: str) -> None:
    assert text.count("torch is not installed") == 1, text
    assert "pip install 'remote-gpu-trainer[torch]'" in text
    assert "https://download.pytorch.org/whl/cpu" in text
    assert "crashed" not in text and "torch None" not in text


def test_repro_all_without_torch_is_skip_with_exit_4(no_torch_env):
    done = rgt(no_torch_env, "repro", "all")
    assert done.returncode == EXIT_ENVIRONMENT, done.stdout + done.stderr
    assert done.stdout.startswith("SKIP")
    assert "7 variant(s) not run" in done.stdout
    assert_says_how_to_add_torch_once(done.stdout)


def test_repro_json_without_torch_marks_every_case_not_run(no_torch_env):
    done = rgt(no_torch_env, "repro", "all", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == EXIT_ENVIRONMENT
    assert report["verdict"] == "SKIP" and report["problems"] == 0 and report["torch_version"] is None
    assert {r["status"] for r in report["results"]} == {"not_run"}
    assert "pip install 'remote-gpu-trainer[torch]'" in report["torch_missing"]


def test_amp_check_confirm_without_torch_keeps_predictions_and_exits_4(no_torch_env):
    done = rgt(no_torch_env, "amp-check", "--precision", "fp16", "--model-dtype", "fp16", "--confirm")
    assert done.returncode == EXIT_ENVIRONMENT, done.stdout + done.stderr
    assert "Attempting to unscale FP16 gradients" in done.stdout  # the prediction needs no torch
    assert "confirm: SKIP — 1 variant(s) not run" in done.stdout
    assert_says_how_to_add_torch_once(done.stdout)


def test_amp_check_without_confirm_needs_no_torch(no_torch_env):
    done = rgt(no_torch_env, "amp-check", "--precision", "bf16")
    assert done.returncode == 0 and "torch is not installed" not in done.stdout
