"""The run tools: ``run_start``, ``run_status``, ``run_logs``, ``run_stop``, ``run_list``, ``run_adopt``
(``rgt run ...``).

All are machine-facing (``remote=True``): with a ``host`` they run on that box over ssh, and all
they look at is the box they run on. The run itself lives in a run directory on the box
(``ledger.py``) watched by a detached supervisor (``supervisor.py``), so it survives the ssh
connection, the MCP server and the agent; these tools only read that directory and the process
table, or (run_stop) signal the run's processes through the same safe-kill machinery as
``kill_port_holders``.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ..errors import InputError
from ..models import EntryRef, StrictModel
from ..notify import HELP as NOTIFY_HELP
from ..notify import NotifyCommand
from ..processes.safekill import KillReport, printable, safe_kill, target_table, whole_command
from ..processes.snapshot import ZOMBIE, read_start_ticks, snapshot
from ..tables import format_table, gib
from ..toolspec import Progress, ToolSpec, cli_host_args
from ..trainenv.find import ActivateText, PythonPath, TrainingEnv, activate_field
from . import start as starting
from .adopt import absolute_logs, resolve
from .checkpoints import CheckpointOutlook, checkpoint_outlook
from .gpu import GpuReading, GpuUse, default_backend, run_gpu_use
from .hang import HangSummary, hang_summary
from .ledger import EXIT, RUN_ID_PATTERN, STOP, RunDir, list_runs, run_dir, write_json
from .members import live_members
from .placement import Placement, gpu_placement, placement_text, ranks_of
from .progress import Progress as TrainingProgress
from .progress import progress_of, read_tail
from .states import ENDED, State, classify, signal_name
from .watch import files_of_processes, followed, last_changes, recorded_files


def _run_id_field() -> Any:
    return Field(pattern=RUN_ID_PATTERN, max_length=96, description="The run_id that run_start returned")


Check = Literal["port", "gpus", "disk"]

PidField = Annotated[int | None, Field(ge=1, le=4194304, description="A process started by hand (torchrun, python "
                                       "train.py): it and its descendants; its log is found from the files it writes")]
PatternField = Annotated[str | None, Field(min_length=2, max_length=200, description="A regular expression matched "
                                           "against command lines, e.g. 'train.py --config big' (one job must match, "
                                           "and the result shows the pids it resolved to; never used to stop "
                                           "anything)")]
LogsField = Annotated[list[str] | None, Field(min_length=1, max_length=16, description="Log files of a run started "
                                              "by hand (absolute, ~ or relative to the home directory); alone they "
                                              "find the process writing them, or say it has ended")]
WatchField = Annotated[list[str] | None, Field(min_length=1, max_length=32, description="Files or globs (relative to "
                                               "the run's working directory) where it writes its progress, e.g. "
                                               "['runs/*/train.log']; files its processes hold open for writing are "
                                               "followed too")]
CheckpointDirField = Annotated[str | None, Field(min_length=1, max_length=4096, description="Where the run saves "
                                                 "checkpoints (relative to its working directory): run_status and "
                                                 "box_idle then say whether the night's saves fit (space, inodes, "
                                                 "tmpfs, the provider's volume, integrity)")]
SaveEveryField = Annotated[int | None, Field(ge=1, le=10**9, description="The save interval in steps (default: read "
                                             "from the step numbers of its checkpoints)")]
KeepLastField = Annotated[int | None, Field(ge=1, le=10**6, description="How many checkpoints the run keeps (HF "
                                            "save_total_limit); default: all are kept, the worst case")]


# ================================================================== run_start


class RunStartInput(StrictModel):
    argv: list[str] | None = Field(None, min_length=1, max_length=4096, description="The command as a list of "
                                   "words, e.g. ['torchrun', '--nproc-per-node=8', 'train.py']. Never run through "
                                   "a shell. Give argv or command. CLI: the words after `--`.")
    command: str | None = Field(None, min_length=1, max_length=65536, description="The command line as "
                                "render_launch printed it; split like a shell would (quotes, leading NAME=value "
                                "assignments become env) but never run by one: pipes, &&, redirections and $(...) "
                                "are refused. Give argv or command.")
    cwd: str | None = Field(None, min_length=1, max_length=4096, description="Working directory on the box "
                            "(default: the home directory)")
    env: dict[str, str] | None = Field(None, max_length=256, description="Extra environment variables for the run, "
                                       "e.g. {'CUDA_VISIBLE_DEVICES': '0,1', 'NCCL_DEBUG': 'WARN'}")
    name: str | None = Field(None, min_length=1, max_length=40, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                             description="A short label, part of the run_id")
    notify: NotifyCommand | None = Field(None, min_length=1, max_length=64, description=NOTIFY_HELP + ". The "
                                         "supervisor runs it once when the run ends, fails, is OOM-killed or stalls, "
                                         "with RGT_RUN_ID, RGT_RUN_STATE, RGT_RUN_DIAGNOSIS and RGT_RUN_DIR set too")
    gpus: list[int] | None = Field(None, max_length=1024, description="GPU indices the run uses (default: "
                                   "CUDA_VISIBLE_DEVICES from env, else all); checked for other VRAM holders")
    allow_shared_gpus: bool = Field(False, description="Start even when another process or another of our runs "
                                    "holds those GPUs")
    port: int | None = Field(None, ge=1, le=65535, description="Rendezvous port to check is free (default: from "
                             "--master-port/--master_port/--rdzv-endpoint/MASTER_PORT; 29500 for torchrun)")
    stall_after_s: float = Field(900.0, ge=1, le=7 * 86400, description="No change in any progress file (its log, "
                                 "the watch files, files it writes) for this long, with stacks that do not move, "
                                 "counts as stalled; GPU load is not used (a hung collective spins at 100 %)")
    watch: WatchField = None
    checkpoint_dir: CheckpointDirField = None
    save_every_steps: SaveEveryField = None
    keep_last: KeepLastField = None
    skip_checks: list[Check] = Field(default_factory=list, description="Quick checks not to run: port, gpus, disk")
    min_free_disk_gib: float = Field(1.0, ge=0, le=100000, description="Free space needed on cwd and the runs "
                                     "directory")
    flight_recorder: bool = Field(False, description="Switch on torch's flight recorder (TORCH_FR_BUFFER_SIZE=2000) "
                                  "with dumps in the run folder, so a stall or a collective timeout reports "
                                  "mismatched collectives (sequence numbers, sizes, ranks that never entered)")
    rank_hook: bool = Field(True, description="Put the rank hook (a sitecustomize.py that chains to yours) on the "
                            "run's PYTHONPATH so run_stacks can read every rank's stack with a signal instead of "
                            "ptrace; false leaves the environment untouched")
    python: PythonPath = Field(None, min_length=1, max_length=4096, description=(
        "The training environment's interpreter (absolute or ~ path): its bin/ goes first on the run's PATH, so "
        "python, torchrun, accelerate resolve there (VIRTUAL_ENV/CONDA_PREFIX set). Default on a box: found "
        "(argv's interpreter or launch script, the login shell's PATH, ~/venvs/*, conda envs), since a non-"
        "interactive ssh session's PATH is not the user's; run locally: this shell's PATH, unchanged"))
    activate: ActivateText = activate_field()

    @model_validator(mode="after")
    def _one_command(self) -> RunStartInput:
        if (self.argv is None) == (self.command is None):
            raise ValueError("give exactly one of argv (a list of words) or command (a command line)")
        return self


class CheckRow(StrictModel):
    check: str
    result: str


class RunStarted(StrictModel):
    run_id: str
    state: State
    detail: str
    pid: int | None = Field(description="Training process (its process group id is the same)")
    argv: list[str]
    cwd: str
    env_added: list[str] = Field(description="Names of the variables added (values are in meta.json, mode 0600)")
    gpus: list[int] | None
    port: int | None
    checks: list[CheckRow]
    run_dir: str
    log: str
    next_step: str
    training_env: TrainingEnv | None = Field(None, description="The environment the run was started in (its "
                                             "activation is on the run's PATH), how it was found; None: this "
                                             "shell's environment, unchanged")


def run_start(args: RunStartInput, progress: Progress) -> RunStarted:
    env = dict(args.env or {})
    if args.command is not None:
        argv, assigned = starting.split_command(args.command)
        env = {**assigned, **env}
    else:
        argv = list(args.argv or [])
    if not argv[0]:
        raise InputError("argv", "the first word (the program) is empty")
    starting.check_env(env)
    cwd = Path(os.path.abspath(os.path.expanduser(args.cwd or "~")))  # relative: to the home the runtime starts in
    if not cwd.is_dir():
        raise InputError("cwd", f"{cwd} is not a directory on this box")
    training = starting.training_env(args.python, args.activate, argv, cwd)
    gpus = sorted(set(args.gpus)) if args.gpus is not None else starting.gpus_from_env(env)
    port = args.port if args.port is not None else starting.rendezvous_port(argv, env)
    progress(0, 3, "quick checks")
    checks = {}
    if "port" not in args.skip_checks:
        checks["port"] = starting.check_port(port)
    if "gpus" not in args.skip_checks:
        checks["gpus"] = starting.check_gpus(gpus, args.allow_shared_gpus)
    if "disk" not in args.skip_checks:
        root = starting.runs_root()
        root.mkdir(parents=True, exist_ok=True)
        checks["disk"] = starting.check_disk([cwd, root], args.min_free_disk_gib)
    progress(1, 3, "starting the supervisor")
    run = starting.create_run(argv=argv, cwd=cwd, env_added=env, name=args.name, notify=args.notify, gpus=gpus,
                              port=port, stall_after_s=args.stall_after_s, checks=checks, rank_hook=args.rank_hook,
                              flight_recorder=args.flight_recorder, activation=training.activation if training else {},
                              extra={"watch": args.watch, "checkpoint_dir": args.checkpoint_dir and str(
                                  cwd / os.path.expanduser(args.checkpoint_dir)),
                                     "save_every_steps": args.save_every_steps, "keep_last": args.keep_last})
    starting.launch_supervisor(run)
    meta = starting.wait_started(run)
    status = classify(run)
    progress(2, 3, f"run {run.run_id}: {status.state}")
    status_cli = shlex.join(["rgt", "run", "status", run.run_id, *cli_host_args()])
    step = (f"Watch it: run_status run_id={run.run_id} (or `{status_cli}`); stop it with run_stop."
            if status.state not in ENDED else f"It already ended: run_status run_id={run.run_id} (or `{status_cli}`) "
            "says why.")
    return RunStarted(run_id=run.run_id, state=status.state, detail=status.detail, pid=meta.get("pid"), argv=argv,
                      cwd=str(cwd), env_added=sorted(env), gpus=gpus, port=port,
                      checks=[CheckRow(check=k, result=v) for k, v in checks.items()], run_dir=str(run.path),
                      log=str(run.log), next_step=step, training_env=training)


def render_started(result: RunStarted) -> str:
    lines = [f"run {result.run_id}: {result.state}" + (f" ({result.detail})" if result.detail else ""),
             f"pid {result.pid} · cwd {result.cwd} · log {result.log}",
             f"command: {shlex.join(result.argv)}"]
    if result.training_env is not None:
        lines.append(f"environment: {result.training_env.brief()}")
    lines += [f"check {c.check}: {c.result}" for c in result.checks]
    lines.append(f"next: {result.next_step}")
    return "\n".join(lines)


# ================================================================== the run's processes


class RunProcess(StrictModel):
    pid: int
    ppid: int
    name: str
    status: str
    command: str


def run_pids(run: RunDir, meta: dict[str, Any] | None = None) -> list[int]:
    """The run's live processes (members.py: its session, its group, what the supervisor recorded and their
    descendants, so a detached or setsid'd job stays found). Never the supervisor."""
    return live_members(run, meta if meta is not None else run.meta())


