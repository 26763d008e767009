"""A short all-reduce benchmark across the fleet: torchrun on every host, c10d rendezvous at the head.

Three layers, each small:

* ``rank.py`` runs inside every rank (``python -m remote_gpu_trainer.fleet.rank``, under the training
  interpreter, which has torch and none of the runtime's packages): it writes a ``started`` file, joins the
  process group with a short timeout (NCCL on GPUs, gloo on CPU), warms up, times all-reduces from 1 MiB up
  (1 GiB on GPUs, 64 MiB on CPU) and writes its times, or the error.
* ``allreduce_node`` (an internal remote spec) runs ``python -m torch.distributed.run`` on one host in
  its own session, with a deadline, kills that session afterwards and reads the rank files: which
  ranks started, which finished, which died without a word (killed).
* ``run_fleet_allreduce`` starts ``allreduce_node`` on every host at once and judges: bandwidth with
  the nccl-tests formulas (algbw = bytes / time; busbw = algbw x 2(n-1)/n) at the largest size, and,
  on failure, the hosts whose ranks never joined or died first.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from pydantic import Field

from ..jobs import DaemonPool
from ..models import EntryRef, StrictModel, Verdict
from ..tables import format_table
from ..toolspec import Progress, ToolSpec
from ..trainenv.child import child_environ
from ..trainenv.find import (
    ActivateText,
    LaunchPath,
    PythonPath,
    activate_field,
    find_training_env,
    launch_field,
    python_field,
)
from .facts import HostFacts
from .verdicts import E_MASTER, E_TCP_FALLBACK, FleetCheck, HostError

MIB = 1 << 20
GPU_MAX_BYTES = 1 << 30
CPU_MAX_BYTES = 64 * MIB
E_HANG = EntryRef(file="references/multinode.md", id="NODE-07")
AGENT_CLOSED = re.compile(r"Sending process (\d+) closing signal")
"""torchrun's agent logs this for each worker it ends (torch/distributed/elastic/multiprocessing/api.py)."""


# --- on one host ------------------------------------------------------------------------------------


class NodeInput(StrictModel):
    head_addr: str = Field(max_length=255)
    port: int = Field(ge=1, le=65535)
    nnodes: int = Field(ge=1, le=4096)
    nproc: int = Field(ge=1, le=64, description="Ranks on this host")
    backend: str = Field(pattern="^(nccl|gloo)$")
    rdzv_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    max_bytes: int = Field(ge=MIB, le=GPU_MAX_BYTES)
    iters: int = Field(5, ge=1, le=10_000)
    timeout_s: float = Field(120, ge=5, le=900)
    python: PythonPath = python_field()
    activate: ActivateText = activate_field()
    launch: LaunchPath = launch_field("The launch script (for finding the python)")


class NodeResult(StrictModel):
    started_ranks: list[int] = Field(description="Local ranks that started")
    finished_ranks: list[int]
    errors: dict[str, str] = Field(description="Local rank → its error")
    silent_ranks: list[int] = Field(description="Local ranks that started and ended with neither result nor error "
                                    "(killed)")
    stopped_ranks: list[int] = Field(default_factory=list, description="Local ranks their own torchrun agent ended "
                                     "with a closing signal (it does so after a peer's failure): a consequence, "
                                     "not a cause")
    rows: list[dict] = Field(description="size_bytes, time_s from local rank 0 (times are the max over all ranks)")
    world: int | None
    exit_code: int | None
    timed_out: bool
    stderr_tail: str
    leftover: int = Field(description="Processes of this check still alive after cleanup (should be 0)")
    python: str | None = Field(None, description="The training interpreter torchrun and the ranks ran under")


