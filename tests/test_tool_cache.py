"""The tools/list cache: same answer as a fresh registration, no tool module imported on a hit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mcp import Client

from remote_gpu_trainer import tool_cache
from remote_gpu_trainer.server import build_server

from .conftest import ROOT, call_ok

pytestmark = pytest.mark.anyio


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RGT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RGT_NO_TOOL_CACHE", raising=False)
    return tmp_path


def _dump(tools):
    return [t.model_dump(mode="json", by_alias=True) for t in tools]


async def test_cached_list_is_exactly_the_registered_list(cache_dir):
    async with Client(build_server(), mode="legacy") as client:
        fresh = (await client.list_tools()).tools
    assert len(list(cache_dir.glob("tools-*.json"))) == 1
    second = build_server()
    async with Client(second, mode="legacy") as client:
        cached = (await client.list_tools()).tools
        assert not second._registered  # answered from the cache
        assert _dump(cached) == _dump(fresh)
        # a call on a cache-answered server registers the tools on demand
        data = await call_ok(client, "skill_info")
        assert second._registered and data["name"] == "remote-gpu-trainer"


async def test_corrupt_cache_is_rebuilt(cache_dir):
    async with Client(build_server(), mode="auto") as client:
        first = (await client.list_tools()).tools
    for path in cache_dir.glob("tools-*.json"):
        path.write_text("{not json")
    server = build_server()
    async with Client(server, mode="auto") as client:
        again = (await client.list_tools()).tools
    assert server._registered and _dump(again) == _dump(first)
    json.loads(next(cache_dir.glob("tools-*.json")).read_text())  # rewritten


async def test_the_cache_is_written_once_not_on_every_list(cache_dir, monkeypatch):
    writes = []
    real_store = tool_cache.store
    monkeypatch.setattr(tool_cache, "store", lambda key, tools: (writes.append(key), real_store(key, tools)))
    async with Client(build_server(), mode="legacy", cache=None) as client:
        for _ in range(3):
            await client.list_tools()
        await call_ok(client, "skill_info")
        await client.list_tools()
    assert len(writes) == 1


def test_cache_can_be_disabled(monkeypatch):
    monkeypatch.setenv("RGT_NO_TOOL_CACHE", "1")
    assert build_server()._cache_key is None


def test_custom_specs_are_never_cached(cache_dir):
    assert build_server(specs=[])._cache_key is None


def test_fingerprint_changes_with_any_code_file(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "data.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("ignored")
    before = tool_cache.fingerprint((tmp_path,))
    (tmp_path / "notes.txt").write_text("still ignored")
    assert tool_cache.fingerprint((tmp_path,)) == before
    (tmp_path / "data.json").write_text('{"preset": 1}')
    assert tool_cache.fingerprint((tmp_path,)) != before


def test_a_cache_hit_starts_without_importing_any_tool_module(cache_dir):
    code = """
import sys, anyio
sys.path.insert(0, 'tools')
from mcp import Client
import server
async def main():
    async with Client(server.mcp, mode='legacy') as client:
        print(len((await client.list_tools()).tools))
    loaded = sorted(m for m in sys.modules if m.startswith('remote_gpu_trainer.') and
                    m.split('.')[1] in ('health', 'processes', 'memory', 'repro', 'render', 'diagnose', 'providers'))
    print(loaded)
anyio.run(main)
"""
    env = {**os.environ, "RGT_CACHE_DIR": str(cache_dir)}
    def start() -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return out

    first, second = start(), start()
    count, loaded = second.stdout.strip().splitlines()[-2:]
    assert int(count) >= 12 and count == first.stdout.strip().splitlines()[-2]
    assert loaded == "[]"
