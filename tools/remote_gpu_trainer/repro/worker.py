"""Child process: import torch once, run repro jobs, report each as one JSON line.

Run as ``python -m remote_gpu_trainer.repro.worker`` with a JSON request on stdin::

    {"jobs": [{"case": "fp16_unscale", "variant": "lora_clip"}, ...], "device": "auto", "timeout_s": 120}

Events on stdout, one JSON object per line: ``ready`` (torch version, resolved device, import
seconds), ``start`` and ``result`` per job, ``error`` (then exit 2) when the request cannot run.
File descriptor 1 is moved to stderr before any case runs, so a print or a C++ warning from torch
can never corrupt the protocol. The worker only *observes* (exception text, frame, measured
numbers); the server judges the observations against each variant's expectation.

Distributed jobs run first: their ranks are forked from this process, and forking after torch has
started its OpenMP thread pool hangs the child (libgomp), so no tensor op may run before them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from . import cases
from .base import Observed

TEST_HOOKS_ENV = "RGT_REPRO_TEST_HOOKS"
"""Set to 1 to enable the hidden ``_hang`` and ``_crash`` cases used by the timeout/crash tests."""


def _test_hook(case: str):
    """Hidden cases for tests only: never listed, never reachable through the tool's input model."""
    if os.environ.get(TEST_HOOKS_ENV) != "1" or case not in ("_hang", "_crash"):
        return None

    def run(variant: str, device: str) -> Observed:
        if case == "_hang":
            while True:
                time.sleep(1)
        import ctypes

        ctypes.string_at(0)  # a real segfault, like a crashing CUDA/C++ extension
        return Observed()

    return run


def _observe(function, variant: str, device: str) -> tuple[dict[str, Any], float]:
    from .frames import describe_exception

    start = time.perf_counter()
    try:
        observed = function(variant, device)
    except Exception as exc:
        observed = Observed(raised=describe_exception(exc))
    seconds = time.perf_counter() - start
    return {"raised": observed.raised.to_dict() if observed.raised else None, "symptom": observed.symptom,
            "detail": observed.detail, "metrics": observed.metrics, "ranks": observed.ranks}, seconds


def run_job(job: dict[str, Any], device: str, timeout_s: float) -> dict[str, Any]:
    hook = _test_hook(job["case"])
    process_group = None
    if hook is not None:
        bug = fix = hook
        distributed = False
    else:
        module = cases.case_module(job["case"])
        bug, fix, distributed = module.bug, module.fix, module.CASE.distributed
        if distributed:
            module.TIMEOUT_S = timeout_s * 0.45  # bug and fix share the limit; ranks report before the kill
            process_group = f"gloo, {module.WORLD} ranks on CPU"
    case_device = "cpu" if distributed else device  # the distributed cases run gloo ranks, never a GPU
    bug_seen, bug_s = _observe(bug, job["variant"], case_device)
    fix_seen, fix_s = _observe(fix, job["variant"], case_device)
    return {"case": job["case"], "variant": job["variant"], "device": case_device, "requested_device": device,
            "process_group": process_group, "bug": bug_seen,
            "bug_s": bug_s, "fix": fix_seen, "fix_s": fix_s}


def _is_distributed(job: dict[str, Any]) -> bool:
    return job["case"] in cases.CASE_NAMES and cases.case(job["case"]).distributed


def main() -> int:
    request = json.loads(sys.stdin.read())
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(event: str, **fields: Any) -> None:
        protocol.write(json.dumps({"event": event, **fields}) + "\n")
        protocol.flush()

    import warnings

    warnings.simplefilter("ignore")  # GradScaler/FSDP warnings would only bury a crash's stderr tail
    start = time.perf_counter()
    try:
        import torch
    except ImportError as exc:  # an environment fact, not a failed case: the server says how to add torch
        missing = isinstance(exc, ModuleNotFoundError) and (
            (exc.name or "").split(".")[0] == "torch" or "No module named 'torch'" in str(exc))
        emit("error", kind="torch_missing" if missing else "torch_broken", message=str(exc),
             python=sys.executable)
        return 2
    # Toy-sized tensors gain nothing from an OpenMP pool, and on a busy box its spin-waits cost 10-50x;
    # one thread also keeps a later fork safe (libgomp hangs a child forked after its pool started).
    torch.set_num_threads(1)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)])  # the first optimizer imports torch._dynamo (~1.3 s)
    jobs = list(enumerate(request["jobs"]))
    if any(_is_distributed(job) for _, job in jobs):
        import torch.distributed.fsdp  # before the fork, so the ranks inherit it
    requested = request.get("device", "auto")
    cuda = requested != "cpu" and torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        emit("error", field="device", message=f"cuda was requested but torch {torch.__version__} sees no CUDA "
                                              "device (torch.cuda.is_available() is False)")
        return 2
    device = "cuda" if cuda else "cpu"
    emit("ready", torch_version=torch.__version__, device=device, cuda_available=torch.cuda.is_available(),
         import_s=time.perf_counter() - start)
    for index, job in sorted(jobs, key=lambda item: not _is_distributed(item[1])):
        emit("start", index=index)
        emit("result", index=index, result=run_job(job, device, float(request.get("timeout_s", 120))))
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
