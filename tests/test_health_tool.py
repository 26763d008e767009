"""gpu_health and reap_vram_zombies through the MCP server and the `rgt` CLI (this machine: no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from remote_gpu_trainer import cli, nvml_session
from remote_gpu_trainer.health.fakes import SCENARIOS

from .conftest import call_error, call_ok

pytestmark = pytest.mark.anyio


def _has_gpu() -> bool:
    return bool(nvml_session.nvml_status().ok)


async def test_gpu_health_without_a_driver_answers_fast_and_says_why(client):
    if _has_gpu():
        pytest.skip("this machine has a working NVIDIA driver")
    started = time.monotonic()
    data = await call_ok(client, "gpu_health")
    assert time.monotonic() - started < 2
    assert data["verdict"] == "FAIL" and data["exit_code"] == 4 and data["gpus_found"] == 0
    driver = data["host_checks"][0]
    assert driver["name"] == "nvml_driver" and driver["verdict"] == "FAIL"
    assert "nvmlInit failed" in driver["observed"] and driver["entry"]["id"] in ("GOT-17", "GOT-12")
    assert "no NVIDIA GPU found" in data["summary"]


async def test_tool_annotations(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert tools["gpu_health"].annotations.read_only_hint is True
    zombies = tools["reap_vram_zombies"]
    assert zombies.annotations.destructive_hint is True and zombies.annotations.read_only_hint is False
    assert zombies.input_schema["properties"]["dry_run"]["default"] is True
    assert "Exit status" in tools["gpu_health"].description


@pytest.mark.parametrize(("arguments", "field"), [
    ({"sample_s": 11}, "sample_s"), ({"timeout_s": 0}, "timeout_s"), ({"expect_gpus": 0}, "expect_gpus"),
])
async def test_bad_input_names_the_field(client, arguments, field):
    assert field in await call_error(client, "gpu_health", arguments)


async def test_fake_scenario_through_mcp(client, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "ecc-dbe")
    data = await call_ok(client, "gpu_health", {"expect_gpus": 8})
    assert data["backend"] == "fake:ecc-dbe" and data["verdict"] == "FAIL" and data["exit_code"] == 1
    gpu2 = {c["name"]: c for c in data["gpus"][2]["checks"]}
    assert gpu2["ecc_uncorrected"]["verdict"] == "FAIL"
    assert gpu2["ecc_uncorrected"]["entry"] == {"file": "references/gotchas_universal.md", "id": "GOT-19"}


async def test_unknown_fake_scenario_is_an_input_error(client, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "melted")
    text = await call_error(client, "gpu_health", {})
    assert "RGT_HEALTH_FAKE" in text and "healthy-8xh100" in text


async def test_out_of_range_indices_name_the_field(client, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "healthy-8xh100")
    text = await call_error(client, "gpu_health", {"indices": [0, 12]})
    assert "indices: no GPU 12 on this machine (8 found)" in text and "allowed: 0, 1, 2" in text


async def test_a_hang_never_hangs_the_server(client, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "nvml-hang")
    started = time.monotonic()
    data = await call_ok(client, "gpu_health", {"timeout_s": 1})
    assert time.monotonic() - started < 5
    assert data["verdict"] == "FAIL" and "nvmlDeviceGetRemappedRows (GPU 4)" in data["summary"]
    # the server still answers other calls at once
    assert (await call_ok(client, "skill_info"))["name"] == "remote-gpu-trainer"


async def test_reap_dry_run_on_a_fake_lists_classes_and_signals_nothing(client, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "zombie-orphan-namespaced")
    data = await call_ok(client, "reap_vram_zombies", {})
    assert data["dry_run"] is True and data["kill"] is None
    kinds = {row["pid"]: row["kind"] for row in data["holders"]}
    assert kinds[2001] == "orphan" and kinds[3001] == "zombie" and kinds[4001] == "uninterruptible"
    assert kinds[884422] == "namespaced" and kinds[771133] == "phantom" and kinds[4294967295] == "invalid_pid"
    assert {row["pid"] for row in data["holders"] if row["candidate"]} == {2001, 2002, 5005}


@pytest.mark.parametrize(("scenario", "code"), [("healthy-8xh100", 0), ("exclusive-process", 0),
                                                 ("row-remap-pending", 1), ("container-healthy", 0),
                                                 ("no-driver", 4)])
def test_cli_exit_codes(monkeypatch, capsys, scenario, code):
    monkeypatch.setenv("RGT_HEALTH_FAKE", scenario)
    assert cli.main(["health"]) == code
    out = capsys.readouterr().out
    assert out.startswith("gpu_health: ") and f"exit {code}:" in out and "FAKE NVML scenario" in out


def test_cli_text_lists_findings_with_entries(monkeypatch, capsys):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "thermal-throttle")
    cli.main(["health", "--sample-s", "0.1"])
    out = capsys.readouterr().out
    assert "FAIL    GPU 3  clock_events: HW slowdown (idle)" in out
    assert "references/gotchas_universal.md#GOT-24" in out


def test_cli_json_is_the_structured_report(monkeypatch, capsys):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "mig-on")
    assert cli.main(["health", "--json", "--indices", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "WARN" and [g["index"] for g in data["gpus"]] == [0]


def test_cli_zombies_on_a_fake(monkeypatch, capsys):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "zombie-orphan-namespaced")
    assert cli.main(["zombies"]) == 0
    out = capsys.readouterr().out
    assert "DRY RUN (nothing signalled)" in out and "not signalled (fake scenario)" in out
    assert "remedy: reset the idle GPU (sudo nvidia-smi -r -i 4)" in out


def test_every_scenario_renders(monkeypatch, capsys):
    for name in SCENARIOS:
        if name == "nvml-hang":
            continue  # covered above; it blocks a fake NVML thread for its timeout
        monkeypatch.setenv("RGT_HEALTH_FAKE", name)
        code = cli.main(["health"])
        assert code in (0, 1, 3, 4)
        assert "Traceback" not in capsys.readouterr().out


def test_rgt_health_subprocess_on_this_machine():
    if _has_gpu():
        pytest.skip("this machine has a working NVIDIA driver")
    out = subprocess.run([sys.executable, "-m", "remote_gpu_trainer", "health"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 4, out.stderr
    assert "no NVIDIA GPU found" in out.stdout and "exit 4: no NVIDIA GPU here" in out.stdout