def _end_session(proc: subprocess.Popen) -> int:
    """SIGTERM, then SIGKILL, the whole session torchrun leads; count survivors."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        members = [p for p in psutil.process_iter(["pid"]) if _in_session(p, proc.pid)]
        if not members and proc.poll() is not None:
            return 0
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        gone_by = time.monotonic() + wait
        while time.monotonic() < gone_by and any(_alive(p) for p in members):
            time.sleep(0.05)
        proc.poll()
    return sum(1 for p in psutil.process_iter(["pid"]) if _in_session(p, proc.pid))


def _in_session(process: psutil.Process, sid: int) -> bool:
    try:
        return os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _rank_of(path: Path) -> int:
    """``rank-3.started`` → 3."""
    return int(path.name.split("-")[1].split(".")[0])


def allreduce_node(args: NodeInput, progress: Progress) -> NodeResult:
    """torchrun and its ranks under the training interpreter that host_facts found with the same arguments."""
    env = find_training_env(args.python, args.activate, args.launch)
    if env.python is None or not env.has_torch:
        return NodeResult(started_ranks=[], finished_ranks=[], errors={}, silent_ranks=[], rows=[], world=None,
                          exit_code=None, timed_out=False, leftover=0, python=env.python,
                          stderr_tail=f"no python with torch here ({env.found_by}; {'; '.join(env.errors.values())})")
    with tempfile.TemporaryDirectory(prefix="rgt-allreduce-") as tmp:
        argv = [env.python, "-m", "torch.distributed.run", f"--nnodes={args.nnodes}",
                f"--nproc-per-node={args.nproc}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={args.head_addr}:{args.port}", f"--rdzv-id={args.rdzv_id}", "--max-restarts=0",
                f"--rdzv-conf=join_timeout={int(max(10, args.timeout_s / 2))}",
                "-m", "remote_gpu_trainer.fleet.rank", "--out", tmp, "--backend", args.backend,
                "--max-bytes", str(args.max_bytes), "--iters", str(args.iters),
                "--pg-timeout-s", str(max(10, int(args.timeout_s / 2)))]
        environ = child_environ(env, {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "OMP_NUM_THREADS": "1"})
        log = Path(tmp, "torchrun.log").open("w+")  # noqa: SIM115 - torchrun writes to it while we wait
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=environ,
                                start_new_session=True)
        progress(0, 1, "torchrun started")
        timed_out = False
        try:
            proc.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        leftover = _end_session(proc)
        log.seek(0)
        whole = log.read()
        tail = whole[-3000:]
        if (first_error := _first_error(whole)) not in tail:  # a long C++ stack can push it out of the tail
            tail = f"{first_error}\n…\n{tail}"
        log.close()
        out = Path(tmp)
        pids = {_rank_of(p): json.loads(p.read_text()).get("pid") for p in out.glob("rank-*.started")}
        started = sorted(pids)
        finished = {_rank_of(p): json.loads(p.read_text()) for p in out.glob("rank-*.json")}
        errors = {str(_rank_of(p)): p.read_text() for p in out.glob("rank-*.error")}
        closed = {int(pid) for pid in AGENT_CLOSED.findall(whole)}
        ended = [r for r in started if r not in finished and str(r) not in errors]
        stopped = [r for r in ended if pids.get(r) in closed]
        first = finished.get(0) or next(iter(finished.values()), None)
        return NodeResult(started_ranks=started, finished_ranks=sorted(finished), errors=errors,
                          silent_ranks=[r for r in ended if r not in stopped], stopped_ranks=stopped,
                          rows=first["rows"] if first else [], world=first["world"] if first else None,
                          exit_code=proc.returncode, timed_out=timed_out, stderr_tail=tail, leftover=leftover,
                          python=env.python)


ALLREDUCE_NODE = ToolSpec(
    name="allreduce_node", cli="allreduce-node", title="All-reduce benchmark on one host of a fleet",
    description="Internal: runs torchrun for the fleet all-reduce on this box and reports its ranks.",
    input_model=NodeInput, output_model=NodeResult, run=allreduce_node, read_only=True, remote=True, internal=True)

SPECS = [ALLREDUCE_NODE]


# --- across the fleet -------------------------------------------------------------------------------


class BandwidthRow(StrictModel):
    size_bytes: int
    time_s: float
    algbw_gbps: float = Field(description="Algorithm bandwidth, GB/s (1e9 bytes/s): bytes / time")
    busbw_gbps: float = Field(description="Bus bandwidth, GB/s: algbw x 2(n-1)/n (nccl-tests)")


class HostRun(StrictModel):
    host: str
    state: str = Field(description="finished, never_joined, died (a rank ended without a word), stopped (its own "
                       "torchrun agent ended it after a peer failed), failed, unreachable")
    ranks: int
    detail: str


class AllreduceReport(StrictModel):
    verdict: Verdict
    backend: str
    world_size: int
    rows: list[BandwidthRow]
    judged_size_bytes: int | None
    busbw_gbps: float | None = Field(description="Bus bandwidth at the judged (largest) size")
    algbw_gbps: float | None
    expected_busbw_gbps: float | None
    expected_source: str | None
    hosts: list[HostRun]
    failed_hosts: list[str] = Field(description="Hosts whose ranks never joined, died, or could not be reached")
    explanation: str
    entry: EntryRef | None = None
    notes: list[str] = Field(default_factory=list)

    def as_fleet_check(self) -> FleetCheck:
        observed = (f"busbw {self.busbw_gbps:.2f} GB/s at {self.judged_size_bytes // MIB} MiB"
                    if self.busbw_gbps is not None else "no bandwidth")
        return FleetCheck(name="allreduce", verdict=self.verdict, observed=observed, explanation=self.explanation,
                          hosts=self.failed_hosts, entry=self.entry)


NodeCaller = Callable[[str, dict], NodeResult]
CLEANUP_S = 30.0
"""Beyond its own timeout, what a host needs to end torchrun's session (SIGTERM, then SIGKILL) and reply."""


