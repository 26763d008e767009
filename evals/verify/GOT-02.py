"""GOT-02: a 'training run' keeps its log open after the file was deleted (the space is not returned)
vs the Fix's truncation of the open file through ``/proc/<pid>/fd/<fd>`` (the run keeps going). The
Verify is the entry's ``lsof -nP +L1``, looked at for this file only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

HOLDER = ("import time\nf = open('big.log', 'w')\nf.write('x' * (8 << 20)); f.flush()\n"
          "print('open', flush=True)\ntime.sleep(60)\n")


def run(case) -> str:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=case.tmp, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        path = case.tmp / "big.log"
        os.unlink(path)  # the "rm" of a huge log the run still writes
        fds = f"/proc/{proc.pid}/fd"
        fd = next(n for n in os.listdir(fds) if os.readlink(f"{fds}/{n}") == f"{path} (deleted)")
        if case.fixed:
            truncate = case.code("Fix", ": > /proc/<pid>/fd/<fd>", role="fix")
            case.shell(truncate.replace("<pid>", str(proc.pid)).replace("<fd>", fd))
        time.sleep(0.2)
        listed = case.shell(case.code("Verify", "lsof -nP +L1") + " 2>/dev/null")
        mine = [line for line in listed.splitlines() if str(path) in line]
        return "\n".join(mine) + "\n" if mine else "not listed\n"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the holder this scenario started
        proc.wait()


def passed(outputs: list[str]) -> bool:
    """The Verify: the file is gone from ``lsof -nP +L1`` or listed with size 0 (SIZE/OFF, column 7)."""
    for out in outputs:
        for line in out.splitlines():
            fields = line.split()
            if line != "not listed" and (len(fields) < 7 or fields[6] != "0"):
                return False
    return True
