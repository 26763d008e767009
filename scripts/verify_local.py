#!/usr/bin/env python3
"""verify_local.py — load and verify every artifact before anyone stops or destroys the box (MON-05).

A log line saying "saved" is a claim; this is the evidence. For each file (directories are walked):

* ``.pt .pth .ckpt .bin`` (torch.save): ``torch.load(..., map_location="cpu", weights_only=True)`` when
  torch is importable — the safe loader, which refuses arbitrary pickled objects; it also reports the
  step found in the checkpoint. Without torch (or with ``--no-torch``), the zip container torch
  writes is checked for truncation and CRC errors with the standard library.
* ``.safetensors``: the header parses and every tensor lies inside the file.
* ``.json``: parses. ``.jsonl``: every line parses (a truncated last line fails), the last record's
  step is reported.
* ``exit_code``: must be 0.
* checkpoint directories (``checkpoint*``, ``ckpt*``, ``step_*``, ``global_step*``): with
  ``--require-marker NAME`` they must hold that completion marker (SPOT-06); a torch.distributed
  checkpoint (``.metadata``) has its metadata read and every file it references must exist.
* ``--manifest FILE``: sha256sum-format lines, checked against the files (e.g. the MANIFEST.sha256
  that aggregate_to_fs.sh writes at the destination).
* ``--expect-step N``: the newest checkpoint (and each metrics .jsonl with a step) must reach N.

Exit status: 0 everything verified (WARN lines are advice) · 1 something failed · 2 bad usage ·
3 nothing verifiable was found (no files, or only unrecognised ones).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NOTHING = 0, 1, 2, 3
TORCH_SUFFIXES = {".pt", ".pth", ".ckpt", ".bin"}
CKPT_DIR_PREFIXES = ("checkpoint", "ckpt", "step_", "global_step")
STEP_KEYS = ("step", "global_step", "iteration", "iter", "num_updates")


@dataclass
class Finding:
    verdict: str  # PASS, WARN, FAIL, SKIP
    path: str
    what: str
    step: int | None = None


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)

    def add(self, verdict: str, path: Path | str, what: str, step: int | None = None) -> None:
        self.findings.append(Finding(verdict, str(path), what, step))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="verify_local.py", description="Load and verify run artifacts (checkpoints, safetensors, JSON/JSONL "
        "metrics, exit_code, sha256 manifests) before teardown.",
        epilog="Exit status: 0 verified, 1 a check failed, 2 bad usage, 3 nothing verifiable found.")
    parser.add_argument("paths", nargs="*", type=Path, help="files or directories (default: none; see --manifest)")
    parser.add_argument("--manifest", type=Path, help="sha256sum-format file; paths are relative to its directory")
    parser.add_argument("--write-manifest", type=Path, help="write sha256 lines of every verified file here")
    parser.add_argument("--expect-step", type=int, help="the newest checkpoint's step (and metrics' last step) "
                        "must be at least this")
    parser.add_argument("--require-marker", metavar="NAME", help="checkpoint directories must contain this file "
                        "(e.g. COMPLETE)")
    parser.add_argument("--no-torch", action="store_true", help="never import torch; check torch files' zip "
                        "container only")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    if not args.paths and not args.manifest:
        parser.error("give at least one PATH or --manifest")
    for path in [*args.paths, *([args.manifest] if args.manifest else [])]:
        if not path.exists():
            parser.error(f"{path} does not exist")
    if args.expect_step is not None and args.expect_step < 0:
        parser.error("--expect-step must be >= 0")
    return args


# ------------------------------------------------------------------------------------------ checks


def step_of(obj: object) -> int | None:
    """A step counter at the top level of a checkpoint dict (or one level down, e.g. trainer_state)."""
    if not isinstance(obj, dict):
        return None
    for key in STEP_KEYS:
        value = obj.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
            return int(value.item())
    for value in obj.values():
        if isinstance(value, dict):
            for key in STEP_KEYS:
                if isinstance(value.get(key), int):
                    return value[key]
    return None


def load_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def looks_like_torch(path: Path) -> bool:
    """torch.save output: a zip archive (since 1.6) or a raw pickle (legacy, first byte 0x80)."""
    if zipfile.is_zipfile(path):
        return True
    with path.open("rb") as handle:
        return handle.read(1) == b"\x80"


def check_torch_file(path: Path, report: Report, torch) -> None:
    if path.suffix == ".bin" and not looks_like_torch(path):
        report.add("SKIP", path, "not a torch.save file (another .bin format): not checked")
        return
    if torch is not None:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            text = str(err).splitlines()[0][:200]
            if "Weights only load failed" in str(err) or "weights_only" in str(err):
                report.add("WARN", path, "loads only with weights_only=False (pickled objects inside): not loaded; "
                           "load it yourself only if you trust its origin")
                check_zip(path, report, after_torch=True)
            else:
                report.add("FAIL", path, f"torch.load failed: {type(err).__name__}: {text}")
            return
        keys = list(obj)[:6] if isinstance(obj, dict) else [type(obj).__name__]
        step = step_of(obj)
        at_step = f"; step {step}" if step is not None else ""
        report.add("PASS", path, f"torch.load ok (weights_only=True); keys {keys}{at_step}", step)
        return
    check_zip(path, report)


def check_zip(path: Path, report: Report, after_torch: bool = False) -> None:
    """torch.save writes a zip archive: a truncated save fails here ('failed finding central directory')."""
    if not zipfile.is_zipfile(path):
        with path.open("rb") as handle:
            head = handle.read(4)
        if head == b"PK\x03\x04":
            report.add("FAIL", path, "zip archive without its central directory: truncated save")
        elif head[:1] == b"\x80":
            report.add("WARN", path, "legacy (pre-1.6) torch pickle: not verifiable without torch")
        else:
            report.add("FAIL", path, "neither a torch zip archive nor a torch pickle")
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        report.add("FAIL", path, f"archive unreadable: {err}")
        return
    if bad is not None:
        report.add("FAIL", path, f"CRC error in member {bad}")
    elif not after_torch:
        report.add("PASS", path, "torch zip archive intact (torch not used: contents not loaded)")


def check_safetensors(path: Path, report: Report) -> None:
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            (n,) = struct.unpack("<Q", handle.read(8))
            if n > size - 8:
                raise ValueError(f"header length {n} exceeds the file ({size} bytes)")
            header = json.loads(handle.read(n))
        data = size - 8 - n
        count = 0
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, end = meta["data_offsets"]
            if not 0 <= start <= end <= data:
                raise ValueError(f"tensor {name} [{start}, {end}) lies outside the {data} data bytes")
            count += 1
    except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as err:
        report.add("FAIL", path, f"safetensors invalid: {err}")
        return
    report.add("PASS", path, f"safetensors header ok, {count} tensors")


def check_json(path: Path, report: Report) -> None:
    try:
        json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        report.add("FAIL", path, f"JSON does not parse: {err}")
        return
    report.add("PASS", path, "JSON parses")


def check_jsonl(path: Path, report: Report) -> None:
    last = None
    lines = path.read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            last = json.loads(line)
        except ValueError as err:
            where = "last line (truncated write?)" if number == len(lines) else f"line {number}"
            report.add("FAIL", path, f"{where} does not parse: {err}")
            return
    step = step_of(last)
    report.add("PASS", path, f"{len(lines)} JSON lines" + (f"; last step {step}" if step is not None else ""), step)


def check_exit_code(path: Path, report: Report) -> None:
    text = path.read_text().strip()
    if text == "0":
        report.add("PASS", path, "exit code 0")
    else:
        report.add("FAIL", path, f"exit code {text!r}: the run did not finish cleanly (MON-06)")


def check_dcp(folder: Path, report: Report, torch) -> None:
    """A torch.distributed.checkpoint directory: metadata readable and every referenced file present."""
    if torch is None:
        report.add("WARN", folder, "torch.distributed.checkpoint metadata not read (torch unavailable)")
        return
    try:
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as err:
        report.add("FAIL", folder, f"DCP metadata unreadable: {type(err).__name__}: {str(err)[:200]}")
        return
    files = {info.relative_path for info in (metadata.storage_data or {}).values()}
    missing = sorted(f for f in files if not (folder / f).exists())
    if missing:
        report.add("FAIL", folder, f"DCP checkpoint misses {len(missing)} file(s): {missing[:3]}")
    else:
        report.add("PASS", folder, f"DCP metadata ok, {len(metadata.state_dict_metadata)} entries, {len(files)} files")


def is_ckpt_dir(path: Path) -> bool:
    return path.is_dir() and path.name.startswith(CKPT_DIR_PREFIXES) and not path.name.endswith(".tmp")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_manifest(manifest: Path, report: Report) -> None:
    base = manifest.parent
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        expected, _, name = line.partition("  ")
        target = base / name.lstrip("*")
        if not target.is_file():
            report.add("FAIL", target, "listed in the manifest but missing")
        elif sha256(target) != expected.strip():
            report.add("FAIL", target, "sha256 differs from the manifest")
        else:
            report.add("PASS", target, "sha256 matches the manifest")


# ------------------------------------------------------------------------------------------- main


def collect(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(files, directories worth a directory-level check), in a stable order."""
    files: list[Path] = []
    folders: list[Path] = []
    for root in paths:
        if root.is_file():
            files.append(root)
            continue
        for path in sorted(root.rglob("*")):
            if path.is_file() and ".cache" not in path.parts and path.name != "MANIFEST.sha256":
                files.append(path)
            elif is_ckpt_dir(path) or (path.is_dir() and (path / ".metadata").is_file()):
                folders.append(path)
        if is_ckpt_dir(root) or (root / ".metadata").is_file():
            folders.append(root)
    return files, folders


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    report = Report()
    files, folders = collect(args.paths)
    needs_torch = any(f.suffix in TORCH_SUFFIXES for f in files) or any((d / ".metadata").is_file() for d in folders)
    torch = load_torch() if needs_torch and not args.no_torch else None
    checked: list[Path] = []
    for folder in folders:
        if args.require_marker and is_ckpt_dir(folder) and not (folder / args.require_marker).is_file():
            report.add("FAIL", folder, f"no {args.require_marker} marker: incomplete or interrupted save (SPOT-06)")
        if (folder / ".metadata").is_file():
            check_dcp(folder, report, torch)
    for path in files:
        before = len(report.findings)
        if path.name == "exit_code":
            check_exit_code(path, report)
        elif path.suffix in TORCH_SUFFIXES:
            check_torch_file(path, report, torch)
        elif path.suffix == ".safetensors":
            check_safetensors(path, report)
        elif path.suffix == ".json":
            check_json(path, report)
        elif path.suffix == ".jsonl":
            check_jsonl(path, report)
        if len(report.findings) > before and report.findings[-1].verdict in ("PASS", "WARN"):
            checked.append(path)
    if args.manifest:
        check_manifest(args.manifest, report)
    if args.expect_step is not None:
        ckpt_steps = [f.step for f in report.findings if f.step is not None and not f.path.endswith(".jsonl")]
        if not ckpt_steps:
            report.add("FAIL", "-", f"--expect-step {args.expect_step}: no checkpoint with a step counter was found")
        elif max(ckpt_steps) < args.expect_step:
            report.add("FAIL", "-", f"newest checkpoint is at step {max(ckpt_steps)}, expected {args.expect_step}")
        else:
            report.add("PASS", "-", f"newest checkpoint reaches step {max(ckpt_steps)} (>= {args.expect_step})")
        for finding in [f for f in report.findings if f.step is not None and f.path.endswith(".jsonl")]:
            if finding.step < args.expect_step:
                report.add("FAIL", finding.path, f"metrics stop at step {finding.step}, expected {args.expect_step}")
    if args.write_manifest and checked:
        base = args.write_manifest.parent.resolve()
        lines = []
        for path in checked:
            resolved = path.resolve()
            name = resolved.relative_to(base) if resolved.is_relative_to(base) else resolved
            lines.append(f"{sha256(path)}  {name}")
        args.write_manifest.write_text("\n".join(lines) + "\n")

    verdicts = [f.verdict for f in report.findings]
    status = EXIT_FAIL if "FAIL" in verdicts else EXIT_OK if {"PASS", "WARN"} & set(verdicts) else EXIT_NOTHING
    if args.json:
        print(json.dumps({"exit_status": status, "torch": torch is not None,
                          "findings": [f.__dict__ for f in report.findings]}, indent=2))
        return status
    for f in report.findings:
        print(f"{f.verdict:5} {f.path}: {f.what}")
    counts = {v: verdicts.count(v) for v in ("PASS", "WARN", "FAIL", "SKIP")}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    loader = "torch.load(weights_only=True)" if torch is not None else "standard library only"
    print(f"{'VERIFIED' if status == EXIT_OK else 'FAILED' if status == EXIT_FAIL else 'NOTHING VERIFIED'}: "
          f"{summary} ({loader})")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
