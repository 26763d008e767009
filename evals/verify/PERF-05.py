"""PERF-05: debug settings left on. The entry's two checks in a launch script, before and after its Fix.

Failure: the launch script exports ``CUDA_LAUNCH_BLOCKING=1`` and ``NCCL_DEBUG=INFO`` and the training
script calls ``torch.autograd.set_detect_anomaly(True)`` (which prints no warning). Fix: the entry's
``unset`` line in the launch script, and its ``set_detect_anomaly(args.debug)`` with ``--debug`` not given.
The Verify is the entry's environment one-liner plus its ``torch.is_anomaly_enabled()`` print.
"""

from __future__ import annotations

import shlex
import sys

TIMEOUT = 120


def run(case) -> str:
    env_check = case.code("Verify", "no debug variables")
    anomaly_check = case.code("Verify", "is_anomaly_enabled")
    if case.fixed:
        unset = case.code("Fix", "unset CUDA_LAUNCH_BLOCKING", role="fix")
        anomaly_on = case.code("Fix", "set_detect_anomaly(args.debug)", role="fix")
    else:
        unset, anomaly_on = "", "torch.autograd.set_detect_anomaly(True)\n"
    train = case.tmp / "train.py"
    train.write_text("import argparse\nimport torch\n"
                     "args = argparse.Namespace(debug=False)   # --debug not given\n"
                     f"{anomaly_on}{anomaly_check}", encoding="utf-8")
    python = shlex.quote(sys.executable)
    launch = (f"export CUDA_LAUNCH_BLOCKING=1 NCCL_DEBUG=INFO\n{unset}"
              f"{env_check.replace('python -c', python + ' -c', 1)}"
              f"{python} {shlex.quote(str(train))}\n")
    return case.shell(launch)


def passed(outputs: list[str]) -> bool:
    return all("no debug variables" in out and "anomaly mode: False" in out for out in outputs)
