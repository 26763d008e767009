"""Helper processes of a training job, and whether one was left behind by a job that died.

A rank's DataLoader workers, multiprocessing children and torchrun's ranks only exist for a parent: when that
parent dies (``kill -9`` on the rank, torchrun killed, the ssh session gone), a worker that is stuck (in a
``__getitem__`` on a dead NFS mount, a hung decode) is re-parented to PID 1 or a subreaper and keeps its memory.
How they are recognised, from what the kernel shows:

* **DataLoader worker**: torch names the worker's main thread ``pt_data_worker``, which is the process name
  (``/proc/<pid>/comm``) of a worker process (torch/utils/data/_utils/worker.py, ``_set_thread_name``).
* **multiprocessing child**: the command line of a ``spawn``/``forkserver`` child
  (``--multiprocessing-fork``, ``spawn_main``, ``forkserver``, ``resource_tracker``).
* **torchrun rank**: ``TORCHELASTIC_RUN_ID`` in its environment (torchrun sets it for the ranks it starts).

A main training process (``python train.py``, detached on purpose with nohup) is none of these, so it is never
called a left-behind worker, whatever its parent. Nor is a helper of ours (``RGT_HELPER``): the warm health daemon
an ``rgt health`` inside a rank starts outlives the rank by design, with the rank's environment.
"""

from __future__ import annotations

from .snapshot import HELPER_ENV, ProcInfo, read_environ

_MP_MARKS = ("--multiprocessing-fork", "from multiprocessing.spawn import spawn_main",
             "from multiprocessing.forkserver import main", "multiprocessing.resource_tracker")


def worker_kind(info: ProcInfo) -> str | None:
    """``DataLoader worker``, ``multiprocessing child`` or ``torchrun rank``; None for anything else."""
    if info.name == "pt_data_worker":
        return "DataLoader worker"
    command = " ".join(info.cmdline)
    if any(mark in command for mark in _MP_MARKS):
        return "multiprocessing child"
    environ = read_environ(info.pid, ("TORCHELASTIC_RUN_ID", HELPER_ENV))
    if "TORCHELASTIC_RUN_ID" in environ and HELPER_ENV not in environ:
        return "torchrun rank"
    return None


def is_run_supervisor(info: ProcInfo | None) -> bool:
    """Our run supervisor: a subreaper, so a job's orphans are re-parented to it while it watches the run."""
    return info is not None and "remote_gpu_trainer.runs.supervisor" in info.cmdline
