"""The idle guard: a detached process on the box that notifies, or stops the box, once it is idle.

Why on the box: the user's laptop sleeps and MCP calls time out; only a process on the box itself
sees the box all night. It is started with :func:`~remote_gpu_trainer.detach.spawn_detached` (own
session, so the SSH session ending does not kill it) and keeps its state in a folder
(``$RGT_GUARD_DIR`` or ``~/.cache/remote-gpu-trainer/guard/``):

* ``guard.json`` — what it was armed to do (action, threshold, window, the exact stop argv, pid);
  deleting it disarms the guard, which exits at its next check;
* ``status.json`` — its latest check (watching / idle since / refused / fired) and why;
* ``events.jsonl`` — one line per change and per action, with the reason;
* ``notice.json`` — the record ``action=notify`` (and a refused stop) leaves for every later
  ``box_idle`` call to show.

It acts only when **all** hold at a check, continuously for ``idle_s``: no run of ours running (a
stalled one counts as ended only with ``on_stalled``), no process of ours on a GPU (except a stalled
run's when ``on_stalled``), and every GPU under the utilisation threshold unless only a stalled run holds
it (with ``on_stalled``: a rank hung in NCCL spins at 100 %). Where GPU load cannot be read (no NVML), the
runs' states and their log/file progress decide, and a process holding a CUDA context that is not ours
blocks (verdict.py); the dry run says so. A ``stop`` is refused while custody finds files not copied off
(unless ``allow_unsynced``), and only ever runs the provider's documented stop command from inside the
box: never terminate or delete.

The person hears about it through their own ``notify`` command (notify.py): for ``action=notify`` when the
box is idle; for ``action=stop`` a warning ``warn_s`` before the stop, "stopping" right before it, the
result after it (it may not arrive when the stop takes the box down at once), a refused stop, and a
cancelled one when the box gets busy again after the warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..notify import box_name, send
from ..processes.fingerprint import boot_id
from .custody import unsynced
from .ledger import RunView, our_runs
from .sampling import Window, sample
from .verdict import gpu_work, owners, unreadable_note

GUARD_ENV = "RGT_GUARD_DIR"
MODULE = "remote_gpu_trainer.idle.guard"
STOP_TIMEOUT_S = 120.0


def guard_dir() -> Path:
    override = os.environ.get(GUARD_ENV)
    return Path(override) if override else Path.home() / ".cache" / "remote-gpu-trainer" / "guard"


@dataclass
class GuardConfig:
    action: str
    """``notify`` or ``stop``."""
    idle_s: float
    util_threshold: int
    on_stalled: bool
    allow_unsynced: bool
    interval_s: float
    stall_s: float
    paths: list[str]
    argv: list[str] = field(default_factory=list)
    """The stop command (action stop), exactly as it will be executed (no shell)."""
    provider: str | None = None
    notify: list[str] = field(default_factory=list)
    """The person's notify command (notify.py): idle (action notify), a warning ``warn_s`` before a stop, the
    stop and its result, a refused stop."""
    warn_s: float = 0.0
    host: str = ""
    boot_id: str = ""
    armed_at: float = 0.0
    pid: int | None = None

    def token(self) -> str:
        """Bound to everything that decides what runs and when, whom it tells, and to this boot."""
        parts = [boot_id(), self.action, "\0".join(self.argv), str(self.util_threshold), f"{self.idle_s:g}",
                 str(self.on_stalled), str(self.allow_unsynced), "\0".join(self.paths), str(self.provider),
                 "\0".join(self.notify), f"{self.warn_s:g}"]
        return "guard1-" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def record_event(state: Path, kind: str, **details: Any) -> dict[str, Any]:
    event = {"at": time.time(), "event": kind, **details}
    with (state / "events.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(event) + "\n")
    return event


def events(state: Path | None = None, last: int = 20) -> list[dict[str, Any]]:
    try:
        lines = ((state or guard_dir()) / "events.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines[-last:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def load_config(state: Path | None = None) -> GuardConfig | None:
    data = _read((state or guard_dir()) / "guard.json")
    if data is None:
        return None
    try:
        return GuardConfig(**data)
    except TypeError:
        return None


def notice(state: Path | None = None) -> dict[str, Any] | None:
    return _read((state or guard_dir()) / "notice.json")


def status(state: Path | None = None) -> dict[str, Any] | None:
    return _read((state or guard_dir()) / "status.json")


def alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live guard process (checked by its command line, not just the pid)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return MODULE.encode() in cmdline and state[state.rfind(")") + 2] != "Z"


# ------------------------------------------------------------------------------------------------
# Arming and removal (called by the idle_guard tool on the box)


def arm(config: GuardConfig, state: Path | None = None) -> GuardConfig:
    """Write guard.json and start the detached guard process. Replaces a guard already armed."""
    from ..detach import spawn_detached

    state = state or guard_dir()
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    remove(state, reason="replaced by a new guard")
    config.boot_id = boot_id()
    config.armed_at = time.time()
    config.host = config.host or box_name()
    (state / "notice.json").unlink(missing_ok=True)
    _write(state / "guard.json", asdict(config))
    pid = spawn_detached([sys.executable, "-m", MODULE, str(state)], state / "guard.log")
    deadline = time.monotonic() + 10  # return a guard that runs: until exec, /proc shows the caller's command line
    while not alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    config.pid = pid
    _write(state / "guard.json", asdict(config))
    record_event(state, "armed", action=config.action, argv=config.argv, idle_s=config.idle_s,
                 util_threshold=config.util_threshold, pid=pid)
    return config


def remove(state: Path | None = None, reason: str = "removed by the user") -> bool:
    """Disarm: delete guard.json (the guard exits at its next check) and SIGTERM it. True if one was armed."""
    state = state or guard_dir()
    config = load_config(state)
    if config is None:
        return False
    (state / "guard.json").unlink(missing_ok=True)
    if alive(config.pid):
        assert config.pid is not None
        os.kill(config.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while alive(config.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    record_event(state, "removed", reason=reason, pid=config.pid)
    return True


# ------------------------------------------------------------------------------------------------
# The guard process


def blockers(config: GuardConfig, runs: list[RunView], window: Window) -> list[str]:
    """Why the box must not be treated as idle right now (empty: it is idle at this check). GPU load held only
    by a stalled run does not block with ``on_stalled`` (a hung collective spins at 100 %); without GPU readings
    the runs and their files decide (verdict.py), and for ``action=stop`` a /proc scan that cannot rule out another
    user's CUDA job blocks too."""
    reasons = [f"run {r.run_id} is running" for r in runs if r.state == "running"]
    stalled = {r.run_id for r in runs if r.state == "stalled"}
    if stalled and not config.on_stalled:
        reasons += [f"run {rid} is stalled (on_stalled is off, so it still counts as running)" for rid in stalled]
    mine = owners(runs)
    for gpu in window.gpus:
        for pid in gpu.processes:
            run_id = mine.get(pid)
            if run_id and not (config.on_stalled and run_id in stalled):
                reasons.append(f"process {pid} of run {run_id} is on GPU {gpu.index}")
    work, doubts = gpu_work(window, runs, config.util_threshold)
    reasons += work
    if config.action == "stop":  # a stop must be proven safe; a notice on a doubt only costs a message
        reasons += doubts
    if not window.ok and not runs:
        reasons.append(f"{unreadable_note(window)}; no run of ours is recorded, so nothing shows the box idle")
    return reasons


