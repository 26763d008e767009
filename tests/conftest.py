"""Shared test harness: in-memory MCP clients in both protocol modes, and the ``gpu`` marker."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
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
    os.environ["RGT_CACHE_DIR"] = str(tmp_path_factory.mktemp("tool-cache"))


@pytest.fixture(scope="session", autouse=True)
def _no_health_daemon():
    """No `rgt health` a test runs leaves a warm health daemon behind (healthd.py); tests/test_healthd.py turns
    it on for its own daemons, each in a private runtime directory and stopped at the end."""
    os.environ["RGT_NO_DAEMON"] = "1"


TEST_RUN_ENV = "RGT_TEST_RUN"


@pytest.fixture(scope="session", autouse=True)
def _test_run_marker():
    """Every process this test session starts inherits ``RGT_TEST_RUN=<id>``, so a test that finds its processes
    by command line (all-reduce ranks, leftovers) can tell them from a test run's beside it on the machine."""
    os.environ.setdefault(TEST_RUN_ENV, uuid.uuid4().hex[:12])


def started_by_this_run(proc) -> bool:
    """Whether a psutil process carries this test run's marker (an orphan re-parented to init keeps it)."""
    import psutil

    try:
        return proc.environ().get(TEST_RUN_ENV) == os.environ[TEST_RUN_ENV]
    except psutil.Error:
        return False


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """A run ledger of the test's own (``RGT_RUNS_DIR``, no fake NVML), and afterwards no run of it left running,
    whatever the test did: every process of every run is killed, ranks and detached jobs included (the run's
    process group alone would leave torchrun's ranks, each in its own session, and a launcher's detached job)."""
    path = tmp_path / "runs"
    monkeypatch.setenv("RGT_RUNS_DIR", str(path))
    monkeypatch.delenv("RGT_HEALTH_FAKE", raising=False)
    yield path
    kill_runs(path)


def kill_runs(root: Path) -> None:
    import json
    import os
    import signal

    from remote_gpu_trainer.runs.ledger import RunDir
    from remote_gpu_trainer.runs.tool import run_pids

    for meta in root.glob("*/meta.json"):
        run = RunDir(meta.parent)
        try:
            pids = run_pids(run, json.loads(meta.read_text()))
        except (OSError, ValueError):
            continue
        for pid in reversed(pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


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


def rendezvous_port() -> int:
    """A free port for a test's rendezvous, below the ephemeral range, searched from a random start: test runs
    side by side on one machine would otherwise all take the first free port above the same fixed start."""
    from remote_gpu_trainer.processes.ports import suggest_free_port

    port = suggest_free_port(random.randrange(20000, 28000), 500)
    assert port is not None, "no free port below the ephemeral range"
    return port


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


#: Test files that must share one pytest-xdist worker (run one after another): the fleet checks pick rendezvous
#: ports from the same range (29400+, ``suggest_free_port``) and find all-reduce ranks by their command line.
SERIAL_GROUPS = {"fleet": ("test_fleet.py", "test_fleet_allreduce.py", "test_fleet_remote.py")}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the marks into scheduling groups
def pytest_collection_modifyitems(config, items) -> None:
    """With ``--dist loadgroup`` (pyproject's addopts), each test file runs on one worker, as with
    ``loadfile``, so module- and session-scoped fixtures are built once per file; the files of a
    ``SERIAL_GROUPS`` entry share one worker."""
    group_of = {name: group for group, names in SERIAL_GROUPS.items() for name in names}
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            name = item.path.name
            item.add_marker(pytest.mark.xdist_group(group_of.get(name, name)))
    _skip_gpu_tests_without_a_gpu(items)


def _skip_gpu_tests_without_a_gpu(items) -> None:
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
    """Loopback ssh boxes that look like fresh rented boxes (tests/sshbox.py), shared by the remote tests of
    this process: ``box-a`` (OpenSSH sshd where it is installed, healthy 8×H100 fake) and ``box-b`` (the
    asyncssh server, ECC fake), both with the runtime that the real ``rgt box install --wheels`` built once
    for the whole test run (pytest-xdist workers share it). Tests may ``add`` more boxes; ``install_runtime``
    links them to the same runtime. RGT_SSH_CONFIG and RGT_SSH_CONTROL_DIR point at the fleet for the whole
    session. A box's training interpreter (torch importable) is ``fleet.boxes[alias].train_python``."""
    from tests.sshbox import SSHD, Fleet, clean_python, have_asyncssh

    if not (SSHD or have_asyncssh()):
        pytest.fail("no ssh server for the remote tests: install openssh-server or the asyncssh dev dependency")
    if clean_python()[0] is None:
        pytest.skip(clean_python()[1])
    # every worker's basetemp is a child of the run's own directory: the runtime is installed there once
    run_dir = tmp_path_factory.getbasetemp()
    shared = run_dir.parent if os.environ.get("PYTEST_XDIST_WORKER") else run_dir
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), shared=shared)
    try:
        fleet.add("box-a", scenario="healthy-8xh100")
        fleet.add("box-b", scenario="ecc-dbe", server="asyncssh" if have_asyncssh() else None)
        with fleet.environment():
            fleet.install_runtime("box-a")
            fleet.install_runtime("box-b")
            yield fleet
    finally:
        fleet.close()
