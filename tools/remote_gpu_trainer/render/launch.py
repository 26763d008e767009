"""render_launch: launch commands and configs for torchrun, Accelerate and DeepSpeed, checked.

What it renders, per launcher:

* torchrun: ``launch.sh`` (single node: ``--standalone``, a free port chosen by c10d; several nodes:
  c10d rendezvous on the head node, or static with ``--master-addr``/``--node-rank``), or with
  ``scheduler="slurm"`` a ``launch.sbatch`` (one torchrun per node, head node from the allocation).
* accelerate: ``accelerate_config.yaml`` (MULTI_GPU / FSDP2 / DEEPSPEED with real Accelerate keys)
  plus ``launch.sh`` running ``accelerate launch --config_file``.
* deepspeed: ``ds_config.json`` (ZeRO 1-3, CPU offload, bf16/fp16, batch sizes that satisfy
  DeepSpeed's own assertion) plus ``launch.sh`` running the ``deepspeed`` launcher (``--include``
  rather than CUDA_VISIBLE_DEVICES, DIST-09; several nodes: ``--no_ssh`` per node with a hostfile).

Bad or contradictory input is an InputError before anything is rendered. What can only be judged
by looking at the result or at this host becomes a check: the config parses, its keys are real
keys of the tool that reads it, the batch arithmetic holds, the launcher flags exist, the script
parses (bash -n, shellcheck), the port is free, there are enough GPUs, the precision suits the GPU
generation, and this host's accelerate (if installed) loads the YAML. Host checks describe *this*
machine: render on the box you launch from, or pass ``check_host=false`` (they then read SKIP).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field

from ..errors import InputError
from ..health.checks import Check
from ..models import EntryRef, StrictModel, Verdict, worst
from ..processes.tool import PortStatusInput, port_status
from ..toolspec import no_progress
from . import engine, keys
from .gpus import BF16_MIN_CC, LocalGpus, capability_of, local_gpus
from .installed import accelerate_loads
from .templates import ENV_NAME, GPUS, IFNAME, load_profile_for, profile_context, shell_checks

Launcher = Literal["torchrun", "accelerate", "deepspeed"]
Strategy = Literal["ddp", "fsdp", "zero1", "zero2", "zero3"]
Precision = Literal["auto", "fp32", "fp16", "bf16"]
Offload = Literal["none", "optimizer", "optimizer_and_params"]

HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                  r"[A-Za-z0-9])?)*$")
RDZV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_C10D_PORT = 29400
DEFAULT_STATIC_PORT = 29500

DL = "references/training/distributed-launch.md"
NODE = "references/multinode.md"
AMP = "references/training/precision-stability.md"
E_PORT = EntryRef(file=DL, id="DIST-02")
E_RDZV = EntryRef(file=DL, id="DIST-03")
E_ORDINAL = EntryRef(file=DL, id="DIST-05")
E_ACCEL = EntryRef(file=DL, id="DIST-08")
E_DS_DEVICES = EntryRef(file=DL, id="DIST-09")
E_DS_BATCH = EntryRef(file=DL, id="DIST-29")
E_MASTER = EntryRef(file=NODE, id="NODE-02")
E_SAME = EntryRef(file=NODE, id="NODE-12")
E_BF16 = EntryRef(file=AMP, id="AMP-10")
E_DS_PRECISION = EntryRef(file=AMP, id="AMP-15")


class RenderLaunchInput(StrictModel):
    launcher: Launcher = Field(description="torchrun, accelerate (accelerate launch + config YAML) or deepspeed "
                               "(deepspeed launcher + DeepSpeed JSON)")
    script: str = Field(min_length=1, max_length=4096, description="Training script (path as the launch directory "
                        "sees it), e.g. train.py")
    nproc_per_node: int = Field(ge=1, le=64, description="Processes (GPUs) per node")
    nnodes: int = Field(1, ge=1, le=1024, description="Number of nodes; > 1 needs master_addr (or scheduler=slurm)")
    script_args: str = Field("", max_length=20_000, description="Arguments for the training script as you would "
                             "type them, shell-quoted: e.g. \"--lr 3e-4 --name 'run 1'\" (each word is re-quoted "
                             "in launch.sh; $VARS are not expanded, and the result's notes say so)")
    master_addr: str | None = Field(None, description="Head node's private IP (preferred) or hostname, reachable from "
                                    "every node (NODE-02); multi-node only")
    port: int | None = Field(None, ge=1, le=65535, description="Rendezvous/master port. Default: single node picks a "
                             "free one (torchrun --standalone, accelerate port 0; deepspeed 29500); multi-node 29400 "
                             "(c10d) or 29500 (static)")
    rdzv_backend: Literal["c10d", "static"] = Field("c10d", description="Multi-node rendezvous: c10d (every node the "
                                                    "same command) or static (MASTER_ADDR/PORT + node rank); torchrun "
                                                    "and accelerate")
    rdzv_id: str | None = Field(None, description="torchrun c10d job id, the same on every node (default: derived from "
                                "script and sizes, so every node renders the same)")
    node_rank: int | None = Field(None, ge=0, description="This node's rank for static rendezvous / deepspeed / "
                                  "accelerate multi-node; default: the launch script reads $NODE_RANK")
    max_restarts: int = Field(0, ge=0, le=100, description="torchrun --max-restarts (the script must resume from its "
                              "checkpoint, NODE-13)")
    join_timeout_s: int | None = Field(None, ge=30, le=86400, description="torchrun c10d join timeout when nodes "
                                       "start far apart (NODE-03); default 600")
    scheduler: Literal["none", "slurm"] = Field("none", description="slurm: an sbatch script with one torchrun per "
                                                "node (torchrun only)")
    gpus: str | None = Field(None, description="GPUs of this node to use, e.g. \"0,1\" (CUDA_VISIBLE_DEVICES for "
                             "torchrun/accelerate, --include for deepspeed); count must equal nproc_per_node")
    strategy: Strategy | None = Field(None, description="accelerate: ddp (default), fsdp (FSDP2), zero1/zero2/zero3; "
                                      "deepspeed: zero1/zero2 (default)/zero3; not for torchrun (your script chooses)")
    precision: Precision = Field("auto", description="auto = bf16 on compute capability >= 8.0 (Ampere+), fp16 "
                                 "below (AMP-10); fp32 disables mixed precision. torchrun: the precision your script "
                                 "uses, only checked against the GPU")
    offload: Offload = Field("none", description="CPU offload: optimizer (ZeRO), optimizer_and_params (ZeRO-3, or "
                             "FSDP which offloads parameters, gradients and optimizer together)")
    micro_batch_size: int | None = Field(None, ge=1, le=1_000_000, description="deepspeed train_micro_batch_size_per_"
                                         "gpu (default 1; 'auto' with hf_trainer)")
    gradient_accumulation_steps: int | None = Field(None, ge=1, le=100_000, description="deepspeed (and accelerate "
                                                    "DeepSpeed) gradient accumulation steps (default 1)")
    train_batch_size: int | None = Field(None, ge=1, description="deepspeed global batch; must equal micro_batch_size"
                                         " x gradient_accumulation_steps x world size (computed when omitted)")
    gradient_clipping: float | None = Field(None, gt=0, le=1e6, description="deepspeed gradient_clipping")
    hf_trainer: bool = Field(False, description="deepspeed: write \"auto\" for batch sizes, clipping and precision, "
                             "filled in by the HF Trainer (AMP-15); the script gets --deepspeed ds_config.json")
    fsdp_transformer_layer: str | None = Field(None, description="accelerate fsdp: transformer block class to wrap, "
                                               "e.g. LlamaDecoderLayer (default: the model's _no_split_modules)")
    gpu: str | None = Field(None, description="GPU model or compute capability of the box you launch on (\"A100\", "
                            "\"T4\", \"8.6\") for the precision check; default: detected here")
    provider: str | None = Field(None, description="Provider profile: exports its HF_HOME and environment in "
                                 "launch.sh")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables to export in "
                                "launch.sh (literal values)")
    nccl_socket_ifname: str | None = Field(None, description="NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for "
                                           "multi-node, e.g. \"=ens5\" (NODE-01)")
    omp_num_threads: int | None = Field(None, ge=1, le=1024, description="OMP_NUM_THREADS per process (PAR-03)")
    extra_config: dict[str, Any] = Field(default_factory=dict, description="Keys merged into the Accelerate YAML or "
                                         "DeepSpeed JSON (checked against the real key sets); sections merge")
    check_host: bool = Field(True, description="Run this host's checks (port free, GPU count, GPU generation); set "
                             "false when rendering for another machine")


class RenderedFile(StrictModel):
    name: str = Field(description="Suggested file name; launch.sh looks for its config files next to itself")
    language: Literal["bash", "yaml", "json", "text"]
    executable: bool
    text: str


class RenderLaunchResult(StrictModel):
    verdict: Verdict = Field(description="Worst check: FAIL > UNKNOWN > WARN > PASS (SKIP ignored)")
    launcher: str
    summary: str
    world_size: int
    precision: str = Field(description="The precision rendered (after resolving auto)")
    command: str = Field(description="The launch command line this node runs (inside launch.sh)")
    files: list[RenderedFile]
    checks: list[Check]
    notes: list[str]
    references: list[EntryRef]


@dataclass
class Plan:
    """What a launcher builder produces, before the checks."""

    command: list[str | tuple[str]]
    files: list[RenderedFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    needs_node_rank: bool = False
    port: int | None = None
    """The fixed port this launch binds on the head node (None: chosen at launch)."""


# ------------------------------------------------------------------------------------ validation


def _fail_if(condition: bool, field_name: str, message: str, allowed: list[str] | None = None) -> None:
    if condition:
        raise InputError(field_name, message, allowed=allowed)


def validate(args: RenderLaunchInput) -> None:
    """Reject contradictory or inapplicable parameters, naming the field and what is allowed."""
    multi = args.nnodes > 1
    slurm = args.scheduler == "slurm"
    _fail_if(not args.script.strip() or "\x00" in args.script or "\n" in args.script, "script",
             "must be one path or module name")
    _fail_if("\x00" in args.script_args, "script_args", "must not contain NUL bytes")
    script_words(args)
    if args.launcher == "torchrun":
        _fail_if(args.strategy is not None, "strategy", "torchrun starts your script as is: the script chooses DDP or "
                 "FSDP. strategy applies to launcher=accelerate or deepspeed", allowed=["(omit for torchrun)"])
        _fail_if(args.offload != "none", "offload", "offload is configured by accelerate/deepspeed, or in your "
                 "script for torchrun", allowed=["none"])
    if args.launcher == "deepspeed":
        _fail_if(args.strategy in ("ddp", "fsdp"), "strategy", "the deepspeed launcher runs ZeRO",
                 allowed=["zero1", "zero2", "zero3"])
    strategy = effective_strategy(args)
    if args.offload != "none":
        _fail_if(strategy == "ddp", "offload", "DDP keeps everything on the GPU; offloading needs ZeRO or FSDP",
                 allowed=["none"])
        _fail_if(strategy == "fsdp" and args.offload == "optimizer", "offload", "FSDP offloads parameters, gradients "
                 "and optimizer state together", allowed=["none", "optimizer_and_params"])
        _fail_if(strategy in ("zero1", "zero2") and args.offload == "optimizer_and_params", "offload",
                 "parameter offload needs ZeRO-3", allowed=["none", "optimizer"])
    deepspeed_json = args.launcher == "deepspeed"
    zero = strategy is not None and strategy.startswith("zero")
    for name in ("micro_batch_size", "train_batch_size"):
        _fail_if(getattr(args, name) is not None and not deepspeed_json, name,
                 "applies to the DeepSpeed JSON (launcher=deepspeed); with accelerate or torchrun the script sets "
                 "its batch size")
    for name in ("gradient_accumulation_steps", "gradient_clipping"):
        _fail_if(getattr(args, name) is not None and not zero, name,
                 "applies to DeepSpeed configs (launcher=deepspeed, or accelerate with strategy zero1-3); otherwise "
                 "the script sets it")
    _fail_if(args.hf_trainer and not deepspeed_json, "hf_trainer", "writes 'auto' values into the DeepSpeed JSON: "
             "launcher=deepspeed only")
    _fail_if(args.fsdp_transformer_layer is not None and strategy != "fsdp", "fsdp_transformer_layer",
             "applies to launcher=accelerate with strategy=fsdp")
    if args.fsdp_transformer_layer is not None:
        _fail_if(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*", args.fsdp_transformer_layer),
                 "fsdp_transformer_layer", "must be a Python class name (or a comma list), e.g. LlamaDecoderLayer")
    _fail_if(slurm and args.launcher != "torchrun", "scheduler", "the Slurm script is rendered for torchrun",
             allowed=["none"])
    _fail_if(multi and not slurm and not args.master_addr, "master_addr",
             f"nnodes={args.nnodes} needs the head node's address (its private IP, NODE-02)")
    _fail_if(args.master_addr is not None and (not multi or slurm), "master_addr",
             "applies to multi-node launches without Slurm (Slurm takes the head node from the allocation)")
    if args.master_addr is not None:
        _fail_if(not (HOST.match(args.master_addr) or _is_ip(args.master_addr)), "master_addr",
                 "must be an IP address or a hostname")
        _fail_if(_loopback(args.master_addr), "master_addr", "a loopback address is unreachable from the other "
                 "nodes: use the head node's private IP (hostname -I on it)")
    _fail_if(args.node_rank is not None and not multi, "node_rank", "applies to multi-node launches (nnodes > 1)")
    _fail_if(args.node_rank is not None and args.node_rank >= args.nnodes, "node_rank",
             f"must be below nnodes={args.nnodes}")
    _fail_if(args.node_rank is not None and args.launcher == "torchrun" and args.rdzv_backend == "c10d",
             "node_rank", "c10d rendezvous assigns node ranks itself; node_rank is for rdzv_backend=static")
    _fail_if(args.node_rank is not None and slurm, "node_rank", "Slurm runs one torchrun per node; ranks come from "
             "the rendezvous")
    torchrun_only = {"rdzv_id": args.rdzv_id, "join_timeout_s": args.join_timeout_s}
    for name, value in torchrun_only.items():
        _fail_if(value is not None and args.launcher != "torchrun", name, "applies to launcher=torchrun")
        _fail_if(value is not None and (not multi or args.rdzv_backend != "c10d"), name,
                 "applies to multi-node c10d rendezvous (nnodes > 1, rdzv_backend=c10d)")
    _fail_if(args.max_restarts and args.launcher == "deepspeed", "max_restarts",
             "the deepspeed launcher does not restart workers; use torchrun or accelerate")
    if args.rdzv_id is not None:
        _fail_if(not RDZV_ID.match(args.rdzv_id), "rdzv_id", "must be 1-64 letters, digits, . _ -")
    _fail_if(args.rdzv_backend != "c10d" and (args.launcher == "deepspeed" or not multi or slurm), "rdzv_backend",
             "static rendezvous applies to multi-node torchrun/accelerate launches without Slurm",
             allowed=["c10d (the default)"])
    if args.gpus is not None:
        _fail_if(not GPUS.match(args.gpus.replace(" ", "")), "gpus",
                 "must be a CUDA_VISIBLE_DEVICES value like \"0,1\"")
        count = len(args.gpus.split(","))
        _fail_if(count != args.nproc_per_node, "gpus", f"lists {count} GPU(s) but nproc_per_node={args.nproc_per_node}:"
                 " launch exactly one process per GPU (DIST-05)")
        _fail_if(args.launcher == "deepspeed" and not all(g.strip().isdigit() for g in args.gpus.split(",")), "gpus",
                 "deepspeed --include takes GPU indices, e.g. \"2,3\"")
        _fail_if(args.launcher == "deepspeed" and multi, "gpus", "with several nodes the hostfile's slots decide")
        _fail_if(slurm, "gpus", "Slurm assigns the GPUs (--gpus-per-node)")
    for name in args.env:
        _fail_if(not ENV_NAME.match(name), "env", f"{name!r} is not an environment variable name")
    _fail_if(any("\x00" in v for v in args.env.values()), "env", "values must not contain NUL bytes")
    if args.nccl_socket_ifname is not None:
        _fail_if(not IFNAME.match(args.nccl_socket_ifname), "nccl_socket_ifname",
                 "must be like \"=ens5\", \"eth0\" or \"^docker,lo\"")
    _fail_if(args.launcher == "torchrun" and bool(args.extra_config), "extra_config",
             "torchrun has no config file; pass options in script_args")


def script_words(args: RenderLaunchInput) -> list[str]:
    """The script's arguments, split as a shell would (quotes honoured)."""
    try:
        return shlex.split(args.script_args)
    except ValueError as err:
        raise InputError("script_args", f"cannot be split like a shell command line: {err}") from None


