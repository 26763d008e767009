"""Running an agent CLI (``run``) or a judge CLI (``judge``) once per prompt, and reading its answer.

The command is an argv template, never a shell string: ``shlex.split`` once, then ``{prompt}``
(and ``{id}``, ``{run}``) are replaced inside the elements, so a prompt with quotes, ``$`` or
backticks reaches the agent byte for byte and cannot run anything. A template without ``{prompt}``
gets the prompt on stdin. Each call runs in its own process group and the whole group is ended on
timeout (agent CLIs start helpers: MCP servers, shells).

Output formats understood by :func:`extract_answer`:

- Claude Code ``claude -p … --output-format json``: one object, answer in ``result``; ``is_error``,
  ``total_cost_usd``, ``duration_ms``, ``num_turns`` kept as metadata. ``--output-format
  stream-json``: JSON lines, the last ``{"type": "result"}`` object counts.
- Gemini CLI ``gemini -p … --output-format json``: answer in ``response``; ``error`` and ``stats``
  kept. Exit codes 42 (input error) and 53 (turn limit) are errors.
- Anything else: stdout as plain text.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Invocation:
    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    launch_error: str | None = None

    def transcript(self, prompt: str) -> dict[str, Any]:
        """What is saved per call: the argv with the prompt elided (it is in the case file)."""
        argv = [a.replace(prompt, "{prompt}") if prompt else a for a in self.argv]
        return {"argv": argv, "returncode": self.returncode, "timed_out": self.timed_out,
                "launch_error": self.launch_error, "duration_s": round(self.duration_s, 3),
                "stdout": self.stdout, "stderr": self.stderr}


def build_argv(template: str, prompt: str, **fields: str) -> tuple[list[str], str | None]:
    """``(argv, stdin)`` for one call. Raises ValueError for an empty or unparsable template."""
    try:
        parts = shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"cannot split the command template: {exc}") from exc
    if not parts:
        raise ValueError("the command template is empty")
    uses_prompt = any("{prompt}" in p for p in parts)
    argv = []
    for part in parts:
        for key, value in fields.items():
            part = part.replace("{" + key + "}", value)
        argv.append(part.replace("{prompt}", prompt))
    return argv, None if uses_prompt else prompt


def invoke(argv: list[str], stdin: str | None, cwd: Path | None, timeout: float,
           env: dict[str, str] | None = None) -> Invocation:
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
                                errors="replace", start_new_session=True)
    except OSError as exc:
        return Invocation(argv, None, "", "", 0.0, launch_error=f"{type(exc).__name__}: {exc}")
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
        return Invocation(argv, proc.returncode, out, err, time.monotonic() - started)
    except subprocess.TimeoutExpired:
        _end_group(proc)
        out, err = proc.communicate()
        return Invocation(argv, proc.returncode, out or "", err or "", time.monotonic() - started, timed_out=True)


def _end_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the process group we created, then SIGKILL it if it has not gone in 5 s."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def extract_answer(inv: Invocation) -> tuple[str | None, str | None, dict[str, Any]]:
    """``(answer, error, metadata)`` from one call's output."""
    if inv.launch_error:
        return None, inv.launch_error, {}
    if inv.timed_out:
        return None, f"timed out after {inv.duration_s:.0f} s", {}
    text = inv.stdout.strip()
    answer, error, meta = _from_json(text)
    if answer is None and error is None:
        answer = text or None
    if inv.returncode in (42, 53) and error is None:
        error = f"exit {inv.returncode} (" + ("input error" if inv.returncode == 42 else "turn limit") + ")"
    if inv.returncode and answer is None and error is None:
        error = f"exit {inv.returncode}: {inv.stderr.strip()[-300:]}"
    if answer is None and error is None:
        error = "empty output"
    return answer, error, meta


def _from_json(text: str) -> tuple[str | None, str | None, dict[str, Any]]:
    if not text.startswith(("{", "[")):
        return None, None, {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if data is None:  # stream-json: one object per line, the result comes last
        objects = []
        for line in text.splitlines():
            try:
                objects.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        data = objects
    if isinstance(data, list):
        results = [d for d in data if isinstance(d, dict) and d.get("type") == "result"]
        if not results:
            return None, None, {}
        data = results[-1]
    if not isinstance(data, dict):
        return None, None, {}
    if "result" in data or data.get("type") == "result":
        meta = {k: data[k] for k in ("total_cost_usd", "duration_ms", "num_turns", "session_id", "subtype")
                if k in data}
        if data.get("is_error"):
            why = f"{data.get('subtype', 'error')}): {str(data.get('result'))[:300]}"
            return None, f"agent reported an error ({why}", meta
        result = data.get("result")
        return (result if isinstance(result, str) else None), None, meta
    if "response" in data or "error" in data:
        meta = {"stats": data["stats"]} if "stats" in data else {}
        if data.get("error"):
            err = data["error"]
            message = err.get("message") if isinstance(err, dict) else str(err)
            return None, f"agent reported an error: {message}", meta
        response = data.get("response")
        return (response if isinstance(response, str) else None), None, meta
    return None, None, {}
