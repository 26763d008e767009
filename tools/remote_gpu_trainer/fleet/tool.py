"""The ``preflight`` tool (``rgt preflight``): check every node of a multi-node run at once.

It is a local tool that takes the hosts itself: it sends ``host_facts`` to every host in parallel
(bounded concurrency, a deadline per host, so one dead box never stalls the rest), judges each row
and the fleet as a whole, suggests the NCCL settings and renders the launch command. With
``allreduce=true`` it then runs a short collective benchmark on every reachable host.

MCP clients give up on a call after about a minute, so the work runs as a background job
(:mod:`remote_gpu_trainer.jobs`): the call waits up to ``wait_s`` and otherwise answers with a
``job_id``; ``preflight(job_id=…)`` returns progress and, with ``done: true``, the result.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from .. import jobs
from ..models import StrictModel, Verdict
from ..tables import format_table
from ..toolspec import Progress, ToolSpec
from ..trainenv.find import ActivateText, LaunchPath, PythonPath, activate_field, launch_field
from .facts import HOST_FACTS, HostFacts, HostFactsInput
from .hosts import FleetHost, fleet_from, srun_available
from .verdicts import (
    FleetCheck,
    HostError,
    HostRow,
    fleet_checks,
    fleet_verdict,
    host_checks,
    nccl_env,
    row_verdict,
    unreachable_check,
)


class PreflightInput(StrictModel):
    hosts: list[str] | None = Field(None, max_length=1024, description="The fleet as ssh hosts (aliases or "
                                    "user@name[:port]), head first unless head= says otherwise")
    hostfile: str | None = Field(None, max_length=4096, description="Path to a hostfile: DeepSpeed style "
                                 "'worker-0 slots=8' or one host per line, # comments")
    slurm: bool = Field(False, description="The current Slurm allocation: SLURM_JOB_NODELIST, fanned out with "
                        "srun --ntasks-per-node=1 when srun is present")
    expect_gpus: int | None = Field(None, ge=1, le=1024, description="GPUs every node should have (as gpu_health); "
                                    "default: all nodes must agree")
    head: str | None = Field(None, max_length=255, description="Which host is the head (rendezvous); default the "
                             "first")
    head_addr: str | None = Field(None, max_length=255, description="Address the workers use for the head "
                                  "(its private IP); default: the head's HostName from ssh -G, or the node name")
    port: int = Field(29400, ge=1024, le=65535, description="Rendezvous port on the head (torchrun c10d default "
                      "29400)")
    checkpoint_dir: str = Field("~", max_length=4096, description="Where checkpoints go on every node (free disk)")
    allreduce: bool = Field(False, description="Then run an all-reduce benchmark across the fleet (torchrun, NCCL "
                            "on GPUs, gloo on CPU) and judge bus bandwidth")
    job_id: str | None = Field(None, max_length=80, description="Poll a check started earlier; all other "
                               "arguments are ignored")
    concurrency: int = Field(16, ge=2, le=256, description="Hosts checked at the same time")
    timeout_s: float = Field(90.0, ge=5, le=600, description="Deadline per host for its facts")
    python: PythonPath = Field(None, min_length=1, max_length=4096, description=(
        "The training interpreter on every node (absolute or ~ path, the same on each), e.g. ~/venvs/pt/bin/python. "
        "Default: found per node (the launch script, the login shell's PATH, ~/venvs/*, conda envs, the system "
        "python); each row says which one and how"))
    activate: ActivateText = activate_field()
    launch: LaunchPath = launch_field("The launch script's path on the nodes: compared across nodes (sha256), its "
                                      "exports and torchrun/accelerate endpoint checked, its activation used to "
                                      "find the python. Read, never run")
    wait_s: float | None = Field(45.0, ge=0, le=3600, description="How long this call waits before answering "
                                 "with a job_id (MCP clients give up after about 60 s); null: wait for the result "
                                 "with no job at all (what `rgt preflight` does)")


class PreflightResult(StrictModel):
    done: bool = Field(description="False: still running, call preflight(job_id=…) again")
    job_id: str | None
    state: str = Field(description="running, done or failed")
    progress: str
    elapsed_s: float
    verdict: Verdict = Field(description="Worst over every host row and cross-host check (UNKNOWN while running)")
    summary: str
    head: str | None = None
    head_addr: str | None = None
    port: int | None = None
    hosts: list[HostRow] = Field(default_factory=list)
    fleet_checks: list[FleetCheck] = Field(default_factory=list)
    nccl_env: dict[str, str] = Field(default_factory=dict, description="NCCL_*/GLOO_* settings the checks suggest")
    launch: str | None = Field(None, description="torchrun command for this fleet, from render_launch")
    allreduce: Any = Field(None, description="AllreduceReport when allreduce=true: rows with algbw_gbps and "
                           "busbw_gbps per message size and the judged size")
    notes: list[str] = Field(default_factory=list)


CONNECT_WAIT_S = 6.0
"""How long a worker retries its connect to the head, and the head holds the port per round of workers."""

FactsCaller = Callable[[str, dict], HostFacts]
"""Runs host_facts on one host and returns its facts; raises RemoteError when it cannot."""


def ssh_caller(timeout_s: float) -> FactsCaller:
    """The transport's remote call: the same spec, run on ``host`` over the user's ssh, ended (session and
    box processes) when the per-host deadline passes."""
    from .transport import call_on_host

    def call(host: str, arguments: dict) -> HostFacts:
        return call_on_host(HOST_FACTS, host, arguments, HostFacts, timeout_s)

    return call


def srun_facts(nodes: list[str], arguments: dict, timeout_s: float) -> dict[str, HostFacts | HostError]:
    """Slurm fan-out without ssh: one ``srun --ntasks-per-node=1`` over the allocation's nodes, each
    task running ``python -m remote_gpu_trainer.fleet.facts`` with the JSON arguments on stdin."""
    argv = ["srun", f"--nodes={len(nodes)}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}",
            "--kill-on-bad-exit=0", sys.executable, "-m", "remote_gpu_trainer.fleet.facts"]
    found: dict[str, HostFacts | HostError] = {}
    try:
        out = subprocess.run(argv, input=json.dumps(arguments), capture_output=True, text=True, timeout=timeout_s)
        stderr = out.stderr.strip()
    except subprocess.TimeoutExpired:
        stderr = f"srun did not finish in {timeout_s:g} s"
        out = None
    for line in (out.stdout.splitlines() if out else []):
        try:
            reply = json.loads(line)
            found[reply["node"]] = HostFacts.model_validate(reply["result"])
        except (ValueError, KeyError):
            continue
    for node in nodes:
        found.setdefault(node, HostError(kind="srun_failed", message=stderr[-400:] or "no reply from srun",
                                         next_step="check the allocation (squeue) and run the step by hand"))
    return found


@dataclass
class Reply:
    facts: HostFacts | None
    error: HostError | None
    sent: float
    received: float


def _error_of(host: str, err: BaseException) -> HostError:
    kind = getattr(err, "kind", type(err).__name__)
    return HostError(kind=str(kind), message=str(getattr(err, "message", err)),
                     next_step=str(getattr(err, "next_step", f"check the host by hand: ssh {host} true")))


def gather(fleet: list[str], per_host: dict[str, dict], caller: FactsCaller, concurrency: int, timeout_s: float,
           progress: Progress) -> dict[str, Reply]:
    """host_facts on every host at once, each with its own deadline."""
    replies: dict[str, Reply] = {}
    pool = jobs.DaemonPool(min(concurrency, len(fleet)), "rgt-fleet")  # a hung box never holds the process open

    def one(host: str) -> Reply:
        sent = time.time()
        try:
            facts = caller(host, per_host[host])
            received = time.time()
            # the transport stamps host/box on remote results; the row carries the host itself
            plain = HostFacts.model_validate(facts.model_dump(exclude={"host", "box"}))
            return Reply(plain, None, sent, received)
        except Exception as err:  # RemoteError, or anything the transport raised: a row, not a crash
            return Reply(None, _error_of(host, err), sent, time.time())

    futures = {host: pool.submit(one, host) for host in fleet}  # in order: the head (first) never waits
    deadline = time.monotonic() + timeout_s * waves(len(fleet), concurrency)
    for done, (host, future) in enumerate(futures.items()):
        try:
            replies[host] = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            replies[host] = Reply(None, HostError(kind="timeout", message=f"no answer within {timeout_s:g} s",
                                                  next_step=f"the box or its ssh is hung: ssh {host} uptime"),
                                  time.time(), time.time())
        # "facts read", never "ok": the verdict comes after every host's facts are judged together
        error = replies[host].error
        progress(done + 1, len(fleet), f"{host}: facts read" if replies[host].facts else
                 f"{host}: no facts ({error.kind if error else 'no answer'})")
    pool.shutdown(cancel=futures.values())
    return replies


def waves(hosts: int, concurrency: int) -> int:
    """How many rounds the workers need: the head holds one slot for the whole check."""
    workers, slots = max(0, hosts - 1), max(1, min(concurrency, hosts) - 1)
    return max(1, -(-workers // slots))


def per_host_arguments(args: PreflightInput, names: list[str], head: str, head_addr: str) -> dict[str, dict]:
    """host_facts arguments per host. The head holds its rendezvous port open while the workers connect:
    one connect window per round of workers (when the fleet is larger than ``concurrency``), ended early once
    every worker has connected, and always well inside the per-host timeout, or the head's own reply would be
    cut off by the deadline it is holding the port for."""
    window = min(CONNECT_WAIT_S, args.timeout_s / 4)
    # Two windows more than the rounds need: a worker's own cold start (ssh handshake, Python, imports) on a
    # loaded box can take seconds after the head's listener opened. It closes as soon as every worker came.
    hold = min(window * (waves(len(names), args.concurrency) + 2), args.timeout_s / 2, 60.0)
    base = HostFactsInput(head_addr=head_addr, port=args.port, checkpoint_dir=args.checkpoint_dir,
                          expect_gpus=args.expect_gpus, timeout_s=min(60.0, args.timeout_s / 2),
                          connect_wait_s=max(0.5, window), python=args.python, activate=args.activate,
                          launch=args.launch)
    head_args = base.model_copy(update={"is_head": True, "workers": len(names) - 1, "connect_wait_s": max(0.5, hold)})
    return {h: (head_args if h == head else base).model_dump() for h in names}


def _clock(reply: Reply) -> tuple[float | None, float | None]:
    """Box time minus the local moment it most likely corresponds to: the midpoint between the earliest
    the box could have finished (send + its own work) and the reply's arrival."""
    if reply.facts is None:
        return None, None
    earliest = reply.sent + reply.facts.elapsed_s
    middle = (earliest + reply.received) / 2
    return round(reply.facts.box_time - middle, 3), round(max(0.0, reply.received - earliest) / 2, 3)


