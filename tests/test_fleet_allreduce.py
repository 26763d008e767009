"""The fleet all-reduce really runs: two torchrun agents ("hosts") on this machine, c10d rendezvous on
127.0.0.1, gloo on CPU; and a rank killed mid-run gives a clean failure naming its host, with no
process left behind."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

from remote_gpu_trainer.fleet.allreduce import ALLREDUCE_NODE, NodeResult, run_fleet_allreduce
from remote_gpu_trainer.fleet.facts import HOST_FACTS, HostFacts
from remote_gpu_trainer.models import Verdict

from .conftest import rendezvous_port, started_by_this_run

pytestmark = pytest.mark.slow
WORKER = "remote_gpu_trainer.fleet.rank"


def local_node(host: str, arguments: dict) -> NodeResult:
    return ALLREDUCE_NODE.call(arguments)  # every "host" is this machine


@pytest.fixture(scope="module")
def facts() -> HostFacts:
    result = HOST_FACTS.call({"checkpoint_dir": "/tmp"})
    return HostFacts.model_validate(result.model_dump(exclude={"host", "box"}))


def _ours() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if (WORKER in cmdline or "rgt-preflight-" in cmdline) and started_by_this_run(proc):
            found.append(proc)
    return found


def test_gloo_allreduce_across_two_hosts_reports_bandwidth_and_cleans_up(facts):
    port = rendezvous_port()
    report = run_fleet_allreduce(["a", "b"], "a", "127.0.0.1", port, {"a": facts, "b": facts}, timeout_s=120,
                                 caller=local_node)
    assert report.backend == "gloo" and report.world_size == 2, report
    assert report.verdict is Verdict.PASS, report.explanation
    assert [r.size_bytes for r in report.rows] == [1 << 20, 4 << 20, 16 << 20, 64 << 20]
    assert all(r.busbw_gbps > 0 and r.busbw_gbps == pytest.approx(r.algbw_gbps, rel=1e-3) for r in report.rows)
    assert report.judged_size_bytes == 64 << 20 and report.busbw_gbps == report.rows[-1].busbw_gbps
    assert any("64 MiB" in n for n in report.notes)
    assert [h.state for h in report.hosts] == ["finished", "finished"]
    assert _ours() == []


def test_a_rank_killed_mid_run_fails_cleanly_naming_its_host(facts):
    port = rendezvous_port()
    victim_pids: list[int] = []

    def kill_b_rank(rdzv_id: str) -> None:
        """Kill host b's rank a second after it appears, found by the host tag in its environment."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not victim_pids:
            for proc in psutil.process_iter(["cmdline"]):
                if WORKER not in " ".join(proc.info["cmdline"] or []) or not started_by_this_run(proc):
                    continue
                try:
                    env = proc.environ()
                except psutil.Error:
                    continue
                if env.get("RGT_TEST_HOST") == "b" and env.get("RANK") is not None:
                    time.sleep(1.0)
                    victim_pids.append(proc.pid)
                    proc.kill()
                    return
            time.sleep(0.1)

    lock = threading.Lock()

    def serial_env(host: str, arguments: dict) -> NodeResult:
        with lock:
            os.environ["RGT_TEST_HOST"] = host
            if host == "b":
                threading.Thread(target=kill_b_rank, args=(arguments["rdzv_id"],), daemon=True).start()
            result: dict = {}
            thread = threading.Thread(target=lambda: result.setdefault("r", local_node(host, arguments)))
            thread.start()
            time.sleep(0.5)  # torchrun has been spawned with this host's tag
        thread.join()
        return result["r"]

    report = run_fleet_allreduce(["a", "b"], "a", "127.0.0.1", port, {"a": facts, "b": facts}, timeout_s=90,
                                 caller=serial_env, iters=400)
    os.environ.pop("RGT_TEST_HOST", None)
    assert victim_pids, "the test did not find host b's rank to kill"
    assert report.verdict is Verdict.FAIL
    assert report.failed_hosts == ["b"], report
    assert "b (died" in report.explanation
    assert _ours() == []
