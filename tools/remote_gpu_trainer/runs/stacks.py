"""The Python stacks of a run's processes, taken while they run, without stopping them.

Two ways, tried in this order for each process:

1. **The rank hook's signal** (the default for runs started by ``run_start``). The supervisor starts
   the run with ``rank_hook/sitecustomize.py`` on ``PYTHONPATH`` (:func:`hook_env`), which arms
   ``faulthandler`` on :func:`stacks_signal` in every Python process of the run. A sample appends a
   ``#rgt-sample <token>`` line to the process's file, sends the signal, and reads what the handler
   wrote after the token. Sending is refused unless ``/proc/<pid>/status`` shows the signal caught
   (SigCgt) and the pid's start ticks match the hook's record: an unarmed process is never signalled.
   No ptrace, no extra package, so it works in containers without CAP_SYS_PTRACE and under any Yama
   ``ptrace_scope``; the handler is C code that needs neither the GIL nor the main thread.
2. **py-spy** (``py-spy dump --nonblocking --full-filenames --pid``) for a process the hook does not arm: a pid the user
   started, a Python run with ``-I``/``-E``/``-S``. It reads memory with ``process_vm_readv``;
   ``--nonblocking`` never stops the process. It needs ptrace permission: Yama ``ptrace_scope`` 1
   allows only the target's ancestors (py-spy started by us is not one) or CAP_SYS_PTRACE, which
   Docker-style containers drop by default. Used only when ``py-spy`` is on PATH.

Why not torch's own facilities: ``torch.distributed.debug.start_debug_server`` (2.13) serves stacks
over HTTP only when the training script calls it, and needs aiohttp; the flight recorder
(``flight.py``) records collectives, not where the Python code is.

Each process is sampled ``samples`` times, ``interval_s`` apart, all processes in parallel; a
process whose main-thread stack differs between samples is moving. Everything is bounded by
``timeout_s``; a process that does not answer (D state, a handler replaced by the program) is
reported with why, never waited for.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..models import StrictModel
from ..processes.snapshot import ZOMBIE, read_environ, read_start_ticks, snapshot

HOOK_DIR = Path(__file__).with_name("rank_hook")
STACKS_SIGNAL_OFFSET = 4
"""SIGRTMIN + 4: a real-time signal no launcher or framework we know handles (torchrun's workers
handle SIGTERM/SIGINT/SIGHUP/SIGQUIT, Lightning's SLURM requeue SIGUSR1); glibc keeps 32 and 33."""
SETTLE_S = 0.03
"""A dump is complete when its file has not grown for this long (faulthandler writes it in one burst)."""
PY_SPY_TIMEOUT_S = 10.0

Mechanism = Literal["signal", "py-spy"]
Role = Literal["rank", "worker", "launcher", "process"]


class Frame(StrictModel):
    file: str
    line: int
    function: str


class ThreadStack(StrictModel):
    thread: str = Field(description="Thread id as the dump printed it")
    main: bool = Field(description="The process's main thread")
    frames: list[Frame] = Field(description="Innermost (most recent call) first")


class ProcessStacks(StrictModel):
    pid: int
    ppid: int | None = None
    name: str | None = None
    status: str | None = Field(None, description="Process state when sampled (sleeping, running, disk-sleep...)")
    role: Role = Field(description="rank (has RANK), worker (a forked child of a rank: DataLoader), launcher "
                       "(torchrun's agent), process (anything else)")
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    mechanism: Mechanism | None = Field(None, description="How the stacks were read (None: they could not be)")
    samples: int = Field(0, description="Samples that answered")
    moving: bool | None = Field(None, description="The main thread's stack changed between samples")
    threads: list[ThreadStack] = Field(default_factory=list, description="Every thread, from the last sample")
    error: str | None = Field(None, description="Why there is no stack")

    @property
    def main_frames(self) -> list[Frame]:
        return next((t.frames for t in self.threads if t.main), [])


def stacks_signal() -> int:
    return signal.SIGRTMIN + STACKS_SIGNAL_OFFSET


def hook_env(run_path: Path, env: dict[str, str]) -> dict[str, str]:
    """The variables that arm the rank hook in every Python process of a run started with ``env``.

    The hook is copied into the run folder so a runtime upgrade during the run cannot pull it away
    from processes that start later (DataLoader workers of the next epoch, spawned helpers).
    """
    hook = run_path / "rank_hook"
    hook.mkdir(exist_ok=True)
    shutil.copyfile(HOOK_DIR / "sitecustomize.py", hook / "sitecustomize.py")
    folder = run_path / "stacks"
    folder.mkdir(exist_ok=True)
    path = os.pathsep.join(p for p in (str(hook), env.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "RGT_STACKS_DIR": str(folder), "RGT_STACKS_SIGNAL": str(stacks_signal())}


# ------------------------------------------------------------------ parsing

_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*?)\s*$')
_SPY_THREAD = re.compile(r'^Thread (?P<id>\S+)(?: \((?P<state>[^)]*)\))?(?:: "(?P<name>.*)")?\s*$')
_SPY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>.+):(?P<line>\d+)\)\s*$")


