"""Tools ``box_idle`` (``rgt idle``), ``idle_guard`` (``rgt guard``), ``run_pull`` (``rgt pull``) and the
internal custody specs the pull runs on the box. Logic lives in the sibling modules; this file holds
the input/output models, the glue and the text rendering."""

from __future__ import annotations

import builtins
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..errors import InputError
from ..models import StrictModel
from ..notify import HELP as NOTIFY_HELP
from ..notify import NotifyCommand
from ..runs.checkpoints import CheckpointOutlook
from ..tables import format_table, gib
from ..toolspec import Progress, ToolSpec

MAX_LISTED = 50


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts is not None else None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


# ------------------------------------------------------------------------------------------------
# box_idle


class BoxIdleInput(StrictModel):
    window_s: float = Field(10.0, ge=0, le=300, description="Seconds to sample GPU utilisation, memory and power "
                            "(one reading lies: a data-loading pause reads 0 %). 0 = one reading.")
    interval_s: float = Field(1.0, gt=0, le=60, description="Seconds between readings inside the window.")
    price_per_hour: float | None = Field(None, ge=0, le=10_000, description="What the box costs per hour (any "
                                         "currency); with it, idle_cost is the money spent while idle so far.")
    provider: str | None = Field(None, min_length=1, max_length=64, description="Provider profile name (runpod, "
                                 "vastai, lambda, ...). Default: detected from the box's documented environment.")
    paths: list[str] = Field(default_factory=list, max_length=64, description="Extra folders or files on the box "
                             "to check for custody (besides our runs' folders and output dirs).")
    dest: str | None = Field(None, min_length=1, max_length=4096, description="Only count copies verified into "
                             "this local destination (as given to run_pull). Default: any verified copy.")
    util_threshold: int = Field(5, ge=1, le=100, description="A GPU at or above this utilisation (%) at any "
                                "reading is busy.")
    stall_minutes: float = Field(30.0, gt=0, le=1440, description="A run alive whose log has not changed for "
                                 "this long is stalled.")


class ProviderOut(StrictModel):
    name: str | None
    how: str = Field(description="given (by the caller), detected (from a documented sign), or unknown")
    evidence: str
    source_urls: list[str] = Field(default_factory=list)


class Command(StrictModel):
    inside: str = Field(description="Run on the box itself ('not documented' where the provider does not say)")
    outside: str = Field(description="Run on the user's machine, or the console action")


class ActionOut(StrictModel):
    command: Command
    keeps: str
    wipes: str
    still_bills: str
    source_urls: list[str] = Field(default_factory=list)


class ProcOut(StrictModel):
    pid: int
    used_bytes: int | None
    ours: bool = Field(description="A process of one of our runs (its process group is in the run ledger)")
    run_id: str | None
    command: str


class GpuOut(StrictModel):
    index: int
    name: str | None
    util_mean: float | None
    util_max: int | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_w_mean: float | None
    lost: str | None = None
    processes: list[ProcOut]


class RunOut(StrictModel):
    run_id: str
    state: str
    ended_at: str | None
    last_output_at: str | None
    pids: list[int]
    follows: str | None = Field(None, description="The log its progress is read from")
    checkpoints: CheckpointOutlook | None = Field(None, description="For a run with a checkpoint folder: will the "
                                                  "saves of the next 8 h fit, and does the folder survive a stop")


class UnsyncedOut(StrictModel):
    path: str
    size: int
    reason: str


class GuardOut(StrictModel):
    armed: bool
    action: str | None = None
    state: str | None = None
    detail: str | None = None
    notice: str | None = Field(None, description="What the guard reported (a notify record, a refused or done "
                               "stop); shown until the guard is re-armed")


