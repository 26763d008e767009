"""The warm health daemon (healthd.py) against the C-level fake libnvidia-ml, through real fresh processes.

A first ``rgt health`` answers in-process and leaves a daemon; the next one is answered by it without importing
pydantic, byte for byte as the normal path answers (apart from the measured elapsed time). Whatever goes wrong on
the way (no daemon, another key, a killed one, help or a usage error) falls back to the normal path. Each test's
daemons live in a private runtime directory and are stopped at the end.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from remote_gpu_trainer import healthd
from remote_gpu_trainer.processes.fingerprint import boot_id
from remote_gpu_trainer.processes.snapshot import read_environ, read_start_ticks, snapshot
from remote_gpu_trainer.processes.workers import worker_kind
from remote_gpu_trainer.runs.ledger import RunDir
from remote_gpu_trainer.runs.members import live_members

FAST = ("import os, sys\n"
        "from remote_gpu_trainer import healthd\n"
        "code = healthd.answer(sys.argv[1:])\n"
        "sys.stdout.flush(); sys.stderr.flush()\n"
        "os._exit(99 if code is None else 98 if 'pydantic' in sys.modules else code)\n")
"""rgt's fast path alone: exit 99 when no daemon answered, 98 when it imported pydantic after all."""
NOT_ANSWERED = 99


