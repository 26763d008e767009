"""SPOT-06: a process killed with SIGKILL while it writes a checkpoint straight to its final name (a
truncated ``step_000002.pt`` is left) vs one that writes with the Fix's ``atomic_save`` (only a temp
file is left; ``step_000001.pt`` stays the newest complete one). The Verify is the entry's one-liner
that loads every checkpoint with a final name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SAVER = '''
import os, sys, torch
{save_fn}
os.makedirs("ckpt", exist_ok=True)
save(torch.nn.Linear(4, 4).state_dict(), "ckpt/step_000001.pt")
print("step 1 saved", flush=True)
save({{"big": torch.ones(96 * 2**20 // 4)}}, "ckpt/step_000002.pt")   # 96 MiB: long enough to be cut
print("step 2 saved", flush=True)
'''
PLAIN = "def save(obj, path):\n    torch.save(obj, path)\n"


def run(case) -> str:
    if case.fixed:
        save_fn = case.code("Fix", "def atomic_save(obj, path):", role="fix") + "save = atomic_save\n"
    else:
        save_fn = PLAIN
    script = case.tmp / "saver.py"
    script.write_text(SAVER.format(save_fn=save_fn))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=case.tmp, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "step 1 saved"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the second save has started writing
            if any(p.stat().st_size > 2**20 for p in Path(case.tmp, "ckpt").glob("step_000002*")):
                break
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # the kill -KILL of the Verify, mid-save
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = sorted(p.name for p in Path(case.tmp, "ckpt").iterdir())
    return f"left: {left}\n" + case.python_c(case.code("Verify", "glob.glob('ckpt/step_*.pt')"))


def passed(outputs: list[str]) -> bool:
    return all("every checkpoint with a final name loads" in out for out in outputs)