def describe_processes(pids: list[int]) -> list[RunProcess]:
    rows = []
    for pid in pids:
        info = snapshot(pid)
        if info is not None:
            rows.append(RunProcess(pid=pid, ppid=info.ppid, name=info.name, status=info.status,
                                   command=printable(info.command)[:300]))
    return rows


# ================================================================== where progress is read


class WatchedFile(StrictModel):
    path: str
    source: str = Field(description="Why it is followed: the run's stdout, a watch glob, given, written by pid N")
    idle_s: float | None = Field(None, description="Seconds since it last changed (null: missing)")


@dataclass
class FilesView:
    follows: str | None
    quiet_s: float | None
    rows: list[WatchedFile]


def files_view(files: dict[str, str]) -> FilesView:
    """Which file is followed (the text log that changed last) and how long every progress file has been quiet."""
    changes = last_changes(files)
    now = time.time()
    rows = [WatchedFile(path=path, source=source, idle_s=round(max(0.0, now - changes[path]), 1)
                        if path in changes else None) for path, source in list(files.items())[:64]]
    quiet = max(0.0, now - max(changes.values())) if changes else None
    return FilesView(followed(changes), quiet, rows)


def progress_from(*logs: Path | str | None) -> TrainingProgress | None:
    """Progress from the first log that shows some (the followed file, then the run's own log)."""
    parsed = None
    for log in logs:
        if log is None:
            continue
        parsed = progress_of(Path(log))
        if parsed.step is not None or parsed.loss is not None:
            return parsed
    return parsed


