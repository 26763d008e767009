"""Every NVML call of this package runs in one long-lived worker *process*; this module is its owner.

Why a process, not a thread. NVML is a C library called through ctypes without prototypes
(nvidia-ml-py sets no ``argtypes``): one wrong argument, or a driver bug, is a native fault, and a
native fault ends the process it happens in. On a real H100 one such call (a struct passed by value)
killed the MCP server and every tool with it. A thread survives a hang, not a segfault; a process
survives both. So the server, the CLI and a run's supervisor never load ``libnvidia-ml`` at all:
``nvml_worker`` does, and answers requests over a pipe.

* **A native fault** costs one signal, not the answer. The worker writes the call it is about to make
  into a page of shared memory; when it dies, the session reads that page, restarts the worker with
  that call (on that GPU) on a skip list, and retries the request: the report says which call crashed
  (UNKNOWN for the one check it feeds), and every other check still runs. A skipped call stays
  skipped until the server restarts: a call that crashed once will crash again.
* **A hang** (a GPU that fell off the bus leaves the caller in the kernel, in D state) costs the
  caller's timeout and a FAIL naming the call. The worker is then SIGKILLed and abandoned, never
  ``wait()``-ed for: one stuck in D state cannot even die until the driver lets go. The next request
  gets a fresh worker, unless the abandoned one is still alive; then it is told at once that NVML is
  stuck, and where, instead of piling up stuck processes.
* **Warm stays warm.** One worker serves every request for the life of the server: ``nvmlInit`` runs
  once (it takes seconds without persistence mode and serialises across processes) and NVML is never
  shut down. A request costs one round trip on a pipe (a pickled snapshot, well under a millisecond);
  the worker initialises NVML as soon as it starts, while the caller is still doing its own work.
  A failed init is retried after a few seconds, so ``modprobe nvidia`` under a running server is seen.
* Prototypes (``argtypes`` on every NVML function pointer) were the other way to refuse a wrong
  argument before C sees it. They would mean keeping our own copy of ~50 C signatures in step with
  pynvml, and would not help with a fault inside the driver or a hang. The C-level fake library in the
  tests (``tests/nvml_fake``) checks the arguments at the ABI instead.

``SerialWorker`` (one thread, jobs with a timeout) remains for the in-process backends: the named fake
scenarios and the in-process ``PynvmlBackend`` that tests drive with a monkeypatched pynvml.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import pickle
import queue
import re
import select
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Generic, TypeVar

T = TypeVar("T")

RETRY_FAILED_INIT_AFTER_S = 5.0
DEFAULT_REQUEST_TIMEOUT_S = 30.0
MAX_RESTARTS_PER_REQUEST = 4
"""Crashes one request may cost (each skips one more call) before it gives up with NvmlCrash."""
PROGRESS_SIZE = 256
"""Shared page: 8-byte CLOCK_MONOTONIC start time of the call in flight, then its label, NUL-ended."""


@dataclass(frozen=True)
class NvmlStatus:
    ok: bool
    reason: str
    """``ok`` or one of: pynvml_missing, no_driver, driver_not_loaded, driver_library_mismatch,
    no_permission, timeout, crashed, error."""
    detail: str
    driver_version: str | None = None
    nvml_version: str | None = None
    device_count: int | None = None
    cuda_driver_version: str | None = None
    """The CUDA version the driver supports, e.g. ``12.4`` (what ``nvidia-smi`` prints top right)."""


#: Reasons meaning "there is no usable NVIDIA GPU stack here at all", as opposed to a broken one.
NO_GPU_REASONS = frozenset({"pynvml_missing", "no_driver", "driver_not_loaded"})


class NvmlFault(Exception):
    """NVML did not answer: it hung (:class:`NvmlHang`), its process died (:class:`NvmlCrash`) or it answered
    with an error of the worker's own (:class:`NvmlWorkerError`)."""


class NvmlHang(NvmlFault, TimeoutError):
    """An NVML job did not finish in time; ``stuck_in`` names the call the worker is blocked in."""

    def __init__(self, label: str, waited_s: float, stuck_in: str | None, stuck_for_s: float):
        self.label = label
        self.waited_s = waited_s
        self.stuck_in = stuck_in
        self.stuck_for_s = stuck_for_s
        where = f" (blocked in {stuck_in} for {stuck_for_s:.1f} s)" if stuck_in else ""
        super().__init__(f"{label} did not finish within {waited_s:g} s{where}")