def literal_dollar_note(args: RenderLaunchInput) -> str | None:
    """A word with ``$`` reaches the script literally (launch.sh quotes every word, so a caller's text never
    becomes shell code): say so, because ``"$HOME/x y"`` in a shell would have expanded."""
    words = [w for w in script_words(args) if "$" in w]
    if not words:
        return None
    shown = ", ".join(shlex.quote(w) for w in words[:3]) + (" …" if len(words) > 3 else "")
    return (f"script_args: {shown} reach the script literally: launch.sh quotes every word, so $VARIABLES are not "
            "expanded. Write the value itself, or read the variable inside the script (env passes it)")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _loopback(text: str) -> bool:
    if text.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    return _is_ip(text) and ipaddress.ip_address(text).is_loopback


def effective_strategy(args: RenderLaunchInput) -> str | None:
    if args.launcher == "torchrun":
        return None
    if args.strategy is not None:
        return args.strategy
    return "ddp" if args.launcher == "accelerate" else "zero2"


# --------------------------------------------------------------------------------------- precision


@dataclass(frozen=True)
class GpuFacts:
    capability: tuple[int, int] | None
    source: str
    """Where the capability came from: the gpu parameter, this host's NVML, or nowhere."""


def gpu_facts(args: RenderLaunchInput, local: LocalGpus | None) -> GpuFacts:
    if args.gpu is not None:
        return GpuFacts(capability_of(args.gpu), f"gpu={args.gpu!r}")
    if local is not None and local.capabilities:
        return GpuFacts(min(local.capabilities), f"detected here ({', '.join(sorted(set(local.names)))})")
    return GpuFacts(None, "unknown (no gpu given, none detected here)")


