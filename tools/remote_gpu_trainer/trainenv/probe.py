"""The version probe: a standard-library script that the training interpreter runs in a child process.

Why a child and a script: the interpreter may be another Python version than ours, sees none of our packages,
and ``import torch`` can take seconds or hang on a broken CUDA install. The script prints one ``RGT-PROBE``
line per step as soon as the step is done, each step guarded, so a reading survives a later failure or a
timeout: torch's version is kept when ``torch.distributed`` fails to import, and a hung CUDA query still
leaves the versions read before it.

Modes: ``find`` only locates torch (``importlib.util.find_spec`` and the distribution's metadata, no import:
tens of milliseconds); ``import`` imports torch and ``torch.distributed``, asks CUDA for devices and NCCL for
its version; ``names`` adds each GPU's name (it creates a CUDA context).
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field

from .bounded import run_bounded

PREFIX = "RGT-PROBE "

PROBE_SCRIPT = r'''
import json, sys
def emit(step, **fields):
    sys.stdout.write("RGT-PROBE " + json.dumps(dict(step=step, **fields)) + "\n")
    sys.stdout.flush()
def failed(err):
    return "%s: %s" % (type(err).__name__, str(err).strip().splitlines()[-1][:400] if str(err).strip() else "")
mode = sys.argv[1] if len(sys.argv) > 1 else "find"
emit("python", version="%d.%d.%d" % sys.version_info[:3], executable=sys.executable, prefix=sys.prefix,
     base_prefix=getattr(sys, "base_prefix", sys.prefix))
found = False
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    found = spec is not None
    version = None
    if found:
        try:
            from importlib import metadata
            version = metadata.version("torch")
        except Exception:
            pass
    emit("find", found=found, location=(spec.origin if found else None), version=version)
except BaseException as err:
    emit("find", error=failed(err))
if mode == "find" or not found:
    sys.exit(0)
try:
    import torch
    emit("torch", version=getattr(torch, "__version__", None), location=getattr(torch, "__file__", None),
         cuda=getattr(getattr(torch, "version", None), "cuda", None))
except BaseException as err:
    emit("torch", error=failed(err))
    sys.exit(0)
try:
    import torch.distributed as dist
    available = bool(dist.is_available())
    emit("distributed", available=available,
         gloo=bool(available and getattr(dist, "is_gloo_available", lambda: False)()),
         nccl=bool(available and getattr(dist, "is_nccl_available", lambda: False)()))
except BaseException as err:
    emit("distributed", error=failed(err))
try:
    available = bool(torch.cuda.is_available())
    count = torch.cuda.device_count() if available else 0
    names = [torch.cuda.get_device_name(i) for i in range(count)] if mode == "names" else []
    emit("cuda", available=available, devices=count, names=names)
except BaseException as err:
    emit("cuda", error=failed(err))
try:
    if getattr(torch.version, "cuda", None):
        v = torch.cuda.nccl.version()
        emit("nccl", version=".".join(map(str, v)) if isinstance(v, tuple) else str(v))
except BaseException as err:
    emit("nccl", error=failed(err))
'''


@dataclass
class Reading:
    """What the probe printed, step by step, and what stopped it."""

    steps: dict[str, dict] = field(default_factory=dict)
    stopped: str | None = None
    """Why the probe did not finish: a timeout, a crash (with stderr's last line), or a python that would not start."""

    def value(self, step: str, key: str):
        return self.steps.get(step, {}).get(key)

    def errors(self) -> dict[str, str]:
        """step → its error, plus ``probe`` when the probe itself stopped."""
        found = {step: data["error"] for step, data in self.steps.items() if "error" in data}
        if self.stopped:
            found["probe"] = self.stopped
        return found


def next_step(reading: Reading, mode: str) -> str | None:
    """The step a probe that stopped was in (for "import torch did not finish in 60 s")."""
    order = ["python", "find"] + (["torch", "distributed", "cuda", "nccl"] if mode != "find" else [])
    return next((s for s in order if s not in reading.steps), None)


STEP_WORDS = {"python": "starting python", "find": "finding torch", "torch": "import torch",
              "distributed": "import torch.distributed", "cuda": "the CUDA device query", "nccl": "NCCL's version"}


def run_probe(python: str, environ: dict[str, str] | None = None, mode: str = "find",
              timeout_s: float = 60.0) -> Reading:
    """Run the probe under ``python`` with ``environ`` (default: ours). Never raises for the probe's own
    failures: they are in the reading."""
    reading = Reading()
    try:
        done = run_bounded([python, "-c", PROBE_SCRIPT, mode], timeout_s, environ, "/")
    except OSError as err:
        reading.stopped = f"{python} does not start: {err.strerror or err}"
        return reading
    _parse(done.out.decode("utf-8", "replace"), reading)
    if done.returncode is None:
        reading.stopped = f"{STEP_WORDS.get(next_step(reading, mode) or '', 'the probe')} did not finish in " \
                          f"{timeout_s:g} s"
    elif done.returncode != 0:
        last = (done.err.decode("utf-8", "replace").strip().splitlines() or [f"exit status {done.returncode}"])
        where = next_step(reading, mode)
        if where:  # died inside a step (a segfault in a CUDA query, an interpreter too old to run the script)
            reading.stopped = f"{STEP_WORDS[where]} ended the probe ({_status(done.returncode)}): {last[-1][:400]}"
    return reading


def _parse(out: str, reading: Reading) -> Reading:
    for line in out.splitlines():
        if line.startswith(PREFIX):
            try:
                data = json.loads(line[len(PREFIX):])
            except ValueError:
                continue
            reading.steps[data.pop("step")] = data
    return reading


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
