"""The idle verdict: busy, idle (since when, with the evidence), stalled, or unknown.

Rules, in order (the first that applies decides):

1. **busy** — a run of ours is running (alive, its log moving), or any GPU's utilisation reached the
   threshold at any reading in the window. A foreign process at full load is work too.
2. **stalled** — a run of ours is alive but its log has not moved for the stall limit, and no GPU
   reached the threshold: it bills like a busy box and produces nothing (the failure SkyPilot's
   autostop cannot see).
3. **unknown** — NVML could not be read, so GPU load is unknown (runs alone cannot prove idleness).
4. **idle** — no run of ours alive and every GPU under the threshold for the whole window. Idle since
   the last run ended, or, with no run recorded, since the window began (at least).

A process that holds VRAM without load (a notebook kernel) does not make a box busy, but it is listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .ledger import RunView
from .sampling import Window

IdleVerdict = Literal["busy", "idle", "stalled", "unknown"]


@dataclass(frozen=True)
class Decision:
    verdict: IdleVerdict
    idle_since: float | None
    evidence: list[str]


def owners(runs: list[RunView]) -> dict[int, str]:
    """pid → run id for every live process of our runs' process groups."""
    return {pid: run.run_id for run in runs for pid in run.pids}


def decide(window: Window, runs: list[RunView], util_threshold: int) -> Decision:
    running = [r for r in runs if r.state == "running"]
    stalled = [r for r in runs if r.state == "stalled"]
    loaded = [g for g in window.gpus if (g.util_max or 0) >= util_threshold]
    evidence = []
    if running:
        evidence.append(f"run(s) of ours running: {', '.join(r.run_id for r in running)}")
    if loaded:
        evidence.append("GPU(s) at or above {}% utilisation: {}".format(
            util_threshold, ", ".join(f"{g.index} (max {g.util_max}%)" for g in loaded)))
    if running or loaded:
        return Decision("busy", None, evidence)
    if stalled:
        return Decision("stalled", None, [f"run {r.run_id} is alive but its log has not changed since "
                                          f"{r.last_output_at or 'start'} (unix time)" for r in stalled]
                        + [f"every GPU under {util_threshold}% over {window.seconds:.0f} s"])
    if not window.ok:
        return Decision("unknown", None, [f"GPU load unreadable: {window.detail}"])
    ended = [r.ended_at for r in runs if r.ended_at is not None]
    since = max(ended) if ended else window.started_at
    evidence.append(f"every GPU under {util_threshold}% at each of {window.samples} reading(s) over "
                    f"{window.seconds:.0f} s")
    evidence.append(f"last run of ours ended at {max(ended):.0f} (unix time)" if ended else
                    "no run of ours recorded on this box: idle since the window began, at least")
    return Decision("idle", since, evidence)
