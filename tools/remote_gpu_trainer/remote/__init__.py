"""Running the tools on a remote box through the user's own OpenSSH client.

The seam is :meth:`ToolSpec.call`: a machine-facing spec (``remote=True``) called with a ``host`` sends
its validated arguments to the same spec on the box and validates the reply with the same output model.
Tool modules never import this package. Pieces: ``hosts`` (what a caller may name, and ``ssh -G``),
``ssh`` (the one place ssh options are built, and ssh's failures as RemoteErrors), ``session`` (one
open JSON-lines channel per host), ``serve`` (the box side), ``runtime`` (what is installed on the box).

The transport is a command prefix plus bytes on stdin and stdout; another prefix (``docker exec``,
``kubectl exec``, ``srun``) would reuse everything else.
"""

from __future__ import annotations

from .errors import RemoteError
from .hosts import Host, parse_host

__all__ = ["Host", "RemoteError", "call_remote", "parse_host", "rsync_command"]


def call_remote(host: Host, tool: str, arguments: dict, progress=None, timeout_s: float | None = None) -> dict:
    """Run a registered remote tool on ``host`` (see :func:`session.call_remote`)."""
    from ..toolspec import no_progress
    from .session import call_remote as _call

    return _call(host, tool, arguments, progress or no_progress, timeout_s)


def rsync_command(host: str | Host) -> tuple[str, str]:
    """``(rsh, dest_prefix)`` for ``rsync -e RSH … DEST_PREFIX:PATH LOCAL`` over the same ssh set-up.

    ``rsh`` carries our options (connection sharing, BatchMode, host-key policy, port); rsync splits it on
    whitespace, which is safe because nothing in it comes from the caller except the validated host.
    """
    import shlex

    from .ssh import ssh_options

    parsed = host if isinstance(host, Host) else parse_host(host)
    port = ["-p", str(parsed.port)] if parsed.port else []
    return shlex.join(["ssh", *ssh_options(parsed), *port]), parsed.destination