# ================================================================== run_status


HAND_TARGET = ("For a run started by hand (not by run_start or run_adopt): give pid, pattern (a regular expression "
               "matched against command lines; the result shows the pids it resolved to) or logs")


class RunTarget(StrictModel):
    """Which run a reading tool is about: one of ours by run_id, or one started by hand."""

    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, max_length=96, description="The run_id that run_start "
                               "or run_adopt returned. " + HAND_TARGET + " instead.")
    pid: PidField = None
    pattern: PatternField = None
    logs: LogsField = None

    @model_validator(mode="after")
    def _one_target(self) -> RunTarget:
        given = [name for name in ("run_id", "pid", "pattern") if getattr(self, name) is not None]
        if len(given) > 1 or (self.run_id is not None and self.logs) or not (given or self.logs):
            raise ValueError("give run_id (a run started by run_start or run_adopt), or pid, pattern or logs (a run "
                             "started by hand)")
        return self


class RunStatusInput(RunTarget):
    stall_after_s: float = Field(900.0, ge=1, le=7 * 86400, description="For pid/pattern/logs: no change in its "
                                 "log files for this long counts as stalled")
    checkpoint_dir: CheckpointDirField = None
    save_every_steps: SaveEveryField = None
    keep_last: KeepLastField = None
    horizon_hours: float = Field(8.0, gt=0, le=24 * 14, description="How far ahead the checkpoint outlook looks "
                                 "(e.g. until morning); the run's ETA if sooner")
    load_test: bool = Field(False, description="Also torch.load the newest checkpoint under the run's own python "
                            "(slow for a big checkpoint; the header check always runs)")
    provider: str | None = Field(None, min_length=1, max_length=40, description="The box's provider (runpod, "
                                 "vastai, lambda, ...). Used when the box cannot be reached, to say what is likely "
                                 "(a spot preemption, a stopped pod), and for its durable volume path; detected "
                                 "otherwise.")


class DiagnosisRow(StrictModel):
    id: str
    file: str
    title: str
    evidence: str
    line: str | None = Field(None, description="The log line that matched")
    short_fix: str
    tool_call: str | None = None


class Notification(StrictModel):
    event: str
    state: str
    at: float
    exit_code: int | None = None
    error: str | None = None
    message: str | None = Field(None, description="The message the notify command was given")


class RunStatus(StrictModel):
    run_id: str | None = Field(description="null for a run started by hand that was not adopted")
    state: State
    detail: str
    name: str | None = None
    adopted: bool = Field(False, description="A run started by hand and watched since run_adopt")
    pattern: str | None = None
    resolved_pids: list[int] = Field(default_factory=list, description="The pids pid/pattern/logs resolved to")
    exit_code: int | None = None
    exit_status_known: bool | None = Field(None, description="False: the process was not the supervisor's child "
                                           "(adopted, started by hand), so its exit code could not be read")
    signal: int | None = None
    signal_name: str | None = None
    started_at: float | None = Field(None, description="Unix time the training process started")
    ended_at: float | None = None
    runtime_s: float | None = None
    pid: int | None = None
    command: str | None = None
    log: str | None = Field(None, description="Path of the run's own log (stdout and stderr) on the box")
    log_bytes: int | None = None
    follows: str | None = Field(None, description="The file progress and stalls are read from: the text log that "
                                "changed last among its log, the watch files and files its processes write")
    files: list[WatchedFile] = Field(default_factory=list, description="Every progress file and how long it is quiet")
    log_idle_s: float | None = Field(None, description="Seconds since any progress file last changed")
    stall_after_s: float | None = None
    progress: TrainingProgress | None = Field(None, description="Parsed from the last 64 KiB of the followed file")
    processes: list[RunProcess] = Field(default_factory=list, description="The run's live processes")
    gpu: list[GpuUse] = Field(default_factory=list, description="NVML: VRAM of the run's own pids, their GPUs' use")
    gpu_note: str | None = None
    diagnosis: list[DiagnosisRow] = Field(default_factory=list, description="On failure: diagnose_error's top "
                                          "entries for the log tail")
    oom: dict[str, Any] | None = Field(None, description="OOM evidence the supervisor gathered at the end")
    notifications: list[Notification] = Field(default_factory=list)
    hang: HangSummary | None = Field(None, description="Stalled or ended: which rank was odd and where (the stacks "
                                     "the supervisor took at the stall), and torchrun's first failure")
    placement: Placement | None = Field(None, description="NVML: each rank's GPUs, GPUs shared by two ranks, visible "
                                        "GPUs no rank uses, how busy each is")
    checkpoints: CheckpointOutlook | None = Field(None, description="Will the saves before the horizon fit: free "
                                                  "space and inodes, tmpfs, the provider's volume, integrity")
    next_step: str
    entry: EntryRef | None = Field(None, description="The catalog entry explaining this state")


def _diagnosis(*logs: Path | str | None) -> list[DiagnosisRow]:
    from ..diagnose import diagnose

    parts = [read_tail(Path(log), 256 * 1024)[0] for log in logs if log is not None]
    out = diagnose("\n".join(parts), max_results=3)
    return [DiagnosisRow(id=m.id, file=m.file, title=m.title, evidence=m.evidence,
                         line=m.line.text[:300] if m.line else None, short_fix=m.short_fix, tool_call=m.tool_call)
            for m in out.matches]