def resolve_precision(args: RenderLaunchInput, facts: GpuFacts) -> str:
    if args.precision != "auto":
        return args.precision
    if facts.capability is None:
        return "bf16"
    return "bf16" if facts.capability >= BF16_MIN_CC else "fp16"


def precision_check(args: RenderLaunchInput, precision: str, facts: GpuFacts) -> Check:
    threshold = "bf16 needs compute capability >= 8.0 (Ampere or newer)"
    if args.launcher == "torchrun" and args.precision == "auto":
        # torchrun sets no precision: the script does. Say what this GPU allows, as advice.
        if facts.capability is None:
            return Check(name="precision", verdict=Verdict.SKIP, observed="set by your script; GPU generation unknown",
                         threshold=threshold, explanation="pass precision= (what the script uses) and gpu= to check "
                         "them against each other", entry=E_BF16)
        cc = f"{facts.capability[0]}.{facts.capability[1]}"
        if facts.capability >= BF16_MIN_CC:
            return Check(name="precision", verdict=Verdict.PASS, observed=f"compute capability {cc} ({facts.source})",
                         threshold=threshold, explanation="bf16 autocast runs natively here", entry=E_BF16)
        return Check(name="precision", verdict=Verdict.WARN, observed=f"compute capability {cc} ({facts.source})",
                     threshold=threshold, explanation="no native bf16 here: the script should use fp16 with a "
                     "GradScaler (or fp32)", entry=E_BF16)
    if facts.capability is None:
        assumed = " (auto chose bf16 without knowing the GPU)" if args.precision == "auto" else ""
        return Check(name="precision", verdict=Verdict.UNKNOWN, observed=f"{precision}{assumed}; GPU generation "
                     "unknown", threshold=threshold, explanation="pass gpu=\"A100\" (or the model you rent) to check "
                     "it; on a T4/V100 bf16 runs emulated and slow", entry=E_BF16)
    cc = f"{facts.capability[0]}.{facts.capability[1]}"
    native = facts.capability >= BF16_MIN_CC
    if precision == "bf16" and not native:
        return Check(name="precision", verdict=Verdict.FAIL, observed=f"bf16 on compute capability {cc} "
                     f"({facts.source})", threshold=threshold, explanation="no bf16 tensor cores before Ampere: use "
                     "precision=fp16 (with loss scaling) or fp32", entry=E_BF16)
    if precision == "fp16" and native:
        return Check(name="precision", verdict=Verdict.PASS, observed=f"fp16 on compute capability {cc}",
                     threshold=threshold, explanation="works; bf16 would avoid loss scaling and fp16 overflow on this "
                     "GPU", entry=E_BF16)
    return Check(name="precision", verdict=Verdict.PASS, observed=f"{precision} on compute capability {cc} "
                 f"({facts.source})", threshold=threshold, explanation="the precision suits this GPU generation",
                 entry=E_BF16)


