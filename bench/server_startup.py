"""Start-up and per-call cost of the real server against a trivial one-tool MCPServer, same run.

Cold start = spawn `mcp run <file>` → initialize → tools/list. Per-call = skill_info vs a trivial
tool over the same connection kind. Prints medians and ratios (goals: cold ≤ 1.3×, call ≤ 2×).
The real server answers tools/list from a cache keyed by its code (see tool_cache.py); the run uses a
fresh cache directory, reports the one cache-miss start on its own, then the warm starts.

    python bench/server_startup.py [--starts 7] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL = '''from mcp.server import MCPServer

mcp = MCPServer("trivial")


@mcp.tool()
def ping() -> str:
    """Reply pong."""
    return "pong"
'''


_ENV: dict[str, str] = {}


def _params(server_file: Path) -> StdioServerParameters:
    return StdioServerParameters(command=str(Path(sys.executable).with_name("mcp")),
                                 args=["run", str(server_file)], cwd=str(ROOT), env=_ENV)


async def _cold_start(server_file: Path) -> float:
    start = time.perf_counter()
    async with Client(_params(server_file), mode="legacy") as client:
        await client.list_tools()
        elapsed = time.perf_counter() - start
    return elapsed


async def _timed_call(client: Client, tool: str) -> float:
    start = time.perf_counter()
    result = await client.call_tool(tool, {})
    elapsed = time.perf_counter() - start
    assert not result.is_error, result.content
    return elapsed


async def _per_call(real: Path, trivial: Path, calls: int) -> tuple[list[float], list[float]]:
    """Alternate calls on two open connections, so load changes hit both series equally."""
    async with Client(_params(real), mode="legacy") as real_client, \
            Client(_params(trivial), mode="legacy") as trivial_client:
        await real_client.call_tool("skill_info", {})  # warm-up: the first call opens NVML
        await trivial_client.call_tool("ping", {})
        real_times, trivial_times = [], []
        for _ in range(calls):
            real_times.append(await _timed_call(real_client, "skill_info"))
            trivial_times.append(await _timed_call(trivial_client, "ping"))
    return real_times, trivial_times


async def main(starts: int, calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trivial = Path(tmp) / "trivial_server.py"
        trivial.write_text(TRIVIAL)
        real = ROOT / "tools" / "server.py"
        _ENV["RGT_CACHE_DIR"] = str(Path(tmp) / "cache")  # empty: the first real start is a cache miss
        miss = await _cold_start(real)
        cold = {"real": [], "trivial": []}
        for _ in range(starts):  # interleaved so machine load hits both equally
            cold["trivial"].append(await _cold_start(trivial))
            cold["real"].append(await _cold_start(real))
        call_real, call_trivial = await _per_call(real, trivial, calls)
    med = statistics.median
    cold_ratio = med(cold["real"]) / med(cold["trivial"])
    call_ratio = med(call_real) / med(call_trivial)
    print(f"first start real {miss:.3f} s  (tool-list cache miss: imports and registers every tool)  "
          f"ratio {miss / med(cold['trivial']):.2f}x")
    print(f"cold start  real {med(cold['real']):.3f} s  trivial {med(cold['trivial']):.3f} s  "
          f"ratio {cold_ratio:.2f}x  (goal <= 1.30x, {starts} starts each, cache warm)")
    print(f"per call    skill_info {med(call_real) * 1e3:.2f} ms  ping {med(call_trivial) * 1e3:.2f} ms  "
          f"ratio {call_ratio:.2f}x  (goal <= 2.00x, {calls} calls each)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    ns = parser.parse_args()
    anyio.run(main, ns.starts, max(ns.calls, 30))
