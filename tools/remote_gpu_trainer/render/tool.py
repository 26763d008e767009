"""The render_template and render_launch ToolSpecs (``rgt render-template``, ``rgt render``).

Both are read-only: they return the files and checks, and never write a file or start anything. The
agent saves ``files[].text`` on the box; a human uses ``rgt render ... --out DIR`` (:func:`write_files`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ..errors import InputError
from ..health.checks import Check
from ..models import EntryRef, StrictModel, Verdict, worst
from ..tables import format_table
from ..toolspec import Progress, ToolSpec, exit_1_on_fail
from .launch import RenderedFile, RenderLaunchInput, RenderLaunchResult, render_launch
from .templates import TEMPLATES, describe, render_script, shell_checks

TemplateName = Literal["run_one", "run_queue", "health_patrol"]


def _variables_help() -> str:
    return "; ".join(f"{name}: {', '.join(describe(t, has_profile=None))}" for name, t in TEMPLATES.items())


class RenderTemplateInput(StrictModel):
    name: TemplateName = Field(description="run_one (one detached, resumable run), run_queue (a job queue, one worker "
                               "per GPU set), health_patrol (a watcher for a run_one run)")
    provider: str | None = Field(None, description="Provider profile (runpod, lambda, autodl, vastai, paperspace, "
                                 "china, generic-ssh, local, or an alias): fills the durable directory, HF_HOME and "
                                 "the profile's environment. Without it, give run_dir / queue_dir")
    variables: dict[str, Any] = Field(default_factory=dict, description="The template's variables as an object. "
                                      + _variables_help() + ".")


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


def write_files(result: RenderTemplateResult | RenderLaunchResult, out_dir: Path | str) -> list[Path]:
    """Write every rendered file into ``out_dir`` (created if missing), executable ones with mode 0755.

    For ``rgt render ... --out DIR``: a DeepSpeed launch is launch.sh + ds_config.json + hostfile, and
    launch.sh finds its config files next to itself. File names come from the renderer, never from the
    caller, and must be plain names: nothing is written outside ``out_dir``.
    """
    directory = Path(out_dir)
    files = [result.file] if isinstance(result, RenderTemplateResult) else list(result.files)
    for f in files:
        if Path(f.name).name != f.name or f.name in ("", ".", ".."):
            raise InputError("out", f"refusing to write {f.name!r}: not a plain file name")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for f in files:
        path = directory / f.name
        path.write_text(f.text, encoding="utf-8")
        path.chmod(0o755 if f.executable else 0o644)
        written.append(path)
    return written


def run_render_launch(args: RenderLaunchInput, progress: Progress) -> RenderLaunchResult:
    progress(0, 2, "rendering")
    return render_launch(args)


def _check_table(checks: list[Check]) -> str:
    return format_table(["verdict", "check", "observed", "entry"],
                        [[c.verdict.value, c.name, c.observed[:90], c.entry.id if c.entry else ""] for c in checks])


def _file_line(f: RenderedFile) -> str:
    lines = f.text.count("\n") + (not f.text.endswith("\n"))
    return f"  {f.name}  ({f.language}{', executable' if f.executable else ''}, {len(f.text.encode()):,} bytes, " \
           f"{lines} lines)"


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _checks_line(checks: list[Check]) -> list[str]:
    """Passing checks on one line; anything else with what was observed, since that is what to act on."""
    passed = [c.name for c in checks if c.verdict in (Verdict.PASS, Verdict.SKIP)]
    lines = [f"checks: {len(passed)} passed ({', '.join(passed)})"] if passed else []
    lines += [f"  {c.verdict.value:7} {c.name}: {_short(c.observed, 200)}"
              + (f"  → {c.entry.file}#{c.entry.id}" if c.entry else "")
              for c in checks if c.verdict not in (Verdict.PASS, Verdict.SKIP)]
    return lines


def _files_hint(files: list[RenderedFile]) -> str:
    return ("the text of each file is in the structured result (files[].text / file.text); "
            "`--out DIR` writes " + ("them" if len(files) > 1 else "it") + " from the CLI")


def render_template_text(result: RenderTemplateResult) -> str:
    """What was rendered and whether it passed: the file's name and size, the variables, the checks,
    how to use it. The script itself is ``file.text`` (or ``rgt render-template ... --out DIR``)."""
    lines = [f"{result.verdict.value}  {result.summary}", "file:", _file_line(result.file),
             "variables: " + ", ".join(f"{k}={_short(v, 40)}" for k, v in result.variables.items()
                                       if v not in (None, {}, [], ""))]
    lines += _checks_line(result.checks)
    lines += [f"usage: {u}" for u in result.usage]
    lines.append(f"({_files_hint([result.file])})")
    return "\n".join(lines)


def render_launch_text(result: RenderLaunchResult) -> str:
    """The verdict, the command this node runs, the files with sizes and the checks; the file bodies
    are in ``files[].text`` (or ``rgt render ... --out DIR``)."""
    lines = [f"{result.verdict.value}  {result.summary}", f"command: {result.command}", "files:"]
    lines += [_file_line(f) for f in result.files]
    lines += _checks_line(result.checks)
    lines += [f"note: {n}" for n in result.notes]
    lines.append(f"({_files_hint(result.files)})")
    return "\n".join(lines)


SPECS = [
    ToolSpec(
        name="render_template",
        cli_write_files=write_files,
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
        cli_write_files=write_files,
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
