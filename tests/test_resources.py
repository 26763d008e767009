"""Skill markdown served as skill:// resources, with no way to read outside the skill."""

from __future__ import annotations

import os

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from remote_gpu_trainer.paths import skill_markdown_files
from remote_gpu_trainer.server import build_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake_skill(tmp_path):
    (tmp_path / "SKILL.md").write_text("---\nname: x\n---\n# hub\n")
    (tmp_path / "references" / "training").mkdir(parents=True)
    (tmp_path / "references" / "training" / "oom-memory.md").write_text("# OOM\n")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "runpod.md").write_text("# RunPod\n")
    secret = tmp_path.parent / f"{tmp_path.name}-secret.md"
    secret.write_text("TOP SECRET")
    os.symlink(secret, tmp_path / "references" / "escape.md")
    return tmp_path


@pytest.fixture(params=["auto", "legacy"])
async def skill_client(request, fake_skill):
    async with Client(build_server(root=fake_skill, specs=[]), mode=request.param) as connected:
        yield connected


async def test_lists_skill_references_and_profiles(skill_client):
    uris = sorted(str(r.uri) for r in (await skill_client.list_resources()).resources)
    assert uris == ["skill://SKILL.md", "skill://profiles/runpod.md", "skill://references/training/oom-memory.md"]


async def test_reads_a_reference(skill_client):
    result = await skill_client.read_resource("skill://references/training/oom-memory.md")
    assert result.contents[0].text == "# OOM\n"
    assert result.contents[0].mime_type == "text/markdown"


@pytest.mark.parametrize("uri", [
    "skill://references/../../etc/passwd",
    "skill://references/escape.md",
    "skill://../SKILL.md",
    "skill:///etc/passwd",
    "file:///etc/passwd",
])
async def test_traversal_and_unlisted_uris_are_refused(skill_client, uri):
    with pytest.raises(MCPError):
        await skill_client.read_resource(uri)


def test_symlink_out_of_the_skill_is_not_listed(fake_skill):
    assert "references/escape.md" not in [p.as_posix() for p in skill_markdown_files(fake_skill)]
