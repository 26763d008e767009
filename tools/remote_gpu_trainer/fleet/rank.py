"""One rank of the fleet all-reduce: ``python -m torch.distributed.run … -m remote_gpu_trainer.fleet.rank``.

It runs under the training interpreter (trainenv/child.py), so it imports only the standard library and torch.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

MIB = 1 << 20


def _sizes(max_bytes: int) -> list[int]:
    sizes, size = [], MIB
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def worker_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--pg-timeout-s", type=float, default=60)
    opts = parser.parse_args(argv)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    out = Path(opts.out)
    (out / f"rank-{local_rank}.started").write_text(json.dumps({"rank": rank, "pid": os.getpid()}))
    try:
        import datetime

        import torch
        import torch.distributed as dist

        device = torch.device("cuda", local_rank) if opts.backend == "nccl" else torch.device("cpu")
        if opts.backend == "nccl":
            torch.cuda.set_device(device)
        dist.init_process_group(opts.backend, timeout=datetime.timedelta(seconds=opts.pg_timeout_s))

        def sync() -> None:
            if opts.backend == "nccl":
                torch.cuda.synchronize(device)

        rows = []
        for size in _sizes(opts.max_bytes):
            tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
            dist.all_reduce(tensor)  # warm-up: connections and buffers for this size
            sync()
            dist.barrier()
            started = time.perf_counter()
            for _ in range(opts.iters):
                dist.all_reduce(tensor)
            sync()
            elapsed = torch.tensor([(time.perf_counter() - started) / opts.iters], dtype=torch.float64,
                                   device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace, as in nccl-tests
            rows.append({"size_bytes": size, "time_s": float(elapsed.item())})
        world = dist.get_world_size()
        dist.destroy_process_group()
        (out / f"rank-{local_rank}.json").write_text(json.dumps({"rank": rank, "world": world, "rows": rows}))
    except BaseException as err:
        (out / f"rank-{local_rank}.error").write_text(f"{type(err).__name__}: {err}"[:2000])
        raise



if __name__ == "__main__":
    worker_main()
