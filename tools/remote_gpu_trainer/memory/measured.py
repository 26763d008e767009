"""Measured mode: a real training step under ``FakeTensorMode`` with torch's memory trackers.

The model is the real Hugging Face class (``hf_models``: ``from_config`` on the meta device, HF's
gradient checkpointing, PEFT's LoRA) when transformers can be imported and the model comes from a
config.json or preset, else the built-in re-implementation (``torch_models``); the result says which
class ran and why. It is materialised as fake tensors, so even a 70B step allocates nothing; torch's
``MemTracker`` (single replica) or ``FSDPMemTracker`` (FSDP2 ``fully_shard`` over a fake process group of
any world size) counts the bytes of every tensor the step creates. Two iterations run because the
optimizer state appears at the first ``optimizer.step()``; the peak covers both.

The step runs as CUDA runs it where that changes what is kept (``cuda_emulation``: the SDPA kernel
torch picks on the GPU, fused dropout's 1-byte mask, CUDA autocast's fp32 ops, Hugging Face's mask
creation). What a CPU step still cannot show is listed in ``cuda_emulation.CANNOT_SHOW``; the cuBLAS
workspaces are added to the peak as a correction. On the five H100 rows of issue 28 the corrected
measurement lands within 0.6 % of ``torch.cuda.max_memory_allocated``.

The step runs in a child process (``python -m remote_gpu_trainer.memory.measured``): the parent
passes a JSON job on stdin, reads ``@@progress`` lines from stderr and one JSON result from stdout,
and kills the child at the time limit, so a slow measurement can never hang the MCP server. Nothing
here is fed back into the analytic formulas: the two are computed independently and compared.
"""

from __future__ import annotations

import gc
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

PROGRESS_PREFIX = "@@progress "

#: Strategies the worker can run with torch's own FSDP2 / single-replica code.
MEASURABLE_STRATEGIES = ("ddp", "no_shard", "full_shard", "shard_grad_op", "hybrid_shard")
MEASURABLE_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd_momentum")
"""adam8bit needs bitsandbytes CUDA kernels; torch's Adafactor calls ``.item()``, which fake tensors cannot answer."""


@dataclass
class MeasureJob:
    """Everything the worker needs; plain JSON so it crosses the process boundary."""

    arch: dict[str, Any]
    strategy: str
    precision: str
    optimizer: str
    optimizer_impl: str
    world_size: int
    gpus_per_node: int
    seq_len: int
    micro_batch_size: int
    activation_checkpointing: bool
    attention: str
    lora_rank: int | None = None
    lora_targets: list[str] = field(default_factory=list)
    adapter_dtype: str = "fp32"
    engine: str = "builtin"
    """``transformers``: the real Hugging Face class from ``hf_config``; ``builtin``: ``torch_models``."""
    hf_config: dict[str, Any] | None = None
    """The model's config.json fields (the transformers engine builds the class from them)."""


@dataclass
class MeasureResult:
    peak_bytes: int
    """Tracked peak plus ``corrections``: comparable with ``torch.cuda.max_memory_allocated``."""
    categories: dict[str, int]
    """Tracker categories at the peak (Parameter, Gradient, Activation, Temp, Optstate, ...)."""
    peak_phase: str
    seconds: float
    tracker: str
    torch_version: str
    tracked_bytes: int = 0
    """What the tracker saw, before corrections."""
    engine: str = "builtin"
    model_class: str = ""
    transformers_version: str | None = None
    attention_kernels: dict[str, int] = field(default_factory=dict)
    """CUDA SDPA kernel chosen per attention call of one step (flash / efficient / math)."""
    corrections: dict[str, int] = field(default_factory=dict)
    """Bytes a CUDA step allocates that a CPU fake-tensor step cannot, added to ``peak_bytes``."""
    cannot_show: list[str] = field(default_factory=list)


def module_found(name: str) -> bool:
    """Whether this Python (the worker's) can import ``name``, checked without importing it (fast start)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _transformers_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def measured_unsupported(arch) -> str | None:
    """What of ``arch`` the built-in plain-torch models cannot build (None: measurable). Decoders with MoE
    (Mixtral, Qwen-MoE), Qwen3 q/k norms, Gemma norms and Phi-3's fused projections are built."""
    if arch.kv_lora_rank:
        return "DeepSeek multi-head latent attention"
    if arch.moe_style == "gpt_oss" or arch.attention_sinks:
        return "GPT-OSS's stacked experts and attention sinks"
    return None


