"""Finding and safely signalling processes: port holders, GPU orphans, launcher trees.

Modules, each small and importable on its own (nothing heavy: psutil and the standard library):

``snapshot``     one frozen view of a process (``ProcInfo``) and of the process tree (``ProcessTable``)
``fingerprint``  pid + start ticks + uid + cmdline → digest; confirm tokens that refuse PID reuse
``safety``       the refusal rules (pid ≤ 1, self/ancestors, other users, protected names, ...)
``terminate``    children first, SIGTERM, wait, optional SIGKILL, one outcome per pid
``launchers``    torchrun / accelerate / deepspeed launcher trees
``safekill``     ``safe_kill(candidates, dry_run=..., confirm_token=...)``: the entry point for tools
``netlink``      sock_diag dump with an in-kernel port filter (what ``ss`` uses), stdlib only
``sockets``      who holds a port: netlink or /proc/net/{tcp,udp}{,6}, then /proc/<pid>/fd; invisible owners
``ports``        port specs, port_status (free? what should torchrun use instead?)
``tool``         the ``kill_port_holders`` and ``port_status`` ToolSpecs

Nothing is imported here, so ``import remote_gpu_trainer.processes.safekill`` costs only what it uses.
"""
