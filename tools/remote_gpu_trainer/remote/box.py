"""``box_install`` / ``box_status`` / ``box_remove``: the runtime on a box, installed on request, without root.

Install = upload one tar (our wheel, plus dependency wheels with ``wheels=true``) → a fixed install
script builds ``~/.cache/remote-gpu-trainer/<version>/venv`` with ``--system-site-packages`` and pip-installs
the wheel (dependencies from the box's own index, or only from the uploaded wheels) → ``ready`` is written
last. Re-running is a no-op.

A fleet is one call: ``box_install(hosts=[...])`` installs every box in parallel (the tar is built once and
dependency wheels are downloaded once per python/platform, for all boxes), reports one progress line per
box state change, and answers with a row per box. MCP clients give up on a call after about a minute, so
an install that has not finished in ``wait_s`` keeps going in the background; a later call for the same
hosts reports it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from ..errors import InputError
from ..models import StrictModel
from ..tables import format_table
from ..toolspec import Progress, ToolSpec
from .errors import RemoteError
from .hosts import Host, parse_host, resolve
from .runtime import install_script, remove_script, runtime_version, status_script, upload_command
from .ssh import run

MIN_FREE_BYTES = 64 * 2**20
"""The wheel and a venv with pip: about 25 MiB; more when --wheels sends dependencies."""
STEPS = 5
"""Progress of one box's install: checking, (downloading wheels), sending, installing, done."""
HOST_DESCRIPTION = "The box: an ssh alias from ~/.ssh/config or user@name[:port], as typed after `ssh`."


class BoxInput(StrictModel):
    host: str = Field(min_length=1, max_length=300, description=HOST_DESCRIPTION)


class InstallInput(StrictModel):
    hosts: list[str] | None = Field(None, min_length=1, max_length=256, description="The boxes, each an ssh alias "
                                    "or user@name[:port]; all are installed at once, in parallel")
    host: str | None = Field(None, min_length=1, max_length=300, description="One box (the same as hosts=[host])")
    wheels: bool = Field(False, description="The boxes cannot reach a package index: download the dependencies' "
                         "wheels here (once per python version and platform) and send them with the runtime.")
    wait_s: float | None = Field(45, ge=0, le=3600, description="Wait this long for the installs; past it they go "
                                 "on in the background and a later box_install call for the same hosts reports "
                                 "them. null: wait until every box is done (what `rgt box install` does)")
    concurrency: int = Field(16, ge=1, le=64, description="Boxes installed at the same time")

    @model_validator(mode="after")
    def _some_box(self) -> InstallInput:
        if not self.targets():
            raise ValueError("give hosts (a list of boxes) or host (one box)")
        return self

    def targets(self) -> list[str]:
        """Every box named, in order, each once."""
        return list(dict.fromkeys([*(self.hosts or []), *([self.host] if self.host else [])]))


class RuntimeVersion(StrictModel):
    version: str
    state: Literal["ready", "partial"]


class BoxReport(StrictModel):
    host: str = Field(description="The host as the caller gave it")
    box: str | None = Field(None, description="user@host:port as ssh resolved it")
    needed: str = Field(description="The runtime version this checkout needs on the box")
    state: Literal["ready", "missing", "mismatch", "installing", "failed", "removed"]
    installed: list[RuntimeVersion] = Field(default_factory=list)
    python: str | None = Field(None, description="The runtime's python version, when installed")
    free_bytes: int | None = Field(None, description="Free space in the box user's home")
    steps: list[str] = Field(default_factory=list, description="What the install did, in order")
    outcome: Literal["installed", "already", "installing", "failed"] | None = Field(
        None, description="box_install only: what this call did on the box")
    error: str | None = Field(None, description="Why the install failed, in words")
    error_kind: str | None = Field(None, description="The failure's kind: no_python, disk_full, install_failed, or "
                                   "an ssh failure such as connection_refused or host_key_changed")
    elapsed_s: float | None = Field(None, description="box_install only: seconds this box took")
    next_step: str
    summary: str


class InstallReport(StrictModel):
    state: Literal["ready", "installing", "failed"] = Field(description="ready: every box has the runtime. "
                                                            "installing: some are still going (call again). "
                                                            "failed: at least one box failed (its row says why)")
    summary: str
    needed: str = Field(description="The runtime version this checkout needs on every box")
    hosts: list[BoxReport] = Field(description="One row per box, in the order given")
    elapsed_s: float
    next_step: str


