"""detach.spawn_detached: the child leads its own session, reads /dev/null, writes the log, outlives its caller."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from remote_gpu_trainer.detach import spawn_detached


def _wait_for(predicate, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_detached_child_has_own_session_devnull_stdin_and_log(tmp_path):
    log = tmp_path / "log"
    script = "import os,sys; print(os.getsid(0), os.getpgid(0), os.readlink('/proc/self/fd/0'), flush=True)"
    pid = spawn_detached([sys.executable, "-c", script], log)
    assert _wait_for(lambda: log.read_text().strip() != "")
    sid, pgid, stdin = log.read_text().split()
    assert int(sid) == pid and int(pgid) == pid
    assert stdin == "/dev/null"
    assert sid != str(os.getsid(0))
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_detached_child_outlives_its_caller(tmp_path):
    """The caller (a separate Python process) exits at once; the detached sleeper keeps running."""
    log, pid_file = tmp_path / "log", tmp_path / "pid"
    caller = ("import sys; from remote_gpu_trainer.detach import spawn_detached; "
              f"pid = spawn_detached([sys.executable, '-c', 'import time; print(\"up\", flush=True); time.sleep(30)'], "
              f"{str(log)!r}); open({str(pid_file)!r}, 'w').write(str(pid))")
    subprocess.run([sys.executable, "-c", caller], check=True, timeout=30)
    pid = int(pid_file.read_text())
    try:
        assert _wait_for(lambda: "up" in log.read_text())
        proc = psutil.Process(pid)
        assert proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        assert os.getsid(pid) == pid
    finally:
        psutil.Process(pid).kill()
