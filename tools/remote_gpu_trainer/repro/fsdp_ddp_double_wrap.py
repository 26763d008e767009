"""fsdp_ddp_double_wrap: FSDP wrapped in DDP, and the FSDP1 + GradScaler pitfalls, on 2 real gloo ranks.

DDP verifies at construction that every rank holds the same parameter shapes; FSDP gives each rank
a different shard, so ``DDP(FSDP(model))`` fails there (``use_orig_params=True``) or, with padded
flat params of equal size, in the first backward. FSDP1 with a plain ``torch.amp.GradScaler`` meets
the single-process failures in sharded form: fp16 flat params (unscale FP16), a rank whose shard is
empty (no inf checks), ``keep_low_precision_grads`` with AdamW (dtype of ``end``).

Ranks are forked from the worker (which has torch and FSDP imported but has run no op yet, so no
OpenMP pool is copied) and talk over gloo through a FileStore in a temp dir: no ports, no CUDA.
The root-cause rank is the one whose exception matches the variant; its peers usually die in the
next collective with a gloo "Connection closed/reset by peer", which is reported per rank.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from datetime import timedelta
from typing import Any

from .base import Case, CatalogRef, Expect, Observed, Raised, Variant

WORLD = 2
TIMEOUT_S = 60.0
"""Per phase (bug or fix) for all ranks together; the worker lowers it to the request's timeout."""

FSDP_ENTRY = CatalogRef(file="references/training/distributed-launch.md", id="DIST-17")
SCALER_ENTRY = CatalogRef(file="references/training/distributed-launch.md", id="DIST-24")

CASE = Case(
    name="fsdp_ddp_double_wrap",
    title="FSDP wrapped in DDP; FSDP1 with a plain GradScaler",
    why="FSDP already shards and synchronises grads; DDP on top sees different shards per rank and fails its "
        "shape check or the first backward. FSDP1 needs ShardedGradScaler, which allows fp16 grads and "
        "all-reduces inf checks across ranks.",
    entry=FSDP_ENTRY,
    distributed=True,
    variants=(
        Variant(
            name="ddp_over_fsdp",
            summary="DDP(FSDP(model, use_orig_params=True)) on 2 ranks: DDP's construction-time shape check fails",
            expect=Expect(("RuntimeError",), r"appears not to match sizes of the same param in process 0"
                                             r"|DDP expects same model across all ranks"),
            fix="Use FSDP alone: it already reduce-scatters grads; never wrap an FSDP module in DDP "
                "(check that a trainer/accelerate does not wrap it again).",
            diff="""\
 model = FSDP(model, use_orig_params=True)
-model = DDP(model)
 opt = torch.optim.AdamW(model.parameters())""",
        ),
        Variant(
            name="ddp_over_fsdp_flat",
            summary="DDP(FSDP(model)) with flat params (use_orig_params=False): DDP's check passes, the first "
                    "backward fails on every rank",
            expect=Expect(("RuntimeError",), r"returned an invalid gradient at index \d+ - got \[\d+\] but expected"),
            fix="Use FSDP alone.",
            diff="""\
 model = FSDP(model)
-model = DDP(model)
 opt = torch.optim.AdamW(model.parameters())""",
        ),
        Variant(
            name="fsdp_half_plain_scaler",
            summary="model.half() wrapped in FSDP1, trained with a plain torch.amp.GradScaler",
            expect=Expect(("ValueError",), r"Attempting to unscale FP16 gradients"),
            fix="Keep fp32 sharded params with MixedPrecision(param_dtype=float16) and use ShardedGradScaler, "
                "which accepts fp16 grads and all-reduces found_inf so every rank skips the same steps.",
            diff="""\
-model = FSDP(build_model().half())
-scaler = torch.amp.GradScaler(device)
+model = FSDP(build_model(), mixed_precision=MixedPrecision(param_dtype=torch.float16,
+                                                           reduce_dtype=torch.float16))
+scaler = ShardedGradScaler(device)    # torch.distributed.fsdp.sharded_grad_scaler""",
            entry=SCALER_ENTRY,
        ),
        Variant(
            name="fsdp_empty_shard",
            summary="a separate optimizer for a tiny FSDP unit (1 element, fewer than ranks, use_orig_params=True) "
                    "with a plain GradScaler: rank 1's shard is empty",
            expect=Expect(("AssertionError",), r"No inf checks were recorded"),
            fix="Use ShardedGradScaler: it records an inf check for ranks without grads and all-reduces it.",
            diff="""\
 temperature = FSDP(Temperature(), use_orig_params=True)   # 1 element over 2 ranks
 opt = torch.optim.AdamW(temperature.parameters())
-scaler = torch.amp.GradScaler(device)
+scaler = ShardedGradScaler(device)""",
            entry=SCALER_ENTRY,
        ),
        Variant(
            name="fsdp_lowprec_adam",
            summary="FSDP1 MixedPrecision(bfloat16, keep_low_precision_grads=True) with stock AdamW",
            expect=Expect(("RuntimeError",), r"expected dtype \w+ for `end` but got dtype"),
            fix="keep_low_precision_grads=False with stock torch.optim (the option is meant for optimizers "
                "that run in low precision).",
            diff="""\
 mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
-                    keep_low_precision_grads=True)
+                    keep_low_precision_grads=False)
 model = FSDP(model, mixed_precision=mp)
 opt = torch.optim.AdamW(model.parameters())""",
            entry=CatalogRef(file="references/training/distributed-launch.md", id="DIST-23"),
        ),
        Variant(
            name="fsdp_opt_before_wrap",
            summary="optimizer built before FSDP wrapping: FSDP replaced the params with FlatParameters",
            expect=Expect(("AssertionError",), r"No inf checks were recorded"),
            fix="Build the optimizer from the FSDP-wrapped module's parameters, after wrapping.",
            diff="""\
-opt = torch.optim.AdamW(model.parameters())
 model = FSDP(model)
+opt = torch.optim.AdamW(model.parameters())""",
            entry=CatalogRef(file="references/training/distributed-launch.md", id="DIST-25"),
        ),
    ),
)