class MeasureError(RuntimeError):
    """The measurement could not run (timeout, crash, unsupported op); the text says why."""


class TorchMissing(MeasureError):
    """torch does not import in the training interpreter: an environment fact, not a failed measurement."""

    def __init__(self, reason: str, python: str):
        super().__init__(reason)
        self.reason, self.python = reason, python


# ---- parent side -----------------------------------------------------------------------------------
def run_measurement(job: MeasureJob, timeout_s: float, progress: Callable[[float, float | None, str], None],
                    python: str, env: dict[str, str]) -> MeasureResult:
    """Run ``job`` in a child process of the training interpreter ``python`` with environment ``env``
    (trainenv/child.py); forward its progress; kill it after ``timeout_s`` seconds."""
    cmd = [python, "-m", "remote_gpu_trainer.memory.measured"]
    env = {**env, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, start_new_session=True)
    tail: list[str] = []
    stdout: list[str] = []
    updates: queue.Queue[tuple[float, float, str]] = queue.Queue()

    def pump_stderr() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            if line.startswith(PROGRESS_PREFIX):
                done, total, message = line[len(PROGRESS_PREFIX):].rstrip("\n").split(" ", 2)
                updates.put((float(done), float(total), message))
            else:
                tail.append(line)
                del tail[:-40]

    readers = [threading.Thread(target=pump_stderr, daemon=True),
               threading.Thread(target=lambda: stdout.append(child.stdout.read()), daemon=True)]  # type: ignore[union-attr]
    for reader in readers:
        reader.start()
    assert child.stdin is not None
    child.stdin.write(json.dumps(asdict(job)))
    child.stdin.close()
    # Progress is reported from the calling thread: the MCP server forwards it with
    # anyio.from_thread, which works only from the worker thread that runs the tool.
    deadline = time.monotonic() + timeout_s
    while child.poll() is None and time.monotonic() < deadline:
        try:
            progress(*updates.get(timeout=0.2))
        except queue.Empty:
            pass
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)  # the worker's own process group, nothing else
        child.wait()
        for reader in readers:
            reader.join(timeout=10)
        raise MeasureError(f"measurement did not finish within {timeout_s:g} s (raise measure_timeout_s, or "
                           "measure a shorter seq_len/fewer layers; fake-tensor cost grows with layers)")
    for reader in readers:
        reader.join(timeout=10)
    while not updates.empty():
        progress(*updates.get_nowait())
    out = "".join(stdout)
    if child.returncode == EXIT_NO_TORCH and out.strip():
        missing = json.loads(out.strip().splitlines()[-1])
        raise TorchMissing(missing["torch_missing"], missing["python"])
    if child.returncode != 0 or not out.strip():
        detail = "".join(tail).strip().splitlines()
        raise MeasureError(f"measurement worker failed (exit {child.returncode}): "
                           f"{detail[-1] if detail else 'no output'}")
    return MeasureResult(**json.loads(out.strip().splitlines()[-1]))


# ---- child side ------------------------------------------------------------------------------------
def _report(done: int, total: int, message: str) -> None:
    print(f"{PROGRESS_PREFIX}{done} {total} {message}", file=sys.stderr, flush=True)


def _param_dtype(precision: str) -> str:
    return {"bf16_pure": "bf16", "fp16_pure": "fp16"}.get(precision, "fp32")


def _half(precision: str):
    import torch

    return torch.float16 if precision.startswith("fp16") else torch.bfloat16


def _optimizer(job: MeasureJob, params):
    import torch

    impl = {"foreach": {"foreach": True}, "single_tensor": {"foreach": False},
            "fused": {"fused": True}}[job.optimizer_impl]
    if job.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **impl)
    if job.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4, **impl)
    if job.optimizer in ("sgd", "sgd_momentum"):
        impl.pop("fused", None)
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9 if job.optimizer == "sgd_momentum" else 0.0,
                               **(impl or {"foreach": False}))
    raise ValueError(f"optimizer {job.optimizer!r} cannot run under fake tensors")


