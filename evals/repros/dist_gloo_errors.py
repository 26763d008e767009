"""DIST-10, -11, -12, -13, -15, -26, -28 and PERF-08 on CPU: DDP and collective errors over gloo.

    python evals/repros/dist_gloo_errors.py [CASE...]

Each case starts its ranks as separate ``python`` processes (``init_process_group("gloo")`` over
a TCP store on a free local port, as ``python train.py`` per rank would), collects everything the
ranks print, and holds it against the entry's signatures. A rank prints its exception as the last
traceback line would read; the C++ warnings (PERF-08) come from the ranks' stderr. ``dist12_exit``
(rank 0 exits while rank 1 waits in a collective) is printed as a note, not checked: whether rank 1
reads "Connection closed by peer" or "Connection reset by peer" is a race.
"""

import datetime
import os
import socket
import subprocess
import sys

from _catalog_check import check, exception_text, first_line, note, summary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _net():
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 1)  # unused in forward when ``skip_b``

        def forward(self, x, skip_b=False):
            h = self.a(x)
            return h.sum() if skip_b else self.b(h).sum()

    return Net()


def rank_main(case: str, rank: int, world: int, port: int) -> None:
    """One rank of one case; everything it has to say goes to stdout/stderr."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if case == "dist26":
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(var, None)
        for call in (lambda: dist.init_process_group("gloo", init_method="env://"),
                     lambda: dist.all_reduce(torch.ones(1))):
            try:
                call()
            except Exception as exc:
                print(exception_text(exc), flush=True)
        return
    timeout = datetime.timedelta(seconds=5)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timeout)
    except Exception as exc:
        print(exception_text(exc), flush=True)
        return
    x = torch.ones(2, 4)
    try:
        if case == "dist10":
            model = DDP(_net())
            for _ in range(2):
                model(x, skip_b=True).backward()
        elif case == "perf08":
            model = DDP(_net(), find_unused_parameters=True)
            model(x).backward()
        elif case == "dist11":
            from torch.utils.checkpoint import checkpoint

            model = DDP(_net(), find_unused_parameters=True)
            # reentrant checkpointing of the whole forward, as HF's gradient_checkpointing_enable
            # did by default before transformers 4.35 (use_reentrant=True)
            out = checkpoint(model.module.a, x.requires_grad_(), use_reentrant=True)
            model(out).backward()
        elif case in ("dist12", "dist12_exit"):
            for _ in range(5 + rank):  # rank 1 has one batch more
                dist.all_reduce(torch.ones(1))
            if case == "dist12":
                dist.barrier()  # rank 0 goes on: the end-of-epoch barrier, a save, an evaluation
        elif case == "dist13":
            if rank == 0:
                dist.all_reduce(torch.ones(1))
            else:
                dist.broadcast(torch.ones(1), src=0)
        elif case == "dist15":
            DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(
                torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))))
        print(f"rank {rank}: completed", flush=True)
    except Exception as exc:
        print(exception_text(exc), flush=True)
    finally:
        dist.destroy_process_group()


#: case -> (entry, ranks started, world size, extra environment, what the check line shows)
CASES = {
    "dist10": ("DIST-10", 2, 2, {}, "Expected to have finished"),
    "perf08": ("PERF-08", 2, 2, {}, "find_unused_parameters=True was"),
    "dist11": ("DIST-11", 2, 2, {}, "Expected to mark"),
    "dist12": ("DIST-12", 2, 2, {}, "Timed out"),
    "dist12_exit": ("DIST-12", 2, 2, {}, "by peer"),  # a note: the text depends on a race
    "dist13": ("DIST-13", 2, 2, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "Detected mismatch"),
    "dist15": ("DIST-15", 1, 1, {}, "SyncBatchNorm"),
    "dist26": ("DIST-26", 1, 1, {}, "env://"),
    "dist28": ("DIST-28", 1, 2, {}, "clients joined"),
}


def run_case(case: str) -> None:
    entry_id, ranks, world, env, show = CASES[case]
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", case, str(r), str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, **env})
             for r in range(ranks)]
    text = "\n".join(p.communicate(timeout=120)[0] for p in procs)
    if case.endswith("_exit"):
        note(f"{case}, {ranks} of {world} ranks", first_line(text, show))
    else:
        check(entry_id, f"{case}, {ranks} of {world} ranks", text, show=show)
    if os.environ.get("REPRO_VERBOSE"):
        print(text)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        raise SystemExit(0)
    import torch

    print(f"torch {torch.__version__}, gloo on CPU")
    for name in sys.argv[1:] or CASES:
        run_case(name)
    raise SystemExit(summary())
