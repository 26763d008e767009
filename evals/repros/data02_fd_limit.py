"""DATA-02 on CPU: what a low file-descriptor limit prints with the default sharing strategy.

    python evals/repros/data02_fd_limit.py loader   # DataLoader, 2 workers, batches kept in a list
    python evals/repros/data02_fd_limit.py queue    # a raw torch.multiprocessing queue
    python evals/repros/data02_fd_limit.py loader file_system   # the fix: completes

The script lowers its own soft RLIMIT_NOFILE to 256 (like ``ulimit -n 256``) before it starts any
worker. Each tensor a worker sends is one open descriptor in this process while the tensor lives.
"""

import resource
import sys

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

LIMIT = 256


class Small(Dataset):
    """Many small tensors per sample: the shape that exhausts descriptors."""

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((4,), float(i)), "y": torch.tensor(i)}


def loader() -> None:
    kept = []
    for batch in DataLoader(Small(), batch_size=1, num_workers=2):
        kept.append(batch)  # every kept batch holds its shared-memory descriptors open
    print(f"completed: {len(kept)} batches kept")


def _produce(q, done, n: int) -> None:
    for i in range(n):
        q.put(torch.full((4,), float(i)))
    q.put(None)
    done.wait(120)  # stay alive: the receiver fetches each descriptor from this process


def queue() -> None:
    q, done = mp.Queue(), mp.Event()
    p = mp.Process(target=_produce, args=(q, done, 2000))
    p.start()
    kept = []
    try:
        while (t := q.get(timeout=20)) is not None:
            kept.append(t)
    except BaseException:
        p.kill()  # its feeder thread may block on a full pipe; the error is re-raised
        p.join()
        raise
    done.set()
    p.join()
    print(f"completed: {len(kept)} tensors kept")


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LIMIT, hard), hard))
    if len(sys.argv) > 2:
        torch.multiprocessing.set_sharing_strategy(sys.argv[2])
    print(f"torch {torch.__version__}, RLIMIT_NOFILE soft={LIMIT}, "
          f"sharing strategy {torch.multiprocessing.get_sharing_strategy()}", flush=True)
    {"loader": loader, "queue": queue}[sys.argv[1] if len(sys.argv) > 1 else "loader"]()
