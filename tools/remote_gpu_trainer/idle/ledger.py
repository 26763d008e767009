"""Our runs on this box, read from the run ledger, as the idle verdict and the guard need them.

The ledger (runs/ledger.py) keeps one folder per run under ``$RGT_RUNS_DIR`` or
``~/.cache/remote-gpu-trainer/runs/<run_id>/``. This module reads it through the run module's own readers, so
the idle tools and run_status agree on what a run is: its processes are ``runs/members.py``'s (the session, the
group, what the supervisor recorded, their descendants: a detached job counts), its progress is the newest
change among ``runs/watch.py``'s files (its log, watch globs, files it writes), and a stall is the supervisor's
own verdict (``stall.json``) or, for a run without one, no progress for ``stall_s``.

States, as the idle verdict needs them:

* ``running``: no ``exit.json`` and a process of the run is alive, its progress files moved recently;
* ``stalled``: alive but the supervisor declared it stalled, or nothing moved for ``stall_s`` (a hung loop bills
  like a busy one);
* ``ended``: ``exit.json`` exists, or no process of the run is left (the run died without one).

Adopted runs (run_adopt) are runs like any other here: that is how the guard covers a job started by hand.
"""

from __future__ import annotations

import json
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
    """Live processes of the run (empty once it ended)."""
    ended_at: float | None
    """Unix time the run ended: exit.json's ``ended_at``, else the newest of exit.json and the log."""
    last_output_at: float | None
    """Newest modification time of its progress files: the last sign of progress."""
    output_dirs: tuple[str, ...]
    """Folders the run writes outputs to, as its meta.json names them (outputs, its checkpoint folder)."""
    follows: str | None = None
    """The text log that changed last (progress is read from it)."""
    meta: dict[str, Any] | None = None


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


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _output_dirs(meta: dict[str, Any]) -> tuple[str, ...]:
    found: list[str] = []
    for key in ("output_dirs", "outputs"):
        value = meta.get(key)
        if isinstance(value, list):
            found += [str(v) for v in value if isinstance(v, str) and v]
    if isinstance(meta.get("checkpoint_dir"), str):
        found.append(meta["checkpoint_dir"])
    return tuple(dict.fromkeys(found))


def read_run(run_dir: Path, stall_s: float, now: float | None = None) -> RunView | None:
    """One run's view, or None when the folder holds no readable meta.json."""
    from ..runs.ledger import STALL, RunDir
    from ..runs.members import live_members
    from ..runs.watch import followed, last_changes, recorded_files

    meta = _read_json(run_dir / "meta.json")
    if meta is None:
        return None
    now = time.time() if now is None else now
    run = RunDir(run_dir)
    pgid = _int(meta.get("pgid")) or _int(meta.get("pid"))
    changes = last_changes(recorded_files(run))
    log_at = max(changes.values(), default=None)
    follows = followed(changes)
    exit_path = run_dir / "exit.json"
    outputs = _output_dirs(meta)
    common = dict(run_id=run_dir.name, run_dir=run_dir, pgid=pgid, last_output_at=log_at, output_dirs=outputs,
                  follows=follows, meta=meta)
    if exit_path.exists():
        record = _read_json(exit_path) or {}
        ended = record.get("ended_at")
        ended_at = float(ended) if isinstance(ended, (int, float)) else _mtime(exit_path)
        return RunView(state="ended", pids=frozenset(), ended_at=ended_at, **common)
    pids = frozenset(live_members(run, meta))
    if not pids:
        last = max((t for t in (log_at, _mtime(run_dir / "meta.json")) if t is not None), default=None)
        return RunView(state="ended", pids=pids, ended_at=last, **common)
    started = _mtime(run_dir / "meta.json")
    last_sign = max((t for t in (log_at, started) if t is not None), default=None)
    stalled = (run_dir / STALL).exists() or (last_sign is not None and now - last_sign >= stall_s)
    return RunView(state="stalled" if stalled else "running", pids=pids, ended_at=None, **common)


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