class NvmlWorkerError(NvmlFault):
    """The worker answered a request with an error (an exception on its side, not NVML's): an NvmlFault so
    that callers, which catch only NvmlFault, turn it into one check's verdict rather than a traceback."""

    def __init__(self, label: str, detail: str):
        self.label = label
        self.detail = detail
        super().__init__(f"{label}: the NVML worker answered with an error: {detail}")


class NvmlCrash(NvmlFault):
    """The worker process kept dying while answering one request (see MAX_RESTARTS_PER_REQUEST)."""

    def __init__(self, label: str, crashed_in: str | None, how: str):
        self.label = label
        self.crashed_in = crashed_in
        self.how = how
        super().__init__(f"{label}: the NVML worker process died ({how})"
                         + (f" in {crashed_in}" if crashed_in else ""))


# --- in-process jobs with a timeout (fakes, in-process backend) ---------------------------------------


class Job(Generic[T]):
    """One unit of work for the worker thread; the submitter waits on it with its own timeout."""

    def __init__(self, fn: Callable[[], T], label: str):
        self.fn = fn
        self.label = label
        self.done = threading.Event()
        self.cancelled = False
        self.result: T | None = None
        self.error: BaseException | None = None

    def wait(self, timeout_s: float | None) -> bool:
        return self.done.wait(timeout_s)

    def outcome(self) -> T:
        """The result, or re-raise the job's exception. Only call after ``wait`` returned True."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class SerialWorker:
    """A daemon thread that runs jobs one at a time and can say what it is blocked in."""

    _ids = itertools.count()

    def __init__(self, name: str = "nvml"):
        self.name = name
        self._jobs: queue.SimpleQueue[Job[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running: tuple[str, float] | None = None
        self.detail: str | None = None
        """Set by the running job to the call it is making (e.g. ``nvmlDeviceGetTemperature (GPU 3)``),
        so a timeout can say exactly where NVML hung."""

    def submit(self, fn: Callable[[], T], label: str) -> Job[T]:
        job = Job(fn, label)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"{self.name}-{next(self._ids)}",
                                                daemon=True)
                self._thread.start()
        self._jobs.put(job)
        return job

    def busy(self) -> tuple[str, float] | None:
        """``(what it is doing, seconds so far)`` of the running job, or None when idle."""
        running = self._running
        if running is None:
            return None
        label, started = running
        return (self.detail or label, time.monotonic() - started)

    def call(self, fn: Callable[[], T], label: str, timeout_s: float) -> T:
        """Run ``fn`` on the worker and return its result; raise :class:`NvmlHang` after ``timeout_s``.

        If the worker has already been blocked for longer than ``timeout_s`` on an earlier job, fail
        at once: queueing behind a wedged driver call would only hang this caller too.
        """
        stuck = self.busy()
        if stuck is not None and stuck[1] >= timeout_s:
            raise NvmlHang(label, 0.0, stuck[0], stuck[1])
        job = self.submit(fn, label)
        if not job.wait(timeout_s):
            job.cancelled = True
            stuck = self.busy()
            raise NvmlHang(label, timeout_s, stuck[0] if stuck else None, stuck[1] if stuck else 0.0)
        return job.outcome()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job.cancelled:  # its caller gave up before it started: do not touch NVML for nobody
                job.done.set()
                continue
            self._running = (job.label, time.monotonic())
            self.detail = None
            try:
                job.result = job.fn()
            except BaseException as err:  # handed to the waiting caller, never lost in this thread
                job.error = err
            finally:
                self._running = None
                self.detail = None
                job.done.set()


# --- the worker process -------------------------------------------------------------------------------


def _log() -> Any:
    import logging  # only when a worker died: logging costs a few ms of every cold start

    return logging.getLogger(__name__)


def send_message(stream: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("!I", len(data)) + data)
    stream.flush()


_CALL = re.compile(r"^(?P<name>\S+)(?: \(GPU (?P<index>\d+)\))?$")


def parse_call(label: str) -> tuple[str, int | None]:
    """``nvmlDeviceGetTemperature (GPU 3)`` → ("nvmlDeviceGetTemperature", 3)."""
    match = _CALL.match(label)
    if not match:
        return label, None
    return match["name"], int(match["index"]) if match["index"] is not None else None


def _signal_text(returncode: int | None) -> str:
    if returncode is None:
        return "killed, not yet gone"
    if returncode < 0:
        import signal

        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def python_command(module: str, *args: str) -> list[str]:
    """argv that runs ``remote_gpu_trainer.<module>.main()`` in a fresh interpreter of this Python, with ``args``
    from ``sys.argv[2]`` on. ``-S`` (no site import: a faster start); the package and its dependencies are found
    where this process found them (its ``sys.path``, passed as ``sys.argv[1]``)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [here, *(p for p in sys.path if p and p != here)]
    boot = ("import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
            f"from remote_gpu_trainer.{module} import main; main()")
    return [sys.executable, "-S", "-c", boot, json.dumps(paths), *args]