# ------------------------------------------------------------------------------------- builders


def _world(args: RenderLaunchInput) -> int:
    return args.nnodes * args.nproc_per_node


def _default_rdzv_id(args: RenderLaunchInput) -> str:
    digest = hashlib.sha256(f"{args.script}|{args.nnodes}|{args.nproc_per_node}|{args.master_addr}".encode())
    stem = re.sub(r"[^A-Za-z0-9]+", "-", PurePosixPath(args.script).stem).strip("-")[:40] or "job"
    return f"{stem}-{digest.hexdigest()[:8]}"


def _node_rank_word(args: RenderLaunchInput) -> str | tuple[str]:
    return str(args.node_rank) if args.node_rank is not None else ("$NODE_RANK",)


def build_torchrun(args: RenderLaunchInput) -> Plan:
    words: list[str | tuple[str]] = ["torchrun"]
    notes: list[str] = []
    port = None
    needs_rank = False
    if args.scheduler == "slurm":
        port = args.port or DEFAULT_C10D_PORT
        words += [("--nnodes=$SLURM_NNODES",), f"--nproc-per-node={args.nproc_per_node}", "--rdzv-backend=c10d",
                  (f"--rdzv-endpoint=$RDZV_HOST:{port}",), ("--rdzv-id=$SLURM_JOB_ID",)]
        notes.append("Slurm: one torchrun per node (--ntasks-per-node=1); the head node and the job id come from the "
                     "allocation, so every node runs the same command (NODE-14)")
    elif args.nnodes == 1:
        words += ["--standalone", f"--nproc-per-node={args.nproc_per_node}"]
        if args.port is not None:
            words = ["torchrun", "--nnodes=1", f"--nproc-per-node={args.nproc_per_node}", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=localhost:{args.port}"]
            port = args.port
            notes.append(f"single node on the fixed port {args.port} (without port=, --standalone picks a free one)")
        else:
            notes.append("single node: --standalone runs the c10d rendezvous on a free port, so two jobs on one box "
                         "never collide (DIST-02, PAR-02)")
    elif args.rdzv_backend == "c10d":
        port = args.port or DEFAULT_C10D_PORT
        rdzv_id = args.rdzv_id or _default_rdzv_id(args)
        words += [f"--nnodes={args.nnodes}", f"--nproc-per-node={args.nproc_per_node}", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint={args.master_addr}:{port}", f"--rdzv-id={rdzv_id}"]
        if args.join_timeout_s:
            words.append(f"--rdzv-conf=join_timeout={args.join_timeout_s}")
        notes.append(f"c10d rendezvous: identical command on all {args.nnodes} nodes; the head node "
                     f"{args.master_addr} hosts the store on port {port} (DIST-03, NODE-03)")
    else:
        port = args.port or DEFAULT_STATIC_PORT
        needs_rank = args.node_rank is None
        words += [f"--nnodes={args.nnodes}", f"--nproc-per-node={args.nproc_per_node}",
                  f"--master-addr={args.master_addr}", f"--master-port={port}"]
        words.append(("--node-rank=$NODE_RANK",) if needs_rank else f"--node-rank={args.node_rank}")
        notes.append("static rendezvous: each node passes its own --node-rank; node 0 hosts the store")
    if args.max_restarts:
        words.append(f"--max-restarts={args.max_restarts}")
    words += [args.script, *script_words(args)]
    return Plan(command=words, notes=notes, needs_node_rank=needs_rank, port=port)


ACCEL_COMMENTS = {
    "num_processes": "TOTAL processes across all machines, not per machine",
    "mixed_precision": "explicit: accelerate's default is 'no' = fp32 (AMP-11)",
    "gpu_ids": "GPUs of each machine",
    "same_network": "true: static rendezvous on main_process_ip:main_process_port",
    "fsdp_config.fsdp_version": "FSDP2 (fully_shard)",
    "fsdp_config.fsdp_auto_wrap_policy": "wrap per transformer block: one giant unit saves no memory (DIST-18)",
    "fsdp_config.fsdp_reshard_after_forward": "true = FULL_SHARD-like, false = SHARD_GRAD_OP-like",
    "deepspeed_config.zero3_init_flag": "build ZeRO-3 models sharded from the start",
    "deepspeed_config.deepspeed_multinode_launcher": "standard = torch.distributed per node, no pdsh/ssh",
}


def accelerate_comments(args: RenderLaunchInput) -> dict[str, str]:
    comments = dict(ACCEL_COMMENTS)
    if args.nnodes > 1:
        comments["machine_rank"] = "0 here; each node passes its own --machine_rank in launch.sh"
        comments["main_process_port"] = "on main_process_ip, reachable from every machine (NODE-02)"
    elif args.port is None:
        comments["main_process_port"] = "0 = accelerate picks a free port (single machine, DIST-02)"
    return comments


def accelerate_config(args: RenderLaunchInput, precision: str) -> dict[str, Any]:
    strategy = effective_strategy(args)
    world = _world(args)
    multi = args.nnodes > 1
    distributed = {"ddp": "MULTI_GPU" if world > 1 else "NO", "fsdp": "FSDP"}.get(strategy or "", "DEEPSPEED")
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed,
        "mixed_precision": "no" if precision == "fp32" else precision,
        "num_machines": args.nnodes,
        "num_processes": world,
        "machine_rank": 0,
        "gpu_ids": args.gpus.replace(" ", "") if args.gpus else "all",
        "use_cpu": False,
        "debug": False,
        "enable_cpu_affinity": False,
        "main_training_function": "main",
    }
    if multi:
        config["main_process_ip"] = args.master_addr
        config["main_process_port"] = args.port or DEFAULT_STATIC_PORT
        config["rdzv_backend"] = args.rdzv_backend
        config["same_network"] = args.rdzv_backend == "static"
    else:
        config["main_process_port"] = args.port if args.port is not None else 0
    if strategy == "fsdp":
        fsdp: dict[str, Any] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,
            "fsdp_offload_params": args.offload == "optimizer_and_params",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_activation_checkpointing": False,
        }
        if args.fsdp_transformer_layer:
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = args.fsdp_transformer_layer
        config["fsdp_config"] = fsdp
    elif distributed == "DEEPSPEED":
        stage = int(strategy[-1]) if strategy else 2
        ds: dict[str, Any] = {
            "zero_stage": stage,
            "offload_optimizer_device": "cpu" if args.offload != "none" else "none",
            "offload_param_device": "cpu" if args.offload == "optimizer_and_params" else "none",
            "gradient_accumulation_steps": args.gradient_accumulation_steps or 1,
        }
        if args.gradient_clipping is not None:
            ds["gradient_clipping"] = args.gradient_clipping
        if stage == 3:
            ds["zero3_init_flag"] = True
        if multi:
            ds["deepspeed_multinode_launcher"] = "standard"
        config["deepspeed_config"] = ds
    return merge_extra(config, args.extra_config, "accelerate")


