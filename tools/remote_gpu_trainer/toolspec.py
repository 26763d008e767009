"""ToolSpec: one definition per tool, shared by the MCP server and the ``rgt`` CLI.

A tool is a pydantic input model, a pydantic output model and a plain ``run(args, progress)``
function. The server turns the input model into flat typed MCP parameters; the CLI turns it into
flags. Both validate through :meth:`ToolSpec.call`, so an agent and a human get the same errors.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError, create_model

from .errors import InputError
from .models import Verdict

BOX_HOST_ENV = "RGT_BOX_HOST"
"""Set by the box's runtime for each request: the host as the caller named it (empty for a local call)."""


def cli_host_args() -> list[str]:
    """``["--host", HOST]`` while a tool runs on a box for a caller who named it HOST, else ``[]``.

    A command a result prints for the next step (a confirmed kill, ``rgt run status``) must reach the same box
    when the person copies it; the tool itself cannot know it runs remotely otherwise.
    """
    host = os.environ.get(BOX_HOST_ENV)
    return ["--host", host] if host else []


class Progress(Protocol):
    def __call__(self, done: float, total: float | None = None, message: str = "") -> None: ...


def no_progress(done: float, total: float | None = None, message: str = "") -> None:
    """Progress sink for callers that do not display progress."""


def exit_1_on_fail(result: Any) -> int:
    """``exit_code`` for tools whose result carries a ``verdict``: a script can test FAIL by status."""
    return 1 if result.verdict is Verdict.FAIL else 0


@dataclass(frozen=True)
class ToolSpec:
    name: str
    """MCP tool name (snake_case)."""
    cli: str
    """``rgt`` subcommand."""
    title: str
    description: str
    """What the tool does, when an agent should call it, and what it never does."""
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    run: Callable[[Any, Progress], BaseModel]
    read_only: bool
    destructive: bool = False
    idempotent: bool = True
    open_world: bool = False
    render_text: Callable[[Any], str] | None = None
    """Human-readable rendering for the CLI; defaults to a generic key/value view."""
    exit_code: Callable[[Any], int] | None = None
    """CLI exit status derived from the result (e.g. FAIL → 1); default 0."""
    cli_positional: str | None = None
    """Input field the CLI takes as positional argument(s), e.g. ``rgt ports 29500 29600-29610``."""
    cli_fixed: tuple[tuple[str, Any], ...] = ()
    """(field, value) pairs the CLI always passes and offers no flag for, e.g. ``wait_s=None`` for a tool whose
    background-job mode only makes sense for a long-lived MCP server (a CLI process simply waits)."""
    cli_command_flags: tuple[str, ...] = ()
    """List fields that hold a command (``notify``): on the CLI each takes every word up to the next option of this
    command or ``--`` (so ``--notify bash -c '…'`` works), and one word is split like a shell line."""
    cli_file_field: str | None = None
    """Text field the CLI reads from a FILE argument or stdin (``-``), e.g. a log for diagnose."""
    cli_write_files: Callable[[Any, str], list[Any]] | None = None
    """For tools whose result holds files (rendered configs): ``rgt … --out DIR`` writes them with this."""
    remote: bool = False
    """Machine-facing: the tool looks at or acts on a machine, so it takes an optional ``host`` (an ssh
    alias or ``user@name[:port]``) and, given one, runs on that box through the transport in
    :mod:`remote_gpu_trainer.remote`. The tool's own input model never declares ``host``; the registry
    adds it to the MCP schema, the CLI (``--host``, default ``$RGT_HOST``) and the result."""
    internal: bool = False
    """Not listed as an MCP tool or CLI command: a building block that a local tool runs on a box
    through ``call`` with a ``host`` (e.g. the per-host facts a fleet check gathers)."""
    unreachable: Callable[[Any, Exception], BaseModel] | None = None
    """For a remote call whose box cannot be reached: build a result from the validated arguments and
    the :class:`~remote_gpu_trainer.remote.RemoteError` instead of failing (``run_status`` answers
    ``unreachable`` with what the provider makes likely). None: the error is raised."""
    elicit: Callable[[Any], str | None] | None = None
    """A question for the human before a costly action (MCP elicitation, where the client supports
    it), or None when the arguments need no extra consent. A token alone can be obtained by the model."""

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        try:
            return self.input_model.model_validate(arguments)
        except ValidationError as err:
            raise InputError.from_validation(err) from None

    def text(self, result: BaseModel) -> str:
        """The short summary people and agents read (``rgt`` stdout, MCP text content). A result from a box is
        headed by its host: the tool's own wording ("here", "this box") was written on the box."""
        from .tables import render_model

        body = self.render_text(result) if self.render_text else render_model(result)
        host = getattr(result, "host", None) if self.remote else None
        return f"[host {host}] {body}" if host else body

    @property
    def result_model(self) -> type[BaseModel]:
        """The output model, plus a top-level ``host`` for machine-facing tools (the host as the caller gave
        it, None for this machine) and ``box`` (``user@host:port`` as ``ssh -G`` resolved it)."""
        return _with_host(self.output_model) if self.remote else self.output_model

    def call(self, arguments: dict[str, Any], progress: Progress = no_progress,
             timeout_s: float | None = None) -> BaseModel:
        """Validate ``arguments`` and run the tool, here or, given a ``host``, on that box.

        ``timeout_s`` bounds a remote call (default ``RGT_REMOTE_TIMEOUT``); past it the session is ended
        and with it the tool's processes on the box. Raises :class:`InputError` for bad input and
        :class:`~remote_gpu_trainer.remote.RemoteError` when the box cannot be reached or fails.
        """
        arguments = dict(arguments)
        host = arguments.pop("host", None) if self.remote else None
        args = self.validate(arguments)
        if host is None:
            result = self.run(args, progress)
            if not isinstance(result, self.output_model):
                raise TypeError(f"{self.name} returned {type(result).__name__}, not {self.output_model.__name__}")
            return _stamp(self.result_model, result, None, None) if self.remote else result
        from .remote import RemoteError, call_remote, parse_host
        from .remote.hosts import resolve

        parsed = parse_host(host)

        def from_box(done: float, total: float | None = None, message: str = "") -> None:
            progress(done, total, f"{host}: {message}" if message else message)  # the box's words name the box

        try:
            data = call_remote(parsed, self.name, args.model_dump(mode="json"), from_box, timeout_s)
        except RemoteError as err:
            if self.unreachable is None or not err.unreachable:
                raise
            return _stamp(self.result_model, self.unreachable(args, err), host, None)
        data.update(host=host, box=resolve(parsed).identity)
        return self.result_model.model_validate(data)


@functools.cache
def _with_host(model: type[BaseModel]) -> type[BaseModel]:
    return create_model(
        model.__name__, __base__=model, __module__=model.__module__,
        host=(str | None, Field(None, description="The ssh host the result is about, as the caller gave it; "
                                "null: the machine the tool ran on")),
        box=(str | None, Field(None, description="user@host:port as ssh resolved the host; null when local")))


def _stamp(model: type[BaseModel], result: BaseModel, host: str | None, box: str | None) -> BaseModel:
    """``result`` as an instance of ``model`` (its subclass with host fields), without re-validating it."""
    values = {name: getattr(result, name) for name in type(result).model_fields}
    return model.model_construct(_fields_set={*result.model_fields_set, "host", "box"}, **values, host=host, box=box)