def parse_faulthandler(text: str, main_thread: str | None) -> list[ThreadStack]:
    """faulthandler's all-threads dump: ``Thread 0x… (most recent call first):`` then frame lines."""
    threads: list[ThreadStack] = []
    main_id = int(main_thread, 16) if main_thread else None
    for line in text.splitlines():
        if head := _FH_THREAD.match(line):
            threads.append(ThreadStack(thread=head.group(1), main=int(head.group(1), 16) == main_id, frames=[]))
        elif threads and (frame := _FH_FRAME.match(line)):
            threads[-1].frames.append(Frame(file=frame["file"], line=int(frame["line"]), function=frame["func"]))
    if main_id is None and threads:  # no record: faulthandler lists the main thread last
        threads[-1].main = True
    return threads


def parse_py_spy(text: str, pid: int) -> list[ThreadStack]:
    """``py-spy dump``: ``Thread 0x… (idle): "MainThread"`` then ``    func (file:line)`` lines."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        if line.startswith("Thread ") and (head := _SPY_THREAD.match(line)):
            main = head["name"] == "MainThread" or head["id"] == str(pid)
            threads.append(ThreadStack(thread=head["id"], main=main, frames=[]))
        elif threads and (frame := _SPY_FRAME.match(line)):
            threads[-1].frames.append(Frame(file=frame["file"], line=int(frame["line"]), function=frame["func"]))
    return threads


# ------------------------------------------------------------------ the processes


@dataclass
class Target:
    pid: int
    record: dict | None
    """The hook's ``#rgt`` record, when the process is armed."""
    env: dict[str, str]
    stacks: ProcessStacks


def read_record(path: Path) -> dict | None:
    """The newest ``#rgt {json}`` line of a hook file (a reused pid appends its own)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64 * 1024)
    except OSError:
        return None
    found = None
    for line in head.decode("utf-8", "replace").splitlines():
        if line.startswith("#rgt {"):
            try:
                found = json.loads(line[5:])
            except ValueError:
                continue
    return found


def signal_caught(pid: int, signum: int) -> bool:
    """SigCgt of /proc/<pid>/status has ``signum``: the process installed a handler for it."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES",
              "TORCHELASTIC_RUN_ID")


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def describe(pid: int, stacks_dir: Path | None) -> Target | None:
    """Who ``pid`` is: rank, worker, launcher; and whether the hook armed it. None: it is gone."""
    info = snapshot(pid)
    if info is None or info.status == ZOMBIE:
        return None
    record = read_record(stacks_dir / f"{pid}.txt") if stacks_dir else None
    if record is not None and record.get("start_ticks") not in (None, info.start_ticks):
        record = None  # the file belongs to an earlier process with the same pid
    env = read_environ(pid, _RANK_VARS)
    rank = _int(env.get("RANK"))
    if (rank is not None and (record or {}).get("forked")) or info.name == "pt_data_worker":
        role: Role = "worker"
    elif rank is not None:
        role = "rank"
    elif info.name == "pt_elastic" or any(w.endswith(("torchrun", "torch.distributed.run")) for w in info.cmdline[:3]):
        role = "launcher"
    else:
        role = "process"
    stacks = ProcessStacks(pid=pid, ppid=info.ppid, name=info.name, status=info.status, role=role, rank=rank,
                           local_rank=_int(env.get("LOCAL_RANK")), world_size=_int(env.get("WORLD_SIZE")),
                           local_world_size=_int(env.get("LOCAL_WORLD_SIZE")))
    return Target(pid, record, env, stacks)


