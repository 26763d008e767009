"""The safe-kill core on real processes: tokens, refusal rules, children-first TERM/KILL.

Every process signalled here was spawned by the test itself; teardown kills only those (by their
psutil handles, which refuse a reused pid).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.processes.fingerprint import check_token, fingerprint, make_token, parse_token
from remote_gpu_trainer.processes.launchers import launcher_kind
from remote_gpu_trainer.processes.safekill import safe_kill
from remote_gpu_trainer.processes.safety import Caller, Policy, protected_reason, refusal
from remote_gpu_trainer.processes.snapshot import ProcessTable, ProcInfo, snapshot
from remote_gpu_trainer.processes.terminate import PID_REUSED, order_children_first, terminate

SLEEPER = "import time; print('ready', flush=True); time.sleep(600)"
IGNORES_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "time.sleep(600)")


class Spawner:
    """Starts helper processes, waits for their 'ready' line, and cleans up exactly those."""

    def __init__(self) -> None:
        self.handles: list[psutil.Process] = []
        self.popens: list[subprocess.Popen] = []
        self.scripts = Path(tempfile.mkdtemp(prefix="rgt-test-"))
        self.scripts.chmod(0o755)  # readable by a helper that runs as another user

    def python(self, code: str, *args: str, executable: str = sys.executable, user: int | None = None,
               ) -> tuple[subprocess.Popen, list[str]]:
        """Run ``code`` from a script file (short, readable command lines); return the Popen and the
        words after 'ready' on its first line."""
        script = self.scripts / f"helper{len(self.popens)}.py"
        script.write_text(code)
        script.chmod(0o644)
        proc = subprocess.Popen([executable, str(script), *args], stdout=subprocess.PIPE, text=True, user=user)
        self.popens.append(proc)
        self.handles.append(psutil.Process(proc.pid))
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", f"helper did not start: {line}"
        for extra in line[1:]:
            if extra.startswith("pid="):
                self.handles.append(psutil.Process(int(extra[4:])))
        return proc, line[1:]

    def cleanup(self) -> None:
        for handle in reversed(self.handles):
            try:
                handle.kill()  # psutil refuses if the pid now belongs to another process
            except psutil.Error:
                pass
        for proc in self.popens:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout:
                proc.stdout.close()
        shutil.rmtree(self.scripts, ignore_errors=True)


@pytest.fixture
def spawn():
    spawner = Spawner()
    yield spawner
    spawner.cleanup()


def gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` exited (a zombie counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = snapshot(pid)
        if info is None or info.status == "zombie":
            return True
        time.sleep(0.02)
    return False


def info(pid: int = 4242, **changes) -> ProcInfo:
    base = ProcInfo(pid=pid, ppid=4000, name="python", cmdline=("python", "train.py"), uid=1000, username="alice",
                    status="sleeping", create_time=1.7e9, sid=4000, start_ticks=123456)
    return replace(base, **changes)


ALICE = Caller(pid=5000, uid=1000, ancestors=frozenset({4999, 4998, 1}), session_leader=4998)
ROOT = replace(ALICE, uid=0)


# ------------------------------------------------------------------ fingerprints and tokens


def test_token_accepts_the_same_processes_and_names_changed_or_new_ones(spawn):
    proc, _ = spawn.python(SLEEPER)
    fp = fingerprint(snapshot(proc.pid))
    token = make_token([fp])
    assert token.startswith("rgt1.") and str(proc.pid) in token
    assert check_token(token, [fingerprint(snapshot(proc.pid))]) == []

    restarted = replace(fp, start=fp.start + "1")  # same pid, another start time: PID reuse or restart
    problems = check_token(token, [restarted])
    assert [(p.pid, p.problem) for p in problems] == [(proc.pid, "changed")]
    assert str(proc.pid) in problems[0].detail

    newcomer = replace(fp, pid=proc.pid + 100000)
    assert [p.problem for p in check_token(token, [fp, newcomer])] == ["not_in_dry_run"]
    assert check_token(token, []) == []  # a confirmed process that exited is simply not signalled


def test_fingerprint_binds_uid_and_command_line():
    a = fingerprint(info())
    assert a.digest() == fingerprint(info()).digest()
    assert a.digest() != fingerprint(info(uid=1001)).digest()
    assert a.digest() != fingerprint(info(cmdline=("python", "eval.py"))).digest()
    with pytest.raises(ValueError):
        fingerprint(info(start_ticks=None, create_time=None))


@pytest.mark.parametrize("bad", ["", "abc", "rgt1", "rgt2.12-0123456789ab", "rgt1.12-xyz", "rgt1.0-0123456789ab",
                                 "rgt1.12-0123456789ab.oops"])
def test_malformed_token_is_an_input_error_naming_the_field(bad):
    with pytest.raises(InputError) as err:
        parse_token(bad)
    assert err.value.field == "confirm_token"


# ------------------------------------------------------------------ refusal rules (pure)


@pytest.mark.parametrize(("proc", "caller", "policy", "code"), [
    (info(pid=1), ALICE, Policy(), "pid_le_1"),
    (info(pid=5000), ALICE, Policy(), "self"),
    (info(pid=4999), ALICE, Policy(), "ancestor"),
    (info(pid=4998), ALICE, Policy(), "ancestor"),
    (info(status="zombie", cmdline=()), ALICE, Policy(), "zombie"),
    (info(cmdline=(), name="kworker/0:1"), ALICE, Policy(), "kernel_thread"),
    (info(uid=1001, username="bob"), ALICE, Policy(allow_other_users=True), "other_user"),  # not root: never
    (info(uid=1001, username="bob"), ROOT, Policy(), "other_user"),  # root, but not allowed
    (info(uid=None), ALICE, Policy(), "other_user"),  # unreadable owner is not "mine"
    (info(name="sshd", cmdline=("sshd: alice@pts/0",)), ALICE, Policy(), "protected"),
    (info(name="sshd-session", cmdline=("sshd-session: alice [priv]",)), ALICE, Policy(), "protected"),
    (info(name="systemd-logind", cmdline=("/lib/systemd/systemd-logind",)), ALICE, Policy(), "protected"),
    (info(name="containerd-shim", cmdline=("/usr/bin/containerd-shim-runc-v2", "-id", "x")), ALICE, Policy(),
     "protected"),
    (info(name="docker-proxy", cmdline=("/usr/bin/docker-proxy", "-host-port", "29500")), ALICE, Policy(),
     "protected"),
    (info(name="tmux: server", cmdline=("tmux", "new", "-s", "train")), ALICE, Policy(), "protected"),
    (info(name="python", cmdline=("python", "-m", "jupyter", "lab")), ALICE, Policy(), "protected"),
    (info(name="python", cmdline=("python", "-m", "ipykernel_launcher", "-f", "k.json")), ALICE, Policy(),
     "protected"),
    (info(name="node", cmdline=("/home/alice/.vscode-server/bin/abc/node", "server-main.js")), ALICE, Policy(),
     "protected"),
    (info(name="bash", cmdline=("-bash",)), ALICE, Policy(), "login_shell"),
    (info(name="bash", cmdline=("bash",), sid=4242), ALICE, Policy(), "login_shell"),  # leads its own session
    (info(status="disk-sleep"), ALICE, Policy(), "uninterruptible"),
    (info(start_ticks=None, create_time=None), ALICE, Policy(), "no_start_time"),
])
def test_refusal_rules(proc, caller, policy, code):
    found = refusal(proc, caller, policy, parent_name="python")
    assert found is not None and found.code == code, found
    assert found.detail


@pytest.mark.parametrize(("proc", "caller", "policy"), [
    (info(), ALICE, Policy()),
    (info(cmdline=("python", "train.py", "--log", "sshd.log", "--resume", "/x/.vscode-server/ckpt")), ALICE,
     Policy()),  # protected words as *arguments* do not protect a training job
    (info(name="bash", cmdline=("bash", "run.sh"), sid=4000), ALICE, Policy()),  # a script, not a session
    (info(uid=1001, username="bob"), ROOT, Policy(allow_other_users=True)),
    (info(status="stopped"), ALICE, Policy()),
])
def test_ordinary_processes_may_be_signalled(proc, caller, policy):
    assert refusal(proc, caller, policy) is None


def test_zombie_refusal_names_the_parent():
    found = refusal(info(status="zombie", cmdline=()), ALICE, parent_name="torchrun")
    assert "4000 (torchrun)" in found.detail


def test_protected_reason_uses_extra_names():
    assert protected_reason(info(name="my-daemon"), frozenset({"my-daemon"}))
    assert protected_reason(info()) is None


@pytest.mark.parametrize(("cmdline", "kind"), [
    (("/venv/bin/python3", "/venv/bin/torchrun", "--nproc-per-node=8", "train.py"), "torchrun"),
    (("torchrun", "train.py"), "torchrun"),
    (("python", "-m", "torch.distributed.run", "train.py"), "torchrun"),
    (("python", "-u", "-m", "torch.distributed.launch", "train.py"), "torch.distributed.launch"),
    (("/usr/bin/python", "/venv/bin/accelerate", "launch", "train.py"), "accelerate"),
    (("python", "-m", "deepspeed.launcher.launch", "--world_info=x"), "deepspeed"),
    (("python", "-u", "train.py", "--note", "torchrun"), None),
    (("python", "/venv/bin/accelerate", "config"), None),
    (("python", "torchrun_helpers.py"), None),
])
def test_launcher_kind(cmdline, kind):
    assert launcher_kind(cmdline) == kind


def test_children_are_ordered_before_parents():
    table = ProcessTable({10: 1, 11: 10, 12: 11, 13: 10, 20: 1})
    ordered = [p.pid for p in order_children_first([info(pid=p) for p in (10, 11, 12, 13, 20)], table)]
    assert ordered.index(12) < ordered.index(11) < ordered.index(10)
    assert ordered.index(13) < ordered.index(10)
    assert table.descendants(10) == [11, 13, 12]
    assert table.ancestors(12) == [11, 10, 1]


def test_process_table_survives_a_parent_loop():
    table = ProcessTable({5: 6, 6: 5})
    assert table.ancestors(5) == [6]


# ------------------------------------------------------------------ safe_kill on real processes


def test_dry_run_signals_nothing_and_the_token_kills_exactly_it(spawn):
    proc, _ = spawn.python(SLEEPER)
    report = safe_kill({proc.pid: "test sleeper"})
    assert report.dry_run and not report.executed
    [target] = report.targets
    assert (target.pid, target.action, target.why) == (proc.pid, "would_signal", "test sleeper")
    assert target.ppid == os.getpid() and target.uid == os.getuid()
    time.sleep(0.2)
    assert proc.poll() is None, "the dry run must not signal"

    done = safe_kill({proc.pid: "test sleeper"}, dry_run=False, confirm_token=report.confirm_token, grace_s=5)
    assert done.executed
    assert done.targets[0].outcome == "exited_after_term"
    assert proc.wait(timeout=5) == -signal.SIGTERM


def test_real_run_without_token_is_refused_as_input_error(spawn):
    proc, _ = spawn.python(SLEEPER)
    with pytest.raises(InputError) as err:
        safe_kill({proc.pid: "x"}, dry_run=False)
    assert err.value.field == "confirm_token"
    assert proc.poll() is None


def test_stale_token_is_refused_and_a_fresh_one_returned(spawn):
    first, _ = spawn.python(SLEEPER)
    token = safe_kill({first.pid: "x"}).confirm_token
    second, _ = spawn.python(SLEEPER)  # "the job was restarted": another process, not in the token
    report = safe_kill({first.pid: "x", second.pid: "x"}, dry_run=False, confirm_token=token)
    assert not report.executed
    assert any(str(second.pid) in p and "not in the dry run" in p for p in report.token_problems)
    assert {t.action for t in report.targets} == {"not_signalled"}
    assert report.confirm_token and report.confirm_token != token
    time.sleep(0.2)
    assert first.poll() is None and second.poll() is None


def test_term_ignoring_process_survives_term_and_dies_only_with_kill(spawn):
    proc, _ = spawn.python(IGNORES_TERM)
    token = safe_kill({proc.pid: "stubborn"}).confirm_token
    report = safe_kill({proc.pid: "stubborn"}, dry_run=False, confirm_token=token, signal="TERM", grace_s=0.5)
    assert report.targets[0].outcome == "survived_term"
    assert proc.poll() is None

    token = safe_kill({proc.pid: "stubborn"}, signal="KILL").confirm_token
    report = safe_kill({proc.pid: "stubborn"}, dry_run=False, confirm_token=token, signal="KILL", grace_s=0.5)
    assert report.targets[0].outcome == "exited_after_kill"
    assert proc.wait(timeout=5) == -signal.SIGKILL


def test_stopped_process_gets_sigcont_so_sigterm_can_end_it(spawn):
    proc, _ = spawn.python(SLEEPER)
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while snapshot(proc.pid).status != "stopped" and time.monotonic() < deadline:
        time.sleep(0.02)
    report = safe_kill({proc.pid: "suspended"})
    assert "SIGCONT" in report.targets[0].detail
    done = safe_kill({proc.pid: "suspended"}, dry_run=False, confirm_token=report.confirm_token, grace_s=5)
    assert done.targets[0].outcome == "exited_after_term"


def test_zombie_is_reported_with_its_parent_and_not_signalled():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while snapshot(child.pid).status != "zombie" and time.monotonic() < deadline:
            time.sleep(0.02)
        report = safe_kill({child.pid: "zombie"}, dry_run=False)  # nothing approved: no token needed
        [target] = report.targets
        assert (target.action, target.refusal) == ("refused", "zombie")
        assert str(os.getpid()) in target.detail
        assert not report.executed
    finally:
        child.wait()


def test_self_and_parent_are_never_signalled():
    report = safe_kill({os.getpid(): "me", os.getppid(): "my parent"}, dry_run=False)
    assert {(t.pid, t.refusal) for t in report.targets} == {(os.getpid(), "self"), (os.getppid(), "ancestor")}
    assert report.confirm_token is None and not report.executed


def test_terminate_skips_a_pid_whose_start_time_changed(spawn):
    proc, _ = spawn.python(SLEEPER)
    snap = snapshot(proc.pid)
    outcomes = terminate([replace(snap, start_ticks=snap.start_ticks - 1)], escalate=True, grace_s=0.1)
    assert outcomes[proc.pid].code == PID_REUSED
    time.sleep(0.1)
    assert proc.poll() is None


def test_tree_is_signalled_children_first(spawn, tmp_path):
    # Three generations; each writes its depth when SIGTERM arrives, so we know all got TERM (not KILL).
    log = tmp_path / "term.log"
    code = f"""
import os, signal, subprocess, sys, time
depth = int(sys.argv[1])
def on_term(*_):
    with open({str(log)!r}, "a") as f:
        f.write(f"{{depth}}\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
below = []
if depth < 2:
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], str(depth + 1), sys.argv[2]],
                             stdout=subprocess.PIPE, text=True)
    below = [f"pid={{child.pid}}", *child.stdout.readline().split()[1:]]
print("ready", *below, flush=True)
time.sleep(600)
"""
    top, below = spawn.python(code, "0", code)
    pids = [top.pid] + [int(word[4:]) for word in below]
    assert len(pids) == 3
    report = safe_kill({pid: "tree" for pid in pids})
    assert [t.pid for t in report.targets] == list(reversed(pids))  # grandchild, child, parent: signal order
    done = safe_kill({pid: "tree" for pid in pids}, dry_run=False, confirm_token=report.confirm_token, grace_s=5)
    assert {t.outcome for t in done.targets} == {"exited_after_term"}
    assert sorted(log.read_text().split()) == ["0", "1", "2"]
