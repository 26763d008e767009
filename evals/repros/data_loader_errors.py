"""DATA-01, -04, -09, -11, -12, -13, -19 and GOT-04 on CPU: what the DataLoader prints.

    python evals/repros/data_loader_errors.py

Each case builds a tiny dataset that fails the way the entry describes (a worker that exits, one
that crashes in native code, one killed by SIGKILL as the OOM killer would, a lambda under
``spawn``, a slow sample, samples of two sizes, a ``None`` sample) and holds the exact text —
exception, warning, or the worker's stderr — against the entry's signatures.
"""

import contextlib
import io
import os
import signal
import sys
import time
import warnings

import torch
from _catalog_check import check, note, raised, summary
from torch.utils.data import DataLoader, Dataset


class Failing(Dataset):
    """Sample 3 fails in the worker: ``exit`` calls os._exit(1), ``segv``/``kill`` send a signal."""

    def __init__(self, how: str = "", delay: float = 0.0) -> None:
        self.how, self.delay = how, delay

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        if i == 3 and self.how == "exit":
            os._exit(1)
        if i == 3 and self.how in ("segv", "kill"):
            os.kill(os.getpid(), signal.SIGSEGV if self.how == "segv" else signal.SIGKILL)
            time.sleep(5)
        if self.how == "sizes":
            return torch.zeros(3, 224 + 32 * (i % 2), 224)
        if self.how == "none":
            return None if i == 1 else torch.zeros(2)
        return torch.zeros(2)


@contextlib.contextmanager
def captured_fd2():
    """The C-level stderr of this process and its forked workers (the SIGSEGV handler writes there)."""
    buf = io.StringIO()
    sys.stderr.flush()
    saved = os.dup(2)
    r, w = os.pipe()
    os.dup2(w, 2)
    os.close(w)
    try:
        yield buf
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        with os.fdopen(r) as f:
            buf.write(f.read())


def run(loader: DataLoader) -> str:
    """What iterating ``loader`` to the end raised (``(no exception)`` when nothing did)."""
    return raised(lambda: [None for _ in loader])


def data01_got04() -> None:
    check("DATA-01", "worker calls os._exit(1)", run(DataLoader(Failing("exit"), num_workers=2)))
    with captured_fd2() as err:
        text = run(DataLoader(Failing("segv"), num_workers=2))
    check("DATA-01", "worker gets SIGSEGV", err.getvalue() + "\n" + text, show="segmentation")
    note("... and then", text)
    check("GOT-04", "worker gets SIGKILL", run(DataLoader(Failing("kill"), num_workers=2)))


def collate_in_main(batch):  # a function defined in a function: not picklable
    return batch


def data04() -> None:
    def collate(batch):
        return batch

    spawn = {"num_workers": 1, "multiprocessing_context": "spawn"}
    for case, fn in (("lambda collate_fn, spawn", lambda b: b), ("local collate_fn, spawn", collate)):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            text = run(DataLoader(Failing(), collate_fn=fn, **spawn))
        warned = "\n".join(str(w.message) for w in got if "pickle" in str(w.message))
        check("DATA-04", case, text)
        check("DATA-04", case.replace("collate_fn", "warning"), warned)
    note("fork, same lambda", run(DataLoader(Failing(), collate_fn=lambda b: b, num_workers=1,
                                             multiprocessing_context="fork")))


def data09() -> None:
    n = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) + 2
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        it = iter(DataLoader(Failing(), num_workers=n))
        del it
    check("DATA-09", f"{n} workers", "\n".join(str(w.message) for w in got))


def data11() -> None:
    check("DATA-11", "timeout=1, 3 s sample", run(DataLoader(Failing(delay=3), num_workers=1, timeout=1)))


def data12() -> None:
    check("DATA-12", "two image sizes", run(DataLoader(Failing("sizes"), batch_size=2)))


def data13() -> None:
    check("DATA-13", "a None sample, batch 2", run(DataLoader(Failing("none"), batch_size=2)))
    check("DATA-13", "... the None first", run(DataLoader(Failing("none"), batch_size=2, sampler=[1, 0])))


def data19() -> None:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        run(DataLoader(Failing(), pin_memory=True))
    check("DATA-19", "pin_memory=True, no GPU", "\n".join(str(w.message) for w in got))
    check("DATA-19", "persistent_workers, 0 workers", raised(lambda: DataLoader(Failing(), persistent_workers=True)))


if __name__ == "__main__":
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    data01_got04()
    data04()
    data09()
    data11()
    data12()
    data13()
    data19()
    raise SystemExit(summary())
