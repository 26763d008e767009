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
  * cold, no daemon (RGT_NO_DAEMON=1): `rgt health --json` as a fresh process vs `nvidia-smi -q`; broken down
    by an instrumented fresh process: interpreter, imports, parser, the wait for the NVML worker (started first,
    so its Python start, `import pynvml` and nvmlInit overlap the imports), the probe, the JSON.
  * first call: no daemon running; it answers in-process and starts the warm health daemon (healthd.py), and
    how long after it returned the daemon answers.
  * cold, daemon: `rgt health --json` as a fresh process that the warm daemon answers, vs `nvidia-smi -q`;
    broken down: interpreter, the fast path's imports, its key, the round trip (the daemon's probe inside).
  Each cold series is also given as a multiple of `python -c pass`, the floor of any Python command.
  Goals on a GPU: warm >= 10x faster than `nvidia-smi -q`; cold no slower than `nvidia-smi -q`.
  Fresh processes run with bytecode caching on (a private PYTHONPYCACHEPREFIX), as an installed package does.
  The daemons live in a private XDG_RUNTIME_DIR and are stopped at the end.
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


def ratio_line(label: str, ours: list[float], smi: list[float], goal: str, floor: list[float] | None = None) -> None:
    """``floor``: times of `python -c pass`; our time is then also given as a multiple of it."""
    med = statistics.median(ours)
    over = f"   {med / statistics.median(floor):5.2f}x python -c pass" if floor else ""
    if smi:
        base = statistics.median(smi)
        print(f"{label:<34} {ms(med)}   nvidia-smi -q {ms(base)}   ratio {base / med:6.2f}x  ({goal}; n={len(ours)})"
              f"{over}")
    else:
        print(f"{label:<34} {ms(med)}   nvidia-smi -q: absent, no ratio  ({goal}; n={len(ours)}){over}")


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
    "ended_at": time.monotonic()}), file=sys.stderr, flush=True)
os._exit(0)  # as cli.entry does after an NVML command
"""
"""`rgt health --json` step by step, as cli.main and cli.entry do it, in a fresh process that imports
nothing else; argv[1] is the parent's CLOCK_MONOTONIC at the spawn, so the interpreter's start counts."""


def timed_children(code: str, runs: int, env: dict[str, str]) -> list[dict]:
    """Run ``code`` as a fresh process ``runs`` times, argv[1] the spawn time; each prints its steps' times as JSON,
    the last line on its stderr, with ``ended_at``; exit and total are measured here."""
    rows: list[dict] = []
    for _ in range(runs):
        spawned_at = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code, repr(spawned_at)], capture_output=True, text=True,
                              timeout=120, env=env)
        ended = time.monotonic()
        if done.returncode == 0 and done.stderr.strip():
            row = json.loads(done.stderr.strip().splitlines()[-1])
            row["exit"] = ended - row.pop("ended_at")
            row["total"] = ended - spawned_at
            rows.append(row)
        else:
            print(f"  (instrumented child failed: {(done.stdout + done.stderr).strip()[-300:]})")
    for key in rows[0] if rows else ():
        if key != "worker":
            print(f"  {key:<44} {ms(statistics.median(r[key] for r in rows))}")
    return rows


def cold_breakdown(runs: int, env: dict[str, str]) -> None:
    rows = timed_children(COLD_CHILD, runs, env)
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
    alone = {**env, "RGT_NO_DAEMON": "1"}
    run_quiet(HEALTH_CLI, alone)  # bytecode written, per-boot InfoROM cache filled
    floor, _ = interleaved(lambda: run_quiet([sys.executable, "-c", "pass"], env), None, runs)
    print(f"(python -c pass, the floor of any Python command: {ms(statistics.median(floor))})")
    cold, smi_cold = interleaved(lambda: run_quiet(HEALTH_CLI, alone), smi_q, runs)
    ratio_line("cold rgt health --json, no daemon", cold, smi_cold, "goal >= 1x", floor)
    cold_breakdown(runs, alone)
    daemon_bench(runs, {k: v for k, v in env.items() if k != "RGT_NO_DAEMON"}, smi_q, floor)
    print("(ratio = nvidia-smi -q time / our time: how many times faster)")


# --- cold with the warm health daemon (healthd.py) ----------------------------------------------------------


HEALTH_CLI = [sys.executable, "-m", "remote_gpu_trainer", "health", "--json"]

FAST_CHILD = """
import time
started = time.monotonic()
import io, os, sys
t0 = time.perf_counter()
from remote_gpu_trainer import healthd