class BoxIdle(StrictModel):
    verdict: Literal["busy", "idle", "stalled", "unknown"]
    idle_since: str | None = Field(description="ISO time the box became idle (UTC), when the verdict is idle")
    idle_for_s: float | None
    evidence: list[str]
    provider: ProviderOut
    price_per_hour: float | None
    idle_cost: float | None = Field(description="price_per_hour × idle hours so far, in the price's currency")
    stop: ActionOut | None
    terminate: ActionOut | None
    terminate_safe: bool = Field(description="False while any file on the box has no verified copy")
    unsynced: list[UnsyncedOut] = Field(description=f"Files that exist only on this box (first {MAX_LISTED})")
    unsynced_count: int
    custody_files_checked: int
    gpus: list[GpuOut]
    runs: list[RunOut]
    guard: GuardOut
    backend: str
    window_s: float
    next_step: str


def _action(profile: object, which: str) -> ActionOut:
    from ..providers import Profile, _refs

    assert isinstance(profile, Profile)
    action = getattr(profile.front.lifecycle, which)
    refs = {r for fact in (action.inside, action.outside, action.keeps, action.wipes, action.still_bills)
            for r in _refs(fact.source)}
    urls = sorted({s.url for r in refs if (s := profile.source_for(r))})
    return ActionOut(command=Command(inside=action.inside.value, outside=action.outside.value),
                     keeps=action.keeps.value, wipes=action.wipes.value, still_bills=action.still_bills.value,
                     source_urls=urls)


def _provider(name: str | None):  # -> (ProviderOut, Profile | None)
    from ..providers import load_profiles, resolve_provider
    from .detect import box_environment, detect

    profiles = load_profiles()
    if name:
        profile = resolve_provider(name, profiles)
        return ProviderOut(name=profile.name, how="given", evidence="named by the caller"), profile
    found = detect(profiles, box_environment())
    out = ProviderOut(name=found.provider, how=found.how, evidence=found.evidence, source_urls=list(found.source_urls))
    return out, profiles.get(found.provider) if found.provider else None


def _guard_out() -> GuardOut:
    from . import guard

    config = guard.load_config()
    note = guard.notice()
    state = guard.status() or {}
    if config is None:
        return GuardOut(armed=False, state=state.get("state"), notice=note.get("message") if note else None)
    return GuardOut(armed=guard.alive(config.pid), action=config.action, state=state.get("state"),
                    detail=state.get("reason") or (f"acts at {_iso(state['acts_at'])}"
                                                   if state.get("acts_at") else None),
                    notice=note.get("message") if note else None)


def box_idle(args: BoxIdleInput, progress: Progress) -> BoxIdle:
    from .custody import unsynced
    from .guard import GuardConfig, custody_roots
    from .ledger import our_runs
    from .sampling import sample
    from .verdict import decide, owners

    provider, profile = _provider(args.provider)
    progress(0, args.window_s or None, f"sampling GPUs for {args.window_s:g} s")
    window = sample(args.window_s, args.interval_s)
    runs = our_runs(args.stall_minutes * 60)
    decision = decide(window, runs, args.util_threshold)
    mine = owners(runs)
    roots = custody_roots(GuardConfig("notify", 0, 0, False, False, 1, 1, list(args.paths)), runs)
    missing, checked = unsynced(roots, args.dest)
    idle_for = time.time() - decision.idle_since if decision.idle_since is not None else None
    cost = (args.price_per_hour * idle_for / 3600) if args.price_per_hour is not None and idle_for else None
    gpus = [GpuOut(index=g.index, name=g.name, util_mean=g.util_mean, util_max=g.util_max,
                   memory_used_bytes=g.memory_used_bytes, memory_total_bytes=g.memory_total_bytes,
                   power_w_mean=g.power_w_mean, lost=g.lost,
                   processes=[ProcOut(pid=pid, used_bytes=used, ours=pid in mine, run_id=mine.get(pid),
                                      command=_cmdline(pid)) for pid, used in sorted(g.processes.items())])
            for g in window.gpus]
    result = BoxIdle(
        verdict=decision.verdict, idle_since=_iso(decision.idle_since), idle_for_s=idle_for,
        evidence=decision.evidence, provider=provider, price_per_hour=args.price_per_hour,
        idle_cost=round(cost, 4) if cost is not None else None,
        stop=_action(profile, "stop") if profile else None,
        terminate=_action(profile, "terminate") if profile else None,
        terminate_safe=not missing, unsynced=[UnsyncedOut(path=m.path, size=m.size, reason=m.reason)
                                              for m in missing[:MAX_LISTED]],
        unsynced_count=len(missing), custody_files_checked=checked, gpus=gpus,
        runs=[RunOut(run_id=r.run_id, state=r.state, ended_at=_iso(r.ended_at), last_output_at=_iso(r.last_output_at),
                     pids=sorted(r.pids), follows=r.follows, checkpoints=_outlook(r, args.provider)) for r in runs],
        guard=_guard_out(), backend=window.backend, window_s=window.seconds, next_step="")
    result.next_step = _next_step(result)
    return result


