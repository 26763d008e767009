"""GPU-side checks of claims issue 29 changed but could only read or reason about on CPU.

    python evals/verify/_gpu_checks.py            # on a box with an NVIDIA GPU; prints one line per check
    torchrun --standalone --nproc-per-node 1 evals/verify/_gpu_checks.py --nccl   # DIST-06's NCCL path

Not a scenario (the catalog check never runs it): the lead's GPU script runs it. Each line is
``[PASS|FAIL|INFO] ENTRY what: evidence``; the exit status is 1 when a check fails.

- GOT-14: ``torch.version.cuda`` against the driver's CUDA (NVML ``nvmlSystemGetCudaDriverVersion``):
  CUDA works and the wheel's CUDA major is not above the driver's (the entry's corrected Verify).
- NODE-05: what NVML's fabric query says on this GPU (Hopper and newer answer; older ones are
  NOT_SUPPORTED) — the entry now says the state exists only on Hopper and newer.
- AMP-01: the Fix's fp16 AMP step (fp32 trainable parameters, ``autocast("cuda")``, GradScaler) runs
  and the scaler is enabled on CUDA.
- AMP-16: the precision a fresh process runs with is ``highest`` and the Fix's call makes it ``high``.
- DIST-06 (``--nccl``): the entry's ``report_shards`` runs under NCCL (its all-reduce tensor on CUDA).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

failures = 0


def line(ok: bool | None, entry: str, what: str, evidence: str) -> None:
    global failures
    tag = "INFO" if ok is None else "PASS" if ok else "FAIL"
    failures += ok is False
    print(f"[{tag}] {entry} {what}: {evidence}", flush=True)


def snippet(entry_id: str, field: str, contains: str) -> str:
    from remote_gpu_trainer.catalog import code_blocks, entry

    text = getattr(entry(entry_id), field)
    [code] = [c for _, c in code_blocks(text) if contains in c]
    return code


def got14() -> None:
    import pynvml
    import torch

    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetCudaDriverVersion()  # 1000 * major + 10 * minor
    wheel = torch.version.cuda or "none"
    ok = torch.cuda.is_available() and wheel != "none" and int(wheel.split(".")[0]) <= driver // 1000
    line(ok, "GOT-14", "wheel CUDA major <= driver CUDA major and CUDA available",
         f"torch {torch.__version__} cuda {wheel}, driver CUDA {driver // 1000}.{driver % 1000 // 10}, "
         f"available {torch.cuda.is_available()}")


def node05() -> None:
    import ctypes

    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    cap = torch.cuda.get_device_capability(0)
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    info.version = pynvml.nvmlGpuFabricInfo_v2
    try:
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        said = f"state {info.state}, status {info.status}"
    except pynvml.NVMLError as err:
        said = f"NVML error: {err}"
    line(None, "NODE-05", "fabric query", f"{torch.cuda.get_device_name(0)} (sm_{cap[0]}{cap[1]}): {said}")


def amp01() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)).cuda().half()
    namespace = {"model": model, "torch": torch}
    exec(snippet("AMP-01", "fix", "p.data = p.data.float()"), namespace)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = snippet("AMP-01", "fix", 'GradScaler("cuda")').replace("model(**batch).loss", "model(x).float().sum()")
    namespace.update(optimizer=optimizer, x=torch.randn(4, 16, device="cuda"))
    exec(step, namespace)
    scaler = namespace["scaler"]
    line(scaler.is_enabled(), "AMP-01", "the Fix's fp16 step on CUDA", f"scaler enabled {scaler.is_enabled()}, "
         f"scale {scaler.get_scale()}")


def amp16() -> None:
    import torch

    before = torch.get_float32_matmul_precision()
    exec(snippet("AMP-16", "fix", 'set_float32_matmul_precision("high")'), {"torch": torch})
    after = torch.get_float32_matmul_precision()
    line(before == "highest" and after == "high", "AMP-16", "precision before/after the Fix", f"{before} -> {after}")


def dist06_nccl() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    namespace: dict = {}
    exec(snippet("DIST-06", "fix", "def report_shards"), namespace)
    model = torch.nn.Linear(64, 64).cuda()
    full = namespace["param_bytes"](model)
    from contextlib import redirect_stdout
    from io import StringIO

    buf = StringIO()
    with redirect_stdout(buf):
        namespace["report_shards"](model, full)
    dist.destroy_process_group()
    line("ratio 1.000" in buf.getvalue(), "DIST-06", "report_shards under NCCL, world 1", buf.getvalue().strip())


if __name__ == "__main__":
    checks = [dist06_nccl] if "--nccl" in sys.argv else [got14, node05, amp01, amp16]
    for check in checks:
        try:
            check()
        except Exception as exc:  # one broken check must not hide the others
            line(False, check.__name__.upper(), "raised", f"{type(exc).__name__}: {exc}")
    raise SystemExit(1 if failures else 0)