def ssh_node_caller(host: str, arguments: dict) -> NodeResult:
    """allreduce_node on ``host`` over ssh; the transport's deadline covers the run and its cleanup."""
    from .transport import call_on_host

    return call_on_host(ALLREDUCE_NODE, host, arguments, NodeResult, float(arguments["timeout_s"]) + CLEANUP_S)


def _reference(facts: dict[str, HostFacts], backend: str, nnodes: int) -> tuple[float | None, str | None]:
    if backend == "gloo":
        return None, None
    table = json.loads(Path(__file__).with_name("interconnects.json").read_text())
    if nnodes == 1:
        only = next(iter(facts.values()))
        model = (only.health.gpu_models or [""])[0]
        for item in table["single_node"]:
            if item["match"] in model and item["gpus"] == only.health.gpus_found:
                return float(item["busbw_gbps"]), item["source"]
        return None, None
    per_node = []
    for f in facts.values():
        rdma = sum(p.rate_gbps or 0 for p in f.ib_ports if p.active)
        link = rdma or ((f.route.speed_mbps or 0) / 1000 if f.route else 0)
        per_node.append(link / 8)  # Gbit/s → GB/s
    if not per_node or min(per_node) <= 0:
        return None, None
    multi = table["multi_node"]
    return round(multi["efficiency"] * min(per_node), 2), multi["efficiency_source"]


_EXCEPTION_LINE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?[A-Za-z_][\w.]*(?:Error|Exception|Timeout)\b:?.*$", re.M)


def _first_error(log: str) -> str:
    """The line that names what went wrong (the first ``SomethingError: …`` line), not a C++ stack's tail."""
    found = _EXCEPTION_LINE.findall(log)
    return (found[0].strip() if found else log.strip()[-300:])[:400]