class _LocalShards:
    """The optimizer steps the parameters' local shards, as a GPU rank does.

    FSDP2 parameters are DTensors. Stepping them under FakeTensorMode also runs DTensor's sharding
    propagation on global-shape fake tensors inside the tracked mode, which the tracker counts (fused
    Adam showed 4× the whole model). The memory a rank really uses is the local ops on local shards:
    step plain aliases of those shards, with the sharded gradients attached.
    """

    def __init__(self, params):
        from torch.distributed.tensor import DTensor

        self.pairs = []
        for p in params:
            local = p.to_local().detach() if isinstance(p, DTensor) else p
            self.pairs.append((p, local))
        self.locals = [local for _, local in self.pairs]

    def attach_grads(self) -> None:
        from torch.distributed.tensor import DTensor

        for p, local in self.pairs:
            if local is not p:
                local.grad = None if p.grad is None else (
                    p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad)

    def clear(self, model) -> None:
        for p, local in self.pairs:
            if local is not p:
                local.grad = None
        model.zero_grad(set_to_none=True)


def _checkpoint_blocks(blocks) -> None:
    """Non-reentrant activation checkpointing of every block, keeping parameter names unchanged."""
    import functools

    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def _progress_hooks(blocks, total: int, counter: list[int], iteration: list[int]) -> None:
    """One progress line per block forward, and per block backward (a hook on the block's input grad)."""
    n = len(blocks)
    for index, block in enumerate(blocks):
        def pre(module, args, index=index):
            counter[0] += 1
            _report(counter[0], total, f"iteration {iteration[0] + 1}/2 forward block {index + 1}/{n}")
            x = args[0] if args else None
            if getattr(x, "requires_grad", False):
                def on_grad(grad, index=index):
                    counter[0] += 1
                    _report(counter[0], total, f"iteration {iteration[0] + 1}/2 backward block {index + 1}/{n}")
                x.register_hook(on_grad)
        block.register_forward_pre_hook(pre)


class _NoHook:
    def remove(self) -> None:
        pass


def _frozen_safe(tracker_cls):
    """MemTracker (torch 2.13) registers a grad hook on every parameter and fails on frozen ones
    (LoRA): pre-fill its handle table for frozen parameters so it skips them."""

    class FrozenSafe(tracker_cls):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            for param in module.parameters():
                if not param.requires_grad:
                    self._param_to_grad_hook_handles.setdefault(param, (_NoHook(), _NoHook()))
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return FrozenSafe


@dataclass
class _Built:
    """A model ready for the fake step: module, its blocks, a batch and how to get the loss."""

    model: Any
    blocks: list
    make_batch: Callable[[], dict]
    loss: Callable[[dict], Any]
    model_class: str
    materialize: Callable[[], None]


def _build_builtin(job: MeasureJob, arch) -> _Built:
    import torch

    from .torch_models import build_model, example_batch

    with torch.device("meta"):
        model = build_model(arch, dtype=_param_dtype(job.precision), lora_rank=job.lora_rank,
                            lora_targets=job.lora_targets or None, adapter_dtype=job.adapter_dtype,
                            attention_impl=job.attention, dropout=True)
    if job.activation_checkpointing:
        _checkpoint_blocks(model.blocks())

    def materialize() -> None:
        model.to_empty(device="cpu")
        model.train()

    return _Built(model, model.blocks(), lambda: example_batch(arch, job.micro_batch_size, job.seq_len),
                  lambda batch: model(batch), f"{type(model).__name__} (built-in)", materialize)


def _build_hf(job: MeasureJob, arch) -> _Built:
    from . import hf_models

    hf = hf_models.build(job.hf_config or {}, arch.family, dtype=_param_dtype(job.precision), attention=job.attention,
                         checkpointing=job.activation_checkpointing, lora_rank=job.lora_rank,
                         lora_targets=job.lora_targets)
    return _Built(hf.model, hf.blocks, lambda: hf_models.batch(arch.family, job.micro_batch_size, job.seq_len),
                  hf.loss, hf.class_name, lambda: hf_models.materialize(hf))