def default_head_addr(head: str, slurm: bool) -> tuple[str, str | None]:
    """The head's address for the workers: the ssh config's HostName (``ssh -G``), else the name itself."""
    if slurm:
        return head, None
    try:
        from ..remote.hosts import parse_host, resolve

        return resolve(parse_host(head, "head")).hostname, None
    except Exception as err:  # no ssh here, or the transport is not installed: the name is the best guess
        return head.rsplit("@", 1)[-1].split(":", 1)[0], f"could not read ssh -G {head} ({err}); using the name"


def run_fleet(args: PreflightInput, progress: Progress, caller: FactsCaller | None = None,
              fleet: list[FleetHost] | None = None, node_caller: Callable | None = None) -> PreflightResult:
    started = time.monotonic()
    fleet = fleet or fleet_from(args.hosts, args.hostfile, args.slurm)
    names = [h.host for h in fleet]
    head = args.head or names[0]
    if head not in names:
        from ..errors import InputError

        raise InputError("head", f"{head!r} is not one of the hosts", allowed=names)
    notes: list[str] = []
    head_addr = args.head_addr
    if head_addr is None:
        head_addr, note = default_head_addr(head, args.slurm)
        notes += [note] if note else []
    per_host = per_host_arguments(args, names, head, head_addr)
    progress(0, len(names), f"checking {len(names)} host(s)")
    if args.slurm and caller is None and srun_available():
        t0 = time.time()
        worker = next((per_host[h] for h in names if h != head), per_host[head] | {"is_head": False, "workers": 0})
        got = srun_facts(names, worker, args.timeout_s)
        replies = {h: Reply(v if isinstance(v, HostFacts) else None, v if isinstance(v, HostError) else None, t0,
                            time.time()) for h, v in got.items()}
        notes.append("fanned out with srun --ntasks-per-node=1; the head's port was not held open in this mode")
    else:
        ordered = [head, *(h for h in names if h != head)]
        replies = gather(ordered, per_host, caller or ssh_caller(args.timeout_s), args.concurrency, args.timeout_s,
                         progress)
    head_facts = replies[head].facts
    head_held = bool(head_facts and not head_facts.port_free and head_facts.port_holders)
    head_ok = bool(head_facts and (head_facts.port_free or head_held))
    head_loopback = bool(head_facts and any(h.loopback_only for h in head_facts.port_holders))
    rows = []
    for host in names:
        reply = replies[host]
        offset, uncertainty = _clock(reply)
        if reply.facts is None:
            assert reply.error is not None
            checks = [unreachable_check(reply.error)]
        else:
            checks = host_checks(reply.facts, is_head=host == head, expect_gpus=args.expect_gpus, head_ok=head_ok,
                                 clock_offset_s=offset, clock_uncertainty_s=uncertainty, head_held=head_held,
                                 head_loopback=head_loopback)
        rows.append(HostRow(host=host, verdict=Verdict.UNKNOWN, is_head=host == head, reachable=reply.facts is not None,
                            error=reply.error, clock_offset_s=offset, clock_uncertainty_s=uncertainty,
                            route_iface=reply.facts.route.iface if reply.facts and reply.facts.route else None,
                            nccl_socket_ifname=reply.facts.launch_env.value("NCCL_SOCKET_IFNAME") if reply.facts
                            else None,
                            checks=checks, facts=reply.facts))
    answered = {r.host: r.facts for r in rows if r.facts is not None}
    across = fleet_checks(answered, args.expect_gpus)
    for check in across:  # a host that deviates carries the cross-host finding in its own row too
        for row in rows:
            if row.host in check.hosts and check.verdict in (Verdict.FAIL, Verdict.WARN):
                row.checks.append(_as_check(check))
    for row in rows:
        row.verdict = row_verdict(row.checks)
    notes += runtime_notes(rows)
    env, env_notes = nccl_env(answered)
    notes += env_notes
    launch = _launch(args, fleet, answered, head_addr, env, notes)
    verdict = fleet_verdict(rows, across)
    result = PreflightResult(done=True, job_id=None, state="done", progress=f"{len(names)}/{len(names)} hosts",
                             elapsed_s=0.0, verdict=verdict, summary="", head=head, head_addr=head_addr,
                             port=args.port, hosts=rows, fleet_checks=across, nccl_env=env, launch=launch, notes=notes)
    if args.allreduce:
        from .allreduce import run_fleet_allreduce

        reachable = [r.host for r in rows if r.reachable]
        progress(len(names), len(names) + 1, f"all-reduce across {len(reachable)} host(s)")
        result.allreduce = run_fleet_allreduce(reachable, head, head_addr, args.port, answered, args.timeout_s,
                                               caller=node_caller, env_args={"python": args.python, "activate":
                                                                             args.activate, "launch": args.launch})
        verdict = fleet_verdict(rows, [*across, result.allreduce.as_fleet_check()])
        result.verdict = verdict
    result.summary = _summary(result)
    result.elapsed_s = round(time.monotonic() - started, 3)
    return result


