"""Which rank is stuck, and where: ``run_stacks`` (``rgt run stacks``) and the supervisor's stall forensics.

Every hang of a distributed job starts with the same question: which rank is not where the others
are? This module answers it from the stacks ``stacks.py`` takes:

1. **Where each rank is.** The main thread's innermost frame outside site-packages and the standard
   library is the rank's *site* (``train.py:88``); the library frames it called name the *activity*:
   a collective of ``torch.distributed`` (``all_reduce``, ``barrier``...), ``DataLoader.__next__``,
   ``backward``, ``torch.save``. A rank waiting on its DataLoader gets its busy worker's site
   (``dataset.py:41`` in ``__getitem__``).
2. **Moving or stuck.** Each process is sampled several times; a rank whose stack changed, or a run
   whose log grew while it was sampled, is progressing.
3. **Groups.** Ranks that are stuck at the same (activity, site) form a group; the biggest group is
   where "the others" wait, every other group is odd, and a local rank with no process is gone.
4. **One sentence and one catalog entry**, e.g. ``ranks 0–2, 4–7 wait in `all_reduce` at
   `train.py:88`; rank 3 is in `DataLoader.__next__` → `dataset.py:41` (DATA-11)``. The entry is
   chosen by what the odd group does (a different collective or site: DIST-13; the data loader:
   DATA-11; a checkpoint: DIST-20; anything else: DIST-14; a rank gone while the others wait:
   DIST-12), and its title is read through the catalog parser.

For a run that has ended, torchrun's own failure summary (``Root Cause (first observed failure)``)
names the rank that failed first and how; ``run_status`` shows it beside the stall verdict.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from ..errors import InputError
from ..models import EntryRef, StrictModel
from ..toolspec import Progress, ToolSpec
from .flight import FOLDER as FLIGHT_FOLDER
from .flight import FlightReport, flight_report, recorder_env, request_dumps, wait_dumps
from .ledger import RUN_ID_PATTERN, STACKS, STALL, RunDir, run_dir
from .stacks import Frame, ProcessStacks, collect, hook_env

_STDLIB = re.compile(r"/lib/python3\.\d+/|^<frozen ")

Kind = Literal["collective", "data", "compute", "checkpoint"]
ACTIVITIES: tuple[tuple[str, frozenset[str] | None, str, Kind], ...] = (
    ("torch/distributed/distributed_c10d.py", None, "{function}", "collective"),
    ("torch/utils/data/dataloader.py", frozenset({"__next__"}), "DataLoader.__next__", "data"),
    ("torch/_tensor.py", frozenset({"backward"}), "backward", "compute"),
    ("torch/autograd/__init__.py", frozenset({"backward", "grad"}), "autograd.{function}", "compute"),
    ("torch/serialization.py", frozenset({"save", "load"}), "torch.{function}", "checkpoint"),
    ("torch/distributed/checkpoint/state_dict_saver.py", frozenset({"save", "async_save"}), "dcp.{function}",
     "checkpoint"),
    ("torch/distributed/checkpoint/state_dict_loader.py", frozenset({"load"}), "dcp.load", "checkpoint"),
    ("torch/cuda/__init__.py", frozenset({"synchronize"}), "cuda.synchronize", "compute"),
)
"""(path suffix, functions or None for any public one, label, kind): what library code a rank is in."""

MAX_PROCESSES = 512
"""A pid's tree is cut here: a training job is a launcher, its ranks and their workers, never more."""
ENTRY_OF_ODD: dict[str, str] = {"collective": "DIST-13", "data": "DATA-11", "checkpoint": "DIST-20",
                                "compute": "DIST-14", "other": "DIST-14"}


def is_library(path: str) -> bool:
    path = path.replace("\\", "/")
    return "/site-packages/" in path or "/dist-packages/" in path or bool(_STDLIB.search(path))


