"""SPOT-06: a process killed with SIGKILL while it writes a checkpoint straight to its final name (a
truncated ``step_000002.pt`` is left) vs one that writes with the Fix's ``atomic_save`` (only a temp
file is left; ``step_000001.pt`` stays the newest complete one). The second save is made to stop
half-way, so the kill lands mid-write on any disk. The Verify is the entry's one-liner that loads every
checkpoint with a final name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

SAVER = '''
import io, os, sys, time, torch
{save_fn}
os.makedirs("ckpt", exist_ok=True)
save(torch.nn.Linear(4, 4).state_dict(), "ckpt/step_000001.pt")
print("step 1 saved", flush=True)
_save = torch.save


def _interrupted_save(obj, f):
    # The second save stops half-way, so that the SIGKILL lands mid-write every time, whatever the disk speed.
    buf = io.BytesIO()
    _save(obj, buf)
    out = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
    out.write(buf.getvalue()[: len(buf.getvalue()) // 2])
    out.flush()
    print("half written", flush=True)
    time.sleep(60)


torch.save = _interrupted_save
save({{"big": torch.ones(1 << 18)}}, "ckpt/step_000002.pt")
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
        proc.stdout.readline()  # "half written": the second save is under way
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
