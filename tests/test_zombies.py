"""reap_vram_zombies: classification rules on hand-made processes, then the real thing on real processes.

Real processes cannot open /dev/nvidia*, so they open stand-in files and the /proc scan is pointed
at them (``device_prefix``); everything else (psutil, /proc, the safe-kill step) is the real code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.health.backend import GpuProcess, GpuProcesses, Memory
from remote_gpu_trainer.health.fakes import OK_STATUS, SCENARIOS, FakeBackend, FakeProcesses, h100, proc
from remote_gpu_trainer.health.holders import (
    DeviceUse,
    HolderClass,
    LocalProcesses,
    classify,
    parent_gone,
    scan_device_holders,
)
from remote_gpu_trainer.health.zombies import ReapInput, reap
from remote_gpu_trainer.models import Verdict

GIB = 1 << 30


# --- classification rules on hand-made processes ---------------------------------------------------


def _gpus(scenario_name: str) -> tuple[list[GpuProcesses], FakeProcesses]:
    scenario = SCENARIOS[scenario_name]()
    return [scenario.backend.read_processes(i) for i in range(len(scenario.backend.gpus))], scenario.processes


def by_pid(result) -> dict[int, object]:
    return {h.pid: h for h in result.holders}


def test_every_class_in_the_mixed_scenario():
    gpus, source = _gpus("zombie-orphan-namespaced")
    holders = by_pid(classify(gpus, source))
    assert holders[1001].cls is HolderClass.ACTIVE and not holders[1001].candidate
    assert holders[2001].cls is HolderClass.ORPHAN and holders[2001].candidate
    assert holders[2002].cls is HolderClass.ACTIVE and holders[2002].candidate  # the orphan's DataLoader worker
    assert "descendant of orphan 2001" in holders[2002].reason
    assert holders[3001].cls is HolderClass.ZOMBIE and "pid 1000 (torchrun)" in holders[3001].remedy
    assert holders[4001].cls is HolderClass.UNINTERRUPTIBLE and "reboot" in holders[4001].remedy
    assert holders[884422].cls is HolderClass.NAMESPACED and holders[884422].local_holders == (5005,)
    assert holders[771133].cls is HolderClass.PHANTOM and "nvidia-smi -r -i 4" in holders[771133].remedy
    assert holders[0xFFFFFFFF].cls is HolderClass.INVALID_PID
    local = holders[5005]
    assert not local.nvml_listed and local.cls is HolderClass.ORPHAN and local.candidate
    assert {h.pid for h in holders.values() if h.candidate} == {2001, 2002, 5005}


def _one(pid_info, *, holders=None, container=False, pgids=None, units=None, my_uid=1000, unreadable=frozenset(),
         minor=0, listed=True):
    """Classify a single process NVML lists on GPU 0 (or only holding its device file)."""
    procs = {1: proc(1, 0, "/sbin/init", uid=0, sid=1), 2000: proc(2000, 1, "bash", sid=2000), pid_info.pid: pid_info}
    if holders is None:
        holders = {pid_info.pid: DeviceUse(frozenset({minor}), True)}
    source = FakeProcesses(procs=procs, pgids={1: 1, 2000: 2000, **(pgids or {})}, units=units or {}, holders=holders,
                           container=container, my_uid=my_uid, unreadable=unreadable)
    processes = (GpuProcess(pid_info.pid, 2 * GIB, ("compute",)),) if listed else ()
    gpu = GpuProcesses(index=0, uuid="GPU-0", minor=0, memory=Memory(80 * GIB, 2 * GIB, None), processes=processes)
    return classify([gpu], source).holders


def orphan_info(**changes):
    return dataclasses.replace(proc(3000, 1, "python train.py", sid=2990), **changes)


def test_orphan_needs_evidence_that_its_launcher_is_gone():
    assert _one(orphan_info(), pgids={3000: 2990})[0].cls is HolderClass.ORPHAN
    # started by a systemd unit: systemd is its real parent
    assert _one(orphan_info(), pgids={3000: 2990}, units={3000: "train.service"})[0].cls is HolderClass.ACTIVE
    # detached on purpose (setsid / daemon): leads its own session
    assert _one(orphan_info(sid=3000), pgids={3000: 3000})[0].cls is HolderClass.ACTIVE
    # started by PID 1 itself (a container entrypoint script): same process group as its parent
    assert _one(orphan_info(), pgids={3000: 1})[0].cls is HolderClass.ACTIVE
    # a live, ordinary parent
    assert _one(orphan_info(ppid=2000), pgids={3000: 2990})[0].cls is HolderClass.ACTIVE


def test_a_brief_d_state_is_not_stuck():
    stuck = _one(orphan_info(status="disk-sleep"), pgids={3000: 2990})[0]
    assert stuck.cls is HolderClass.UNINTERRUPTIBLE and "D state for 1 s" in stuck.reason
    info = orphan_info(status="disk-sleep")
    procs = {1: proc(1, 0, "/sbin/init", uid=0, sid=1), 3000: info}
    source = FakeProcesses(procs=procs, pgids={1: 1, 3000: 2990}, holders={3000: DeviceUse(frozenset({0}), True)},
                           after_wait={3000: dataclasses.replace(info, status="sleeping")})
    gpu = GpuProcesses(index=0, minor=0, memory=Memory(80 * GIB, GIB, None),
                       processes=(GpuProcess(3000, GIB, ("compute",)),))
    passing = classify([gpu], source).holders[0]
    assert passing.cls is HolderClass.ORPHAN and passing.info.status == "sleeping"
    assert 0 < source.waited <= 0.2  # one poll was enough to see it move on


def test_candidate_rules():
    assert _one(orphan_info(), pgids={3000: 2990})[0].candidate
    other = _one(orphan_info(uid=1001), pgids={3000: 2990})[0]
    assert not other.candidate and "another user" in other.reason
    young = _one(orphan_info(create_time=1_000_000.0 - 5), pgids={3000: 2990})[0]
    assert not young.candidate and "min_age_s" in young.reason
    hidden = _one(orphan_info(), pgids={3000: 2990}, holders={}, unreadable=frozenset({3000}))[0]
    assert hidden.holds_device is None and not hidden.candidate and "not proven" in hidden.reason


def test_local_holders_count_only_with_a_cuda_context():
    cuda = _one(orphan_info(), pgids={3000: 2990}, listed=False)
    assert cuda[0].cls is HolderClass.ORPHAN and not cuda[0].nvml_listed and cuda[0].candidate
    # NVML-only monitors (nvidia-persistenced, nvtop) open /dev/nvidiaN but not /dev/nvidia-uvm: no VRAM, no row
    assert _one(orphan_info(), pgids={3000: 2990}, holders={3000: DeviceUse(frozenset({0}), False)}, listed=False) == []


def test_in_a_container_a_coincidental_local_pid_is_not_the_nvml_process():
    # NVML lists host pid 3000; locally pid 3000 is some unrelated process that holds no GPU file.
    holders = _one(orphan_info(), pgids={3000: 2990}, container=True, holders={})
    assert holders[0].cls is HolderClass.PHANTOM and "different process" in holders[0].reason
    assert "restart the pod" in holders[0].remedy and not holders[0].candidate


def test_an_nvml_hang_while_listing_processes_is_a_failure():
    scenario = SCENARIOS["nvml-hang"]()
    try:
        started = time.monotonic()
        report = reap(ReapInput(timeout_s=1), scenario.backend, processes=scenario.processes, kill_step=None)
    finally:
        scenario.backend.release.set()
    assert time.monotonic() - started < 4
    assert report.verdict is Verdict.FAIL and report.exit_code == 1
    assert report.summary.startswith("NVML hung on GPU 4") and "ComputeRunningProcesses" in report.summary
    assert [m.gpu for m in report.memory] == [0, 1, 2, 3]


# --- real processes --------------------------------------------------------------------------------

HOLDER = "import sys, time; files = [open(p, 'rb') for p in sys.argv[1:]]; print('ready', flush=True); time.sleep(120)"
PARENT_OF_HOLDER = (  # a training rank holding the GPU, with a DataLoader-like child that holds it too
    "import subprocess, sys, time; files = [open(p, 'rb') for p in sys.argv[2:]]; "
    "c = subprocess.Popen([sys.executable, '-c', sys.argv[1], *sys.argv[2:]], stdout=subprocess.DEVNULL); "
    "time.sleep(120)"
)
LAUNCHER = (  # starts a holder (optionally with its own holder child) and exits at once, orphaning it
    "import subprocess, sys; "
    "c = subprocess.Popen([sys.executable, '-c', sys.argv[1], *sys.argv[2:]], stdout=subprocess.DEVNULL, "
    "stderr=subprocess.DEVNULL); print(c.pid, flush=True)"
)


@pytest.fixture
def devices(tmp_path: Path) -> Path:
    for name in ("nvidia0", "nvidia1", "nvidia-uvm", "nvidiactl"):
        (tmp_path / name).write_bytes(b"")
    return tmp_path


@pytest.fixture
def cleanup():
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def _holds(pid: int, path: Path) -> bool:
    try:
        return any(f.path == str(path) for f in psutil.Process(pid).open_files())
    except psutil.Error:
        return False


def spawn_orphan(devices: Path, cleanup: list[int], *, with_child: bool = False) -> tuple[int, int | None]:
    """A holder whose launcher (a session leader, like a shell job) has exited: a real orphan."""
    files = [str(devices / "nvidia0"), str(devices / "nvidia-uvm")]
    code, args = (PARENT_OF_HOLDER, [HOLDER, *files]) if with_child else (HOLDER, files)
    out = subprocess.run([sys.executable, "-c", LAUNCHER, code, *args], capture_output=True, text=True, timeout=30,
                         start_new_session=True)
    pid = int(out.stdout.split()[0])
    cleanup.append(pid)
    child = None
    _wait(lambda: psutil.pid_exists(pid) and psutil.Process(pid).ppid() != 0)
    if with_child:
        _wait(lambda: bool(psutil.Process(pid).children()))
        child = psutil.Process(pid).children()[0].pid
        cleanup.append(child)
        _wait(lambda: _holds(child, devices / "nvidia0"))
    else:
        _wait(lambda: _holds(pid, devices / "nvidia0"))
    # Settled into time.sleep: a process still paging in Python is briefly in D state, which the
    # safe-kill step (rightly) refuses to signal.
    for settled in (pid, child):
        if settled is not None:
            _wait(lambda p=settled: psutil.Process(p).status() == psutil.STATUS_SLEEPING)
    return pid, child


def _adopter_is_known(pid: int) -> bool:
    parent = psutil.Process(psutil.Process(pid).ppid())
    from remote_gpu_trainer.health.holders import ADOPTERS

    return parent.pid == 1 or parent.name() in ADOPTERS


def backend_listing(*pids: int) -> FakeBackend:
    """Fake NVML that lists real pids on GPU 0 (minor 0)."""
    procs = tuple(GpuProcess(pid, GIB, ("compute",)) for pid in pids)
    status = dataclasses.replace(OK_STATUS, device_count=1)
    return FakeBackend("real-processes", status, [h100(0, processes=procs, memory=Memory(80 * GIB, len(pids) * GIB,
                                                                                         None))])


def test_device_scan_finds_real_holders(devices, cleanup):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(devices / "nvidia1"), str(devices / "nvidia-uvm")],
                              stdout=subprocess.PIPE, text=True)
    cleanup.append(holder.pid)
    assert holder.stdout.readline().strip() == "ready"
    scan = scan_device_holders(prefix=str(devices / "nvidia"))
    assert scan.holders[holder.pid] == DeviceUse(frozenset({1}), True)
    assert os.getpid() not in scan.holders
    holder.kill()
    holder.wait()


def test_real_orphan_is_detected_and_a_live_child_is_active(devices, cleanup):
    orphan, _ = spawn_orphan(devices, cleanup)
    if not _adopter_is_known(orphan):
        pytest.skip(f"orphans here are adopted by an unknown subreaper ({psutil.Process(orphan).parent().name()})")
    active = subprocess.Popen([sys.executable, "-c", HOLDER, str(devices / "nvidia0"), str(devices / "nvidia-uvm")],
                              stdout=subprocess.PIPE, text=True)
    cleanup.append(active.pid)
    assert active.stdout.readline().strip() == "ready"
    source = LocalProcesses(device_prefix=str(devices / "nvidia"))
    gone, why = parent_gone(source.info(orphan), source)
    assert gone and "launched it has exited" in why
    result = classify([backend_listing(orphan, active.pid).read_processes(0)], source, min_age_s=0)
    holders = by_pid(result)
    assert holders[orphan].cls is HolderClass.ORPHAN and holders[orphan].holds_device is True
    assert holders[orphan].candidate
    assert holders[active.pid].cls is HolderClass.ACTIVE and not holders[active.pid].candidate
    active.kill()
    active.wait()


def test_real_zombie(devices):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        _wait(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
        source = LocalProcesses(device_prefix=str(devices / "nvidia"))
        holder = classify([backend_listing(child.pid).read_processes(0)], source).holders[0]
        assert holder.cls is HolderClass.ZOMBIE and f"parent pid {os.getpid()}" in holder.remedy
        assert not holder.candidate
    finally:
        child.wait()


def test_reap_end_to_end_dry_run_then_confirmed_kill(devices, cleanup):
    orphan, worker = spawn_orphan(devices, cleanup, with_child=True)
    if not _adopter_is_known(orphan):
        pytest.skip("orphans here are adopted by an unknown subreaper")
    backend = backend_listing(orphan, worker)
    source = LocalProcesses(device_prefix=str(devices / "nvidia"))
    dry = reap(ReapInput(min_age_s=0), backend, processes=source)
    assert dry.dry_run and dry.verdict is Verdict.WARN and dry.exit_code == 0
    targets = {t.pid: t for t in dry.kill.targets}
    assert set(targets) == {orphan, worker}
    assert all(t.action == "would_signal" for t in targets.values())
    assert dry.confirm_token and "--confirm-token" in dry.next_step
    assert psutil.pid_exists(orphan) and psutil.pid_exists(worker)  # a dry run signals nothing

    with pytest.raises(InputError) as missing:
        reap(ReapInput(dry_run=False, min_age_s=0), backend, processes=LocalProcesses(str(devices / "nvidia")))
    assert missing.value.field == "confirm_token"

    done = reap(ReapInput(dry_run=False, confirm_token=dry.confirm_token, grace_s=5, min_age_s=0), backend,
                processes=LocalProcesses(device_prefix=str(devices / "nvidia")))
    assert done.verdict is Verdict.PASS and done.exit_code == 0, done.summary
    outcomes = {t.pid: t.outcome for t in done.kill.targets}
    assert outcomes == {orphan: "exited_after_term", worker: "exited_after_term"}
    order = [t.pid for t in done.kill.targets]
    assert order.index(worker) < order.index(orphan)  # children first
    _wait(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE)


def test_reap_refuses_a_token_for_other_processes(devices, cleanup):
    first, _ = spawn_orphan(devices, cleanup)
    if not _adopter_is_known(first):
        pytest.skip("orphans here are adopted by an unknown subreaper")
    token = reap(ReapInput(min_age_s=0), backend_listing(first),
                 processes=LocalProcesses(str(devices / "nvidia"))).confirm_token
    second, _ = spawn_orphan(devices, cleanup)
    result = reap(ReapInput(dry_run=False, confirm_token=token, min_age_s=0), backend_listing(second),
                  processes=LocalProcesses(str(devices / "nvidia")))
    assert result.verdict is Verdict.FAIL and result.exit_code == 1
    assert "not in the dry run" in result.summary
    assert psutil.pid_exists(second) and psutil.Process(second).status() != psutil.STATUS_ZOMBIE


def test_young_orphans_are_left_alone(devices, cleanup):
    orphan, _ = spawn_orphan(devices, cleanup)
    result = reap(ReapInput(min_age_s=3600), backend_listing(orphan), processes=LocalProcesses(str(devices / "nvidia")))
    assert result.kill is None and not any(h.candidate for h in result.holders)


# --- orphans that hold host RAM: DataLoader workers of a killed rank, without NVML -----------------------

RANK = """import sys, time
import torch
from torch.utils.data import DataLoader, Dataset


