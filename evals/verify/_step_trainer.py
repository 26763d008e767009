"""A training loop for the signal scenarios (SPOT-01): one gloo rank or torchrun's ranks, a "step" every
0.2 s, and the stop handling that a file given as argv[1] holds (an entry's Fix, run as written).

    python _step_trainer.py [handler.py]          # RANK/WORLD_SIZE/MASTER_* from torchrun or the caller

Without a handler file the loop just trains until a signal ends it. ``save_checkpoint`` writes
``ckpt/last.pt`` atomically (rank 0) and every rank logs the step it stopped at.
"""

import itertools
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
device = "cpu"


def _batches():
    for step in itertools.count(1):
        print(f"rank {rank} step {step}", flush=True)
        yield step, None


loader = _batches()


def train_step(batch) -> None:
    time.sleep(0.2)


def save_checkpoint(step: int) -> None:
    if rank == 0:
        os.makedirs("ckpt", exist_ok=True)
        torch.save({"step": step}, "ckpt/last.pt.tmp")
        os.replace("ckpt/last.pt.tmp", "ckpt/last.pt")
    print(f"rank {rank} stopped at step {step}", flush=True)


loop = "for step, batch in loader:\n    train_step(batch)\n"
exec(Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else loop)
dist.destroy_process_group()
