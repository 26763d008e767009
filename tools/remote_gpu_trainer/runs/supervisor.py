"""The run supervisor: ``python -m remote_gpu_trainer.runs.supervisor RUN_DIR``.

``run_start`` starts it detached (own session, stdin /dev/null, see ``detach.py``) and returns; from
then on it is the only thing on the box that watches the run, so nobody needs to be connected:

1. Record itself (pid and start ticks) in ``supervisor.json``.
2. Start the training command from ``meta.json`` in its own process group (so ``run_stop`` can signal
   the whole group, torchrun and its workers), stdout and stderr appended to ``log``; record pid,
   pgid and start time in ``meta.json``.
3. Every poll: note the run's processes (the training process and its descendants) and, the first
   time each is seen, the cgroups it lives in with their OOM-kill counters (``oom.py``). Watch the
   log's size: when it has not grown for ``stall_after_s`` and the GPUs the run holds are near idle
   (on a box without NVML, log growth alone decides), write ``stall.json``, take every rank's stack
   once (``hang.on_stall``: grouped, ``stacks.json``) and notify ``stalled`` with that verdict; growth
   clears it and re-arms both.
   The run starts with the rank hook on ``PYTHONPATH`` (``hang.forensics_env``) so those stacks can be
   read without ptrace, and with torch's flight recorder when ``run_start(flight_recorder=true)``.
4. When the process ends: exit code or signal, OOM evidence (counter rises, kernel log lines naming
   a run pid), the end state (``states.end_state``), the first line of ``diagnose_error`` on the log
   tail for a failure; written to ``exit.json``; then notify once.

Notifications run the caller's ``notify`` argv (never a shell) with ``RGT_RUN_ID``,
``RGT_RUN_STATE``, ``RGT_RUN_DIAGNOSIS`` and ``RGT_RUN_DIR`` in the environment, at most 30 s each,
and each is recorded in ``notifications.jsonl`` with its exit status.

SIGHUP is ignored (belt and braces: there is no terminal to hang up). If the supervisor itself is
killed, the run goes on without it and ``run_status`` reports ``lost``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..processes.snapshot import ProcessTable, read_start_ticks
from .ledger import EXIT, NOTIFICATIONS, STALL, STOP, SUPERVISOR, RunDir, append_jsonl
from .oom import Cgroup, cgroups_of, kernel_oom_lines, oom_kill_count
from .states import end_state, signal_name

NOTIFY_TIMEOUT_S = 30.0
DIAGNOSIS_TAIL_BYTES = 256 * 1024
EVENT_OF_STATE = {"succeeded": "ended", "killed": "ended", "failed": "failed", "oom_killed": "oom_killed",
                  "stalled": "stalled"}


def poll_interval(stall_after_s: float) -> float:
    """Often enough to notice a stall within a few percent of its threshold, at most once a second."""
    return max(0.1, min(1.0, stall_after_s / 10))


def first_diagnosis_line(log: Path) -> str:
    """``ID — title: short fix`` of diagnose_error's best match on the log tail, or its summary."""
    from ..diagnose import diagnose, read_tail

    try:
        out = diagnose(read_tail(str(log), DIAGNOSIS_TAIL_BYTES), max_results=1)
    except Exception as err:  # a diagnosis is a courtesy: never lose the exit record over it
        return f"diagnose_error failed: {type(err).__name__}: {err}"
    if out.matches:
        top = out.matches[0]
        return f"{top.id} — {top.title}: {top.short_fix}".splitlines()[0][:500]
    return out.summary.splitlines()[0][:500] if out.summary else ""


def notify(run: RunDir, argv: list[str], state: str, diagnosis: str) -> None:
    """Run the notify command once for ``state`` and record what happened."""
    record: dict[str, Any] = {"event": EVENT_OF_STATE.get(state, state), "state": state,
                              "at": time.time(), "argv0": argv[0] if argv else None}
    env = {**os.environ, "RGT_RUN_ID": run.run_id, "RGT_RUN_STATE": state, "RGT_RUN_DIAGNOSIS": diagnosis,
           "RGT_RUN_DIR": str(run.path)}
    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=NOTIFY_TIMEOUT_S,
                              cwd=run.path)
        record.update(exit_code=done.returncode,
                      output=(done.stdout + done.stderr).decode(errors="replace")[-500:])
    except subprocess.TimeoutExpired:
        record.update(exit_code=None, error=f"timed out after {NOTIFY_TIMEOUT_S:g} s")
    except OSError as err:
        record.update(exit_code=None, error=f"could not run: {err}")
    append_jsonl(run.file(NOTIFICATIONS), record)


class Watch:
    """What the supervisor learns about the run while it lives."""

    def __init__(self, root_pid: int):
        self.root_pid = root_pid
        self.pids: set[int] = set()
        self.cgroups: dict[Cgroup, int | None] = {}

    def sample(self) -> set[int]:
        """The run's live processes now; new ones get their cgroups' OOM counters noted."""
        live = {self.root_pid, *ProcessTable.read().descendants(self.root_pid)}
        for pid in live - self.pids:
            for cgroup in cgroups_of(pid):
                if cgroup not in self.cgroups:
                    self.cgroups[cgroup] = oom_kill_count(cgroup)
        self.pids |= live
        return live

    def oom_evidence(self) -> dict[str, Any]:
        rises = []
        for cgroup, before in self.cgroups.items():
            after = oom_kill_count(cgroup)
            if before is not None and after is not None and after > before:
                rises.append({"cgroup": f"{cgroup[0]}:{cgroup[1]}", "oom_kill_before": before, "oom_kill_after": after})
        lines, note = kernel_oom_lines(self.pids)
        checked = [f"{kind}:{path}" for (kind, path), count in self.cgroups.items() if count is not None]
        return {"cgroup_rises": rises, "kernel_lines": lines, "kernel_log_note": note, "cgroups_checked": checked,
                "found": bool(rises or lines)}