NEXT_STEP = {
    "starting": "Check again in a few seconds.",
    "running": "Check again later; run_logs shows the output.",
    "stalled": "hang says which rank was odd and where when the stall began; run_stacks takes every rank's stack "
               "again now, and run_logs shows the end of the log (MON-14). Stop it with run_stop if it does not "
               "recover.",
    "succeeded": "Collect the results; nothing holds the GPUs any more.",
    "failed": "Read the diagnosis and the log tail (run_logs), fix, start again.",
    "killed": "Ended by a signal: if nobody stopped it on purpose, check who could have, and the kernel log "
              "(MON-16).",
    "oom_killed": "Host memory ran out (MON-13): fewer DataLoader workers, smaller batch, or more RAM.",
    "ended": "Its processes are gone and nobody could read the exit status (MON-17): the diagnosis of the log's "
             "tail and its last lines (run_logs) say whether it finished or failed; check the checkpoints.",
    "lost": "The box rebooted or the supervisor died (MON-15): check whether the training process still runs "
            "(processes), and resume from the last checkpoint.",
}
HAND_NEXT = {"running": "Started by hand: run_adopt(pid=...) records it so notify and the idle guard cover it.",
             "stalled": "run_stacks(pid=...) shows where it is stuck (needs py-spy for a run we did not start); "
                        "run_logs(pid=...) the end of its log (MON-14)."}


ENTRY_OF_STATE = {"oom_killed": "MON-13", "stalled": "MON-14", "lost": "MON-15", "killed": "MON-16",
                  "ended": "MON-17"}


def _entry_of(state: str) -> EntryRef | None:
    entry = ENTRY_OF_STATE.get(state)
    return EntryRef(file="references/monitoring_patterns.md", id=entry) if entry else None


def _outlook(args: RunStatusInput, meta: dict[str, Any], progress_now: TrainingProgress | None,
             python: str | None) -> CheckpointOutlook | None:
    folder = args.checkpoint_dir or meta.get("checkpoint_dir")
    if not folder:
        return None
    path = Path(os.path.expanduser(folder))
    if not path.is_absolute():
        path = Path(meta.get("cwd") or Path.home()) / path
    return checkpoint_outlook(path, progress=progress_now, horizon_s=args.horizon_hours * 3600,
                              save_every_steps=args.save_every_steps or meta.get("save_every_steps"),
                              keep_last=args.keep_last or meta.get("keep_last"), provider=args.provider,
                              python=python, load_test=args.load_test)


def _gpu(pids: list[int]) -> tuple[list[GpuUse], str | None, Placement | None]:
    if not pids:
        return [], None, None
    reading = GpuReading.read(default_backend())  # one pass over NVML for both views
    rows, note = run_gpu_use(set(pids), reading=reading)
    return rows, note, gpu_placement(*ranks_of(pids), reading=reading)


def run_status(args: RunStatusInput, progress: Progress) -> RunStatus:
    if args.run_id is None:
        return hand_status(args)
    run = run_dir(args.run_id)
    meta = run.meta()
    status = classify(run)
    ended = run.read(EXIT) or {}
    try:
        size = run.log.stat().st_size
    except OSError:
        size = None
    view = files_view(recorded_files(run))
    pids = run_pids(run, meta)
    gpu_rows, gpu_note, placement = _gpu(pids)
    started, end = meta.get("started_at") or meta.get("created_at"), ended.get("ended_at")
    runtime = (end or time.time()) - started if started else None
    notes = [Notification(**{k: n.get(k) for k in Notification.model_fields}) for n in run.notifications()
             if isinstance(n.get("event"), str)]
    trained = progress_from(view.follows, run.log)
    logs = [p for p in (view.follows, None if meta.get("adopted") else run.log) if p]
    return RunStatus(
        run_id=run.run_id, state=status.state, detail=status.detail, name=meta.get("name"),
        adopted=bool(meta.get("adopted")), exit_code=status.exit_code, exit_status_known=ended.get(
            "exit_status_known", True if ended else None), signal=status.signal,
        signal_name=signal_name(status.signal), started_at=started, ended_at=end,
        runtime_s=round(runtime, 1) if runtime is not None else None, pid=meta.get("pid"),
        command=shlex.join(meta.get("argv", []))[:1000], log=None if meta.get("adopted") else str(run.log),
        log_bytes=size, follows=view.follows, files=view.rows,
        log_idle_s=round(view.quiet_s, 1) if view.quiet_s is not None else None,
        stall_after_s=meta.get("stall_after_s"), progress=trained, processes=describe_processes(pids), gpu=gpu_rows,
        gpu_note=gpu_note, diagnosis=_diagnosis(*logs) if status.state in ("failed", "oom_killed", "lost", "ended")
        else [], oom=ended.get("oom"), notifications=notes, next_step=NEXT_STEP.get(status.state, ""),
        placement=placement, hang=hang_summary(run, status.state, read_tail(run.log, 64 * 1024)[0]),
        checkpoints=_outlook(args, meta, trained, meta.get("python_exe")), entry=_entry_of(status.state))


def hand_status(args: RunStatusInput) -> RunStatus:
    """A run started by hand: state from its process, progress and stall from its newest log (module adopt.py)."""
    from .supervisor import python_of

    target = resolve(args.pid, args.pattern, args.logs)
    pids = target.pids()
    files = {path: "given" for path in target.logs}
    for path, source in files_of_processes(pids).items():
        files.setdefault(path, source)
    view = files_view(files)
    follows = view.follows or (target.logs[0] if target.logs else None)
    where = follows or "no log (it writes no regular file; give logs=[...])"
    if pids and view.quiet_s is not None and view.quiet_s >= args.stall_after_s:
        state: State = "stalled"
        detail = (f"no progress in {where} for {view.quiet_s:.0f} s (threshold {args.stall_after_s:g} s); started "
                  "by hand, so no stacks were taken: run_stacks(pid=...)")
    elif pids:
        state, detail = "running", f"started by hand; progress read from {where}"
    else:
        state = "ended"
        detail = (f"no process writes {where} any more; exit status unknown: it was not started by run_start, so "
                  "no parent recorded it")
    root = target.root if pids else None
    info = snapshot(root) if root else None
    gpu_rows, gpu_note, placement = _gpu(pids)
    trained = progress_from(follows)
    return RunStatus(
        run_id=None, state=state, detail=detail, pattern=target.pattern, resolved_pids=pids[:1] if root else [],
        exit_status_known=False if not pids else None, started_at=info.create_time if info else None,
        pid=root, command=printable(info.command)[:1000] if info else None, follows=follows, files=view.rows,
        log_idle_s=round(view.quiet_s, 1) if view.quiet_s is not None else None, stall_after_s=args.stall_after_s,
        progress=trained, processes=describe_processes(pids), gpu=gpu_rows, gpu_note=gpu_note, placement=placement,
        diagnosis=_diagnosis(follows) if state in ("ended", "stalled") and follows else [],
        next_step=HAND_NEXT.get(state, NEXT_STEP["ended"]), entry=_entry_of(state),
        checkpoints=_outlook(args, {}, trained, python_of(root) if root else None))