def py_spy_path() -> str | None:
    """py-spy on PATH, or next to this Python (a venv's bin)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(os.__file__).parents[2] / "bin" / "py-spy"
    return str(beside) if beside.is_file() else None


# ------------------------------------------------------------------ sampling


def _signal_round(targets: list[Target], stacks_dir: Path, deadline: float) -> dict[int, str]:
    """One sample of every armed target, in parallel: token, signal, wait for each dump to settle."""
    signum = stacks_signal()
    token = secrets.token_hex(4)
    offsets: dict[int, int] = {}
    for target in targets:
        path = stacks_dir / f"{target.pid}.txt"
        if read_start_ticks(target.pid) != target.record.get("start_ticks") or not signal_caught(target.pid, signum):
            continue  # gone, reused, or its handler was replaced: never signal it
        try:
            with open(path, "a") as handle:
                handle.write(f"#rgt-sample {token}\n")
            offsets[target.pid] = path.stat().st_size
            os.kill(target.pid, signum)
        except OSError:
            offsets.pop(target.pid, None)
    sizes: dict[int, tuple[int, float]] = {}
    done: dict[int, str] = {}
    while len(done) < len(offsets) and time.monotonic() < deadline:
        time.sleep(0.005)
        now = time.monotonic()
        for pid, start in offsets.items():
            if pid in done:
                continue
            try:
                size = (stacks_dir / f"{pid}.txt").stat().st_size
            except OSError:
                done[pid] = ""
                continue
            seen, since = sizes.get(pid, (-1, now))
            if size != seen:
                sizes[pid] = (size, now)
            elif size > start and now - since >= SETTLE_S:
                done[pid] = _read_from(stacks_dir / f"{pid}.txt", start)
    return done


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read(1 << 20).decode("utf-8", "replace")


def _py_spy(binary: str, pid: int, timeout_s: float) -> tuple[str, str | None]:
    """One ``py-spy dump`` of ``pid``. Own session and the helper mark: started by the supervisor it would
    otherwise sit in the run's session and count as a run process (run_stop could fingerprint and kill it, and a
    dry-run token would go stale when it exits)."""
    from ..processes.snapshot import HELPER_ENV

    try:
        out = subprocess.run([binary, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)],
                             capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                             start_new_session=True, env={**os.environ, HELPER_ENV: "py-spy"})
    except subprocess.TimeoutExpired:
        return "", f"py-spy timed out after {timeout_s:g} s"
    except OSError as err:
        return "", f"py-spy could not run: {err}"
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        return "", "py-spy: " + (why[-1][:300] if why else f"exit {out.returncode}")
    return out.stdout, None


def _same(a: list[ThreadStack], b: list[ThreadStack]) -> bool:
    main_a = next((t.frames for t in a if t.main), [])
    main_b = next((t.frames for t in b if t.main), [])
    return main_a == main_b


def prune(stacks_dir: Path) -> int:
    """Remove the files of processes that are gone and never dumped (the hook removes its own at a normal
    exit; a forked DataLoader worker ends with ``os._exit`` and cannot). Returns how many went.

    A file without a record yet belongs to a process being armed (the hook creates the file, registers the
    handler, then writes the record): it stays while its pid lives, or the process would write its record into
    an unlinked file and never be read by signal."""
    removed = 0
    for path in stacks_dir.glob("*.txt"):
        pid = int(path.stem) if path.stem.isdigit() else None
        try:
            if pid is None or path.stat().st_size > 4096:
                continue
            record = read_record(path)
            ticks = read_start_ticks(pid)
            alive = ticks is not None if record is None else ticks == record.get("start_ticks")
            if not alive and "#rgt-sample" not in path.read_text(errors="replace"):
                path.unlink()
                removed += 1
        except OSError:
            continue
    return removed


def collect(pids: list[int], stacks_dir: Path | None, *, samples: int = 3, interval_s: float = 0.25,
            timeout_s: float = 5.0, use_py_spy: bool = True) -> list[ProcessStacks]:
    """Stacks of every process in ``pids`` (see the module docstring); gone processes are left out."""
    deadline = time.monotonic() + timeout_s
    if stacks_dir is not None:
        prune(stacks_dir)
    targets = [t for t in (describe(pid, stacks_dir) for pid in pids) if t is not None]
    armed = [t for t in targets if t.record is not None and stacks_dir is not None]
    history: dict[int, list[list[ThreadStack]]] = {t.pid: [] for t in targets}
    for number in range(samples if armed else 0):
        round_deadline = min(deadline, time.monotonic() + max(0.2, timeout_s / (samples + 1)))
        assert stacks_dir is not None
        for pid, text in _signal_round(armed, stacks_dir, round_deadline).items():
            main = next(t.record.get("main_thread") for t in armed if t.pid == pid)
            threads = parse_faulthandler(text, main)
            if threads:
                history[pid].append(threads)
        if number + 1 < samples and time.monotonic() + interval_s < deadline:
            time.sleep(interval_s)
    for target in armed:
        target.stacks.mechanism = "signal"
    rest = [t for t in targets if not history[t.pid] and t.stacks.role != "launcher" and is_python(t.pid)]
    binary = py_spy_path() if use_py_spy and rest else None
    if binary:
        with ThreadPoolExecutor(max_workers=min(8, len(rest))) as pool:
            for number in range(2):  # two samples: enough to tell moving from stuck
                # what timeout_s has left, recomputed each round: a py-spy that hangs must not cost it twice
                left = deadline - time.monotonic()
                if number == 0:
                    left = max(1.0, left)  # the first sample always gets a chance
                if left <= 0:
                    break
                outs = list(pool.map(lambda t, left=left: _py_spy(binary, t.pid, min(PY_SPY_TIMEOUT_S, left)),
                                     rest))
                for target, (text, error) in zip(rest, outs, strict=True):
                    threads = parse_py_spy(text, target.pid) if text else []
                    if threads:
                        history[target.pid].append(threads)
                        target.stacks.mechanism = "py-spy"
                    elif error:
                        target.stacks.error = error
    for target in targets:
        taken = history[target.pid]
        stacks = target.stacks
        stacks.samples = len(taken)
        if taken:
            stacks.threads = taken[-1]
            stacks.moving = any(not _same(a, b) for a, b in itertools.pairwise(taken)) if len(taken) > 1 else None
            stacks.error = None
        elif stacks.error is None:
            stacks.error = _why_silent(target, stacks_dir, binary is not None)
        refreshed = snapshot(target.pid)
        if refreshed is not None:
            stacks.status = refreshed.status
    return [t.stacks for t in targets]


def is_python(pid: int) -> bool:
    """The executable is a Python interpreter (``/proc/<pid>/exe``): py-spy has nothing to read elsewhere."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith(("python", "pypy"))
    except OSError:
        return False


def _why_silent(target: Target, stacks_dir: Path | None, tried_py_spy: bool) -> str:
    if target.record is None and not is_python(target.pid):
        return "not a Python process"
    if target.record is not None:
        status = target.stacks.status
        if status in ("disk-sleep", "stopped", "tracing-stop"):
            return f"signalled but it is in state {status}: it answers when the kernel lets it run"
        if not signal_caught(target.pid, stacks_signal()):
            return "its stack signal handler was replaced by the program, so it was not signalled"
        return "signalled but it did not answer in time"
    where = "not started by run_start" if stacks_dir is None else "the rank hook did not arm it (python -I/-E/-S)"
    return f"{where}; py-spy " + ("could not read it either" if tried_py_spy else "is not installed (pip install "
                                                                                  "py-spy) to read it")
