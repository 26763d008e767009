"""preflight through real loopback ssh boxes (tests/sshbox.py): over MCP, a 4-host fleet with mixed fake
GPU scenarios and one address where nothing listens gets exact per-host and overall verdicts; the CPU (gloo)
all-reduce runs across two boxes with c10d rendezvous at the head and reports bandwidth; a rank killed
mid-run is a clean failure naming its box; and no process of the check is left on any box afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import anyio
import psutil
import pytest

from remote_gpu_trainer.fleet.allreduce import run_fleet_allreduce
from remote_gpu_trainer.fleet.facts import HOST_FACTS, HostFacts
from remote_gpu_trainer.models import Verdict
from remote_gpu_trainer.processes.ports import suggest_free_port

from .conftest import call_ok
from .sshbox import needs_torch_in_runtime

pytestmark = pytest.mark.slow

SCENARIOS = {"pf-head": "healthy-8xh100", "pf-ecc": "ecc-dbe", "pf-old": "driver-535-8xh100"}
CLOSED = "pf-closed"
WORKER = "remote_gpu_trainer.fleet.allreduce"


@pytest.fixture(scope="module")
def fleet(ssh_fleet):
    """Three boxes of our own (sshd and asyncssh servers alike) and one alias where nothing listens."""
    for number, (alias, scenario) in enumerate(SCENARIOS.items()):
        if alias not in ssh_fleet.boxes:
            ssh_fleet.add(alias, scenario=scenario, server="asyncssh" if number == 1 else None)
            ssh_fleet.install_runtime(alias)
    if not any(block.startswith(f"Host {CLOSED}\n") for block in ssh_fleet._blocks):
        ssh_fleet.add_closed(CLOSED)
    return ssh_fleet


def _port() -> int:
    port = suggest_free_port(29400, 500)
    assert port is not None
    return port


def _leftovers(fleet, aliases) -> list[str]:
    """Processes of the check (torchrun, ranks, probes) still running for these boxes; the kept-open
    session server (remote.serve) is the transport's and stays by design."""
    left = []
    for alias in aliases:
        for proc in fleet.box_processes(alias):
            try:
                cmdline = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if "remote_gpu_trainer.remote.serve" not in cmdline:
                left.append(f"{alias}: {proc.pid} {cmdline[:120]}")
    return left


async def _preflight(client, arguments: dict, timeout_s: float = 150) -> dict:
    """Start over MCP with a short wait, as a client that gives up after a minute would, then poll."""
    result = await call_ok(client, "preflight", {**arguments, "wait_s": 0})
    assert result["done"] is False and result["job_id"], result
    deadline = time.monotonic() + timeout_s
    while not result["done"] and time.monotonic() < deadline:
        await anyio.sleep(0.5)
        result = await call_ok(client, "preflight", {"job_id": result["job_id"]})
    assert result["done"], result
    return result


@pytest.fixture(scope="module")
def mixed(fleet):
    """One MCP pre-flight of the 4-host fleet, shared by the checks below."""
    from mcp import Client

    from remote_gpu_trainer.server import build_server

    hosts = [*SCENARIOS, CLOSED]

    async def go() -> dict:
        async with Client(build_server(), mode="legacy") as client:
            return await _preflight(client, {"hosts": hosts, "expect_gpus": 8, "port": _port(),
                                             "checkpoint_dir": "/tmp", "timeout_s": 60})

    return anyio.run(go)


@needs_torch_in_runtime
def test_each_box_gets_its_verdict_and_the_fleet_fails(mixed):
    verdicts = {r["host"]: r["verdict"] for r in mixed["hosts"]}
    assert verdicts == {"pf-head": "PASS", "pf-ecc": "FAIL", "pf-old": "WARN", CLOSED: "FAIL"}, \
        json.dumps([{r["host"]: [(c["name"], c["verdict"], c["observed"]) for c in r["checks"]]}
                    for r in mixed["hosts"]], indent=1)
    assert mixed["verdict"] == "FAIL" and mixed["state"] == "done"
    assert mixed["summary"].startswith("FAIL: 4 host(s)")


def test_the_closed_box_is_named_with_ssh_own_cause(mixed):
    closed = next(r for r in mixed["hosts"] if r["host"] == CLOSED)
    assert closed["reachable"] is False and closed["facts"] is None
    assert closed["error"]["kind"] == "connection_refused"
    reach = closed["checks"][0]
    assert reach["name"] == "reachable" and reach["verdict"] == "FAIL"
    assert "Connection refused" in reach["observed"] and "127.0.0.1" in reach["observed"]
    assert reach["entry"]["id"] == "NODE-18"


