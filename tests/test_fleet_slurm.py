"""The Slurm fan-out (``srun --ntasks-per-node=1``) against a real controller, skipped where there is none.

Set-up that runs on one Debian 12 machine in about a minute (as root): ``apt-get install -y slurm-wlm``,
start ``munged``, write a ``slurm.conf`` with ``SlurmctldHost=localhost`` and one ``NodeName=localhost
NodeHostname=$(hostname)`` in a default partition, start ``slurmctld`` and ``slurmd``; ``srun -N1 hostname``
then answers. Without ``srun``, or with no controller answering ``scontrol ping``, these tests are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from remote_gpu_trainer.fleet.facts import HostFacts
from remote_gpu_trainer.fleet.tool import srun_facts


def _controller_up() -> bool:
    if not (shutil.which("srun") and shutil.which("scontrol")):
        return False
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ping.returncode == 0 and "UP" in ping.stdout


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _controller_up(), reason="no srun, or no Slurm controller answers scontrol ping")]


def _nodes() -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=10)
    return sorted(set(out.stdout.split()))


def test_srun_runs_host_facts_on_the_node_with_this_environment(monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "healthy-8xh100")  # srun exports the caller's environment
    node = _nodes()[0]
    got = srun_facts([node], {"checkpoint_dir": "/tmp"}, timeout_s=120)
    facts = got[node]
    assert isinstance(facts, HostFacts), facts
    assert facts.hostname == socket.gethostname()
    assert facts.health.gpus_found == 8 and facts.health.verdict.value == "PASS"
    assert facts.torch.torch and facts.torch.python_executable == sys.executable


def test_a_node_outside_the_cluster_is_a_row_with_srun_own_words():
    got = srun_facts(["rgt-no-such-node"], {"checkpoint_dir": "/tmp"}, timeout_s=60)
    error = got["rgt-no-such-node"]
    assert not isinstance(error, HostFacts) and error.kind == "srun_failed"
    assert "srun" in error.message.lower() or "node" in error.message.lower(), error.message


def test_preflight_slurm_inside_an_allocation_fans_out_with_srun():
    code = ("from remote_gpu_trainer.fleet.tool import SPECS; "
            "r = SPECS[0].call({'slurm': True, 'wait_s': None, 'checkpoint_dir': '/tmp', 'expect_gpus': 8}); "
            "print('RGT-RESULT ' + r.model_dump_json())")
    done = subprocess.run(["salloc", "-N1", "--quiet", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "RGT_HEALTH_FAKE": "healthy-8xh100"})
    line = next((x for x in done.stdout.splitlines() if x.startswith("RGT-RESULT ")), None)
    assert line, (done.returncode, done.stdout[-1000:], done.stderr[-2000:])
    result = json.loads(line.removeprefix("RGT-RESULT "))
    assert [r["host"] for r in result["hosts"]] == _nodes()[:1]
    assert result["hosts"][0]["reachable"] and result["hosts"][0]["facts"]["health"]["gpus_found"] == 8
    assert any("srun" in n for n in result["notes"]), result["notes"]
