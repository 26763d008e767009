"""Run each entry's Verify in the two situations its scenario builds: the failure, and the failure fixed.

An entry whose **Verify on:** is ``cpu`` names a scenario, ``evals/verify/<ID>.py``. The scenario builds
the situation the entry describes (a DDP job that is not sharded, a ``collate_fn`` that cannot be
pickled, a launch environment with debug variables left in it) once as it fails and once with the fix
applied, takes the Verify's code from the entry itself (``case.code("Verify", …)``: the text a reader
would paste, through the catalog parser) and runs it there. The check passes only when the Verify
*reports the two differently*: it says "broken" for the failure and "fixed" for the fix. A Verify that
passes the failure too cannot fail, and fails the check; so does a fix that leaves the Verify failing.

A scenario is a small module (stdlib at import; torch inside ``run``)::

    RANKS = 3              # gloo ranks; 1 (the default) runs without a process group
    TIMEOUT = 120          # seconds per run (default 120)

    def run(case: Case) -> str:
        '''Build the situation (``case.fixed``), run the entry's Verify in it, return what it printed.'''

    def passed(outputs: list[str]) -> bool:
        '''The entry's Verify criterion on what every rank printed: True means "fixed".'''

Runs share torch's start-up: a few worker processes (as many as the widest scenario has ranks) import
torch once and run every scenario, each run with fresh environment variables, working directory and, for
``RANKS > 1``, a fresh gloo process group on a free port. Single-rank runs go to whichever worker is free.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

EVALS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = EVALS_DIR.parent
SCENARIO_DIR = EVALS_DIR / "verify"
DEFAULT_TIMEOUT = 120.0
#: Roles a piece of entry code plays in a scenario: the instrument that reports, or the fix applied.
ROLES = ("verify", "fix")


def _catalog() -> ModuleType:
    if str(REPO_ROOT / "tools") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "tools"))
    from remote_gpu_trainer import catalog

    return catalog


# ------------------------------------------------------------------------------------------------
# What a scenario gets


@dataclass
class Case:
    """One run of a scenario: which entry, which situation, which rank, and helpers to run code."""

    entry: Any
    """The catalog entry (``remote_gpu_trainer.catalog.Entry``) as the checked skill root has it."""
    fixed: bool
    rank: int = 0
    world: int = 1
    tmp: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    used: set[tuple[str, str, str]] = field(default_factory=set)
    """(entry, field, role) of every piece of entry code the run took, for the report."""

    def code(self, field_name: str, contains: str = "", *, role: str = "verify", entry: str = "") -> str:
        """The one piece of code in ``field_name`` (a fenced block or a code span) that is ``contains``
        or contains it, exactly as the entry shows it. ``entry`` takes it from another entry (a Verify
        that runs the handler another entry's Fix shows). Raises when none or several match, so a
        rewrite of the entry cannot silently change what runs."""
        if role not in ROLES:
            raise ValueError(f"role is one of {ROLES}")
        source = self.entry if not entry else _catalog().load_catalog(Path(self.entry_root)).entry(entry)
        text = {"Fix": source.fix, "Verify": source.verify, "Root cause": source.root_cause}[field_name]
        every = [code for _, code in _catalog().code_blocks(text)]
        exact = [code for code in every if code.strip() == contains]
        pieces = exact if len(exact) == 1 else [code for code in every if contains in code]
        if len(pieces) != 1:
            raise LookupError(f"{source.id} {field_name}: {len(pieces)} pieces of code contain {contains!r}")
        self.used.add((source.id, field_name, role))
        return pieces[0]

    @property
    def entry_root(self) -> str:
        return os.environ.get("RGT_VERIFY_ROOT", str(REPO_ROOT))

    def exec(self, code: str, namespace: dict[str, Any]) -> str:
        """Run Python ``code`` in ``namespace`` in this process; return what it printed (an exception
        ends the output as Python would print its last line)."""
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                exec(compile(code, f"<{self.entry.id}>", "exec"), namespace)
            except Exception as exc:  # what the Verify printed is the result, failures included
                print(exception_line(exc))
        return buf.getvalue()

    def python_c(self, command: str) -> str:
        """Run a Verify's ``python -c "…" [args]`` one-liner here: the same code, in this process (torch
        is already imported, which saves a start-up per run), in ``tmp``, with ``sys.argv`` as Python
        would set it; returns what it printed."""
        argv = shlex.split(command)
        if len(argv) < 3 or not argv[0].startswith("python") or argv[1] != "-c":
            raise ValueError(f"not a python -c one-liner: {command!r}")
        saved = sys.argv
        sys.argv = ["-c", *argv[3:]]
        try:
            return self.exec(argv[2], {"__name__": "__main__"})
        finally:
            sys.argv = saved

    def shell(self, script: str, env: dict[str, str] | None = None, timeout: float = 60.0,
              cwd: Path | None = None) -> str:
        """Run ``script`` with bash (``set -u``); return stdout and stderr, then ``[exit N]``."""
        run_env = {**os.environ, **(env or {})}
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout,
                              env=run_env, cwd=cwd or self.tmp)
        return f"{proc.stdout}{proc.stderr}[exit {proc.returncode}]\n"

    def python(self, code: str, env: dict[str, str] | None = None, timeout: float = 120.0) -> str:
        """Run ``code`` in a fresh interpreter (this one's), in ``tmp``; return its output and exit."""
        path = self.tmp / f"{self.entry.id.lower().replace('-', '_')}_{len(list(self.tmp.iterdir()))}.py"
        path.write_text(code, encoding="utf-8")
        return self.shell(f"{sys.executable} {path}", env=env, timeout=timeout)


def exception_line(exc: BaseException) -> str:
    """``module.Type: message`` as the last line of a traceback reads."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"{name}: {exc}"


# ------------------------------------------------------------------------------------------------
# Loading scenarios


def scenario_path(entry_id: str) -> Path:
    return SCENARIO_DIR / f"{entry_id}.py"


def load_scenario(entry_id: str) -> ModuleType:
    """The scenario module of ``entry_id``, imported by its file name from ``evals/verify`` (on
    ``sys.path``, so what it defines at module level pickles into spawned processes)."""
    if str(SCENARIO_DIR) not in sys.path:
        sys.path.insert(0, str(SCENARIO_DIR))
    module = importlib.import_module(entry_id)
    for name in ("run", "passed"):
        if not callable(getattr(module, name, None)):
            raise TypeError(f"{scenario_path(entry_id)} defines no {name}()")
    return module


# ------------------------------------------------------------------------------------------------
# The worker: one process, torch imported once, many runs


def _run_task(task: dict[str, Any]) -> dict[str, Any]:
    catalog = _catalog()
    entry = catalog.load_catalog(Path(task["root"])).entry(task["entry"])
    module = load_scenario(task["entry"])
    tmp = Path(tempfile.mkdtemp(prefix=f"rgt-verify-{task['entry']}-"))
    case = Case(entry, task["fixed"], task["rank"], task["world"], tmp)
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ["RGT_VERIFY_ROOT"] = task["root"]
    start = time.monotonic()
    output, error = "", None
    group = False
    try:
        os.chdir(tmp)
        if task["world"] > 1:
            import datetime

            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{task['port']}", rank=task["rank"],
                                    world_size=task["world"], timeout=datetime.timedelta(seconds=60))
            group = True
        output = str(module.run(case))
    except BaseException as exc:  # a broken scenario is reported, the worker lives on
        error = "".join(traceback.format_exception(exc))[-3000:]
    finally:
        if group:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"id": task["id"], "output": output, "error": error, "seconds": round(time.monotonic() - start, 2),
            "used": sorted(case.used)}


def worker_main() -> int:
    """Read one JSON task per line from stdin, answer one JSON result per line. The answers go to a
    private copy of stdout; fd 1 is pointed at stderr so that nothing a scenario (or a C++ library)
    prints can corrupt them."""
    answers = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    for line in sys.stdin:
        if line.strip():
            result = _run_task(json.loads(line))
            answers.write(json.dumps(result) + "\n")
    return 0


# ------------------------------------------------------------------------------------------------
# The coordinator


@dataclass
class Run:
    """What one situation of one entry gave: every rank's output, or why there is none."""

    outputs: list[str]
    error: str | None
    seconds: float
    used: set[tuple[str, str, str]]


@dataclass
class Outcome:
    """One entry's verdict."""

    entry: str
    ok: bool
    detail: str
    broken: Run | None = None
    fixed: Run | None = None
    reports_failure: bool = False
    """The Verify reported the failure in the failing situation (whatever it then said after the fix)."""

    @property
    def fix_from_entry(self) -> bool:
        """The fixed situation applied code taken from an entry's text (not the scenario's own)."""
        return bool(self.fixed and any(role == "fix" for _, _, role in self.fixed.used))

    def line(self) -> str:
        return f"[{'PASS' if self.ok else 'FAIL'}] {self.entry}: {self.detail}"


class _Worker:
    def __init__(self, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(EVALS_DIR), str(REPO_ROOT / "tools"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.scenarios", "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log_file, text=True, env=env,
                                     cwd=REPO_ROOT, start_new_session=True)
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                self.answers.put(json.loads(line))
        self.answers.put(None)

    def send(self, task: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.answers.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self, kill: bool = False) -> None:
        if kill and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # the worker's own session: it and what it started
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log_file.close()

    def tail(self) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return text[-1500:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pool:
    """Workers that run tasks; a worker that times out is killed and replaced."""

    def __init__(self, size: int, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.workers = [self._start(i) for i in range(size)]
        self._ids = iter(range(1, 10**9))
        self._id_lock = threading.Lock()

    def _start(self, index: int) -> _Worker:
        return _Worker(self.log_dir / f"worker{index}.log")

    def _replace(self, index: int) -> None:
        self.workers[index].stop(kill=True)
        self.workers[index] = self._start(index)

    def run(self, entry_id: str, root: Path, fixed: bool, world: int, timeout: float,
            workers: list[int]) -> Run:
        """One situation on ``workers`` (one per rank)."""
        port = _free_port() if world > 1 else 0
        base = {"entry": entry_id, "root": str(root), "fixed": fixed, "world": world, "port": port}
        start = time.monotonic()
        ids = []
        for rank, index in enumerate(workers):
            with self._id_lock:
                task = {**base, "id": next(self._ids), "rank": rank}
            ids.append(task["id"])
            self.workers[index].send(task)
        answers = []
        for index, task_id in zip(workers, ids, strict=True):
            left = max(1.0, timeout - (time.monotonic() - start))
            answer = self.workers[index].receive(left)
            if answer is None or answer.get("id") != task_id:
                tail = self.workers[index].tail()
                for i in workers:
                    self._replace(i)
                why = f"no answer within {timeout:.0f} s" if answer is None else "an answer out of step"
                return Run([], f"{why} (worker log tail: {tail[-600:]!r})", time.monotonic() - start, set())
            answers.append(answer)
        errors = [f"rank {r}: {a['error']}" for r, a in enumerate(answers) if a["error"]]
        used = {tuple(u) for a in answers for u in a["used"]}
        return Run([a["output"] for a in answers], "\n".join(errors) or None, time.monotonic() - start, used)

    def close(self) -> None:
        for w in self.workers:
            w.stop()


def judge(entry_id: str, module: ModuleType, broken: Run, fixed: Run) -> Outcome:
    """The verdict for one entry from its two runs."""
    for name, run in (("failure", broken), ("fix", fixed)):
        if run.error:
            return Outcome(entry_id, False, f"the {name} run raised: {run.error.strip().splitlines()[-1][:300]}",
                           broken, fixed)
    taken = {field_name for _, field_name, role in broken.used | fixed.used if role == "verify"}
    if not taken:
        return Outcome(entry_id, False, "the scenario runs none of the entry's own code as its Verify", broken, fixed)
    says_broken, says_fixed = bool(module.passed(broken.outputs)), bool(module.passed(fixed.outputs))
    first = _gist(broken.outputs)
    second = _gist(fixed.outputs)
    if says_broken:
        return Outcome(entry_id, False, f"the Verify passes the failure too, so it cannot fail (failure: {first}; "
                       f"fix: {second})", broken, fixed)
    if not says_fixed:
        return Outcome(entry_id, False, f"the Verify still reports a failure after the fix (fix: {second})",
                       broken, fixed, reports_failure=True)
    fix = "the entry's Fix" if any(role == "fix" for _, _, role in fixed.used) else "the scenario's fix"
    return Outcome(entry_id, True, f"Verify ({'/'.join(sorted(taken))}) reports the failure [{first}] and, after "
                   f"{fix}, the fix [{second}] ({broken.seconds + fixed.seconds:.1f} s)", broken, fixed,
                   reports_failure=True)


def _gist(outputs: list[str], limit: int = 140) -> str:
    """The last two lines of each rank's output (``[exit N]`` left out), shortened, identical ones once."""
    lines: list[str] = []
    for out in outputs:
        said = [ln.strip() for ln in out.splitlines() if ln.strip() and not re.fullmatch(r"\[exit \d+\]", ln.strip())]
        last = " / ".join(said[-2:]) or "(nothing)"
        if last not in lines:
            lines.append(last)
    text = " | ".join(lines)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def run_scenarios(root: Path, entry_ids: Iterable[str], jobs: int = 2,
                  progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run the scenario of every entry in ``entry_ids`` in both situations; one Outcome each.

    Multi-rank scenarios run one at a time on the first workers; the single-rank ones then run on all
    workers at once. ``jobs`` is the number of workers (at least the widest scenario's ranks).
    """
    modules: dict[str, ModuleType] = {}
    outcomes: dict[str, Outcome] = {}
    for entry_id in entry_ids:
        if not scenario_path(entry_id).is_file():
            where = scenario_path(entry_id).relative_to(REPO_ROOT)
            outcomes[entry_id] = Outcome(entry_id, False, f"no scenario at {where}")
            continue
        try:
            modules[entry_id] = load_scenario(entry_id)
        except Exception as exc:  # a scenario that does not load is a failing entry, not a crash
            outcomes[entry_id] = Outcome(entry_id, False, f"scenario does not load: {exception_line(exc)}")
    if not modules:
        return list(outcomes.values())
    ranks = {e: int(getattr(m, "RANKS", 1)) for e, m in modules.items()}
    size = max(max(ranks.values()), jobs)
    log_dir = Path(tempfile.mkdtemp(prefix="rgt-verify-logs-"))
    pool = Pool(size, log_dir)
    lock = threading.Lock()

    def finish(entry_id: str, broken: Run, fixed: Run) -> None:
        outcome = judge(entry_id, modules[entry_id], broken, fixed)
        with lock:
            outcomes[entry_id] = outcome
            if progress:
                progress(outcome)

    try:
        for entry_id in [e for e in modules if ranks[e] > 1]:
            timeout = float(getattr(modules[entry_id], "TIMEOUT", DEFAULT_TIMEOUT))
            runs = [pool.run(entry_id, root, fixed, ranks[entry_id], timeout, list(range(ranks[entry_id])))
                    for fixed in (False, True)]
            finish(entry_id, *runs)
        tasks: queue.Queue[tuple[str, bool]] = queue.Queue()
        singles = [e for e in modules if ranks[e] == 1]
        for entry_id in singles:
            for fixed in (False, True):
                tasks.put((entry_id, fixed))
        results: dict[tuple[str, bool], Run] = {}

        def drain(index: int) -> None:
            while True:
                try:
                    entry_id, fixed = tasks.get_nowait()
                except queue.Empty:
                    return
                timeout = float(getattr(modules[entry_id], "TIMEOUT", DEFAULT_TIMEOUT))
                run = pool.run(entry_id, root, fixed, 1, timeout, [index])
                with lock:
                    results[(entry_id, fixed)] = run
                    done = (entry_id, not fixed) in results
                if done:
                    finish(entry_id, results[(entry_id, False)], results[(entry_id, True)])

        threads = [threading.Thread(target=drain, args=(i,)) for i in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        pool.close()
        shutil.rmtree(log_dir, ignore_errors=True)
    return [outcomes[e] for e in outcomes]


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        raise SystemExit(worker_main())
    raise SystemExit("usage: python -m harness.scenarios --worker (started by run_evals.py verify)")
