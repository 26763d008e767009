"""DATA-04's interpreter half: what each Python prints when a worker's arguments cannot be pickled.

    python3.X evals/repros/pickle_errors.py

Standard library only, so it runs under every Python on the machine (tests/test_repro_pythons.py runs
it under each one it finds): ``pickle.dumps`` of a lambda and of a function defined inside another, and
a ``multiprocessing`` ``spawn`` Process started with each and with a dataset holding a lock or an open
file (what a DataLoader worker start sends). Every text is held against DATA-04's signatures with the
catalog parser; a wording no signature matches fails.
"""

import multiprocessing
import pickle
import sys
import threading

from _catalog_check import check, raised, summary

LAMBDA = lambda batch: batch  # noqa: E731 - the module-level lambda users pass as collate_fn


class HoldsLock:
    """A dataset that keeps a lock (or a connection) it made in ``__init__``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


class HoldsFile:
    """A dataset that opens its file in ``__init__`` instead of in the worker."""

    def __init__(self) -> None:
        self.f = open(__file__)  # noqa: SIM115 - held open on purpose: that is the case


def main() -> None:
    def collate(batch):  # a function defined inside a function: pickled by a name that does not resolve
        return batch

    spawn = multiprocessing.get_context("spawn")
    for name, fn in (("lambda", LAMBDA), ("local function", collate)):
        check("DATA-04", f"pickle.dumps({name})", raised(lambda fn=fn: pickle.dumps(fn)))
        check("DATA-04", f"spawn Process({name})",
              raised(lambda fn=fn: spawn.Process(target=fn, args=(1,)).start()))
    for name, dataset in (("dataset with a lock", HoldsLock), ("dataset with a file", HoldsFile)):
        check("DATA-04", f"spawn Process({name})",
              raised(lambda dataset=dataset: spawn.Process(target=print, args=(dataset(),)).start()))


if __name__ == "__main__":
    print(f"python {sys.version.split()[0]}")
    main()
    raise SystemExit(summary())
