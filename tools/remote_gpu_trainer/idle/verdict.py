"""The idle verdict: busy, idle (since when, with the evidence), stalled, or unknown.

Rules, in order (the first that applies decides):

1. **busy** — a run of ours is running (alive, its progress files moving), or a GPU's utilisation reached the
   threshold at any reading in the window while a process that is not a stalled run of ours holds it (a foreign
   process at full load is work too). Where GPU load cannot be read, a process holding a CUDA context
   (``/dev/nvidia*`` and ``/dev/nvidia-uvm`` open) that is not ours counts as work.
2. **stalled** — a run of ours is alive but made no progress for the stall limit (the supervisor's verdict, or
   its files quiet that long). Its GPUs may read 100 %: a rank hung in an NCCL collective spins there, so load
   held only by stalled runs is not work. It bills like a busy box and produces nothing (the failure SkyPilot's
   autostop cannot see).
3. **idle** — no run of ours alive and every GPU under the threshold for the whole window. Idle since the last
   run ended, or, with no run recorded, since the window began (at least).
4. **unknown** — when nothing can be read at all (no GPU reading and no ledger on this box), or when GPU load
   cannot be read and the /proc scan cannot rule out a foreign CUDA job (the scan failed, or processes of other
   users keep their open files from a non-root caller): idle must be proven, never assumed.

**Without GPU readings** (no NVML: a CPU box, a container without the NVIDIA runtime, a hung driver) the verdict
is decided from our runs' states and their log/file progress alone, and the evidence says so: a job that was
neither started by run_start nor adopted (run_adopt) and holds no CUDA context is invisible then.

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
    """pid → run id for every live process of our runs."""
    return {pid: run.run_id for run in runs for pid in run.pids}


def gpu_work(window: Window, runs: list[RunView], util_threshold: int) -> tuple[list[str], list[str]]:
    """Why the GPUs say the box is working, and why they cannot prove it idle (both empty: idle as far as the GPUs
    go). Load held only by stalled runs is no work. Doubts arise only without GPU readings (see foreign_cuda)."""
    stalled = {pid for run in runs if run.state == "stalled" for pid in run.pids}
    if not window.ok:
        return foreign_cuda(runs)
    reasons = []
    for gpu in window.gpus:
        if (gpu.util_max or 0) < util_threshold:
            continue
        holders = set(gpu.processes)
        if holders and holders <= stalled:
            continue
        reasons.append(f"GPU {gpu.index} at {gpu.util_max}% (threshold {util_threshold}%)")
    return reasons, []


def foreign_cuda(runs: list[RunView]) -> tuple[list[str], list[str]]:
    """Without GPU readings: (work, doubts) from a /proc scan. Work: processes holding a CUDA context that are not
    our runs'. Doubts: why the scan cannot rule such a process out — it failed, or it could not list the open files
    of some processes (other users' when not root). A doubt must never read as idle: a stop then could kill another
    user's CUDA job."""
    from ..health.holders import scan_device_holders

    mine = set(owners(runs))
    try:
        scan = scan_device_holders()
    except OSError as err:
        return [], [f"GPU load cannot be read and the /proc scan for CUDA contexts failed ({err}): "
                    "a job of another user cannot be ruled out"]
    work = [f"pid {pid} holds a CUDA context (/dev/nvidia-uvm) and is not a run of ours; GPU load cannot be read, "
            "so it counts as work" for pid, use in sorted(scan.holders.items()) if use.uvm and pid not in mine]
    hidden = sorted(scan.unreadable - mine)
    doubts = [f"GPU load cannot be read and the open files of {len(hidden)} process(es) of other users cannot be "
              f"listed (e.g. pid {', '.join(map(str, hidden[:5]))}; not root?): any of them may hold a CUDA context, "
              "so the box cannot be proven idle"] if hidden else []
    return work, doubts


def unreadable_note(window: Window) -> str:
    return (f"GPU load unreadable ({window.detail}): decided from our runs' states and their log/file progress; "
            "a job neither started by run_start nor adopted (run_adopt) is not seen")


def decide(window: Window, runs: list[RunView], util_threshold: int) -> Decision:
    running = [r for r in runs if r.state == "running"]
    stalled = [r for r in runs if r.state == "stalled"]
    loaded, doubts = gpu_work(window, runs, util_threshold)
    evidence = []
    if running:
        evidence.append(f"run(s) of ours running: {', '.join(r.run_id for r in running)}")
    evidence += loaded
    if not window.ok:
        evidence.append(unreadable_note(window))
    if running or loaded:
        return Decision("busy", None, evidence)
    if not window.ok and not runs:
        return Decision("unknown", None, [f"{unreadable_note(window)}; no run of ours is recorded on this box, so "
                                          "nothing shows it idle"])
    if stalled:
        held = [f"GPU {g.index} at {g.util_max}% is held only by it (a rank spinning in a collective reads busy)"
                for g in window.gpus if (g.util_max or 0) >= util_threshold]
        quiet = [f"run {r.run_id} is alive but made no progress since "
                 f"{r.last_output_at if r.last_output_at is not None else 'start'} (unix time)" for r in stalled]
        return Decision("stalled", None, quiet + held + ([f"every GPU under {util_threshold}% over "
                                                          f"{window.seconds:.0f} s"] if window.ok and not held else [])
                        + ([unreadable_note(window)] if not window.ok else []) + doubts)
    if doubts:
        return Decision("unknown", None, evidence + doubts)
    ended = [r.ended_at for r in runs if r.ended_at is not None]
    since = max(ended) if ended else window.started_at
    if window.ok:
        evidence.append(f"every GPU under {util_threshold}% at each of {window.samples} reading(s) over "
                        f"{window.seconds:.0f} s")
    evidence.append(f"last run of ours ended at {max(ended):.0f} (unix time)" if ended else
                    "no run of ours recorded on this box: idle since the window began, at least")
    return Decision("idle", since, evidence)
