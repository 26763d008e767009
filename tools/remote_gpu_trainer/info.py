"""skill_info: what this skill is and which optional backends (NVML, torch, CUDA) can run here.

An agent calls it first to learn which checks are real on this machine. It stays cheap by default:
torch's version comes from package metadata, not ``import torch`` (seconds); ``probe_torch=true``
imports torch in a child process with a timeout, so the server never pays for it.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from functools import cache
from importlib import metadata
from typing import Literal

from pydantic import Field

from . import __version__
from .hostinfo import in_container
from .models import StrictModel
from .nvml_session import nvml_status
from .paths import skill_markdown_files, skill_root
from .tables import format_table
from .toolspec import Progress, ToolSpec
from .torch_hint import INSTALL_HINT


class SkillInfoInput(StrictModel):
    probe_torch: bool = Field(
        False,
        description="Import torch in a child process to report whether CUDA is usable and which GPUs "
        "torch sees (takes seconds). Off by default: torch's version is read from package metadata.",
    )
    timeout_s: float = Field(60.0, ge=1, le=600, description="Time limit for the torch probe, seconds.")


class Backend(StrictModel):
    name: Literal["nvml", "torch", "cuda"]
    available: bool | None = Field(description="true/false, or null when not checked")
    version: str | None = None
    detail: str


class SkillInfo(StrictModel):
    name: str = "remote-gpu-trainer"
    version: str
    runtime: str = Field(description="The build: version plus a hash of the code (what `rgt box install` puts on a "
                         "box; a box with another build is reported as a version mismatch)")
    python: str
    platform: str
    in_container: bool
    skill_root: str
    driver: str | None = Field(None, description="NVIDIA driver version, when NVML loads")
    cuda_driver: str | None = Field(None, description="Highest CUDA version the driver supports")
    backends: list[Backend]
    tools: list[str]
    resources: int = Field(description="Markdown files served as skill:// resources")


@cache
def _installed_torch_version() -> str | None:
    """Read once per process: a metadata scan costs ~0.6 ms, and a server restart sees a new install."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


@cache
def _served_resource_count() -> int:
    """The server registers its resources once at start-up, so the served set is fixed for its life;
    walking and resolving every file again on each call cost ~0.8 ms."""
    return len(skill_markdown_files())


def _torch_backends(probe: bool, timeout_s: float) -> list[Backend]:
    version = _installed_torch_version()
    if version is None:
        missing = ("torch is not installed: repro_scaler_bug, amp_config_check confirm and measured memory mode "
                   f"are unavailable; {INSTALL_HINT}")
        return [Backend(name="torch", available=False, detail=missing),
                Backend(name="cuda", available=False, detail="needs torch")]
    build = version.split("+", 1)[1] if "+" in version else "default"
    torch_backend = Backend(name="torch", available=True, version=version, detail=f"build {build}")
    if not probe:
        guess = "CPU-only build" if build == "cpu" else "not probed (pass probe_torch=true)"
        return [torch_backend, Backend(name="cuda", available=False if build == "cpu" else None, detail=guess)]
    code = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'cuda': c, "
            "'cuda_version': torch.version.cuda, 'gpus': [torch.cuda.get_device_name(i) for i in "
            "range(torch.cuda.device_count())] if c else []}))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
        probe_result = json.loads(out.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return [torch_backend, Backend(name="cuda", available=None, detail=f"torch probe timed out ({timeout_s:g} s)")]
    except (ValueError, IndexError):
        return [torch_backend, Backend(name="cuda", available=None, detail=f"torch probe failed: {out.stderr[-300:]}")]
    gpus = probe_result["gpus"]
    detail = f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "torch.cuda.is_available() is False"
    return [torch_backend, Backend(name="cuda", available=probe_result["cuda"],
                                   version=probe_result["cuda_version"], detail=detail)]


def skill_info(args: SkillInfoInput, progress: Progress) -> SkillInfo:
    from .registry import all_specs  # the registry imports this module
    from .remote.runtime import runtime_version

    nvml = nvml_status()
    return SkillInfo(
        version=__version__,
        runtime=runtime_version(),
        driver=nvml.driver_version,
        cuda_driver=nvml.cuda_driver_version,
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.release()} {platform.machine()}",
        in_container=in_container(),
        skill_root=str(skill_root()),
        backends=[Backend(name="nvml", available=nvml.ok, version=nvml.nvml_version, detail=nvml.detail),
                  *_torch_backends(args.probe_torch, args.timeout_s)],
        tools=[s.name for s in all_specs() if not s.internal],  # what MCP lists; internal specs are building blocks
        resources=_served_resource_count(),
    )


def render(info: SkillInfo) -> str:
    driver = f" · driver {info.driver} (CUDA {info.cuda_driver})" if info.driver else ""
    head = (f"{info.name} {info.runtime} · Python {info.python} · {info.platform}{driver}"
            f"{' · container' if info.in_container else ''}\nskill root: {info.skill_root}")
    rows = [[b.name, {True: "yes", False: "no", None: "?"}[b.available], b.version, b.detail] for b in info.backends]
    table = format_table(["backend", "available", "version", "detail"], rows)
    return f"{head}\n\n{table}\n\ntools: {', '.join(info.tools)}\nresources: {info.resources} markdown files"


SPECS = [
    ToolSpec(
        name="skill_info",
        remote=True,
        cli="info",
        title="Skill info and available backends",
        description=(
            "Report the skill version and which optional backends work on this machine: NVML (GPU "
            "health, VRAM holders), torch and CUDA (AMP reproductions, measured memory). Call it first "
            "on a new machine to learn which checks will be real here."
        ),
        input_model=SkillInfoInput,
        output_model=SkillInfo,
        run=skill_info,
        read_only=True,
        render_text=render,
    )
]