def custody_roots(config: GuardConfig, runs: list[RunView]) -> list[str]:
    roots = [str(r.run_dir) for r in runs] + [d for r in runs for d in r.output_dirs] + list(config.paths)
    return list(dict.fromkeys(roots))


def tell(config: GuardConfig, state: Path, kind: str, message: str, runs: list[RunView] = ()) -> None:
    """Run the person's notify command (if any) for one guard event, and record that it did."""
    if not config.notify:
        return
    text = f"[{config.host or box_name()}] idle guard: {message}"
    record = send(config.notify, {"message": text, "state": kind, "host": config.host or box_name(),
                                  "run_id": ",".join(r.run_id for r in runs), "step": ""},
                  env={"RGT_GUARD_DIR": str(state)}, cwd=state)
    record_event(state, "told", what=kind, reason=text, exit_code=record.get("exit_code"), error=record.get("error"))


def _act(config: GuardConfig, state: Path, runs: list[RunView], idle_since: float) -> bool:
    """Take the action. True when the guard is done (fired), False to keep watching (a refusal)."""
    idle_for = time.time() - idle_since
    why = f"idle for {idle_for:.0f} s (window {config.idle_s:g} s, GPUs under {config.util_threshold}% where readable)"
    if config.action == "notify":
        message = f"the idle guard found this box {why}; it did nothing else"
        _write(state / "notice.json", {"at": time.time(), "kind": "idle", "idle_since": idle_since,
                                       "message": message})
        record_event(state, "notified", reason=why)
        tell(config, state, "idle", f"this box has been {why}: nothing of ours is working on it", runs)
        return True
    if not config.allow_unsynced:
        missing, _ = unsynced(custody_roots(config, runs))
        if missing:
            message = (f"stop refused: {len(missing)} file(s) exist only on this box (e.g. {missing[0].path}); "
                       "pull them (run_pull) or re-arm with allow_unsynced")
            previous = notice(state)
            if not previous or previous.get("message") != message:
                _write(state / "notice.json", {"at": time.time(), "kind": "refused", "idle_since": idle_since,
                                               "message": message})
                record_event(state, "refused", reason=message, unsynced=[m.path for m in missing[:20]])
                tell(config, state, "stop_refused", f"the box is {why}, but {message}", runs)
            return False
    command = " ".join(config.argv)
    tell(config, state, "stopping", f"the box is {why}: stopping it now with `{command}` (never terminate)", runs)
    try:
        done = subprocess.run(config.argv, capture_output=True, text=True, timeout=STOP_TIMEOUT_S, check=False)
        rc, output = done.returncode, (done.stdout + done.stderr)[-2000:]
    except (OSError, subprocess.TimeoutExpired) as err:
        rc, output = None, str(err)
    ok = rc == 0
    _write(state / "notice.json", {"at": time.time(), "kind": "stopped" if ok else "stop_failed",
                                   "idle_since": idle_since, "message": f"the idle guard ran {command}"
                                   f" because the box was {why}: exit {rc}"})
    record_event(state, "stopped" if ok else "stop_failed", argv=config.argv, exit_code=rc, output=output, reason=why)
    tell(config, state, "stopped" if ok else "stop_failed",
         f"ran `{command}`: exit {rc}" + ("; the box is stopped (GPU billing ends; the provider's profile says what "
                                          "still bills)" if ok else f"; the stop FAILED, the box still bills: "
                                          f"{output.strip()[-300:]}"), runs)
    return ok


