"""``host_facts``: everything a fleet check needs to know about one box, gathered on that box.

An internal remote spec: the ``preflight`` tool calls it on every host through the transport
(``spec.call({..., "host": h})``) and judges the rows side by side. It only ever looks at the machine
it runs on. The GPU part reuses the ``gpu_health`` probe (same backend choice, so
``RGT_HEALTH_FAKE`` scenarios work here too); torch is imported only in a child process with a
timeout, as ``skill_info`` does, because a broken CUDA install can hang an import.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from pydantic import Field

from ..health.checks import Check
from ..health.tool import HealthInput, gpu_health
from ..models import StrictModel, Verdict
from ..toolspec import Progress, ToolSpec
from .network import HeadListener, IbPort, Route, connect_with_retry, ib_ports, local_addresses, route_to

TORCH_PROBE = """
import json, sys
out = {"torch": None, "torch_cuda": None, "nccl": None, "cuda_available": False, "cuda_devices": 0,
       "gloo": False, "nccl_backend": False}
import torch, torch.distributed as dist
out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, gloo=dist.is_gloo_available(),
           nccl_backend=dist.is_nccl_available())
try:
    out["cuda_available"] = torch.cuda.is_available()
    out["cuda_devices"] = torch.cuda.device_count() if out["cuda_available"] else 0
except Exception as err:
    out["cuda_error"] = repr(err)
if out["nccl_backend"]:
    v = torch.cuda.nccl.version()
    out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
