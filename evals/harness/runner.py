"""``run`` mode: ask an agent CLI every case's prompt (K times), save answers for offline scoring.

Nothing is scored here, on purpose: agent runs cost money and time, scoring is free, and rubrics
change. ``runs/<stamp>-<config>/answers.jsonl`` can be re-scored with any later rubric by
``run_evals.py score``; ``transcripts/`` keeps each call's raw stdout/stderr for disputes.

With-skill vs without-skill: run twice with different ``--cwd`` (a checkout where the skill and
MCP server are installed, and an empty directory) and ``--config`` names, then
``score WITH/answers.jsonl --baseline WITHOUT/answers.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import HARNESS_VERSION
from .agents import build_argv, extract_answer, invoke
from .schema import Case


def case_sha256(case: Case) -> str:
    """Fingerprint of the case as the agent saw it (the prompt) and as it is scored (the rubric)."""
    return hashlib.sha256(json.dumps(case.raw, sort_keys=True).encode()).hexdigest()[:16]


def run_agent(cases: list[Case], template: str, *, runs: int, cwd: Path | None, out_root: Path, timeout: float,
              config: str, jobs: int = 1, echo: Callable[[str], None] = print) -> tuple[Path, int]:
    """Run every case ``runs`` times; returns the run folder and how many calls gave no answer."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", config).strip("-") or "run"
    folder = out_root / f"{stamp}-{safe}"
    (folder / "transcripts").mkdir(parents=True, exist_ok=False)
    build_argv(template, "probe")  # fail fast on a broken template
    meta = {"harness_version": HARNESS_VERSION, "agent_cmd": template, "config": config, "runs": runs,
            "cwd": str(cwd) if cwd else None, "timeout_s": timeout, "started": stamp,
            "cases": [c.id for c in cases]}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    jobs_list = [(case, k) for case in cases for k in range(1, runs + 1)]

    def one(item: tuple[Case, int]) -> dict[str, Any]:
        case, k = item
        argv, stdin = build_argv(template, case.prompt, id=case.id, run=str(k))
        inv = invoke(argv, stdin, cwd, timeout)
        answer, error, extra = extract_answer(inv)
        name = f"transcripts/{case.id}-r{k}.json"
        (folder / name).write_text(json.dumps(inv.transcript(case.prompt), indent=1) + "\n")
        row: dict[str, Any] = {"id": case.id, "run": k, "config": config, "agent": argv[0],
                               "duration_s": round(inv.duration_s, 2), "transcript": name,
                               "case_sha256": case_sha256(case)}
        if "total_cost_usd" in extra:
            row["cost_usd"] = extra["total_cost_usd"]
        if answer is not None:
            row["answer"] = answer
        if error is not None:
            row["error"] = error
        return row

    errors = 0
    with (folder / "answers.jsonl").open("w", encoding="utf-8") as out, ThreadPoolExecutor(max(1, jobs)) as pool:
        for row in pool.map(one, jobs_list):
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            out.flush()
            status = "error: " + row["error"] if "error" in row else "answered"
            errors += "answer" not in row
            echo(f"[{'ok' if 'answer' in row else 'ERROR'}] {row['id']} run {row['run']} "
                 f"({row['duration_s']:.1f} s) {status if 'error' in row else ''}".rstrip())
    return folder, errors