def rank_ranges(numbers: Iterable[int], noun: str = "rank") -> str:
    """``rank 3`` / ``ranks 0–2, 4–7``."""
    values = sorted(set(numbers))
    if not values:
        return f"no {noun}s"
    parts: list[str] = []
    start = prev = values[0]
    for value in [*values[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}, {prev}" if prev == start + 1 else f"{start}–{prev}")
        if value is not None:
            start = prev = value
    return f"{noun}{'s' if len(values) > 1 else ''} {', '.join(parts)}"


# ------------------------------------------------------------------ where a process is


@dataclass(frozen=True)
class Place:
    activity: str | None
    kind: str | None
    site: str | None
    function: str | None

    @property
    def key(self) -> tuple[str | None, str | None]:
        return self.activity, self.site


def _activity(frame: Frame) -> tuple[str, Kind] | None:
    path = frame.file.replace("\\", "/")
    name = frame.function.rsplit(".", 1)[-1]  # py-spy qualifies methods: _BaseDataLoaderIter.__next__
    for suffix, functions, label, kind in ACTIVITIES:
        if not path.endswith(suffix):
            continue
        if functions is None and (name.startswith("_") or name in ("wrapper", "<module>")):
            continue
        if functions is not None and name not in functions:
            continue
        return label.format(function=name), kind
    return None


def place_of(frames: list[Frame]) -> Place:
    """The user site of a main-thread stack (innermost first) and the library activity it called."""
    if not frames:
        return Place(None, None, None, None)
    user = next((i for i, f in enumerate(frames) if not is_library(f.file)), None)
    inner = frames[:user] if user is not None else frames
    found = [a for a in (_activity(f) for f in reversed(inner)) if a]  # outermost (closest to user code) first
    activity = next((a for a in found if a[1] == "collective"), found[0] if found else None)
    site_frame = frames[user] if user is not None else frames[0]
    return Place(activity[0] if activity else None, activity[1] if activity else None,
                 f"{os.path.basename(site_frame.file)}:{site_frame.line}", site_frame.function)


# ------------------------------------------------------------------ the report


class RankGroup(StrictModel):
    ranks: list[int] = Field(description="Global ranks in this group (empty for a run without torchrun ranks)")
    pids: list[int]
    activity: str | None = Field(description="Library call the ranks are in: all_reduce, DataLoader.__next__, ...")
    kind: str | None = Field(description="collective, data, compute, checkpoint; null: plain user code")
    site: str | None = Field(description="Innermost user frame: file:line")
    function: str | None
    worker: str | None = Field(None, description="For a rank waiting on its DataLoader: the busy worker's site")
    moving: bool = Field(description="Every rank of the group changed its stack between samples")
    odd: bool = Field(description="Not where the biggest group is")
    text: str


class RootCause(StrictModel):
    rank: int | None
    local_rank: int | None
    pid: int | None
    exitcode: int | None
    signal: str | None
    stopped_after: list[int] = Field(default_factory=list, description="Ranks torchrun stopped after it (SIGTERM)")
    text: str

    @property
    def entry_id(self) -> str:
        """A signal with no traceback (MON-06 decodes it), else the error further up the log (DIST-27)."""
        return "MON-06" if self.signal else "DIST-27"


class HangReport(StrictModel):
    run_id: str | None = None
    pid: int | None = Field(None, description="The pid asked about, when not a run")
    verdict: str = Field(description="One sentence: who is odd, where, and what the others wait in")
    finding: Literal["progressing", "odd_ranks", "all_waiting", "rank_gone", "ended", "no_stacks"]
    odd_ranks: list[int] = Field(default_factory=list)
    collective: str | None = Field(None, description="What the biggest group waits in")
    groups: list[RankGroup] = Field(default_factory=list)
    gone: list[int] = Field(default_factory=list, description="Local ranks of this box with no process")
    root_cause: RootCause | None = Field(None, description="torchrun's first observed failure, for an ended run")
    flight_recorder: FlightReport | None = None
    entry: EntryRef | None = None
    entry_title: str | None = None
    mechanism: str = Field("", description="How the stacks were read")
    processes: list[ProcessStacks] = Field(default_factory=list, description="Every process sampled, full stacks")
    taken_at: float | None = None
    took_s: float | None = None
    next_step: str = ""


def _entry(entry_id: str | None) -> tuple[EntryRef | None, str | None]:
    if entry_id is None:
        return None, None
    from ..catalog import entry

    try:
        found = entry(entry_id)
    except KeyError:
        return None, None
    return EntryRef(file=found.file, id=found.id), found.title


def _units(processes: list[ProcessStacks]) -> list[ProcessStacks]:
    ranks = [p for p in processes if p.role == "rank"]
    return ranks or [p for p in processes if p.role == "process"]


def _label(units: list[ProcessStacks]) -> str:
    ranks = [u.rank for u in units if u.rank is not None]
    return rank_ranges(ranks) if len(ranks) == len(units) else rank_ranges((u.pid for u in units), "pid")


def _worker_site(unit: ProcessStacks, workers: list[ProcessStacks]) -> str | None:
    """Where the rank's busy DataLoader worker is: an idle worker has no frame outside the library."""
    for worker in workers:
        frames = worker.main_frames
        if worker.ppid == unit.pid and any(not is_library(f.file) for f in frames):
            place = place_of(frames)
            return f"`{place.site}` (`{place.function}`, worker pid {worker.pid})"
    return None


def _group_text(units: list[ProcessStacks], place: Place, worker: str | None) -> str:
    many = len(units) > 1
    who = _label(units)
    if place.kind == "collective":
        return f"{who} wait{'' if many else 's'} in `{place.activity}` at `{place.site}`"
    if place.activity and worker:
        return f"{who} {'are' if many else 'is'} in `{place.activity}` → {worker}"
    if place.activity:
        return f"{who} {'are' if many else 'is'} in `{place.activity}` at `{place.site}`"
    if place.site:
        return f"{who} {'are' if many else 'is'} in `{place.function}` at `{place.site}`"
    return f"{who}: no stack ({units[0].error or 'no frames'})"


def _gone(units: list[ProcessStacks]) -> list[int]:
    """Local ranks that should be on this box (LOCAL_WORLD_SIZE) but have no process, as global ranks."""
    sizes = {u.local_world_size for u in units if u.local_world_size}
    if len(sizes) != 1 or not units or any(u.local_rank is None or u.rank is None for u in units):
        return []
    offset = units[0].rank - units[0].local_rank  # type: ignore[operator]
    present = {u.local_rank for u in units}
    return [offset + local for local in range(sizes.pop()) if local not in present]


def judge(processes: list[ProcessStacks], *, log_grew: bool | None = None, flight: FlightReport | None = None,
          root_cause: RootCause | None = None) -> HangReport:
    """The verdict on one set of samples; see the module docstring."""
    units = _units(processes)
    workers = [p for p in processes if p.role == "worker"]
    gone = _gone(units)
    answered = [u for u in units if u.threads]
    flight_part = f"; flight recorder: {flight.summary}" if flight and (flight.mismatches or flight.never_entered) \
        else ""
    if root_cause is not None and not units:
        return _report(processes, root_cause.text + flight_part, "ended", root_cause.entry_id, root_cause=root_cause,
                       flight_recorder=flight, odd_ranks=[root_cause.rank] if root_cause.rank is not None else [])
    if not answered:
        why = units[0].error if units else "no process of the run is left"
        return _report(processes, f"no stacks: {why}", "no_stacks", None, flight_recorder=flight, gone=gone)
    moving = all(u.moving for u in answered)
    if (log_grew or moving) and not gone and len(answered) == len(units):
        why = "the log grew while sampling" if log_grew else "every stack changed between samples"
        return _report(processes, f"all {len(units)} {'ranks' if units[0].rank is not None else 'processes'} "
                                  f"progressing ({why}), nothing odd{flight_part}", "progressing", None,
                       flight_recorder=flight)
    buckets: dict[tuple[Any, ...], list[ProcessStacks]] = {}
    places: dict[tuple[Any, ...], tuple[Place, str | None]] = {}
    for unit in units:
        place = place_of(unit.main_frames)
        worker = _worker_site(unit, workers) if place.kind == "data" else None
        key = (*place.key, worker, bool(unit.threads))
        buckets.setdefault(key, []).append(unit)
        places[key] = (place, worker)
    order = sorted(buckets, key=lambda k: (not k[3], -len(buckets[k]), places[k][0].kind != "collective",
                                           min(u.rank if u.rank is not None else u.pid for u in buckets[k])))
    groups = []
    for i, key in enumerate(order):
        members = buckets[key]
        place, worker = places[key]
        text = _group_text(members, place, worker)
        if i > 0 and members[0].threads and all(m.moving for m in members):
            text += " (moving)"
        groups.append(RankGroup(ranks=sorted(m.rank for m in members if m.rank is not None),
                                pids=sorted(m.pid for m in members), activity=place.activity, kind=place.kind,
                                site=place.site, function=place.function, worker=worker,
                                moving=all(bool(m.moving) for m in members), odd=i > 0, text=text))
    majority, odd = groups[0], groups[1:]
    parts = [g.text for g in groups]
    if gone:
        parts.append(f"{rank_ranges(gone)} {'have' if len(gone) > 1 else 'has'} no process (exited or killed "
                     "while the others wait)")
    world = next((u.world_size for u in units if u.world_size), None)
    entry_id = _entry_for(majority, odd, gone, flight, root_cause)
    if not odd and not gone:
        finding = "all_waiting"
        if majority.kind == "collective":
            elsewhere = world is not None and world > len(units)
            parts = [f"all {len(units)} ranks wait in `{majority.activity}` at `{majority.site}`",
                     f"nothing odd on this box: the rank holding them up runs elsewhere (world size {world}, "
                     f"{len(units)} here)" if elsewhere else "no rank on this box is elsewhere: look for a rank that "
                     "died earlier (the log) or the network"]
            entry_id = entry_id or ("NODE-06" if elsewhere else "DIST-14")
    else:
        finding = "rank_gone" if gone and not odd else "odd_ranks"
    if root_cause is not None:
        parts.append(root_cause.text)
    odd_ranks = sorted({r for g in odd for r in g.ranks} | set(gone))
    return _report(processes, "; ".join(parts) + flight_part, finding, entry_id, groups=groups, odd_ranks=odd_ranks,
                   collective=majority.activity if majority.kind == "collective" else None, gone=gone,
                   flight_recorder=flight, root_cause=root_cause)


def _entry_for(majority: RankGroup, odd: list[RankGroup], gone: list[int], flight: FlightReport | None,
               root_cause: RootCause | None) -> str | None:
    if root_cause is not None:
        return root_cause.entry_id
    if flight is not None and flight.mismatches:
        return "DIST-13"
    if odd:
        first = odd[0]
        return ENTRY_OF_ODD.get(first.kind or "other", "DIST-14")
    if gone:
        return "DIST-12"
    if majority.kind == "data":
        return "DATA-11"
    return None if majority.kind == "collective" else "MON-14"


def _report(processes: list[ProcessStacks], verdict: str, finding: str, entry_id: str | None,
            **fields: Any) -> HangReport:
    """The report, its verdict ending with the entry ID and the entry's title read through the catalog."""
    entry, title = _entry(entry_id)
    if entry is not None:
        verdict = f"{verdict} ({entry.id})"
    mechanisms = sorted({p.mechanism for p in processes if p.mechanism})
    return HangReport(verdict=verdict, finding=finding, entry=entry, entry_title=title,  # type: ignore[arg-type]
                      processes=processes, mechanism=", ".join(mechanisms) or "none", **fields)


# ------------------------------------------------------------------ torchrun's failure summary

_FAILURE_BLOCK = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)\s*"
    r"\(pid:\s*(?P<pid>\d+)\)(?:\s*\((?P<signal>SIG[A-Z0-9]+)\))?")