RUNTIME_KINDS = ("runtime_missing", "version_mismatch")


def runtime_notes(rows: list[HostRow]) -> list[str]:
    """Hosts without this checkout's runtime get one command that installs it on all of them at once; each such
    row's next step says the same, so the fix is the same wherever it is read."""
    names = [r.host for r in rows if r.error is not None and r.error.kind in RUNTIME_KINDS]
    if not names:
        return []
    fix = (f"`{shlex.join(['rgt', 'box', 'install', *names])}` (MCP: box_install(hosts={json.dumps(names)})), "
           "after the user agrees, then run the pre-flight again")
    for row in rows:
        if row.host in names and row.error is not None:
            row.error.next_step = f"install the runtime on every host that lacks it: {fix}"
            row.checks = [unreachable_check(row.error) if c.name == "reachable" else c for c in row.checks]
    return [f"{len(names)} host(s) have no runtime of this checkout ({', '.join(names)}): {fix}"]


def _as_check(check: FleetCheck):
    from ..health.checks import Check

    return Check(name=check.name, verdict=check.verdict, observed=check.observed, threshold="same on every node",
                 explanation=check.explanation, entry=check.entry)


def _launch(args: PreflightInput, fleet: list[FleetHost], facts: dict[str, HostFacts], head_addr: str,
            env: dict[str, str], notes: list[str]) -> str | None:
    """The torchrun command for this fleet, from the render_launch spec (the same validation)."""
    from ..render.tool import SPECS as RENDER_SPECS

    gpus = args.expect_gpus or min((f.health.gpus_found for f in facts.values()), default=0) or \
        min((h.slots for h in fleet if h.slots), default=1)
    render = next(s for s in RENDER_SPECS if s.name == "render_launch")
    try:
        rendered = render.call({"launcher": "torchrun", "script": "train.py", "nproc_per_node": gpus,
                                "nnodes": len(fleet), "master_addr": head_addr, "port": args.port,
                                "nccl_socket_ifname": env.get("NCCL_SOCKET_IFNAME"), "check_host": False})
    except Exception as err:  # a launch we cannot render is a note, not a failed pre-flight
        notes.append(f"render_launch could not render the launch: {err}")
        return None
    return rendered.command  # type: ignore[attr-defined]


