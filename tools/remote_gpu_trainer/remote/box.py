"""``box_install`` / ``box_status`` / ``box_remove``: the runtime on a box, installed on request, without root.

Install = upload one tar (our wheel, plus dependency wheels with ``wheels=true``) → a fixed install
script builds ``~/.cache/remote-gpu-trainer/<version>/venv`` with ``--system-site-packages`` and pip-installs
the wheel (dependencies from the box's own index, or only from the uploaded wheels) → ``ready`` is written
last. Re-running is a no-op. MCP clients give up on a call after about a minute, so an install that has
not finished in ``wait_s`` keeps going in the background; a later call for the same host reports it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..models import StrictModel
from ..toolspec import Progress, ToolSpec
from .errors import RemoteError
from .hosts import Host, parse_host, resolve
from .runtime import install_script, remove_script, runtime_version, status_script, upload_command
from .ssh import run

MIN_FREE_BYTES = 64 * 2**20
"""The wheel and a venv with pip: about 25 MiB; more when --wheels sends dependencies."""
HOST_DESCRIPTION = "The box: an ssh alias from ~/.ssh/config or user@name[:port], as typed after `ssh`."


class BoxInput(StrictModel):
    host: str = Field(min_length=1, max_length=300, description=HOST_DESCRIPTION)


class InstallInput(BoxInput):
    wheels: bool = Field(False, description="The box cannot reach a package index: download the dependencies' "
                         "wheels here for the box's python and platform and send them with the runtime.")
    wait_s: float = Field(45, ge=0, le=3600, description="Wait this long for the install; past it, it goes on in "
                          "the background and a later box_install call for the host reports it.")


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
    error: str | None = None
    next_step: str
    summary: str


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


def _download_wheels(host: Host, into: Path, progress: Progress) -> list[Path]:
    version, platform = _box_python(host)
    progress(1, 5, f"downloading dependency wheels for python {version} {platform}")
    try:
        return download_wheels(version, platform, into)
    except RuntimeError as err:
        raise RemoteError(host.given, "install_failed", "could not download the dependency wheels here",
                          f"check this machine's package index access; pip said: {err}") from err


_FAIL_KINDS = {"no_python": "no_python", "venv": "install_failed", "pip": "install_failed",
               "import": "install_failed"}


def install(host: Host, wheels: bool = False, progress: Progress | None = None) -> BoxReport:
    """Install (or confirm) this checkout's runtime on ``host``. Raises RemoteError with the cause."""
    from .runtime import dist_tarball

    report = progress or (lambda *a, **k: None)
    version = runtime_version()
    steps: list[str] = []
    current = _status(host)
    if current.state == "ready":
        return current.model_copy(update={"summary": f"{host.given}: runtime {version} already installed"})
    if current.free_bytes is not None and current.free_bytes < MIN_FREE_BYTES:
        raise RemoteError(host.given, "disk_full", f"the box has {current.free_bytes / 2**20:.0f} MiB free in the "
                          f"home directory; the runtime needs about {MIN_FREE_BYTES // 2**20} MiB",
                          "free space in the home directory (`df -h ~` on the box), then run `rgt box install` "
                          "again")
    with tempfile.TemporaryDirectory() as tmp:
        extra = _download_wheels(host, Path(tmp), report) if wheels else []
        report(2, 5, "sending the runtime")
        sent = run(host, upload_command(version), dist_tarball(extra), timeout_s=600)
    if sent.returncode != 0:
        raise _install_failure(host, sent.stderr.decode("utf-8", errors="replace"))
    steps.append(f"sent {version} ({len(extra)} dependency wheels)" if wheels else f"sent {version}")
    report(3, 5, "building the venv and installing (pip on the box)")
    done = run(host, "sh -s", install_script(version, offline=wheels).encode(), timeout_s=900)
    out = done.stdout.decode("utf-8", errors="replace")
    steps += _lines(out, "rgt-step:")
    if done.returncode != 0:
        raise _install_failure(host, done.stderr.decode("utf-8", errors="replace"))
    report(5, 5, "ready")
    final = _status(host)
    return final.model_copy(update={"steps": steps, "summary": f"{host.given}: runtime {version} installed "
                                    f"(python {final.python})"})


def _install_failure(host: Host, stderr: str) -> RemoteError:
    kind_word = next(iter(_lines(stderr, "rgt-fail:")), "").split(" ")[0]
    tail = stderr.strip()[-1200:]
    if any(sign in stderr for sign in ("No space left on device", "Errno 28", "Wrote only")):  # tar: "Wrote only"
        return RemoteError(host.given, "disk_full", "the box ran out of disk space during the install",
                           "free space in the home directory (`df -h ~` on the box), then run `rgt box install` "
                           "again", detail=tail)
    if kind_word == "no_python":
        return RemoteError(host.given, "no_python", "the box has no python 3.11 or newer "
                           f"({stderr.split('no_python', 1)[1].strip()[:80] or 'python3 not found'})",
                           "install python 3.11+ on the box (e.g. `apt install python3.11 python3.11-venv`, or "
                           "conda/uv), then run `rgt box install` again", detail=tail)
    last = tail.splitlines()[-2] if len(tail.splitlines()) > 1 else tail
    return RemoteError(host.given, _FAIL_KINDS.get(kind_word, "install_failed"),  # type: ignore[arg-type]
                       f"the install failed at step {kind_word or 'upload'}: {last[:200]}",
                       "read the detail; with no package index on the box, use `rgt box install HOST --wheels`",
                       detail=tail)


# The background install of each host (a jobs.py id), so a later call reports the one already running.
_install_jobs: dict[str, str] = {}
_install_lock = threading.Lock()


def _install_in_background(host: Host, wheels: bool, progress: Progress, wait_s: float) -> BoxReport:
    """Install, waiting at most ``wait_s``; past that the install goes on and the next call reports it."""
    from .. import jobs

    with _install_lock:
        job_id = _install_jobs.get(host.given)  # running, or finished since the last call: report that one
        if job_id is None:
            job_id = jobs.start(lambda report: install(host, wheels, report), name=f"box install {host.given}")
            _install_jobs[host.given] = job_id
    deadline = time.monotonic() + wait_s
    status = jobs.poll(job_id)
    while not status.done and time.monotonic() < deadline:
        progress(status.progress, status.total, status.message)
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        status = jobs.poll(job_id)
    if not status.done:
        return BoxReport(host=host.given, needed=runtime_version(), state="installing", steps=[status.message],
                         next_step="call box_install again with the same host to see progress",
                         summary=f"{host.given}: install running ({status.message}, {status.elapsed_s:.0f} s)")
    with _install_lock:
        _install_jobs.pop(host.given, None)
    if status.exception is not None:
        raise status.exception
    return status.result


def _run_install(args: InstallInput, progress: Progress) -> BoxReport:
    return _install_in_background(parse_host(args.host), args.wheels, progress, args.wait_s)


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


SPECS = [
    ToolSpec(
        name="box_install", cli="box install", title="Install the runtime on a box",
        description="Installs this checkout's runtime on an ssh host once, so every tool can run there with "
        "host=...: a venv under ~/.cache/remote-gpu-trainer/<version>/ on the box (no root) that uses the box's "
        "own torch and CUDA, with this project's wheel sent over ssh and its small dependencies from the box's "
        "index (wheels=true sends them too, for boxes without one). Idempotent. Changes the box: ask the user "
        "first. Slow installs continue in the background; call again for progress.",
        input_model=InstallInput, output_model=BoxReport, run=_run_install, read_only=False, destructive=False,
        idempotent=True, open_world=True, render_text=render, cli_positional="host",
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
