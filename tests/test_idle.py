"""box_idle, custody, run_pull's copy-and-verify and the idle guard, on this machine.

GPUs come from the fake NVML scenarios (RGT_HEALTH_FAKE); runs, files, rsync and the guard process
are real. The guard is a real detached process; the provider's stop command is a fake ``runpodctl``
on PATH that records its arguments. Windows are a few seconds at most.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.idle import custody, guard
from remote_gpu_trainer.idle.detect import detect, etc_environment, inside_argv, runnable
from remote_gpu_trainer.idle.pull import copy_and_verify
from remote_gpu_trainer.idle.tool import SPECS, elicit_guard
from remote_gpu_trainer.providers import load_profiles

BOX_IDLE, IDLE_GUARD = SPECS[0], SPECS[1]
RECORDER = str(Path(__file__).parent / "fixtures" / "runs" / "notify_record.py")


@pytest.fixture
def box(tmp_path, monkeypatch):
    """A private ledger, custody record and guard folder; a fake runpodctl that records its calls."""
    for name, sub in (("RGT_RUNS_DIR", "runs"), ("RGT_CUSTODY_DIR", "custody"), ("RGT_GUARD_DIR", "guard")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(name, str(tmp_path / sub))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "runpodctl.calls"
    fake = bin_dir / "runpodctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RUNPOD_POD_ID", "pod-abc123")
    monkeypatch.setenv("RGT_HEALTH_FAKE", "idle-8xh100")
    yield tmp_path
    guard.remove(tmp_path / "guard", reason="test teardown")


def _run(box: Path, run_id: str, pgid: int | None, ended: bool, outputs: list[str] = ()) -> Path:
    run_dir = box / "runs" / run_id
    run_dir.mkdir()
    (run_dir / "meta.json").write_text(json.dumps({"pgid": pgid, "output_dirs": list(outputs)}))
    (run_dir / "log").write_text("step 1\n")
    if ended:
        (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": time.time() - 120}))
    return run_dir


def _sync_everything(*roots: Path) -> None:
    custody.mark_verified(custody.hash_roots(roots), dest="/local/copy")


# --- verdicts -------------------------------------------------------------------------------------


def test_idle_box_is_idle_with_cost_and_the_providers_stop_and_terminate(box):
    _run(box, "r1", None, ended=True)
    result = BOX_IDLE.call({"window_s": 0.2, "interval_s": 0.1, "price_per_hour": 30.0})
    assert result.verdict == "idle"
    assert result.idle_for_s is not None and 100 < result.idle_for_s < 200  # the run ended 120 s ago
    assert result.idle_cost == pytest.approx(30.0 * result.idle_for_s / 3600, rel=0.05)
    assert result.provider.name == "runpod" and result.provider.how == "detected"
    assert result.stop.command.inside == "runpodctl stop pod $RUNPOD_POD_ID"
    assert "remove pod" in result.terminate.command.inside
    assert result.stop.still_bills and result.terminate.wipes and result.stop.source_urls
    assert [g.util_max for g in result.gpus] == [0] * 8 and result.gpus[0].power_w_mean == 70
    assert result.terminate_safe is False  # the run folder itself was never copied off
    assert "run_pull" in result.next_step and "Do not terminate" in result.next_step


def test_busy_box_is_busy_and_lists_foreign_processes_as_not_ours(box, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "busy-8xh100")
    result = BOX_IDLE.call({"window_s": 0})
    assert result.verdict == "busy" and result.idle_since is None and result.idle_cost is None
    assert all(g.util_max == 97 for g in result.gpus)
    assert result.gpus[0].processes[0].pid == 7001 and result.gpus[0].processes[0].ours is False


def test_a_running_run_makes_the_box_busy_and_a_silent_one_stalled(box):
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        run_dir = _run(box, "live", proc.pid, ended=False)
        assert BOX_IDLE.call({"window_s": 0}).verdict == "busy"
        old = time.time() - 3600
        os.utime(run_dir / "log", (old, old))
        os.utime(run_dir / "meta.json", (old, old))
        result = BOX_IDLE.call({"window_s": 0, "stall_minutes": 30})
        assert result.verdict == "stalled" and result.runs[0].pids == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert BOX_IDLE.call({"window_s": 0}).verdict == "idle"  # process gone, no exit.json: ended


def test_without_nvml_box_idle_decides_from_our_runs_and_says_so(box, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "no-driver")
    _run(box, "r1", None, ended=True)
    result = BOX_IDLE.call({"window_s": 0})
    assert result.verdict == "idle", result.evidence
    assert any("GPU load unreadable" in e and "runs" in e for e in result.evidence), result.evidence


# --- provider detection ---------------------------------------------------------------------------


def test_each_profiles_detect_rule_names_that_provider_and_nothing_else():
    profiles = load_profiles()
    rules = [(name, rule) for name, p in profiles.items() for rule in p.front.lifecycle.detect]
    assert {name for name, _ in rules} >= {"runpod", "vastai"}
    for name, rule in rules:
        assert rule.env, "file rules need a test that creates the file"
        found = detect(profiles, {rule.env: "x123"})
        assert found.provider == name and found.how == "detected" and found.source_urls
    unknown = detect(profiles, {"HOME": "/root"})
    assert unknown.provider is None and "RUNPOD_POD_ID" in unknown.evidence


def test_every_profile_says_documented_or_not_for_each_lifecycle_fact():
    for name, profile in load_profiles().items():
        life = profile.front.lifecycle
        assert life.detect or life.detect_note, name
        for action in (life.stop, life.terminate):
            assert all(getattr(action, k).value for k in ("inside", "outside", "keeps", "wipes", "still_bills"))
    runnable_stops = {n for n, p in load_profiles().items() if runnable(p.front.lifecycle.stop)}
    assert runnable_stops == {"runpod", "vastai"}


def test_stop_argv_fills_provider_variables_and_refuses_when_unset(tmp_path):
    stop = load_profiles()["vastai"].front.lifecycle.stop
    assert inside_argv(stop, {"CONTAINER_ID": "42"}) == ["vastai", "stop", "instance", "42"]
    with pytest.raises(ValueError, match="CONTAINER_ID is not set"):
        inside_argv(stop, {})
    env_file = tmp_path / "environment"
    env_file.write_text('PATH="/usr/bin"\nVAST_CONTAINERLABEL="C.42"\nexport CONTAINER_ID=42\n')
    assert etc_environment(env_file) == {"PATH": "/usr/bin", "VAST_CONTAINERLABEL": "C.42", "CONTAINER_ID": "42"}


def test_stop_on_a_provider_without_an_inside_command_is_refused(box):
    with pytest.raises(InputError, match="no documented command"):
        IDLE_GUARD.call({"action": "stop", "provider": "lambda"})


# --- custody --------------------------------------------------------------------------------------


def test_custody_lists_unsynced_files_and_not_verified_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("RGT_CUSTODY_DIR", str(tmp_path / "custody"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt-1.pt").write_bytes(b"a" * 1000)
    (out / "ckpt-2.pt").write_bytes(b"b" * 1000)
    missing, checked = custody.unsynced([out])
    assert checked == 2 and {Path(m.path).name for m in missing} == {"ckpt-1.pt", "ckpt-2.pt"}
    custody.mark_verified([custody.hash_file(out / "ckpt-1.pt")], dest="/home/me/runs")
    missing, _ = custody.unsynced([out])
    assert [Path(m.path).name for m in missing] == ["ckpt-2.pt"]
    assert custody.unsynced([out], dest="/elsewhere")[0].__len__() == 2  # only copies into that dest count
    time.sleep(0.01)
    (out / "ckpt-1.pt").write_bytes(b"c" * 1000)  # overwritten in place: the copy is stale
    reasons = {Path(m.path).name: m.reason for m in custody.unsynced([out])[0]}
    assert reasons["ckpt-1.pt"] == "changed since its verified copy"


# --- pull (rsync between two local folders; the transport only adds -e ssh) -----------------------


def _source(tmp_path: Path) -> tuple[Path, list[custody.FileHash]]:
    run = tmp_path / "box" / "run-7"
    (run / "ckpt").mkdir(parents=True)
    (run / "ckpt" / "model.pt").write_bytes(os.urandom(3 << 20))
    (run / "log").write_text("done\n")
    return run, custody.hash_roots([run])


def test_pull_verifies_checksums(tmp_path):
    run, files = _source(tmp_path)
    outcome = copy_and_verify([str(run)], files, tmp_path / "local")
    assert outcome.rsync_exit == 0 and outcome.mismatches == [] and outcome.first_pass == []
    assert len(outcome.verified) == 2 and (tmp_path / "local" / "run-7" / "ckpt" / "model.pt").is_file()


def test_pull_detects_a_corrupted_local_copy_and_repairs_it(tmp_path):
    run, files = _source(tmp_path)
    copy_and_verify([str(run)], files, tmp_path / "local")
    local = tmp_path / "local" / "run-7" / "ckpt" / "model.pt"
    stat = local.stat()
    with local.open("r+b") as handle:  # same size, same mtime: rsync's quick check would skip it
        handle.seek(1 << 20)
        handle.write(b"\0" * 16)
    os.utime(local, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    outcome = copy_and_verify([str(run)], files, tmp_path / "local")
    assert [(Path(m.path).name, m.kind) for m in outcome.first_pass] == [("model.pt", "sha256")]
    assert outcome.mismatches == [] and len(outcome.verified) == 2


def test_pull_resumes_an_interrupted_copy(tmp_path):
    run, files = _source(tmp_path)
    local = tmp_path / "local" / "run-7" / "ckpt" / "model.pt"
    local.parent.mkdir(parents=True)
    local.write_bytes((run / "ckpt" / "model.pt").read_bytes()[: 2 << 20])  # 2 of 3 MiB arrived before the cut
    outcome = copy_and_verify([str(run)], files, tmp_path / "local")
    assert outcome.mismatches == [] and outcome.first_pass == []
    assert outcome.literal_bytes is not None and outcome.literal_bytes < (3 << 20) // 2  # only the tail was sent


def test_pull_reports_a_mismatch_that_persists(tmp_path):
    run, files = _source(tmp_path)
    wrong = [custody.FileHash(f.path, f.size, "0" * 64, f.mtime_ns) if f.path.endswith("log") else f for f in files]
    outcome = copy_and_verify([str(run)], wrong, tmp_path / "local")
    assert [(Path(m.path).name, m.kind) for m in outcome.mismatches] == [("log", "sha256")]


# --- the guard ------------------------------------------------------------------------------------


def _arm(**args) -> object:
    dry = IDLE_GUARD.call(args)
    assert dry.mode == "dry_run" and dry.confirm_token
    return IDLE_GUARD.call({**args, "dry_run": False, "confirm_token": dry.confirm_token})


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _checks_for_longer_than_the_window(box: Path, reason: str) -> None:
    """Wait (with a deadline, not a fixed sleep: the guard starts slowly on a loaded machine) until the guard has
    judged the box busy for ``reason`` and kept checking for over a second, twice the 0.6 s idle window the
    tests arm it with, so a guard that ignored the reason would have acted by then."""
    def current() -> dict:
        return guard.status(box / "guard") or {}

    assert _wait(lambda: reason in current().get("reason", ""), 30), current()
    first = current()["checked_at"]
    assert _wait(lambda: current().get("checked_at", 0) > first + 1.2, 30), current()
    assert reason in current().get("reason", ""), current()


def _calls(box: Path) -> list[str]:
    record = box / "runpodctl.calls"
    return record.read_text().splitlines() if record.exists() else []


def test_guard_stops_the_box_after_the_window_and_not_before(box):
    _run(box, "r1", None, ended=True)
    _sync_everything(box / "runs")
    armed_at = time.time()
    result = _arm(action="stop", idle_minutes=0.03, interval_s=0.2)
    assert result.mode == "armed" and result.argv == ["runpodctl", "stop", "pod", "pod-abc123"]
    time.sleep(1.0)
    assert _calls(box) == []  # idle, but not yet for 1.8 s
    assert _wait(lambda: _calls(box), 15), guard.events(box / "guard")
    assert _calls(box) == ["stop pod pod-abc123"]
    fired = [e for e in guard.events(box / "guard") if e["event"] == "stopped"]
    assert fired and fired[0]["at"] - armed_at >= 1.8 and "idle for" in fired[0]["reason"]
    shown = BOX_IDLE.call({"window_s": 0})
    assert "runpodctl stop pod pod-abc123" in shown.guard.notice


def test_guard_never_acts_while_a_run_is_running(box):
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_dir = _run(box, "live", proc.pid, ended=False)
        _sync_everything(box / "runs")
        _arm(action="stop", idle_minutes=0.01, interval_s=0.2)
        _checks_for_longer_than_the_window(box, "run live is running")
        assert _calls(box) == []
    finally:
        proc.kill()
        proc.wait()
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": -9, "ended_at": time.time()}))
    _sync_everything(box / "runs")
    assert _wait(lambda: _calls(box), 15), guard.events(box / "guard")


def test_guard_never_acts_on_a_busy_gpu(box, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "busy-8xh100")
    _arm(action="notify", idle_minutes=0.01, interval_s=0.2)
    _checks_for_longer_than_the_window(box, "GPU 0 at 97%")
    assert guard.notice(box / "guard") is None


def test_guard_refuses_to_stop_with_unsynced_outputs(box):
    outputs = box / "outputs"
    outputs.mkdir()
    (outputs / "final.pt").write_bytes(b"weights")
    _run(box, "r1", None, ended=True, outputs=[str(outputs)])
    _sync_everything(box / "runs")
    notes = box / "notes.jsonl"
    _arm(action="stop", idle_minutes=0.01, interval_s=0.2, notify=[sys.executable, RECORDER, str(notes), "{state}",
                                                                   "{message}"])
    assert _wait(lambda: (guard.notice(box / "guard") or {}).get("kind") == "refused", 15)
    assert _calls(box) == [] and "final.pt" in guard.notice(box / "guard")["message"]
    assert _wait(lambda: any(n["argv"][0] == "stop_refused" for n in _notes(notes, 1)), 15)
    told = next(n for n in _notes(notes, 1) if n["argv"][0] == "stop_refused")  # the person hears why not
    assert "final.pt" in told["argv"][1]
    assert BOX_IDLE.call({"window_s": 0}).guard.notice.startswith("stop refused")
    _sync_everything(outputs)  # pulled and verified: now it may stop
    assert _wait(lambda: _calls(box), 15)


def test_guard_notify_is_listed_and_removed(box):
    _arm(action="notify", idle_minutes=60, interval_s=0.2)
    listed = IDLE_GUARD.call({"list": True})
    assert listed.armed and listed.action == "notify" and listed.pid
    pid = listed.pid
    assert _wait(lambda: (guard.status(box / "guard") or {}).get("state") == "idle", 10)
    removed = IDLE_GUARD.call({"remove": True})
    assert removed.mode == "removed"
    assert _wait(lambda: not guard.alive(pid), 5)
    assert IDLE_GUARD.call({"list": True}).armed is False
    assert IDLE_GUARD.call({"remove": True}).mode == "nothing_to_remove"
    assert _wait(lambda: not Path(f"/proc/{pid}").exists(), 5)  # reaped, not a zombie


def test_notify_fires_and_every_later_box_idle_shows_it(box):
    _arm(action="notify", idle_minutes=0.01, interval_s=0.2)
    assert _wait(lambda: guard.notice(box / "guard") is not None, 15)
    assert "idle guard found this box idle" in BOX_IDLE.call({"window_s": 0}).guard.notice


def test_arming_needs_the_dry_runs_token_bound_to_the_plan(box):
    dry = IDLE_GUARD.call({"action": "stop", "idle_minutes": 5})
    assert "runpodctl stop pod pod-abc123" in dry.plan and "5 min" in dry.plan
    with pytest.raises(InputError, match="confirm_token"):
        IDLE_GUARD.call({"action": "stop", "idle_minutes": 1, "dry_run": False, "confirm_token": dry.confirm_token})
    with pytest.raises(InputError, match="confirm_token"):
        IDLE_GUARD.call({"action": "stop", "idle_minutes": 5, "dry_run": False})
    assert guard.load_config(box / "guard") is None


def test_stop_asks_the_person_and_notify_does_not():
    from remote_gpu_trainer.idle.tool import IdleGuardInput

    assert "STOPS" in elicit_guard(IdleGuardInput(action="stop", dry_run=False, confirm_token="x"))
    assert elicit_guard(IdleGuardInput(action="stop")) is None
    assert elicit_guard(IdleGuardInput(action="notify", dry_run=False)) is None
    assert IDLE_GUARD.elicit is elicit_guard


# --- reaching the person, no NVML, stalled runs at full GPU load ---------------------------------------


def _notes(path: Path, count: int, timeout_s: float = 20.0) -> list[dict]:
    _wait(lambda: path.exists() and len(path.read_text().splitlines()) >= count, timeout_s)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_guard_warns_the_person_before_the_stop_and_tells_them_after(box):
    notes = box / "notes.jsonl"
    _run(box, "r1", None, ended=True)
    _sync_everything(box / "runs")
    armed_at = time.time()
    _arm(action="stop", idle_minutes=0.05, warn_minutes=0.025, interval_s=0.2,
         notify=[sys.executable, RECORDER, str(notes), "{state}", "{host}", "{message}"])
    assert _wait(lambda: _calls(box), 20), guard.events(box / "guard")
    stop_at = (box / "runpodctl.calls").stat().st_mtime
    records = _notes(notes, 3)
    assert [r["argv"][0] for r in records] == ["idle_warning", "stopping", "stopped"], records
    warning, _stopping, stopped = records
    assert warning["at"] < stop_at and warning["at"] - armed_at >= 1.4
    assert "runpodctl stop pod pod-abc123" in warning["argv"][2] and "unless" in warning["argv"][2]
    assert stopped["at"] >= stop_at and "exit 0" in stopped["argv"][2]


def test_guard_without_nvml_decides_from_runs_and_its_dry_run_says_so(box, monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "no-driver")
    notes = box / "notes.jsonl"
    _run(box, "r1", None, ended=True)
    plan = dict(action="notify", idle_minutes=0.01, interval_s=0.2,
                notify=[sys.executable, RECORDER, str(notes), "{state}", "{message}"])
    dry = IDLE_GUARD.call(plan)
    assert "GPU load cannot be read" in dry.plan and "run states" in dry.plan, dry.plan
    _arm(**plan)
    assert _wait(lambda: guard.notice(box / "guard") is not None, 15), guard.status(box / "guard")
    [record] = _notes(notes, 1)
    assert record["argv"][0] == "idle" and "idle" in record["argv"][1]


def test_on_stalled_a_stalled_run_is_idle_whatever_its_gpu_utilisation():
    """A rank hung in an NCCL collective spins its GPU at 100 %: the guard's on_stalled must still see it idle."""
    from remote_gpu_trainer.idle.guard import GuardConfig, blockers
    from remote_gpu_trainer.idle.ledger import RunView
    from remote_gpu_trainer.idle.sampling import GpuWindow, Window
    from remote_gpu_trainer.idle.verdict import decide

    hung = RunView(run_id="hung", state="stalled", run_dir=Path("/nonexistent"), pgid=4242, pids=frozenset({4242}),
                   ended_at=None, last_output_at=time.time() - 3600, output_dirs=())
    spinning = Window(True, "ok", "fake", time.time(), 2.0, 3,
                      [GpuWindow(0, utilization=[100, 100, 99], processes={4242: 1 << 30})])
    config = GuardConfig(action="stop", idle_s=60, util_threshold=5, on_stalled=True, allow_unsynced=False,
                         interval_s=1, stall_s=1800, paths=[])
    assert blockers(config, [hung], spinning) == []
    assert decide(spinning, [hung], 5).verdict == "stalled"
    assert blockers(replace(config, on_stalled=False), [hung], spinning)
    foreign = Window(True, "ok", "fake", time.time(), 2.0, 3,
                     [GpuWindow(0, utilization=[100], processes={4242: 1 << 30, 999_999: 1 << 30})])
    assert any("GPU 0" in reason for reason in blockers(config, [hung], foreign))