print("RGT-TORCH " + json.dumps(out))
"""


class HostFactsInput(StrictModel):
    head_addr: str | None = Field(None, max_length=255, description="Address (or name) of the head node as the "
                                  "workers will use it for the rendezvous; None: no network checks")
    port: int = Field(29400, ge=1, le=65535, description="Rendezvous port on the head")
    is_head: bool = Field(False, description="This box is the head: hold head:port open while workers connect")
    workers: int = Field(0, ge=0, le=4096, description="How many worker connections the head waits for")
    connect_wait_s: float = Field(6.0, ge=0.5, le=60, description="Head: how long to hold the port open; workers: "
                                  "how long to retry the connect")
    checkpoint_dir: str = Field("~", max_length=4096, description="Where checkpoints will be written (free disk)")
    expect_gpus: int | None = Field(None, ge=1, le=1024, description="GPUs this box should have")
    timeout_s: float = Field(60.0, ge=5, le=600, description="Limit for the torch probe and for NVML, each")


class HealthSummary(StrictModel):
    verdict: Verdict
    summary: str
    backend: str
    gpus_found: int
    driver_version: str | None
    cuda_driver_version: str | None
    gpu_models: list[str] = Field(description="One name per GPU")
    gpu_memory_bytes: list[int | None]
    mig: list[str] = Field(description="MIG mode per GPU as gpu_health read it")
    compute_modes: list[str]
    findings: list[Check] = Field(description="gpu_health checks that are not PASS/SKIP (host and per GPU)")


class TorchFacts(StrictModel):
    python: str
    python_executable: str
    torch: str | None = Field(description="torch.__version__, None when torch does not import")
    torch_cuda: str | None = Field(description="torch.version.cuda (None: a CPU build)")
    nccl: str | None = Field(description="NCCL version as torch reports it (torch.cuda.nccl.version())")
    cuda_available: bool
    cuda_devices: int
    gloo: bool
    error: str | None = Field(description="Why torch could not be probed")


class HostFacts(StrictModel):
    hostname: str
    platform: str
    box_time: float = Field(description="time.time() on the box when the reply was built")
    elapsed_s: float = Field(description="Seconds the box spent gathering (for the clock-offset estimate)")
    health: HealthSummary
    torch: TorchFacts
    checkpoint_dir: str
    disk_free_bytes: int | None
    disk_detail: str
    addresses: dict[str, list[str]] = Field(description="Interface → addresses on this box")
    route: Route | None = Field(description="Route to the head; None without head_addr")
    head_resolves_to: list[str] = Field(default_factory=list, description="What head_addr resolves to here")
    ib_ports: list[IbPort]
    head_connect: str | None = Field(description="Worker: ok / refused / timeout / unresolvable / error")
    head_connect_detail: str
    port_free: bool | None = Field(description="Head: was the rendezvous port free to bind")
    port_detail: str
    listener_accepted: int = Field(0, description="Head: worker connections its listener accepted")


def summarise_health(expect_gpus: int | None, timeout_s: float) -> HealthSummary:
    report = gpu_health(HealthInput(expect_gpus=expect_gpus, timeout_s=min(timeout_s, 300)), lambda *a, **k: None)

    def observed(gpu, name: str) -> str:
        return next((c.observed for c in gpu.checks if c.name == name), "?")

    findings = [c for c in report.host_checks if c.verdict not in (Verdict.PASS, Verdict.SKIP)]
    for gpu in report.gpus:
        findings += [c.model_copy(update={"name": f"gpu{gpu.index}.{c.name}"}) for c in gpu.checks
                     if c.verdict not in (Verdict.PASS, Verdict.SKIP)]
    return HealthSummary(
        verdict=report.verdict, summary=report.summary, backend=report.backend, gpus_found=report.gpus_found,
        driver_version=report.driver_version, cuda_driver_version=report.cuda_driver_version,
        gpu_models=[g.name or "?" for g in report.gpus], gpu_memory_bytes=[g.memory_total_bytes for g in report.gpus],
        mig=[observed(g, "mig_mode") for g in report.gpus], compute_modes=[observed(g, "compute_mode")
                                                                          for g in report.gpus],
        findings=findings)


def probe_torch(timeout_s: float) -> TorchFacts:
    """torch, its CUDA and NCCL, imported in a child of this very python (the runtime's)."""
    base = {"python": platform.python_version(), "python_executable": sys.executable}
    empty = {"torch": None, "torch_cuda": None, "nccl": None, "cuda_available": False, "cuda_devices": 0,
             "gloo": False}
    try:
        out = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=timeout_s,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return TorchFacts(**base, **empty, error=f"import torch did not finish in {timeout_s:g} s")
    line = next((x for x in out.stdout.splitlines() if x.startswith("RGT-TORCH ")), None)
    if line is None:
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return TorchFacts(**base, **empty, error=f"torch does not import with {sys.executable}: {last[:300]}")
    data = json.loads(line.removeprefix("RGT-TORCH "))
    return TorchFacts(**base, torch=data["torch"], torch_cuda=data["torch_cuda"], nccl=data["nccl"],
                      cuda_available=data["cuda_available"], cuda_devices=data["cuda_devices"], gloo=data["gloo"],
                      error=data.get("cuda_error"))


def free_disk(path: str) -> tuple[int | None, str]:
    """Free bytes where checkpoints go; a directory not made yet is measured at its nearest parent."""
    target = Path(path).expanduser().absolute()  # relative: to the home the box's runtime starts in
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError as err:
        return None, f"{probe}: {err.strerror or err}"
    where = str(target) if probe == target else f"{target} (not created yet; measured at {probe})"
    return free, where


def host_facts(args: HostFactsInput, progress: Progress) -> HostFacts:
    started = time.monotonic()
    listener = None
    if args.head_addr and args.is_head:
        listener = HeadListener(args.port, args.workers, args.connect_wait_s if args.workers else 0.0).start()
    results: dict[str, object] = {}

    def run(name: str, fn) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.__setitem__(name, fn()), daemon=True)
        thread.start()
        return thread

    threads = [run("health", lambda: summarise_health(args.expect_gpus, args.timeout_s)),
               run("torch", lambda: probe_torch(args.timeout_s))]
    if args.head_addr and not args.is_head:
        threads.append(run("connect", lambda: connect_with_retry(args.head_addr, args.port, args.connect_wait_s)))
    progress(0, 3, "gathering health, torch and network facts")
    addresses = local_addresses()
    route = head_resolves = None
    if args.head_addr:
        from .network import resolve_addresses

        head_resolves = resolve_addresses(args.head_addr)
        route = route_to(head_resolves[0], addresses) if head_resolves else Route(
            iface=None, src=None, speed_mbps=None, detail=f"{args.head_addr} does not resolve on this box")
    disk_free, disk_detail = free_disk(args.checkpoint_dir)
    for thread in threads:
        thread.join(args.timeout_s * 2 + 10)
    if listener is not None:
        listener.wait()
    connect = results.get("connect")
    return HostFacts(
        hostname=socket.gethostname(), platform=f"{platform.system()} {platform.release()} {platform.machine()}",
        box_time=time.time(), elapsed_s=round(time.monotonic() - started, 3),
        health=results["health"], torch=results["torch"],  # type: ignore[arg-type]
        checkpoint_dir=args.checkpoint_dir, disk_free_bytes=disk_free, disk_detail=disk_detail, addresses=addresses,
        route=route, head_resolves_to=head_resolves or [], ib_ports=ib_ports(),
        head_connect=getattr(connect, "outcome", None),
        head_connect_detail=getattr(connect, "detail", "this box is the head" if args.is_head else "not checked"),
        port_free=listener.free if listener else None,
        port_detail=listener.detail if listener else "not the head",
        listener_accepted=len(listener.accepted) if listener else 0)


def main() -> None:
    """``python -m remote_gpu_trainer.fleet.facts``: JSON arguments on stdin, one JSON result line on
    stdout. The srun fan-out runs this on every node of an allocation (no ssh involved)."""
    arguments = json.loads(sys.stdin.read() or "{}")
    result = HOST_FACTS.call(arguments)
    print(json.dumps({"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                      "result": result.model_dump(mode="json", exclude={"host", "box"})}), flush=True)


HOST_FACTS = ToolSpec(
    name="host_facts",
    cli="host-facts",
    title="One box's facts for a fleet pre-flight",
    description="Internal: health summary, versions, disk, clock, route to the head, RDMA ports, rendezvous "
                "reachability, gathered on the box the preflight tool sends it to.",
    input_model=HostFactsInput,
    output_model=HostFacts,
    run=host_facts,
    read_only=True,
    remote=True,
    internal=True,
)

SPECS = [HOST_FACTS]

if __name__ == "__main__":
    main()