def _warning(config: GuardConfig, idle_for: float) -> str:
    left = max(0.0, config.idle_s - idle_for)
    return (f"this box has been idle for {idle_for:.0f} s; it will stop it with `{' '.join(config.argv)}` in "
            f"{left:.0f} s unless a run of ours starts or a GPU gets busy")


def watch(state: Path, sleep: Any = time.sleep) -> None:
    """The guard's loop; returns when it fired, was removed, or was replaced."""
    me = os.getpid()
    idle_since: float | None = None
    warned = False
    last_reason = None
    while True:
        config = load_config(state)
        if config is None or (config.pid is not None and config.pid != me):
            return
        runs = our_runs(config.stall_s)
        window = sample(0.0, timeout_s=min(30.0, max(config.interval_s, 5.0)))
        reasons = blockers(config, runs, window)
        now = time.time()
        if reasons:
            idle_since = None
            summary = "; ".join(reasons)
            _write(state / "status.json", {"state": "watching", "checked_at": now, "reason": summary})
            if summary != last_reason:
                record_event(state, "busy", reason=summary)
            if warned:
                tell(config, state, "idle_cancelled", f"the stop is off, the box is working again: {summary}", runs)
                warned = False
        else:
            if idle_since is None:
                idle_since = now
                how = ("every GPU under the threshold" if window.ok else unreadable_note(window))
                record_event(state, "idle", reason=f"no run of ours active; {how}")
            summary = f"idle since {idle_since:.0f}"
            _write(state / "status.json", {"state": "idle", "checked_at": now, "idle_since": idle_since,
                                           "acts_at": idle_since + config.idle_s,
                                           "gpu": "read" if window.ok else unreadable_note(window)})
            idle_for = now - idle_since
            if (config.action == "stop" and config.warn_s > 0 and not warned and idle_for < config.idle_s
                    and idle_for >= config.idle_s - config.warn_s):
                tell(config, state, "idle_warning", _warning(config, idle_for), runs)
                warned = True
            if idle_for >= config.idle_s and _act(config, state, runs, idle_since):
                _write(state / "status.json", {"state": "fired", "checked_at": now, "idle_since": idle_since})
                (state / "guard.json").unlink(missing_ok=True)
                return
        last_reason = summary
        sleep(config.interval_s)


def main(argv: list[str]) -> int:
    state = Path(argv[0]) if argv else guard_dir()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        watch(state)
    except Exception as err:
        record_event(state, "crashed", reason=f"{type(err).__name__}: {err}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
