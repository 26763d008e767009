"""ToolSpec: one definition per tool, shared by the MCP server and the ``rgt`` CLI.

A tool is a pydantic input model, a pydantic output model and a plain ``run(args, progress)``
function. The server turns the input model into flat typed MCP parameters; the CLI turns it into
flags. Both validate through :meth:`ToolSpec.call`, so an agent and a human get the same errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from .errors import InputError
from .models import Verdict


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
    cli_file_field: str | None = None
    """Text field the CLI reads from a FILE argument or stdin (``-``), e.g. a log for diagnose."""
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

    def call(self, arguments: dict[str, Any], progress: Progress = no_progress) -> BaseModel:
        """Validate ``arguments`` and run the tool. Raises :class:`InputError` for bad input."""
        result = self.run(self.validate(arguments), progress)
        if not isinstance(result, self.output_model):
            raise TypeError(f"{self.name} returned {type(result).__name__}, not {self.output_model.__name__}")
        return result