def _summary(result: PreflightResult) -> str:
    """The verdict, then the hosts that fail, warn and cannot be checked, each with the checks that decided it: a
    check we could not make (no torch found) never hides a real fault on another host."""
    groups: dict[Verdict, list[str]] = {Verdict.FAIL: [], Verdict.WARN: [], Verdict.UNKNOWN: []}
    for row in result.hosts:
        for verdict, names in groups.items():
            decided = [c.name for c in row.checks if c.verdict is verdict]
            if decided:
                names.append(f"{row.host} ({', '.join(decided)})")
    parts = [f"{label} {len(groups[v])}: {'; '.join(groups[v])}" for v, label in
             ((Verdict.FAIL, "fail on"), (Verdict.WARN, "warn on"), (Verdict.UNKNOWN, "cannot check on"))
             if groups[v]]
    cross = [f"{c.name} {c.verdict.value} ({', '.join(c.hosts)})" for c in result.fleet_checks
             if c.verdict in (Verdict.FAIL, Verdict.WARN)]
    if cross:
        parts.append("across hosts: " + "; ".join(cross))
    if result.allreduce is not None:
        parts.append(f"all-reduce {result.allreduce.verdict.value}")
    return f"{result.verdict.value}: {len(result.hosts)} host(s)" + (" — " + " — ".join(parts) if parts else "")


