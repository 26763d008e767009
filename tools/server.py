"""Entry point for ``mcp run tools/server.py`` (which looks for a module-level MCPServer named ``mcp``).

``mcp run`` puts this directory on sys.path, so the package next to this file imports without an
install; ``pip install -e .`` works as well.
"""

from remote_gpu_trainer.server import build_server

mcp = build_server()
