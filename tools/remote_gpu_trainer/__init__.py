"""remote-gpu-trainer: checks, estimates and reproductions for GPU training on rented or owned boxes.

Importing this package must stay cheap: the MCP server imports it at start-up, so torch, pynvml and
model files are only loaded inside the functions that need them.
"""

__version__ = "0.1.0"
