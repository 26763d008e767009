"""Installing the runtime on 8 boxes in one call vs the slowest single-box install, in one run.

Eight loopback ssh boxes are built as the tests build them (tests/sshbox.py: OpenSSH sshd where installed,
else asyncssh; each with its own HOME). Each round installs every box alone, one after the other (the
single-box times), removes the runtimes, then installs all of them with one ``box_install`` call (the same
function the tool and ``rgt box install h1 h2 …`` run), and removes them again. A warm-up install comes
first so that the page cache and pip's cache are the same for both. Goal (issue 25): the fleet install
≤ 1.5 × the slowest single install.

All boxes share this machine's CPUs, while real boxes each have their own: the script prints the
machine's load average and the CPU time all processes used during the fleet install, and the floor that
CPU time sets on this machine (CPU-s / cores). Where that floor is above the goal, the ratio here measures
this machine, not the install.

    python bench/box_install.py [--boxes 8] [--rounds 1] [--wheels]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]

from remote_gpu_trainer.remote.box import BoxInput, _run_remove, install_many  # noqa: E402
from remote_gpu_trainer.remote.hosts import parse_host  # noqa: E402
from remote_gpu_trainer.remote.session import POOL  # noqa: E402
from tests.sshbox import SSHD, Fleet  # noqa: E402

GOAL = 1.5


def machine_cpu_s() -> float:
    """CPU-seconds the whole machine spent so far, other users' work included."""
    times = psutil.cpu_times()
    return times.user + times.system + getattr(times, "nice", 0.0)


def own_cpu_s(fleet: Fleet) -> float | None:
    """CPU-seconds of the installs themselves: this process and the ssh clients it waited for, plus every process
    the boxes' sshd servers ran and reaped (/proc/PID/stat utime, stime, cutime, cstime). Call it with no ssh
    connection open (``drop_connections``), so that every session has been reaped. None without OpenSSH boxes."""
    mine = os.times()
    total = mine.user + mine.system + mine.children_user + mine.children_system
    tick = os.sysconf("SC_CLK_TCK")
    for box in fleet.boxes.values():
        if not isinstance(box.stop, subprocess.Popen):
            return None
        fields = Path(f"/proc/{box.stop.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(v) for v in fields[11:15]) / tick  # utime stime cutime cstime (stat fields 14-17)
    return total


def drop_connections(fleet: Fleet) -> None:
    """End every ssh master and session, so each install starts as on a box never contacted before and the
    boxes' sshd servers have reaped everything the last one ran."""
    POOL.close_all()
    for alias in fleet.boxes:
        subprocess.run(["ssh", "-F", str(fleet.config), "-o", f"ControlPath={fleet.control_dir}/%C", "-O", "exit",
                        alias], capture_output=True, stdin=subprocess.DEVNULL, timeout=10, check=False)
    time.sleep(0.3)  # sshd reaps the ended sessions


def install(fleet: Fleet, aliases: list[str], wheels: bool) -> tuple[float, float, float | None]:
    """(wall seconds, machine CPU-seconds, the installs' own CPU-seconds) of one box_install call over
    ``aliases``, from no open connection; every box must end ready."""
    drop_connections(fleet)
    own = own_cpu_s(fleet)
    started, cpu = time.perf_counter(), machine_cpu_s()
    report = install_many([parse_host(a) for a in aliases], wheels, lambda *a, **k: None, wait_s=None)
    took, cpu = time.perf_counter() - started, machine_cpu_s() - cpu
    drop_connections(fleet)
    after = own_cpu_s(fleet)
    bad = [r for r in report.hosts if r.outcome != "installed"]
    if bad:
        raise SystemExit(f"bench broken: {bad[0].host} {bad[0].outcome}: {bad[0].summary}")
    return took, cpu, (after - own) if own is not None and after is not None else None


def remove(aliases: list[str]) -> None:
    for alias in aliases:
        _run_remove(BoxInput(host=alias), lambda *a, **k: None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", type=int, default=8, choices=range(2, 33), metavar="2..32")
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 11), metavar="1..10")
    parser.add_argument("--wheels", action="store_true", help="send dependency wheels (downloaded once per call)")
    opts = parser.parse_args()
    n, cores = opts.boxes, os.cpu_count() or 1
    server = "OpenSSH sshd" if SSHD else "asyncssh"
    print(f"transport: real ssh client → {server} on 127.0.0.1; {n} boxes; wheels={opts.wheels}; {cores} CPU(s)")
    ratios: list[float] = []
    floors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rgt-bench-install-") as tmp:
        fleet = Fleet(Path(tmp))
        try:
            aliases = [f"inst-{i}" for i in range(n)]
            for alias in aliases:
                fleet.add(alias)
            with fleet.environment():
                install(fleet, aliases[:1], opts.wheels)  # warm-up: page cache, pip's cache
                remove(aliases[:1])
                for round_no in range(1, opts.rounds + 1):
                    singles = [install(fleet, [alias], opts.wheels) for alias in aliases]
                    remove(aliases)
                    took, cpu, own = install(fleet, aliases, opts.wheels)
                    load = os.getloadavg()
                    remove(aliases)
                    walls = [t for t, _, _ in singles]
                    ratios.append(took / max(walls))
                    single_own = [o for _, _, o in singles if o is not None]
                    if own is not None:
                        floors.append(own / cores / max(walls))
                    own_text = (f"; the installs' own CPU {own:.1f} CPU-s (single: median "
                                f"{statistics.median(single_own):.2f}), floor on {cores} cores {own / cores:.2f} s"
                                if own is not None and single_own else "")
                    print(f"round {round_no}: single box slowest {max(walls):.2f} s, median "
                          f"{statistics.median(walls):.2f} s, fastest {min(walls):.2f} s | {n} boxes in one call "
                          f"{took:.2f} s = {ratios[-1]:.2f}x the slowest single | machine CPU during it {cpu:.1f} "
                          f"CPU-s ({cpu / took:.2f} of {cores} cores busy){own_text} | load average "
                          f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
        finally:
            fleet.close()
    ratio = statistics.median(ratios)
    print(f"ratio {n} boxes / slowest single install, median over {len(ratios)} round(s): {ratio:.2f}x "
          f"(goal <= {GOAL}x)")
    if floors:
        floor = statistics.median(floors)
        print(f"the installs' own CPU time alone, spread over {cores} cores, takes {floor:.2f}x the slowest single "
              "install (median over rounds): the part of the ratio this code sets on this machine")
    if ratio > GOAL:
        print(f"MISSED here: the {n} boxes share {cores} CPU(s) with everything else on this machine (see the CPU "
              "floor and load average above); on real boxes each install has its own CPUs.")


if __name__ == "__main__":
    main()
