"""``host_facts``: everything a fleet check needs to know about one box, gathered on that box.

An internal remote spec: the ``preflight`` tool calls it on every host through the transport
(``spec.call({..., "host": h})``) and judges the rows side by side. It only ever looks at the machine
it runs on. The GPU part reuses the ``gpu_health`` probe (same backend choice, so
``RGT_HEALTH_FAKE`` scenarios work here too). The training stack is the user's: the interpreter the job runs
with is found (or taken from ``python=``/``activate=``/the launch script) and probed in a child process with a
timeout (trainenv/), because a broken CUDA install can hang an import. The launch environment is read as a login
shell gets it, with NCCL's own files and the launch script's exports, and checked against this box.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

from pydantic import Field

from ..health.checks import Check
from ..health.tool import HealthInput, probe_gpus
from ..models import StrictModel, Verdict
from ..toolspec import Progress, ToolSpec
from ..trainenv.find import (
    ActivateText,
    LaunchPath,
    PythonPath,
    TrainingEnv,
    activate_field,
    find_training_env,
    launch_field,
    python_field,
)
from ..trainenv.launch import LaunchEnv, cuda_visible_check, endpoint_checks, ifname_checks, read_launch_env
from ..trainenv.login import ShellRead, read_login_env
from ..trainenv.script import read_launch_script
from .network import HeadListener, IbPort, Route, connect_with_retry, ib_ports, local_addresses, route_to


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
    python: PythonPath = python_field()
    activate: ActivateText = activate_field()
    launch: LaunchPath = launch_field("The launch script on this box (read, hashed and parsed, never run)")


class HealthSummary(StrictModel):
    verdict: Verdict
    summary: str
    backend: str
    gpus_found: int
    driver_version: str | None
    cuda_driver_version: str | None
    gpu_models: list[str] = Field(description="One name per GPU")
    gpu_uuids: list[str | None] = Field(default_factory=list, description="One UUID per GPU (CUDA_VISIBLE_DEVICES "
                                        "may name GPUs by UUID)")
    gpu_memory_bytes: list[int | None]
    mig: list[str] = Field(description="MIG mode per GPU as gpu_health read it")
    compute_modes: list[str]
    findings: list[Check] = Field(description="gpu_health checks that are not PASS/SKIP (host and per GPU)")


class PortHolder(StrictModel):
    pid: int | None = Field(description="None: the socket's owner is not visible here")
    command: str = Field(description="Its whole command line")
    listening_on: list[str] = Field(description="Local address:port of each listening socket")
    loopback_only: bool = Field(description="Every listening address is a loopback one: other machines cannot "
                                "connect to it")


class HostFacts(StrictModel):
    hostname: str
    platform: str
    box_time: float = Field(description="time.time() on the box when the reply was built")
    elapsed_s: float = Field(description="Seconds the box spent gathering (for the clock-offset estimate)")
    health: HealthSummary
    torch: TrainingEnv = Field(description="The training interpreter (found or given) and its torch stack")
    launch_env: LaunchEnv = Field(description="NCCL_*/GLOO_*/CUDA_VISIBLE_DEVICES/MASTER_* as a launch here gets them")
    env_checks: list[Check] = Field(default_factory=list, description="The launch environment against this box: "
                                    "interfaces, CUDA_VISIBLE_DEVICES against NVML, the endpoint")
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
    port_holders: list[PortHolder] = Field(default_factory=list, description="Head: what holds the port when it "
                                           "was not free")
    listener_accepted: int = Field(0, description="Head: worker connections its listener accepted")


def summarise_health(expect_gpus: int | None, timeout_s: float) -> HealthSummary:
    report = probe_gpus(HealthInput(expect_gpus=expect_gpus, timeout_s=min(timeout_s, 300)), lambda *a, **k: None)

    def observed(gpu, name: str) -> str:
        return next((c.observed for c in gpu.checks if c.name == name), "?")

    findings = [c for c in report.host_checks if c.verdict not in (Verdict.PASS, Verdict.SKIP)]
    for gpu in report.gpus:
        findings += [c.model_copy(update={"name": f"gpu{gpu.index}.{c.name}"}) for c in gpu.checks
                     if c.verdict not in (Verdict.PASS, Verdict.SKIP)]
    return HealthSummary(
        verdict=report.verdict, summary=report.summary, backend=report.backend, gpus_found=report.gpus_found,
        driver_version=report.driver_version, cuda_driver_version=report.cuda_driver_version,
        gpu_models=[g.name or "?" for g in report.gpus], gpu_uuids=[g.uuid for g in report.gpus],
        gpu_memory_bytes=[g.memory_total_bytes for g in report.gpus],
        mig=[observed(g, "mig_mode") for g in report.gpus], compute_modes=[observed(g, "compute_mode")
                                                                          for g in report.gpus],
        findings=findings)


def port_holders(port: int) -> list[PortHolder]:
    """Who listens on ``port`` here, and on which addresses (a holder bound to 127.0.0.1 only is named so)."""
    from ..processes.ports import scan_ports
    from ..processes.snapshot import snapshot

    try:
        scan = scan_ports([port])
    except OSError:
        return []
    by_pid: dict[int | None, list[str]] = {}
    for entry in scan.sockets:
        if entry.local_port == port and entry.listening:
            for pid in scan.pids_of(entry) or [None]:
                by_pid.setdefault(pid, []).append(entry.local)
    holders = []
    for pid, local in by_pid.items():
        info = snapshot(pid) if pid else None
        loopback = all(_is_loopback(address.rsplit(":", 1)[0].strip("[]")) for address in local)
        holders.append(PortHolder(pid=pid, command=info.command if info else "(not visible here)",
                                  listening_on=local, loopback_only=loopback))
    return holders


def _is_loopback(address: str) -> bool:
    import ipaddress

    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


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

    def training() -> TrainingEnv:
        login = results["login"] = read_login_env()
        return find_training_env(args.python, args.activate, args.launch, mode="import", timeout_s=args.timeout_s,
                                 login=login)

    threads = [run("health", lambda: summarise_health(args.expect_gpus, args.timeout_s)), run("torch", training)]
    if args.head_addr and not args.is_head:
        threads.append(run("connect", lambda: connect_with_retry(args.head_addr, args.port, args.connect_wait_s)))
    progress(0, 3, "gathering health, training environment and network facts")
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
    login = results.get("login") or ShellRead(None, "bash -l -i", "the login shell was not read in time")
    script = read_launch_script(args.launch, login.env) if args.launch else None
    launch_env = read_launch_env(login, script)
    health: HealthSummary = results["health"]  # type: ignore[assignment]
    env_checks = ifname_checks(launch_env, addresses, route.iface if route else None)
    visible = cuda_visible_check(launch_env.get("CUDA_VISIBLE_DEVICES"), health.gpus_found, health.gpu_uuids)
    env_checks += [visible] if visible else []
    env_checks += endpoint_checks(launch_env, args.head_addr, args.port if args.head_addr else None)
    return HostFacts(
        hostname=socket.gethostname(), platform=f"{platform.system()} {platform.release()} {platform.machine()}",
        box_time=time.time(), elapsed_s=round(time.monotonic() - started, 3),
        health=health, torch=results["torch"], launch_env=launch_env, env_checks=env_checks,  # type: ignore[arg-type]
        checkpoint_dir=args.checkpoint_dir, disk_free_bytes=disk_free, disk_detail=disk_detail, addresses=addresses,
        route=route, head_resolves_to=head_resolves or [], ib_ports=ib_ports(),
        head_connect=getattr(connect, "outcome", None),
        head_connect_detail=getattr(connect, "detail", "this box is the head" if args.is_head else "not checked"),
        port_free=listener.free if listener else None,
        port_detail=listener.detail if listener else "not the head",
        port_holders=port_holders(args.port) if listener and not listener.free else [],
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