def torchrun_root_cause(log_tail: str) -> RootCause | None:
    """The first observed failure of torchrun's ``ChildFailedError`` summary, and the ranks it stopped after."""
    start = log_tail.rfind("Root Cause (first observed failure):")
    if start < 0:
        return None
    head = log_tail.rfind("Failures:", 0, start)
    root = _FAILURE_BLOCK.search(log_tail, start)
    if root is None:
        return None
    others = [m for m in _FAILURE_BLOCK.finditer(log_tail, head if head >= 0 else start, start)]
    stopped = sorted(int(m["rank"]) for m in others if m["signal"] == "SIGTERM")
    rank, code, pid = int(root["rank"]), int(root["code"]), int(root["pid"])
    how = f"exit code {code} ({root['signal']})" if root["signal"] else f"exit code {code}"
    text = f"rank {rank} (pid {pid}) failed first: {how}"
    if stopped:
        text += f"; torchrun then stopped {rank_ranges(stopped)}"
    return RootCause(rank=rank, local_rank=int(root["local"]), pid=pid, exitcode=code, signal=root["signal"],
                     stopped_after=stopped, text=text)


# ------------------------------------------------------------------ a run's forensics


def forensics_env(run: RunDir, meta: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """What the supervisor adds to the run's environment: the rank hook, and the flight recorder on request.
    Never raises: a run starts without forensics rather than not at all."""
    added: dict[str, str] = {}
    try:
        if meta.get("rank_hook", True):
            added.update(hook_env(run.path, env))
        if meta.get("flight_recorder"):
            added.update(recorder_env(run.path, env))
    except OSError:
        return {}
    return added


def _log_size(run: RunDir) -> int:
    """Bytes in the run's progress files (its log, watched files, files it writes: watch.py)."""
    from .watch import recorded_files

    total = 0
    for path in recorded_files(run):
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total


def investigate_run(run: RunDir, *, samples: int = 3, interval_s: float = 0.25, timeout_s: float = 10.0) -> HangReport:
    """Sample the run's processes now (with flight-recorder dumps when it records), and judge."""
    from .progress import read_tail
    from .tool import run_pids

    started = time.monotonic()
    meta = run.meta()
    pids = run_pids(run, meta)
    flight_dir = run.path / FLIGHT_FOLDER
    asked = request_dumps(flight_dir) if meta.get("flight_recorder") and pids else None
    before = _log_size(run)
    stacks_dir = run.path / "stacks"
    processes = collect(pids, stacks_dir if stacks_dir.is_dir() else None, samples=samples, interval_s=interval_s,
                        timeout_s=timeout_s)
    grew = _log_size(run) > before if pids else None
    ranks = sorted(p.rank for p in processes if p.role == "rank" and p.rank is not None)
    if asked is not None:
        wait_dumps(flight_dir, asked, len(ranks), timeout_s=1.5)
    flight = flight_report(run.path, ranks) if meta.get("flight_recorder") else None
    root = None if pids else torchrun_root_cause(read_tail(run.log, 64 * 1024)[0])
    if not pids and (stored := stored_report(run)) is not None:
        stored.root_cause = root or stored.root_cause
        if root is not None:
            stored.verdict = f"at the stall: {stored.verdict}; at the end: {root.text}"
        stored.flight_recorder = flight or stored.flight_recorder
        return stored
    report = judge(processes, log_grew=grew, flight=flight, root_cause=root)
    report.run_id, report.taken_at, report.took_s = run.run_id, time.time(), round(time.monotonic() - started, 3)
    report.next_step = _next_step(report, run.run_id)
    quiet = _log_quiet_s(run)
    if report.finding in ("odd_ranks", "all_waiting") and quiet is not None and quiet < float(
            meta.get("stall_after_s", 900)) and not run.file(STALL).exists():
        report.next_step = (f"The log moved {quiet:.0f} s ago and the run is not stalled: this may be one moment "
                            "of a slow step. Sample again (more samples, a longer interval_s) or wait for a stall. "
                            + report.next_step)
    return report


def _log_quiet_s(run: RunDir) -> float | None:
    from .watch import last_changes, recorded_files

    changes = last_changes(recorded_files(run))
    return max(0.0, time.time() - max(changes.values())) if changes else None


class HangSummary(StrictModel):
    """What run_status shows of the forensics: the verdict taken at the stall and, once the run ended,
    torchrun's first failure; the full stacks are in ``file`` and come with run_stacks."""

    verdict: str
    finding: str
    odd_ranks: list[int] = Field(default_factory=list)
    collective: str | None = None
    entry: EntryRef | None = None
    taken_at: float | None = Field(None, description="When the stacks were taken (at the stall)")
    file: str | None = Field(None, description="stacks.json in the run folder, when stacks were taken")


def hang_summary(run: RunDir, state: str, log_tail: str) -> HangSummary | None:
    """For a stalled or ended run: the stall verdict the supervisor kept, and torchrun's root cause."""
    stored = stored_report(run) if state not in ("starting", "running") else None
    stall = run.read(STALL) if state == "stalled" else None
    if stored is not None and stall is not None and (stored.taken_at or 0) < float(stall.get("detected_at", 0)):
        stored = None  # taken at an earlier stall; the supervisor is taking this one's now
    root = torchrun_root_cause(log_tail) if state in ("failed", "killed", "oom_killed") else None
    if stored is None and root is None:
        return None
    if stored is None:
        assert root is not None
        ref, _title = _entry(root.entry_id)
        return HangSummary(verdict=root.text, finding="ended", odd_ranks=[root.rank] if root.rank is not None else [],
                           entry=ref)
    verdict = stored.verdict if root is None else f"at the stall: {stored.verdict}; at the end: {root.text}"
    return HangSummary(verdict=verdict, finding=stored.finding, odd_ranks=stored.odd_ranks,
                       collective=stored.collective, entry=stored.entry, taken_at=stored.taken_at,
                       file=str(run.file(STACKS)))


def stored_report(run: RunDir) -> HangReport | None:
    data = run.read(STACKS)
    if data is None:
        return None
    try:
        return HangReport.model_validate(data)
    except ValueError:
        return None


def on_stall(run: RunDir) -> tuple[str, HangReport | None]:
    """Called once by the supervisor when it marks the run stalled: take the stacks, keep them in the run
    folder (``stacks.json``), return the one-line verdict for the notification and the report (None when the
    stacks could not be taken). The report is returned, not left to be re-read: if the write failed (a full disk),
    stacks.json still holds the previous stall's report. Never raises."""
    try:
        report = investigate_run(run, timeout_s=8.0)
    except Exception as err:  # forensics are a courtesy: the supervisor must go on watching
        with contextlib.suppress(OSError):  # a full disk refuses supervisor.log too
            traceback.print_exc()  # into supervisor.log
        return f"stacks could not be taken: {type(err).__name__}: {err}", None
    from .supervisor import bookkeep  # the supervisor's own rule for a write that fails: log it, go on

    bookkeep(STACKS, run.write, STACKS, report.model_dump(mode="json"))
    return report.verdict, report


def investigate_pid(pid: int, *, samples: int, interval_s: float, timeout_s: float) -> HangReport:
    """A process we did not start: it and its descendants, through the rank hook if a run of ours armed
    them, else py-spy."""
    from ..processes.snapshot import ProcessTable, snapshot
    from .ledger import list_runs

    info = snapshot(pid)
    if info is None:
        raise InputError("pid", f"no process {pid} on this box")
    if pid == 1 or pid == os.getpid() or info.name in ("sshd", "systemd", "init"):
        raise InputError("pid", f"pid {pid} ({info.name}) is not a training process: give the torchrun or python "
                         "process of the job")
    pids = [pid, *ProcessTable.read().descendants(pid)][:MAX_PROCESSES]
    stacks_dir = next((run.path / "stacks" for run in list_runs() if (run.path / "stacks" / f"{pid}.txt").exists()),
                      None)
    started = time.monotonic()
    processes = collect(pids, stacks_dir, samples=samples, interval_s=interval_s, timeout_s=timeout_s)
    report = judge(processes)
    report.pid, report.taken_at, report.took_s = pid, time.time(), round(time.monotonic() - started, 3)
    report.next_step = _next_step(report, None)
    return report


def _next_step(report: HangReport, run_id: str | None) -> str:
    read = f"Read {report.entry.id} in {report.entry.file}" if report.entry else ""
    if report.finding == "ended":
        return (read + ": " if read else "") + "the run has ended; run_logs shows the failing rank's own lines."
    if report.finding == "progressing":
        return "Nothing to fix here; if the log is quiet, the run just logs rarely (raise stall_after_s)."
    if report.finding == "no_stacks":
        return ("Start the run with run_start (it arms every rank for stacks), or install py-spy on the box; "
                "the log tail (run_logs) may still say where it stopped.")
    stop = f" Stop it with run_stop(run_id={run_id!r}) once you have what you need." if run_id else ""
    return (read + ": fix the odd rank's code path." if read else "Look at the odd rank's frames below.") + stop


# ------------------------------------------------------------------ the tool


class RunStacksInput(StrictModel):
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, max_length=96, description="The run_id run_start "
                               "returned (give run_id or pid)")
    pid: int | None = Field(None, ge=1, le=4194304, description="A process not started by run_start (e.g. a "
                            "torchrun launched by hand): it and its descendants; needs py-spy on the box unless a "
                            "run of ours armed it")
    samples: int = Field(3, ge=1, le=10, description="Samples per process; two or more tell moving from stuck")
    interval_s: float = Field(0.25, ge=0.01, le=5.0, description="Seconds between samples")
    timeout_s: float = Field(10.0, ge=1.0, le=60.0, description="Upper bound for the whole sampling")

    @model_validator(mode="after")
    def _one_target(self) -> RunStacksInput:
        if (self.run_id is None) == (self.pid is None):
            raise ValueError("give exactly one of run_id (a run started by run_start) or pid")
        return self