def _blame(runs: dict[str, NodeResult | HostError]) -> tuple[list[HostRun], list[str]]:
    """Per host: finished, never joined, died (a rank gone without a word: killed), failed."""
    rows, died, never, other = [], [], [], []
    for host, run in runs.items():
        if isinstance(run, HostError):
            rows.append(HostRun(host=host, state="unreachable", ranks=0, detail=f"{run.kind}: {run.message}"))
            other.append(host)
        elif run.silent_ranks:
            rows.append(HostRun(host=host, state="died", ranks=len(run.started_ranks), detail=f"local rank(s) "
                                f"{run.silent_ranks} ended without a result or an error (killed?)"))
            died.append(host)
        elif not run.started_ranks:
            rows.append(HostRun(host=host, state="never_joined", ranks=0, detail="no rank started: torchrun did "
                                f"not get through the rendezvous: {_first_error(run.stderr_tail)}"))
            never.append(host)
        elif run.stopped_ranks and not run.timed_out and not run.finished_ranks:
            rows.append(HostRun(host=host, state="stopped", ranks=len(run.started_ranks), detail=f"local rank(s) "
                                f"{run.stopped_ranks} were ended by this host's torchrun agent after a peer failed"))
            other.append(host)
        elif len(run.finished_ranks) == len(run.started_ranks) and not run.timed_out:
            rows.append(HostRun(host=host, state="finished", ranks=len(run.started_ranks), detail="ok"))
        else:
            first_error = next(iter(run.errors.values()), "timed out" if run.timed_out else "failed")
            rows.append(HostRun(host=host, state="failed", ranks=len(run.started_ranks), detail=first_error[:300]))
            other.append(host)
    # the hosts that caused it come first: a dead rank makes every peer fail too
    culprits = died or never or other
    return rows, culprits