t_import = time.perf_counter()
path = healthd.socket_path(healthd.key_material(os.environ))
t_key = time.perf_counter()
real, sys.stdout = sys.stdout, io.StringIO()
code = healthd.answer(["health", "--json"])
t_answer = time.perf_counter()
text, sys.stdout = sys.stdout.getvalue(), real
sys.stdout.write(text)
sys.stdout.flush()
t_out = time.perf_counter()
assert code == 0 and text and "pydantic" not in sys.modules, (code, len(text))
import json
print(json.dumps({
    "interpreter start": started - float(sys.argv[1]),
    "import the fast path (socket, zlib, codestamp)": t_import - t0,
    "key: code stamp + checksum": t_key - t_import, "ask the daemon (connect, its probe, reply)": t_answer - t_key,
    "print the answer": t_out - t_answer, "ended_at": time.monotonic()}), file=sys.stderr, flush=True)
os._exit(0)  # as rgt.main does after the daemon answered
"""
"""The fast path of `rgt health --json` step by step, as rgt.main and healthd.answer do it; the key is computed
twice (once timed alone, once inside answer), so its row is also inside the daemon's."""


def daemon_pids() -> list[int]:
    from remote_gpu_trainer import healthd

    return healthd.pids()


def stop_daemons() -> None:
    """Stop this bench's daemons (its private XDG_RUNTIME_DIR) and wait until they are gone."""
    from remote_gpu_trainer import healthd

    pids = daemon_pids()
    healthd.stop_all()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def wait_for_daemon(timeout_s: float = 60) -> float | None:
    """Seconds until a daemon answers a ping; None if none does within ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if daemon_pids():
            return time.monotonic() - start
        time.sleep(0.005)
    return None


def daemon_bench(runs: int, env: dict[str, str], smi_q: Callable[[], object] | None, floor: list[float]) -> None:
    """The first call (answers in-process, then starts the daemon) and cold calls the daemon answers."""
    first, smi_first, ready = [], [], []
    for _ in range(runs):
        stop_daemons()
        first.append(timed(lambda: run_quiet(HEALTH_CLI, env)))
        ready.append(wait_for_daemon())
        if smi_q:
            smi_first.append(timed(smi_q))
    ratio_line("first call (starts the daemon)", first, smi_first, "no goal: once per 10 idle minutes", floor)
    up = [r for r in ready if r is not None]
    print(f"  the daemon answers {ms(statistics.median(up)) if up else 'never (!)'} after that call returned "
          f"({len(up)}/{runs} started)")
    if not up:
        return
    warm, smi_warm = interleaved(lambda: run_quiet(HEALTH_CLI, env), smi_q, runs)
    ratio_line("cold rgt health --json, daemon", warm, smi_warm, "goal >= 1x", floor)
    if timed_children(FAST_CHILD, runs, env):
        print("  (pydantic not imported by the client: checked)")
    stop_daemons()


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
    runtime = tempfile.mkdtemp(prefix="rgt-bench-run-")  # mode 0700: this bench's health daemons, never the user's
    os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        if not ns.fake and nvml_status().ok:
            fake = os.environ.get("RGT_FAKE_NVML_SCENARIO")  # bench/gpu_suite.sh on a CPU box
            nvml_bench(runs, f"C-level fake libnvidia-ml.so.1 ({fake})" if fake else "real driver")
            return
        no_gpu_bench(runs, max(ns.calls, 10))
        print()
        source = use_fake(ns.fake or "healthy-8xh100")
        if source:
            nvml_bench(runs, source)
    finally:
        stop_daemons()
        shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    main()