def run_stacks(args: RunStacksInput, progress: Progress) -> HangReport:
    progress(0, 2, "sampling stacks")
    if args.run_id is not None:
        report = investigate_run(run_dir(args.run_id), samples=args.samples, interval_s=args.interval_s,
                                 timeout_s=args.timeout_s)
    else:
        assert args.pid is not None
        report = investigate_pid(args.pid, samples=args.samples, interval_s=args.interval_s, timeout_s=args.timeout_s)
    progress(2, 2, report.finding)
    return report


def _frames_line(frames: list[Frame], limit: int = 4) -> str:
    """From the library call the rank is in (or its innermost user frame) outwards: the frames people read."""
    user = next((i for i, f in enumerate(frames) if not is_library(f.file)), None)
    start = 0
    if user is not None:
        start = max((i for i in range(user) if _activity(frames[i])), default=user)
    shown = [f"{f.function} ({os.path.basename(f.file)}:{f.line})" for f in frames[start:start + limit]]
    return " ← ".join(shown) + (" ← …" if len(frames) > start + limit else "")


def render_stacks(report: HangReport) -> str:
    lines = [report.verdict]
    if report.entry_title:
        lines.append(f"entry: {report.entry.id if report.entry else ''} — {report.entry_title}")
    by_pid = {p.pid: p for p in report.processes}
    for group in report.groups:
        mark = "ODD " if group.odd else ""
        lines.append(f"{mark}{group.text}")
        if group.odd:
            for pid in group.pids[:2]:
                proc = by_pid.get(pid)
                if proc and proc.main_frames:
                    lines.append(f"    pid {pid}: {_frames_line(proc.main_frames)}")
    if report.flight_recorder:
        lines.append(f"flight recorder: {report.flight_recorder.summary}")
    silent = [p for p in report.processes if p.error and p.error != "not a Python process"
              and p.role in ("rank", "worker", "process")]
    for proc in silent[:4]:
        lines.append(f"pid {proc.pid} ({proc.role}): {proc.error}")
    took = f" in {report.took_s:.2f} s" if report.took_s is not None else ""
    lines.append(f"{len(report.processes)} process(es) sampled via {report.mechanism}{took}")
    if report.next_step:
        lines.append(f"next: {report.next_step}")
    return "\n".join(lines)


SPECS = [
    ToolSpec(
        name="run_stacks", cli="run stacks", remote=True, cli_positional="run_id",
        title="Which rank is stuck, and where (stacks of every rank, grouped)",
        description=(
            "Read-only. For a hung or slow distributed run: takes the Python stack of every rank's main thread and "
            "of its DataLoader workers several times, groups the ranks by where they are and says in one sentence "
            "which rank is odd, where (file:line, the busy DataLoader worker) and which collective the others wait "
            "in, with the catalog entry that fits (DIST-13 rank-conditional collective, DATA-11 stuck data loader, "
            "DIST-20 rank-0-only save, DIST-12 a rank gone, DIST-14 one rank busy). With flight_recorder=true at "
            "run_start it adds mismatched collectives (sequence numbers, sizes, ranks that never entered). Runs "
            "started by run_start are read through a faulthandler signal their ranks arm at start (no ptrace, the "
            "ranks keep running); a pid started by hand needs py-spy on the box. For an ended run: what the "
            "supervisor took at the stall and torchrun's first failure."),
        input_model=RunStacksInput, output_model=HangReport, run=run_stacks, read_only=True, idempotent=True,
        render_text=render_stacks),
]

