"""The run supervisor: ``python -m remote_gpu_trainer.runs.supervisor RUN_DIR``.

``run_start`` starts it detached (own session, stdin /dev/null, see ``detach.py``) and returns; from
then on it is the only thing on the box that watches the run, so nobody needs to be connected:

1. Record itself (pid and start ticks) in ``supervisor.json`` and become a **child subreaper**
   (``prctl(PR_SET_CHILD_SUBREAPER)``): a process the run detaches (``nohup python train.py & exit 0``, a
   ``setsid``'d child, a double fork) is re-parented to the supervisor when its parent exits, instead of to
   init. Why: it stays findable as one of ours, and the supervisor can ``wait`` for it and so learn its exit
   code, which only a parent ever sees. The alternative, following the session and process group alone,
   loses ``setsid``'d children and never knows how a detached job ended.
2. Start the training command from ``meta.json`` in its own process group inside the supervisor's session
   (so ``run_stop`` can signal the group, torchrun and its workers), stdout and stderr appended to ``log``;
   record pid, pgid, session and start time in ``meta.json``.
3. Every poll: reap every child that ended (``waitpid(-1)``), note the run's processes (``members.py``: the
   session, the group, what was recorded and their descendants) and, the first time each is seen, the cgroups
   it lives in with their OOM-kill counters (``oom.py``). Follow the run's progress files (``watch.py``: its
   log, ``watch`` globs, files its processes write).
4. **Launchers that detach.** When the first process exits and processes it started still run, the run stays
   ``running`` ("launcher exited with code 0; 1 process continues", ``launcher.json``) and ends when they end.
   Left-behind helpers (a DataLoader worker whose rank died: ``processes/workers.py``) do not keep it alive;
   they are listed at the end for ``reap_vram_zombies``.
5. **Stalls are decided from file progress, not GPU load**: a rank hung in an NCCL collective keeps its GPU at
   100 %, so utilisation proves nothing. When no progress file changed for ``stall_after_s``, the supervisor
   takes every rank's stack (``hang.on_stall``: grouped, ``stacks.json``). If every stack moved between samples
   the run computes without writing: not stalled, checked again one threshold later, and declared stalled
   anyway after three thresholds of silence. Otherwise ``stall.json`` is written (the file, the silence, the
   stacks' verdict, the GPU reading as evidence) and the person is notified; new progress clears it.
6. At the end: the exit status that decides (the launcher's, or for a detached job the codes of the processes
   that continued, reaped as their subreaper; unknown ones are said to be unknown), OOM evidence, the end
   state (``states.end_state``), the first line of ``diagnose_error`` on the followed log's tail for a failure;
   written to ``exit.json``; then notify once.

An **adopted** run (``run_adopt``: a process the user started) is watched the same way without being started:
the supervisor is not its parent, so its exit status is unknown and the end state is ``ended`` (or
``oom_killed`` when the kernel log names one of its pids).

Notifications (``notify.py``) run the caller's command (never a shell) with ``{message}``, ``{state}``,
``{run_id}``, ``{host}``, ``{step}`` filled in and ``RGT_RUN_ID``, ``RGT_RUN_STATE``, ``RGT_RUN_DIAGNOSIS``,
``RGT_RUN_DIR`` in the environment, at most 30 s each, each recorded in ``notifications.jsonl``.

SIGHUP is ignored (belt and braces: there is no terminal to hang up). If the supervisor itself is
killed, the run goes on without it and ``run_status`` reports ``lost``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..processes.snapshot import HELPER_ENV, ProcessTable, read_cmdline, read_environ, read_start_ticks, snapshot
from ..processes.workers import worker_kind
from .ledger import EXIT, LAUNCHER, NOTIFICATIONS, STALL, STOP, SUPERVISOR, RunDir, append_jsonl
from .members import live_members, record
from .oom import Cgroup, cgroups_of, kernel_oom_lines, oom_kill_count
from .states import end_state, signal_name
from .watch import WATCH, ProgressFiles

if TYPE_CHECKING:
    from .hang import HangReport

DIAGNOSIS_TAIL_BYTES = 256 * 1024
EVENT_OF_STATE = {"succeeded": "ended", "killed": "ended", "ended": "ended", "failed": "failed",
                  "oom_killed": "oom_killed", "stalled": "stalled"}
STATE_WORD = {"succeeded": "succeeded", "failed": "FAILED", "killed": "KILLED", "oom_killed": "OOM-KILLED",
              "stalled": "STALLED", "ended": "ENDED"}
PR_SET_CHILD_SUBREAPER = 36
RECHECK_AFTER = 3
"""Silence of this many thresholds is a stall even while the stacks move (a Python loop polling forever)."""


def log(line: str) -> None:
    """One line into supervisor.log (the supervisor's stderr); a full disk may refuse it, and that is no reason to
    stop watching."""
    try:
        print(f"[rgt supervisor {time.strftime('%Y-%m-%d %H:%M:%S')}] {line}", file=sys.stderr, flush=True)
    except OSError:
        pass


def bookkeep(what: str, write: Callable[..., object], *args: Any, **kwargs: Any) -> bool:
    """Run one bookkeeping write; False when it failed. An OSError (ENOSPC on a full disk, EIO) is logged and the
    watch goes on: the supervisor is the only one that records how the run ends, and if it died the run would read
    ``lost`` and nobody would be notified."""
    try:
        write(*args, **kwargs)
        return True
    except OSError as err:
        log(f"could not write {what}: {err}; going on")
        return False


def poll_interval(stall_after_s: float) -> float:
    """Often enough to notice a stall within a few percent of its threshold, at most once a second."""
    return max(0.1, min(1.0, stall_after_s / 10))


def become_subreaper() -> bool:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: orphaned descendants come to us (Linux ≥ 3.4, no privilege)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _tail(path: Path | None, max_bytes: int) -> str:
    from .progress import read_tail

    return read_tail(path, max_bytes)[0] if path is not None else ""


def first_diagnosis_line(logs: list[Path]) -> str:
    """``ID — title: short fix`` of diagnose_error's best signature match on the logs' tails; without one, the log's
    last line. A word-overlap guess is not sent to a person: it reads like a verdict and often is not one."""
    from ..diagnose import diagnose
    from .progress import logical_lines

    text = "\n".join(_tail(log, DIAGNOSIS_TAIL_BYTES // max(1, len(logs))) for log in logs)
    try:
        out = diagnose(text, max_results=3)
    except Exception as err:  # a diagnosis is a courtesy: never lose the exit record over it
        return f"diagnose_error failed: {type(err).__name__}: {err}"
    signed = [m for m in out.matches if m.evidence != "lexical"]
    if signed:
        top = signed[0]
        return f"{top.id} — {top.title}: {top.short_fix}".splitlines()[0][:500]
    last = next((line.strip() for line in reversed(logical_lines(_tail(logs[0], 64 * 1024))) if line.strip()), "")
    return f"no catalog signature in the log; it ends: {last[:300]}" if last else "the log is empty"


def _step(log: Path | None) -> int | None:
    from .progress import progress_of

    return progress_of(log).step if log is not None else None


def event_message(run: RunDir, meta: dict[str, Any], state: str, detail: str, diagnosis: str,
                  step: int | None) -> str:
    """One line a person reads on a phone: where, which run, what happened, where it got to, why."""
    from ..notify import box_name

    parts = [f"[{meta.get('host') or box_name()}] run {run.run_id} {STATE_WORD.get(state, state)}: {detail}"]
    if step is not None:
        parts.append(f"at step {step}")
    if diagnosis:
        parts.append(f"— {'where: ' if state == 'stalled' else ''}{diagnosis}")
    return " ".join(parts)


def notify(run: RunDir, meta: dict[str, Any], state: str, detail: str, diagnosis: str = "",
           log: Path | None = None) -> None:
    """Run the notify command once for ``state`` and record what happened."""
    from ..notify import box_name, send

    argv = meta.get("notify")
    if not argv:
        return
    step = _step(log)
    message = event_message(run, meta, state, detail, diagnosis, step)
    record_ = send(argv, {"message": message, "state": state, "run_id": run.run_id,
                          "host": meta.get("host") or box_name(), "step": "" if step is None else str(step)},
                   env={"RGT_RUN_ID": run.run_id, "RGT_RUN_STATE": state, "RGT_RUN_DIAGNOSIS": diagnosis,
                        "RGT_RUN_DIR": str(run.path)}, cwd=run.path)
    bookkeep(NOTIFICATIONS, append_jsonl, run.file(NOTIFICATIONS),
             {**record_, "event": EVENT_OF_STATE.get(state, state), "message": message})


class Watch:
    """What the supervisor learns about the run's processes while they live."""

    def __init__(self, run: RunDir, meta: dict[str, Any]):
        self.run, self.meta = run, meta
        self.me = os.getpid()
        self.pids: set[int] = set()
        self.known: dict[int, int | None] = {}
        self.started: dict[int, int | None] = {}
        """Every process of the run ever seen → its start ticks (kept after it ends: the OOM evidence needs them)."""
        self.commands: dict[int, str] = {}
        self.cgroups: dict[Cgroup, int | None] = {}
        self.unrecorded = False
        """members.json is behind (its last write failed): write it again at the next poll."""

    def sample(self) -> list[int]:
        """The run's live processes now; new ones are recorded (members.json) with their cgroups' OOM counters."""
        table = ProcessTable.read()
        live = set(live_members(self.run, self.meta, table))
        if not self.meta.get("adopted"):  # an orphan that reached us before we saw it (a fast double fork)
            for child in table.children(self.me):
                if child not in live and table.alive(child) and not read_environ(
                        child, ("RGT_MESSAGE", HELPER_ENV)):  # not a notify command, not our own helper
                    live.update([child, *(p for p in table.descendants(child) if table.alive(p))])
        new = live - set(self.known)
        for pid in new:
            self.known[pid] = read_start_ticks(pid)
            self.started.setdefault(pid, self.known[pid])
            self.commands[pid] = " ".join(read_cmdline(pid))[:300]
            for cgroup in cgroups_of(pid):
                if cgroup not in self.cgroups:
                    self.cgroups[cgroup] = oom_kill_count(cgroup)
            self._note_python(pid)
        if new or set(self.known) - live or self.unrecorded:
            self.known = {pid: ticks for pid, ticks in self.known.items() if pid in live}
            self.unrecorded = not bookkeep("members.json", record, self.run, self.known)
        self.pids |= live
        return sorted(live)

    def _note_python(self, pid: int) -> None:
        """The run's own python, as it was invoked (a venv's ``bin/python``: /proc/<pid>/exe would name the base
        interpreter outside the venv), for a checkpoint load test under the training environment; once."""
        if self.meta.get("python_exe"):
            return
        exe = python_of(pid)
        if exe:
            self.meta["python_exe"] = exe
            bookkeep("meta.json (python_exe)", self.run.update_meta, python_exe=exe)

    def parent(self, pid: int) -> int | None:
        info = snapshot(pid)
        return info.ppid if info else None

    def left_behind(self, pid: int) -> str | None:
        """Why ``pid`` does not keep the run alive: a helper (DataLoader worker, …) whose parent died."""
        info = snapshot(pid)
        if info is None or info.ppid not in (1, self.me):
            return None
        kind = worker_kind(info)
        return f"{kind} re-parented after its parent exited" if kind else None

    def oom_evidence(self) -> dict[str, Any]:
        rises = []
        for cgroup, before in self.cgroups.items():
            after = oom_kill_count(cgroup)
            if before is not None and after is not None and after > before:
                rises.append({"cgroup": f"{cgroup[0]}:{cgroup[1]}", "oom_kill_before": before, "oom_kill_after": after})
        lines, note = kernel_oom_lines({pid: self.started.get(pid) for pid in self.pids})
        checked = [f"{kind}:{path}" for (kind, path), count in self.cgroups.items() if count is not None]
        return {"cgroup_rises": rises, "kernel_lines": lines, "kernel_log_note": note, "cgroups_checked": checked,
                "found": bool(rises or lines)}


def python_of(pid: int) -> str | None:
    """The python interpreter ``pid`` runs, as invoked (argv[0] resolved against its cwd or PATH), or None."""
    import shutil

    argv = read_cmdline(pid)
    if not argv or not Path(argv[0]).name.startswith("python"):
        return None
    if "/" in argv[0]:
        try:
            return str(Path(os.readlink(f"/proc/{pid}/cwd")) / argv[0]) if not argv[0].startswith("/") else argv[0]
        except OSError:
            return None
    return shutil.which(argv[0], path=read_environ(pid, ("PATH",)).get("PATH", os.defpath))


class StallWatch:
    """No change in any progress file for ``after_s`` → a stall candidate; the caller takes the stacks and then
    ``declare``s or ``postpone``s it. GPU load plays no part (a hung collective spins at 100 %)."""

    def __init__(self, run: RunDir, after_s: float, files: ProgressFiles | None = None):
        self.run, self.after_s = run, after_s
        self.files = files or ProgressFiles(run, run.meta())
        self.started = time.time()
        self.stalled = False
        self.postponed_until = 0.0
        self.candidate_at = 0.0

    def quiet_s(self) -> float:
        last = max(self.files.last_change() or self.started, self.started)
        return max(0.0, time.time() - last)

    def check(self, live: set[int] | list[int]) -> bool:
        """True when a stall candidate begins: quiet for the threshold, not stalled yet, not postponed."""
        self.files.poll(sorted(live))
        quiet, now = self.quiet_s(), time.time()
        if quiet < self.after_s:
            self.postponed_until = 0.0
            if self.stalled:
                self.stalled = False
                self.run.file(STALL).unlink(missing_ok=True)
            return False
        if self.stalled or now < self.postponed_until:
            return False
        self.candidate_at = now
        return True

    def overdue(self) -> bool:
        return self.quiet_s() >= RECHECK_AFTER * self.after_s

    def describe(self, gpu: str) -> str:
        follows = self.files.follows()
        where = f"in {follows}" if follows else "in its log"
        others = len(self.files.sources) - 1
        more = f" (nor in {others} other watched file{'s' if others > 1 else ''})" if others > 0 else ""
        return f"no progress {where}{more} for {self.quiet_s():.0f} s (threshold {self.after_s:g} s){gpu}"

    def declare(self, detail: str) -> None:
        since = max(self.files.last_change() or self.started, self.started)
        bookkeep(STALL, self.run.write, STALL, {"since": since, "detected_at": self.candidate_at, "detail": detail,
                               "follows": self.files.follows(),
                               "decided_by": "no change in any progress file, and the stacks did not move (or "
                                             f"{RECHECK_AFTER} thresholds passed); GPU load is evidence only"})
        self.stalled = True

    def postpone(self) -> None:
        self.postponed_until = time.time() + self.after_s


def _gpu_evidence(live: list[int]) -> str:
    """The GPU reading, as evidence only: it never decides a stall."""
    try:
        from .gpu import run_gpu_use

        rows, _note = run_gpu_use(set(live))
    except Exception:  # a sick NVML must not stop the watch
        return ""
    busy = [r.gpu_util_percent for r in rows if r.gpu_util_percent is not None]
    if not busy:
        return ""
    return (f"; GPUs it holds at up to {max(busy)} % (a rank spinning in a collective reads busy)" if max(busy) > 5
            else "; the GPUs it holds are idle")


def stall_forensics(run: RunDir) -> tuple[str, HangReport | None]:
    """Once per stall: every rank's stack, grouped, kept in ``stacks.json``; the one-line verdict and the report
    (``hang.py``)."""
    from .hang import on_stall

    return on_stall(run)


def _watch_stall(run: RunDir, meta: dict[str, Any], stall: StallWatch, live: list[int]) -> None:
    if not stall.check(live):
        return
    verdict, report = stall_forensics(run)  # this stall's report, never stacks.json re-read (its write may fail)
    if report is not None and report.finding == "progressing" and not stall.overdue():
        stall.postpone()  # quiet, but computing: every stack moved between samples
        return
    detail = stall.describe(_gpu_evidence(live))
    stall.declare(detail)
    follows = stall.files.follows()
    notify(run, meta, "stalled", detail, verdict, log=Path(follows) if follows else None)


def _write_watch(run: RunDir, files: ProgressFiles, last: dict[str, Any] | None) -> dict[str, Any]:
    """watch.json when what the run is followed by changed; the record last written (retried when a write failed)."""
    now = files.record()
    if now != last and not bookkeep(WATCH, run.write, WATCH, now):
        return last
    return now


def _start_child(run: RunDir, meta: dict[str, Any]) -> subprocess.Popen[bytes] | str:
    from .hang import forensics_env

    env = {**os.environ, **meta.get("activation", {}), **meta.get("env_added", {})}
    env.update(forensics_env(run, meta, env))
    fd = os.open(run.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(meta["argv"], cwd=meta.get("cwd"), env=env, stdin=subprocess.DEVNULL, stdout=fd,
                                stderr=subprocess.STDOUT, process_group=0, close_fds=True)
    except OSError as err:
        return f"could not start {meta['argv'][0]!r}: {err.strerror or err}"
    finally:
        os.close(fd)


def _finish(run: RunDir, meta: dict[str, Any], record_: dict[str, Any], logs: list[Path]) -> None:
    """exit.json, then the notification, whatever happened to exit.json: a full disk must not also cost the person
    the message that the run ended (it then says that run_status will read the run as lost)."""
    record_.setdefault("ended_at", time.time())
    detail = record_["detail"]
    try:
        if record_["state"] in ("failed", "oom_killed", "ended"):
            record_["diagnosis_first_line"] = first_diagnosis_line(logs)
        run.write(EXIT, record_)
        run.file(STALL).unlink(missing_ok=True)
    except OSError as err:
        log(f"could not write {EXIT}: {err}")
        detail += f" (exit.json could not be written: {err.strerror or err}; run_status will read the run as lost)"
    finally:
        notify(run, meta, record_["state"], detail, record_.get("diagnosis_first_line", ""),
               log=logs[0] if logs else None)


def _reap(reaped: dict[int, int]) -> None:
    """Collect every ended child (the launcher, and as subreaper every orphan of the run)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reaped[pid] = status


def _split(status: int) -> tuple[int | None, int | None]:
    code = os.waitstatus_to_exitcode(status)
    return (code, None) if code >= 0 else (None, -code)


def _how(exit_code: int | None, sig: int | None) -> str:
    return f"exit code {exit_code}" if sig is None else f"killed by {signal_name(sig)}"


def _decide(launcher: tuple[int | None, int | None], continued: dict[int, str],
            reaped: dict[int, int]) -> tuple[int | None, int | None, str, bool]:
    """(exit code, signal, detail, known) of the run: the launcher's own, or for a detached job the worst status
    of the processes that continued after it, as far as they were ours to reap."""
    code, sig = launcher
    if not continued:
        return code, sig, _how(code, sig), True
    known = {pid: _split(reaped[pid]) for pid in continued if pid in reaped}
    unknown = [pid for pid in continued if pid not in reaped]
    after = (f"after the launcher exited with code {code}" if sig is None else
             f"after the launcher was killed by {signal_name(sig)}")
    bad = sorted(known.items(), key=lambda kv: (kv[1][1] is None, kv[1][0] == 0, kv[0]))
    if bad and (bad[0][1][1] is not None or bad[0][1][0] != 0):
        pid, (c, s) = bad[0]
        return c, s, f"pid {pid} ({continued[pid][:120]}): {_how(c, s)}, {after}", True
    if unknown:
        names = ", ".join(f"pid {p} ({continued[p][:80]})" for p in unknown[:3])
        return None, None, (f"exit status unknown for {names}: not a child of the supervisor, so nobody could "
                            f"read it; {after}"), False
    return 0, None, f"exit code 0 of the {len(known)} process(es) that continued, {after}", True


def supervise(run: RunDir) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    me = os.getpid()
    subreaper = become_subreaper()
    run.write(SUPERVISOR, {"pid": me, "start_ticks": read_start_ticks(me), "started_at": time.time(),
                           "subreaper": subreaper})
    meta = run.meta()
    if meta.get("adopted"):
        return watch_adopted(run, meta)
    child = _start_child(run, meta)
    if isinstance(child, str):
        with open(run.log, "a") as log:
            log.write(f"[rgt supervisor] {child}\n")
        _finish(run, meta, {"state": "failed", "detail": child, "exit_code": 127, "signal": None}, [run.log])
        return 0
    run.update_meta(pid=child.pid, pgid=child.pid, sid=os.getsid(0), started_at=time.time(),
                    start_ticks=read_start_ticks(child.pid))
    meta = run.meta()
    watch, files = Watch(run, meta), ProgressFiles(run, meta)
    stall = StallWatch(run, float(meta.get("stall_after_s", 900)), files)
    interval = poll_interval(stall.after_s)
    reaped: dict[int, int] = {}
    launcher: tuple[int | None, int | None] | None = None
    continued: dict[int, str] = {}
    shown, last_count = None, -1
    while True:
        _reap(reaped)
        live = watch.sample()
        if launcher is None and child.pid in reaped:
            launcher = _split(reaped[child.pid])
            child.returncode = launcher[0] if launcher[0] is not None else -(launcher[1] or 0)
        if launcher is not None:
            going = [pid for pid in live if not watch.left_behind(pid)]
            top = [pid for pid in going if watch.parent(pid) not in live]  # the detached job, not its own children
            continued.update((pid, watch.commands.get(pid, "")) for pid in top)
            if not going:
                break
            if len(going) != last_count and bookkeep(
                    LAUNCHER, run.write, LAUNCHER, {"exit_code": launcher[0], "signal": launcher[1],
                                                    "continuing": going, "at": time.time(),
                                                    "commands": [watch.commands.get(p, "") for p in going]}):
                last_count = len(going)
        _watch_stall(run, meta, stall, live)
        shown = _write_watch(run, files, shown)
        time.sleep(interval)
    _reap(reaped)
    files.poll(sorted(watch.pids), force=True)  # a log that appeared in the last moments still counts
    exit_code, sig, detail, known = _decide(launcher, continued, reaped)
    oom = watch.oom_evidence()
    state = end_state(exit_code, sig, oom["found"]) if known else "ended"
    if state == "ended" and oom["kernel_lines"]:
        state, detail = "oom_killed", f"killed by the OOM killer (kernel log); {detail}"
    elif state == "oom_killed":
        detail = f"killed by the OOM killer ({detail})"
    stopped = run.read(STOP)
    if stopped and state in ("killed", "failed", "ended"):
        # torchrun turns the SIGTERM it got into exit code 1: the run was still stopped on request
        state, detail = "killed", f"stopped by run_stop ({detail})"
    left = sorted(set(watch.sample()))
    if left:
        detail += (f"; {len(left)} left-behind helper process(es) still hold memory (pids "
                   f"{', '.join(map(str, left[:8]))}): reap_vram_zombies frees them")
    follows = files.follows()
    logs = [Path(follows)] if follows and follows != str(run.log) else []
    _finish(run, meta, {"state": state, "detail": detail, "exit_code": exit_code, "signal": sig,
                        "signal_name": signal_name(sig), "oom": oom, "stopped_by_run_stop": bool(stopped),
                        "left_running": left, "launcher_exit_code": launcher[0] if launcher else None,
                        "launcher_signal": launcher[1] if launcher else None, "exit_status_known": known,
                        "continued": sorted(continued)}, [*logs, run.log])
    return 0


def watch_adopted(run: RunDir, meta: dict[str, Any]) -> int:
    """Watch a process we did not start until it and its descendants are gone (run_adopt)."""
    watch, files = Watch(run, meta), ProgressFiles(run, meta)
    stall = StallWatch(run, float(meta.get("stall_after_s", 900)), files)
    interval = poll_interval(stall.after_s)
    shown = None
    while True:
        live = watch.sample()
        if not live:
            break
        _watch_stall(run, meta, stall, live)
        shown = _write_watch(run, files, shown)
        time.sleep(interval)
    oom = watch.oom_evidence()
    files.poll([], force=True)
    follows = files.follows()
    logs = [Path(follows)] if follows else [Path(p) for p in meta.get("logs") or []][:1]
    state = "oom_killed" if oom["kernel_lines"] else "ended"
    detail = ("the kernel log names one of its pids as killed by the OOM killer" if state == "oom_killed" else
              "exit status unknown: an adopted run's supervisor is not its parent, so nobody could read it")
    if run.read(STOP) and state == "ended":
        state, detail = "killed", f"stopped by run_stop ({detail})"
    _finish(run, meta, {"state": state, "detail": detail, "exit_code": None, "signal": None, "oom": oom,
                        "exit_status_known": False, "left_running": []}, logs)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m remote_gpu_trainer.runs.supervisor RUN_DIR", file=sys.stderr)
        return 2
    return supervise(RunDir(Path(args[0])))


if __name__ == "__main__":
    sys.exit(main())
