"""The MCP server: tool registrations from the registry, plus the skill's markdown as resources.

Only translation lives here. Each ToolSpec's input model becomes flat, typed MCP parameters (flat
scalars, not one nested object, because some hosts mishandle ``$defs``); its output model becomes
the structured output schema. Tool bodies run in a worker thread so a slow check never blocks the
event loop, and progress from that thread is forwarded to the client.
"""

from __future__ import annotations

import functools
import inspect
import logging
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resources import FileResource
from mcp.shared.exceptions import NoBackChannelError
from mcp.types import CallToolResult, ClientCapabilities, ElicitationCapability, TextContent, ToolAnnotations
from mcp.types import Tool as MCPTool
from pydantic import BaseModel, Field, ValidationError

from . import __version__, tool_cache
from .errors import InputError, describe_validation_error
from .paths import skill_markdown_files, skill_root
from .registry import all_specs
from .remote.errors import RemoteError
from .toolspec import ToolSpec

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Tools and troubleshooting catalogs for training deep-learning models on rented or owned GPUs "
    "(RunPod, Lambda, AutoDL, vast.ai, bare SSH). Read skill://SKILL.md for routing. Run diagnose_error "
    "on a pasted traceback before answering; destructive tools are dry-run by default and need the "
    "user's consent before a real run."
)


def _forward_progress(ctx: Context):
    """A Progress callable usable from the worker thread; progress is best-effort, never fatal."""

    def report(done: float, total: float | None = None, message: str = "") -> None:
        try:
            anyio.from_thread.run(functools.partial(ctx.report_progress, done, total, message or None))
        except Exception as err:  # a closed session must not abort the tool
            log.debug("progress not delivered: %s", err)

    return report


HOST_FIELD = Field(
    None, min_length=1, max_length=300,
    description="Run on this box over ssh: an alias from ~/.ssh/config or user@name[:port], as typed after "
    "`ssh`. Omit for the machine the server runs on. The box needs the runtime once (box_install).")


def tool_function(spec: ToolSpec):
    """An async function whose signature is the spec's input fields, for MCPServer to introspect.

    Machine-facing specs get one more parameter, ``host``. The text content is the spec's short summary
    (what the CLI prints); the full result is the structured content.
    """
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    result_model = spec.result_model
    annotations: dict[str, Any] = {"ctx": Context, "return": result_model}
    for name, field in spec.input_model.model_fields.items():
        annotation = Annotated[(field.annotation, *field.metadata,
                                Field(description=field.description, examples=field.examples))]
        default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default))
        annotations[name] = annotation
    if spec.remote:
        annotation = Annotated[str | None, HOST_FIELD]
        params.append(inspect.Parameter("host", inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=None))
        annotations["host"] = annotation

    async def tool(ctx: Context, **arguments: Any):
        try:
            if spec.elicit is not None:
                await _ask_consent(ctx, spec, arguments)
            result = await anyio.to_thread.run_sync(functools.partial(spec.call, arguments, _forward_progress(ctx)))
        except InputError as err:
            raise ToolError(str(err)) from None
        except RemoteError as err:
            raise ToolError(f"{err} [{err.kind}]") from None
        return CallToolResult(content=[TextContent(type="text", text=spec.text(result))],
                              structured_content=result.model_dump(mode="json"))

    tool.__name__ = spec.name
    tool.__doc__ = spec.description
    tool.__signature__ = inspect.Signature(params, return_annotation=result_model)  # type: ignore[attr-defined]
    tool.__annotations__ = annotations
    return tool


class Consent(BaseModel):
    confirm: bool = Field(description="Yes: go ahead with exactly what was shown")


async def _ask_consent(ctx: Context, spec: ToolSpec, arguments: dict[str, Any]) -> None:
    """Ask the human (MCP elicitation) before a costly action, where the client can ask at all.

    A confirm token can be obtained by the model itself; a question shown to the person cannot. A client
    without elicitation gets the token-only flow (the dry run still had to be shown and confirmed).
    """
    assert spec.elicit is not None
    question = spec.elicit(spec.validate({k: v for k, v in arguments.items() if k != "host"}))
    if not question:
        return
    try:
        supported = ctx.session.check_client_capability(
            ClientCapabilities(elicitation=ElicitationCapability()))
    except Exception:  # no session object in this transport mode: treat as unsupported
        supported = False
    if not supported:
        return
    if arguments.get("host"):
        question = f"On {arguments['host']}: {question}"
    try:
        answer = await ctx.elicit(question, schema=Consent)
    except NoBackChannelError:  # a stateless request cannot ask back: the token-only flow, as without support
        return
    if answer.action != "accept" or not getattr(answer.data, "confirm", False):
        raise InputError("confirm_token", f"the user did not agree ({answer.action}): nothing was changed")