def _outlook(run, provider: str | None) -> CheckpointOutlook | None:
    """The checkpoint outlook of a live run that named its checkpoint folder (run_start/run_adopt checkpoint_dir).
    None for a run that ended: it saves nothing more, and extrapolating its old saves forward would predict space
    it will never take."""
    from ..runs.checkpoints import checkpoint_outlook
    from ..runs.progress import progress_of

    meta = run.meta or {}
    if not meta.get("checkpoint_dir") or run.state == "ended":
        return None
    progress = progress_of(Path(run.follows)) if run.follows else None
    return checkpoint_outlook(Path(meta["checkpoint_dir"]), progress=progress, provider=provider,
                              save_every_steps=meta.get("save_every_steps"), keep_last=meta.get("keep_last"))


def _next_step(r: BoxIdle) -> str:
    if r.verdict == "busy":
        return "The box is working; nothing to stop. Check again later or arm idle_guard (action=notify or stop)."
    if r.verdict == "unknown":
        return "GPU load could not be read; check gpu_health before deciding anything."
    first = ("A run is stalled: read its log (run status) before stopping anything. " if r.verdict == "stalled"
             else "")
    if r.unsynced_count:
        return (first + f"{r.unsynced_count} file(s) exist only on this box: copy them off with run_pull (it "
                "verifies sha256) before any stop or terminate. Do not terminate.")
    stop = r.stop.command.outside if r.stop else "the provider's stop (provider unknown: pass provider=)"
    return first + f"Everything is copied off. Stop the box ({stop}); terminate only if nothing on it is needed."