def _ago(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def render_status(status: RunStatus) -> str:
    who = f"run {status.run_id}" if status.run_id else (
        f"pid {status.pid}" if status.pid else "a run started by hand")
    head = f"{who}: {status.state.upper()}"
    if status.detail:
        head += f" — {status.detail}"
    lines = [head]
    if status.pattern:
        lines.append(f"pattern {status.pattern!r} resolved to pid(s) {', '.join(map(str, status.resolved_pids))}")
    if status.command:
        lines.append(f"command: {status.command}")
    facts = [f"started {_ago(status.started_at)}"]
    if status.runtime_s is not None:
        facts.append(f"runtime {status.runtime_s:.0f} s")
    if status.log_idle_s is not None:
        facts.append(f"quiet {status.log_idle_s:.0f} s")
    lines.append(" · ".join(facts))
    if status.follows:
        lines.append(f"follows: {status.follows}" + (f" (+{len(status.files) - 1} other file(s))"
                                                     if len(status.files) > 1 else ""))
    p = status.progress
    if p and (p.step is not None or p.loss is not None):
        parts = [f"step {p.step}" + (f"/{p.total} ({p.percent} %)" if p.total else "") if p.step is not None else "",
                 f"loss {p.loss:g}" if p.loss is not None else "",
                 f"{p.throughput:g} {p.throughput_unit or ''}".strip() if p.throughput is not None else "",
                 f"ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""]
        lines.append("progress: " + " · ".join(x for x in parts if x))
    if status.processes:
        lines.append(f"processes: {len(status.processes)} ({', '.join(str(r.pid) for r in status.processes[:8])})")
    if status.placement and status.placement.gpus:
        lines += placement_text(status.placement)
    else:
        for row in status.gpu:
            util = f", GPU {row.gpu_util_percent} % busy" if row.gpu_util_percent is not None else ""
            lines.append(f"GPU {row.gpu}: pid {row.pid} holds {gib(row.used_bytes, 1)}{util}")
    if status.hang:
        lines.append(f"where: {status.hang.verdict}")
    if status.checkpoints:
        lines.append(f"checkpoints: {status.checkpoints.verdict} — {status.checkpoints.summary}")
    for d in status.diagnosis[:3]:
        lines.append(f"diagnosis: {d.id} — {d.title} ({d.evidence}): {d.short_fix}")
    for n in status.notifications:
        lines.append(f"notified {n.event} ({n.state}) at {_ago(n.at)}: exit {n.exit_code}"
                     + (f", {n.error}" if n.error else ""))
    lines.append(f"next: {status.next_step}")
    return "\n".join(lines)


def status_when_unreachable(args: RunStatusInput, error: Exception) -> RunStatus:
    """The box did not answer: say what its provider makes likely, not a bare ssh error.

    Called by the remote transport with the validated arguments and the RemoteError. The provider
    is ``args.provider`` or the first profile whose name or alias appears in the host name.
    """
    host = str(getattr(error, "host", "") or "")
    message = str(getattr(error, "message", "") or error)
    likely = _likely_cause(args.provider, host)
    return RunStatus(run_id=args.run_id, state="unreachable", detail=f"{host or 'the box'} did not answer: {message}",
                     pid=args.pid, pattern=args.pattern, next_step=likely)


def _likely_cause(provider: str | None, host: str) -> str:
    from ..providers import load_profiles, resolve_provider

    generic = ("The run lives on the box and is not lost by this: when the box answers again, run_status tells "
               "how it ended. Check the provider's console: a stopped or preempted instance, a changed IP or SSH "
               "port after a restart, or a network problem on the way.")
    try:
        profiles = load_profiles()
        profile = resolve_provider(provider, profiles) if provider else next(
            (p for p in profiles.values() if p.name != "local" and any(
                alias and alias.lower() in host.lower() for alias in (p.name, *p.front.aliases))), None)
    except Exception:  # a broken profile must not hide the unreachable answer
        profile = None
    if profile is None:
        return generic
    spot = profile.front.spot
    parts = [f"{profile.front.name}:"]
    if spot.available.value:
        parts.append(f"if it is a spot/interruptible instance, a preemption is likely ({spot.on_preemption.value})")
    parts.append(f"a stopped instance is the other usual cause; what stopping does: "
                 f"{profile.front.billing.stop_compute.value}")
    return " ".join(parts) + " " + generic


# ================================================================== run_logs


class RunLogsInput(RunTarget):
    path: str | None = Field(None, min_length=1, max_length=4096, description="Which of the run's files to read "
                             "(default: its own log, or the file it follows when that is empty; the first of logs)")
    lines: int = Field(50, ge=1, le=10000, description="How many of the last lines (when offset is not given)")
    offset: int | None = Field(None, ge=0, description="Read forward from this byte offset instead (the "
                               "next_offset of a previous call), to follow a log without repeats")
    grep: str | None = Field(None, min_length=1, max_length=200, description="Only lines matching this Python "
                             "regular expression (searched in at most the last 4 MiB, or max_bytes from offset)")
    max_bytes: int = Field(16384, ge=256, le=1 << 20, description="Most bytes of log text returned")


class RunLogs(StrictModel):
    run_id: str | None
    path: str = Field(description="The file read")
    text: str
    lines: int
    start_offset: int = Field(description="Byte offset in the log where the scanned text starts")
    next_offset: int = Field(description="Pass as offset to read what follows")
    size: int = Field(description="Log size in bytes now")
    truncated: bool = Field(description="More matched than max_bytes/lines allowed; the newest part is kept "
                            "(tail) or the rest follows from next_offset")


GREP_SCAN_BYTES = 4 << 20


def _read_range(path: Path, start: int, length: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read(length)
    except OSError:
        return b""


def _log_to_read(args: RunLogsInput) -> tuple[str | None, Path]:
    """(run_id, the file to read) for the target the caller named."""
    if args.run_id is not None:
        run = run_dir(args.run_id)
        files = recorded_files(run)
        if args.path:
            wanted = str(Path(os.path.expanduser(args.path)).resolve())
            if wanted not in files and wanted != str(run.log):
                raise InputError("path", f"{args.path} is not one of run {run.run_id}'s files", allowed=list(files))
            return run.run_id, Path(wanted)
        own = run.log if not run.meta().get("adopted") else None
        if own is not None and own.exists() and own.stat().st_size > 0:
            return run.run_id, own
        follows = files_view(files).follows
        return run.run_id, Path(follows) if follows else run.log
    target = resolve(args.pid, args.pattern, args.logs)
    if args.path:
        return None, Path(absolute_logs([args.path])[0])
    if target.logs:
        return None, Path(target.logs[0])
    follows = files_view(files_of_processes(target.pids())).follows
    if follows is None:
        raise InputError("pid", "the process holds no regular file open for writing (its log may be a pipe or a "
                         "terminal): give logs=[...]")
    return None, Path(follows)


def run_logs(args: RunLogsInput, progress: Progress) -> RunLogs:
    run_id, log = _log_to_read(args)
    try:
        pattern = re.compile(args.grep) if args.grep else None
    except re.error as err:
        raise InputError("grep", f"not a valid regular expression: {err}") from None
    try:
        size = log.stat().st_size
    except OSError:
        size = 0
    if args.offset is not None:
        start = min(args.offset, size)
        data = _read_range(log, start, args.max_bytes if pattern is None else GREP_SCAN_BYTES)
        cut = data.rfind(b"\n") + 1 if start + len(data) < size else len(data)
        data = data[:cut] if cut else data
        kept: list[str] = []
        used = 0
        consumed = 0
        for raw in data.splitlines(keepends=True):
            line = raw.decode("utf-8", "replace")
            if pattern is None or pattern.search(line):
                if used + len(raw) > args.max_bytes or (len(kept) >= args.lines and pattern is not None):
                    break
                kept.append(line)
                used += len(raw)
            consumed += len(raw)
        truncated = start + consumed < size
        return RunLogs(run_id=run_id, path=str(log), text="".join(kept), lines=len(kept), start_offset=start,
                       next_offset=start + consumed, size=size, truncated=truncated)
    window = GREP_SCAN_BYTES if pattern is not None else min(GREP_SCAN_BYTES, max(args.max_bytes * 4, 65536))
    start = max(0, size - window)
    data = _read_range(log, start, window)
    if start > 0 and b"\n" in data:
        skip = data.index(b"\n") + 1
        data, start = data[skip:], start + skip
    lines = [ln for ln in logical_lines_keep(data.decode("utf-8", "replace"))
             if pattern is None or pattern.search(ln)]
    chosen = lines[-args.lines:]
    while chosen and sum(len(x.encode()) + 1 for x in chosen) > args.max_bytes:
        chosen = chosen[1:]
    text = "\n".join(chosen) + ("\n" if chosen else "")
    return RunLogs(run_id=run_id, path=str(log), text=text, lines=len(chosen), start_offset=start, next_offset=size,
                   size=size, truncated=len(chosen) < len(lines))


def logical_lines_keep(text: str) -> list[str]:
    """Lines as a reader wants them: a tqdm bar's redraws collapse to its newest state."""
    return [line.split("\r")[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r") for line in text.split("\n")
            if line.strip()]


def render_logs(logs: RunLogs) -> str:
    more = f"\n[… more: offset {logs.next_offset}]" if logs.truncated else ""
    return logs.text.rstrip("\n") + more + f"\n[{logs.path}: {logs.size} bytes; next_offset {logs.next_offset}]"


# ================================================================== run_adopt


class RunAdoptInput(StrictModel):
    pid: PidField = None
    pattern: PatternField = None
    logs: LogsField = None
    watch: WatchField = None
    name: str | None = Field(None, min_length=1, max_length=40, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                             description="A short label, part of the run_id")
    notify: NotifyCommand | None = Field(None, min_length=1, max_length=64, description=NOTIFY_HELP + ". Run when "
                                         "it stalls and when it ends (exit status unknown: not our child)")
    stall_after_s: float = Field(900.0, ge=1, le=7 * 86400, description="No change in its log files for this long, "
                                 "with stacks that do not move, counts as stalled")
    checkpoint_dir: CheckpointDirField = None
    save_every_steps: SaveEveryField = None
    keep_last: KeepLastField = None

    @model_validator(mode="after")
    def _one_target(self) -> RunAdoptInput:
        if (self.pid is None) == (self.pattern is None):
            raise ValueError("give exactly one of pid or pattern (the job to adopt)")
        return self


class RunAdopted(StrictModel):
    run_id: str
    state: State
    detail: str
    pid: int
    resolved_pids: list[int] = Field(description="The pids pid/pattern resolved to (the root and its descendants)")
    command: str
    cwd: str | None
    follows: str | None = Field(description="The log it writes that the supervisor follows (it keeps looking)")
    run_dir: str
    next_step: str


def run_adopt(args: RunAdoptInput, progress: Progress) -> RunAdopted:
    from .supervisor import python_of

    target = resolve(args.pid, args.pattern, args.logs)
    if target.root is None:
        raise InputError("pid", "nothing to adopt: no process runs")
    root = target.root
    for run in list_runs():
        meta = run.meta()
        if classify(run).state not in ENDED and root in run_pids(run, meta):
            raise InputError("pid", f"pid {root} already belongs to run {run.run_id}: use run_status(run_id=...)")
    info = snapshot(root)
    assert info is not None
    try:
        cwd = Path(os.readlink(f"/proc/{root}/cwd"))
    except OSError:
        cwd = Path.home()
    pids = target.pids()
    folder = args.checkpoint_dir and str(cwd / os.path.expanduser(args.checkpoint_dir))
    progress(0, 2, f"adopting pid {root}")
    run = starting.create_run(
        argv=list(info.cmdline), cwd=cwd, env_added={}, name=args.name, notify=args.notify, gpus=None, port=None,
        stall_after_s=args.stall_after_s, checks={}, rank_hook=False,
        extra={"adopted": True, "pid": root, "start_ticks": read_start_ticks(root), "pgid": None,
               "started_at": info.create_time, "logs": target.logs, "watch": args.watch, "checkpoint_dir": folder,
               "save_every_steps": args.save_every_steps, "keep_last": args.keep_last,
               "python_exe": python_of(root)})
    starting.launch_supervisor(run)
    starting.wait_started(run)
    status = classify(run)
    follows = files_view({**{p: "given" for p in target.logs}, **files_of_processes(pids)}).follows
    return RunAdopted(run_id=run.run_id, state=status.state, detail=status.detail, pid=root, resolved_pids=pids,
                      command=printable(info.command)[:1000], cwd=str(cwd), follows=follows, run_dir=str(run.path),
                      next_step=f"run_status(run_id={run.run_id!r}) from now on; the idle guard counts it as a run; "
                                "its exit status will be unknown (the supervisor is not its parent).")


def render_adopted(result: RunAdopted) -> str:
    return "\n".join([f"adopted pid {result.pid} as run {result.run_id}: {result.state}"
                      + (f" ({result.detail})" if result.detail else ""),
                      f"command: {result.command}", f"follows: {result.follows or 'no log yet (it keeps looking)'}",
                      f"next: {result.next_step}"])


# ================================================================== run_stop


class RunStopInput(StrictModel):
    run_id: str = _run_id_field()
    dry_run: bool = Field(True, description="Only list the run's processes and return a confirm_token")
    confirm_token: str | None = Field(None, min_length=1, max_length=8192, description="The confirm_token of the "
                                      "dry run; binds pid, start time, uid and command of every process")
    grace_s: float = Field(30.0, ge=0, le=600, description="Seconds between SIGTERM and SIGKILL (torchrun waits up "
                           "to 30 s for its workers before it kills them itself)")


class RunStopReport(StrictModel):
    run_id: str
    dry_run: bool
    state: State = Field(description="The run's state after the call")
    summary: str
    kill: KillReport | None = None
    confirm_token: str | None = None
    remaining: list[RunProcess] = Field(default_factory=list, description="Run processes still present after the stop")
    vram_left: list[GpuUse] = Field(default_factory=list, description="VRAM the run's pids still hold after it")
    verified: bool = Field(False, description="True: every process of the run is gone and holds no VRAM")
    next_step: str


def run_stop(args: RunStopInput, progress: Progress) -> RunStopReport:
    run = run_dir(args.run_id)
    meta = run.meta()
    pids = run_pids(run, meta)
    state = classify(run).state
    if not pids:
        return RunStopReport(run_id=run.run_id, dry_run=args.dry_run, state=state, verified=True,
                             summary=f"nothing to stop: no process of the run is left (state {state})",
                             next_step="run_status tells how it ended.")
    why = {pid: f"run {run.run_id}" + (" (training process, group leader)" if pid == meta.get("pid") else "")
           for pid in pids}
    if not args.dry_run and args.confirm_token:
        write_json(run.file(STOP), {"requested_at": time.time(), "pids": pids})
    report = safe_kill(why, dry_run=args.dry_run, confirm_token=args.confirm_token, signal="KILL",
                       grace_s=args.grace_s, progress=progress)
    if args.dry_run or not report.executed:
        if report.token_problems:
            run.file(STOP).unlink(missing_ok=True)
        cli = shlex.join(["rgt", "run", "stop", run.run_id, *cli_host_args(), "--no-dry-run", "--confirm-token",
                          str(report.confirm_token)])
        summary = (f"would stop {len(pids)} process(es): SIGTERM, {args.grace_s:g} s grace, then SIGKILL" if
                   args.dry_run else "nothing signalled: " + " ".join(report.token_problems))
        return RunStopReport(run_id=run.run_id, dry_run=args.dry_run, state=state, summary=summary, kill=report,
                             confirm_token=report.confirm_token,
                             next_step=f"Show the processes to the user; to stop: dry_run=false with this "
                                       f"confirm_token, or `{cli}`")
    remaining = [p for p in pids if (info := snapshot(p)) is not None and info.status != ZOMBIE]
    vram, _note = run_gpu_use(set(pids))
    deadline = time.monotonic() + 5.0  # the supervisor records the end right after the last exit
    while time.monotonic() < deadline and not run.file(EXIT).exists() and not remaining:
        time.sleep(0.05)
    state = classify(run).state
    verified = not remaining and not vram
    summary = (f"stopped: {len(pids)} process(es) gone, no VRAM held; state {state}" if verified else
               f"{len(remaining)} process(es) left, {len(vram)} VRAM holder(s) left")
    step = "Nothing left on the box from this run." if verified else (
        "Processes survived SIGKILL (D state: stuck in the driver) or still hold VRAM: run reap_vram_zombies "
        "and gpu_health.")
    return RunStopReport(run_id=run.run_id, dry_run=False, state=state, summary=summary, kill=report,
                         remaining=describe_processes(remaining), vram_left=vram, verified=verified, next_step=step)


def render_stop(report: RunStopReport) -> str:
    lines = [("DRY RUN (nothing signalled) " if report.dry_run else "") + f"run {report.run_id}: {report.summary}"]
    if report.kill:
        lines += ["", target_table(report.kill.targets)]
    if report.confirm_token and report.dry_run:
        lines.append(f"\nconfirm_token: {report.confirm_token}")
    lines.append(f"next: {report.next_step}")
    return "\n".join(lines)


def stop_exit_code(report: RunStopReport) -> int:
    return 0 if report.dry_run or report.verified else 1


# ================================================================== run_list


class RunListInput(StrictModel):
    limit: int = Field(20, ge=1, le=1000, description="At most this many runs, newest first")
    active_only: bool = Field(False, description="Only runs that have not ended")


class RunRow(StrictModel):
    run_id: str
    name: str | None
    state: State
    detail: str
    started_at: float | None
    pid: int | None
    command: str


class RunList(StrictModel):
    runs_dir: str
    runs: list[RunRow]
    total: int = Field(description="Runs on this box, before limit and active_only")


def run_list(args: RunListInput, progress: Progress) -> RunList:
    from .ledger import runs_root

    runs = list_runs()
    rows = []
    for run in runs:
        if len(rows) >= args.limit:
            break
        status = classify(run)
        if args.active_only and status.state in ENDED:
            continue
        meta = run.meta()
        rows.append(RunRow(run_id=run.run_id, name=meta.get("name"), state=status.state, detail=status.detail,
                           started_at=meta.get("started_at") or meta.get("created_at"), pid=meta.get("pid"),
                           command=whole_command(shlex.join(meta.get("argv", [])))))
    return RunList(runs_dir=str(runs_root()), runs=rows, total=len(runs))


def render_list(result: RunList) -> str:
    if not result.runs:
        return f"no runs under {result.runs_dir}"
    rows = [[r.run_id, r.state, _ago(r.started_at), r.pid or "-", r.command] for r in result.runs]
    table = format_table(["run_id", "state", "started", "pid", "command"], rows, wrap=["command"])
    return f"{table}\n{result.total} run(s) in {result.runs_dir}"


# ================================================================== specs

SPECS = [
    ToolSpec(
        name="run_start", cli="run start", remote=True, cli_positional="argv", cli_command_flags=("notify",),
        title="Start a training run detached on the box",
        description=(
            "Start a training command on the box so that it survives the ssh connection dropping and the agent "
            "exiting: own process group, stdin from /dev/null, output to a log, watched by a small supervisor "
            "(a subreaper: a launcher that backgrounds its job with nohup/setsid and exits is followed until the "
            "job ends, with its exit code) that records argv, cwd, env added, pid, boot id, git commit and at the "
            "end the exit status or signal and OOM evidence. Progress is read from the run's log, the watch "
            "files/globs and every file its processes write; no progress for stall_after_s (with stacks that do "
            "not move; GPU load is not used) is a stall. notify runs your command (argv or one string, never a "
            "shell; {message} {state} {run_id} {host} {step} filled in) on end/failure/OOM/stall. Give argv (a "
            "list) or command (the line render_launch printed). It runs in the training environment: python= or "
            "activate= as given, else on a box the one found (the command's own interpreter or launch script, the "
            "login shell's PATH, ~/venvs/*, conda), its bin/ first on PATH, named in training_env. Quick checks "
            "first: the rendezvous port is free, no other process or run of ours holds VRAM on its GPUs "
            "(allow_shared_gpus overrides), enough free disk. "
            "With checkpoint_dir, run_status and box_idle say whether the night's saves fit. Returns run_id for "
            "run_status/run_logs/run_stop. It starts a job that uses (and bills) the GPUs."),
        input_model=RunStartInput, output_model=RunStarted, run=run_start, read_only=False, destructive=False,
        idempotent=False, open_world=True, render_text=render_started),
    ToolSpec(
        name="run_status", cli="run status", remote=True, cli_positional="run_id",
        title="How is the run going? Why did it end? (ours, or one started by hand)",
        description=(
            "Read-only. One state: starting, running, stalled, succeeded, failed (exit code), killed (signal), "
            "oom_killed (cgroup/kernel OOM killer), ended (gone, exit status unknown: adopted or started by hand), "
            "lost (box rebooted or supervisor gone) or unreachable (the box did not answer; says what the provider "
            "makes likely). Progress (step/total, loss, throughput, ETA) from the last 64 KiB of the file it "
            "follows (its log, watch files, files it writes; HF Trainer, tqdm/Accelerate, Lightning, torchtitan, "
            "plain 'step N loss X'), the run's processes, their VRAM and GPU use (NVML), diagnose_error's top "
            "entries when it failed or ended, the notifications sent, and with a checkpoint folder whether the "
            "saves before morning fit (space, inodes, tmpfs, the provider's volume, header integrity). For a run "
            "started by hand: pid, pattern (shown resolved to pids; never used to stop) or logs instead of run_id."),
        input_model=RunStatusInput, output_model=RunStatus, run=run_status, read_only=True, idempotent=True,
        render_text=render_status, unreachable=status_when_unreachable),
    ToolSpec(
        name="run_adopt", cli="run adopt", remote=True, cli_command_flags=("notify",),
        title="Watch a run started by hand: stalls, its end, notify, the idle guard",
        description=(
            "For a job the user started by hand (nohup, tmux, a notebook terminal): records it in the box's run "
            "ledger with a supervisor that follows it (its log files and every file it writes), declares a stall "
            "from file progress, runs the notify command on a stall and at the end, and lets box_idle and "
            "idle_guard count it as a run. Give pid, or a pattern matching exactly one job's command line. Its "
            "exit status stays unknown (the supervisor is not its parent): the end state is 'ended' with the "
            "diagnosis of its log. Returns a run_id for run_status, run_logs, run_stop (with a confirm token)."),
        input_model=RunAdoptInput, output_model=RunAdopted, run=run_adopt, read_only=False, destructive=False,
        idempotent=False, render_text=render_adopted),
    ToolSpec(
        name="run_logs", cli="run logs", remote=True, cli_positional="run_id",
        title="The run's log: last lines, or from an offset, optionally filtered",
        description=(
            "Read-only. The last N lines of a run's log (tqdm redraws collapsed), or the text from a byte offset "
            "(follow a log with next_offset), optionally only lines matching a regex. Output bounded by "
            "max_bytes; never reads more than 4 MiB. The run's own log, or the file it follows when that is empty "
            "(path= for another of its files); for a run started by hand: pid, pattern or logs."),
        input_model=RunLogsInput, output_model=RunLogs, run=run_logs, read_only=True, idempotent=True,
        render_text=render_logs),
    ToolSpec(
        name="run_stop", cli="run stop", remote=True, cli_positional="run_id",
        title="Stop a run and verify nothing is left (safe kill)",
        description=(
            "Dry run by default: lists the run's processes (its process group and their descendants) and returns "
            "a confirm_token bound to their pid, start time, uid and command. With dry_run=false and the token: "
            "SIGTERM (children first; torchrun also forwards it to its workers), grace_s, SIGKILL for survivors, "
            "then verifies every process is gone and holds no VRAM (NVML), or lists what is left and points to "
            "reap_vram_zombies. Never signals the supervisor, other users' processes or your own session."),
        input_model=RunStopInput, output_model=RunStopReport, run=run_stop, read_only=False, destructive=True,
        idempotent=True, render_text=render_stop, exit_code=stop_exit_code),
    ToolSpec(
        name="run_list", cli="run list", remote=True,
        title="Runs on the box with their states",
        description="Read-only. Every run in the box's run directory, newest first, with its state and command.",
        input_model=RunListInput, output_model=RunList, run=run_list, read_only=True, idempotent=True,
        render_text=render_list),
]
