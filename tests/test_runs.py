"""Run lifecycle with real processes: run_start → run_status → run_stop, failures, stalls, kills, OOM, notify.

Every run is a real detached supervisor with a real training process (torch on CPU, gloo); nothing
about the OS is mocked. RGT_RUNS_DIR points at a temporary folder, thresholds are short.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.runs.tool import SPECS

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
TOOLS = {spec.name: spec for spec in SPECS}


@pytest.fixture(autouse=True)
def _own_ledger(runs_dir):
    """Every test here gets its own run ledger (conftest.runs_dir)."""


def call(tool: str, **arguments):
    return TOOLS[tool].call(arguments)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_status(run_id: str, predicate, timeout_s: float = 30.0):
    end = time.monotonic() + timeout_s
    status = call("run_status", run_id=run_id)
    while not predicate(status) and time.monotonic() < end:
        time.sleep(0.2)
        status = call("run_status", run_id=run_id)
    assert predicate(status), status.model_dump_json(indent=1)
    return status


def wait_lines(path: Path, count: int, timeout_s: float = 15.0) -> list[dict]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            break
        time.sleep(0.1)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_gloo_run_shows_progress_and_stops_with_a_token():
    port = free_port()
    started = call("run_start", argv=[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                                      f"--master-port={port}", str(FIXTURES / "train_gloo.py"), "100000", "0.05"],
                   cwd=str(FIXTURES), name="gloo")
    assert started.port == port and started.pid
    assert "gloo" in started.run_id
    status = wait_status(started.run_id, lambda s: s.progress and (s.progress.step or 0) >= 3, timeout_s=60)
    assert status.state == "running"
    assert status.progress.total == 100000 and status.progress.loss is not None
    assert len(status.processes) >= 3  # the torchrun agent and two workers
    pids = [p.pid for p in status.processes]

    dry = call("run_stop", run_id=started.run_id)
    assert dry.dry_run and dry.confirm_token
    assert {t.pid for t in dry.kill.targets if t.action == "would_signal"} >= set(pids)
    assert all(psutil.pid_exists(pid) for pid in pids), "a dry run must not signal anything"

    stopped = call("run_stop", run_id=started.run_id, dry_run=False, confirm_token=dry.confirm_token, grace_s=10)
    assert stopped.verified, stopped.summary
    gone = [pid for pid in pids if not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"]
    assert gone == pids
    final = wait_status(started.run_id, lambda s: s.state == "killed", timeout_s=15)
    assert "run_stop" in final.detail
    assert call("run_list").runs[0].run_id == started.run_id


def test_failing_run_is_diagnosed_and_notifies_once(tmp_path):
    notes = tmp_path / "notes.jsonl"
    started = call("run_start", argv=[sys.executable, str(FIXTURES / "fail_unused_param.py")], cwd=str(tmp_path),
                   notify=[sys.executable, str(FIXTURES / "notify_to_file.py"), str(notes)])
    status = wait_status(started.run_id, lambda s: s.state == "failed", timeout_s=60)
    assert status.exit_code == 1 and status.signal is None
    assert status.diagnosis and status.diagnosis[0].id == "DIST-10"
    lines = wait_lines(notes, 1)
    assert [(n["RGT_RUN_ID"], n["RGT_RUN_STATE"]) for n in lines] == [(started.run_id, "failed")]
    assert lines[0]["RGT_RUN_DIAGNOSIS"].startswith("DIST-10")
    status = call("run_status", run_id=started.run_id)
    assert [(n.event, n.exit_code) for n in status.notifications] == [("failed", 0)]
    time.sleep(0.5)
    assert len(notes.read_text().splitlines()) == 1


def test_silent_run_is_stalled_then_killed_from_outside_reports_the_signal(tmp_path):
    notes = tmp_path / "notes.jsonl"
    started = call("run_start", argv=[sys.executable, str(FIXTURES / "quiet_sleeper.py")], cwd=str(tmp_path),
                   stall_after_s=1.5, notify=[sys.executable, str(FIXTURES / "notify_to_file.py"), str(notes)])
    status = wait_status(started.run_id, lambda s: s.state == "stalled", timeout_s=20)
    assert "no progress in" in status.detail and status.detail.split(" for ")[0].endswith("/log")
    assert [n["RGT_RUN_STATE"] for n in wait_lines(notes, 1)] == ["stalled"]

    os.kill(started.pid, signal.SIGKILL)
    status = wait_status(started.run_id, lambda s: s.state not in ("stalled", "running"), timeout_s=15)
    assert (status.state, status.signal, status.signal_name) == ("killed", 9, "SIGKILL")
    states = [n["RGT_RUN_STATE"] for n in wait_lines(notes, 2)]
    assert states == ["stalled", "killed"], "the stall is notified once, the end once"


def test_sigterm_from_outside_is_killed_with_sigterm(tmp_path):
    started = call("run_start", argv=[sys.executable, str(FIXTURES / "quiet_sleeper.py")], cwd=str(tmp_path))
    wait_status(started.run_id, lambda s: s.state == "running")
    os.kill(started.pid, signal.SIGTERM)
    status = wait_status(started.run_id, lambda s: s.state == "killed")
    assert status.signal == signal.SIGTERM and status.exit_code is None
    assert status.diagnosis == []


def test_successful_run_and_logs_bounded_with_offsets(tmp_path):
    script = "for i in range(200):\n    print(f'step {i + 1}/200 loss {1 / (i + 1):.4f}')\n"
    started = call("run_start", argv=[sys.executable, "-c", script], cwd=str(tmp_path))
    status = wait_status(started.run_id, lambda s: s.state == "succeeded")
    assert (status.exit_code, status.progress.step, status.progress.total) == (0, 200, 200)
    tail = call("run_logs", run_id=started.run_id, lines=3)
    assert tail.text.splitlines() == ["step 198/200 loss 0.0051", "step 199/200 loss 0.0050",
                                      "step 200/200 loss 0.0050"]
    first = call("run_logs", run_id=started.run_id, offset=0, max_bytes=256)
    assert first.text.startswith("step 1/200") and len(first.text) <= 256 and first.truncated
    second = call("run_logs", run_id=started.run_id, offset=first.next_offset, max_bytes=256)
    assert second.text.startswith(f"step {first.lines + 1}/200")
    grep = call("run_logs", run_id=started.run_id, grep=r"step 1\d/", lines=100)
    assert grep.lines == 10
    with pytest.raises(InputError, match="grep"):
        call("run_logs", run_id=started.run_id, grep="(")


def test_bad_input_is_refused_clearly(tmp_path):
    with pytest.raises(InputError, match="shell"):
        call("run_start", command="python train.py | tee log", cwd=str(tmp_path))
    with pytest.raises(InputError, match="argv"):
        call("run_start", cwd=str(tmp_path))
    with pytest.raises(InputError, match="env"):
        call("run_start", argv=["true"], env={"1BAD": "x"}, cwd=str(tmp_path))
    with pytest.raises(InputError, match="run_id"):
        call("run_status", run_id="../etc")
    with pytest.raises(InputError, match="no run"):
        call("run_status", run_id="20260101-000000-none")


def test_busy_rendezvous_port_is_refused(tmp_path):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(InputError, match=f"port {port} is in use"):
            call("run_start", command=f"torchrun --nproc-per-node=2 --master-port {port} train.py", cwd=str(tmp_path))


def test_command_env_assignments_and_missing_program(tmp_path):
    started = call("run_start", command="RGT_T=hello python3 -c 'import os; print(os.environ[\"RGT_T\"])'",
                   cwd=str(tmp_path))
    assert started.env_added == ["RGT_T"]
    wait_status(started.run_id, lambda s: s.state == "succeeded")
    assert call("run_logs", run_id=started.run_id).text == "hello\n"
    missing = call("run_start", argv=["/nonexistent/trainer"], cwd=str(tmp_path))
    status = wait_status(missing.run_id, lambda s: s.state == "failed")
    assert status.exit_code == 127 and "could not start" in status.detail


def test_second_run_on_the_same_gpus_is_refused_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "healthy-8xh100")  # 8 fake GPUs, nobody holding VRAM
    first = call("run_start", argv=[sys.executable, str(FIXTURES / "quiet_sleeper.py")], cwd=str(tmp_path), gpus=[0])
    wait_status(first.run_id, lambda s: s.state == "running")
    with pytest.raises(InputError, match=f"our run\\(s\\) {first.run_id}"):
        call("run_start", argv=["true"], cwd=str(tmp_path), gpus=[0, 1])
    other = call("run_start", argv=["true"], cwd=str(tmp_path), env={"CUDA_VISIBLE_DEVICES": "2"})
    assert other.gpus == [2]
    shared = call("run_start", argv=["true"], cwd=str(tmp_path), gpus=[0], allow_shared_gpus=True)
    assert "shared" in shared.checks[1].result


def test_supervisor_survives_the_cli_that_started_it(tmp_path):
    """`rgt run start` in a process that exits; status from another process still sees the run."""
    env = {**os.environ}
    out = subprocess.run([sys.executable, "-m", "remote_gpu_trainer.cli", "run", "start", "--json", "--cwd",
                          str(tmp_path), "--", sys.executable, "-c",
                          "import time\nfor i in range(600):\n print(f'step {i}', flush=True); time.sleep(0.05)"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout)["run_id"]
    later = subprocess.run([sys.executable, "-m", "remote_gpu_trainer.cli", "run", "status", run_id, "--json"],
                           capture_output=True, text=True, env=env, timeout=60)
    status = json.loads(later.stdout)
    assert status["state"] == "running" and status["progress"]["step"] is not None
    supervisor = json.loads((Path(os.environ["RGT_RUNS_DIR"]) / run_id / "supervisor.json").read_text())["pid"]
    assert os.getsid(supervisor) == supervisor  # its own session: no terminal or ssh hangup reaches it


def _memory_cgroup() -> tuple[Path, Path] | str:
    """A fresh cgroup with a 96 MiB memory limit: (its folder, its cgroup.procs), or why not."""
    if os.geteuid() != 0:
        return "needs root to create a cgroup"
    name = f"rgt-test-{uuid.uuid4().hex[:8]}"
    v2 = Path("/sys/fs/cgroup")
    if "memory" in (v2 / "cgroup.subtree_control").read_text().split() if (v2 / "cgroup.subtree_control").exists() \
            else False:
        path = v2 / name
        try:
            path.mkdir()
            (path / "memory.max").write_text(str(96 << 20))
            (path / "memory.swap.max").write_text("0")
        except OSError as err:
            return f"cgroup v2 child not writable: {err}"
        return path, path / "cgroup.procs"
    mine = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                 if line.split(":")[1] == "memory"), None)
    if mine is None:
        return "no cgroup v2 memory controller in cgroup.subtree_control and no cgroup v1 memory hierarchy"
    path = Path("/sys/fs/cgroup/memory") / mine.lstrip("/") / name
    try:
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(96 << 20))
    except OSError as err:
        return f"cgroup v1 memory child not writable: {err}"
    return path, path / "cgroup.procs"


def test_an_oom_line_older_than_the_process_is_about_a_reused_pid(tmp_path):
    """The kernel log keeps OOM kills from before the run: a line naming one of its pids counts only when it was
    logged after that process started (a full-suite run once called a stopped gloo run oom_killed for a line about
    an earlier test's process with the same pid)."""
    from remote_gpu_trainer.runs.oom import kernel_oom_lines

    hz = os.sysconf("SC_CLK_TCK")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("3,101,5000000,-;Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB\n"
                    "3,102,9000000,-;Out of memory: Killed process 4242 (python) total-vm:2kB\n"
                    "6,103,9500000,-;Out of memory: Killed process 777 (python) total-vm:3kB\n")
    lines, note = kernel_oom_lines({4242: 7 * hz}, str(kmsg))  # started 7 s after boot
    assert note is None and lines == ["Out of memory: Killed process 4242 (python) total-vm:2kB"]
    assert len(kernel_oom_lines({4242: None}, str(kmsg))[0]) == 2  # start unknown: every line naming it


def test_memory_hog_in_a_limited_cgroup_is_oom_killed(tmp_path):
    made = _memory_cgroup()
    if isinstance(made, str):
        pytest.skip(made)
    folder, procs = made
    try:
        # The wrapper moves itself into the limited cgroup, then becomes the hog (exec keeps the pid).
        argv = ["sh", "-c", f'echo $$ > {procs} && exec "$0" "$@"', sys.executable, str(FIXTURES / "memory_hog.py")]
        started = call("run_start", argv=argv, cwd=str(tmp_path))
        status = wait_status(started.run_id, lambda s: s.state not in ("starting", "running"), timeout_s=60)
        assert status.state == "oom_killed", status.detail
        assert status.signal == signal.SIGKILL
        assert status.oom["cgroup_rises"] or status.oom["kernel_lines"]
    finally:
        for _ in range(50):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)
