"""Will tonight's checkpoints fit? A checkpoint folder's outlook for the hours ahead.

A run that dies at 3 a.m. with ``No space left on device`` (GOT-01), or whose checkpoints sat on a tmpfs that a
stop wiped, loses the night. Everything here is read on the box, in milliseconds, no torch needed:

* **What one save costs**: the newest checkpoint in the folder, a file (``step_1000.pt``) or a folder
  (``checkpoint-1000/``, counted with its files), its bytes and its inodes.
* **How many saves before the horizon** (``horizon_s``, a night by default, or the run's ETA if sooner): from
  the save interval in steps (given, or the difference of the two newest checkpoints' step numbers) and the
  step rate (the log's ``it/s``, or the two newest checkpoints' steps over their times); else from the time
  between the two newest saves. Retention (``keep_last``, e.g. HF's ``save_total_limit``) caps what piles up;
  without it every save is assumed kept, the worst case, and the summary says so.
* **The folder's filesystem** (``/proc/self/mountinfo``, the longest mount point above it): free bytes and
  inodes (``statvfs``), and its type: ``tmpfs``/``ramfs`` live in RAM and are lost on a stop or reboot;
  ``overlay`` is a container's own disk. The provider's profile (``profiles/``, through providers.py; detected
  from the box's documented environment) says where checkpoints outlive a stop (``durable_dir``).
* **The newest checkpoint's integrity** from its headers, without loading it: a torch ``.pt``/``.bin`` zip
  archive must have its central directory (a save cut short has none: CKPT-01's "failed finding central
  directory"), a ``.safetensors`` file's JSON header must account for exactly the bytes that follow it.
  A real ``torch.load`` runs only when asked (``load_test``), in a child process of the run's own python (the
  training environment), with ``weights_only=True`` and a timeout.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from ..models import StrictModel, Verdict
from .progress import Progress

NIGHT_S = 8 * 3600.0
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pkl", ".distcp", ".tar")
RAM_FILESYSTEMS = ("tmpfs", "ramfs")
MAX_FILES_CHECKED = 64
MAX_SAVES_READ = 3
LOAD_TEST_TIMEOUT_S = 300.0
_STEP = re.compile(r"(?:step|global_step|checkpoint|ckpt|iter)[-_=]?(\d+)", re.I)
_NUMBER = re.compile(r"(\d+)")


class CheckpointOutlook(StrictModel):
    verdict: Verdict = Field(description="FAIL: the saves ahead will not fit (bytes or inodes) or the newest "
                             "checkpoint is damaged; WARN: lost on a stop or outside the provider's volume; UNKNOWN: "
                             "no checkpoint to size yet")
    summary: str
    folder: str
    filesystem: str | None = Field(None, description="tmpfs, overlay, ext4, ...")
    mount_point: str | None = None
    lost_on_stop: bool | None = Field(None, description="True: RAM-backed (tmpfs) or the provider's stop wipes it")
    free_bytes: int | None = None
    free_inodes: int | None = None
    checkpoints_found: int = Field(0, description="Saves read: the newest few (their size, interval, rate)")
    newest: str | None = None
    newest_bytes: int | None = None
    files_per_checkpoint: int | None = Field(None, description="Inodes one save takes (a folder counts itself)")
    save_every_steps: int | None = None
    save_every_s: float | None = None
    steps_per_s: float | None = None
    next_save_in_s: float | None = None
    horizon_s: float
    saves_ahead: int | None = None
    needed_bytes: int | None = None
    needed_inodes: int | None = None
    integrity: str = Field("", description="ok: … / what is wrong with the newest checkpoint's files")
    load_test: str | None = Field(None, description="torch.load under the run's python, only when asked")
    findings: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Saved:
    path: Path
    step: int | None
    mtime: float
    size: int
    files: list[Path]

    @property
    def inodes(self) -> int:
        return len(self.files) + (1 if self.path.is_dir() else 0)


def _is_checkpoint_file(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(CHECKPOINT_SUFFIXES)


def _step_of(name: str) -> int | None:
    match = _STEP.search(name) or (None if not _NUMBER.search(name) else list(_NUMBER.finditer(name))[-1])
    return int(match.group(1)) if match else None


def saved_checkpoints(folder: Path, deep: int = MAX_SAVES_READ) -> list[Saved]:
    """The newest ``deep`` saves in ``folder`` (a checkpoint file, or a folder holding some), oldest first. Only
    those are walked file by file: a folder of a hundred HF checkpoints costs three walks, not a hundred."""
    try:
        entries = sorted(folder.iterdir(), key=_mtime, reverse=True)
    except OSError:
        return []
    found = []
    for entry in entries:
        if len(found) >= deep:
            break
        try:
            if _is_checkpoint_file(entry):
                info = entry.stat()
                found.append(Saved(entry, _step_of(entry.name), info.st_mtime, info.st_size, [entry]))
            elif entry.is_dir():
                files = [p for p in entry.rglob("*") if p.is_file()]
                if files and (any(_is_checkpoint_file(p) for p in files) or _step_of(entry.name) is not None):
                    size = sum(p.stat().st_size for p in files)
                    mtime = max(p.stat().st_mtime for p in files)
                    found.append(Saved(entry, _step_of(entry.name), mtime, size, files))
        except OSError:
            continue
    return sorted(found, key=lambda s: (s.step if s.step is not None else -1, s.mtime))


def count_checkpoints(folder: Path) -> int:
    """How many saves ``folder`` holds, by their names alone (one directory listing, no walk): a checkpoint file,
    or a folder whose name carries a step (HF's ``checkpoint-500``). Retention (keep_last) needs them all, while
    saved_checkpoints reads only the newest few."""
    try:
        with os.scandir(folder) as entries:
            return sum(1 for e in entries
                       if (_step_of(e.name) is not None if e.is_dir() else _is_checkpoint_file(Path(e.path))))
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: Path, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str] | None:
    """(mount point, filesystem type) of the mount holding ``path``; the last of stacked mounts wins."""
    real = os.path.realpath(path)
    best: tuple[str, str] | None = None
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, tail[0])
    return best


def _durable(provider: str | None) -> tuple[str, str, str] | None:
    """(provider name, durable dir, what the profile says of it) for this box's provider, when it names a path."""
    from ..idle.detect import box_environment, detect
    from ..providers import load_profiles, resolve_provider

    try:
        profiles = load_profiles()
        profile = resolve_provider(provider, profiles) if provider else profiles.get(
            detect(profiles, box_environment()).provider or "")
    except Exception:  # a broken profile must not break the outlook
        return None
    if profile is None:
        return None
    durable = profile.front.script_overrides.durable_dir
    if not durable.startswith("/") or "$" in durable:
        return None
    return profile.front.name, durable, profile.front.storage.durable_path.value


# ------------------------------------------------------------------ integrity


def check_zip(path: Path) -> str:
    """A torch zip archive's central directory and its records' extents (no data read)."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except zipfile.BadZipFile as err:
        with open(path, "rb") as handle:
            head = handle.read(2)
        if head == b"\x80\x02":
            return f"ok: {path.name} is torch's legacy (non-zip) format, not checkable without loading"
        return f"{path.name}: no readable zip central directory ({err}): truncated or not fully written (CKPT-01)"
    beyond = [i.filename for i in infos if i.header_offset + i.compress_size > size]
    if beyond:
        return f"{path.name}: record {beyond[0]} runs past the end of the file ({size} bytes): truncated"
    return f"ok: {path.name} zip archive, {len(infos)} records"


def check_safetensors(path: Path) -> str:
    """The header's tensor offsets must end exactly where the file does."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) < 8:
            return f"{path.name}: {size} bytes, shorter than a safetensors header"
        length = struct.unpack("<Q", raw)[0]
        if length > min(size - 8, 100 << 20):
            return f"{path.name}: header length {length} does not fit in {size} bytes: truncated or not safetensors"
        try:
            header = json.loads(handle.read(length))
        except ValueError as err:
            return f"{path.name}: header is not JSON ({err})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    expected = max(ends, default=0)
    have = size - 8 - length
    if have != expected:
        return (f"{path.name}: header says {expected} bytes of tensors, the file holds {have}: "
                f"{'truncated' if have < expected else 'trailing bytes'}")
    return f"ok: {path.name} safetensors, {len(ends)} tensors"


def integrity_of(saved: Saved) -> str:
    results = []
    for path in saved.files[:MAX_FILES_CHECKED]:
        name = path.name.lower()
        try:
            if name.endswith(".safetensors"):
                results.append(check_safetensors(path))
            elif name.endswith((".pt", ".pth", ".bin", ".ckpt", ".tar")):
                results.append(check_zip(path))
        except OSError as err:
            results.append(f"{path.name}: unreadable ({err.strerror or err})")
    bad = [r for r in results if not r.startswith("ok")]
    if bad:
        return "; ".join(bad[:3])
    if not results:
        return "ok: no file with a checkable header"
    return results[0] if len(results) == 1 else f"ok: {len(results)} files' headers are complete"


LOAD_SCRIPT = """import sys, torch
obj = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
print(type(obj).__name__, len(obj) if hasattr(obj, "__len__") else "")
"""


def try_load(saved: Saved, python: str) -> str:
    """``torch.load(weights_only=True)`` of the newest checkpoint's first torch file, under ``python``."""
    target = next((p for p in saved.files if p.name.lower().endswith((".pt", ".pth", ".bin", ".ckpt"))), None)
    if target is None:
        return "not run: no torch checkpoint file in the newest save (safetensors are checked by header)"
    try:
        done = subprocess.run([python, "-c", LOAD_SCRIPT, str(target)], capture_output=True, text=True,
                              timeout=LOAD_TEST_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"not run under {python}: {err}"
    if done.returncode == 0:
        return f"loaded {target.name} with torch.load(weights_only=True) under {python}: {done.stdout.strip()}"
    last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return f"FAILED to load {target.name} under {python}: {last}"


# ------------------------------------------------------------------ the outlook


def _rate(progress: Progress | None, saves: list[Saved]) -> float | None:
    if progress and progress.throughput and progress.throughput_unit in ("it/s", "steps/s"):
        return float(progress.throughput)
    stepped = [s for s in saves if s.step is not None]
    if len(stepped) >= 2 and stepped[-1].mtime > stepped[-2].mtime and stepped[-1].step > stepped[-2].step:
        return (stepped[-1].step - stepped[-2].step) / (stepped[-1].mtime - stepped[-2].mtime)  # type: ignore[operator]
    return None


def _interval(saves: list[Saved]) -> int | None:
    steps = sorted({s.step for s in saves if s.step is not None})
    return steps[-1] - steps[-2] if len(steps) >= 2 and steps[-1] > steps[-2] else None


def checkpoint_outlook(folder: Path, *, progress: Progress | None, horizon_s: float = NIGHT_S,
                       save_every_steps: int | None = None, keep_last: int | None = None,
                       provider: str | None = None, python: str | None = None, load_test: bool = False,
                       now: float | None = None) -> CheckpointOutlook:
    """The folder's outlook; see the module docstring. ``load_test`` runs torch.load under ``python``."""
    now = time.time() if now is None else now
    folder = Path(folder).expanduser()
    out = CheckpointOutlook(verdict=Verdict.UNKNOWN, summary="", folder=str(folder), horizon_s=horizon_s)
    if not folder.is_dir():
        out.summary = f"{folder} does not exist (yet): nothing to size"
        return out
    findings: list[str] = []
    verdicts: list[Verdict] = []
    mounted = mount_of(folder)
    if mounted:
        out.mount_point, out.filesystem = mounted
    if out.filesystem in RAM_FILESYSTEMS:
        out.lost_on_stop = True
        findings.append(f"{folder} is on {out.filesystem} (RAM) at {out.mount_point}: lost on a stop or reboot")
        verdicts.append(Verdict.WARN)
    elif out.filesystem == "overlay":
        findings.append(f"{folder} is on the container's own disk (overlay): lost when the container is recreated")
    durable = _durable(provider)
    real = os.path.realpath(folder)
    if durable and not (real == durable[1] or real.startswith(durable[1].rstrip("/") + "/")):
        findings.append(f"{durable[0]}: checkpoints outlive a stop only under {durable[1]} ({durable[2]}); "
                        f"{folder} is not there")
        verdicts.append(Verdict.WARN)
    stats = os.statvfs(folder)
    out.free_bytes, out.free_inodes = stats.f_bavail * stats.f_frsize, stats.f_favail if stats.f_files else None
    saves = saved_checkpoints(folder)
    out.checkpoints_found = len(saves)  # the newest few: enough for a size, an interval and a rate
    if not saves:
        out.verdict = Verdict.UNKNOWN if not verdicts else max(verdicts, key=_order)
        out.findings = findings
        out.summary = (f"no checkpoint in {folder} yet: size unknown; {_gib(out.free_bytes)} free on "
                       f"{out.filesystem or 'an unknown filesystem'}") + ("; " + findings[0] if findings else "")
        return out
    newest = max(saves, key=lambda s: s.mtime)
    out.newest, out.newest_bytes, out.files_per_checkpoint = str(newest.path), newest.size, newest.inodes
    out.integrity = integrity_of(newest)
    if not out.integrity.startswith("ok"):
        findings.append(f"newest checkpoint damaged: {out.integrity}")
        verdicts.append(Verdict.FAIL)
    if load_test:
        out.load_test = (try_load(newest, python) if python else
                         "not run: no python known for this run (none of its processes was seen)")
        if out.load_test.startswith("FAILED"):
            verdicts.append(Verdict.FAIL)
            findings.append(out.load_test)
    out.save_every_steps = save_every_steps or _interval(saves)
    rate = _rate(progress, saves)
    out.steps_per_s = round(rate, 4) if rate else None
    times = sorted(s.mtime for s in saves)
    out.save_every_s = (out.save_every_steps / rate if out.save_every_steps and rate else
                        times[-1] - times[-2] if len(times) >= 2 and times[-1] > times[-2] else None)
    horizon = horizon_s
    if progress and progress.eta_s is not None:
        horizon = min(horizon, progress.eta_s)
    step = progress.step if progress else None
    if out.save_every_steps and rate and step is not None:
        every = out.save_every_steps
        out.next_save_in_s = round(((step // every + 1) * every - step) / rate, 3)
        last_step = step + rate * horizon
        if progress and progress.total:
            last_step = min(last_step, progress.total)
        out.saves_ahead = max(0, int(last_step // every) - int(step // every))
    elif out.save_every_s:
        out.next_save_in_s = max(0.0, newest.mtime + out.save_every_s - now)
        out.saves_ahead = 0 if out.next_save_in_s > horizon else 1 + int((horizon - out.next_save_in_s)
                                                                         // out.save_every_s)
    kept = "" if keep_last is None else f", {keep_last} kept"
    if out.saves_ahead is not None:
        # with keep_last, the folder grows only until it holds keep_last + 1 (a save lands before the oldest goes)
        held = max(len(saves), count_checkpoints(folder)) if keep_last is not None else 0
        piling = out.saves_ahead if keep_last is None else min(out.saves_ahead, max(1, keep_last + 1 - held))
        out.needed_bytes, out.needed_inodes = piling * newest.size, piling * newest.inodes
        short_bytes = out.needed_bytes > (out.free_bytes or 0)
        short_inodes = out.free_inodes is not None and out.needed_inodes > out.free_inodes
        if short_bytes or short_inodes:
            what = []
            if short_bytes:
                what.append(f"{_gib(out.needed_bytes)} needed, {_gib(out.free_bytes)} free")
            if short_inodes:
                what.append(f"{out.needed_inodes} inodes needed, {out.free_inodes} free")
            fits = max(0, min((out.free_bytes or 0) // max(1, newest.size),
                              (out.free_inodes if out.free_inodes is not None else 1 << 62) // max(1, newest.inodes)))
            findings.insert(0, f"will not fit: {out.saves_ahead} save(s) of {_gib(newest.size)} "
                               f"({newest.inodes} inode(s) each) before {_hours(horizon)}{kept}: {'; '.join(what)}; "
                               f"only {fits} more fit")
            verdicts.append(Verdict.FAIL)
        else:
            findings.insert(0, f"fits: {out.saves_ahead} save(s) of {_gib(newest.size)} before {_hours(horizon)}"
                               f"{kept or ' (all kept)'} need {_gib(out.needed_bytes)} of {_gib(out.free_bytes)} free")
            verdicts.append(Verdict.PASS)
        if out.next_save_in_s is not None:
            findings[0] += f"; next save in {out.next_save_in_s:.0f} s"
    else:
        findings.append("save interval or step rate unknown: give save_every_steps, or wait for two checkpoints")
        verdicts.append(Verdict.UNKNOWN)
    out.findings = findings
    out.verdict = max(verdicts, key=_order) if verdicts else Verdict.UNKNOWN
    where = f"{out.filesystem} at {out.mount_point}" if out.filesystem else "its filesystem"
    out.summary = f"{findings[0]} ({where})" + (f"; {findings[1]}" if len(findings) > 1 else "")
    return out



def _order(verdict: Verdict) -> int:
    return {Verdict.PASS: 0, Verdict.UNKNOWN: 1, Verdict.WARN: 2, Verdict.FAIL: 3}.get(verdict, 0)


def _gib(value: int | None) -> str:
    if value is None:
        return "?"
    return f"{value / (1 << 30):.2f} GiB" if value >= 1 << 30 else f"{value / (1 << 20):.1f} MiB"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h ahead" if seconds >= 3600 else f"{seconds / 60:.0f} min ahead"
