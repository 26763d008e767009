"""Hang forensics inside every Python process of a supervised run (copied into the run folder).

The run supervisor puts the folder holding this file first on ``PYTHONPATH`` and sets
``RGT_STACKS_DIR`` and ``RGT_STACKS_SIGNAL``, so every Python process the run starts (torchrun, each
rank, spawned helpers) imports it at start-up, and DataLoader workers forked from a rank re-arm it in
``os.register_at_fork``. It does three small things and nothing else:

1. **Stacks on a signal.** ``faulthandler.register(RGT_STACKS_SIGNAL, all_threads=True)`` writing to
   ``$RGT_STACKS_DIR/<pid>.txt``, whose first line is a ``#rgt {json}`` record (pid, start ticks,
   main thread id, RANK/LOCAL_RANK/WORLD_SIZE, whether it is a forked child). faulthandler's handler
   is C code that needs no GIL and no Python bytecode to run, so it answers while the main thread is
   blocked inside a collective or holds the GIL, and the process carries on afterwards.
   ``runs/stacks.py`` reads ``/proc/<pid>/status`` (SigCgt) before it ever sends the signal, so a
   process without this handler is never signalled (a real-time signal's default action kills).
2. **Flight recorder dumps** when ``RGT_FR_DIR`` is set (``run_start(flight_recorder=true)``): in each
   rank (a process with ``RANK``), a daemon thread that checks ``$RGT_FR_DIR/request`` twice a second
   and, when the supervisor touches it, writes torch's JSON flight-recorder dump to
   ``rank<R>-stall.json``; and the same at interpreter exit as ``rank<R>-exit.json`` (a collective
   timeout ends a gloo rank with an exception, and torch writes no dump of its own for gloo).
3. **Chains to the sitecustomize it shadows** (a distribution's or the user's), imported from the
   rest of ``sys.path`` exactly as ``site`` would have, and takes its own folder off ``sys.path``.

It must run on whatever Python the user trains with, so it uses only the standard library and
syntax that Python 3.8 accepts, and it never raises: a failure costs the forensics, never the run.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _start_ticks():
    try:
        with open("/proc/self/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _arm_stacks(folder, signum, forked):
    import atexit
    import faulthandler
    import json
    import threading

    record = {"pid": os.getpid(), "ppid": os.getppid(), "start_ticks": _start_ticks(), "forked": forked,
              "main_thread": f"0x{threading.main_thread().ident:016x}", "argv0": (sys.argv or [""])[0][-200:]}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        if name in os.environ:
            record[name.lower()] = os.environ[name]
    path = os.path.join(folder, f"{os.getpid()}.txt")
    handle = open(path, "a")  # noqa: SIM115 (faulthandler keeps it open)
    # Handler first, record second: a sampler signals only a pid whose record it has read, so once the
    # record is there the handler writes here (a forked child until now still had its parent's file).
    faulthandler.register(signum, file=handle, all_threads=True, chain=False)
    handle.write("#rgt " + json.dumps(record) + "\n")
    handle.flush()
    atexit.register(_drop_if_unused, path, os.getpid(), handle.tell())


def _drop_if_unused(path, pid, size):
    """At exit, remove the file when it holds only the record (no dump was ever asked for), so short-lived
    processes leave nothing behind. A forked child inherits this call; the pid check keeps it off the
    parent's file."""
    try:
        if os.getpid() == pid and os.path.getsize(path) == size:
            os.remove(path)
    except OSError:
        pass


def _fr_dump(folder, why):
    """torch's JSON flight-recorder dump of this rank, written whole (temporary file, then rename)."""
    if "torch.distributed" not in sys.modules:
        return
    try:
        import torch._C._distributed_c10d as c10d

        data = _nccl_dump(c10d) or c10d._dump_fr_trace_json()
        path = os.path.join(folder, f"rank{os.environ.get('RANK', 'x')}-{why}.json")
        with open(path + ".tmp", "wb") as handle:
            handle.write(data)
        os.replace(path + ".tmp", path)
    except Exception:
        pass


def _nccl_dump(c10d):
    """NCCL process groups record into their own flight recorder (CUDA builds only, ``_dump_nccl_trace_json``);
    the generic dump then holds no entries. The NCCL one when it has entries, else None."""
    dump = getattr(c10d, "_dump_nccl_trace_json", None)
    if dump is None:
        return None
    try:
        data = dump()
        data = data.encode() if isinstance(data, str) else data
        return data if b'"entries"' in data else None
    except Exception:
        return None


def _fr_watch(folder):
    import time

    request = os.path.join(folder, "request")

    def stamp():
        try:
            return os.stat(request).st_mtime_ns
        except OSError:
            return None

    seen = stamp()
    while True:
        time.sleep(0.5)
        now = stamp()
        if now is not None and now != seen:
            seen = now
            _fr_dump(folder, "stall")


def _arm_flight_recorder(folder):
    import atexit
    import threading

    atexit.register(_fr_dump, folder, "exit")
    threading.Thread(target=_fr_watch, args=(folder,), name="rgt-flight-recorder", daemon=True).start()


def _arm():
    folder = os.environ.get("RGT_STACKS_DIR")
    signum = os.environ.get("RGT_STACKS_SIGNAL", "")
    if folder and signum.isdigit():

        def arm(forked):
            try:
                _arm_stacks(folder, int(signum), forked)
            except Exception:
                pass

        arm(False)
        os.register_at_fork(after_in_child=lambda: arm(True))
    fr_folder = os.environ.get("RGT_FR_DIR")
    if fr_folder and "RANK" in os.environ:
        try:
            _arm_flight_recorder(fr_folder)
        except Exception:
            pass


def _chain():
    """Import the sitecustomize this one shadows, as ``site`` would (errors reported, not raised)."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the next one on sys.path, if any)
    except ImportError as err:
        if err.name != "sitecustomize":
            _report(err)
        if mine is not None:
            sys.modules["sitecustomize"] = mine
    except Exception as err:
        _report(err)


def _report(err):
    sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}\n")


_arm()
_chain()
