"""What identifies the code of this checkout, cheaply: path, size and mtime of every code and data file.

Like a ``.pyc`` header, (size, mtime) changes whenever a file is edited, replaced or reinstalled, and reading it
costs one ``stat`` per file (~150 files: well under a millisecond), never a read. Two things key on it: the
server's cached tool list (``tool_cache``) and the warm health daemon (``healthd``), which must never answer
for code that has changed since it started. The ``rgt health`` fast path computes it before anything else is
imported, so this module imports only ``os``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself costs milliseconds to import (see the module docstring)
if TYPE_CHECKING:
    from collections.abc import Iterable

CODE_SUFFIXES = (".py", ".json", ".j2")


def code_stamp(directories: Iterable[str | os.PathLike[str]], suffixes: tuple[str, ...] = CODE_SUFFIXES) -> str:
    """One line ``path\\0size\\0mtime_ns`` per file with one of ``suffixes`` under ``directories`` (recursively,
    ``__pycache__`` left out), sorted. A directory that cannot be read contributes nothing."""
    lines: list[str] = []
    for top in directories:
        for folder, subfolders, files in os.walk(top):
            subfolders[:] = [d for d in subfolders if d != "__pycache__"]
            for name in files:
                if name.endswith(suffixes):
                    path = os.path.join(folder, name)
                    try:
                        info = os.stat(path)
                    except OSError:
                        continue
                    lines.append(f"{path}\0{info.st_size}\0{info.st_mtime_ns}")
    lines.sort()
    return "\n".join(lines)
