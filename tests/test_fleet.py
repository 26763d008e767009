"""Fleet pre-flight: hostfile and nodelist parsing, cross-host verdicts, and a local fleet of "hosts"
that run host_facts in their own processes with different fake GPU scenarios."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.fleet.facts import HostFacts
from remote_gpu_trainer.fleet.hosts import FleetHost, expand_nodelist, fleet_from, parse_hostfile_text
from remote_gpu_trainer.fleet.tool import PreflightInput, run_fleet
from remote_gpu_trainer.models import Verdict
from remote_gpu_trainer.remote.errors import RemoteError

from .conftest import rendezvous_port

# --- parsing -------------------------------------------------------------------------------------


def test_slurm_nodelists_expand_like_slurm_does():
    assert expand_nodelist("node[01-04,07]") == ["node01", "node02", "node03", "node04", "node07"]
    assert expand_nodelist("gpu-a[1-2],gpu-b3") == ["gpu-a1", "gpu-a2", "gpu-b3"]


def test_a_broken_nodelist_is_an_input_error_naming_the_field():
    with pytest.raises(InputError) as err:
        expand_nodelist("node[01-")
    assert err.value.field == "slurm"


def test_slurm_flag_reads_the_allocation_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-a[1-2],gpu-b3")
    assert [h.host for h in fleet_from(None, None, True)] == ["gpu-a1", "gpu-a2", "gpu-b3"]
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    with pytest.raises(InputError, match="SLURM_JOB_NODELIST"):
        fleet_from(None, None, True)


def test_deepspeed_hostfile_with_slots_comments_and_plain_lines():
    text = "# 2 nodes of 8\nworker-0 slots=8\n\nworker-1 slots=8  # the second box\n10.0.0.7\n"
    assert parse_hostfile_text(text) == [FleetHost("worker-0", 8), FleetHost("worker-1", 8), FleetHost("10.0.0.7")]


@pytest.mark.parametrize("text, why", [("worker-0 slots=8\nworker-0 slots=8\n", "listed twice"),
                                       ("worker-0 slots=eight\n", "neither"), ("# only a comment\n", "no host"),
                                       ("worker-0 slots=0\n", "slots=0")])
def test_bad_hostfiles_are_refused_with_the_line(text, why):
    with pytest.raises(InputError, match=why):
        parse_hostfile_text(text)


def test_the_fleet_is_named_exactly_one_way(tmp_path):
    with pytest.raises(InputError, match="exactly one way"):
        fleet_from(["a"], str(tmp_path / "h"), False)
    with pytest.raises(InputError, match="cannot read"):
        fleet_from(None, str(tmp_path / "missing"), False)


# --- a local fleet: each "host" is a child process with its own fake GPU scenario ------------------


def local_caller(scenarios: dict[str, str | None]):
    """Run host_facts for ``host`` in a child process (the box), with that host's fake scenario.
    A scenario of None plays a host whose ssh connection is refused."""

    def call(host: str, arguments: dict) -> HostFacts:
        scenario = scenarios[host]
        if scenario is None:
            raise RemoteError(host, "connection_refused", "ssh: connect to host 127.0.0.1 port 1: Connection refused",
                              "check the box is running and the port is right")
        env = {**os.environ, "RGT_HEALTH_FAKE": scenario}
        out = subprocess.run([sys.executable, "-m", "remote_gpu_trainer.fleet.facts"], input=json.dumps(arguments),
                             capture_output=True, text=True, env=env, timeout=120, check=True)
        return HostFacts.model_validate(json.loads(out.stdout.strip().splitlines()[-1])["result"])

    return call


@pytest.fixture(scope="module")
def mixed_fleet():
    scenarios = {"head": "healthy-8xh100", "ecc": "ecc-dbe", "old": "driver-535-8xh100", "closed": None}
    args = PreflightInput(hosts=list(scenarios), expect_gpus=8, head_addr="127.0.0.1", port=rendezvous_port(),
                          checkpoint_dir="/tmp", concurrency=4)
    return run_fleet(args, lambda *a, **k: None, caller=local_caller(scenarios))


def test_each_host_gets_its_own_verdict(mixed_fleet):
    verdicts = {r.host: r.verdict for r in mixed_fleet.hosts}
    assert verdicts == {"head": Verdict.PASS, "ecc": Verdict.FAIL, "old": Verdict.WARN, "closed": Verdict.FAIL}
    assert mixed_fleet.verdict is Verdict.FAIL


def test_the_unreachable_host_carries_the_ssh_cause(mixed_fleet):
    closed = next(r for r in mixed_fleet.hosts if r.host == "closed")
    assert not closed.reachable and closed.facts is None
    assert closed.checks[0].name == "reachable"
    assert "Connection refused" in closed.checks[0].observed
    assert closed.checks[0].entry.id == "NODE-18"


def test_the_ecc_host_fails_on_gpu_health(mixed_fleet):
    ecc = next(r for r in mixed_fleet.hosts if r.host == "ecc")
    health = next(c for c in ecc.checks if c.name == "gpu_health")
    assert health.verdict is Verdict.FAIL and "ecc" in health.observed.lower()


def test_a_different_driver_is_a_warning_naming_the_odd_host(mixed_fleet):
    driver = next(c for c in mixed_fleet.fleet_checks if c.name == "driver")
    assert driver.verdict is Verdict.WARN and driver.hosts == ["old"] and driver.entry.id == "NODE-17"
    assert "535.183.01: old" in driver.observed


def test_workers_reached_the_head_port_and_the_head_held_it(mixed_fleet):
    rows = {r.host: {c.name: c for c in r.checks} for r in mixed_fleet.hosts}
    assert rows["head"]["head_port"].verdict is Verdict.PASS
    assert rows["ecc"]["head_reachable"].verdict is Verdict.PASS
    assert rows["old"]["head_reachable"].verdict is Verdict.PASS
    assert mixed_fleet.hosts[0].facts.listener_accepted == 2


def test_nccl_env_and_launch_come_from_the_checks(mixed_fleet):
    assert mixed_fleet.nccl_env["NCCL_SOCKET_IFNAME"] == "=lo"
    assert mixed_fleet.nccl_env["NCCL_IB_DISABLE"] == "1"
    # render_launch refuses a loopback head for a real multi-node launch, and the note says so
    assert mixed_fleet.launch is None
    assert any("loopback" in n for n in mixed_fleet.notes)


def test_launch_is_rendered_by_render_launch_for_a_routable_head():
    from remote_gpu_trainer.fleet.hosts import FleetHost as H
    from remote_gpu_trainer.fleet.tool import _launch

    notes: list[str] = []
    args = PreflightInput(hosts=["a", "b"], expect_gpus=8, port=29400)
    command = _launch(args, [H("a"), H("b")], {}, "10.0.0.5", {"NCCL_SOCKET_IFNAME": "=ens5"}, notes)
    assert command.startswith("torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d "
                              "--rdzv-endpoint=10.0.0.5:29400"), (command, notes)


def test_a_busy_head_port_fails_on_the_head_and_leaves_workers_unjudged():
    import socket

    port = rendezvous_port()
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", port))
        holder.listen()
        args = PreflightInput(hosts=["head", "w1"], head_addr="127.0.0.1", port=port, checkpoint_dir="/tmp")
        result = run_fleet(args, lambda *a, **k: None,
                           caller=local_caller({"head": "healthy-8xh100", "w1": "healthy-8xh100"}))
    rows = {r.host: {c.name: c for c in r.checks} for r in result.hosts}
    assert rows["head"]["head_port"].verdict is Verdict.FAIL
    assert rows["head"]["head_port"].entry.id == "DIST-02"
    assert f"pid {os.getpid()}" in rows["head"]["head_port"].observed  # the holder, by pid and command line
    assert "loopback only" not in rows["head"]["head_port"].observed  # it listens on every address
    # the worker still gets a verdict: it connected to whatever holds the port
    assert rows["w1"]["head_reachable"].verdict is Verdict.PASS, rows["w1"]["head_reachable"]


def test_a_host_without_any_torch_cannot_be_checked_and_does_not_bury_real_faults():
    from remote_gpu_trainer.trainenv.find import TrainingEnv

    real = local_caller({"head": "healthy-8xh100", "ecc": "ecc-dbe", "notorch": "healthy-8xh100"})

    def call(host: str, arguments: dict) -> HostFacts:
        facts = real(host, arguments)
        if host == "notorch":  # as on a box where no interpreter with torch was found
            facts.torch = TrainingEnv(python=None, source="none", found_by="no interpreter with torch was found")
        return facts

    args = PreflightInput(hosts=["head", "ecc", "notorch"], head_addr="127.0.0.1", port=rendezvous_port(),
                          checkpoint_dir="/tmp")
    result = run_fleet(args, lambda *a, **k: None, caller=call)
    verdicts = {r.host: r.verdict for r in result.hosts}
    assert verdicts["notorch"] is Verdict.UNKNOWN and verdicts["ecc"] is Verdict.FAIL
    assert "fail on 1: ecc (gpu_health)" in result.summary, result.summary
    assert "cannot check on 1: notorch (torch)" in result.summary
    torch = next(c for c in result.hosts[2].checks if c.name == "torch")
    assert torch.observed.startswith("cannot check") and "python=" in torch.explanation
    assert "runtime" not in torch.explanation
    from remote_gpu_trainer.fleet.tool import render_preflight

    assert "CANNOT CHECK torch: cannot check: no python with torch found" in render_preflight(result)


def test_a_host_that_is_not_an_ssh_name_is_refused_before_anything_runs():
    from remote_gpu_trainer.fleet.tool import SPECS

    with pytest.raises(InputError) as err:
        SPECS[0].call({"hosts": ["good", "-oProxyCommand=touch /tmp/x"]})
    assert err.value.field == "hosts" and "starts with '-'" in str(err.value)


def test_the_head_check_leaves_the_port_bindable_for_torchrun():
    """The head's listener must not leave a server-side TIME_WAIT on head:port: torchrun's TCPStore binds
    without SO_REUSEADDR and would fail with EADDRINUSE for a minute right after the pre-flight."""
    import socket
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from remote_gpu_trainer.fleet.network import HeadListener
    port = rendezvous_port()
    listener = HeadListener(port, 1, 5).start()
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        time.sleep(0.3)  # the worker lingers: a listener that closed first would own the TIME_WAIT
    listener.wait()
    assert listener.accepted
    store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=5))
    del store


def test_a_torch_that_did_not_import_and_a_patch_level_are_not_fleet_mismatches():
    """torch located but not imported (its import failed: that host's own torch check says so) has no CUDA
    build to compare, so it must not add a "mixed builds" FAIL; 3.10.12 and 3.10.14 are one Python for pickles
    and wheels."""
    from remote_gpu_trainer.fleet.verdicts import fleet_checks
    from remote_gpu_trainer.trainenv.find import TrainingEnv

    facts = local_caller({"a": "healthy-8xh100"})("a", {"timeout_s": 30, "checkpoint_dir": "/tmp"})
    good = TrainingEnv(python="/opt/venv/bin/python", source="python", found_by="python=", python_version="3.10.12",
                       torch="2.3.0+cu121", torch_imported=True, torch_cuda="12.1")
    broken = good.model_copy(update={"python_version": "3.10.14", "torch": "2.3.0+cu121", "torch_imported": False,
                                     "torch_cuda": None})
    both = {"a": facts.model_copy(update={"torch": good}), "b": facts.model_copy(update={"torch": broken})}
    checks = {c.name: c for c in fleet_checks(both, 8)}
    assert checks["torch_version"].verdict is Verdict.PASS, checks["torch_version"]
    assert checks["python_version"].verdict is Verdict.PASS, checks["python_version"]
    newer = good.model_copy(update={"python_version": "3.11.4"})
    checks = {c.name: c for c in fleet_checks({**both, "b": facts.model_copy(update={"torch": newer})}, 8)}
    assert checks["python_version"].verdict is Verdict.WARN and checks["python_version"].hosts