class Stuck(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, index):
        ballast = bytearray(24 << 20)
        for offset in range(0, len(ballast), 4096):
            ballast[offset] = 1
        time.sleep(600)  # stuck in the dataset (a dead NFS, a hung decode): the worker outlives its rank
        return index


loader = iter(DataLoader(Stuck(), num_workers=2, multiprocessing_context="fork"))
print(" ".join(str(w.pid) for w in loader._workers), flush=True)
next(loader)
"""


def _rank() -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True, start_new_session=True)
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    assert len(workers) == 2, "the rank did not start its workers"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(psutil.Process(w).memory_info().rss > 20 << 20 for w in workers):
        time.sleep(0.2)
    return proc, workers


@pytest.mark.slow
def test_ram_orphans_of_a_killed_rank_are_reaped_without_nvml_and_live_jobs_are_not():
    pytest.importorskip("torch")
    no_nvml = SCENARIOS["no-driver"]().backend
    detached = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(120)' & echo $!"],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    nohup_job = int(detached.stdout.readline())  # a job the user detached on purpose: re-parented, not a worker
    detached.wait()
    dead, orphans = _rank()
    live, live_workers = _rank()
    try:
        dead.kill()
        dead.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(psutil.Process(w).ppid() == dead.pid for w in orphans):
            time.sleep(0.1)
        report = reap(ReapInput(min_age_s=0), no_nvml)
        rows = {row.pid: row for row in report.ram_orphans}
        assert {pid for pid, row in rows.items() if row.candidate} == set(orphans), report.summary
        assert all(rows[w].rss_bytes > 20 << 20 and rows[w].kind == "DataLoader worker" for w in orphans)
        assert not any(rows.get(pid) and rows[pid].candidate for pid in [live.pid, *live_workers, nohup_job])
        assert "without NVML" not in report.next_step and report.confirm_token
        done = reap(ReapInput(min_age_s=0, dry_run=False, confirm_token=report.confirm_token), no_nvml)
        assert done.kill.executed and {t.pid for t in done.kill.targets if t.action == "signalled"} == set(orphans)
        assert not [w for w in orphans if psutil.pid_exists(w) and psutil.Process(w).status() != "zombie"]
        assert all(psutil.Process(p).is_running() for p in [live.pid, *live_workers, nohup_job])
    finally:
        for pid in [*orphans, *live_workers, nohup_job]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        live.kill()
        live.wait()


def test_a_ram_orphans_command_is_shown_whole_and_printable_as_a_gpu_holders_is():
    """A ``python -c`` script's newlines and an escape sequence in argv must not reach a table raw."""
    from remote_gpu_trainer.health.holders import RamOrphan
    from remote_gpu_trainer.health.zombies import _ram_row
    from remote_gpu_trainer.processes.snapshot import snapshot

    script = "import time\n# \x1b[2J" + "x" * 500 + "\ntime.sleep(30)"
    proc_ = subprocess.Popen([sys.executable, "-c", script])
    try:
        info = snapshot(proc_.pid)
        deadline = time.monotonic() + 5
        while "time.sleep(30)" not in info.command and time.monotonic() < deadline:  # argv visible after exec
            time.sleep(0.05)
            info = snapshot(proc_.pid)
        row = _ram_row(RamOrphan(info, "DataLoader worker", 1 << 20, True, "test", 1.0))
    finally:
        proc_.kill()
        proc_.wait()
    assert row.command.isprintable() and "\\n" in row.command and "\\x1b" in row.command, row.command
    assert row.command.endswith("time.sleep(30)"), "a long command is shown whole, not cut at 400 characters"


