"""Turn a caught exception into a :class:`Raised`: class, torch's own message, and where torch raised it.

"Where" is the innermost traceback frame inside the installed torch package, reported relative to
the directory holding it (``torch/amp/grad_scaler.py:275``) so it reads the same on every install
and can be opened in the user's own torch. Errors raised in C++ (``lerp_`` dtype checks) point at
the Python line that called into C++, which is the line a user can look up.
"""

from __future__ import annotations

import os
import traceback

from .base import Raised

MAX_MESSAGE = 4000


def _torch_root() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))


def describe_exception(exc: BaseException, rank: int | None = None) -> Raised:
    root = _torch_root()
    where = function = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if root and path.startswith(os.path.join(root, "torch") + os.sep):
            where = f"{os.path.relpath(path, root).replace(os.sep, '/')}:{frame.lineno}"
            function = frame.name
    message = str(exc)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + " …[truncated]"
    return Raised(type=type(exc).__name__, message=message, raised_at=where, function=function, rank=rank)