class SkillServer(MCPServer):
    """An MCPServer whose tools are registered on first need.

    With the registry's tools, ``tools/list`` is answered from :mod:`tool_cache` when the code has
    not changed since the list was last built, so a start-up imports no tool module at all; the
    first ``tools/call`` (or a cache miss) registers every tool, as a plain MCPServer would have at
    start. The listed tools are byte-for-byte those the registration produces (a test holds this).
    """

    def __init__(self, specs: list[ToolSpec] | None, cache_key: str | None, **kwargs: Any):
        super().__init__(**kwargs)
        self._specs = specs
        self._cache_key = cache_key
        self._registered = False
        self._cached_tools: list[MCPTool] | None = None

    def _ensure_registered(self) -> None:
        # Runs on the event loop thread with no await inside, so two requests cannot both register.
        if self._registered:
            return
        self._registered = True
        for spec in all_specs() if self._specs is None else self._specs:
            if spec.internal:
                continue
            self.add_tool(
                tool_function(spec),
                name=spec.name,
                title=spec.title,
                description=spec.description,
                annotations=ToolAnnotations(
                    title=spec.title,
                    read_only_hint=spec.read_only,
                    destructive_hint=spec.destructive,
                    idempotent_hint=spec.idempotent,
                    open_world_hint=spec.open_world,
                ),
                structured_output=True,
            )

    async def list_tools(self) -> list[MCPTool]:
        if self._registered or not self._cache_key:
            self._ensure_registered()
            return await super().list_tools()
        if self._cached_tools is None:  # read the cache file once, not on every tools/list
            self._cached_tools = tool_cache.load(self._cache_key)
        if self._cached_tools is not None:
            return self._cached_tools
        self._ensure_registered()  # a miss: build once and write the cache once
        tools = await super().list_tools()
        tool_cache.store(self._cache_key, tools)
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        self._ensure_registered()
        schema = self._tool_input_schema(name)
        if schema is not None:  # the SDK drops undeclared arguments; a dropped host would answer about the wrong box
            unknown = sorted(set(arguments or {}) - set(schema.get("properties", {})))
            if unknown:
                allowed = ", ".join(sorted(schema.get("properties", {})))
                raise ToolError(f"{', '.join(unknown)}: not an argument of {name} (allowed: {allowed})")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as err:
            if isinstance(err.__cause__, ValidationError):  # the SDK's own check: say it as the CLI does
                raise ToolError(describe_validation_error(err.__cause__)) from None
            raise

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        self._ensure_registered()
        return super()._tool_input_schema(name)


def build_server(root: Path | None = None, specs: list[ToolSpec] | None = None) -> SkillServer:
    """The server for the skill at ``root`` (default: this checkout) with ``specs`` (default: registry).

    Only the registry's tools are cached: the cache key covers the package's code, not ad-hoc specs.
    """
    root = root or skill_root()
    cache_key = None
    if specs is None and tool_cache.enabled():
        cache_key = tool_cache.fingerprint((Path(__file__).resolve().parent, root / "scripts" / "templates"))
    server = SkillServer(specs, cache_key, name="remote-gpu-trainer", version=__version__,
                         instructions=INSTRUCTIONS)
    # One static resource per markdown file: a read can only name a URI listed here, so no
    # client-supplied path ever reaches the filesystem (traversal is impossible by construction).
    for rel in skill_markdown_files(root):
        server.add_resource(
            FileResource(
                uri=f"skill://{rel.as_posix()}",
                name=rel.as_posix(),
                title=rel.as_posix(),
                path=root / rel,
                mime_type="text/markdown",
            )
        )
    return server


def main() -> None:
    build_server().run()