def _lines(text: str, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in text.splitlines() if line.startswith(prefix)]


def _status(host: Host) -> BoxReport:
    needed = runtime_version()
    done = run(host, "sh -s", status_script(needed).encode(), timeout_s=60)
    out = done.stdout.decode("utf-8", errors="replace")
    installed = [RuntimeVersion(version=v.split()[0], state=v.split()[1]) for v in _lines(out, "rgt-version:")
                 if len(v.split()) == 2 and v.split()[1] in ("ready", "partial")]
    python = next(iter(_lines(out, "rgt-python:")), None)
    free = next(iter(_lines(out, "rgt-free-kib:")), None)
    ready = any(v.version == needed and v.state == "ready" for v in installed)
    state = "ready" if ready else "mismatch" if installed else "missing"
    next_step = {"ready": "call any tool with host=... (CLI: --host)",
                 "mismatch": f"run `rgt box install {host.given}` to add {needed}",
                 "missing": f"run `rgt box install {host.given}` (or box_install over MCP)"}[state]
    summary = {"ready": f"{host.given}: runtime {needed} ready (python {python})",
               "mismatch": f"{host.given}: has {', '.join(v.version for v in installed)}, needs {needed}",
               "missing": f"{host.given}: no runtime installed"}[state]
    return BoxReport(host=host.given, box=resolve(host).identity, needed=needed, state=state, installed=installed,
                     python=python, free_bytes=int(free) * 1024 if free and free.isdigit() else None,
                     next_step=next_step, summary=summary)


def _box_python(host: Host) -> tuple[str, str]:
    """(X.Y, platform tag) of the interpreter the install script will pick, for downloading wheels."""
    probe = ("sh -c 'for c in python3.13 python3.12 python3.11 python3; do p=$(command -v \"$c\") || continue; "
             "exec \"$p\" -c \"import sys, sysconfig; print(sys.version_info[0], sys.version_info[1], "
             "sysconfig.get_platform())\"; done; exit 91'")
    out = run(host, probe, timeout_s=60).stdout.decode().split()
    if len(out) != 3:
        raise RemoteError(host.given, "no_python", "no python3 on the box", "install python 3.11+ on the box")
    return f"{out[0]}.{out[1]}", wheel_platform(out[2])


def wheel_platform(sysconfig_platform: str) -> str:
    """The pip ``--platform`` for a box whose ``sysconfig.get_platform()`` is e.g. ``linux-x86_64``."""
    return f"manylinux2014_{sysconfig_platform.split('-')[-1]}"


_NO_WHEEL = re.compile(r"No matching distribution found for (\S+)")


def download_wheels(python_version: str, platform: str, into: Path) -> list[Path]:
    """The runtime's dependencies as wheels for another interpreter (``3.11``, ``manylinux2014_x86_64``): what
    ``--wheels`` sends to a box that cannot reach a package index. Raises RuntimeError with pip's words.

    ``pip download --platform`` takes wheels only, and some dependencies publish only an sdist (python-hostlist):
    such a requirement is built into a wheel here, which must come out pure Python (``py3-none-any``) to suit
    the box, and the download runs again with it at hand.
    """
    from .runtime import box_requirements

    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--platform", platform,
            "--python-version", python_version, "--find-links", str(into), "-d", str(into), *box_requirements()]
    built: set[str] = set()
    while True:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        missing = _NO_WHEEL.search(done.stderr)
        if done.returncode == 0 or missing is None or missing.group(1) in built:
            break
        built.add(missing.group(1))
        before = set(into.glob("*.whl"))
        wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(into),
                                missing.group(1)], capture_output=True, text=True, timeout=600,
                               stdin=subprocess.DEVNULL)
        new = set(into.glob("*.whl")) - before
        if wheel.returncode != 0 or not new or not all(w.name.endswith("-py3-none-any.whl") for w in new):
            for path in new:
                path.unlink()
            raise RuntimeError(f"{missing.group(1)} has no wheel for python {python_version} {platform}, and "
                               f"built here it is not pure Python: {wheel.stderr.strip()[-300:] or sorted(new)}")
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-300:])
    return sorted(into.glob("*.whl"))


