"""Worker for spot07_torchrun_signals.py: logs start, then waits; on SIGTERM or SIGUSR1 it writes
a marker file (standing in for the checkpoint save) and exits 0."""

import os
import signal
import sys
import time
from pathlib import Path

marker = Path(sys.argv[1])


def _save_and_exit(signum, frame):
    marker.write_text(f"saved on signal {signum}\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, _save_and_exit)
signal.signal(signal.SIGUSR1, _save_and_exit)
print(f"worker {os.getpid()} ready", flush=True)
time.sleep(120)
