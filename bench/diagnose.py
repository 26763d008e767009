"""diagnose_error: latency on 10 KB and 1 MB logs, and hit rates on the labelled test logs, one run.

Latency inputs are realistic training output (``[rankN]:`` prefixes, timestamps, tqdm redraws with
``\\r``, NCCL INFO lines) ending in the 8-GPU OOM cascade from tests/fixtures/logs. Reported: the
first call (parses the catalog), the median of warm calls, and, for the 1 MB input, the same scan
done naively (every signature regex on every line) so the prefilter's gain is a same-run ratio.

Hit rates: tests/fixtures/logs/cases.json routed against the real catalog (top-1 / top-3 file) and
against the fixture catalog (top-1 / top-3 entry), and every real entry's own Symptom (top-1 / top-3).

    python bench/diagnose.py [--runs 15] [--root SKILL_ROOT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from remote_gpu_trainer import catalog as cat  # noqa: E402
from remote_gpu_trainer.diagnose import ScanStats, _Text, diagnose, scan_signatures  # noqa: E402

LOGS = ROOT / "tests" / "fixtures" / "logs"
FIXTURE = ROOT / "tests" / "fixtures" / "skill"


def read_log(name: str) -> str:
    return (LOGS / name).read_bytes().decode("utf-8")


def training_log(size: int) -> str:
    """About ``size`` characters of ordinary multi-rank training output, then a real crash."""
    crash = read_log("oom_rank3_cascade.log")
    parts, total, step = [], 0, 0
    while total < size - len(crash):
        step += 1
        rank = step % 8
        if step % 50 == 0:
            bar = "\r".join(f"[rank0]: Epoch 2: {p:3d}%|{'█' * (p // 10):<10}| {p * 31}/3100 [12:0{p % 10}<41:12, "
                            f"1.42it/s, loss=1.{9000 - p:04d}]" for p in range(step % 97, step % 97 + 5))
            line = bar
        elif step % 37 == 0:
            line = (f"gpu-node-1:3412:3590 [{rank}] NCCL INFO Channel 0{rank % 4}/24 : {rank} -> {(rank + 1) % 8} "
                    "via P2P/IPC")
        else:
            line = (f"[rank{rank}]: 2024-11-05 14:{step // 600 % 60:02d}:{step % 60:02d},{step % 1000:03d} INFO "
                    f"step={step} loss={2.31 - step * 1e-5:.5f} lr=2.0e-05 grad_norm=1.{step % 97:02d} "
                    f"tokens/s=4{step % 10}873 mem_alloc=61.{step % 10}GiB")
        parts.append(line)
        total += len(line) + 1
    return "\n".join(parts) + "\n" + crash


def naive_scan(catalog: cat.Catalog, text: _Text) -> int:
    """Every signature on every line, or on the whole text when it may span lines: the baseline."""
    hits = 0
    joined = "\n".join(text.lines)
    for e in catalog.entries:
        for sig in e.signatures:
            if sig.spans_lines:
                hits += sum(1 for _ in sig.regex.finditer(joined))
            else:
                hits += sum(1 for line in text.lines if sig.regex.search(line))
    return hits


def timed(fn, runs: int) -> tuple[float, float, float]:
    """(first call wall, median warm wall, median warm CPU) in seconds. CPU time is printed too
    because wall time on a shared 2-core box also measures everybody else's load."""
    first = 0.0
    wall, cpu = [], []
    for i in range(runs + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if i == 0:
            first = elapsed
        else:
            wall.append(elapsed)
            cpu.append(elapsed_cpu)
    return first, statistics.median(wall), statistics.median(cpu)


def rate(hits: list[int], k: int) -> str:
    n = sum(1 for h in hits if 0 <= h < k)
    return f"{n}/{len(hits)} ({100 * n / max(1, len(hits)):.0f}%)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--root", type=Path, default=None, help="skill root (default: this checkout)")
    args = parser.parse_args()
    root = (args.root or ROOT).resolve()

    cat._cached.clear()
    start = time.perf_counter()
    catalog = cat.load_catalog(root)
    parse_ms = 1000 * (time.perf_counter() - start)
    sigs = sum(len(e.signatures) for e in catalog.entries)
    print(f"catalog: {len(catalog.entries)} entries, {sigs} signatures, {len(catalog.files)} files; "
          f"parse {parse_ms:.1f} ms")

    print("\nlatency (the first call parses the catalog and builds the lexical index; then the median "
          f"of {args.runs} warm calls)")
    for label, size in (("10 KB", 10_000), ("1 MB", 1_000_000)):
        text = training_log(size)
        cat._cached.clear()
        first, warm, warm_cpu = timed(lambda text=text: diagnose(text, 5, root), args.runs)
        top = diagnose(text, 5, root).matches
        print(f"  {label:>5}: {len(text):>9,} chars  first {1000 * first:6.1f} ms  warm {1000 * warm:6.1f} ms "
              f"(CPU {1000 * warm_cpu:6.1f} ms)  top: {top[0].id + ' (' + top[0].evidence + ')' if top else '-'}")
    text = _Text(training_log(1_000_000))
    stats = ScanStats()
    _, fast, _ = timed(lambda: scan_signatures(catalog, text, stats), 5)
    _, naive, _ = timed(lambda: naive_scan(catalog, text), 3)
    print(f"  1 MB signature scan: prefiltered {1000 * fast:.1f} ms vs naive {1000 * naive:.1f} ms "
          f"({naive / fast:.0f}x); regex calls per scan {stats.regex_calls // 6:,} vs "
          f"{sigs * len(text.lines):,} naive")

    cases = json.loads((LOGS / "cases.json").read_text())["cases"]
    print(f"\nhit rates on {len(cases)} labelled logs (tests/fixtures/logs)")
    file_hits, fixture_hits = [], []
    for case in cases:
        text = read_log(case["log"])
        files = [m.file for m in diagnose(text, 3, root).matches]
        file_hits.append(next((i for i, f in enumerate(files) if f in case["files"]), -1))
        ids = [m.id for m in diagnose(text, 3, FIXTURE).matches]
        fixture_hits.append(ids.index(case["fixture"]["top"][0]) if case["fixture"]["top"][0] in ids else -1)
        if file_hits[-1] != 0:
            print(f"  miss (real catalog): {case['log']}: expected {case['files']}, top 3 {files}")
    print(f"  real catalog, right file: top-1 {rate(file_hits, 1)}, top-3 {rate(file_hits, 3)}")
    print(f"  fixture catalog, right entry: top-1 {rate(fixture_hits, 1)}, top-3 {rate(fixture_hits, 3)}")

    own = []
    for e in catalog.entries:
        if e.signatures:
            ids = [m.id for m in diagnose(e.symptom_plain, 3, root).matches]
            own.append(ids.index(e.id) if e.id in ids else -1)
    print(f"  real entries' own Symptom -> own entry: top-1 {rate(own, 1)}, top-3 {rate(own, 3)}")


if __name__ == "__main__":
    main()
