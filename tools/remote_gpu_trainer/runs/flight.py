"""torch's flight recorder for a run: switched on by ``run_start(flight_recorder=true)``, read on a hang.

What the installed torch (2.13) offers, as run on CPU/gloo here:

* ``TORCH_FR_BUFFER_SIZE`` (falling back to ``TORCH_NCCL_TRACE_BUFFER_SIZE``) turns the recorder on
  for every backend: gloo records each collective with its sequence number (``collective_seq_id``),
  op (``gloo:all_reduce``), input/output sizes and dtypes, and per process group
  ``last_enqueued_collective`` / ``last_completed_collective``. gloo leaves ``state`` at
  ``scheduled`` and the start/completion times at 0; NCCL fills them.
* Getting a dump out is the catch. ``torch._C._distributed_c10d._dump_fr_trace_json()`` returns one
  at once; the pickle variant (``_dump_fr_trace``) took 2.5–2.8 s while symbolising C++ stacks. On a
  gloo collective timeout torch writes no dump (``TORCH_FR_DUMP_TEMP_FILE`` stays unused), and the
  rank only raises. Only NCCL's watchdog dumps by itself on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``,
  to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``/``TORCH_FR_DUMP_TEMP_FILE`` + rank, a pickle): that path
  needs a GPU to check. So the rank hook (``rank_hook/sitecustomize.py``) dumps JSON itself: when the
  supervisor touches ``request`` (a stall) and at interpreter exit (the exception of a timeout).
* torch's analyzer (``python -m torch.distributed.flight_recorder.fr_trace DIR``) refuses a set with
  a rank missing (``AssertionError: Missing dump files from ranks {2}``), which is exactly the hang
  case, and on complete gloo dumps fails with ``KeyError: ('0', 3)`` in ``build_collectives``
  (``-j`` with ``KeyError: ('0', 0)``). So :func:`analyze` compares the entries itself: per process
  group and sequence number, op, sizes and dtypes across ranks; and which ranks never entered the
  newest collective the others entered.

A dump is data written by the run's own processes into its 0700 folder; NCCL's pickles are still
read with an unpickler that refuses every class (they hold only dicts, lists, strings and numbers).
"""

from __future__ import annotations

import io
import json
import pickle
import re
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from ..models import StrictModel

FOLDER = "flight_recorder"
BUFFER_ENTRIES = "2000"
REQUEST = "request"
NCCL_PREFIX = "nccl_trace_rank_"
_OUR_DUMP = re.compile(r"^rank(\d+)-(stall|exit)\.json$")


def recorder_env(run_path: Path, env: dict[str, str]) -> dict[str, str]:
    """Variables that switch the recorder on and point every dump into the run folder; the user's own
    settings in ``env`` win."""
    folder = run_path / FOLDER
    folder.mkdir(exist_ok=True)
    prefix = str(folder / NCCL_PREFIX)
    wanted = {"TORCH_FR_BUFFER_SIZE": BUFFER_ENTRIES, "TORCH_NCCL_TRACE_BUFFER_SIZE": BUFFER_ENTRIES,
              "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": prefix,
              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix, "RGT_FR_DIR": str(folder)}
    return {k: v for k, v in wanted.items() if k not in env}


def request_dumps(folder: Path) -> float:
    """Ask every rank's hook for a dump now; returns the request time (dumps newer than it answer it)."""
    folder.mkdir(exist_ok=True)
    path = folder / REQUEST
    path.write_text(f"{time.time()}\n")
    return path.stat().st_mtime


def wait_dumps(folder: Path, since: float, ranks: int, timeout_s: float = 2.0) -> None:
    """Until ``ranks`` stall dumps newer than ``since`` exist (the hook checks twice a second), or timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fresh = [p for p in folder.glob("rank*-stall.json") if p.stat().st_mtime >= since]
        if len(fresh) >= ranks:
            return
        time.sleep(0.05)


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name} in a flight-recorder dump")


def _load(path: Path) -> dict | None:
    try:
        data = path.read_bytes()
        dump = json.loads(data) if path.suffix == ".json" else _NoClasses(io.BytesIO(data)).load()
    except Exception:  # a half-written or foreign file is skipped, never fatal
        return None
    return dump if isinstance(dump, dict) else None


def read_dumps(folder: Path) -> dict[int, tuple[Path, dict]]:
    """The newest dump per rank: our JSON (stall or exit) or NCCL's own pickle."""
    best: dict[int, tuple[float, Path]] = {}
    try:
        paths = list(folder.iterdir())
    except OSError:
        return {}
    for path in paths:
        mine = _OUR_DUMP.match(path.name)
        rank = int(mine.group(1)) if mine else int(path.name[len(NCCL_PREFIX):]) if (
            path.name.startswith(NCCL_PREFIX) and path.name[len(NCCL_PREFIX):].isdigit()) else None
        if rank is None:
            continue
        stamp = path.stat().st_mtime
        if rank not in best or stamp > best[rank][0]:
            best[rank] = (stamp, path)
    loaded = {}
    for rank, (_stamp, path) in best.items():
        if (dump := _load(path)) is not None:
            loaded[rank] = (path, dump)
    return loaded


# ------------------------------------------------------------------ analysis


class RankRecord(StrictModel):
    rank: int
    file: str
    entries: int
    last_enqueued: int | None = Field(None, description="Sequence number of the newest collective this rank issued")
    last_completed: int | None = None


