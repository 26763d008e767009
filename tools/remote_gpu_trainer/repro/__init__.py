"""Run known mixed-precision (AMP) failures for real on the user's torch, then run their fixes.

One module per failure class (``fp16_unscale.py`` ... ``fsdp_ddp_double_wrap.py``); each holds its
variants as data (what the buggy code does, the error it must raise, the fix and its diff) plus
``bug(variant, device)`` and ``fix(variant, device)``, which import torch only when called.
``worker.py`` runs them in a child process that imports torch once; ``runner.py`` is the server
side (timeouts, restarts after a hang or crash, progress); ``tool.py`` exposes the MCP tools.

Nothing here imports torch at module level: the server imports this package at start-up.
"""
