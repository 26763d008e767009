"""Cost of a tool call through ``host`` against plain ``ssh HOST true``, on one loopback box, in one run.

Builds a loopback box exactly as the tests do (tests/sshbox.py: OpenSSH sshd where installed, else the
asyncssh server), installs the runtime with the real ``box install``, then measures medians of:

* ``ssh true, warm``   ``ssh HOST true`` with our options while a ControlMaster is open
* ``tool, local``      the same tool called on this machine (no host)
* ``tool, warm``       the tool through ``host`` on an open session (one JSON line out, one back)
* ``ssh true, cold``   ``ssh HOST true`` with no master (a new TCP + ssh handshake each time)
* ``tool, cold``       the first call with no master and no session: handshake, start of the box's
                       runtime server, the call

Goals (issue 16): warm ≤ 1.5 × warm ssh + the local tool time; cold ≤ 3 × cold ssh. Loopback only.

    python bench/remote.py [--repeat 15] [--tool port_status]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]

from remote_gpu_trainer.registry import all_specs  # noqa: E402
from remote_gpu_trainer.remote.hosts import parse_host  # noqa: E402
from remote_gpu_trainer.remote.session import POOL  # noqa: E402
from remote_gpu_trainer.remote.ssh import ssh_argv  # noqa: E402
from tests.sshbox import Fleet  # noqa: E402

ARGUMENTS = {"port_status": {"port": 29500}, "gpu_health": {}, "skill_info": {}}


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--tool", default="port_status", choices=sorted(ARGUMENTS))
    args = parser.parse_args()
    spec = {s.name: s for s in all_specs()}[args.tool]
    arguments = ARGUMENTS[args.tool]
    fleet = Fleet(Path(tempfile.mkdtemp(prefix="rgt-bench-")))
    try:
        box = fleet.add("bench-box", scenario="healthy-8xh100")
        with fleet.environment():
            fleet.install_runtime("bench-box")
            host = parse_host("bench-box")
            true_argv = ssh_argv(host, "true")

            def ssh_true() -> None:
                subprocess.run(true_argv, stdin=subprocess.DEVNULL, capture_output=True, check=True)

            def close_master() -> None:
                POOL.close_all()
                subprocess.run(["ssh", "-F", str(fleet.config), "-o", f"ControlPath={fleet.control_dir}/%C",
                                "-O", "exit", "bench-box"], capture_output=True, stdin=subprocess.DEVNULL)
                time.sleep(0.05)

            def cold(fn) -> float:
                times = []
                for _ in range(max(3, args.repeat // 3)):
                    close_master()
                    started = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - started) * 1000)
                return statistics.median(times)

            def remote_call() -> None:
                spec.call({**arguments, "host": "bench-box"})

            remote_call()  # opens the master and a session
            warm_ssh = median_ms(ssh_true, args.repeat)
            local = median_ms(lambda: spec.call(arguments), args.repeat)
            warm_tool = median_ms(remote_call, args.repeat)
            cold_ssh = cold(ssh_true)
            cold_tool = cold(remote_call)
            close_master()
    finally:
        fleet.close()
    print(f"box: loopback {box.server}, tool {args.tool}, {args.repeat} repeats (medians)")
    print(f"  ssh true, warm   {warm_ssh:8.1f} ms")
    print(f"  tool, local      {local:8.1f} ms")
    print(f"  tool, warm       {warm_tool:8.1f} ms   ratio (warm - local) / warm ssh = "
          f"{(warm_tool - local) / warm_ssh:.2f} (goal <= 1.5)")
    print(f"  ssh true, cold   {cold_ssh:8.1f} ms")
    print(f"  tool, cold       {cold_tool:8.1f} ms   ratio cold / cold ssh = {cold_tool / cold_ssh:.2f} (goal <= 3)")


if __name__ == "__main__":
    main()
