"""The run directory: one folder per run on the box, the only memory a run has.

A run must outlive the MCP server, the ssh connection and the agent, so everything about it lives
in files on the box, under ``<runs root>/<run_id>/``:

==================== ============ ==============================================================
file                 written by   holds
==================== ============ ==============================================================
meta.json            run_start,   argv, cwd, the environment added, name, notify argv, thresholds,
                     supervisor   boot id, git commit, GPUs; then pid, pgid and start time
supervisor.json      supervisor   its own pid and start ticks (how "the supervisor vanished" is told)
log                  the run      stdout and stderr of the training process
stall.json           supervisor   present while the run is stalled (since when, why, the file it follows)
members.json         supervisor   the run's processes seen so far (pid, start ticks): members.py
watch.json           supervisor   the progress files it follows (log, watch globs, files the run writes)
launcher.json        supervisor   the launcher exited while processes it started go on (its code, which)
stop.json            run_stop     who asked for the stop, before any signal is sent
exit.json            supervisor   at the end: exit code or signal, end time, state, OOM evidence
notifications.jsonl  supervisor   one line per notify command run
stacks.json          supervisor   every rank's stack and the verdict, taken once per stall (hang.py)
stacks/<pid>.txt     the run      each Python process's hook record and its stack dumps (stacks.py)
rank_hook/           supervisor   the sitecustomize.py put on the run's PYTHONPATH (rank_hook/)
flight_recorder/     the run      torch flight-recorder dumps, with run_start(flight_recorder=true)
==================== ============ ==============================================================

JSON files are written whole to a temporary file and renamed over the old one, so a reader never
sees half a file, even when the box loses power mid-write. ``notifications.jsonl`` is appended one
line per ``write`` (O_APPEND), which the kernel keeps whole for lines this short.

The runs root is ``$RGT_RUNS_DIR`` if set, else ``runs/`` in the package's cache directory
(``~/.cache/remote-gpu-trainer/runs``, moved by ``RGT_CACHE_DIR`` like the tool-list cache).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from ..paths import cache_dir

RUNS_ENV = "RGT_RUNS_DIR"
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
_RUN_ID = re.compile(RUN_ID_PATTERN)

META, SUPERVISOR, LOG, STALL, STOP, EXIT, NOTIFICATIONS, STACKS, LAUNCHER = (
    "meta.json", "supervisor.json", "log", "stall.json", "stop.json", "exit.json", "notifications.jsonl",
    "stacks.json", "launcher.json")


def runs_root() -> Path:
    if override := os.environ.get(RUNS_ENV):
        return Path(override).expanduser()
    return cache_dir() / "runs"


def new_run_id(name: str | None, now: float | None = None) -> str:
    """``20261122-031500-<name>-<4 hex>``: sorts by start time, readable, unique without a lock."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name or "").strip("-._")[:40]
    return "-".join(part for part in (stamp, slug, secrets.token_hex(2)) if part)


def valid_run_id(run_id: str) -> bool:
    """A plain folder name: no separators, no ``..``, so it can never point outside the runs root."""
    return bool(_RUN_ID.match(run_id)) and ".." not in run_id


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic: a temporary file in the same folder, flushed, then renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's object, or None when it is missing or unreadable (a run being set up)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_jsonl(path: Path, limit: int = 100) -> list[dict[str, Any]]:
    """The last ``limit`` records; a torn or foreign line is skipped, not fatal."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines[-limit:]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


class RunDir:
    """Paths and small readers for one run's folder."""

    def __init__(self, path: Path):
        self.path = path

    @property
    def run_id(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def log(self) -> Path:
        return self.path / LOG

    def meta(self) -> dict[str, Any]:
        return read_json(self.file(META)) or {}

    def read(self, name: str) -> dict[str, Any] | None:
        return read_json(self.file(name))

    def write(self, name: str, data: dict[str, Any]) -> None:
        write_json(self.file(name), data)

    def update_meta(self, **changes: Any) -> None:
        """Only the supervisor calls this after start, so read-modify-write needs no lock."""
        self.write(META, {**self.meta(), **changes})

    def notifications(self) -> list[dict[str, Any]]:
        return read_jsonl(self.file(NOTIFICATIONS))


def run_dir(run_id: str, root: Path | None = None) -> RunDir:
    """The folder of ``run_id``. Raises InputError for an id that is malformed or not on this box."""
    from ..errors import InputError

    if not valid_run_id(run_id):
        raise InputError("run_id", "not a run id (letters, digits, '.', '_' and '-', as run_start returned)")
    root = root or runs_root()
    path = root / run_id
    if not (path / META).is_file():
        recent = [r.run_id for r in list_runs(root)[:5]]
        raise InputError("run_id", f"no run {run_id!r} under {root}", allowed=recent or None)
    return RunDir(path)


def list_runs(root: Path | None = None) -> list[RunDir]:
    """Every run folder with a meta.json, newest first (ids start with their start time)."""
    root = root or runs_root()
    try:
        entries = [p for p in root.iterdir() if p.is_dir() and (p / META).is_file()]
    except OSError:
        return []
    return [RunDir(p) for p in sorted(entries, key=lambda p: p.name, reverse=True)]
