"""Judge a fleet: one row per host from its own facts, then the checks that only make sense across
hosts (what must be equal on every node, and what merely should be).

Why these severities: ranks built against different torch or NCCL releases hang or crash at the
first collective (NODE-12), and a node with fewer GPUs than the launch's ``--nproc-per-node`` fails
with an invalid device ordinal, so those are FAIL. Different drivers or GPU models can train together
but run at the slowest node's pace or hit driver-specific bugs (NODE-17), so those are WARN with the
reason. A host that cannot be reached is FAIL with ssh's own words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from pydantic import Field

from ..health.checks import Check
from ..models import EntryRef, StrictModel, Verdict, worst
from ..tables import GIB
from ..trainenv.find import TrainingEnv, tilde
from .facts import HostFacts

MULTINODE = "references/multinode.md"
SSH = "references/ssh_transport.md"
E_VERSIONS = EntryRef(file=MULTINODE, id="NODE-12")
E_HETERO = EntryRef(file=MULTINODE, id="NODE-17")
E_UNREACHABLE = EntryRef(file=MULTINODE, id="NODE-18")
E_WRONG_IFACE = EntryRef(file=MULTINODE, id="NODE-01")
E_MASTER = EntryRef(file=MULTINODE, id="NODE-02")
E_TCP_FALLBACK = EntryRef(file=MULTINODE, id="NODE-10")
E_PORT_BUSY = EntryRef(file="references/training/distributed-launch.md", id="DIST-02")
E_DISK = EntryRef(file="references/training/checkpoint-resume.md", id="CKPT-02")
E_NO_TORCH = EntryRef(file=SSH, id="SSH-13")

DISK_WARN_BYTES = 20 * GIB
CLOCK_WARN_S = 2.0
VIRTUAL_IFACES = ("docker", "veth", "virbr", "br-", "tailscale", "wg", "zt", "cni", "flannel", "lo")


class HostError(StrictModel):
    kind: str = Field(description="RemoteError kind, e.g. connection_refused, timeout, auth_refused")
    message: str = Field(description="The cause in ssh's own words where it gave some")
    next_step: str


class HostRow(StrictModel):
    host: str = Field(description="The host as given (ssh alias, hostfile or nodelist entry)")
    verdict: Verdict
    is_head: bool
    reachable: bool
    error: HostError | None = None
    clock_offset_s: float | None = Field(None, description="Box clock minus this machine's, seconds")
    clock_uncertainty_s: float | None = Field(None, description="± bound on the offset (half the transport time)")
    route_iface: str | None = Field(None, description="The interface that routes to the head on this host: what "
                                    "the suggested NCCL_SOCKET_IFNAME is built from")
    nccl_socket_ifname: str | None = Field(None, description="NCCL_SOCKET_IFNAME as a launch on this host gets it "
                                           "(login shell, launch script or NCCL's config files); None: not set")
    checks: list[Check]
    facts: HostFacts | None = None


class FleetCheck(StrictModel):
    name: str
    verdict: Verdict
    observed: str = Field(description="Value per host, grouped")
    explanation: str
    hosts: list[str] = Field(description="The hosts that differ from the majority (or that fail)")
    entry: EntryRef | None = None


def _check(name: str, verdict: Verdict, observed: str, threshold: str, explanation: str,
           entry: EntryRef | None = None) -> Check:
    return Check(name=name, verdict=verdict, observed=observed, threshold=threshold, explanation=explanation,
                 entry=entry)


def unreachable_entry(kind: str) -> EntryRef:
    return {"auth_refused": EntryRef(file=SSH, id="SSH-06"), "host_key_changed": EntryRef(file=SSH, id="SSH-05"),
            "no_python": E_NO_TORCH, "runtime_missing": E_NO_TORCH}.get(kind, E_UNREACHABLE)


def unreachable_check(error: HostError) -> Check:
    return _check("reachable", Verdict.FAIL, f"{error.kind}: {error.message}", "the box answers over ssh",
                  f"No facts from this host. {error.next_step}", unreachable_entry(error.kind))


def _iface_verdict(iface: str | None, is_head: bool) -> tuple[Verdict, str]:
    if iface is None:
        return Verdict.UNKNOWN, "no route to the head could be read"
    if iface == "lo" and not is_head:
        return Verdict.WARN, "the head is reached over loopback: fine for boxes on one machine, wrong across machines"
    if iface.startswith(VIRTUAL_IFACES) and iface != "lo":
        return Verdict.WARN, (f"{iface} is a bridge/VPN/virtual interface: NCCL traffic over it is slow or "
                              "unreachable from the other nodes; check the head address")
    return Verdict.PASS, f"NCCL_SOCKET_IFNAME={iface} on this host"


def torch_check(env: TrainingEnv) -> Check:
    """The training stack on one host. Nothing with torch found anywhere is "cannot check" (UNKNOWN: the job may
    use a python we did not look at), not a failure; a torch that fails to import, or a torch.distributed that
    does, in the interpreter the job uses is a FAIL."""
    where = f"{env.display or env.python or 'no python'} ({env.found_by})"
    threshold = "torch and torch.distributed import in the training python"
    if env.python is None or (env.torch is None and env.source not in ("python", "activate")):
        searched = ", ".join(tilde(c.python) for c in env.candidates) or "nothing"
        return _check("torch", Verdict.UNKNOWN, f"cannot check: no python with torch found (looked at {searched})",
                      threshold, "pass python= (the interpreter the job runs with) or activate= (e.g. 'source "
                      "~/venvs/pt/bin/activate', 'conda activate NAME') so the check reads the job's torch"
                      + (f"; {'; '.join(env.errors.values())}" if env.errors else ""), E_NO_TORCH)
    if env.torch is None or "torch" in env.errors or ("probe" in env.errors and not env.torch_imported):
        why = env.errors.get("torch") or env.errors.get("probe") or env.errors.get("find") or next(
            iter(env.errors.values()), "torch is not installed there")
        return _check("torch", Verdict.FAIL, f"{where}: {why}", threshold, "the job's python cannot import torch: "
                      "install the fleet's torch build into that environment (the job's, not the skill's runtime)",
                      E_NO_TORCH)
    versions = (f"torch {env.torch} · CUDA {env.torch_cuda or 'none (CPU build)'} · NCCL {env.nccl or '-'} · "
                f"python {env.python_version or '?'}")
    if not env.distributed:
        why = env.errors.get("distributed") or "torch.distributed.is_available() is False (a build without it)"
        return _check("torch", Verdict.FAIL, f"{versions} · {where}", threshold, f"torch imports, but "
                      f"torch.distributed does not: {why}", E_VERSIONS)
    partial = {k: v for k, v in env.errors.items() if k in ("cuda", "nccl", "probe")}
    if partial:
        return _check("torch", Verdict.WARN, f"{versions} · {where}", threshold, "read in part: " + "; ".join(
            f"{k}: {v}" for k, v in partial.items()))
    return _check("torch", Verdict.PASS, f"{versions} · {where}", threshold, "the job's python imports torch and "
                  "torch.distributed")


def host_checks(facts: HostFacts, *, is_head: bool, expect_gpus: int | None, head_ok: bool | None,
                clock_offset_s: float | None, clock_uncertainty_s: float | None, head_held: bool = False,
                head_loopback: bool = False) -> list[Check]:
    """One host's own checks. ``head_ok``: something listened on the head's port (our listener, or the
    process that holds it: ``head_held``, ``head_loopback`` when that one listens on loopback only); a
    worker's failed connect is only its fault when something did."""
    health = facts.health
    first = next((c.entry for c in health.findings if c.verdict is health.verdict and c.entry), None)
    checks = [_check("gpu_health", health.verdict, health.summary, "gpu_health PASS or WARN",
                     f"gpu_health on this box ({health.backend}); its findings are in facts.health", first)]
    if expect_gpus is not None:
        ok = health.gpus_found >= expect_gpus
        checks.append(_check("gpu_count", Verdict.PASS if ok else Verdict.FAIL, str(health.gpus_found),
                             f"≥ {expect_gpus}", "as expected" if ok else
                             "fewer GPUs than the launch will start ranks for: invalid device ordinal", E_VERSIONS))
    checks.append(torch_check(facts.torch))
    if facts.disk_free_bytes is None:
        checks.append(_check("disk", Verdict.UNKNOWN, facts.disk_detail, f"≥ {DISK_WARN_BYTES // GIB} GiB free",
                             "free space where checkpoints go could not be read", E_DISK))
    else:
        low = facts.disk_free_bytes < DISK_WARN_BYTES
        checks.append(_check("disk", Verdict.WARN if low else Verdict.PASS,
                             f"{facts.disk_free_bytes / GIB:.1f} GiB free at {facts.disk_detail}",
                             f"≥ {DISK_WARN_BYTES // GIB} GiB free", "a checkpoint save can fail half-written"
                             if low else "room for checkpoints", E_DISK if low else None))
    if clock_offset_s is not None:
        slack = CLOCK_WARN_S + (clock_uncertainty_s or 0.0)
        off = abs(clock_offset_s) > slack
        checks.append(_check("clock", Verdict.WARN if off else Verdict.PASS,
                             f"{clock_offset_s:+.2f} s ± {clock_uncertainty_s or 0:.2f} s",
                             f"within {CLOCK_WARN_S:g} s",
                             "logs of different nodes will not line up; enable NTP (chrony/timesyncd)" if off
                             else "clock agrees with this machine"))
    if facts.route is not None and not facts.head_resolves_to:
        checks.append(_check("route_to_head", Verdict.FAIL, facts.route.detail, "the head's name resolves here",
                             "the launch as written cannot find its head from this node: use an address every node "
                             "resolves (the head's private IP), or add the name to DNS or /etc/hosts", E_MASTER))
    elif facts.route is not None:
        verdict, why = _iface_verdict(facts.route.iface, is_head)
        checks.append(_check("route_to_head", verdict, f"{facts.route.iface or '?'} ({facts.route.detail})",
                             "a real NIC shared with the head", why, E_WRONG_IFACE if verdict is not Verdict.PASS
                             else None))
    if is_head and facts.port_free is not None:
        checks.append(_head_port_check(facts))
    if not is_head and facts.head_connect not in (None, "unresolvable"):  # unresolvable: route_to_head says it
        if facts.head_connect == "ok":
            checks.append(_check("head_reachable", Verdict.PASS, facts.head_connect_detail, "TCP connect succeeds",
                                 "this worker reaches the rendezvous port" + (
                                     " (the process holding it answered; the port itself is still taken)"
                                     if head_ok and head_held else "")))
        else:
            verdict = Verdict.FAIL if head_ok else Verdict.UNKNOWN
            why = ("this worker cannot open the head's rendezvous port: it would never join (firewall, security "
                   "group, wrong address)" if head_ok else "nothing listened on the head's port (the head did "
                   "not answer, or the port is taken by a socket that does not listen), so this connect proves "
                   "nothing")
            if head_ok and head_loopback:
                why = ("refused: the process holding the head's port listens on loopback only, so no other "
                       "machine can connect to it")
            checks.append(_check("head_reachable", verdict, f"{facts.head_connect}: {facts.head_connect_detail}",
                                 "TCP connect succeeds", why, E_MASTER))
    checks += [c for c in facts.env_checks if c.verdict is not Verdict.SKIP]
    return checks


