"""One real end-to-end run: `mcp run tools/server.py` as a subprocess over stdio."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from .conftest import ROOT

pytestmark = pytest.mark.anyio


async def test_mcp_run_serves_tools_and_resources_over_stdio():
    params = StdioServerParameters(
        command=str(Path(sys.executable).with_name("mcp")),
        args=["run", "tools/server.py"],
        cwd=str(ROOT),
        env={"PATH": os.environ.get("PATH", "")},
    )
    async with Client(params, mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "skill_info" in names
        result = await client.call_tool("skill_info", {})
        assert not result.is_error
        assert result.structured_content["skill_root"] == str(ROOT)
        uris = {str(r.uri) for r in (await client.list_resources()).resources}
        assert "skill://SKILL.md" in uris
        hub = await client.read_resource("skill://SKILL.md")
        assert "remote-gpu-trainer" in hub.contents[0].text
