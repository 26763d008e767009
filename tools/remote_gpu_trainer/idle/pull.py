"""``run_pull``: copy a run's outputs off the box with rsync, then prove the copy by sha256.

Runs on the user's machine. The hashes of the box's files are computed on the box (the internal
``custody_hashes`` tool, over the same SSH set-up), the local ones here; a copy counts only when
both agree. Why each rsync flag:

* ``--partial`` keeps a half-transferred file when the connection drops, and ``--append-verify``
  continues it on the next pull instead of starting again (a 40 GB checkpoint over a slow link),
  then checks the whole file's checksum and re-sends it if the kept part was wrong;
* a same-size corrupted local copy is skipped by rsync's size+mtime quick check and by
  ``--append`` alike, which is why the sha256 comparison exists: any mismatch triggers one repair
  pass with ``--checksum`` (full-content comparison), then the hashes are compared again.

Verified files are then recorded on the box (internal ``custody_mark``), which is what lets
``box_idle`` and the idle guard know, on the box alone, that nothing is left there uncopied.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .custody import FileHash, sha256_file

RSYNC_TIMEOUT_S = 6 * 3600.0


@dataclass(frozen=True)
class Mismatch:
    path: str
    """The file on the box."""
    local: str
    kind: str
    """``missing`` locally, ``size`` differs, or ``sha256`` differs."""
    detail: str


@dataclass
class CopyOutcome:
    rsync_exit: int | None
    rsync_tail: str
    first_pass: list[Mismatch] = field(default_factory=list)
    """Mismatches after the resumable copy, before the repair pass."""
    mismatches: list[Mismatch] = field(default_factory=list)
    """What is still wrong at the end: empty means every file is verified."""
    verified: list[FileHash] = field(default_factory=list)
    literal_bytes: int | None = None
    """Bytes rsync actually sent (its ``Literal data``); far below the total when a copy resumed."""


def local_path(box_file: str, roots: Sequence[str], dest: Path) -> Path:
    """Where rsync puts ``box_file``: ``dest/<root's name>/<path below the root>`` (longest root wins)."""
    for root in sorted((r.rstrip("/") for r in roots), key=len, reverse=True):
        if box_file == root:
            return dest / Path(root).name
        if box_file.startswith(root + "/"):
            return dest / Path(root).name / box_file[len(root) + 1 :]
    raise ValueError(f"{box_file} is under none of {list(roots)}")


def rsync_argv(roots: Sequence[str], dest: Path, rsh: str | None = None, prefix: str | None = None,
               repair: bool = False) -> list[str]:
    """The rsync command line (argv, no shell). Remote paths are ``prefix:path``; rsync >= 3.2.4
    passes them to the box without letting its shell split them."""
    argv = ["rsync", "-a", "--partial", "--stats", "--checksum" if repair else "--append-verify"]
    if rsh:
        argv += ["-e", rsh]
    sources = [f"{prefix}:{r.rstrip('/')}" if prefix else r.rstrip("/") for r in roots]
    return [*argv, "--", *sources, f"{dest}/"]


def _literal(stats: str) -> int | None:
    for line in stats.splitlines():
        if line.startswith("Literal data:"):
            digits = "".join(ch for ch in line.split(":", 1)[1].split("bytes")[0] if ch.isdigit())
            return int(digits) if digits else None
    return None


def _rsync(argv: list[str]) -> tuple[int | None, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RSYNC_TIMEOUT_S, check=False,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return None, "rsync is not installed on this machine"
    except subprocess.TimeoutExpired:
        return None, f"rsync ran longer than {RSYNC_TIMEOUT_S:.0f} s"
    return done.returncode, (done.stdout + done.stderr)[-4000:]


def compare(box_files: Sequence[FileHash], roots: Sequence[str], dest: Path) -> tuple[list[Mismatch], list[FileHash]]:
    """(mismatches, verified) between the box's hashes and the local copies under ``dest``."""
    mismatches, verified = [], []
    for item in box_files:
        local = local_path(item.path, roots, dest)
        if not local.is_file():
            mismatches.append(Mismatch(item.path, str(local), "missing", "no local copy"))
            continue
        size = local.stat().st_size
        if size != item.size:
            mismatches.append(Mismatch(item.path, str(local), "size", f"box {item.size} bytes, local {size} bytes"))
            continue
        digest = sha256_file(local)
        if digest != item.sha256:
            mismatches.append(Mismatch(item.path, str(local), "sha256",
                                       f"box {item.sha256[:16]}…, local {digest[:16]}…"))
            continue
        verified.append(item)
    return mismatches, verified


def copy_and_verify(roots: Sequence[str], box_files: Sequence[FileHash], dest: Path, rsh: str | None = None,
                    prefix: str | None = None) -> CopyOutcome:
    """Resumable copy of ``roots`` into ``dest``, sha256 check, one repair pass if needed, check again."""
    dest.mkdir(parents=True, exist_ok=True)
    code, tail = _rsync(rsync_argv(roots, dest, rsh, prefix))
    outcome = CopyOutcome(code, tail, literal_bytes=_literal(tail))
    first, verified = compare(box_files, roots, dest)
    outcome.first_pass = first
    if first and code is not None:
        code, tail = _rsync(rsync_argv(roots, dest, rsh, prefix, repair=True))
        outcome.rsync_exit, outcome.rsync_tail = code, tail
        first_literal = outcome.literal_bytes or 0
        outcome.literal_bytes = first_literal + (_literal(tail) or 0)
        outcome.mismatches, verified = compare(box_files, roots, dest)
    outcome.verified = verified
    return outcome