def _head_port_check(facts: HostFacts) -> Check:
    if facts.port_free:
        return _check("head_port", Verdict.PASS, facts.port_detail, "free on the head", "the rendezvous can bind it")
    holders = "; ".join(f"pid {h.pid or '?'} ({h.command}) listening on {', '.join(h.listening_on)}"
                        + (" — loopback only" if h.loopback_only else "") for h in facts.port_holders)
    why = "something already holds the rendezvous port: torchrun's store cannot bind it"
    if any(h.loopback_only for h in facts.port_holders):
        why += (". It listens on loopback only (127.0.0.1/::1): a run started with --master-addr=localhost or "
                "--standalone, which no other node could join even while it runs")
    return _check("head_port", Verdict.FAIL, f"{facts.port_detail}" + (f": {holders}" if holders else ""),
                  "free on the head", why, E_PORT_BUSY)


def _groups(values: dict[str, str]) -> tuple[str, list[str]]:
    """'a: h1, h2 · b: h3' and the hosts outside the largest group."""
    counts = Counter(values.values())
    majority = counts.most_common(1)[0][0] if counts else None
    observed = " · ".join(f"{v}: {', '.join(h for h, x in values.items() if x == v)}" for v in counts)
    return observed, [h for h, v in values.items() if v != majority]


