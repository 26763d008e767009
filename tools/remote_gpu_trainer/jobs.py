"""A small in-process registry of background jobs: start now, poll later.

Why: MCP clients give up on a call after about a minute (``MCP error -32001: Request timed out``),
while a fleet pre-flight, an all-reduce sweep or a runtime install can take longer. Such a tool
starts its work here, answers at once with a ``job_id``, and a later call with that id returns the
progress and, once finished, the result.

The registry lives in the server process (the MCP server is long-lived; a CLI call simply waits for
its own job). It is bounded: at most ``max_jobs`` jobs are kept, finished ones expire after
``keep_s`` seconds, and a start beyond the bound while every slot still runs is refused rather than
growing without limit. A job is a daemon thread: it never keeps the process alive on its own.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .errors import InputError
from .toolspec import Progress

if TYPE_CHECKING:
    from concurrent.futures import Future

State = Literal["running", "done", "failed"]


@dataclass
class JobStatus:
    """A copy of a job's state at the moment of a poll (safe to read without the lock)."""

    job_id: str
    name: str
    state: State
    done: bool
    progress: float
    total: float | None
    message: str
    started_at: float
    elapsed_s: float
    result: Any = None
    error: str | None = None
    error_type: str | None = None
    exception: BaseException | None = field(default=None, repr=False)
    """The exception itself, for callers that re-raise it as the tool's own error."""


@dataclass
class _Job:
    job_id: str
    name: str
    started_at: float
    started_mono: float
    state: State = "running"
    progress: float = 0.0
    total: float | None = None
    message: str = "started"
    finished_mono: float | None = None
    result: Any = None
    error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, done: float, total: float | None = None, message: str = "") -> None:
        with self.lock:
            self.progress, self.total = done, total
            if message:
                self.message = message

    def snapshot(self) -> JobStatus:
        with self.lock:
            end = self.finished_mono if self.finished_mono is not None else time.monotonic()
            return JobStatus(
                job_id=self.job_id, name=self.name, state=self.state, done=self.state != "running",
                progress=self.progress, total=self.total, message=self.message, started_at=self.started_at,
                elapsed_s=round(end - self.started_mono, 3), result=self.result,
                error=str(self.error) if self.error is not None else None,
                error_type=type(self.error).__name__ if self.error is not None else None, exception=self.error)


class JobRegistry:
    """Bounded set of background jobs. ``start(fn)`` runs ``fn(progress)`` on a daemon thread."""

    def __init__(self, max_jobs: int = 16, keep_s: float = 3600.0):
        self.max_jobs = max_jobs
        self.keep_s = keep_s
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        """Drop finished jobs older than ``keep_s``."""
        for job_id, job in list(self._jobs.items()):
            if job.finished_mono is not None and now - job.finished_mono > self.keep_s:
                del self._jobs[job_id]

    def _make_room(self) -> None:
        """When full, drop the oldest finished jobs (a running job is never dropped)."""
        finished = sorted((j for j in self._jobs.values() if j.finished_mono is not None),
                          key=lambda j: j.finished_mono or 0.0)
        while len(self._jobs) >= self.max_jobs and finished:
            del self._jobs[finished.pop(0).job_id]

    def start(self, fn: Callable[[Progress], Any], name: str = "job") -> str:
        """Run ``fn(progress)`` in the background and return its id at once.

        Raises :class:`InputError` (field ``job_id``) when ``max_jobs`` jobs are all still running.
        """
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            self._make_room()
            if len(self._jobs) >= self.max_jobs:
                raise InputError("job_id", f"{self.max_jobs} jobs are still running; poll one of them until it is "
                                 "done before starting another", allowed=sorted(self._jobs))
            job = _Job(job_id=f"{name}-{secrets.token_hex(6)}", name=name, started_at=time.time(), started_mono=now)
            self._jobs[job.job_id] = job

        def body() -> None:
            try:
                result = fn(job.report)
            except BaseException as err:  # a job's failure is reported to the poller, not lost
                with job.lock:
                    job.state, job.error, job.message = "failed", err, f"failed: {err}"
                    job.finished_mono = time.monotonic()
            else:
                with job.lock:
                    job.state, job.result, job.message = "done", result, "done"
                    job.finished_mono = time.monotonic()

        threading.Thread(target=body, name=f"rgt-{job.job_id}", daemon=True).start()
        return job.job_id

    def poll(self, job_id: str) -> JobStatus:
        """The job's state now. Raises :class:`InputError` for an unknown or expired id."""
        with self._lock:
            self._expire(time.monotonic())
            job = self._jobs.get(job_id)
            known = sorted(self._jobs)
        if job is None:
            raise InputError("job_id", f"no job {job_id!r} (unknown, or finished more than {self.keep_s:g} s ago "
                             "and expired); start the check again", allowed=known or None)
        return job.snapshot()

    def wait(self, job_id: str, timeout_s: float | None = None, interval_s: float = 0.05) -> JobStatus:
        """Poll until the job is done or ``timeout_s`` passes (for the CLI and tests)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self.poll(job_id)
            if status.done or (deadline is not None and time.monotonic() >= deadline):
                return status
            time.sleep(interval_s)


JOBS = JobRegistry()
"""The process-wide registry the tools share."""


def start(fn: Callable[[Progress], Any], name: str = "job") -> str:
    return JOBS.start(fn, name)


def poll(job_id: str) -> JobStatus:
    return JOBS.poll(job_id)


class DaemonPool:
    """``submit`` as a ThreadPoolExecutor has it, on daemon threads. A ThreadPoolExecutor's workers are joined at
    interpreter exit, so one host whose ssh call still runs (an install, a hung box in a fleet check) would hold
    ``rgt`` or the MCP server open after the answer was given; a job never keeps the process alive (above), and
    nor do the workers it fans out to. ``shutdown`` never waits: the callers wait on their futures, with deadlines.
    """

    def __init__(self, workers: int, name: str):
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._workers = max(1, workers)
        for number in range(self._workers):
            threading.Thread(target=self._work, name=f"{name}-{number}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        from concurrent.futures import Future  # only where a pool is used, not with every import of jobs

        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # the caller's future.result() raises it
                future.set_exception(err)

    def shutdown(self, cancel: Iterable[Future[Any]] = ()) -> None:
        """Let the workers end once the queue is empty; ``cancel``: futures not started yet are dropped."""
        for future in cancel:
            future.cancel()
        for _ in range(self._workers):
            self._queue.put(None)

    def __enter__(self) -> DaemonPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
