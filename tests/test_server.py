"""The MCP server frame: typed tools, annotations, structured output, field-named errors."""

from __future__ import annotations

from typing import Literal

import pytest
from mcp import Client
from pydantic import Field

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.models import StrictModel
from remote_gpu_trainer.registry import all_specs
from remote_gpu_trainer.server import build_server
from remote_gpu_trainer.toolspec import ToolSpec

from .conftest import call_error, call_ok

pytestmark = pytest.mark.anyio


class EchoInput(StrictModel):
    count: int = Field(3, ge=1, le=10, description="how many")
    mode: Literal["fast", "slow"] = Field("fast", description="speed")
    name: str = Field(description="required name")
    tags: list[str] = Field(default_factory=list, description="labels")


class EchoOutput(StrictModel):
    text: str


def _echo(args: EchoInput, progress) -> EchoOutput:
    progress(1, 2, "half way")
    if args.name == "reserved":
        raise InputError("name", "is reserved", allowed=["anything else"])
    if args.name == "crash":
        raise RuntimeError("secret internals")
    return EchoOutput(text=f"{args.name}:{args.count}:{args.mode}:{','.join(args.tags)}")


ECHO = ToolSpec(name="echo", cli="echo", title="Echo", description="Echo for tests.", input_model=EchoInput,
                output_model=EchoOutput, run=_echo, read_only=False, destructive=True, idempotent=False)


@pytest.fixture(params=["auto", "legacy"])
async def echo_client(request):
    async with Client(build_server(specs=[ECHO]), mode=request.param) as connected:
        yield connected


async def test_every_registered_tool_is_typed_and_annotated(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    public = [s for s in all_specs() if not s.internal]
    assert set(tools) == {s.name for s in public}
    for spec in public:
        tool = tools[spec.name]
        # machine-facing tools take host (added once by the registry) and say which host a result is about
        assert ("host" in tool.input_schema["properties"]) is (spec.remote or "host" in spec.input_model.model_fields)
        if spec.remote:
            assert {"host", "box"} <= set(tool.output_schema["properties"])
        assert tool.description and tool.title
        assert tool.output_schema and tool.output_schema["type"] == "object"
        assert tool.annotations.read_only_hint is spec.read_only
        assert tool.annotations.destructive_hint is spec.destructive
        assert tool.annotations.idempotent_hint is spec.idempotent
        for name, prop in tool.input_schema.get("properties", {}).items():
            assert prop.get("description"), f"{spec.name}.{name} has no description"


async def test_input_model_becomes_flat_parameters_with_bounds(echo_client):
    tool = (await echo_client.list_tools()).tools[0]
    props = tool.input_schema["properties"]
    assert tool.input_schema["required"] == ["name"]
    assert props["count"]["minimum"] == 1 and props["count"]["maximum"] == 10
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert tool.annotations.destructive_hint is True


async def test_structured_output_and_defaults(echo_client):
    data = await call_ok(echo_client, "echo", {"name": "a", "tags": ["x", "y"]})
    assert data == {"text": "a:3:fast:x,y"}


async def test_out_of_bounds_argument_names_the_field(echo_client):
    text = await call_error(echo_client, "echo", {"name": "a", "count": 0})
    assert "count" in text and "greater than or equal to 1" in text


async def test_bad_literal_lists_allowed_values(echo_client):
    text = await call_error(echo_client, "echo", {"name": "a", "mode": "warp"})
    assert "mode" in text and "'fast' or 'slow'" in text


async def test_input_error_from_tool_body_names_field_and_allowed(echo_client):
    text = await call_error(echo_client, "echo", {"name": "reserved"})
    assert "name: is reserved (allowed: anything else)" in text


async def test_unexpected_exception_is_a_tool_error_without_leaking(echo_client):
    text = await call_error(echo_client, "echo", {"name": "crash"})
    assert "secret" not in text


async def test_missing_required_argument(echo_client):
    text = await call_error(echo_client, "echo", {})
    assert "name" in text and "required" in text.lower()


async def test_progress_reaches_the_client(echo_client):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    await echo_client.call_tool("echo", {"name": "a"}, progress_callback=on_progress)
    assert seen == [(1.0, 2.0, "half way")]


async def test_skill_info_reports_backends(client):
    data = await call_ok(client, "skill_info")
    assert data["name"] == "remote-gpu-trainer"
    names = [b["name"] for b in data["backends"]]
    assert names == ["nvml", "torch", "cuda"]
    assert "skill_info" in data["tools"]
    for backend in data["backends"]:
        # an unreadable backend is reported as unavailable or unknown, with a reason
        assert backend["detail"]


async def test_skill_info_rejects_bad_timeout(client):
    text = await call_error(client, "skill_info", {"timeout_s": 0})
    assert "timeout_s" in text