def _download_wheels(host: Host, kind: tuple[str, str], into: Path, progress: Progress) -> list[Path]:
    version, platform = kind
    progress(1, STEPS, f"downloading dependency wheels for python {version} {platform}")
    try:
        return download_wheels(version, platform, into)
    except RuntimeError as err:
        raise RemoteError(host.given, "install_failed", "could not download the dependency wheels here",
                          f"check this machine's package index access; pip said: {err}") from err


_FAIL_KINDS = {"no_python": "no_python", "venv": "install_failed", "pip": "install_failed",
               "import": "install_failed"}


class Payload:
    """What every box of one install call is sent: the runtime tar, built once, and with ``wheels`` the
    dependency wheels, downloaded once per python version and platform however many boxes share them."""

    def __init__(self, wheels: bool):
        self.wheels = wheels
        self._tars: dict[tuple[str, str] | None, tuple[bytes, int]] = {}
        self._lock = threading.Lock()

    def tar(self, host: Host, progress: Progress) -> tuple[bytes, int]:
        """(tar bytes, number of dependency wheels in it) for ``host``."""
        from .runtime import dist_tarball

        key = _box_python(host) if self.wheels else None
        with self._lock:  # boxes of one kind wait for the first one's download instead of repeating it
            if key not in self._tars:
                with tempfile.TemporaryDirectory() as tmp:
                    extra = _download_wheels(host, key, Path(tmp), progress) if key else []
                    self._tars[key] = (dist_tarball(extra), len(extra))
            return self._tars[key]


def install(host: Host, wheels: bool = False, progress: Progress | None = None,
            payload: Payload | None = None) -> BoxReport:
    """Install (or confirm) this checkout's runtime on ``host``. Raises RemoteError with the cause.

    ``payload`` is shared by the boxes of one call (see :class:`Payload`); without it one is made here.
    """
    report = progress or (lambda *a, **k: None)
    payload = payload or Payload(wheels)
    version = runtime_version()
    steps: list[str] = []
    report(0, STEPS, "checking the box")
    current = _status(host)
    if current.state == "ready":
        return current.model_copy(update={"outcome": "already",
                                          "summary": f"{host.given}: runtime {version} already installed"})
    if current.free_bytes is not None and current.free_bytes < MIN_FREE_BYTES:
        raise RemoteError(host.given, "disk_full", f"the box has {current.free_bytes / 2**20:.0f} MiB free in the "
                          f"home directory; the runtime needs about {MIN_FREE_BYTES // 2**20} MiB",
                          f"free space in the home directory (`df -h ~` on the box), then run `rgt box install "
                          f"{host.given}` again")
    tar, extra = payload.tar(host, report)
    report(2, STEPS, "sending the runtime")
    sent = run(host, upload_command(version), tar, timeout_s=600)
    if sent.returncode != 0:
        raise _install_failure(host, sent.stderr.decode("utf-8", errors="replace"))
    steps.append(f"sent {version} ({extra} dependency wheels)" if payload.wheels else f"sent {version}")
    report(3, STEPS, "building the venv and installing (pip on the box)")
    done = run(host, "sh -s", install_script(version, offline=payload.wheels).encode(), timeout_s=900)
    out = done.stdout.decode("utf-8", errors="replace")
    steps += _lines(out, "rgt-step:")
    if done.returncode != 0:
        raise _install_failure(host, done.stderr.decode("utf-8", errors="replace"))
    final = _status(host)
    return final.model_copy(update={"steps": steps, "outcome": "installed", "summary": f"{host.given}: runtime "
                                    f"{version} installed (python {final.python})"})


