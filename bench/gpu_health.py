"""gpu_health speed against `nvidia-smi -q` in the same run, with where the time goes. Prints medians and ratios.

Which NVML it measures:
  * a real GPU when NVML works here;
  * otherwise the C-level fake libnvidia-ml.so.1 of the tests (tests/nvml_fake, built with gcc against
    NVIDIA's nvml.h; ``--fake SCENARIO``, default healthy-8xh100) through the real pynvml and the real
    worker process. Its calls cost nothing, so this shows our own overhead; `nvidia-smi -q` is then
    absent and no ratio is printed.

  * warm: the full probe in this process (the NVML worker already running, as in an MCP server) vs
    `nvidia-smi -q`; broken down into the NVML reads (one request per GPU to the worker), the kernel log
    (read on a thread while the GPUs are read) and the judging/classification.
  * cold: `rgt health --json` as a fresh process vs `nvidia-smi -q`; broken down by an instrumented
    fresh process: interpreter, imports, parser, the wait for the NVML worker (started first, so its
    Python start, `import pynvml` and nvmlInit overlap the imports), the probe, the JSON.
  Goals on a GPU: warm >= 10x faster than `nvidia-smi -q`; cold no slower than `nvidia-smi -q`.
  Fresh processes run with bytecode caching on (a private PYTHONPYCACHEPREFIX), as an installed package does.
Without a GPU it also times the no-driver answer against skill_info (in-process and fresh processes).

    python bench/gpu_health.py [--runs 9] [--fake SCENARIO] [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(a: Callable[[], object], b: Callable[[], object] | None, n: int) -> tuple[list[float], list[float]]:
    """Alternate the two, so load changes on the machine hit both series equally."""
    first, second = [], []
    for _ in range(n):
        first.append(timed(a))
        if b is not None:
            second.append(timed(b))
    return first, second


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms"


def fresh_env() -> dict[str, str]:
    """Fresh processes as on a user's machine: bytecode cached (here in a private prefix)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "rgt-bench-pycache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tools"), os.environ.get("PYTHONPATH")]))
    return env


def run_quiet(argv: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, check=False, env=env)


def ratio_line(label: str, ours: list[float], smi: list[float], goal: str) -> None:
    med = statistics.median(ours)
    if smi:
        base = statistics.median(smi)
        print(f"{label:<30} {ms(med)}   nvidia-smi -q {ms(base)}   ratio {base / med:6.2f}x  ({goal}; n={len(ours)})")
    else:
        print(f"{label:<30} {ms(med)}   nvidia-smi -q: absent, no ratio  ({goal}; n={len(ours)})")


# --- the instrumented cold start (runs in a fresh process) ------------------------------------------------


COLD_CHILD = """
import time
started = time.monotonic()
import json, os, sys
t0 = time.perf_counter()
from remote_gpu_trainer.nvml_session import session

session().start()
t_spawn = time.perf_counter()
from remote_gpu_trainer import cli, registry

t_cli = time.perf_counter()
specs = registry.cli_specs("health")
t_tool = time.perf_counter()
namespace = cli.build_parser(specs).parse_args(["health", "--json"])
t_parse = time.perf_counter()
status = session().status(30)
t_ready = time.perf_counter()
report = namespace.spec.call({})
t_probe = time.perf_counter()
text = report.model_dump_json(indent=2)
t_json = time.perf_counter()
assert status.ok and text
print(json.dumps({
    "interpreter start": started - float(sys.argv[1]), "import nvml_session + spawn worker": t_spawn - t0,
    "import cli (pydantic, registry)": t_cli - t_spawn, "import health.tool": t_tool - t_cli,
    "argparse": t_parse - t_tool, "wait for the worker (not overlapped)": t_ready - t_parse,
    "probe (all GPUs, judge)": t_probe - t_ready, "JSON": t_json - t_probe, "worker": session().startup(),
    "ended_at": time.monotonic()}), flush=True)
os._exit(0)  # as cli.entry does after an NVML command
"""
"""`rgt health --json` step by step, as cli.main and cli.entry do it, in a fresh process that imports
nothing else; argv[1] is the parent's CLOCK_MONOTONIC at the spawn, so the interpreter's start counts."""


def cold_breakdown(runs: int, env: dict[str, str]) -> None:
    rows: list[dict] = []
    for _ in range(runs):
        spawned_at = time.monotonic()
        done = subprocess.run([sys.executable, "-c", COLD_CHILD, repr(spawned_at)], capture_output=True, text=True,
                              timeout=120, env=env)
        ended = time.monotonic()
        if done.returncode == 0 and done.stdout.strip():
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["exit"] = ended - row.pop("ended_at")
            row["total"] = ended - spawned_at
            rows.append(row)
        else:
            print(f"  (breakdown child failed: {done.stderr.strip()[-300:]})")
    if not rows:
        return
    interpreter, _ = interleaved(lambda: run_quiet([sys.executable, "-c", "pass"], env), None, runs)
    print(f"  {'(python -c pass, for scale)':<44} {ms(statistics.median(interpreter))}")
    for key in rows[0]:
        if key != "worker":
            print(f"  {key:<44} {ms(statistics.median(r[key] for r in rows))}")
    worker = [r["worker"] for r in rows if r.get("worker")]
    if worker:
        parts = {"python -S start + import worker": "python_start_s", "import pynvml": "import_pynvml_s",
                 "nvmlInit": "nvml_init_s", "spawn to ready": "ready_after_s"}
        text = ", ".join(f"{name} {statistics.median(w[key] for w in worker) * 1e3:.1f} ms"
                         for name, key in parts.items())
        print(f"  in parallel, the NVML worker: {text}")