def _same(name: str, values: dict[str, str], verdict_if_differ: Verdict, explanation: str,
          entry: EntryRef) -> FleetCheck:
    observed, odd = _groups(values)
    if len(set(values.values())) <= 1:
        return FleetCheck(name=name, verdict=Verdict.PASS if values else Verdict.SKIP, observed=observed or "-",
                          explanation="the same on every reachable host", hosts=[])
    return FleetCheck(name=name, verdict=verdict_if_differ, observed=observed, explanation=explanation, hosts=odd,
                      entry=entry)


def _major_minor(version: str | None) -> str | None:
    """``3.10.14`` → ``3.10``: pickles and wheels (cp310) differ by minor version, not by patch level."""
    return None if version is None else ".".join(version.split(".")[:2])


def fleet_checks(facts: dict[str, HostFacts], expect_gpus: int | None) -> list[FleetCheck]:
    """Checks across the hosts that answered."""
    def values(get: Callable[[HostFacts], object]) -> dict[str, str]:
        return {h: str(v) for h, f in facts.items() if (v := get(f)) is not None}

    # Only a torch that imported has a build to compare: one found by its metadata alone (its import failed, which
    # that host's own torch check reports) has no torch_cuda and would read as a second, "mixed" build.
    with_torch = {h: f for h, f in facts.items() if f.torch.torch and f.torch.torch_imported}
    checks = [
        _same("torch_version", {h: f"{f.torch.torch} (CUDA {f.torch.torch_cuda or 'none'})"
                                for h, f in with_torch.items()}, Verdict.FAIL,
              "every rank must run the same torch build: mixed builds hang or fail at the first collective; "
              "install one version everywhere", E_VERSIONS),
        _same("nccl_version", values(lambda f: f.torch.nccl), Verdict.FAIL,
              "NCCL versions must match across nodes, or init hangs; use one torch build everywhere", E_VERSIONS),
        _same("driver", values(lambda f: f.health.driver_version), Verdict.WARN,
              "different NVIDIA drivers can work together, but CUDA features, NCCL behaviour and bugs differ "
              "per driver; align them when a node misbehaves", E_HETERO),
        _same("gpu_model", values(lambda f: ", ".join(sorted(set(f.health.gpu_models))) or None), Verdict.WARN,
              "mixed GPU models train at the pace of the slowest and may differ in precision support (bf16)",
              E_HETERO),
    ]
    if expect_gpus is None:
        checks.append(_same("gpu_count", values(lambda f: f.health.gpus_found), Verdict.FAIL,
                            "torchrun starts the same --nproc-per-node on every node; a node with fewer GPUs "
                            "fails with an invalid device ordinal", E_VERSIONS))
    checks.append(_same("training_python", values(lambda f: f.torch.display), Verdict.WARN,
                        "the job's python was found in different places (see each host's torch.found_by): check "
                        "that every node runs the same environment, or pass python=/activate=", E_VERSIONS))
    checks.append(_same("python_version", values(lambda f: _major_minor(f.torch.python_version)), Verdict.WARN,
                        "ranks on different Python versions can disagree on pickled objects and on package builds",
                        E_VERSIONS))
    checks += launch_env_checks(facts)
    rdma = {h: any(p.active for p in f.ib_ports) for h, f in facts.items()}
    if any(rdma.values()) and not all(rdma.values()):
        without = [h for h, v in rdma.items() if not v]
        checks.append(FleetCheck(name="rdma", verdict=Verdict.WARN, observed=f"no active IB/RoCE port on "
                                 f"{', '.join(without)}", explanation="NCCL falls back to TCP sockets on nodes "
                                 "without RDMA, and the whole collective runs at that speed", hosts=without,
                                 entry=E_TCP_FALLBACK))
    return checks


