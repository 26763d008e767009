"""A cache of the server's tools/list answer, keyed by a fingerprint of the code that produces it.

Building the tool list means importing every tool module and having pydantic generate a JSON schema
for every input and output model: about 150 ms, more than the rest of the server's start-up beyond
the MCP SDK itself. The answer only changes when the code does, so it is cached like a ``.pyc``:
the key covers every code, data and template file of this package and of ``scripts/templates``
(path, size, mtime), and the package, MCP SDK, pydantic and Python versions. A miss, an unreadable
file or a version change simply rebuilds. ``RGT_NO_TOOL_CACHE=1`` bypasses it; ``RGT_CACHE_DIR``
moves it.

Only the MCP server imports this module (it needs ``mcp.types``); code that also runs on a box takes
the cache directory from :func:`remote_gpu_trainer.paths.cache_dir`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pydantic
from mcp.types import Tool as MCPTool

from . import __version__
from .codestamp import code_stamp
from .paths import cache_dir

log = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get("RGT_NO_TOOL_CACHE", "") in ("", "0")


def fingerprint(directories: tuple[Path, ...]) -> str:
    """Changes whenever anything that can shape a tool's schema or description changes."""
    digest = hashlib.sha256()
    versions = (__version__, metadata.version("mcp"), pydantic.VERSION, sys.version)
    digest.update(repr(versions).encode())
    digest.update(code_stamp(directories).encode(errors="surrogateescape"))
    return digest.hexdigest()[:32]


def _path(key: str) -> Path:
    return cache_dir() / f"tools-{key}.json"


def load(key: str) -> list[MCPTool] | None:
    try:
        raw = json.loads(_path(key).read_text())
        return [MCPTool.model_validate(item) for item in raw]
    except (OSError, ValueError, pydantic.ValidationError):
        return None


def store(key: str, tools: list[MCPTool]) -> None:
    """Atomic write; a cache that cannot be written is only a slower next start."""
    data = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    try:
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tools-", dir=directory)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, _path(key))
    except OSError as err:
        log.debug("tool list cache not written: %s", err)