def test_scenarios_come_from_each_box(mixed, fleet):
    rows = {r["host"]: r for r in mixed["hosts"]}
    ecc = {c["name"]: c for c in rows["pf-ecc"]["checks"]}
    assert ecc["gpu_health"]["verdict"] == "FAIL" and "ecc" in ecc["gpu_health"]["observed"].lower()
    driver = next(c for c in mixed["fleet_checks"] if c["name"] == "driver")
    assert driver["verdict"] == "WARN" and driver["hosts"] == ["pf-old"] and driver["entry"]["id"] == "NODE-17"
    assert rows["pf-old"]["facts"]["health"]["driver_version"] == "535.183.01"
    # each box answered from its own HOME (the runtime's python there), not from this process
    assert all(rows[h]["facts"]["torch"]["python_executable"].startswith(str(fleet.boxes[h].home))
               for h in SCENARIOS)


def test_workers_reached_the_head_over_ssh_and_the_head_held_its_port(mixed):
    rows = {r["host"]: {c["name"]: c for c in r["checks"]} for r in mixed["hosts"]}
    assert rows["pf-head"]["head_port"]["verdict"] == "PASS"
    assert rows["pf-ecc"]["head_reachable"]["verdict"] == "PASS"
    assert rows["pf-old"]["head_reachable"]["verdict"] == "PASS"
    head = next(r for r in mixed["hosts"] if r["host"] == "pf-head")
    assert head["facts"]["listener_accepted"] == 2
    assert mixed["head_addr"] == "127.0.0.1"  # the head alias's HostName, read with ssh -G


def test_loopback_fleet_gets_env_and_a_note_instead_of_a_launch(mixed):
    assert mixed["nccl_env"]["NCCL_SOCKET_IFNAME"] == "=lo"
    assert mixed["launch"] is None
    assert any("loopback" in n for n in mixed["notes"]), mixed["notes"]


def test_no_process_of_the_check_is_left_on_any_box(mixed, fleet):
    assert _leftovers(fleet, SCENARIOS) == []


# --- the collective ---------------------------------------------------------------------------------


@needs_torch_in_runtime
@pytest.mark.anyio
@pytest.mark.parametrize("client", ["legacy"], indirect=True)
async def test_gloo_allreduce_across_two_boxes_over_mcp_reports_bandwidth(fleet, client):
    result = await _preflight(client, {"hosts": ["pf-head", "pf-old"], "port": _port(), "checkpoint_dir": "/tmp",
                                       "allreduce": True, "timeout_s": 90})
    report = result["allreduce"]
    assert report["backend"] == "gloo" and report["world_size"] == 2, json.dumps(report)[:4000]
    assert report["verdict"] == "PASS", report["explanation"]
    assert [h["state"] for h in report["hosts"]] == ["finished", "finished"]
    assert [r["size_bytes"] for r in report["rows"]] == [1 << 20, 4 << 20, 16 << 20, 64 << 20]
    assert all(r["busbw_gbps"] > 0 and r["algbw_gbps"] > 0 for r in report["rows"])
    assert report["judged_size_bytes"] == 64 << 20 and report["busbw_gbps"] == report["rows"][-1]["busbw_gbps"]
    failing = [(row["host"], c["name"], c["observed"]) for row in result["hosts"] for c in row["checks"]
               if c["verdict"] == "FAIL"] + [(c["name"], c["observed"]) for c in result.get("fleet_checks", [])
                                             if c["verdict"] == "FAIL"]
    head = next(r for r in result["hosts"] if r["host"] == "pf-head")["facts"]
    old = next(r for r in result["hosts"] if r["host"] == "pf-old")["facts"]
    keys = ("box_time", "elapsed_s", "port_detail", "listener_accepted", "head_connect", "head_connect_detail")
    assert result["verdict"] == "WARN", json.dumps([failing, {k: head[k] for k in keys}, {k: old[k] for k in keys}])
    assert _leftovers(fleet, SCENARIOS) == []


