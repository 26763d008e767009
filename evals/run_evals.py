#!/usr/bin/env python3
"""Eval harness for the remote-gpu-trainer skill (see evals/README.md).

    python evals/run_evals.py                       # structure mode: the CI guard (stdlib only)
    python evals/run_evals.py score ANSWERS.jsonl [--json OUT] [--md OUT] [--junit OUT] [--baseline B.jsonl]
    python evals/run_evals.py run --agent-cmd 'claude -p {prompt} --output-format json' [--runs K] [--cwd DIR]
    python evals/run_evals.py judge ANSWERS.jsonl --judge-cmd 'claude -p {prompt} --output-format json'
    python evals/run_evals.py facts [--download]      # catalog strings and commands vs the real packages
    python evals/run_evals.py verify [--only ID...]   # Verify steps on failure and fix; figures from the tools

Runs from the repository root with a plain python3 and no install: the logic lives in the
``harness`` package beside this file, which imports only the standard library (plus the optional
extras, lazily, when their mode is asked for).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