@pytest.mark.parametrize("scan", ["raises", "unreadable"])
def test_without_gpu_readings_a_scan_that_cannot_see_every_process_never_reads_idle(monkeypatch, scan):
    """GPU load unreadable, one run ended: the /proc scan decides whether a foreign CUDA job runs. When the scan
    fails, or (not root) cannot list another user's open files, idle is unproven: box_idle says unknown and an
    action=stop guard is blocked (a stop could kill that user's job); a notify guard may still tell."""
    from remote_gpu_trainer.health import holders
    from remote_gpu_trainer.idle.guard import GuardConfig, blockers
    from remote_gpu_trainer.idle.ledger import RunView
    from remote_gpu_trainer.idle.sampling import Window
    from remote_gpu_trainer.idle.verdict import decide

    ended = RunView(run_id="r1", state="ended", run_dir=Path("/nonexistent"), pgid=None, pids=frozenset(),
                    ended_at=time.time() - 600, last_output_at=None, output_dirs=())
    blind = Window(False, "no driver", "fake", time.time(), 2.0, 0, [])
    stop = GuardConfig(action="stop", idle_s=60, util_threshold=5, on_stalled=False, allow_unsynced=False,
                       interval_s=1, stall_s=1800, paths=[])
    # This test runs as root, where every /proc/<pid>/fd is listable: the scan's two failure modes are stood in for.
    assert decide(blind, [ended], 5).verdict == "idle"  # a scan that sees everything: idle, as before
    if scan == "raises":
        def failing(*_a, **_k):
            raise PermissionError(13, "Permission denied", "/proc")
        monkeypatch.setattr(holders, "scan_device_holders", failing)
    else:
        monkeypatch.setattr(holders, "scan_device_holders", lambda *_a, **_k: holders.DeviceScan({}, frozenset({4242})))
    decision = decide(blind, [ended], 5)
    assert decision.verdict == "unknown", decision
    assert any("cannot" in e and ("4242" in e or "scan" in e) for e in decision.evidence), decision.evidence
    assert any("4242" in r or "scan" in r for r in blockers(stop, [ended], blind))
    assert blockers(replace(stop, action="notify"), [ended], blind) == []


def test_box_idle_gives_no_checkpoint_outlook_for_a_run_that_ended(box):
    """A run that ended saves nothing more: its old saves must not be extrapolated into space it will never take."""
    folder = box / "ckpt"
    folder.mkdir()
    for age, step in ((7200, 10), (3600, 20)):
        path = folder / f"checkpoint-{step}.pt"
        path.write_bytes(b"\0" * 1000)
        os.utime(path, (time.time() - age, time.time() - age))
    run_dir = _run(box, "r1", None, ended=True)
    (run_dir / "meta.json").write_text(json.dumps({"pgid": None, "output_dirs": [], "checkpoint_dir": str(folder),
                                                   "save_every_steps": 10}))
    result = BOX_IDLE.call({"window_s": 0})
    [row] = result.runs
    assert row.state == "ended" and row.checkpoints is None, row.checkpoints