#: Logging switches: nodes may differ in them without harm.
_LOGGING_ONLY = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "TORCH_DISTRIBUTED_DEBUG",
                           "TORCH_CPP_LOG_LEVEL", "NCCL_CONF_FILE"})
#: Must be identical on every node, or the ranks look for different heads.
_SAME_EVERYWHERE = frozenset({"MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT",
                              "PET_RDZV_ENDPOINT"})


def launch_env_checks(facts: dict[str, HostFacts]) -> list[FleetCheck]:
    """The launch environments side by side: a setting some nodes have and others lack or set differently, and
    the launch script's hash (the same file everywhere, or not there at all)."""
    checks = []
    names = sorted({s.name for f in facts.values() for s in f.launch_env.settings} - _LOGGING_ONLY)
    for name in names:
        values = {h: f.launch_env.value(name) or "(unset)" for h, f in facts.items()}
        if len(set(values.values())) > 1:
            severe = name in _SAME_EVERYWHERE
            check = _same(f"env {name}", values, Verdict.FAIL if severe else Verdict.WARN,
                          "every node must point at the same head" if severe else
                          "the nodes' launch environments set this differently (login shell, launch script or "
                          "NCCL's config files; each host's facts.launch_env says where): NCCL and gloo then "
                          "behave differently per node", E_MASTER if severe else E_VERSIONS)
            checks.append(check)
    scripts = {h: f.launch_env.script for h, f in facts.items() if f.launch_env.script is not None}
    if scripts:
        missing = [h for h, sc in scripts.items() if sc.sha256 is None]
        hashes = {h: (sc.sha256 or "")[:12] for h, sc in scripts.items() if sc.sha256}
        if missing:
            checks.append(FleetCheck(name="launch_script", verdict=Verdict.FAIL, observed="; ".join(
                f"{h}: {scripts[h].error}" for h in missing), explanation="the launch script is missing or "
                "unreadable on these nodes", hosts=missing, entry=E_VERSIONS))
        checks.append(_same("launch_script", hashes, Verdict.WARN, "the launch script differs between nodes "
                            "(sha256 shown): copy one version everywhere", E_VERSIONS))
    return checks