class _Worker:
    """One NVML worker process: its pipes, its shared progress page and its stderr (faulthandler)."""

    def __init__(self, skip: dict[tuple[str, int | None], str]):
        import subprocess

        from .processes.snapshot import HELPER_ENV

        self.page_file = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker; close())
        self.page_file.truncate(PROGRESS_SIZE)
        self.page = mmap.mmap(self.page_file.fileno(), PROGRESS_SIZE)
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (faulthandler output; close())
        skipped = [[name, index, why] for (name, index), why in skip.items()]
        # Its own session: it is this process's helper, not part of whatever job shares our session (a run
        # supervisor counts its session's processes as the run's, runs/members.py). It still ends with us: it
        # exits when its stdin closes.
        self.process = subprocess.Popen(
            python_command("nvml_worker", str(self.page_file.fileno()), json.dumps(skipped)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, pass_fds=(self.page_file.fileno(),),
            close_fds=True, start_new_session=True, env={**os.environ, HELPER_ENV: "nvml"})
        self.started = time.monotonic()
        self.ready_status: NvmlStatus | None = None
        self.timings: dict[str, float] = {}
        """Its start-up, for bench/gpu_health.py: main_at (CLOCK_MONOTONIC), import_pynvml_s, nvml_init_s,
        ready_after_s (from the spawn to its status arriving here)."""
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.process.pid

    def in_flight(self) -> tuple[str, float] | None:
        """The call the worker is in (label, seconds so far), read from the shared page; None when in none.

        Callers (``NvmlSession.busy``) read it without the session's lock, so a concurrent close may have
        unmapped the page: that worker is in no call any more, not an error."""
        try:
            started, = struct.unpack_from("d", self.page, 0)
            raw = self.page[8:PROGRESS_SIZE]
        except ValueError:  # mmap closed
            return None
        label = raw.split(b"\0", 1)[0].decode(errors="replace")
        if not label:
            return None
        return label, max(time.monotonic() - started, 0.0)

    def send(self, message: object) -> bool:
        try:
            assert self.process.stdin is not None
            send_message(self.process.stdin, message)
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def receive(self, deadline: float) -> tuple[str, Any]:
        """The next message; ("timeout", None) past ``deadline``; ("died", None) when the process is gone."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while True:
            if len(self._buffer) >= 4:
                size, = struct.unpack("!I", self._buffer[:4])
                if len(self._buffer) >= 4 + size:
                    data, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
                    return pickle.loads(data)
            left = deadline - time.monotonic()
            if left <= 0:
                return ("timeout", None)
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return ("died", None)
            self._buffer += chunk

    def death(self) -> str:
        """How it died: the signal, and faulthandler's first lines when it wrote any."""
        returncode = None
        for _ in range(50):  # an exited process is reaped at once; never block on one that is not
            returncode = self.process.poll()
            if returncode is not None:
                break
            time.sleep(0.01)
        text = _signal_text(returncode)
        try:
            self.stderr.seek(0)
            fault = self.stderr.read()[-4000:].decode(errors="replace")
        except OSError:
            fault = ""
        if fault.strip():
            _log().warning("NVML worker %s died (%s); its last words:\n%s", self.pid, text, fault.strip())
        return text

    def kill(self) -> None:
        """SIGKILL and let go: no wait() (a process in D state would block it forever)."""
        try:
            self.process.kill()
        except OSError:
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass

    def close(self) -> None:
        self.kill()
        self.page.close()
        self.page_file.close()
        self.stderr.close()


class NvmlSession:
    """The process-wide NVML session: one worker process, restarted after a crash, abandoned when hung.

    ``call(fn, label, timeout_s)`` is the seam the probes use (the same as :class:`SerialWorker`'s):
    ``fn`` runs on the caller's thread and makes its requests through :meth:`request`, which answers
    or raises :class:`NvmlHang` / :class:`NvmlCrash` by the deadline ``call`` set.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._worker: _Worker | None = None
        self._abandoned: list[tuple[_Worker, str]] = []
        self.skipped: dict[tuple[str, int | None], str] = {}
        """(call, GPU) → why: calls that crashed the worker, answered as unreadable from then on."""
        self._status: NvmlStatus | None = None
        self._status_at = 0.0
        self._deadline: float | None = None
        self._label = "NVML"
        self.restarts = 0

    # -- the worker ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker now (it initialises NVML at once), so its start-up overlaps the caller's."""
        with self._lock:
            self._ensure_worker()

    def _ensure_worker(self) -> _Worker:
        if self._worker is not None and self._worker.process.poll() is None:
            return self._worker
        if self._worker is not None:  # exited between requests: start afresh
            self._worker.close()
            self._worker = None
        still_stuck = [(w, where) for w, where in self._abandoned if w.process.poll() is None]
        for worker, _ in self._abandoned:
            if worker.process.returncode is not None:
                worker.close()
        self._abandoned = still_stuck
        if still_stuck:
            worker, where = still_stuck[0]
            raise NvmlHang(self._label, 0.0, f"{where} (worker pid {worker.pid}, killed but still stuck: "
                           "D state)", time.monotonic() - worker.started)
        self._worker = _Worker(self.skipped)
        return self._worker

    def _abandon(self, worker: _Worker, where: str) -> None:
        worker.kill()
        self._worker = None
        for _ in range(20):  # a killable worker is gone within moments; one in D state is not
            if worker.process.poll() is not None:
                break
            time.sleep(0.01)
        if worker.process.poll() is None:
            self._abandoned.append((worker, where))
        else:
            worker.close()

    def _wait_ready(self, worker: _Worker, deadline: float) -> NvmlStatus | None:
        """The status the worker sends after its nvmlInit; None if not yet by ``deadline``."""
        if worker.ready_status is not None:
            return worker.ready_status
        kind, payload = worker.receive(deadline)
        if kind == "status":
            worker.ready_status, worker.timings = payload
            worker.timings["ready_after_s"] = time.monotonic() - worker.started
            return worker.ready_status
        if kind == "died":
            how = worker.death()
            where = worker.in_flight()
            self._worker = None
            worker.close()
            name = where[0] if where else "NVML start-up"
            return NvmlStatus(False, "crashed", f"the NVML worker process died ({how}) in {name}: the driver "
                              "or library faults natively; nothing else is wrong with this server")
        return None

    # -- status ----------------------------------------------------------------------------------

    def status(self, timeout_s: float = 10.0) -> NvmlStatus:
        """NVML's status, initialising it (in the worker) on first use and retrying a failed init.

        A slow init is not abandoned: a later call waits on the same attempt (without persistence
        mode nvmlInit can take seconds, and a second init would only queue behind the first)."""
        cached = self._status
        if cached is not None and (cached.ok or time.monotonic() - self._status_at < RETRY_FAILED_INIT_AFTER_S):
            return cached
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=timeout_s):
            busy = self.busy()
            where = f": busy in {busy[0]} for {busy[1]:.1f} s" if busy else ""
            return NvmlStatus(False, "timeout", f"NVML did not answer within {timeout_s:g} s{where}")
        try:
            try:
                worker = self._ensure_worker()
            except NvmlHang as hang:
                return NvmlStatus(False, "timeout", f"{hang}: the driver is wedged; a reset or reboot is needed")
            retry = worker.ready_status is not None and not worker.ready_status.ok
            status = self._wait_ready(worker, deadline)
            if status is None:
                return NvmlStatus(False, "timeout", f"nvmlInit did not return within {timeout_s:g} s: the driver "
                                  "is likely wedged (look for XID 79 'fallen off the bus' in dmesg); a reset or "
                                  "reboot is needed")
            if retry:  # the worker's init failed a while ago: try again (modprobe nvidia since?)
                try:
                    status = self._request_locked("retry_init", (), deadline)
                except NvmlFault as fault:
                    status = NvmlStatus(False, "timeout" if isinstance(fault, NvmlHang) else "crashed", str(fault))
                if self._worker is worker:
                    worker.ready_status = status
            self._status, self._status_at = status, time.monotonic()
            return status
        finally:
            self._lock.release()

    # -- requests --------------------------------------------------------------------------------

    def call(self, fn: Callable[[], T], label: str, timeout_s: float) -> T:
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=timeout_s):
            busy = self.busy()
            raise NvmlHang(label, timeout_s, busy[0] if busy else None, busy[1] if busy else 0.0)
        outer = self._deadline, self._label
        try:
            self._deadline, self._label = deadline, label
            return fn()
        finally:
            self._deadline, self._label = outer
            self._lock.release()

    def request(self, op: str, *args: Any) -> Any:
        """Ask the worker; inside :meth:`call` the call's deadline applies, else the default."""
        with self._lock:
            deadline = self._deadline or time.monotonic() + DEFAULT_REQUEST_TIMEOUT_S
            return self._request_locked(op, args, deadline)

    def _request_locked(self, op: str, args: tuple[Any, ...], deadline: float) -> Any:
        for _ in range(MAX_RESTARTS_PER_REQUEST + 1):
            worker = self._ensure_worker()
            if self._wait_ready(worker, deadline) is None:
                where = worker.in_flight()
                self._abandon(worker, where[0] if where else "nvmlInit")
                raise NvmlHang(self._label, round(deadline - worker.started, 3), where[0] if where else "nvmlInit",
                               where[1] if where else 0.0)
            if self._worker is not worker:  # it died during start-up: a fresh one next round
                continue
            sent_at = time.monotonic()
            if worker.send((op, args)):
                kind, payload = worker.receive(deadline)
            else:
                kind, payload = "died", None
            if kind == "ok":
                return payload
            if kind == "error":
                raise NvmlWorkerError(self._label, str(payload))
            where = worker.in_flight()
            if kind == "timeout":
                self._abandon(worker, where[0] if where else op)
                raise NvmlHang(self._label, round(time.monotonic() - sent_at, 3), where[0] if where else None,
                               where[1] if where else 0.0)
            how = worker.death()  # "died": a native fault (or someone killed it)
            self._worker = None
            worker.close()
            self.restarts += 1
            if where is None:
                raise NvmlCrash(self._label, None, how)
            name, index = parse_call(where[0])
            self.skipped[(name, index)] = (f"skipped: it crashed the NVML worker process ({how}) at "
                                           f"{time.strftime('%H:%M:%S')}; not called again until the server "
                                           "restarts")
            _log().warning("NVML call %s crashed the worker (%s); skipping it from now on", where[0], how)
        raise NvmlCrash(self._label, None, f"{MAX_RESTARTS_PER_REQUEST} restarts")

    def busy(self) -> tuple[str, float] | None:
        """What the worker is in now (from its shared page), or None."""
        worker = self._worker
        return worker.in_flight() if worker is not None else None

    def startup(self) -> dict[str, float]:
        """The current worker's start-up times (see ``_Worker.timings``), with the interpreter's share."""
        worker = self._worker
        if worker is None or not worker.timings:
            return {}
        return {**worker.timings, "python_start_s": worker.timings["main_at"] - worker.started}

    @property
    def last_status(self) -> NvmlStatus | None:
        """What the last :meth:`status` found, without asking NVML again (None before the first)."""
        return self._status

    @property
    def worker_pid(self) -> int | None:
        worker = self._worker
        return worker.pid if worker is not None else None

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None


_session = NvmlSession()


def session() -> NvmlSession:
    """The process-wide session every real NVML request goes through (see the module docstring)."""
    return _session


def nvml_status(timeout_s: float = 10.0) -> NvmlStatus:
    """The process-wide NVML status, initialising NVML (in the worker) on first use."""
    return _session.status(timeout_s)


def reset_for_tests() -> None:
    """End the worker and forget everything, so a test can open a new (fake) session.

    A worker stuck in a test's fake hang is killed (it is in user space, so it dies).
    """
    global _session
    old = _session
    _session = NvmlSession()
    old.close()
    for worker, _ in old._abandoned:
        worker.close()
