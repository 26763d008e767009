"""run_start's work: turn the request into an argv, run the quick checks, write meta.json, detach.

The command never goes through a shell: ``argv`` is passed to ``execve`` as is, and ``command`` (the
line ``render_launch`` prints) is split with :mod:`shlex`, leading ``NAME=value`` words becoming
environment. A command that needs a shell (pipes, ``&&``, redirections, ``$(...)``) is refused
with a message saying so, because running caller text through ``sh -c`` would make it shell code.

Quick checks, each refused with what to do instead (and ``skip_checks`` to override):

* ``port``: the rendezvous port the launch will bind (``--master-port``/``--master_port``,
  ``--rdzv-endpoint``, accelerate's ``--main_process_port``, ``MASTER_PORT``; torchrun's static
  default 29500; nothing for ``--standalone``, which picks a free port) is free, via port_status.
* ``gpus``: no process holds VRAM on the GPUs the run will use (NVML), and none of our own live runs
  was started on them, unless ``allow_shared_gpus``. Skipped on a box without NVML.
* ``disk``: at least ``min_free_disk_gib`` free where the run writes (cwd and the run directory).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

from ..commandline import shell_words
from ..errors import InputError
from ..hostinfo import is_box_runtime
from ..processes.fingerprint import boot_id
from ..trainenv.find import TrainingEnv, find_training_env
from ..trainenv.script import flag_value
from .ledger import EXIT, META, RunDir, list_runs, new_run_id, runs_root, write_json
from .states import ENDED, classify

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TORCHRUN_DEFAULT_PORT = 29500
RESERVED_ENV = frozenset({"RGT_RUN_ID", "RGT_RUN_STATE", "RGT_RUN_DIAGNOSIS", "RGT_RUN_DIR", "RGT_MESSAGE", "RGT_STATE",
                          "RGT_HOST", "RGT_STEP"})
START_WAIT_S = 10.0


def split_command(command: str) -> tuple[list[str], dict[str, str]]:
    """argv and leading ``NAME=value`` assignments of a shell-like command line, without a shell."""
    try:
        words = shell_words(command)
    except ValueError as err:
        raise InputError("command", str(err)) from None
    env: dict[str, str] = {}
    while words and "=" in words[0] and _ENV_NAME.match(words[0].split("=", 1)[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words:
        raise InputError("command", "holds no program to run")
    return words, env


def check_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise InputError("env", f"{name!r} is not an environment variable name",
                             allowed=["letters, digits and _, not starting with a digit"])
        if name in RESERVED_ENV:
            raise InputError("env", f"{name} is set by the run supervisor for notify commands")
        if "\0" in value:
            raise InputError("env", f"the value of {name} holds a NUL byte")
    return env


# ------------------------------------------------------------------ what the command will use


def is_torchrun(argv: list[str]) -> bool:
    if PurePosixPath(argv[0]).name == "torchrun":
        return True
    return "-m" in argv[:3] and argv[argv.index("-m") + 1:][:1] in (["torch.distributed.run"],
                                                                    ["torch.distributed.launch"])


def rendezvous_port(argv: list[str], env: dict[str, str]) -> int | None:
    """The port this launch binds on this box, or None (standalone, not a launcher, a non-head node)."""
    if "--standalone" in argv:
        return None
    node_rank = flag_value(argv, ("--node-rank", "--node_rank", "--machine_rank"))
    if node_rank not in (None, "0"):
        return None  # only the head node binds the store
    value = flag_value(argv, ("--master-port", "--master_port", "--main_process_port"))
    if value is None and (endpoint := flag_value(argv, ("--rdzv-endpoint", "--rdzv_endpoint"))):
        value = endpoint.rsplit(":", 1)[1] if ":" in endpoint else None
    if value is None:
        value = env.get("MASTER_PORT")
    if value is None and is_torchrun(argv):
        return TORCHRUN_DEFAULT_PORT
    return int(value) if value and value.isdigit() and 0 < int(value) < 65536 else None


def gpus_from_env(env: dict[str, str]) -> list[int] | None:
    visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is None or not visible.strip():
        return None
    parts = [p.strip() for p in visible.split(",")]
    return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None


# ------------------------------------------------------------------ quick checks


def check_port(port: int | None) -> str:
    if port is None:
        return "no fixed rendezvous port (not a launcher, --standalone, or not the head node)"
    from ..processes.tool import PortStatusInput, port_status
    from ..toolspec import no_progress

    status = port_status(PortStatusInput(port=port), no_progress)
    if not status.free:
        holders = ", ".join(f"pid {h.pid} ({h.command[:60]})" for h in status.holders) or "an invisible owner"
        other = f"; port {status.suggested_port} is free" if status.suggested_port else ""
        raise InputError("port", f"rendezvous port {port} is in use by {holders}{other}. Free it with "
                         "kill_port_holders, launch with another --master-port, or pass skip_checks=['port']")
    return f"port {port} is free"


def _overlap(a: list[int] | None, b: list[int] | None) -> bool:
    return a is None or b is None or bool(set(a) & set(b))


def check_gpus(gpus: list[int] | None, allow_shared: bool) -> str:
    from .gpu import read_holders

    holders, note = read_holders(gpus)
    if note:
        return f"GPU check skipped: {note}"
    if not holders:
        return "no GPU here: nothing to check"
    busy = [f"GPU {g.index}: pid {p.pid}" for g in holders if isinstance(g.processes, tuple) for p in g.processes]
    ours = []
    for run in list_runs():
        meta = run.meta()
        if _overlap(gpus, meta.get("gpus")) and classify(run).state not in ENDED:
            ours.append(run.run_id)
    where = f"GPUs {', '.join(map(str, gpus))}" if gpus is not None else "all GPUs"
    if (busy or ours) and not allow_shared:
        parts = ([f"processes hold VRAM ({'; '.join(busy[:8])})"] if busy else []) + (
            [f"our run(s) {', '.join(ours[:5])} use them"] if ours else [])
        raise InputError("gpus", f"{where} are in use: {' and '.join(parts)}. Stop it (run_stop), reap stale holders "
                         "(reap_vram_zombies), choose other GPUs, or pass allow_shared_gpus=true")
    return f"{where} in use (shared: allowed)" if busy or ours else f"{where}: no other holder"


def check_disk(paths: list[Path], min_free_gib: float) -> str:
    notes = []
    for path in paths:
        free = shutil.disk_usage(path).free / (1 << 30)
        if free < min_free_gib:
            raise InputError("cwd", f"only {free:.2f} GiB free on {path} (need {min_free_gib:g} GiB for logs and "
                             "checkpoints): free space, or pass skip_checks=['disk']")
        notes.append(f"{free:.0f} GiB free on {path}")
    return "; ".join(dict.fromkeys(notes))


def git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(cwd), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


# ------------------------------------------------------------------ the training environment


def _launch_script(argv: list[str], cwd: Path) -> str | None:
    """The shell script a command runs (``./launch.sh``, ``bash launch.sh``), to find its activation."""
    words = argv[1:] if PurePosixPath(argv[0]).name in ("bash", "sh") else argv
    if not words:
        return None
    path = Path(os.path.expanduser(words[0]))
    path = path if path.is_absolute() else cwd / path
    try:
        with path.open("rb") as handle:
            start = handle.read(128)
    except OSError:
        return None
    shell = start.startswith(b"#!") and any(w in start.split(b"\n", 1)[0] for w in (b"sh", b"bash"))
    return str(path) if shell or path.suffix == ".sh" or words is not argv else None


def training_env(python: str | None, activate: str | None, argv: list[str], cwd: Path) -> TrainingEnv | None:
    """The environment the run starts in: python=/activate= as given; on a box, found (argv's own interpreter by
    path, the launch script's activation, the login shell's PATH, common locations), because the session's PATH
    is not the one a person's terminal has; run locally without either, None (this shell's PATH, unchanged)."""
    if python or activate:
        env = find_training_env(python, activate)
        if env.python is None or "python" in env.errors or "activate" in env.errors:
            field = "python" if python else "activate"
            raise InputError(field, next(iter(env.errors.values()), "no interpreter there"))
        return env
    if not is_box_runtime():
        return None
    head = os.path.expanduser(argv[0])
    if os.path.isabs(head) and PurePosixPath(head).parent.name == "bin" and not _launch_script(argv, cwd):
        env = find_training_env(head)
        env.source, env.found_by = "command", "the command calls it by path"
        return env
    return find_training_env(launch=_launch_script(argv, cwd))


# ------------------------------------------------------------------ start


def create_run(*, argv: list[str], cwd: Path, env_added: dict[str, str], name: str | None,
               notify: list[str] | None, gpus: list[int] | None, port: int | None, stall_after_s: float,
               checks: dict[str, str], rank_hook: bool = True, flight_recorder: bool = False,
               activation: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> RunDir:
    """Write meta.json in a fresh run folder (mode 0700: the folder holds the run's environment).
    ``activation``: the training environment's variables (PATH first), under the caller's ``env_added``;
    ``extra`` adds fields (watch globs, the checkpoint folder; an adopted run's pid and logs)."""
    from ..notify import box_name

    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id(name)
    path = root / run_id
    path.mkdir(mode=0o700)
    write_json(path / META, {
        "run_id": run_id, "name": name, "argv": argv, "cwd": str(cwd), "env_added": env_added,
        "notify": notify, "gpus": gpus, "port": port, "stall_after_s": stall_after_s, "boot_id": boot_id(),
        "git_commit": git_commit(cwd), "created_at": time.time(), "checks": checks, "activation": activation or {},
        "python": sys.executable, "user": os.environ.get("USER"), "rank_hook": rank_hook,
        "flight_recorder": flight_recorder, "host": box_name(), **(extra or {}),
    })
    return RunDir(path)


def launch_supervisor(run: RunDir) -> int:
    """Start the supervisor detached; ``-m`` from the package's parent folder finds this very code."""
    from ..detach import spawn_detached

    package_parent = Path(__file__).resolve().parents[2]
    return spawn_detached([sys.executable, "-m", "remote_gpu_trainer.runs.supervisor", str(run.path)],
                          run.file("supervisor.log"), cwd=package_parent)


def wait_started(run: RunDir, timeout_s: float = START_WAIT_S) -> dict[str, Any]:
    """meta.json once the supervisor recorded the training pid (or exit.json when it could not start)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = run.meta()
        if meta.get("pid") or run.file(EXIT).exists():
            return meta
        time.sleep(0.05)
    return run.meta()
