"""The render_template and render_launch ToolSpecs (``rgt render-template``, ``rgt render``).

Both are read-only: they return text and checks, and never write a file or start anything. The
agent (or the human, through ``rgt ... > file``) saves the text on the box.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..health.checks import Check
from ..models import EntryRef, StrictModel, Verdict, worst
from ..tables import format_table
from ..toolspec import Progress, ToolSpec, exit_1_on_fail
from .launch import RenderedFile, RenderLaunchInput, RenderLaunchResult, render_launch
from .templates import TEMPLATES, describe, render_script, shell_checks

TemplateName = Literal["run_one", "run_queue", "health_patrol"]


def _variables_help() -> str:
    return "; ".join(f"{name}: {', '.join(describe(t, has_profile=True))}" for name, t in TEMPLATES.items())


class RenderTemplateInput(StrictModel):
    name: TemplateName = Field(description="run_one (one detached, resumable run), run_queue (a job queue, one worker "
                               "per GPU set), health_patrol (a watcher for a run_one run)")
    provider: str | None = Field(None, description="Provider profile (runpod, lambda, autodl, vastai, paperspace, "
                                 "china, generic-ssh, local, or an alias): fills the durable directory, HF_HOME and "
                                 "the profile's environment. Without it, give run_dir / queue_dir")
    variables: dict[str, Any] = Field(default_factory=dict, description="The template's variables as an object. "
                                      + _variables_help() + ". (required without a provider: run_dir / queue_dir)")


class RenderTemplateResult(StrictModel):
    verdict: Verdict = Field(description="Worst check (bash -n, shellcheck): FAIL means do not use the text")
    name: str
    provider: str | None
    summary: str
    file: RenderedFile
    variables: dict[str, Any] = Field(description="Every variable as rendered, defaults filled in")
    checks: list[Check]
    usage: list[str]
    references: list[EntryRef]


def run_render_template(args: RenderTemplateInput, progress: Progress) -> RenderTemplateResult:
    template, values, text = render_script(args.name, args.variables, args.provider)
    progress(1, 2, "checking the rendered script")
    checks = shell_checks(text)
    verdict = worst([c.verdict for c in checks])
    file = RenderedFile(name=template.output_name(values), language="bash", executable=True, text=text)
    summary = f"{template.name}: {template.summary}; {verdict.value}"
    return RenderTemplateResult(verdict=verdict, name=template.name, provider=args.provider, summary=summary, file=file,
                                variables=values, checks=checks, usage=list(template.usage),
                                references=list(template.references))


def run_render_launch(args: RenderLaunchInput, progress: Progress) -> RenderLaunchResult:
    progress(0, 2, "rendering")
    return render_launch(args)


def _check_table(checks: list[Check]) -> str:
    return format_table(["verdict", "check", "observed", "entry"],
                        [[c.verdict.value, c.name, c.observed[:90], c.entry.id if c.entry else ""] for c in checks])


def render_template_text(result: RenderTemplateResult) -> str:
    """The script itself (so `rgt render-template ... > run_one.sh` works), then the checks as comments."""
    lines = [f"# rgt render-template: {result.verdict.value}"]
    lines += [f"#   {c.verdict.value:7} {c.name}: {c.observed}" for c in result.checks]
    lines += [f"#   usage: {u}" for u in result.usage]
    return result.file.text.rstrip("\n") + "\n\n" + "\n".join(lines)


def render_launch_text(result: RenderLaunchResult) -> str:
    parts = [f"{result.verdict.value}  {result.summary}", _check_table(result.checks)]
    parts += [f"note: {n}" for n in result.notes]
    for f in result.files:
        parts.append(f"==> {f.name} <==\n{f.text.rstrip()}")
    return "\n\n".join(parts)



SPECS = [
    ToolSpec(
        name="render_template",
        cli="render-template",
        title="Render a box-side launcher: run_one, run_queue or health_patrol",
        description=(
            "Render one of the skill's shell templates for the GPU box, filled from a provider profile: run_one "
            "(a detached, logged, resumable run with pidfile, exit-code file and heartbeat: start/status/stop), "
            "run_queue (a file-locked job queue, one worker per GPU set, free port and run directory per job) or "
            "health_patrol (a watcher that checks progress, not liveness, and never counts itself). Returns the "
            "script text plus bash -n / shellcheck results; save it on the box and run it there. Unknown, missing "
            "or malformed variables are an error that lists what the template accepts. Read-only: writes nothing, "
            "starts nothing. Variables: " + _variables_help() + "."
        ),
        input_model=RenderTemplateInput,
        output_model=RenderTemplateResult,
        run=run_render_template,
        read_only=True,
        render_text=render_template_text,
        exit_code=exit_1_on_fail,
        cli_positional="name",
    ),
    ToolSpec(
        name="render_launch",
        remote=True,
        cli="render",
        title="Render and check a torchrun / accelerate / deepspeed launch",
        description=(
            "Render the launch for a training script: torchrun (single node --standalone; multi-node c10d or static "
            "rendezvous; a Slurm sbatch script), accelerate (a config YAML for DDP, FSDP2 or DeepSpeed ZeRO with "
            "real Accelerate keys, plus the launch line) or deepspeed (a DeepSpeed JSON: ZeRO 1-3, CPU offload, "
            "bf16/fp16, consistent batch sizes; plus the launcher line). Returns launch.sh and the config files with "
            "checks: the config parses and uses only real keys, the batch arithmetic holds, every launcher flag "
            "exists, the script parses, and on this host the port is free, enough GPUs are visible and the "
            "precision suits the GPU generation (UNKNOWN/SKIP when this host cannot tell). Contradictory parameters "
            "are an error naming the field. Read-only: writes nothing, launches nothing. "
            "Exit status of `rgt render`: 0 no FAIL, 1 a check failed, 2 bad input."
        ),
        input_model=RenderLaunchInput,
        output_model=RenderLaunchResult,
        run=run_render_launch,
        read_only=True,
        render_text=render_launch_text,
        exit_code=exit_1_on_fail,
    ),
]
