"""Where a run shows progress: its log, the files it was told to watch, and the files it writes.

Many training scripts print little to stdout and write their progress to a file of their own
(``runs/<name>/train.log``, a ``logging.FileHandler``, a launcher's ``> train.log``). Judging a stall by
the run's stdout alone would call such a run stalled while its real log grows. So the progress files of a run are:

* its own log (stdout and stderr, ``log`` in the run folder), for runs we started;
* the log paths given to run_adopt / run_status (``logs``);
* the ``watch`` paths or globs of run_start, relative to the run's cwd, looked up again every few seconds and at
  the run's end (a ``runs/*/train.log`` that appears later is found);
* every regular file a process of the run holds open for writing (``processes/openfiles.py``), remembered
  once seen (a log rotated or closed between writes stays followed).

Any change of size or modification time in any of them is progress. The file run_status *follows* (reads
progress from, names in a stall) is the one that changed last among those that are text logs: checkpoints and
data files count as progress but are never followed. The supervisor keeps the list in ``watch.json`` so that
every later reader sees the same files.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path
from typing import Any

from ..processes.openfiles import files_open_for_writing
from .ledger import RunDir, read_json

WATCH = "watch.json"
NOT_LOGS = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".pkl", ".pickle", ".npy", ".npz", ".h5", ".hdf5",
            ".tar", ".zip", ".gz", ".arrow", ".parquet", ".lock", ".db", ".sqlite", ".distcp", ".json.tmp")
"""Written by a run and counted as progress, but never followed for progress lines."""
MAX_FILES = 256
SCAN_EVERY_S = 2.0
"""How often the watch globs are looked up and the open files of every process of the run looked through (at
most; their sizes are read every poll). A ``**`` glob over a big tree is too costly for every poll."""


def is_log(path: str) -> bool:
    return not path.lower().endswith(NOT_LOGS)


def _stat(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_size, info.st_mtime_ns


class ProgressFiles:
    """The progress files of one run and their last change; ``poll`` says whether anything moved."""

    def __init__(self, run: RunDir, meta: dict[str, Any]):
        self.run = run
        self.cwd = Path(meta.get("cwd") or ".")
        self.globs = list(meta.get("watch") or [])
        self.sources: dict[str, str] = {}
        if not meta.get("adopted"):
            self.sources[str(run.log)] = "the run's stdout and stderr"
        for path in meta.get("logs") or []:
            self.sources[str(path)] = "given"
        self.changed_at: dict[str, float] = {}
        self.next_scan = 0.0
        self.scan_every = min(SCAN_EVERY_S, float(meta.get("stall_after_s") or 900) / 4)
        """A quarter of the stall threshold at most: a watched log that appears late is found before its silence
        could read as a stall."""

    def _discover(self, members: list[int], force: bool = False) -> bool:
        """New progress files from the globs and the processes' open files, on the scan throttle or when forced."""
        now = time.monotonic()
        if not force and now < self.next_scan:
            return False
        self.next_scan = now + self.scan_every
        before = len(self.sources)
        for pattern in self.globs:
            for match in sorted(glob.glob(str(self.cwd / pattern), recursive=True))[:MAX_FILES]:
                if os.path.isfile(match):
                    self.sources.setdefault(os.path.abspath(match), f"watch {pattern!r}")
        inside = str(self.run.path) + os.sep
        for pid in members:
            for path in files_open_for_writing(pid):
                if not path.startswith(inside) and len(self.sources) < MAX_FILES:
                    self.sources.setdefault(path, f"written by pid {pid}")
        return len(self.sources) != before

    def poll(self, members: list[int], force: bool = False) -> bool:
        """Look for new files and read every file's modification time; True when the set of files changed.
        ``force`` looks up the globs and the processes' open files now, whenever they were last looked up."""
        new_files = self._discover(members, force)
        for path in self.sources:
            state = _stat(path)
            if state is not None:
                self.changed_at[path] = state[1] / 1e9
        return new_files

    def last_change(self) -> float | None:
        """Unix time of the newest write to any progress file."""
        return max(self.changed_at.values(), default=None)

    def follows(self) -> str | None:
        return followed(self.changed_at)

    def record(self) -> dict[str, Any]:
        return {"files": [{"path": p, "source": s} for p, s in self.sources.items()], "follows": self.follows()}


def followed(changed_at: dict[str, float]) -> str | None:
    """The text log that changed last."""
    logs = [(at, path) for path, at in changed_at.items() if is_log(path)]
    return max(logs)[1] if logs else None


def recorded_files(run: RunDir) -> dict[str, str]:
    """path → why it is watched, from watch.json; the run's own log when there is none (runs before it)."""
    data = read_json(run.file(WATCH)) or {}
    files = {f["path"]: f.get("source", "") for f in data.get("files", []) if isinstance(f, dict) and f.get("path")}
    if not files and not run.meta().get("adopted"):
        files = {str(run.log): "the run's stdout and stderr"}
    return files


def last_changes(paths: list[str] | dict[str, str]) -> dict[str, float]:
    """path → modification time, for the paths that exist."""
    out = {}
    for path in paths:
        state = _stat(path)
        if state is not None:
            out[path] = state[1] / 1e9
    return out


def files_of_processes(pids: list[int]) -> dict[str, str]:
    """Regular files any of ``pids`` holds open for writing, path → which pid."""
    found: dict[str, str] = {}
    for pid in pids:
        for path in files_open_for_writing(pid):
            found.setdefault(path, f"written by pid {pid}")
    return found
