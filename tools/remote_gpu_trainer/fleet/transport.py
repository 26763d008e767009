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
    """Validate ``arguments`` here, run ``spec`` on ``host`` within ``timeout_s`` and validate the reply with
    ``model`` (the spec's output model without the host stamp). Raises RemoteError or InputError."""
    from ..registry import all_specs, home_of
    from ..remote import call_remote, parse_host

    if home_of(spec.name) is None:
        all_specs()  # tells the box which module to import (it then imports only that one)
    args = spec.validate(arguments)
    data = call_remote(parse_host(host), spec.name, args.model_dump(mode="json"), timeout_s=timeout_s)
    data.pop("host", None)
    data.pop("box", None)
    return model.model_validate(data)