def _install_failure(host: Host, stderr: str) -> RemoteError:
    kind_word = next(iter(_lines(stderr, "rgt-fail:")), "").split(" ")[0]
    tail = stderr.strip()[-1200:]
    if any(sign in stderr for sign in ("No space left on device", "Errno 28", "Wrote only")):  # tar: "Wrote only"
        return RemoteError(host.given, "disk_full", "the box ran out of disk space during the install",
                           f"free space in the home directory (`df -h ~` on the box), then run `rgt box install "
                           f"{host.given}` again", detail=tail)
    if kind_word == "no_python":
        return RemoteError(host.given, "no_python", "the box has no python 3.11 or newer "
                           f"({stderr.split('no_python', 1)[1].strip()[:80] or 'python3 not found'})",
                           "install python 3.11+ on the box (e.g. `apt install python3.11 python3.11-venv`, or "
                           f"conda/uv), then run `rgt box install {host.given}` again", detail=tail)
    last = tail.splitlines()[-2] if len(tail.splitlines()) > 1 else tail
    return RemoteError(host.given, _FAIL_KINDS.get(kind_word, "install_failed"),  # type: ignore[arg-type]
                       f"the install failed at step {kind_word or 'upload'}: {last[:200]}",
                       f"read the detail; with no package index on the box, use `rgt box install {host.given} "
                       "--wheels`", detail=tail)


class _Batch:
    """The boxes one box_install call started, installed in parallel by one background job.

    It keeps a row per finished box and every state change as an event, so whoever waits (the call that
    started it, or a later call for the same hosts) shows each change once, in order, however often it looks.
    Whether it is done is read from the batch itself, never from the job registry: that drops a job an hour
    after it ends (or for 16 newer ones), while the batch waits for a call to report it.
    """

    def __init__(self, hosts: list[Host], wheels: bool, concurrency: int):
        from .. import jobs

        self.hosts = hosts
        self.payload = Payload(wheels)
        self.concurrency = concurrency
        self.lock = threading.Lock()
        self.step = {h.given: 0.0 for h in hosts}
        self.rows: dict[str, BoxReport] = {}
        self.events: list[tuple[str, float, str]] = []
        """(host, its step then, message): every state change, in order."""
        self.started = time.monotonic()
        self.ended = False
        self.failure: BaseException | None = None
        """Why the job itself died (not a box's failure: that is the box's row)."""
        self.job_id = jobs.start(self._run, name=f"box install ({len(hosts)} host(s))")

    def done(self) -> bool:
        """Every box has its row, or the job ended without one (it died)."""
        with self.lock:
            return self.ended or all(h.given in self.rows for h in self.hosts)

    def _progress_of(self, host: Host) -> Progress:
        def report(done: float, total: float | None = None, message: str = "") -> None:
            with self.lock:
                self.step[host.given] = done
                if message:
                    self.events.append((host.given, done, message))
        return report

    def _run(self, _progress: Progress) -> None:
        """``concurrency`` daemon workers (jobs.DaemonPool) take the hosts in order, so Ctrl-C or a server
        shutdown never waits for the installs still running."""
        from .. import jobs

        try:
            with jobs.DaemonPool(min(self.concurrency, len(self.hosts)), "rgt-install") as pool:
                futures = [pool.submit(self._one, host) for host in self.hosts]
            for future in futures:
                future.result()
        except BaseException as err:
            self.failure = err
            raise
        finally:
            with self.lock:
                self.ended = True

    def _one(self, host: Host) -> None:
        started = time.monotonic()
        try:
            row = install(host, progress=self._progress_of(host), payload=self.payload)
        except Exception as err:  # a failed box is a row with its cause and fix; the others go on
            row = failed_row(host.given, err)
        took = time.monotonic() - started
        row = row.model_copy(update={"elapsed_s": round(took, 2)})
        event = {"already": "already installed", "installed": f"installed in {took:.0f} s (python {row.python})"
                 }.get(row.outcome or "", f"FAILED after {took:.0f} s: {row.error_kind}")
        with self.lock:
            self.rows[host.given] = row
            self.step[host.given] = STEPS
            self.events.append((host.given, STEPS, event))

    def row(self, host: str) -> BoxReport | None:
        """The finished row, or a row saying the box is still being installed (and the job's failure, should the
        job itself have died)."""
        with self.lock:
            if host in self.rows:
                return self.rows[host]
            last = next((m for h, _, m in reversed(self.events) if h == host), "waiting for a free slot")
            ended = self.ended
        if ended:
            return failed_row(host, self.failure or RuntimeError("the install job ended before this box"))
        return BoxReport(host=host, needed=runtime_version(), state="installing", outcome="installing", steps=[last],
                         next_step="call box_install again with the same hosts to see progress",
                         summary=f"{host}: installing ({last}, {time.monotonic() - self.started:.0f} s)")


