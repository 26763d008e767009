"""RemoteError: one typed failure for everything between "the caller named a host" and "the box answered".

Each kind carries the cause in the user's own words (ssh's message, verbatim where there is one) and the
next step, because an agent that gets "exit 255" cannot help anyone.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal[
    "unknown_host", "connection_refused", "timeout", "unreachable", "auth_refused", "host_key_unknown",
    "host_key_changed", "ssh_failed", "no_command_channel", "no_python", "runtime_missing",
    "version_mismatch", "disk_full", "install_failed", "remote_tool_failed", "remote_timeout", "protocol",
]

#: Kinds where the box itself could not be reached (a run's status is then "unreachable", not an error).
UNREACHABLE_KINDS = frozenset({"unknown_host", "connection_refused", "timeout", "unreachable"})


class RemoteError(Exception):
    """A remote call that did not produce a result. ``str()`` is the one-paragraph message for people."""

    def __init__(self, host: str, kind: Kind, message: str, next_step: str, detail: str = ""):
        self.host = host
        self.kind = kind
        self.message = message
        self.next_step = next_step
        self.detail = detail
        super().__init__(f"host {host}: {message}. Next: {next_step}")

    @property
    def unreachable(self) -> bool:
        return self.kind in UNREACHABLE_KINDS

    def as_dict(self) -> dict[str, str]:
        return {"host": self.host, "kind": self.kind, "message": self.message, "next_step": self.next_step,
                "detail": self.detail}
