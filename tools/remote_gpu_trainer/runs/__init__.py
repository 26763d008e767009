"""Training runs on the box: start detached, watch, diagnose, stop (``run_*`` tools, ``rgt run ...``)."""
