"""Our runs on this box, read from the run ledger: the one place this package depends on run lifecycle.

The ledger (run-lifecycle issue) keeps one folder per run under ``$RGT_RUNS_DIR`` or
``~/.cache/remote-gpu-trainer/runs/<run_id>/`` with ``meta.json`` (how it was started, its process
group), ``log`` and, once it ended, ``exit.json``. This module reads only that layout, so the idle
tools keep working whichever code wrote it; :func:`our_runs` is the single function to switch to the
run module's own reader once it settles.

States, as the idle verdict needs them:

* ``running``: no ``exit.json`` and a process of its group is alive, log written recently;
* ``stalled``: alive but the log has not changed for ``stall_s`` (a hung loop bills like a busy one);
* ``ended``: ``exit.json`` exists, or no process of the group is left (the run died without one).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

RunState = Literal["running", "stalled", "ended"]


def runs_dir() -> Path:
    """The run module's own root (``$RGT_RUNS_DIR``, else ``runs/`` in the cache dir), so both read one ledger."""
    from ..runs.ledger import runs_root

    return runs_root()


@dataclass(frozen=True)
class RunView:
    run_id: str
    state: RunState
    run_dir: Path
    pgid: int | None
    pids: frozenset[int]
    """Live processes of the run's process group (empty once it ended)."""
    ended_at: float | None
    """Unix time the run ended: exit.json's ``ended_at``, else the newest of exit.json and the log."""
    last_output_at: float | None
    """Modification time of the run's log: the last sign of progress."""
    output_dirs: tuple[str, ...]
    """Folders the run writes outputs to, as its meta.json names them (checkpoints, results)."""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def group_members(pgid: int) -> frozenset[int]:
    """Live, non-zombie pids whose process group is ``pgid`` (read from /proc, no signal sent)."""
    members = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            members.add(int(entry.name))
    return frozenset(members)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _output_dirs(meta: dict[str, Any]) -> tuple[str, ...]:
    for key in ("output_dirs", "outputs"):
        value = meta.get(key)
        if isinstance(value, list):
            return tuple(str(v) for v in value if isinstance(v, str) and v)
    return ()


def read_run(run_dir: Path, stall_s: float, now: float | None = None) -> RunView | None:
    """One run's view, or None when the folder holds no readable meta.json."""
    meta = _read_json(run_dir / "meta.json")
    if meta is None:
        return None
    now = time.time() if now is None else now
    pgid = _int(meta.get("pgid")) or _int(meta.get("pid"))
    log_at = _mtime(run_dir / "log")
    exit_path = run_dir / "exit.json"
    outputs = _output_dirs(meta)
    if exit_path.exists():
        record = _read_json(exit_path) or {}
        ended = record.get("ended_at")
        ended_at = float(ended) if isinstance(ended, (int, float)) else _mtime(exit_path)
        return RunView(run_dir.name, "ended", run_dir, pgid, frozenset(), ended_at, log_at, outputs)
    pids = group_members(pgid) if pgid else frozenset()
    if not pids:
        last = max((t for t in (log_at, _mtime(run_dir / "meta.json")) if t is not None), default=None)
        return RunView(run_dir.name, "ended", run_dir, pgid, pids, last, log_at, outputs)
    started = _mtime(run_dir / "meta.json")
    last_sign = log_at if log_at is not None else started
    stalled = last_sign is not None and now - last_sign >= stall_s
    return RunView(run_dir.name, "stalled" if stalled else "running", run_dir, pgid, pids, None, log_at, outputs)


def our_runs(stall_s: float = 1800.0, now: float | None = None) -> list[RunView]:
    """Every run in the ledger on this machine, oldest folder name first."""
    root = runs_dir()
    if not root.is_dir():
        return []
    views = (read_run(d, stall_s, now) for d in sorted(root.iterdir()) if d.is_dir())
    return [v for v in views if v is not None]


def find_run(run_id: str) -> Path | None:
    """The ledger folder of ``run_id`` (never a path outside the ledger)."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        return None
    path = runs_dir() / run_id
    return path if (path / "meta.json").is_file() else None
