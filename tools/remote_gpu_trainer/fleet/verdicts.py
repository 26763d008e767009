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
    nccl_socket_ifname: str | None = Field(None, description="The interface that routes to the head on this host")
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


def host_checks(facts: HostFacts, *, is_head: bool, expect_gpus: int | None, head_ok: bool | None,
                clock_offset_s: float | None, clock_uncertainty_s: float | None) -> list[Check]:
    """One host's own checks. ``head_ok``: whether the head itself came up (port bound); a worker's
    failed connect is only its fault when it did."""
    health = facts.health
    first = next((c.entry for c in health.findings if c.verdict is health.verdict and c.entry), None)
    checks = [_check("gpu_health", health.verdict, health.summary, "gpu_health PASS or WARN",
                     f"gpu_health on this box ({health.backend}); its findings are in facts.health", first)]
    if expect_gpus is not None:
        ok = health.gpus_found >= expect_gpus
        checks.append(_check("gpu_count", Verdict.PASS if ok else Verdict.FAIL, str(health.gpus_found),
                             f"≥ {expect_gpus}", "as expected" if ok else
                             "fewer GPUs than the launch will start ranks for: invalid device ordinal", E_VERSIONS))
    torch = facts.torch
    if torch.torch is None:
        checks.append(_check("torch", Verdict.FAIL, torch.error or "torch missing", "torch imports",
                             f"Install the same torch as the other nodes into {torch.python_executable} (or point "
                             "the runtime at the python that has it)", E_NO_TORCH))
    else:
        checks.append(_check("torch", Verdict.PASS, f"torch {torch.torch} · CUDA {torch.torch_cuda or 'none (CPU)'}"
                             f" · NCCL {torch.nccl or '-'} · python {torch.python}", "imports",
                             "torch imports in the runtime's python"))
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
    if facts.route is not None:
        verdict, why = _iface_verdict(facts.route.iface, is_head)
        checks.append(_check("route_to_head", verdict, f"{facts.route.iface or '?'} ({facts.route.detail})",
                             "a real NIC shared with the head", why, E_WRONG_IFACE if verdict is not Verdict.PASS
                             else None))
    if is_head and facts.port_free is not None:
        checks.append(_check("head_port", Verdict.PASS if facts.port_free else Verdict.FAIL, facts.port_detail,
                             "free on the head", "the rendezvous can bind it" if facts.port_free else
                             "something already holds the rendezvous port: torchrun's store cannot bind it",
                             None if facts.port_free else E_PORT_BUSY))
    if not is_head and facts.head_connect is not None:
        if facts.head_connect == "ok":
            checks.append(_check("head_reachable", Verdict.PASS, facts.head_connect_detail, "TCP connect succeeds",
                                 "this worker reaches the rendezvous port"))
        else:
            verdict = Verdict.FAIL if head_ok else Verdict.UNKNOWN
            why = ("this worker cannot open the head's rendezvous port: it would never join (firewall, security "
                   "group, wrong address)" if head_ok else "the head did not hold the port open, so this "
                   "connect proves nothing")
            checks.append(_check("head_reachable", verdict, f"{facts.head_connect}: {facts.head_connect_detail}",
                                 "TCP connect succeeds", why, E_MASTER))
    return checks


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


def fleet_checks(facts: dict[str, HostFacts], expect_gpus: int | None) -> list[FleetCheck]:
    """Checks across the hosts that answered."""
    def values(get: Callable[[HostFacts], object]) -> dict[str, str]:
        return {h: str(v) for h, f in facts.items() if (v := get(f)) is not None}

    with_torch = {h: f for h, f in facts.items() if f.torch.torch}
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
    rdma = {h: any(p.active for p in f.ib_ports) for h, f in facts.items()}
    if any(rdma.values()) and not all(rdma.values()):
        without = [h for h, v in rdma.items() if not v]
        checks.append(FleetCheck(name="rdma", verdict=Verdict.WARN, observed=f"no active IB/RoCE port on "
                                 f"{', '.join(without)}", explanation="NCCL falls back to TCP sockets on nodes "
                                 "without RDMA, and the whole collective runs at that speed", hosts=without,
                                 entry=E_TCP_FALLBACK))
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
