"""gpu_health speed against baselines measured in the same run. Prints medians and ratios.

On a GPU machine (NVML works and nvidia-smi is installed):
  * warm: the full probe in-process (NVML already open, as in a running MCP server) vs `nvidia-smi -q`
  * cold: `rgt health --json` as a fresh process (Python start + nvmlInit + probe) vs `nvidia-smi -q`
  Goal: the warm probe ≥ 5× faster than `nvidia-smi -q`.
Without a GPU (no driver):
  * the no-GPU answer of gpu_health vs skill_info, in-process and as fresh `rgt` processes
    (both open NVML the same way; the difference is the probe's own work).

    python bench/gpu_health.py [--runs 15] [--calls 200]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from remote_gpu_trainer.health.tool import SPECS as HEALTH_SPECS  # noqa: E402
from remote_gpu_trainer.info import SPECS as INFO_SPECS  # noqa: E402
from remote_gpu_trainer.nvml_session import nvml_status  # noqa: E402

HEALTH = HEALTH_SPECS[0]
INFO = INFO_SPECS[0]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(a: Callable[[], object], b: Callable[[], object], n: int) -> tuple[list[float], list[float]]:
    """Alternate the two, so load changes on the machine hit both series equally."""
    first, second = [], []
    for _ in range(n):
        first.append(timed(a))
        second.append(timed(b))
    return first, second


def run_quiet(argv: list[str]) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, check=False)


def line(label: str, a_name: str, a: list[float], b_name: str, b: list[float], goal: str = "") -> None:
    med_a, med_b = statistics.median(a), statistics.median(b)
    print(f"{label:<34} {a_name} {med_a * 1e3:9.2f} ms   {b_name} {med_b * 1e3:9.2f} ms   "
          f"ratio {med_b / med_a:6.2f}x{goal}  (n={len(a)})")


def gpu_bench(runs: int) -> None:
    smi = shutil.which("nvidia-smi")
    report = HEALTH.call({})
    print(f"device: {report.gpus_found} GPU(s): {', '.join(sorted({g.name or '?' for g in report.gpus}))}; "
          f"driver {report.driver_version}; verdict {report.verdict.value}")
    if not smi:
        print("nvidia-smi not installed: GPU baseline skipped")
        return
    probe = lambda: HEALTH.call({})  # noqa: E731
    smi_q = lambda: run_quiet([smi, "-q"])  # noqa: E731
    warm, smi_times = interleaved(probe, smi_q, runs)
    line("warm probe vs nvidia-smi -q", "gpu_health", warm, "nvidia-smi -q", smi_times, "  (goal >= 5x)")
    cli = [sys.executable, "-m", "remote_gpu_trainer", "health", "--json"]
    cold, smi_times = interleaved(lambda: run_quiet(cli), smi_q, max(3, runs // 3))
    line("cold rgt health vs nvidia-smi -q", "rgt health", cold, "nvidia-smi -q", smi_times)
    print("(ratio = nvidia-smi -q time / gpu_health time: how many times faster the probe is)")


def no_gpu_bench(runs: int, calls: int) -> None:
    status = nvml_status()
    print(f"no GPU here: {status.reason} ({status.detail[:80]}...)")
    health = lambda: HEALTH.call({})  # noqa: E731
    info = lambda: INFO.call({})  # noqa: E731
    health(), info()  # warm-up: imports, cached NVML status
    h, i = interleaved(health, info, calls)
    line("in-process, no-GPU answer", "skill_info", i, "gpu_health", h)
    base = [sys.executable, "-m", "remote_gpu_trainer"]
    h, i = interleaved(lambda: run_quiet([*base, "health"]), lambda: run_quiet([*base, "info"]), runs)
    line("fresh process, no-GPU answer", "rgt info", i, "rgt health", h)
    print("(ratio = gpu_health time / skill_info time: how much the no-GPU answer costs over the cheapest tool)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="subprocess repetitions per series")
    parser.add_argument("--calls", type=int, default=200, help="in-process repetitions per series (no-GPU mode)")
    ns = parser.parse_args()
    print(f"python {sys.version.split()[0]} on {sys.platform}; {time.strftime('%Y-%m-%d %H:%M:%S')}")
    if nvml_status().ok:
        gpu_bench(max(ns.runs, 3))
    else:
        no_gpu_bench(max(ns.runs, 3), max(ns.calls, 10))


if __name__ == "__main__":
    main()
