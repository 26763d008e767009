"""Project-level guarantees: light start-up, one test command, no unpinned CUDA torch in CI."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from .conftest import ROOT


def test_server_import_loads_no_heavy_modules():
    code = ("import sys; sys.path.insert(0, 'tools'); import server; "
            "heavy = [m for m in ('torch', 'pynvml', 'numpy', 'jinja2') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- test-command -->\s*```(?:bash|sh)\n(.+?)\n```", readme, re.S)
    assert match, "README must mark its test command with <!-- test-command -->"
    return match.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_test_command() in ci


def test_test_command_pins_the_local_cpu_torch():
    command = _readme_test_command()
    assert "torch==2.13.0" in command
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.split("[")[0].split(">")[0].split("=")[0].strip() == "torch" for d in deps)