def rgt(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``rgt ARGV`` as a fresh process (the normal path, or the fast path when a daemon answers)."""
    return subprocess.run([sys.executable, "-m", "remote_gpu_trainer", *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


def fast(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", FAST, *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def wait_for(condition: Callable[[], object], timeout_s: float = 30.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s} s: {condition}")


def daemon_pid() -> int:
    """The one daemon of this test, once it answers."""
    pids = wait_for(healthd.pids)
    assert len(pids) == 1, pids
    return pids[0]


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def without_elapsed(text: str) -> str:
    """The one thing two answers may differ in: the probe's measured time (JSON field and the text's `· 0.01 s`)."""
    text = re.sub(r'"elapsed_s": [0-9.e-]+', '"elapsed_s": T', text)
    return re.sub(r" · [0-9.]+ s\b", " · T s", text)


def daemons_of(runtime: str) -> list[int]:
    """Health daemons started with this runtime directory (the test's own), found in /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            env = read_environ(int(entry), ("RGT_HELPER", "XDG_RUNTIME_DIR"))
            if env.get("RGT_HELPER") == "health-daemon" and env.get("XDG_RUNTIME_DIR") == runtime:
                found.append(int(entry))
    return found


@pytest.fixture
def daemons(fake_nvml, monkeypatch):
    """The C-level fake (healthy 8×H100), daemons allowed, in a private runtime directory (short: a unix socket
    path has room for 107 bytes). Yields that directory; every daemon started in it is stopped afterwards."""
    fake_nvml("healthy-8xh100")
    runtime = tempfile.mkdtemp(prefix="rgt-", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    monkeypatch.delenv(healthd.NO_DAEMON_ENV, raising=False)
    monkeypatch.setenv(healthd.IDLE_ENV, "120")
    yield Path(runtime)
    healthd.stop_all()
    for pid in daemons_of(runtime):
        try:
            wait_for(lambda pid=pid: gone(pid), 5)
        except AssertionError:
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(runtime, ignore_errors=True)


def test_the_first_call_starts_a_daemon_that_answers_the_next_byte_for_byte(daemons):
    first = rgt("health", "--json")
    assert first.returncode == 0, first.stderr
    pid = daemon_pid()
    served = fast("health", "--json")
    assert served.returncode == 0, served.stderr  # answered by the daemon, without importing pydantic
    alone = rgt("health", "--json", RGT_NO_DAEMON="1")
    assert without_elapsed(served.stdout) == without_elapsed(first.stdout) == without_elapsed(alone.stdout)
    assert served.stderr == first.stderr == alone.stderr  # the progress lines, as they came
    assert '"verdict": "PASS"' in served.stdout and served.stdout.count('"index":') >= 8
    text, text_alone = fast("health"), rgt("health", RGT_NO_DAEMON="1")
    assert text.returncode == text_alone.returncode == 0
    assert without_elapsed(text.stdout) == without_elapsed(text_alone.stdout)
    assert "exit 0: trainable" in text.stdout
    assert daemon_pid() == pid  # the same daemon throughout: no second one was started


def test_rgt_itself_takes_the_fast_path(daemons):
    rgt("health")
    daemon_pid()
    done = rgt("health", "--json", PYTHONPROFILEIMPORTTIME="1")  # -X importtime: every module imported
    assert done.returncode == 0
    imported = re.findall(r"import time:.*\| (\S+)$", done.stderr, re.M)
    assert "remote_gpu_trainer.healthd" in imported
    assert not [m for m in imported if m.split(".")[0] in ("pydantic", "torch", "pynvml")]
    assert "remote_gpu_trainer.cli" not in imported


def test_exit_status_input_errors_and_the_callers_environment_are_the_normal_paths(daemons):
    rgt("health")
    daemon_pid()
    for argv, env in [(("health", "--expect-gpus", "9"), {}),  # 8 found: FAIL, exit 1
                      (("health", "--expect-gpus", "0"), {}),  # the model refuses it: exit 2, the field named
                      (("health", "--json"), {"CUDA_VISIBLE_DEVICES": "0,1"}),  # the caller's, not the daemon's
                      (("health", "--indices", "1", "3", "--json"), {})]:
        served, alone = fast(*argv, **env), rgt(*argv, RGT_NO_DAEMON="1", **env)
        assert served.returncode == alone.returncode, (argv, served.returncode, served.stderr)
        assert (without_elapsed(served.stdout), served.stderr) == (without_elapsed(alone.stdout), alone.stderr), argv
    assert fast("health", "--expect-gpus", "9").returncode == 1
    bad = fast("health", "--expect-gpus", "0")
    assert bad.returncode == 2 and "expect_gpus" in bad.stderr
    assert "cuda_visible_devices" in fast("health", "--json", CUDA_VISIBLE_DEVICES="0,1").stdout
    assert "cuda_visible_devices" not in fast("health", "--json").stdout


def test_help_usage_errors_host_and_no_daemon_fall_back(daemons):
    rgt("health")
    daemon_pid()
    for argv in (["health", "--help"], ["health", "--bogus"], ["health", "--host", "box"], ["health", "--ho=box"],
                 ["health", "--no-daemon"], ["health", "--expect-gpus"], ["zombies"]):
        done = fast(*argv)
        assert done.returncode == NOT_ANSWERED and not done.stdout, argv
    assert fast("health", RGT_NO_DAEMON="1").returncode == NOT_ANSWERED


def test_another_key_is_never_answered(daemons, tmp_path):
    rgt("health")
    daemon_pid()
    # Another RGT_ variable, another Python or another code: another socket, and no daemon there.
    assert fast("health", RGT_CACHE_DIR=str(tmp_path / "other-cache")).returncode == NOT_ANSWERED
    # On the same socket, a request carrying other material is refused: the material is compared, not a checksum.
    material = healthd.key_material(os.environ)
    path = healthd.socket_path(material)
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(path)
        conn.sendall(healthd._request(healthd.COMMAND, material + "\nedited", ["health"], {}, b"/"))
        kind, why = healthd.read_frame(conn)
    assert kind == healthd.FALL_BACK and b"another code" in why


def test_the_key_follows_the_code_and_the_environment(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    env = {"HOME": "/home/u", "RGT_CACHE_DIR": "/c", "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}
    before = healthd.key_material(env, str(package))
    assert healthd.key_material({**env, "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "1",
                                 healthd.IDLE_ENV: "5", "RGT_HELPER": "health-daemon"}, str(package)) == before
    assert healthd.key_material({**env, "RGT_CACHE_DIR": "/d"}, str(package)) != before
    assert healthd.key_material({**env, "LD_LIBRARY_PATH": "/fake"}, str(package)) != before
    stamp = (package / "a.py").stat()
    (package / "a.py").write_text("x = 22\n")
    os.utime(package / "a.py", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # same mtime, other size
    assert healthd.key_material(env, str(package)) != before
    (package / "a.py").write_text("x = 1\n")
    os.utime(package / "a.py", ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))  # same size, touched
    assert healthd.key_material(env, str(package)) != before


def test_a_killed_daemon_falls_back_and_the_next_call_starts_a_new_one(daemons):
    rgt("health")
    pid = daemon_pid()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid))
    assert fast("health").returncode == NOT_ANSWERED  # its socket is still there: refused, silently
    done = rgt("health", "--json")
    assert done.returncode == 0 and '"verdict": "PASS"' in done.stdout
    assert daemon_pid() != pid
    assert fast("health").returncode == 0


def test_a_replaced_nvidia_library_is_never_answered_from_and_the_daemon_exits(daemons, nvml_fake_lib, monkeypatch,
                                                                                 tmp_path):
    """A driver upgrade replaces libnvidia-ml: a fresh process loads the new one (a mismatch until reboot)."""
    library = tmp_path / "driver"
    shutil.copytree(nvml_fake_lib, library)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(library))
    rgt("health")
    pid = daemon_pid()
    assert fast("health").returncode == 0
    shutil.copy(library / "libnvidia-ml.so.1", library / "new")
    os.replace(library / "new", library / "libnvidia-ml.so.1")  # as a package upgrade installs a file
    assert fast("health").returncode == NOT_ANSWERED
    wait_for(lambda: gone(pid))
    assert not healthd.sockets()


def test_no_daemon_flag_stops_it_and_the_variable_starts_none(daemons):
    rgt("health")
    pid = daemon_pid()
    stopped = rgt("health", "--no-daemon")
    assert stopped.returncode == 0 and "exit 0: trainable" in stopped.stdout
    wait_for(lambda: gone(pid))
    assert not healthd.sockets()
    assert rgt("health", RGT_NO_DAEMON="1").returncode == 0
    time.sleep(1.0)
    assert not healthd.pids() and not daemons_of(str(daemons))


def test_it_exits_when_idle_and_removes_its_socket(daemons, monkeypatch):
    monkeypatch.setenv(healthd.IDLE_ENV, "1")
    assert healthd.start(os.environ)
    pid = daemon_pid()
    wait_for(lambda: gone(pid), 20)
    assert not list((daemons / "remote-gpu-trainer").iterdir())  # socket, lock and log: a clean end leaves none


def test_one_daemon_per_key_however_many_start(daemons):
    started = [healthd.start(os.environ) for _ in range(3)]
    pid = daemon_pid()
    assert pid in started
    time.sleep(0.5)
    assert daemons_of(str(daemons)) == [pid]  # the others found the lock taken and exited


def test_the_daemon_holds_no_cuda_no_torch_and_is_marked_a_helper(daemons):
    rgt("health")
    pid = daemon_pid()
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "torch" not in maps and "libnvidia-ml" not in maps  # NVML lives in its worker, CUDA nowhere
    files = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert not [f for f in files if f.startswith("/dev/nvidia")]
    assert read_environ(pid, ("RGT_HELPER",)) == {"RGT_HELPER": "health-daemon"}
    assert os.getsid(pid) == pid and os.readlink(f"/proc/{pid}/cwd") == "/"


def test_a_helper_started_inside_a_run_is_never_a_member(tmp_path):
    """`rgt health` in a training script starts the daemon as its child in its own session: while the parent
    lives it descends from a member, yet it is not the run's (box_idle and run_status read these members)."""
    own_session = f"{shlex.quote(sys.executable)} -c 'import os, time; os.setsid(); time.sleep(60)'"
    script = f"sleep 60 & RGT_HELPER=health-daemon {own_session} & wait"
    launcher = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    tasks = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
    children = [int(p) for p in wait_for(lambda: len(tasks.read_text().split()) == 2 and tasks.read_text().split())]
    try:
        helper = wait_for(lambda: [p for p in children if read_environ(p, ("RGT_HELPER",))])
        plain = [p for p in children if p not in helper]
        wait_for(lambda: os.getsid(helper[0]) == helper[0])  # its own session, as the daemon's
        meta = {"pid": launcher.pid, "start_ticks": read_start_ticks(launcher.pid), "pgid": launcher.pid,
                "sid": launcher.pid, "boot_id": boot_id()}
        run = RunDir(tmp_path / "run")
        run.path.mkdir()
        members = live_members(run, meta)
        assert launcher.pid in members and plain[0] in members and helper[0] not in members
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        launcher.wait()


def test_a_daemon_started_by_a_torchrun_rank_is_never_taken_for_a_left_behind_rank():
    """It inherits the rank's TORCHELASTIC_RUN_ID and outlives the rank by design: not a RAM orphan to reap."""
    rank_env = {**os.environ, "TORCHELASTIC_RUN_ID": "job-1"}
    rank = subprocess.Popen(["sleep", "60"], env=rank_env)
    helper = subprocess.Popen(["sleep", "60"], env={**rank_env, "RGT_HELPER": "health-daemon"})
    try:
        assert worker_kind(wait_for(lambda: snapshot(rank.pid))) == "torchrun rank"
        assert worker_kind(wait_for(lambda: snapshot(helper.pid))) is None
    finally:
        for proc in (rank, helper):
            proc.kill()
            proc.wait()


def test_the_runtime_directory_must_be_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    made = healthd.runtime_dir(create=True)
    assert made == str(tmp_path / "remote-gpu-trainer") and (os.stat(made).st_mode & 0o777) == 0o700
    os.chmod(made, 0o755)
    assert healthd.runtime_dir() is None  # others may list it: not used, and no daemon starts there
    os.chmod(made, 0o700)
    os.rmdir(made)
    os.symlink(tmp_path, made)
    assert healthd.runtime_dir() is None  # a link, even to a private directory
    os.unlink(made)
    if os.geteuid() == 0:
        os.mkdir(made, 0o700)
        os.chown(made, 65534, 65534)
        assert healthd.runtime_dir() is None  # someone else's
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    assert healthd.runtime_dir(create=True) == str(tmp_path / "t" / f"rgt-{os.geteuid()}")


def test_only_the_same_user_is_served():
    assert healthd.same_user(os.geteuid())
    assert not healthd.same_user(os.geteuid() + 1) and not healthd.same_user(None)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_another_users_connection_is_refused():
    """As root, a process of uid 65534 reaches a socket in an open directory: the daemon answers it nothing."""
    where = tempfile.mkdtemp(prefix="rgt-", dir="/tmp")  # pytest's own tmp_path is private to root
    os.chmod(where, 0o777)
    path = os.path.join(where, "s.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.listen(1)
    listener.settimeout(30)
    reply_r, reply_w = os.pipe()
    child = os.fork()
    if child == 0:  # another user, asking for the daemon's pid
        try:
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(path)
                try:
                    conn.sendall(healthd._request("ping"))
                    answer = conn.recv(100)
                except OSError:  # closed before or after the request arrived: reset, or a broken pipe
                    answer = b""
                os.write(reply_w, b"got:" + answer)
        finally:
            os._exit(0)
    os.close(reply_w)
    conn, _ = listener.accept()
    with conn:
        assert healthd.peer_uid(conn) == 65534
        assert healthd.Daemon({}, "material", path, 60).handle(conn) is None
    os.waitpid(child, 0)
    listener.close()
    shutil.rmtree(where)
    assert os.read(reply_r, 100) == b"got:"  # closed without a word


@pytest.mark.parametrize("words", [["--timeout-", "100"], ["--timeout_=100"], ["--timeout-s", "100"]])
def test_the_reply_limit_reads_the_timeout_as_the_cli_parser_does(words):
    """argparse takes an unambiguous abbreviation (--timeout- is --timeout-s): the client's limit must follow it,
    or it gives up at 75 s on a probe the daemon is still allowed to run for 200."""
    from remote_gpu_trainer.cli import build_parser

    argv = ["health", *words, "--sample-", "5"]
    parsed = build_parser().parse_args(argv)
    assert (float(parsed.timeout_s), float(parsed.sample_s)) == (100.0, 5.0)
    assert healthd.reply_limit_s(argv) == 2 * 100 + 5 + 15