def row_verdict(checks: Sequence[Check]) -> Verdict:
    return worst([c.verdict for c in checks])


def fleet_verdict(rows: Sequence[HostRow], checks: Sequence[FleetCheck]) -> Verdict:
    return worst([r.verdict for r in rows] + [c.verdict for c in checks])


def nccl_env(facts: dict[str, HostFacts]) -> tuple[dict[str, str], list[str]]:
    """The NCCL_* (and GLOO_*) settings the checks suggest, with a note per decision."""
    env: dict[str, str] = {}
    notes: list[str] = []
    ifaces = {h: f.route.iface for h, f in facts.items() if f.route is not None and f.route.iface}
    names = sorted(set(ifaces.values()))
    if len(names) == 1:
        env["NCCL_SOCKET_IFNAME"] = f"={names[0]}"
        env["GLOO_SOCKET_IFNAME"] = names[0]
    elif names:
        env["NCCL_SOCKET_IFNAME"] = ",".join(names)
        env["GLOO_SOCKET_IFNAME"] = ",".join(names)
        notes.append("the interface towards the head differs per host (" + ", ".join(f"{h}: {i}" for h, i in
                     ifaces.items()) + "); a prefix list covers all of them, or set each host's own value (NODE-01)")
    if facts and not any(p.active for f in facts.values() for p in f.ib_ports):
        env["NCCL_IB_DISABLE"] = "1"
        notes.append("no active InfiniBand/RoCE port on any host: NCCL_IB_DISABLE=1 skips the RDMA probe and "
                      "uses TCP sockets")
    return env, notes