class StallWatch:
    """No log growth for ``after_s`` (and idle GPUs where NVML can tell) → stalled, once per episode."""

    def __init__(self, run: RunDir, after_s: float):
        self.run, self.after_s = run, after_s
        self.size = self._size()
        self.grew_at = time.monotonic()
        self.grew_wall = time.time()
        self.stalled = False
        self.next_gpu_check = 0.0

    def _size(self) -> int:
        try:
            return self.run.log.stat().st_size
        except OSError:
            return 0

    def check(self, live: set[int]) -> bool:
        """True exactly when a new stall begins."""
        size, now = self._size(), time.monotonic()
        if size != self.size:
            self.size, self.grew_at, self.grew_wall = size, now, time.time()
            if self.stalled:
                self.stalled = False
                self.run.file(STALL).unlink(missing_ok=True)
            return False
        idle_s = now - self.grew_at
        if self.stalled or idle_s < self.after_s or now < self.next_gpu_check:
            return False
        from .gpu import gpus_idle, run_gpu_use

        rows, _note = run_gpu_use(live)
        if gpus_idle(rows) is False:  # the GPUs work: a quiet log is not a stall
            self.next_gpu_check = now + max(self.after_s / 4, 1.0)
            return False
        gpu_part = ("and the GPUs it holds are near idle" if rows else
                    "(no GPU use of the run's processes visible, so the log alone decides)")
        detail = f"no log output for {idle_s:.0f} s (threshold {self.after_s:g} s) {gpu_part}"
        self.run.write(STALL, {"since": self.grew_wall, "detected_at": time.time(), "detail": detail})
        self.stalled = True
        return True


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


def _finish(run: RunDir, meta: dict[str, Any], record: dict[str, Any]) -> None:
    record.setdefault("ended_at", time.time())
    if record["state"] in ("failed", "oom_killed"):
        record["diagnosis_first_line"] = first_diagnosis_line(run.log)
    run.write(EXIT, record)
    run.file(STALL).unlink(missing_ok=True)
    if meta.get("notify"):
        notify(run, meta["notify"], record["state"], record.get("diagnosis_first_line", ""))


def stall_forensics(run: RunDir) -> str:
    """Once per stall: every rank's stack, grouped, kept in ``stacks.json``; the one-line verdict (``hang.py``)."""
    from .hang import on_stall

    return on_stall(run)


def _in_group(pid: int, pgid: int) -> bool:
    try:
        return os.getpgid(pid) == pgid
    except OSError:
        return False


def supervise(run: RunDir) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    me = os.getpid()
    run.write(SUPERVISOR, {"pid": me, "start_ticks": read_start_ticks(me), "started_at": time.time()})
    meta = run.meta()
    child = _start_child(run, meta)
    if isinstance(child, str):
        with open(run.log, "a") as log:
            log.write(f"[rgt supervisor] {child}\n")
        _finish(run, meta, {"state": "failed", "detail": child, "exit_code": 127, "signal": None})
        return 0
    run.update_meta(pid=child.pid, pgid=child.pid, started_at=time.time(), start_ticks=read_start_ticks(child.pid))
    watch, stall = Watch(child.pid), StallWatch(run, float(meta.get("stall_after_s", 900)))
    interval = poll_interval(stall.after_s)
    while True:
        live = watch.sample()
        if stall.check(live):
            verdict = stall_forensics(run)
            if meta.get("notify"):
                notify(run, meta["notify"], "stalled", f"{verdict} — {(run.read(STALL) or {}).get('detail', '')}")
        try:
            child.wait(timeout=interval)
            break
        except subprocess.TimeoutExpired:
            continue
    code = child.returncode
    exit_code, sig = (code, None) if code >= 0 else (None, -code)
    oom = watch.oom_evidence()
    state = end_state(exit_code, sig, oom["found"])
    stopped = run.read(STOP)
    detail = {"succeeded": "exited with code 0", "failed": f"exited with code {exit_code}",
              "killed": f"ended by {signal_name(sig)}", "oom_killed": "killed by the OOM killer"}[state]
    if stopped and state in ("killed", "failed"):
        # torchrun turns the SIGTERM it got into exit code 1: the run was still stopped on request
        state, detail = "killed", f"stopped by run_stop ({detail})"
    left = sorted(pid for pid in watch.pids - {child.pid} if _in_group(pid, child.pid))
    _finish(run, meta, {"state": state, "detail": detail, "exit_code": exit_code, "signal": sig,
                        "signal_name": signal_name(sig), "oom": oom, "stopped_by_run_stop": bool(stopped),
                        "left_running": left})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m remote_gpu_trainer.runs.supervisor RUN_DIR", file=sys.stderr)
        return 2
    return supervise(RunDir(Path(args[0])))


if __name__ == "__main__":
    sys.exit(main())