def measure(job: MeasureJob) -> MeasureResult:
    """Run two training iterations of ``job`` on fake tensors and return the tracked peak (plus the
    corrections a CPU step cannot show, see ``cuda_emulation.CANNOT_SHOW``)."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .analytic import Overheads
    from .architecture import Architecture
    from .cuda_emulation import CANNOT_SHOW, cuda_semantics

    started = time.monotonic()
    arch = Architecture(**job.arch)
    hf = job.engine == "transformers"
    built = _build_hf(job, arch) if hf else _build_builtin(job, arch)
    blocks = built.blocks
    fsdp = job.strategy in ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")
    mixed = job.precision.endswith("_mixed")
    total_steps = 2 * 2 * len(blocks) + 2
    counter, iteration = [0], [0]
    _report(0, total_steps, f"built {built.model_class} on the meta device ({len(blocks)} blocks)")
    _progress_hooks(blocks, total_steps, counter, iteration)

    if fsdp:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=job.world_size, store=FakeStore())
        if job.strategy == "hybrid_shard":
            mesh = init_device_mesh("cpu", (job.world_size // job.gpus_per_node, job.gpus_per_node),
                                    mesh_dim_names=("replicate", "shard"))
        elif job.strategy == "no_shard" and job.world_size > 1:  # replicate only: a shard dimension of 1
            mesh = init_device_mesh("cpu", (job.world_size, 1), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (job.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=_half(job.precision), reduce_dtype=torch.float32) if mixed \
            else MixedPrecisionPolicy()
        reshard = job.strategy not in ("shard_grad_op", "no_shard")

    kernels: list[str] = []
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = built.model
        if hf:  # tie the head to the embedding before sharding (to_empty unties; FSDP2 keeps the tie)
            built.materialize()
        if fsdp:
            for block in blocks:
                fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        if not hf:
            built.materialize()
        shards = _LocalShards([p for p in model.parameters() if p.requires_grad])
        optimizer = _optimizer(job, shards.locals)
        batch = built.make_batch()
        if fsdp:
            tracker = _frozen_safe(FSDPMemTracker)(model, optimizer)
            tracker.track_inputs(tuple(batch.values()))
        else:
            tracker = _frozen_safe(__import__("torch.distributed._tools.mem_tracker",
                                              fromlist=["MemTracker"]).MemTracker)()
            tracker.track_external(model, optimizer, *batch.values())
        peaks: list[tuple[str, int]] = []
        autocast = torch.autocast("cpu", dtype=_half(job.precision)) if mixed and not fsdp else None
        with tracker, cuda_semantics(kernels):
            for it in range(2):
                iteration[0] = it
                if autocast is not None:
                    with autocast:
                        loss = built.loss(batch)
                else:
                    loss = built.loss(batch)
                loss.backward()
                peaks.append((f"iteration {it + 1} forward/backward", _peak_total(tracker)))
                counter[0] += 1
                _report(counter[0], total_steps, f"iteration {it + 1}/2 optimizer step")
                shards.attach_grads()
                optimizer.step()
                shards.clear(model)
                peaks.append((f"iteration {it + 1} optimizer step", _peak_total(tracker)))
                del loss
                tracker.reset_mod_stats()  # module stats are per iteration; the global peak is kept
            snapshot = tracker.get_tracker_snapshot("peak")
    device_snap = next(iter(snapshot.values()))
    categories = {str(getattr(k, "value", k)): int(v) for k, v in device_snap.items()}
    tracked = categories.pop("Total")
    phase = next(name for name, value in peaks if value == tracked)
    if fsdp:
        dist.destroy_process_group()
    corrections = {"cuBLAS workspaces": Overheads().cublas_workspace_bytes}
    counts = {k: kernels.count(k) // 2 for k in sorted(set(kernels))}  # two iterations
    return MeasureResult(peak_bytes=tracked + sum(corrections.values()), tracked_bytes=tracked,
                         categories={k: v for k, v in categories.items() if v},
                         peak_phase=phase.replace("iteration 2 ", "").replace("iteration 1 ", "first "),
                         seconds=round(time.monotonic() - started, 2),
                         tracker="FSDPMemTracker" if fsdp else "MemTracker", torch_version=torch.__version__,
                         engine=job.engine, model_class=built.model_class,
                         transformers_version=_transformers_version() if hf else None,
                         attention_kernels=counts, corrections=corrections, cannot_show=list(CANNOT_SHOW))


def compare_with_analytic(config: dict[str, Any], *, precision: str, checkpointing: bool = False,
                          lora: bool = False, seq_len: int = 256, micro_batch_size: int = 4, strategy: str = "ddp",
                          world_size: int = 1, optimizer_impl: str = "fused") -> tuple[int, MeasureResult]:
    """The analytic peak of a Hugging Face config and the real class measured in this process (tests and
    ``bench/memory_hf_grid.py``). The analytic side leaves out the cuBLAS workspaces, which the tracker cannot
    see: compare it with ``tracked_bytes``. LoRA: rank 8 on PEFT's default targets."""
    from .advice import default_lora_targets
    from .analytic import Overheads, Setup, estimate
    from .architecture import from_hf_config

    arch = from_hf_config(config)
    targets = tuple(default_lora_targets(arch)) if lora else ()
    knobs = {"strategy": strategy, "precision": precision, "optimizer": "adamw", "optimizer_impl": optimizer_impl,
             "world_size": world_size, "gpus_per_node": world_size, "seq_len": seq_len,
             "micro_batch_size": micro_batch_size, "activation_checkpointing": checkpointing,
             "attention": "eager" if arch.attention_softcap or arch.attention_sinks else "sdpa",
             "lora_rank": 8 if lora else None}
    adapter = "bf16" if precision == "bf16_pure" and strategy != "ddp" else "fp32"
    result = measure(MeasureJob(arch=asdict(arch), lora_targets=list(targets), adapter_dtype=adapter,
                                engine="transformers", hf_config=config, **knobs))
    setup = Setup(num_params=arch.num_params, arch=arch, lora_targets=targets,
                  overheads=Overheads(cublas_workspace_bytes=0), **knobs)
    return estimate(setup).allocated_peak_bytes, result