def _from_job(status: jobs.JobStatus) -> PreflightResult:
    if status.state == "done":
        return status.result.model_copy(update={"job_id": status.job_id})
    if status.state == "failed":
        return PreflightResult(done=True, job_id=status.job_id, state="failed", progress=status.message,
                               elapsed_s=status.elapsed_s, verdict=Verdict.FAIL,
                               summary=f"the pre-flight itself failed: {status.error_type}: {status.error}")
    total = f"/{status.total:g}" if status.total else ""
    return PreflightResult(done=False, job_id=status.job_id, state="running",
                           progress=f"{status.progress:g}{total}: {status.message}", elapsed_s=status.elapsed_s,
                           verdict=Verdict.UNKNOWN, summary=f"running for {status.elapsed_s:.0f} s; call preflight("
                           f"job_id=\"{status.job_id}\") again")


def preflight(args: PreflightInput, progress: Progress) -> PreflightResult:
    if args.job_id:
        return _from_job(jobs.poll(args.job_id))
    fleet = fleet_from(args.hosts, args.hostfile, args.slurm)  # bad input fails now, not inside the job
    if not args.slurm:
        from ..remote.hosts import parse_host

        for member in fleet:  # a host string never reaches ssh as an option (SSH injection guard)
            parse_host(member.host, "hostfile" if args.hostfile else "hosts")
    if args.wait_s is None:  # the CLI: its process is the only one that could ever poll a job, so just wait
        return run_fleet(args, progress, fleet=fleet)
    job_id = jobs.start(lambda job_progress: run_fleet(args, job_progress, fleet=fleet), name="preflight")
    return _from_job(jobs.JOBS.wait(job_id, timeout_s=args.wait_s))


FINDING_WIDTH = 110


def _wrapped(label: str, text: str, indent: int) -> list[str]:
    """``label`` then ``text`` wrapped to FINDING_WIDTH, continuation lines indented: nothing is cut."""
    import textwrap

    return textwrap.wrap(text, FINDING_WIDTH, initial_indent=label, subsequent_indent=" " * indent,
                         break_on_hyphens=False, break_long_words=False) or [label]


def _finding_lines(check, indent: int = 8) -> list[str]:
    word = "CANNOT CHECK" if check.verdict is Verdict.UNKNOWN else check.verdict.value
    entry = f" → {check.entry.file}#{check.entry.id}" if check.entry else ""
    return _wrapped(f"{'':{indent - 6}}{word:<5} ", f"{check.name}: {check.observed} — {check.explanation}{entry}",
                    indent)


