"""The markdown section for bench/RESULTS.md from a bench/gpu_suite.sh work folder (stdlib only).

    python bench/gpu_suite_report.py WORK_DIR [TOTAL_SECONDS]

Each step's outcome comes from WORK_DIR/steps.tsv; the figures from the files the steps wrote. A
step that did not run says so; nothing is filled in that was not measured.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def block(title: str, text: str) -> list[str]:
    return [f"**{title}**", "", "```text", text.strip() or "(no output)", "```", ""] if text.strip() else []


def pytest_summary(text: str) -> str:
    """Each pytest run's summary line ("N passed, M skipped in Xs"), and any FAILED lines."""
    lines = text.strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    summaries = [line for line in lines if re.match(r"^\d+ (passed|failed|skipped|deselected|error)", line)]
    return "\n".join([*failed, *summaries]) or "(not run)"


def main() -> None:
    work = Path(sys.argv[1])
    total = sys.argv[2] if len(sys.argv) > 2 else "?"
    env = read(work / "env" / "env.txt")
    first = env.splitlines()[0].removeprefix("date ") if env else "?"
    gpu_line = next((line for line in env.splitlines()[1:] if line and not line.startswith(("name,", "Linux", "cpus"))
                     and "," in line), "no GPU")
    out = [f"## GPU suite: {gpu_line} ({first[:10]})", "",
           f"`bash bench/gpu_suite.sh` in {total} s. Environment:", "", "```text", env.strip(), "```", "",
           "| step | result | seconds |", "|---|---|---|"]
    for row in read(work / "steps.tsv").splitlines()[1:]:
        name, result, seconds, _ = [*row.split("\t"), "", "", "", ""][:4]
        out.append(f"| {name} | {result} | {seconds} |")
    out.append("")
    out += block("pytest -m gpu tests/test_health_gpu.py (alone, first)", pytest_summary(
        read(work / "pytest_nvml" / "pytest.txt")))
    out += block("pytest -m gpu: memory, hang, runs, trainenv files", pytest_summary(
        read(work / "pytest_gpu" / "pytest.txt")))
    out += block("rgt health --expect-gpus N", read(work / "health" / "health.txt"))
    out += block("python bench/gpu_health.py --runs 7", read(work / "bench_health" / "bench.txt"))
    out += block("rgt repro all --variant all --device cuda", read(work / "repro_cuda" / "repro.txt"))
    orphan = read(work / "orphan" / "orphan.txt")
    line = next((x for x in orphan.splitlines() if x.startswith("{")), "")
    if line:
        data = json.loads(line)
        if "skipped" in data:
            text = f"skipped: {data['skipped']}"
        else:
            reap = data.get("reap", {})
            text = (f"worker pid {data.get('worker_pid')} holding {data.get('gib')} GiB, re-parented to "
                    f"{data.get('parent_pid')} ({data.get('parent_name')}); dry run: {data.get('dry_run')}; "
                    f"reaped: {reap.get('summary')}; memory before/after per GPU: {reap.get('memory')}; "
                    f"worker gone: {data.get('worker_gone')}")
            text += f"; error: {data['error']}" if "error" in data else ""
        out += block("a real orphan reaped with its token (bench/gpu_orphan.py)", text)
    run = work / "supervised_run"
    out += block("supervised run: run status while training", tail(read(run / "run_status.txt"), 15))
    out += block("box_idle while it trains", tail(read(run / "idle_busy.txt"), 12))
    out += block("bench/hf_memory_gpu.py: real Hugging Face classes vs rgt mem",
                 tail(read(work / "hf_memory" / "hf_memory.txt"), 25))
    out += block("evals/verify/_gpu_checks.py", read(work / "verify_gpu" / "verify.txt"))
    print("\n".join(out))


if __name__ == "__main__":
    main()