# --- a supervised run's own processes: the supervisor is their parent (subreaper), yet they are live -------------


@pytest.mark.parametrize("how", ["direct", "nohup"])
def test_a_live_supervised_job_holding_a_gpu_is_never_an_orphan(devices, runs_dir, tmp_path, how):
    """The supervisor starts the job in its own process group and adopts what a launcher detaches (nohup … &):
    neither has a dead launcher, so neither may be called an orphan or offered by the reaper."""
    from remote_gpu_trainer.runs.tool import SPECS

    holder = [sys.executable, "-c", HOLDER, str(devices / "nvidia0"), str(devices / "nvidia-uvm")]
    if how == "direct":
        argv = holder
    else:
        script = tmp_path / "launch.sh"
        script.write_text(f"#!/bin/sh\nnohup {shlex.join(holder)} >/dev/null 2>&1 &\nexit 0\n")
        script.chmod(0o755)
        argv = [str(script)]
    tools = {spec.name: spec for spec in SPECS}
    started = tools["run_start"].call({"argv": argv, "cwd": str(tmp_path)})
    supervisor = None

    def job() -> int | None:
        nonlocal supervisor
        for p in psutil.process_iter():
            try:
                if "remote_gpu_trainer.runs.supervisor" in p.cmdline() and started.run_id in " ".join(p.cmdline()):
                    supervisor = p.pid
                    kids = [c.pid for c in p.children() if _holds(c.pid, devices / "nvidia0")]
                    return kids[0] if kids else None
            except psutil.Error:
                continue
        return None

    _wait(lambda: job() is not None, timeout=30)
    pid = job()
    assert psutil.Process(pid).ppid() == supervisor
    _wait(lambda: psutil.Process(pid).status() == psutil.STATUS_SLEEPING)
    source = LocalProcesses(device_prefix=str(devices / "nvidia"))
    gone, why = parent_gone(source.info(pid), source)
    assert not gone, why
    holder_row = by_pid(classify([backend_listing(pid).read_processes(0)], source, min_age_s=0))[pid]
    assert holder_row.cls is HolderClass.ACTIVE and not holder_row.candidate, holder_row.reason
    dry = reap(ReapInput(min_age_s=0), backend_listing(pid), processes=source)
    assert dry.kill is None or pid not in {t.pid for t in dry.kill.targets}, dry.summary
    assert psutil.Process(pid).is_running()