def deepspeed_config(args: RenderLaunchInput, precision: str) -> dict[str, Any]:
    strategy = effective_strategy(args) or "zero2"
    stage = int(strategy[-1])
    auto = args.hf_trainer
    micro = args.micro_batch_size if args.micro_batch_size is not None else ("auto" if auto else 1)
    accumulation = args.gradient_accumulation_steps if args.gradient_accumulation_steps is not None else \
        ("auto" if auto else 1)
    if args.train_batch_size is not None:
        total = args.train_batch_size
    elif isinstance(micro, int) and isinstance(accumulation, int):
        total = micro * accumulation * _world(args)
    else:
        total = "auto"
    if all(isinstance(v, int) for v in (micro, accumulation, total)) and total != micro * accumulation * _world(args):
        raise InputError("train_batch_size", f"{total} != micro_batch_size {micro} x gradient_accumulation_steps "
                         f"{accumulation} x world size {_world(args)} = {micro * accumulation * _world(args)}: "
                         "DeepSpeed asserts train_batch_size = micro x accumulation x world size",
                         allowed=[str(micro * accumulation * _world(args))])
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if args.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if args.offload == "optimizer_and_params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_batch_size": total,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
    }
    if args.gradient_clipping is not None or auto:
        config["gradient_clipping"] = args.gradient_clipping if args.gradient_clipping is not None else "auto"
    config["zero_optimization"] = zero
    if auto and args.precision == "auto":
        config["bf16"] = {"enabled": "auto"}
        config["fp16"] = {"enabled": "auto"}
    else:
        config["bf16"] = {"enabled": precision == "bf16"}
        config["fp16"] = {"enabled": precision == "fp16"}
        if precision == "fp16":
            config["fp16"].update({"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                                   "hysteresis": 2, "min_loss_scale": 1})
    config["steps_per_print"] = 100
    config["wall_clock_breakdown"] = False
    return merge_extra(config, args.extra_config, "deepspeed")


def merge_extra(config: dict[str, Any], extra: dict[str, Any], tool: str) -> dict[str, Any]:
    """Merge extra_config into config (sections merge key by key). Refuses keys the tool does not know,
    and a merged result the tool would reject or silently ignore (e.g. fsdp_config on MULTI_GPU)."""
    if tool == "accelerate":
        top, nested = keys.ACCELERATE_TOP_KEYS, {k: v for _, (k, v) in keys.ACCELERATE_NESTED.items()}
    else:
        top, nested = keys.DEEPSPEED_TOP_KEYS, dict(keys.DEEPSPEED_NESTED)
    merged = json.loads(json.dumps(config))
    for key, value in extra.items():
        if tool == "deepspeed" and key in keys.DEEPSPEED_REMOVED_KEYS:
            raise InputError("extra_config", f"{key!r} was removed in DeepSpeed {keys.DEEPSPEED_VERSION}, which "
                             f"refuses to start with it: {keys.DEEPSPEED_REMOVED_KEYS[key]}", allowed=sorted(top))
        if key not in top:
            raise InputError("extra_config", f"{key!r} is not a {tool} config key (checked against {tool} "
                             f"{keys.ACCELERATE_VERSION if tool == 'accelerate' else keys.DEEPSPEED_VERSION})",
                             allowed=sorted(top))
        if isinstance(value, dict) and key in nested:
            bad = keys.unknown_keys(value, nested[key])
            if bad:
                raise InputError("extra_config", f"{key}: unknown key(s) {bad}", allowed=sorted(nested[key]))
            section = merged.setdefault(key, {})
            for sub, item in value.items():
                inner = f"{key}.{sub}"
                if isinstance(item, dict) and inner in nested:
                    bad = keys.unknown_keys(item, nested[inner])
                    if bad:
                        raise InputError("extra_config", f"{inner}: unknown key(s) {bad}",
                                         allowed=sorted(nested[inner]))
                    section.setdefault(sub, {}).update(item)
                else:
                    section[sub] = item
        else:
            merged[key] = value
    problems = accelerate_problems(merged) if tool == "accelerate" else deepspeed_problems(merged)
    if problems:
        raise InputError("extra_config", f"the merged {tool} config would be wrong: " + "; ".join(problems))
    return merged


def build_accelerate(args: RenderLaunchInput) -> Plan:
    words: list[str | tuple[str]] = ["accelerate", "launch", "--config_file", ("$HERE/accelerate_config.yaml",)]
    needs_rank = False
    if args.nnodes > 1:
        needs_rank = args.node_rank is None
        words += ["--machine_rank", _node_rank_word(args)]
    if args.max_restarts:
        words += ["--max_restarts", str(args.max_restarts)]
    words += [args.script, *script_words(args)]
    notes = ["every setting lives in accelerate_config.yaml; nothing falls back to accelerate's defaults (DIST-08)"]
    port = None
    if args.nnodes > 1:
        port = args.port or DEFAULT_STATIC_PORT
        notes.append(f"{args.nnodes} machines: the same two files on every node, each started with its NODE_RANK")
    elif args.port is not None:
        port = args.port
    return Plan(command=words, notes=notes, needs_node_rank=needs_rank, port=port)


def build_deepspeed(args: RenderLaunchInput) -> Plan:
    words: list[str | tuple[str]] = ["deepspeed"]
    notes = ["GPUs are chosen with --include (the deepspeed launcher overrides CUDA_VISIBLE_DEVICES, DIST-09)"]
    port = args.port or DEFAULT_STATIC_PORT
    needs_rank = False
    if args.nnodes > 1:
        needs_rank = args.node_rank is None
        words += ["--hostfile", ("$HERE/hostfile",), "--no_ssh", "--node_rank", _node_rank_word(args),
                  "--master_addr", args.master_addr or "", "--master_port", str(port)]
        notes.append("multi-node without pdsh/ssh: every node runs this script with its own NODE_RANK (--no_ssh)")
    else:
        if args.gpus:
            words += ["--include", f"localhost:{args.gpus.replace(' ', '')}"]
        else:
            words += ["--num_gpus", str(args.nproc_per_node)]
        words += ["--master_port", str(port)]
    notes.append("the launcher passes --local_rank=N to the script: accept it (argparse --local_rank, as "
                 "deepspeed.add_config_arguments and the HF Trainer do) or the script exits with 'unrecognized "
                 "arguments' (DIST-04)")
    flag = "--deepspeed" if args.hf_trainer else "--deepspeed_config"
    words += [args.script, *script_words(args), flag, ("$HERE/ds_config.json",)]
    notes.append(f"the script receives {flag} ds_config.json" + (" (HF Trainer/TrainingArguments)" if args.hf_trainer
                                                                  else " (deepspeed.add_config_arguments)"))
    return Plan(command=words, notes=notes, needs_node_rank=needs_rank, port=port)


# ---------------------------------------------------------------------------------------- checks


def config_checks(launcher: str, text: str, args: RenderLaunchInput) -> list[Check]:
    """Parse the rendered config and hold it against the real key sets and DeepSpeed's batch rule."""
    import yaml

    checks: list[Check] = []
    try:
        data = yaml.safe_load(text) if launcher == "accelerate" else json.loads(text)
    except (yaml.YAMLError, ValueError) as err:
        return [Check(name="config_parses", verdict=Verdict.FAIL, observed=str(err)[:300], threshold="parses",
                      explanation="the rendered config does not parse: please report this template bug")]
    kind = "YAML" if launcher == "accelerate" else "JSON"
    checks.append(Check(name="config_parses", verdict=Verdict.PASS, observed=f"{kind} with {len(data)} keys",
                        threshold=f"valid {kind}", explanation="parsed back from the rendered text"))
    problems = accelerate_problems(data) if launcher == "accelerate" else deepspeed_problems(data)
    source = (f"accelerate {keys.ACCELERATE_VERSION}" if launcher == "accelerate"
              else f"deepspeed {keys.DEEPSPEED_VERSION}")
    checks.append(Check(name="config_keys", verdict=Verdict.FAIL if problems else Verdict.PASS,
                        observed="; ".join(problems) if problems else "every key is known",
                        threshold=f"keys and values accepted by {source}",
                        explanation="unknown keys are silently ignored by the tool, so they are errors here"
                        if problems else "keys checked against the tool's own sources",
                        entry=E_ACCEL if launcher == "accelerate" else E_DS_PRECISION))
    if launcher == "deepspeed":
        checks.append(batch_check(data, _world(args)))
    return checks


def accelerate_problems(data: dict[str, Any]) -> list[str]:
    problems = [f"unknown key {k}" for k in keys.unknown_keys(data, keys.ACCELERATE_TOP_KEYS)]
    distributed = data.get("distributed_type")
    if distributed not in keys.ACCELERATE_DISTRIBUTED_TYPES:
        problems.append(f"distributed_type {distributed!r}")
    if data.get("mixed_precision") not in keys.ACCELERATE_MIXED_PRECISION:
        problems.append(f"mixed_precision {data.get('mixed_precision')!r}")
    for dtype, (section, allowed) in keys.ACCELERATE_NESTED.items():
        value = data.get(section) or {}
        if value and distributed != dtype:
            problems.append(f"{section} is ignored unless distributed_type is {dtype}")
        problems += [f"unknown key {section}.{k}" for k in keys.unknown_keys(value, allowed)]
    if distributed == "MULTI_GPU" and data.get("num_processes", 0) < 2:
        problems.append("MULTI_GPU with fewer than 2 processes (accelerate refuses it)")
    machines = data.get("num_machines", 1)
    if machines > 1 and not data.get("main_process_ip"):
        problems.append("num_machines > 1 without main_process_ip")
    if data.get("num_processes", 0) % max(machines, 1):
        problems.append("num_processes is not a multiple of num_machines")
    return problems


def deepspeed_problems(data: dict[str, Any]) -> list[str]:
    problems = [f"unknown key {k}" for k in keys.unknown_keys(data, keys.DEEPSPEED_TOP_KEYS)]
    for path, allowed in keys.DEEPSPEED_NESTED.items():
        node: Any = data
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            problems += [f"unknown key {path}.{k}" for k in keys.unknown_keys(node, allowed)]
    zero = data.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        problems.append(f"zero_optimization.stage {stage!r} (0-3)")
    for section in ("offload_optimizer", "offload_param"):
        device = (zero.get(section) or {}).get("device", "none")
        if device not in keys.DEEPSPEED_OFFLOAD_DEVICES:
            problems.append(f"{section}.device {device!r}")
    if (zero.get("offload_param") or {}).get("device", "none") != "none" and stage != 3:
        problems.append("offload_param needs stage 3")
    bf16 = (data.get("bf16") or {}).get("enabled")
    fp16 = (data.get("fp16") or {}).get("enabled")
    if bf16 is True and fp16 is True:
        problems.append("bf16 and fp16 both enabled (DeepSpeed asserts, AMP-15)")
    return problems


def batch_check(data: dict[str, Any], world: int) -> Check:
    total = data.get("train_batch_size")
    micro = data.get("train_micro_batch_size_per_gpu")
    accumulation = data.get("gradient_accumulation_steps")
    rule = "train_batch_size = micro x gradient_accumulation_steps x world size"
    values = (total, micro, accumulation)
    if any(v == "auto" for v in values):
        return Check(name="batch_sizes", verdict=Verdict.SKIP, observed=f"{values} ('auto')", threshold=rule,
                     explanation="'auto' values are filled in by the HF Trainer from TrainingArguments")
    if not all(isinstance(v, int) and v > 0 for v in values):
        return Check(name="batch_sizes", verdict=Verdict.FAIL, observed=str(values), threshold=rule,
                     explanation="DeepSpeed needs positive integers (or 'auto' with the HF Trainer)", entry=E_DS_BATCH)
    ok = total == micro * accumulation * world
    return Check(name="batch_sizes", verdict=Verdict.PASS if ok else Verdict.FAIL,
                 observed=f"{total} {'=' if ok else '!='} {micro} x {accumulation} x {world}", threshold=rule,
                 explanation="DeepSpeed's own assertion holds" if ok else "DeepSpeed will refuse to start",
                 entry=None if ok else E_DS_BATCH)


def flag_check(args: RenderLaunchInput, words: list[str | tuple[str]]) -> Check:
    """Every --flag of the launch command exists in the launcher it is passed to."""
    known = {"torchrun": keys.TORCHRUN_FLAGS, "accelerate": keys.ACCELERATE_LAUNCH_FLAGS,
             "deepspeed": keys.DEEPSPEED_LAUNCH_FLAGS}[args.launcher]
    version = {"torchrun": f"torch {keys.TORCH_VERSION}", "accelerate": f"accelerate {keys.ACCELERATE_VERSION}",
               "deepspeed": f"deepspeed {keys.DEEPSPEED_VERSION}"}[args.launcher]
    flags = []
    for word in words:
        text = word[0] if isinstance(word, tuple) else word
        if text == args.script:
            break  # the script's own arguments follow
        if text.startswith("--"):
            flags.append(text.split("=", 1)[0])
    bad = [f for f in flags if f not in known]
    return Check(name="launcher_flags", verdict=Verdict.FAIL if bad else Verdict.PASS,
                 observed=f"unknown: {bad}" if bad else f"{len(flags)} flags: {' '.join(flags)}",
                 threshold=f"flags of {version}", explanation="the launcher would exit with 'unrecognized arguments'"
                 if bad else "every flag exists in the launcher", entry=E_RDZV if args.launcher == "torchrun" else None)


def host_checks(args: RenderLaunchInput, plan: Plan, local: LocalGpus | None) -> list[Check]:
    checks = [port_check(args, plan), gpu_count_check(args, local)]
    if args.nnodes > 1 and args.master_addr and not _is_ip(args.master_addr):
        checks.append(Check(name="master_addr", verdict=Verdict.WARN, observed=f"hostname {args.master_addr}",
                            threshold="an IP every node can route to",
                            explanation="a hostname may resolve to 127.0.1.1 or not at all on other nodes: prefer the "
                            "head node's private IP (NODE-02)", entry=E_MASTER))
    return checks


def _local_address(host: str) -> bool | None:
    """Is ``host`` an address of this machine? Binding to it succeeds only if it is."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for family, kind, proto, _name, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind((address[0], 0))
                return True
        except OSError:
            continue
    return False


def port_check(args: RenderLaunchInput, plan: Plan) -> Check:
    threshold = "free on the head node (a test bind like TCPStore's)"
    if not args.check_host:
        return Check(name="port_free", verdict=Verdict.SKIP, observed="check_host=false", threshold=threshold,
                     explanation="run port_status on the head node before launching", entry=E_PORT)
    if plan.port is None:
        return Check(name="port_free", verdict=Verdict.SKIP, observed="no fixed port: chosen free at launch",
                     threshold=threshold, explanation="--standalone / port 0 picks a free port itself", entry=E_PORT)
    if args.scheduler == "slurm":
        return Check(name="port_free", verdict=Verdict.SKIP, observed=f"port {plan.port} on the allocation's head node",
                     threshold=threshold, explanation="checked on the Slurm head node, not here", entry=E_PORT)
    if args.nnodes > 1 and args.master_addr:
        local = _local_address(args.master_addr)
        if local is not True:
            where = "cannot be resolved here" if local is None else "is another machine"
            return Check(name="port_free", verdict=Verdict.SKIP, observed=f"head node {args.master_addr} {where}",
                         threshold=threshold, explanation=f"run port_status(port={plan.port}) on {args.master_addr}",
                         entry=E_PORT)
    status = port_status(PortStatusInput(port=plan.port), no_progress)
    verdict = {Verdict.PASS: Verdict.PASS, Verdict.WARN: Verdict.WARN}.get(status.verdict, Verdict.FAIL)
    hint = "" if status.free else (f"; use port={status.suggested_port}" if status.suggested_port else "")
    return Check(name="port_free", verdict=verdict, observed=f"{status.summary} (on {socket.gethostname()})",
                 threshold=threshold, explanation=status.next_step + hint, entry=E_PORT)


def gpu_count_check(args: RenderLaunchInput, local: LocalGpus | None) -> Check:
    threshold = f"nproc_per_node={args.nproc_per_node} <= GPUs visible to the launch"
    if local is None:
        return Check(name="gpu_count", verdict=Verdict.SKIP, observed="check_host=false", threshold=threshold,
                     explanation="checked where you launch: gpu_health(expect_gpus=N) there", entry=E_ORDINAL)
    if local.source == "none":
        return Check(name="gpu_count", verdict=Verdict.SKIP, observed=local.detail, threshold=threshold,
                     explanation="nothing to count on this host: check on the GPU box (gpu_health)", entry=E_ORDINAL)
    if local.count is None:
        return Check(name="gpu_count", verdict=Verdict.UNKNOWN, observed=local.detail, threshold=threshold,
                     explanation="the GPU list could not be read", entry=E_ORDINAL)
    wanted = args.nproc_per_node
    if args.gpus:  # the launch restricts itself to these indices
        visible = len(args.gpus.split(","))
        if local.source == "nvml" and any(g.strip().isdigit() and int(g) >= local.count for g in args.gpus.split(",")):
            return Check(name="gpu_count", verdict=Verdict.FAIL, observed=f"gpus={args.gpus} but {local.count} GPU(s) "
                         f"visible here", threshold=threshold, explanation="invalid device ordinal at start (DIST-05)",
                         entry=E_ORDINAL)
        wanted = min(wanted, visible)
    if local.count < wanted:
        return Check(name="gpu_count", verdict=Verdict.FAIL, observed=f"{local.count} GPU(s) visible: {local.detail}",
                     threshold=threshold, explanation="ranks beyond the visible GPUs fail with 'invalid device "
                     "ordinal' (DIST-05): lower nproc_per_node or fix CUDA_VISIBLE_DEVICES", entry=E_ORDINAL)
    verdict = Verdict.PASS if local.source == "nvml" else Verdict.UNKNOWN
    explanation = "enough GPUs" if verdict is Verdict.PASS else "CUDA_VISIBLE_DEVICES names enough devices, but NVML " \
        "could not confirm they exist"
    return Check(name="gpu_count", verdict=verdict, observed=f"{local.count} GPU(s): {local.detail}",
                 threshold=threshold, explanation=explanation, entry=E_ORDINAL)


# ---------------------------------------------------------------------------------------- render


def _exports(args: RenderLaunchInput) -> dict[str, str]:
    env = {}
    if args.gpus and args.launcher != "deepspeed":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = args.gpus.replace(" ", "")
    if args.omp_num_threads:
        env["OMP_NUM_THREADS"] = str(args.omp_num_threads)
    if args.nccl_socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = args.nccl_socket_ifname
        env["GLOO_SOCKET_IFNAME"] = args.nccl_socket_ifname
    env["PYTHONUNBUFFERED"] = "1"
    env.update(args.env)
    return env


def render_launch(args: RenderLaunchInput) -> RenderLaunchResult:
    validate(args)
    profile = load_profile_for(args.provider)
    local = local_gpus() if args.check_host else None
    facts = gpu_facts(args, local)
    precision = resolve_precision(args, facts)
    generated = (f"render_launch(launcher={args.launcher}, nnodes={args.nnodes}, nproc_per_node={args.nproc_per_node}"
                 f"{', provider=' + profile.name if profile else ''})")
    common = {"generated": generated, "launcher": args.launcher, "script": args.script, "nnodes": args.nnodes,
              "nproc_per_node": args.nproc_per_node}
    files: list[RenderedFile] = []
    checks: list[Check] = []
    if args.launcher == "torchrun":
        plan = build_torchrun(args)
    elif args.launcher == "accelerate":
        config = accelerate_config(args, precision)
        text = engine.render("accelerate_config.yaml.j2", {**common, "config": config,
                                                           "comments": accelerate_comments(args),
                                                           "distributed_type": config["distributed_type"],
                                                           "accelerate_version": keys.ACCELERATE_VERSION})
        files.append(RenderedFile(name="accelerate_config.yaml", language="yaml", executable=False, text=text))
        checks += config_checks("accelerate", text, args)
        checks.append(accelerate_loads(text, args.check_host))
        plan = build_accelerate(args)
    else:
        config = deepspeed_config(args, precision)
        text = engine.render("deepspeed_config.json.j2", {"config": config})
        files.append(RenderedFile(name="ds_config.json", language="json", executable=False, text=text))
        checks += config_checks("deepspeed", text, args)
        plan = build_deepspeed(args)
        if args.nnodes > 1:
            hosts = [args.master_addr] + [f"node{i}" for i in range(1, args.nnodes)]
            hostfile = engine.render("deepspeed_hostfile.j2", {"hosts": hosts, "nproc_per_node": args.nproc_per_node})
            files.append(RenderedFile(name="hostfile", language="text", executable=False, text=hostfile))
            plan.notes.append("hostfile: with --no_ssh only its line count and slots matter; replace node1.. with "
                              "the real names if you switch to pdsh")
    dollar = literal_dollar_note(args)
    if dollar:
        plan.notes.insert(0, dollar)
    profile_env = {}
    if profile:
        overrides = profile_context(profile) or {}
        profile_env = {"HF_HOME": overrides["hf_home"], **overrides["env"]}
    command = engine.shell_words(plan.command)
    template = "launch.sbatch.j2" if args.scheduler == "slurm" else "launch.sh.j2"
    job_name = PurePosixPath(args.script).stem or "train"
    script_text = engine.render(template, {**common, "notes": plan.notes, "command": command,
                                           "needs_node_rank": plan.needs_node_rank, "profile_env": profile_env,
                                           "env": _exports(args), "job_name": job_name})
    name = "launch.sbatch" if args.scheduler == "slurm" else "launch.sh"
    files.insert(0, RenderedFile(name=name, language="bash", executable=True, text=script_text))
    checks.append(flag_check(args, plan.command))
    checks += shell_checks(script_text)
    checks.append(precision_check(args, precision, facts))
    checks += host_checks(args, plan, local)
    verdict = worst([c.verdict for c in checks])
    failing = [c.name for c in checks if c.verdict in (Verdict.FAIL, Verdict.UNKNOWN)]
    if args.launcher == "torchrun" and args.precision == "auto":
        precision = "set by the script"
    summary = (f"{args.launcher}: {args.nnodes} node(s) x {args.nproc_per_node} = world size {_world(args)}, "
               f"{effective_strategy(args) or 'strategy set by the script'}, {precision}; {verdict.value}"
               + (f" ({', '.join(failing)})" if failing else ""))
    refs = [E_PORT, E_RDZV, E_ORDINAL, E_BF16]
    if args.nnodes > 1:
        refs += [E_MASTER, E_SAME]
    if args.launcher == "accelerate":
        refs.append(E_ACCEL)
    if args.launcher == "deepspeed":
        refs += [E_DS_DEVICES, E_DS_PRECISION]
    return RenderLaunchResult(verdict=verdict, launcher=args.launcher, summary=summary, world_size=_world(args),
                              precision=precision, command=command, files=files, checks=checks, notes=plan.notes,
                              references=refs)