def measure_cuda(job: MeasureJob) -> int:
    """Peak ``torch.cuda.max_memory_allocated`` of two real training iterations on this process's GPU.

    Single-device setups only (DDP/no_shard measured as one replica); the bytes allocated before the
    model exists (cuBLAS workspace, earlier tensors) are subtracted. Used by the bench and GPU tests.
    """
    import torch

    from .architecture import Architecture
    from .torch_models import build_model, example_batch

    if job.strategy not in ("ddp", "no_shard"):
        raise ValueError("measure_cuda runs one replica on one GPU: strategy ddp or no_shard")
    arch = Architecture(**job.arch)
    device = torch.device("cuda")
    gc.collect()  # an earlier measurement's tensors freed now, not in the middle of this one (below the baseline)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    warm = torch.ones(64, 64, device=device, dtype=_half(job.precision) if job.precision != "fp32" else None)
    (warm @ warm).sum().item()  # create the cuBLAS handle and workspace before the baseline
    del warm
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.device("meta"):
        model = build_model(arch, dtype=_param_dtype(job.precision), lora_rank=job.lora_rank,
                            lora_targets=job.lora_targets or None, adapter_dtype=job.adapter_dtype,
                            attention_impl=job.attention, dropout=False)
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    if job.activation_checkpointing:
        _checkpoint_blocks(model.blocks())
    model.train()
    optimizer = _optimizer(job, [p for p in model.parameters() if p.requires_grad])
    batch = example_batch(arch, job.micro_batch_size, job.seq_len, device="cuda")
    mixed = job.precision.endswith("_mixed")
    for _ in range(2):
        with torch.autocast("cuda", dtype=_half(job.precision), enabled=mixed):
            loss = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - baseline
    del model, optimizer, batch
    torch.cuda.empty_cache()
    return peak


def _peak_total(tracker) -> int:
    snap = tracker.get_tracker_snapshot("peak")
    return int(sum(dev.get("Total", 0) for dev in snap.values()))


EXIT_NO_TORCH = 3


def main() -> int:
    job = MeasureJob(**json.loads(sys.stdin.read()))
    try:
        import torch  # noqa: F401
    except ImportError as err:  # an environment fact: the parent says how to add torch
        print(json.dumps({"torch_missing": str(err), "python": sys.executable}), flush=True)
        return EXIT_NO_TORCH
    result = measure(job)
    print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # a worker: skip torch's slow interpreter teardown (seconds), the result is already out