class Mismatch(StrictModel):
    process_group: str
    seq: int = Field(description="collective_seq_id")
    aspect: str = Field(description="op, sizes or dtypes")
    by_value: dict[str, list[int]] = Field(description="Each value seen and the ranks that had it")


class NeverEntered(StrictModel):
    process_group: str
    seq: int
    op: str
    sizes: str
    entered: list[int]
    missing: list[int] = Field(description="Ranks of the group that never issued this collective")


class FlightReport(StrictModel):
    summary: str
    ranks: list[RankRecord] = Field(default_factory=list)
    mismatches: list[Mismatch] = Field(default_factory=list)
    never_entered: list[NeverEntered] = Field(default_factory=list)
    no_dump: list[int] = Field(default_factory=list, description="Ranks of the group with no dump")
    notes: list[str] = Field(default_factory=list)


def _op(entry: dict) -> str:
    return str(entry.get("profiling_name", "?")).split(":", 1)[-1]


def _ranks_text(ranks: list[int]) -> str:
    from .hang import rank_ranges

    return rank_ranges(ranks)


def _group_ranks(dumps: dict[int, dict]) -> list[int]:
    for dump in dumps.values():
        for config in (dump.get("pg_config") or {}).values():
            try:
                ranks = config["ranks"]
                ranks = json.loads(ranks) if isinstance(ranks, str) else ranks
            except (ValueError, KeyError, TypeError):
                continue
            if ranks:
                return sorted(int(r) for r in ranks)
    return sorted(dumps)


def analyze(dumps: dict[int, tuple[Path, dict]], expected_ranks: list[int] | None = None) -> FlightReport | None:
    """Mismatched collectives and ranks that never entered one, per process group. None: no dumps."""
    if not dumps:
        return None
    plain = {rank: dump for rank, (_path, dump) in dumps.items()}
    records, mismatches, never, notes = [], [], [], []
    by_pg: dict[str, dict[int, dict[int, dict]]] = {}
    for rank, dump in sorted(plain.items()):
        status = dump.get("pg_status") or {}
        main = status.get("0") or next(iter(status.values()), {})
        records.append(RankRecord(rank=rank, file=str(dumps[rank][0]), entries=len(dump.get("entries") or []),
                                  last_enqueued=_maybe_int(main.get("last_enqueued_collective")),
                                  last_completed=_maybe_int(main.get("last_completed_collective"))))
        for entry in dump.get("entries") or []:
            if entry.get("is_p2p"):
                continue
            group = entry.get("process_group") or [str(entry.get("pg_id", "0"))]
            pg = str(group[0])
            by_pg.setdefault(pg, {}).setdefault(rank, {})[int(entry.get("collective_seq_id", -1))] = entry
    group_ranks = sorted(set(expected_ranks or []) | set(_group_ranks(plain)))
    no_dump = [r for r in group_ranks if r not in plain]
    for pg, per_rank in sorted(by_pg.items()):
        seqs = sorted({s for entries in per_rank.values() for s in entries if s >= 0})
        for seq in seqs:
            present = {r: e[seq] for r, e in per_rank.items() if seq in e}
            for aspect, value in (("op", _op), ("sizes", lambda e: json.dumps(e.get("input_sizes"))),
                                  ("dtypes", lambda e: json.dumps(e.get("input_dtypes")))):
                values: dict[str, list[int]] = {}
                for rank, entry in sorted(present.items()):
                    values.setdefault(value(entry), []).append(rank)
                if len(values) > 1:
                    mismatches.append(Mismatch(process_group=pg, seq=seq, aspect=aspect, by_value=values))
                    break
        newest = max(seqs) if seqs else None
        if newest is not None:
            entered = sorted(r for r, e in per_rank.items() if newest in e)
            missing = [r for r in group_ranks if r not in entered and r in plain]
            if missing:
                entry = per_rank[entered[0]][newest]
                never.append(NeverEntered(process_group=pg, seq=newest, op=_op(entry),
                                          sizes=json.dumps(entry.get("input_sizes")), entered=entered,
                                          missing=missing))
    if any(not (d.get("entries")) for d in plain.values()):
        notes.append("a dump holds no entries: the recorder was off (TORCH_FR_BUFFER_SIZE unset) in that rank")
    return FlightReport(summary=_summary(mismatches, never, no_dump), ranks=records, mismatches=mismatches[:10],
                        never_entered=never, no_dump=no_dump, notes=notes)


def _maybe_int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _summary(mismatches: list[Mismatch], never: list[NeverEntered], no_dump: list[int]) -> str:
    parts = []
    if mismatches:
        first = mismatches[0]
        sides = sorted(first.by_value.items(), key=lambda kv: len(kv[1]))
        odd = "; ".join(f"{_ranks_text(ranks)} {value}" for value, ranks in sides)
        parts.append(f"collective #{first.seq} differs in {first.aspect}: {odd}")
    for item in never[:2]:
        what = item.op if item.sizes in ("[]", "null") else f"{item.op} {item.sizes}"
        parts.append(f"{_ranks_text(item.missing)} never entered collective #{item.seq} ({what}) "
                     f"that {_ranks_text(item.entered)} entered")
    if no_dump:
        parts.append(f"no dump from {_ranks_text(no_dump)} (it died or was stopped before writing one)")
    return "; ".join(parts) if parts else "every rank issued the same collectives (op, sizes, dtypes) in order"


def flight_report(run_path: Path, expected_ranks: list[int] | None = None) -> FlightReport | None:
    folder = run_path / FOLDER
    return analyze(read_dumps(folder), expected_ranks) if folder.is_dir() else None

