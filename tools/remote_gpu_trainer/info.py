"""skill_info: what this skill is and which optional backends (NVML, torch, CUDA) can run here.

An agent calls it first to learn which checks are real on this machine. The torch it reports is the training
environment's (trainenv/find.py: ``python=``, ``activate=``, or found and named), not the skill runtime's. It stays
cheap by default: the interpreter is located and torch's version read from its metadata, without
``import torch`` (seconds); ``probe_torch=true`` imports torch there in a child process with a timeout, so the
server never pays for it. It also says when the launch environment's ``CUDA_VISIBLE_DEVICES`` hides GPUs that
NVML sees (on a box: the login shell's, which ``ssh box cmd`` never shows).
"""

from __future__ import annotations

import platform
from functools import cache
from typing import Literal

from pydantic import Field

from . import __version__
from .health.checks import Check
from .health.tool import launch_cuda_visible
from .hostinfo import in_container, is_box_runtime
from .models import StrictModel
from .nvml_session import nvml_status
from .paths import skill_markdown_files, skill_root
from .tables import format_table
from .toolspec import Progress, ToolSpec
from .torch_hint import no_training_torch
from .trainenv.find import ActivateText, PythonPath, TrainingEnv, activate_field, find_training_env, python_field
from .trainenv.login import read_login_env


class SkillInfoInput(StrictModel):
    probe_torch: bool = Field(
        False,
        description="Import torch in a child process to report whether CUDA is usable and which GPUs "
        "torch sees (takes seconds). Off by default: torch's version is read from package metadata.",
    )
    timeout_s: float = Field(60.0, ge=1, le=600, description="Time limit for the torch probe, seconds.")
    python: PythonPath = python_field()
    activate: ActivateText = activate_field()


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
    training_env: TrainingEnv = Field(description="The training interpreter the torch backend describes, how it "
                                      "was found and every candidate looked at")
    cuda_visible_devices: Check | None = Field(None, description="The launch environment's CUDA_VISIBLE_DEVICES "
                                               "against the GPUs NVML sees (None: not set)")


@cache
def _served_resource_count() -> int:
    """The server registers its resources once at start-up, so the served set is fixed for its life;
    walking and resolving every file again on each call cost ~0.8 ms."""
    return len(skill_markdown_files())


def _torch_backends(env: TrainingEnv, probed: bool) -> list[Backend]:
    if env.python is None or not env.has_torch:
        missing = (f"{no_training_torch(env)}. Without it repro_scaler_bug, amp_config_check confirm and measured "
                   "memory mode cannot run")
        return [Backend(name="torch", available=False, detail=missing),
                Backend(name="cuda", available=False, detail="needs torch")]
    version = env.torch or "?"
    build = version.split("+", 1)[1] if "+" in version else "default"
    where = f"{env.display} ({env.found_by}), build {build}"
    torch_backend = Backend(name="torch", available=True, version=version, detail=where)
    if not probed:
        guess = "CPU-only build" if build == "cpu" else "not probed (pass probe_torch=true)"
        return [torch_backend, Backend(name="cuda", available=False if build == "cpu" else None, detail=guess)]
    if "cuda" in env.errors or "probe" in env.errors or "torch" in env.errors:
        why = env.errors.get("torch") or env.errors.get("cuda") or env.errors.get("probe")
        return [torch_backend, Backend(name="cuda", available=None, detail=f"torch probe failed: {why}")]
    gpus = env.gpu_names
    detail = f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "torch.cuda.is_available() is False"
    return [torch_backend, Backend(name="cuda", available=bool(env.cuda_available), version=env.torch_cuda,
                                   detail=detail)]


def skill_info(args: SkillInfoInput, progress: Progress) -> SkillInfo:
    from .registry import all_specs  # the registry imports this module
    from .remote.runtime import runtime_version

    nvml = nvml_status()
    # On a box both the training env and CUDA_VISIBLE_DEVICES come from the login shell: start it once, not twice.
    login = read_login_env() if is_box_runtime() else None
    training = find_training_env(args.python, args.activate, mode="names" if args.probe_torch else "find",
                                 timeout_s=args.timeout_s, login=login)
    visible = None
    setting = launch_cuda_visible(login)
    if setting is not None:  # only then are the GPUs' count and UUIDs worth a health probe
        from .health.tool import HealthInput, probe_gpus
        from .trainenv.launch import cuda_visible_check

        gpus = probe_gpus(HealthInput(timeout_s=min(args.timeout_s, 30.0)), progress)
        visible = cuda_visible_check(setting, gpus.gpus_found, [g.uuid for g in gpus.gpus])
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
                  *_torch_backends(training, args.probe_torch)],
        tools=[s.name for s in all_specs() if not s.internal],  # what MCP lists; internal specs are building blocks
        resources=_served_resource_count(),
        training_env=training, cuda_visible_devices=visible,
    )


def render(info: SkillInfo) -> str:
    driver = f" · driver {info.driver} (CUDA {info.cuda_driver})" if info.driver else ""
    head = (f"{info.name} {info.runtime} · Python {info.python} · {info.platform}{driver}"
            f"{' · container' if info.in_container else ''}\nskill root: {info.skill_root}")
    rows = [[b.name, {True: "yes", False: "no", None: "?"}[b.available], b.version, b.detail] for b in info.backends]
    table = format_table(["backend", "available", "version", "detail"], rows)
    visible = info.cuda_visible_devices
    launch = f"\n{visible.verdict.value}: {visible.explanation}" if visible and visible.verdict.value != "PASS" else ""
    return (f"{head}\n\n{table}{launch}\n\ntools: {', '.join(info.tools)}\nresources: {info.resources} markdown "
            "files")


SPECS = [
    ToolSpec(
        name="skill_info",
        remote=True,
        cli="info",
        title="Skill info and available backends",
        description=(
            "Report the skill version and which optional backends work on this machine: NVML (GPU "
            "health, VRAM holders), torch and CUDA (AMP reproductions, measured memory). torch is the training "
            "environment's: python= or activate= as given, else found (launch script, login shell's PATH, "
            "~/venvs/*, conda, system python); training_env names the interpreter, how it was found and every "
            "candidate. Also says when the launch environment's CUDA_VISIBLE_DEVICES hides GPUs NVML sees. Call "
            "it first on a new machine to learn which checks will be real here."
        ),
        input_model=SkillInfoInput,
        output_model=SkillInfo,
        run=skill_info,
        read_only=True,
        render_text=render,
    )
]