def render_box_idle(r: BoxIdle) -> str:
    head = r.verdict.upper()
    if r.verdict == "idle":
        head += f" since {r.idle_since} ({(r.idle_for_s or 0) / 60:.0f} min)"
        if r.idle_cost is not None:
            head += f", idle cost so far {r.idle_cost:.2f} at {r.price_per_hour:g}/h"
    lines = [f"box_idle: {head}", *[f"  - {e}" for e in r.evidence]]
    if r.backend.startswith("fake:"):
        machine = getattr(r, "host", None) or "this machine"
        lines.append(f"!! FAKE NVML scenario '{r.backend[5:]}': not {machine}'s state")
    if r.gpus:
        lines.append(format_table(["gpu", "util mean/max", "memory", "power", "processes"], [
            [g.index, f"{g.util_mean or 0:.0f}/{g.util_max if g.util_max is not None else '-'} %",
             gib(g.memory_used_bytes, 1), f"{g.power_w_mean:.0f} W" if g.power_w_mean is not None else "-",
             ", ".join(f"{p.pid}{' (run ' + p.run_id + ')' if p.run_id else ''}" for p in g.processes) or "-"]
            for g in r.gpus]))
    if r.runs:
        lines.append("runs: " + ", ".join(f"{x.run_id} {x.state}" for x in r.runs))
    for x in r.runs:
        if x.checkpoints:
            lines.append(f"checkpoints of {x.run_id}: {x.checkpoints.verdict} — {x.checkpoints.summary}")
    lines.append(f"provider: {r.provider.name or 'unknown'} ({r.provider.how}: {r.provider.evidence})")
    for name, action in (("stop", r.stop), ("terminate", r.terminate)):
        if action:
            lines.append(f"{name}: inside `{action.command.inside}` · from your machine: {action.command.outside}\n"
                         f"    keeps: {action.keeps}\n    wipes: {action.wipes}\n    still bills: {action.still_bills}")
    lines.append(f"custody: {r.unsynced_count} of {r.custody_files_checked} file(s) not copied off"
                 + "".join(f"\n    {u.path} ({gib(u.size, 2)}): {u.reason}" for u in r.unsynced[:10]))
    if r.guard.armed or r.guard.notice:
        lines.append(f"guard: {'armed ' + (r.guard.action or '') if r.guard.armed else 'not armed'}"
                     f"{' · ' + r.guard.state if r.guard.state else ''}"
                     f"{' · NOTICE: ' + r.guard.notice if r.guard.notice else ''}")
    lines.append(f"next: {r.next_step}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# idle_guard


class IdleGuardInput(StrictModel):
    action: Literal["notify", "stop"] = Field("notify", description="notify: leave a record every later box_idle "
                                              "shows. stop: run the provider's own stop command from inside the "
                                              "box (never terminate or delete).")
    idle_minutes: float = Field(30.0, gt=0, le=1440, description="How long the box must stay idle before the "
                                "guard acts (fractions allowed).")
    util_threshold: int = Field(5, ge=1, le=100, description="GPU utilisation (%) below which a GPU counts as idle.")
    on_stalled: bool = Field(False, description="Also act when a run of ours is stalled (alive, log not moving).")
    allow_unsynced: bool = Field(False, description="Stop even when custody finds files not copied off.")
    provider: str | None = Field(None, min_length=1, max_length=64, description="Provider profile; default detected.")
    paths: builtins.list[str] = Field(default_factory=builtins.list, max_length=64,
                                      description="Extra paths custody must find copied.")
    notify: NotifyCommand | None = Field(None, min_length=1, max_length=64, description=NOTIFY_HELP + ". The guard "
                                         "runs it when the box is idle (action=notify), warn_minutes before a stop, "
                                         "right before and after the stop, and when a stop is refused")
    warn_minutes: float = Field(5.0, ge=0, le=1440, description="With action=stop and notify: warn the person this "
                                "long before the stop (fractions allowed; 0: no warning)")
    interval_s: float = Field(10.0, ge=0.1, le=600, description="Seconds between the guard's checks.")
    stall_minutes: float = Field(30.0, gt=0, le=1440, description="Log silence after which a live run is stalled.")
    dry_run: bool = Field(True, description="Show exactly what would run and when, and a confirm_token; arm nothing.")
    confirm_token: str | None = Field(None, max_length=64, description="The dry run's token: arming needs it, and "
                                      "it is bound to the action, command, threshold, window and this boot.")
    remove: bool = Field(False, description="Disarm the guard (and stop its process).")
    list: bool = Field(False, description="Show the armed guard, its state and its recent events.")


class GuardEvent(StrictModel):
    at: str
    event: str
    reason: str | None = None


class IdleGuardResult(StrictModel):
    mode: Literal["dry_run", "armed", "removed", "nothing_to_remove", "list"]
    plan: str = Field(description="Exactly what the guard runs and when")
    action: str | None = None
    argv: list[str] = Field(default_factory=list, description="The stop command, as executed (no shell)")
    provider: str | None = None
    confirm_token: str | None = None
    armed: bool
    pid: int | None = None
    state: str | None = None
    notice: str | None = None
    events: list[GuardEvent] = Field(default_factory=list)
    next_step: str


def _config(args: IdleGuardInput):  # -> (GuardConfig, provider name)
    from .detect import box_environment, inside_argv
    from .guard import GuardConfig

    argv: list[str] = []
    provider_name = None
    if args.action == "stop":
        provider, profile = _provider(args.provider)
        if profile is None:
            raise InputError("provider", f"action=stop needs the provider's stop command, and {provider.evidence}")
        provider_name = profile.name
        try:
            argv = inside_argv(profile.front.lifecycle.stop, box_environment())
        except ValueError as err:
            raise InputError("action", f"{profile.name}: {err}; use action=notify") from None
    elif args.provider:
        provider_name = _provider(args.provider)[0].name
    config = GuardConfig(action=args.action, idle_s=args.idle_minutes * 60, util_threshold=args.util_threshold,
                         on_stalled=args.on_stalled, allow_unsynced=args.allow_unsynced, interval_s=args.interval_s,
                         stall_s=args.stall_minutes * 60, paths=list(args.paths), argv=argv, provider=provider_name,
                         notify=list(args.notify or []), warn_s=min(args.warn_minutes * 60, args.idle_minutes * 60))
    return config, provider_name


def _plan(config, window=None) -> str:
    """Exactly what the guard will do, in words; ``window`` (a GPU sample) says how it can judge load here."""
    what = (f"run `{' '.join(config.argv)}` (the {config.provider} stop, from inside the box)"
            if config.action == "stop" else "write a notice that every later box_idle call shows")
    stalled = " or stalled (whatever its GPU load: a hung collective spins at 100 %)" if config.on_stalled else ""
    custody = ("" if config.action != "stop" else
               " It refuses while custody finds files not copied off." if not config.allow_unsynced else
               " It does NOT check custody (allow_unsynced).")
    gpus = (f"every GPU stays under {config.util_threshold}%" if window is None or window.ok else
            "nothing else holds a CUDA context")
    plan = (f"Every {config.interval_s:g} s, check runs and GPUs; once all our runs have ended{stalled} and {gpus} "
            f"for {config.idle_s / 60:g} min with no process of ours on a GPU, {what}.{custody}")
    if window is not None and not window.ok:
        plan += (f" GPU load cannot be read here ({window.detail}): idleness is decided from run states and log/file "
                 "progress only, and a job neither started by run_start nor adopted (run_adopt) is not seen.")
    if config.notify:
        tells = ("when the box is idle" if config.action == "notify" else
                 (f"{config.warn_s / 60:g} min before the stop, " if config.warn_s else "") +
                 "right before and after it, and when a stop is refused")
        plan += f" It tells the person with `{' '.join(config.notify)}` {tells}."
    elif config.action == "stop":
        plan += " Nobody is told before the stop: pass notify to reach a person."
    return plan


def _events(raw: list[dict]) -> list[GuardEvent]:
    return [GuardEvent(at=_iso(e.get("at")) or "?", event=str(e.get("event")), reason=e.get("reason")) for e in raw]


def idle_guard(args: IdleGuardInput, progress: Progress) -> IdleGuardResult:
    from . import guard

    if args.remove:
        removed = guard.remove()
        return IdleGuardResult(mode="removed" if removed else "nothing_to_remove", plan="", armed=False,
                               events=_events(guard.events(last=5)),
                               next_step="Guard removed." if removed else "No guard was armed.")
    if args.list:
        config = guard.load_config()
        state = guard.status() or {}
        note = guard.notice()
        return IdleGuardResult(mode="list", plan=_plan(config) if config else "no guard armed",
                               action=config.action if config else None, argv=config.argv if config else [],
                               provider=config.provider if config else None, armed=bool(config and
                                                                                       guard.alive(config.pid)),
                               pid=config.pid if config else None, state=state.get("state"),
                               notice=note.get("message") if note else None, events=_events(guard.events()),
                               next_step="idle_guard remove=true disarms it." if config else
                               "Arm one with a dry run, then dry_run=false and its confirm_token.")
    from .sampling import sample

    config, provider = _config(args)
    token = config.token()
    if args.dry_run:
        window = sample(0.0, timeout_s=5.0)
        return IdleGuardResult(mode="dry_run", plan=_plan(config, window), action=config.action, argv=config.argv,
                               provider=provider, confirm_token=token, armed=False,
                               next_step="Show the plan to the user; to arm, repeat with dry_run=false and "
                               "this confirm_token.")
    if args.confirm_token != token:
        raise InputError("confirm_token", "missing or does not match this plan (action, command, threshold, "
                         "window, paths and boot are bound); run the dry run again and pass its token")
    armed = guard.arm(config)
    return IdleGuardResult(mode="armed", plan=_plan(armed), action=armed.action, argv=armed.argv, provider=provider,
                           armed=True, pid=armed.pid, next_step="box_idle shows the guard's state and notices; "
                           "idle_guard list=true shows its events; remove=true disarms it.")


def elicit_guard(args: IdleGuardInput) -> str | None:
    """Ask the person before arming a guard that will stop the box (a token alone the model can obtain)."""
    if args.action != "stop" or args.dry_run or args.remove or args.list:
        return None
    return (f"Arm an idle guard that STOPS this box after {args.idle_minutes:g} idle minutes "
            f"(GPU under {args.util_threshold}%, all runs ended)? Stopping keeps or wipes data as the provider "
            "defines; box_idle shows what.")


def render_guard(r: IdleGuardResult) -> str:
    lines = [f"idle_guard: {r.mode.replace('_', ' ')}" + (" (nothing armed)" if r.mode == "dry_run" else "")]
    if r.plan:
        lines.append(f"plan: {r.plan}")
    if r.argv:
        lines.append(f"command: {' '.join(r.argv)}")
    if r.state or r.pid:
        lines.append(f"state: {r.state or '-'} · pid {r.pid or '-'} · {'running' if r.armed else 'not running'}")
    if r.notice:
        lines.append(f"NOTICE: {r.notice}")
    lines += [f"  {e.at} {e.event}: {e.reason or ''}" for e in r.events]
    if r.confirm_token:
        lines.append(f"confirm_token: {r.confirm_token}")
    lines.append(f"next: {r.next_step}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# custody on the box (internal) and run_pull (local)


class FileHashModel(StrictModel):
    path: str
    size: int
    sha256: str
    mtime_ns: int


class CustodyHashesInput(StrictModel):
    run_id: str | None = Field(None, min_length=1, max_length=200, description="Run whose folder and output "
                               "dirs to hash")
    paths: list[str] = Field(default_factory=list, max_length=64, description="Extra paths on the box")


class CustodyHashes(StrictModel):
    roots: list[str]
    missing_roots: list[str]
    files: list[FileHashModel]


def custody_hashes(args: CustodyHashesInput, progress: Progress) -> CustodyHashes:
    from .custody import hash_roots
    from .ledger import find_run, read_run

    roots: list[str] = []
    if args.run_id:
        run_dir = find_run(args.run_id)
        if run_dir is None:
            raise InputError("run_id", f"no run {args.run_id!r} in this box's run ledger")
        view = read_run(run_dir, stall_s=float("inf"))
        roots += [str(run_dir), *(view.output_dirs if view else ())]
    roots += [str(Path(p).expanduser()) for p in args.paths]
    roots = list(dict.fromkeys(r.rstrip("/") or "/" for r in roots))
    present = [r for r in roots if Path(r).exists()]
    files = [FileHashModel(path=f.path, size=f.size, sha256=f.sha256, mtime_ns=f.mtime_ns) for f in hash_roots(present)]
    return CustodyHashes(roots=present, missing_roots=[r for r in roots if r not in present], files=files)


class CustodyMarkInput(StrictModel):
    files: list[FileHashModel] = Field(max_length=200_000)
    dest: str = Field(min_length=1, max_length=4096)


class CustodyMark(StrictModel):
    recorded: int
    refused: list[str]


def custody_mark(args: CustodyMarkInput, progress: Progress) -> CustodyMark:
    from .custody import FileHash, mark_verified

    recorded, refused = mark_verified([FileHash(**f.model_dump()) for f in args.files], args.dest)
    return CustodyMark(recorded=len(recorded), refused=refused)


class RunPullInput(StrictModel):
    host: str = Field(min_length=1, max_length=255, description="The box: an ssh alias or user@name[:port]")
    run_id: str | None = Field(None, min_length=1, max_length=200, description="Run whose folder and output dirs "
                               "to copy back")
    dest: str = Field(min_length=1, max_length=4096, description="Local folder to copy into (created if missing); "
                      "each box folder lands in dest/<its name>/")
    paths: list[str] = Field(default_factory=list, max_length=64, description="Extra folders or files on the box")


class MismatchOut(StrictModel):
    path: str
    local: str
    kind: str
    detail: str


class RunPullResult(StrictModel):
    verdict: Literal["verified", "mismatch", "failed"]
    host: str
    run_id: str | None
    dest: str
    roots: list[str]
    missing_roots: list[str]
    files: int
    bytes: int
    verified: int
    literal_bytes: int | None = Field(description="Bytes rsync actually sent (less than bytes when a copy resumed)")
    first_pass_mismatches: list[MismatchOut] = Field(description="Found after the resumable copy and repaired")
    mismatches: list[MismatchOut] = Field(description="Still wrong at the end: these copies are not good")
    recorded_on_box: int
    rsync_exit: int | None
    rsync_tail: str
    next_step: str


def run_pull(args: RunPullInput, progress: Progress) -> RunPullResult:
    from ..remote import rsync_command
    from .custody import FileHash
    from .pull import copy_and_verify

    if not args.run_id and not args.paths:
        raise InputError("run_id", "name a run_id or at least one path to pull")
    progress(0, 3, f"hashing on {args.host}")
    hashes = CUSTODY_HASHES.call({"run_id": args.run_id, "paths": args.paths, "host": args.host})
    assert isinstance(hashes, CustodyHashes)
    dest = Path(args.dest).expanduser().resolve()
    rsh, prefix = rsync_command(args.host)
    box_files = [FileHash(**f.model_dump()) for f in hashes.files]
    progress(1, 3, "copying with rsync")
    outcome = copy_and_verify(hashes.roots, box_files, dest, rsh, prefix) if hashes.roots else None
    recorded = 0
    if outcome and outcome.verified:
        progress(2, 3, f"recording verified copies on {args.host}")
        mark = CUSTODY_MARK.call({"files": [f.__dict__ for f in outcome.verified], "dest": str(dest),
                                  "host": args.host})
        assert isinstance(mark, CustodyMark)
        recorded = mark.recorded
    return _pull_result(args, hashes, outcome, dest, recorded)


def _pull_result(args: RunPullInput, hashes: CustodyHashes, outcome, dest: Path, recorded: int) -> RunPullResult:
    def out(items) -> list[MismatchOut]:
        return [MismatchOut(path=m.path, local=m.local, kind=m.kind, detail=m.detail) for m in items]

    mismatches = out(outcome.mismatches) if outcome else []
    failed = outcome is None or (outcome.rsync_exit is None) or (outcome.rsync_exit != 0 and bool(mismatches))
    verdict = "failed" if failed else "mismatch" if mismatches else "verified"
    next_step = {"verified": "Every file is copied and its sha256 matches the box; box_idle now counts them as "
                             "copied off.",
                 "mismatch": "Some copies do not match the box: run run_pull again (it resumes); do not tear "
                             "the box down.",
                 "failed": "Nothing was verified (no such paths, or rsync failed: see rsync_tail); the box still "
                           "holds the only copy."}[verdict]
    return RunPullResult(verdict=verdict, host=args.host, run_id=args.run_id, dest=str(dest), roots=hashes.roots,
                         missing_roots=hashes.missing_roots, files=len(hashes.files),
                         bytes=sum(f.size for f in hashes.files), verified=len(outcome.verified) if outcome else 0,
                         literal_bytes=outcome.literal_bytes if outcome else None,
                         first_pass_mismatches=out(outcome.first_pass) if outcome else [], mismatches=mismatches,
                         recorded_on_box=recorded, rsync_exit=outcome.rsync_exit if outcome else None,
                         rsync_tail=outcome.rsync_tail[-1500:] if outcome else "", next_step=next_step)


def render_pull(r: RunPullResult) -> str:
    lines = [f"run_pull: {r.verdict.upper()} · {r.verified}/{r.files} file(s), {gib(r.bytes, 2)} from {r.host} "
             f"into {r.dest}"]
    if r.literal_bytes is not None:
        lines.append(f"rsync sent {gib(r.literal_bytes, 2)} (exit {r.rsync_exit})")
    if r.missing_roots:
        lines.append(f"not on {r.host}: " + ", ".join(r.missing_roots))
    for m in r.first_pass_mismatches:
        lines.append(f"  repaired: {m.path} ({m.kind}: {m.detail})")
    for m in r.mismatches:
        lines.append(f"  MISMATCH: {m.path} -> {m.local} ({m.kind}: {m.detail})")
    lines.append(f"next: {r.next_step}")
    return "\n".join(lines)


CUSTODY_HASHES = ToolSpec(
    name="custody_hashes", cli="custody-hashes", title="Hash files on the box (internal)",
    description="Size, sha256 and mtime of a run's files and extra paths, computed on the box for run_pull.",
    input_model=CustodyHashesInput, output_model=CustodyHashes, run=custody_hashes, read_only=True,
    remote=True, internal=True)

CUSTODY_MARK = ToolSpec(
    name="custody_mark", cli="custody-mark", title="Record verified copies on the box (internal)",
    description="Record on the box that these files were copied off and verified, so box_idle and the guard "
                "know they are not the only copy.",
    input_model=CustodyMarkInput, output_model=CustodyMark, run=custody_mark, read_only=False, remote=True,
    internal=True)

SPECS = [
    ToolSpec(
        name="box_idle", cli="idle", title="Is this box still costing money, and can it be shut down?",
        description=(
            "Is my rented GPU box idle but still billing, and what can I safely do about it? Samples GPU "
            "utilisation, memory and power per GPU over window_s, lists the processes on each GPU and whether "
            "they belong to one of our runs (run ledger), the runs' states, and decides: busy, idle (since when, "
            "with evidence), stalled (a run alive whose log stopped), or unknown. Names the provider (from its "
            "documented environment, or the provider argument) and, from its profile, the exact stop and "
            "terminate commands (inside the box and from your machine) and what each keeps, wipes and still "
            "bills. With price_per_hour: the idle cost so far. Custody: lists files (our runs' folders and "
            "outputs, plus paths) that were never copied off with a verified run_pull; terminate_safe is false "
            "while any exist. Shows the idle guard's state and notices. Read-only: stops nothing."),
        input_model=BoxIdleInput, output_model=BoxIdle, run=box_idle, read_only=True, remote=True,
        render_text=render_box_idle),
    ToolSpec(
        name="idle_guard", cli="guard", title="Arm, list or remove an idle guard on the box",
        description=(
            "An opt-in process on the box that acts once all our runs (started or adopted) have ended (or one is "
            "stalled, with on_stalled, whatever its GPU load) and every GPU stays under util_threshold for "
            "idle_minutes (fractions allowed), never while a process of ours is on a GPU; where GPU load cannot "
            "be read (no NVML) the runs' states and log/file progress decide, and the dry run says so. "
            "action=notify leaves a record every later box_idle shows; action=stop runs the provider's documented "
            "stop command from inside the box (never terminate or delete) and refuses while custody finds files "
            "not copied off unless allow_unsynced. notify runs your command (argv or one string, never a shell; "
            "{message} filled in) when idle, warn_minutes before a stop, and before and after it. Dry run by "
            "default: returns the "
            "exact plan and command and a confirm_token bound to them and to this boot; arm with "
            "dry_run=false and that token (stop also asks the person where the client supports it). "
            "list=true shows the guard and its events; remove=true disarms it. Survives the SSH session."),
        input_model=IdleGuardInput, output_model=IdleGuardResult, run=idle_guard, read_only=False,
        destructive=True, idempotent=False, remote=True, render_text=render_guard, elicit=elicit_guard,
        cli_command_flags=("notify",)),
    ToolSpec(
        name="run_pull", cli="pull", title="Copy a run's outputs back and verify them",
        description=(
            "Copy a run's folder and output dirs (and any paths) from the box to dest with rsync over the same "
            "SSH set-up, resumable (--partial --append-verify), then compare sha256 computed on the box with "
            "sha256 computed here; any mismatch gets one repair pass and is reported if it persists. Verified "
            "files are recorded on the box so box_idle and the idle guard know they were copied off. Never "
            "deletes anything on either side."),
        input_model=RunPullInput, output_model=RunPullResult, run=run_pull, read_only=False, idempotent=True,
        open_world=True, render_text=render_pull, cli_positional="run_id",
        exit_code=lambda r: 0 if r.verdict == "verified" else 1),
    CUSTODY_HASHES,
    CUSTODY_MARK,
]