@needs_torch_in_runtime
def test_a_rank_killed_mid_run_on_one_box_fails_cleanly_naming_it(fleet):
    facts = {}
    for alias in ("pf-head", "pf-ecc"):
        got = HOST_FACTS.call({"host": alias, "checkpoint_dir": "/tmp"})
        facts[alias] = HostFacts.model_validate(got.model_dump(exclude={"host", "box"}))
    home = str(fleet.root / "homes" / "pf-ecc")
    killed: list[int] = []

    def kill_a_rank_of_pf_ecc() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for proc in psutil.process_iter(["cmdline"]):
                try:
                    if WORKER in " ".join(proc.info["cmdline"] or []) and "RANK" in proc.environ() \
                            and proc.environ().get("HOME") == home:
                        time.sleep(1.5)  # into the timed loop
                        proc.kill()
                        killed.append(proc.pid)
                        return
                except psutil.Error:
                    continue
            time.sleep(0.1)

    killer = threading.Thread(target=kill_a_rank_of_pf_ecc, daemon=True)
    killer.start()
    report = run_fleet_allreduce(["pf-head", "pf-ecc"], "pf-head", "127.0.0.1", _port(), facts, timeout_s=90,
                                 iters=400)
    killer.join(5)
    assert killed, "no rank of pf-ecc was found to kill"
    assert report.verdict is Verdict.FAIL
    assert report.failed_hosts == ["pf-ecc"], report
    assert "pf-ecc (died" in report.explanation
    # the head's rank fails with gloo's error or is ended by its own torchrun agent: a consequence, never blamed
    states = {h.host: h.state for h in report.hosts}
    assert states["pf-ecc"] == "died" and states["pf-head"] in ("failed", "stopped"), report.hosts
    assert _leftovers(fleet, SCENARIOS) == []


# --- bounded concurrency and a box that never answers ----------------------------------------------


@pytest.fixture
def silent_alias(fleet):
    """An alias whose port accepts TCP and then says nothing (no ssh banner): a wedged box or proxy."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    alias = f"pf-silent-{listener.getsockname()[1]}"
    fleet.add_alias(alias, listener.getsockname()[1])
    yield alias
    stop.set()
    for conn in held:
        conn.close()
    listener.close()


def test_head_listed_last_with_few_slots_and_a_silent_box_still_proves_the_workers(fleet, silent_alias):
    """The head runs first and holds its port for every round of workers, so a worker that waits for a free
    slot still finds it open; the box that never answers is cut at its deadline, named, and stalls no one."""
    from remote_gpu_trainer.fleet.tool import PreflightInput, run_fleet

    args = PreflightInput(hosts=["pf-ecc", silent_alias, "pf-old", "pf-head"], head="pf-head", port=_port(),
                          checkpoint_dir="/tmp", concurrency=3, timeout_s=30)
    result = run_fleet(args, lambda *a, **k: None)
    rows = {r.host: r for r in result.hosts}
    silent = rows[silent_alias]
    assert not silent.reachable and silent.error.kind == "timeout", silent.error
    assert "timed out" in silent.checks[0].observed
    for worker in ("pf-ecc", "pf-old"):
        reach = next(c for c in rows[worker].checks if c.name == "head_reachable")
        assert reach.verdict is Verdict.PASS, (worker, reach)
    assert rows["pf-head"].facts.listener_accepted == 2
    assert _leftovers(fleet, SCENARIOS) == []


# --- the CLI waits; jobs are for MCP clients ----------------------------------------------------------


def _rgt(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remote_gpu_trainer.cli", *argv], capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL)


@needs_torch_in_runtime
def test_the_cli_waits_for_the_result_and_prints_progress_without_a_job(fleet):
    """A job lives in the process that started it, so no later `rgt` could poll one: `rgt preflight` has no
    --wait-s/--job-id, waits for the whole check and reports progress on stderr."""
    done = _rgt("preflight", "--hosts", "pf-head", "pf-old", "--port", str(_port()), "--checkpoint-dir", "/tmp",
                "--json")
    assert done.returncode == 0, done.stderr[-2000:]  # WARN (pf-old's driver) exits 0
    result = json.loads(done.stdout)
    assert result["done"] is True and result["state"] == "done" and result["job_id"] is None
    assert {r["host"]: r["verdict"] for r in result["hosts"]} == {"pf-head": "PASS", "pf-old": "WARN"}
    assert "pf-head: ok" in done.stderr and "pf-old: ok" in done.stderr  # progress, on stderr only
    for flag in ("--wait-s", "--job-id"):
        refused = _rgt("preflight", "--hosts", "pf-head", flag, "0")
        assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr, refused.stderr