def failed_row(host: str, err: BaseException) -> BoxReport:
    """A box whose install failed: the RemoteError's cause and next step, or the exception in words."""
    if isinstance(err, RemoteError):
        return BoxReport(host=host, needed=runtime_version(), state="failed", outcome="failed", error=err.message,
                         error_kind=err.kind, next_step=err.next_step, summary=str(err))
    message = f"{type(err).__name__}: {err}"
    return BoxReport(host=host, needed=runtime_version(), state="failed", outcome="failed", error=message,
                     error_kind="install_failed", next_step=f"run `rgt box install {host}` again; report it if it "
                     "repeats", summary=f"host {host}: the install failed: {message}")


# Host → the batch installing it (or finished and not yet reported), so a later call reports that one.
_batches: dict[str, _Batch] = {}
_batches_lock = threading.Lock()


def install_many(hosts: list[Host], wheels: bool, progress: Progress, wait_s: float | None,
                 concurrency: int = 16) -> InstallReport:
    """Install on every host at once; wait up to ``wait_s`` (None: until all are done) and report a row per host.

    Progress is one message per box state change (``box-3: sending the runtime``), with done/total counted in
    steps over all boxes.
    """
    started = time.monotonic()
    with _batches_lock:
        new = [h for h in hosts if h.given not in _batches]
        if new:
            try:
                batch = _Batch(new, wheels, concurrency)
            except InputError as err:  # the job registry is full: say so about this tool's own field
                raise InputError("hosts", f"cannot start box_install for {', '.join(h.given for h in new)} now: "
                                 f"{err.message}") from None
            _batches.update((h.given, batch) for h in new)
        mine = {h.given: _batches[h.given] for h in hosts}
    batches = list(dict.fromkeys(mine.values()))
    seen = dict.fromkeys(batches, 0)
    deadline = None if wait_s is None else started + wait_s
    total = STEPS * len(mine)
    steps = dict.fromkeys(mine, 0.0)
    while True:
        finished = all(host in batch.rows for host, batch in mine.items())
        for batch in batches:  # every new event about our hosts, once, in the order it happened
            with batch.lock:
                new_events, seen[batch] = batch.events[seen[batch]:], len(batch.events)
            for host, step, message in new_events:
                if host in mine:
                    steps[host] = step
                    progress(sum(steps.values()), total, f"{host}: {message}")
        if finished or (deadline is not None and time.monotonic() >= deadline) or \
                all(b.done() for b in batches):
            break
        time.sleep(0.1)
    rows = [mine[h.given].row(h.given) for h in hosts]
    with _batches_lock:  # a reported result is not reported again: the next call starts afresh
        for row in rows:
            if row is not None and row.outcome != "installing" and _batches.get(row.host) is mine[row.host]:
                del _batches[row.host]
    return _install_report([r for r in rows if r is not None], time.monotonic() - started)


def _install_report(rows: list[BoxReport], elapsed_s: float) -> InstallReport:
    failed = [r for r in rows if r.outcome == "failed"]
    running = [r for r in rows if r.outcome == "installing"]
    state = "failed" if failed else "installing" if running else "ready"
    counts = [f"{n} {word}" for n, word in ((sum(r.outcome == "installed" for r in rows), "installed"),
                                            (sum(r.outcome == "already" for r in rows), "already installed"),
                                            (len(running), "still installing"), (len(failed), "FAILED")) if n]
    summary = f"{len(rows)} box(es) in {elapsed_s:.0f} s: {', '.join(counts)}"
    if failed:
        names = [r.host for r in failed]
        step = (f"fix each failed box as its row says, then `{shlex.join(['rgt', 'box', 'install', *names])}` "
                f"(MCP: box_install(hosts={json.dumps(names)}))")
    elif running:
        step = "call box_install again with the same hosts to see progress; the installs go on meanwhile"
    else:
        step = "call any tool with host=... (CLI: --host); for a multi-node run, preflight(hosts=[...]) next"
    return InstallReport(state=state, summary=summary, needed=runtime_version(), hosts=rows,
                         elapsed_s=round(elapsed_s, 2), next_step=step)