def _train(model, opt, scaler, x, y, steps: int = 3) -> str:
    import torch

    from . import toy

    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = toy.mse(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
    if not all(torch.isfinite(torch.tensor(losses))):
        raise FloatingPointError(f"non-finite loss: {losses}")
    scale = f", scale {scaler.get_scale():g}" if scaler is not None else ""
    return f"{steps} steps, {toy.losses_summary(losses)}{scale}"


def _rank_run(variant: str, fixed: bool, rank: int) -> str:
    """One rank's training code for ``variant``; its exception is the rank's outcome."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.nn.parallel import DistributedDataParallel as DDP

    from . import toy

    cpu = torch.device("cpu")
    model = toy.mlp("cpu")
    torch.manual_seed(100 + rank)  # each rank its own data, as a DistributedSampler would give
    x, y = torch.randn(toy.BATCH, toy.IN), torch.randn(toy.BATCH, toy.OUT)
    if variant in ("ddp_over_fsdp", "ddp_over_fsdp_flat"):
        wrapped = FSDP(model, device_id=cpu, use_orig_params=variant == "ddp_over_fsdp")
        if not fixed:
            wrapped = DDP(wrapped)
        return _train(wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-2), None, x, y)
    if variant == "fsdp_half_plain_scaler":
        if fixed:
            policy = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16)
            wrapped = FSDP(model, device_id=cpu, mixed_precision=policy)
            scaler = ShardedGradScaler("cpu")
        else:
            wrapped = FSDP(model.half(), device_id=cpu)
            scaler = torch.amp.GradScaler("cpu")
            x = x.half()
        return _train(wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-2), scaler, x, y)
    if variant == "fsdp_empty_shard":
        toy.seed()
        temperature = FSDP(nn.Linear(1, 1, bias=False), device_id=cpu, use_orig_params=True)
        scaler = ShardedGradScaler("cpu") if fixed else torch.amp.GradScaler("cpu")
        opt = torch.optim.AdamW(temperature.parameters(), lr=1e-2)
        return _train(temperature, opt, scaler, x[:, :1], y[:, :1])
    if variant == "fsdp_lowprec_adam":
        policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                keep_low_precision_grads=not fixed)
        wrapped = FSDP(model, device_id=cpu, mixed_precision=policy)
        return _train(wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-2), None, x, y)
    if variant == "fsdp_opt_before_wrap":
        if fixed:
            wrapped = FSDP(model, device_id=cpu)
            opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            wrapped = FSDP(model, device_id=cpu)
        return _train(wrapped, opt, torch.amp.GradScaler("cpu"), x, y)
    raise KeyError(variant)


def _rank_entry(variant: str, fixed: bool, rank: int, store_path: str, conn, pg_timeout_s: float) -> None:
    """Child process body: join the group, run, send one outcome dict (before teardown, which may hang)."""
    import warnings

    import torch.distributed as dist

    from .frames import describe_exception

    warnings.simplefilter("ignore")
    outcome: dict[str, Any] = {"rank": rank}
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=pg_timeout_s))
        outcome["detail"] = _rank_run(variant, fixed, rank)
    except BaseException as exc:
        outcome["raised"] = describe_exception(exc, rank).to_dict()
    conn.send(outcome)
    conn.close()
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _context():
    """fork: the ranks inherit the imported torch (ms instead of seconds); spawn where fork is missing."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def launch(variant: str, fixed: bool, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Run ``variant`` on WORLD ranks; one outcome dict per rank (``detail`` or ``raised`` or ``exit``)."""
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    ctx = _context()
    with tempfile.TemporaryDirectory(prefix="rgt-repro-") as tmp:
        store = os.path.join(tmp, "store")
        pipes = [ctx.Pipe(duplex=False) for _ in range(WORLD)]
        procs = [ctx.Process(target=_rank_entry, daemon=True,
                             args=(variant, fixed, rank, store, pipes[rank][1], max(1.0, min(30.0, timeout_s))))
                 for rank in range(WORLD)]
        for proc in procs:
            proc.start()
        for _, send in pipes:
            send.close()
        deadline = time.monotonic() + timeout_s
        outcomes = []
        for rank, (proc, (recv, _)) in enumerate(zip(procs, pipes, strict=True)):
            outcome: dict[str, Any] = {"rank": rank}
            if recv.poll(max(0.0, deadline - time.monotonic())):
                try:
                    outcome = recv.recv()
                except EOFError:  # died before sending
                    pass
            proc.join(max(0.0, min(5.0, deadline - time.monotonic())))
            if proc.is_alive():
                proc.kill()
                proc.join()
                outcome.setdefault("exit", f"killed after {timeout_s:g} s")
            elif "detail" not in outcome and "raised" not in outcome:
                outcome["exit"] = f"exited with code {proc.exitcode} without reporting"
            outcomes.append(outcome)
    return outcomes


def _observed(variant: str, outcomes: list[dict[str, Any]]) -> Observed:
    """Pick the root-cause rank: the one whose error matches the variant, else the first that raised."""
    expect = CASE.variant(variant).expect
    raised = [Raised(**o["raised"]) for o in outcomes if "raised" in o]
    root = next((r for r in raised if expect and expect.matches(r.type, r.message)), raised[0] if raised else None)
    parts = []
    for o in outcomes:
        if "raised" in o:
            parts.append(f"rank {o['rank']}: {o['raised']['type']}")
        else:
            parts.append(f"rank {o['rank']}: {o.get('detail') or o.get('exit')}")
    failed = [o for o in outcomes if "detail" not in o]
    return Observed(symptom=bool(failed) and root is None, detail="; ".join(parts), raised=root,
                    ranks=outcomes, metrics={"world_size": WORLD, "ranks_failed": len(failed)})


def bug(variant: str, device: str) -> Observed:
    return _observed(variant, launch(variant, fixed=False))


def fix(variant: str, device: str) -> Observed:
    return _observed(variant, launch(variant, fixed=True))