# --- warm and cold against nvidia-smi -q --------------------------------------------------------------------


def nvml_bench(runs: int, source: str) -> None:
    from remote_gpu_trainer.health.backend import NvmlProcessBackend
    from remote_gpu_trainer.health.tool import SPECS as HEALTH_SPECS
    from remote_gpu_trainer.health.xid import read_kernel_log

    health = HEALTH_SPECS[0]
    report = health.call({})
    print(f"NVML: {source}; {report.gpus_found} GPU(s): {', '.join(sorted({g.name or '?' for g in report.gpus}))}; "
          f"driver {report.driver_version}; verdict {report.verdict.value}")
    smi = shutil.which("nvidia-smi")
    smi_q = (lambda: run_quiet([smi, "-q"])) if smi else None
    if not smi:
        print("nvidia-smi not installed: the nvidia-smi -q baseline is absent (no ratios)")

    warm, smi_warm = interleaved(lambda: health.call({}), smi_q, runs)
    ratio_line("warm gpu_health (in-process)", warm, smi_warm, "goal >= 10x")
    backend = NvmlProcessBackend()
    count = report.gpus_found
    reads, _ = interleaved(lambda: [backend.worker.call(lambda i=i: backend.read_gpu(i), "bench", 30)
                                    for i in range(count)], None, runs)
    log, _ = interleaved(read_kernel_log, None, runs)
    print(f"  NVML reads ({count} requests to the worker)   {ms(statistics.median(reads))}")
    print(f"  kernel log (on a thread, overlaps the reads) {ms(statistics.median(log))}")
    rest = max(statistics.median(warm) - statistics.median(reads), 0)
    print(f"  judging, classification, models          {ms(rest)}")

    env = fresh_env()
    cli = [sys.executable, "-m", "remote_gpu_trainer", "health", "--json"]
    run_quiet(cli, env)  # bytecode written, per-boot InfoROM cache filled
    cold, smi_cold = interleaved(lambda: run_quiet(cli, env), smi_q, max(3, runs))
    ratio_line("cold rgt health --json", cold, smi_cold, "goal >= 1x")
    cold_breakdown(max(3, runs), env)
    print("(ratio = nvidia-smi -q time / our time: how many times faster)")


def no_gpu_bench(runs: int, calls: int) -> None:
    from remote_gpu_trainer.health.tool import SPECS as HEALTH_SPECS
    from remote_gpu_trainer.info import SPECS as INFO_SPECS
    from remote_gpu_trainer.nvml_session import nvml_status

    health, info = HEALTH_SPECS[0], INFO_SPECS[0]
    status = nvml_status()
    print(f"\nno driver (real pynvml, no libnvidia-ml): {status.reason} ({status.detail[:70]}...)")
    health.call({}), info.call({})  # warm-up: imports, cached NVML status
    h, i = interleaved(lambda: health.call({}), lambda: info.call({}), calls)
    print(f"in-process, no-GPU answer      skill_info {ms(statistics.median(i))}   gpu_health "
          f"{ms(statistics.median(h))}   ratio {statistics.median(h) / statistics.median(i):5.2f}x")
    base = [sys.executable, "-m", "remote_gpu_trainer"]
    env = fresh_env()
    h, i = interleaved(lambda: run_quiet([*base, "health"], env), lambda: run_quiet([*base, "info"], env), runs)
    print(f"fresh process, no-GPU answer   rgt info   {ms(statistics.median(i))}   rgt health "
          f"{ms(statistics.median(h))}   ratio {statistics.median(h) / statistics.median(i):5.2f}x")


def use_fake(scenario: str) -> str | None:
    """Point this process's NVML worker (and fresh processes) at the C-level fake; None if it cannot be built."""
    sys.path.insert(0, str(ROOT))
    from tests.nvml_fake import Unavailable, build, environment, write_scenario

    work = Path(tempfile.mkdtemp(prefix="rgt-bench-nvml-"))
    try:
        lib = build(work / "lib")
    except Unavailable as why:
        print(f"C-level fake not built ({why})")
        return None
    os.environ.update(environment(lib, write_scenario(scenario, work / f"{scenario}.nvml")))
    os.environ["RGT_CACHE_DIR"] = str(work / "cache")
    from remote_gpu_trainer import nvml_session

    nvml_session.reset_for_tests()
    return f"C-level fake libnvidia-ml.so.1, scenario {scenario} (calls cost nothing: our overhead only)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="repetitions per series")
    parser.add_argument("--calls", type=int, default=200, help="in-process repetitions (no-driver mode)")
    parser.add_argument("--fake", metavar="SCENARIO", help="use the C-level fake even where NVML works")
    ns = parser.parse_args()
    from remote_gpu_trainer.nvml_session import nvml_status

    print(f"python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
    runs = max(ns.runs, 3)
    if not ns.fake and nvml_status().ok:
        fake = os.environ.get("RGT_FAKE_NVML_SCENARIO")  # bench/gpu_suite.sh on a CPU box
        nvml_bench(runs, f"C-level fake libnvidia-ml.so.1 ({fake})" if fake else "real driver")
        return
    no_gpu_bench(runs, max(ns.calls, 10))
    print()
    source = use_fake(ns.fake or "healthy-8xh100")
    if source:
        nvml_bench(runs, source)


if __name__ == "__main__":
    main()
