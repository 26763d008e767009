"""One internal fleet spec on one host, with a deadline of its own.

``ToolSpec.call(..., host=h)`` uses the transport's default deadline (``RGT_REMOTE_TIMEOUT``, 10 minutes):
right for a person's single call, wrong for a fleet, where one hung box must not keep its ssh session and
its processes alive long after the pre-flight has reported it as timed out. Here the deadline is the
fleet's per-host timeout; when it passes, the transport kills the session and the box's server ends the
tool's process group.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

from ..toolspec import ToolSpec

Result = TypeVar("Result", bound=BaseModel)


def call_on_host(spec: ToolSpec, host: str, arguments: dict, model: type[Result], timeout_s: float) -> Result:
    """Run ``spec`` on ``host`` within ``timeout_s``; the reply as ``model`` (the spec's output model without
    the host stamp, so it nests in the fleet's rows). Raises RemoteError or InputError."""
    result = spec.call({**arguments, "host": host}, timeout_s=timeout_s)
    return model.model_validate(result.model_dump(exclude={"host", "box"}))