def render_preflight(result: PreflightResult) -> str:
    if not result.done:
        return f"preflight: {result.summary}\nprogress: {result.progress}"
    lines = [f"preflight: {result.summary}"]
    if result.hosts:
        rows = []
        for row in result.hosts:
            f = row.facts
            rows.append([row.host + (" (head)" if row.is_head else ""), row.verdict,
                         f.health.gpus_found if f else "-", (f.health.gpu_models or ["-"])[0] if f else "-",
                         f.health.driver_version if f else "-", f.torch.torch if f else "-",
                         f.torch.nccl if f else "-", (f.torch.display or "-") if f else "-",
                         row.nccl_socket_ifname or "(unset)" if f else "-", row.route_iface or "-"])
        lines += ["", format_table(["host", "verdict", "gpus", "model", "driver", "torch", "nccl", "python",
                                    "NCCL_SOCKET_IFNAME", "to head"], rows)]
        order = {Verdict.FAIL: 0, Verdict.UNKNOWN: 1, Verdict.WARN: 2}  # the fault first, then what was not checked
        found = [(row.host, sorted((c for c in row.checks if c.verdict in order), key=lambda c: order[c.verdict]))
                 for row in result.hosts]
        across = {c.name for c in result.fleet_checks}
        if any(checks for _, checks in found):
            lines += ["", "findings per host (FAIL, WARN, CANNOT CHECK; every one, in full):"]
            for host, checks in found:
                lines += [f"  {host}:", *(line for c in checks for line in (
                    [f"    {c.verdict.value:<5} {c.name}: this host differs (across hosts, below)"] if c.name in across
                    else _finding_lines(c, indent=10)))] if checks else []
    findings = [line for c in result.fleet_checks if c.verdict in (Verdict.FAIL, Verdict.WARN)
                for line in _finding_lines(c, indent=8)]
    lines += ["", "across hosts:", *findings] if findings else []
    if result.allreduce is not None:
        from .allreduce import render_allreduce

        lines += ["", render_allreduce(result.allreduce)]
    if result.nccl_env:
        lines += ["", "suggested environment (our recommendation from the routes, not the nodes' values):",
                  *(f"  export {k}={v}" for k, v in result.nccl_env.items())]
    if result.launch:
        lines += ["", f"launch (every node): {result.launch}"]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def _exit(result: PreflightResult) -> int:
    return 1 if result.verdict is Verdict.FAIL else 0


SPECS = [
    ToolSpec(
        name="preflight",
        cli="preflight",
        title="Fleet pre-flight for a multi-node run",
        description=(
            "Before launching on N nodes, or when a multi-node job hangs: checks every node at once (ssh hosts, "
            "a hostfile, or the Slurm allocation) — gpu_health summary, GPU model/count/memory/MIG/compute mode, "
            "driver and CUDA, the torch/torch.version.cuda/NCCL of each node's training python (python=, activate=, "
            "launch=, or found and named), the launch environment a login shell and the launch script give "
            "(NCCL_*/GLOO_*/CUDA_VISIBLE_DEVICES/MASTER_*, NCCL's config files) checked against the node, free "
            "disk at checkpoint_dir, clock offset, "
            "the interface that routes to the head (NCCL_SOCKET_IFNAME), InfiniBand/RoCE ports, whether each "
            "worker reaches head:port (a TCP connect made on the worker, also to a holder) and whether it is free on "
            "the head (the holder named; a loopback-only one said so). "
            "Then judges across hosts: torch/NCCL versions or GPU counts that differ → FAIL, driver or GPU model "
            "differences → WARN, an unreachable host → FAIL with ssh's cause; each finding cites a catalog "
            "entry. Returns the NCCL_* settings to use and the torchrun command (render_launch). allreduce=true "
            "adds an all-reduce benchmark (NCCL on GPUs, gloo on CPU) with algbw/busbw per size, busbw judged "
            "at one large size. Long checks answer with a job_id: call again with job_id until done=true. "
            "Read-only; the benchmark's processes are cleaned up on every host."
        ),
        input_model=PreflightInput,
        output_model=PreflightResult,
        run=preflight,
        read_only=True,
        idempotent=True,
        open_world=True,
        render_text=render_preflight,
        exit_code=_exit,
        # A job lives in one process, and no later `rgt` process could poll it: the CLI waits for the result
        # and prints progress to stderr instead.
        cli_fixed=(("wait_s", None), ("job_id", None)),
    ),
]
