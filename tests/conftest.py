"""Shared test harness: in-memory MCP clients in both protocol modes, and the ``gpu`` marker."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def _private_tool_cache(tmp_path_factory):
    """Tests never read or write the user's ~/.cache tool-list cache."""
    import os

    os.environ["RGT_CACHE_DIR"] = str(tmp_path_factory.mktemp("tool-cache"))


@pytest.fixture(scope="session")
def server():
    from remote_gpu_trainer.server import build_server

    return build_server()


@pytest.fixture(params=["auto", "legacy"])
async def client(request, server) -> AsyncIterator[Client]:
    """An in-memory client. ``legacy`` runs the real initialize handshake that Claude Code and
    Gemini CLI use today; ``auto`` is the modern direct-dispatch mode."""
    async with Client(server, mode=request.param) as connected:
        yield connected


async def call_ok(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call a tool that must succeed and return its structured content."""
    result = await client.call_tool(tool, arguments or {})
    assert not result.is_error, result.content[0].text if result.content else result
    return result.structured_content


async def call_error(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """Call a tool that must fail as a tool error (not a crash) and return the error text."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return result.content[0].text


def file_text(result, name: str) -> str:
    """The text of one file a render tool returned (its result model, not the JSON form)."""
    return next(f.text for f in result.files if f.name == name)


def _gpu_count() -> int:
    # In a child process, so a sick driver cannot hang or pollute the test session.
    code = "from remote_gpu_trainer.nvml_session import nvml_status; s = nvml_status(); print(s.device_count or 0)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        return int(out.stdout.strip() or 0)
    except (subprocess.TimeoutExpired, ValueError):
        return 0


def pytest_collection_modifyitems(config, items) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and _gpu_count() == 0:
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (NVML found none)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def nvml_fake_lib(tmp_path_factory) -> Path:
    """The C-level fake libnvidia-ml.so.1 (tests/nvml_fake), compiled once per session against NVIDIA's
    nvml.h; the directory to put on LD_LIBRARY_PATH. Skips only when gcc or the header is missing."""
    from tests.nvml_fake import Unavailable, build

    try:
        return build(tmp_path_factory.mktemp("nvml-fake"))
    except Unavailable as why:
        pytest.skip(f"C-level fake NVML not built: {why}")


@pytest.fixture
def fake_nvml(nvml_fake_lib, tmp_path, monkeypatch):
    """``use(scenario, fault=None, once=True, hang_s=None)``: from now on the NVML worker process loads
    the C-level fake with that scenario from health/fakes.py (and fault, e.g. ``segv:<call>[@gpu]``).
    Each test gets a fresh session and its own per-boot cache; the worker is ended afterwards."""
    import itertools

    from remote_gpu_trainer import nvml_session
    from tests.nvml_fake import environment, write_scenario

    uses = itertools.count()

    def use(scenario: str, fault: str | None = None, once: bool = True, hang_s: float | None = None) -> Path:
        path = write_scenario(scenario, tmp_path / f"{scenario}.nvml")
        marker = tmp_path / f"fault-fired-{next(uses)}" if once and fault else None
        for key, value in environment(nvml_fake_lib, path, fault, marker, hang_s).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("RGT_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("RGT_HEALTH_FAKE", raising=False)
        nvml_session.reset_for_tests()
        return path

    yield use
    nvml_session.reset_for_tests()


@pytest.fixture(scope="session")
def ssh_fleet(tmp_path_factory):
    """Loopback ssh boxes shared by the remote tests (tests/sshbox.py): ``box-a`` (OpenSSH sshd where it is
    installed, healthy 8×H100 fake) and ``box-b`` (the asyncssh server, ECC fake), both with the runtime
    installed by the real ``box install``. Tests may ``add`` more boxes; ``install_runtime`` links them to
    the same runtime. RGT_SSH_CONFIG and RGT_SSH_CONTROL_DIR point at the fleet for the whole session."""
    from tests.sshbox import SSHD, Fleet, have_asyncssh

    if not (SSHD or have_asyncssh()):
        pytest.fail("no ssh server for the remote tests: install openssh-server or the asyncssh dev dependency")
    fleet = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        fleet.add("box-a", scenario="healthy-8xh100")
        fleet.add("box-b", scenario="ecc-dbe", server="asyncssh" if have_asyncssh() else None)
        with fleet.environment():
            fleet.install_runtime("box-a")
            fleet.install_runtime("box-b")
            yield fleet
    finally:
        fleet.close()
