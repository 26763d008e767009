"""Custody before teardown: which files on this box exist nowhere else.

A file is *in custody elsewhere* once ``run_pull`` copied it off and the sha256 computed on the box
matched the one computed on the user's machine. The pull then records, on the box, each verified
file's size, sha256 and modification time (``$RGT_CUSTODY_DIR`` or
``~/.cache/remote-gpu-trainer/custody/verified.json``). Everything the box can answer by itself —
``box_idle`` and the guard, which never see the user's machine — rests on that record:

* a file with no record was never copied: **unsynced**;
* a file whose size or mtime changed since its verified copy (a checkpoint overwritten in place):
  **unsynced**, the copy is stale;
* otherwise synced. Files are not re-hashed on every check: size and nanosecond mtime catch a
  rewrite without reading a 50 GB checkpoint.

Hashes are always computed on the box (``hash_roots``), never by copying files back to hash them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

CUSTODY_ENV = "RGT_CUSTODY_DIR"
MAX_FILES = 200_000
"""Walk at most this many files per check: a dataset folder named by mistake must not hang the tool."""
CHUNK = 1 << 20


def custody_file() -> Path:
    override = os.environ.get(CUSTODY_ENV)
    base = Path(override) if override else Path.home() / ".cache" / "remote-gpu-trainer" / "custody"
    return base / "verified.json"


@dataclass(frozen=True)
class FileHash:
    path: str
    size: int
    sha256: str
    mtime_ns: int


@dataclass(frozen=True)
class Unsynced:
    path: str
    size: int
    reason: str


def walk_files(roots: Iterable[str | Path], limit: int = MAX_FILES) -> Iterator[Path]:
    """Regular files under each root (a root may be a file), symlinks not followed, sorted per folder."""
    count = 0
    for root in roots:
        root = Path(root)
        if root.is_symlink():
            continue
        if root.is_file():
            candidates: Iterable[Path] = [root]
        elif root.is_dir():
            candidates = (Path(d, f) for d, dirs, files in os.walk(root) if not dirs.sort()
                          for f in sorted(files))
        else:
            continue
        for path in candidates:
            if path.is_symlink() or not path.is_file():
                continue
            count += 1
            if count > limit:
                return
            yield path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_file(path: Path) -> FileHash:
    """Size, sha256 and mtime of one file; the stat is taken before and after so a file written
    during hashing is reported with the later state (its hash is then stale and will not match)."""
    before = path.stat()
    digest = sha256_file(path)
    after = path.stat()
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        digest = "changed-while-hashing"
    return FileHash(str(path), after.st_size, digest, after.st_mtime_ns)


def hash_roots(roots: Iterable[str | Path]) -> list[FileHash]:
    return [hash_file(p) for p in walk_files(roots)]


def load_records() -> dict[str, dict]:
    try:
        data = json.loads(custody_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(records: dict[str, dict]) -> None:
    path = custody_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def mark_verified(entries: Iterable[FileHash], dest: str) -> tuple[list[str], list[str]]:
    """Record files whose copy at ``dest`` was verified. A file that changed since it was hashed is not
    recorded (its copy is already stale). Returns (recorded, refused) paths."""
    records = load_records()
    recorded, refused = [], []
    for entry in entries:
        try:
            st = Path(entry.path).stat()
        except OSError:
            refused.append(entry.path)
            continue
        if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns) or len(entry.sha256) != 64:
            refused.append(entry.path)
            continue
        records[entry.path] = {"size": entry.size, "sha256": entry.sha256, "mtime_ns": entry.mtime_ns,
                               "dest": dest, "verified_at": time.time()}
        recorded.append(entry.path)
    _save(records)
    return recorded, refused


def unsynced(roots: Iterable[str | Path], dest: str | None = None) -> tuple[list[Unsynced], int]:
    """(files under ``roots`` with no verified copy, number of files checked). With ``dest``, only a
    copy verified into that local destination counts."""
    records = load_records()
    missing: list[Unsynced] = []
    checked = 0
    for path in walk_files(roots):
        checked += 1
        try:
            st = path.stat()
        except OSError:
            continue
        record = records.get(str(path))
        if record is None or (dest is not None and record.get("dest") != dest):
            missing.append(Unsynced(str(path), st.st_size, "never copied off this box (no verified pull)"))
        elif (record.get("size"), record.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
            missing.append(Unsynced(str(path), st.st_size, "changed since its verified copy"))
    return missing, checked