def _run_install(args: InstallInput, progress: Progress) -> InstallReport:
    for name in args.hosts or []:  # a host string never reaches ssh as an option; the error names its field
        parse_host(name, "hosts")
    hosts = [parse_host(name, "host") for name in args.targets()]
    return install_many(hosts, args.wheels, progress, args.wait_s, args.concurrency)


def _run_status(args: BoxInput, progress: Progress) -> BoxReport:
    return _status(parse_host(args.host))


def _run_remove(args: BoxInput, progress: Progress) -> BoxReport:
    host = parse_host(args.host)
    done = run(host, "sh -s", remove_script().encode(), timeout_s=120)
    removed = _lines(done.stdout.decode("utf-8", errors="replace"), "rgt-removed:")
    return BoxReport(host=host.given, box=resolve(host).identity, needed=runtime_version(), state="removed",
                     steps=[f"removed {v}" for v in removed], next_step=f"`rgt box install {host.given}` to add "
                     "it again", summary=f"{host.given}: removed {len(removed)} runtime version(s); runs and "
                     "guard records kept")


def render(report: BoxReport) -> str:
    lines = [report.summary]
    lines += [f"  - {step}" for step in report.steps]
    if report.installed and report.state != "ready":
        lines.append("installed: " + ", ".join(f"{v.version} ({v.state})" for v in report.installed))
    lines.append(f"next: {report.next_step}")
    return "\n".join(lines)


def render_install(report: InstallReport) -> str:
    """One box: as box_status shows it. Several: one table row per box, then each failure in full."""
    if len(report.hosts) == 1:
        return render(report.hosts[0])
    rows = [[r.host, "FAILED" if r.outcome == "failed" else r.outcome or r.state, r.python,
             f"{r.elapsed_s:.0f} s" if r.elapsed_s is not None else "-",
             r.error_kind or (r.steps[-1] if r.outcome == "installing" and r.steps else "-")] for r in report.hosts]
    lines = [f"box install: {report.summary}", "", format_table(["host", "outcome", "python", "time", "detail"], rows)]
    lines += ["", *(r.summary for r in report.hosts if r.outcome == "failed")] if report.state == "failed" else []
    lines.append(f"next: {report.next_step}")
    return "\n".join(lines)


SPECS = [
    ToolSpec(
        name="box_install", cli="box install", title="Install the runtime on one box or a fleet",
        description="Installs this checkout's runtime on ssh hosts once, so every tool can run there with "
        "host=...: a venv under ~/.cache/remote-gpu-trainer/<version>/ on each box (no root) that uses the box's "
        "own torch and CUDA, with this project's wheel sent over ssh and its small dependencies from the box's "
        "index (wheels=true sends them too, for boxes without one). hosts=[...] installs a whole fleet in one "
        "call, in parallel, with a row per box (installed, already installed, or failed with its cause and "
        "fix). Idempotent. Changes the boxes: ask the user first. Slow installs continue in the background; "
        "call again with the same hosts for progress.",
        input_model=InstallInput, output_model=InstallReport, run=_run_install, read_only=False, destructive=False,
        idempotent=True, open_world=True, render_text=render_install, cli_positional="hosts",
        # the CLI process is the only one that could ever report a background install: it waits for all boxes
        cli_fixed=(("wait_s", None),),
        exit_code=lambda r: 0 if r.state in ("ready", "installing") else 1),
    ToolSpec(
        name="box_status", cli="box status", title="Runtime versions on a box",
        description="Which runtime versions a box has, whether the one this checkout needs is ready, its python, "
        "and free space. Read-only.",
        input_model=BoxInput, output_model=BoxReport, run=_run_status, read_only=True, open_world=True,
        render_text=render, cli_positional="host", exit_code=lambda r: 0 if r.state == "ready" else 1),
    ToolSpec(
        name="box_remove", cli="box remove", title="Remove the runtime from a box",
        description="Deletes every runtime version under ~/.cache/remote-gpu-trainer/ on the box; never the runs/ "
        "or guard/ records there.",
        input_model=BoxInput, output_model=BoxReport, run=_run_remove, read_only=False, destructive=True,
        idempotent=True, open_world=True, render_text=render, cli_positional="host"),
]