def run_fleet_allreduce(hosts: list[str], head: str, head_addr: str, port: int, facts: dict[str, HostFacts],
                        timeout_s: float, caller: NodeCaller | None = None, iters: int = 5,
                        env_args: dict[str, str | None] | None = None) -> AllreduceReport:
    """``env_args``: the pre-flight's python/activate/launch; without them each host runs the interpreter its
    facts found (``facts[h].torch.python``)."""
    caller = caller or ssh_node_caller
    gpu = all(f.torch.cuda_available and f.torch.nccl for f in facts.values())
    backend = "nccl" if gpu else "gloo"
    notes = [] if gpu else [f"gloo on CPU (a host has no CUDA torch): sizes capped at {CPU_MAX_BYTES // MIB} MiB; "
                            "the figures measure CPUs and TCP, not GPU interconnects, and are not judged"]
    max_bytes = GPU_MAX_BYTES if gpu else CPU_MAX_BYTES
    missing = [h for h in hosts if not facts[h].torch.has_torch]
    if missing:
        return AllreduceReport(verdict=Verdict.FAIL, backend=backend, world_size=0, rows=[], judged_size_bytes=None,
                               busbw_gbps=None, algbw_gbps=None, expected_busbw_gbps=None, expected_source=None,
                               hosts=[HostRun(host=h, state="failed", ranks=0, detail=f"no torch: "
                                              f"{facts[h].torch.brief()}") for h in missing],
                               failed_hosts=missing, entry=EntryRef(file="references/ssh_transport.md", id="SSH-13"),
                               explanation="no training python with a working torch on " + ", ".join(missing)
                               + ": pass python= or activate= (the environment the job runs in), then run again",
                               notes=notes)
    rdzv_id = f"rgt-preflight-{int(time.time())}"
    per_host = {h: NodeInput(head_addr=head_addr, port=port, nnodes=len(hosts), backend=backend, rdzv_id=rdzv_id,
                             nproc=(facts[h].torch.cuda_devices or 1) if gpu else 1, max_bytes=max_bytes, iters=iters,
                             timeout_s=timeout_s, **(env_args if env_args and any(env_args.values())
                                                     else {"python": facts[h].torch.python})).model_dump()
                for h in hosts}
    runs: dict[str, NodeResult | HostError] = {}
    with DaemonPool(len(hosts), "rgt-allreduce") as pool:  # a node that never answers never holds the process
        futures = {h: pool.submit(caller, h, per_host[h]) for h in hosts}
        for host, future in futures.items():
            try:
                runs[host] = future.result(timeout=timeout_s + CLEANUP_S + 30)
            except Exception as err:
                runs[host] = HostError(kind=str(getattr(err, "kind", type(err).__name__)),
                                       message=str(getattr(err, "message", err)), next_step="")
    host_rows, culprits = _blame(runs)
    ok = all(r.state == "finished" for r in host_rows)
    leftover = sum(r.leftover for r in runs.values() if isinstance(r, NodeResult))
    if leftover:
        notes.append(f"{leftover} process(es) of the check survived cleanup")
    head_run = runs.get(head)
    source = head_run if isinstance(head_run, NodeResult) and head_run.rows else next(
        (r for r in runs.values() if isinstance(r, NodeResult) and r.rows), None)
    world = (source.world or 0) if source else 0
    rows = []
    for item in source.rows if (ok and source) else []:
        algbw = item["size_bytes"] / item["time_s"] / 1e9
        rows.append(BandwidthRow(size_bytes=item["size_bytes"], time_s=item["time_s"], algbw_gbps=round(algbw, 3),
                                 busbw_gbps=round(algbw * 2 * (world - 1) / world, 3) if world > 1 else 0.0))
    if not ok:
        return AllreduceReport(verdict=Verdict.FAIL, backend=backend, world_size=world, rows=[], judged_size_bytes=None,
                               busbw_gbps=None, algbw_gbps=None, expected_busbw_gbps=None, expected_source=None,
                               hosts=host_rows, failed_hosts=culprits, entry=E_MASTER if any(
                                   r.state == "never_joined" for r in host_rows) else E_HANG,
                               explanation="the all-reduce did not complete; caused by " + ", ".join(
                                   f"{r.host} ({r.state}: {r.detail[:120]})" for r in host_rows
                                   if r.host in culprits), notes=notes)
    judged = rows[-1] if rows else None
    expected, expected_source = _reference(facts, backend, len(hosts))
    if judged is None:
        verdict, why = Verdict.UNKNOWN, "no sizes were timed"
    elif expected is None:
        verdict, why = Verdict.PASS, "completed on every host; no sourced reference for this interconnect, not judged"
    elif judged.busbw_gbps >= 0.8 * expected:
        verdict, why = Verdict.PASS, f"busbw within 80% of the reference {expected:g} GB/s"
    else:
        verdict, why = Verdict.WARN, (f"busbw {judged.busbw_gbps:.1f} GB/s is below 80% of the reference "
                                      f"{expected:g} GB/s: a slow link, or NCCL fell back to TCP sockets")
    return AllreduceReport(verdict=verdict, backend=backend, world_size=world, rows=rows,
                           judged_size_bytes=judged.size_bytes if judged else None,
                           busbw_gbps=judged.busbw_gbps if judged else None,
                           algbw_gbps=judged.algbw_gbps if judged else None, expected_busbw_gbps=expected,
                           expected_source=expected_source, hosts=host_rows, failed_hosts=[], explanation=why,
                           entry=E_TCP_FALLBACK if verdict is Verdict.WARN else None, notes=notes)


def render_allreduce(report: AllreduceReport) -> str:
    lines = [f"all-reduce ({report.backend}, {report.world_size} ranks): {report.verdict.value} — {report.explanation}"]
    if report.rows:
        lines.append(format_table(["size", "time", "algbw GB/s", "busbw GB/s"],
                                  [[f"{r.size_bytes // MIB} MiB", f"{r.time_s * 1e3:.2f} ms", f"{r.algbw_gbps:.2f}",
                                    f"{r.busbw_gbps:.2f}"] for r in report.rows]))
    lines += [f"  {h.host}: {h.state} ({h.detail[:100]})" for h in report.hosts if h.state != "finished"]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


