"""run_stacks' parts without torch: the rank hook in real Python processes, the verdict on hand-made stacks,
torchrun's failure summary, flight-recorder analysis, and GPU placement on the fake NVML.

The torch runs (4-rank gloo scenarios) are in test_hang_gloo.py; through an ssh box in test_hang_remote.py.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from remote_gpu_trainer.health.fakes import shared_gpu
from remote_gpu_trainer.runs import stacks as stacks_module
from remote_gpu_trainer.runs.flight import analyze, read_dumps, recorder_env
from remote_gpu_trainer.runs.hang import SPECS, judge, place_of, rank_ranges, torchrun_root_cause
from remote_gpu_trainer.runs.placement import gpu_placement, placement_text, ranks_of
from remote_gpu_trainer.runs.stacks import Frame, ProcessStacks, ThreadStack, collect, hook_env, signal_caught

SITE = "/venv/lib/python3.11/site-packages"
TOOLS = {spec.name: spec for spec in SPECS}


def _wait_file(path: Path, needle: str, timeout_s: float = 10.0) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        text = path.read_text() if path.exists() else ""
        if needle in text:
            return text
        time.sleep(0.02)
    raise AssertionError(f"{needle!r} never appeared in {path}: {path.read_text() if path.exists() else '-'}")


@pytest.fixture
def hooked(tmp_path):
    """A run folder with the hook armed, and a starter for Python programs inside it."""
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, **hook_env(run, dict(os.environ))}
    started: list[subprocess.Popen] = []

    def start(code: str, extra: dict[str, str] | None = None) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env={**env, **(extra or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
        started.append(proc)
        return proc

    yield run, env, start
    for proc in started:
        proc.kill()
        proc.wait()


WAITER = """
    import sys, time
    def wait_for_peer(seconds):
        end = time.time() + seconds
        while time.time() < end:
            time.sleep(0.01)
    print("ready", flush=True)
    wait_for_peer(float(sys.argv[1]) if len(sys.argv) > 1 else 1.5)
    print("finished", flush=True)
"""


def test_signal_dump_reads_the_stack_and_the_process_carries_on(hooked):
    run, _env, start = hooked
    proc = start(WAITER, {"RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"})
    assert proc.stdout.readline().strip() == "ready"
    sampled = collect([proc.pid], run / "stacks", samples=3, interval_s=0.05, timeout_s=5)
    assert [s.pid for s in sampled] == [proc.pid]
    stacks = sampled[0]
    assert (stacks.mechanism, stacks.role, stacks.rank, stacks.local_rank) == ("signal", "rank", 5, 1)
    assert stacks.samples == 3
    main = stacks.main_frames
    assert [f.function for f in main[:2]] == ["wait_for_peer", "<module>"] and main[0].file == "<string>"
    assert proc.wait(timeout=10) == 0, "a sampled process must run on and exit normally"
    assert proc.stdout.read().strip() == "finished"


def test_an_unarmed_process_is_never_signalled(hooked, monkeypatch):
    run, _env, _start = hooked
    monkeypatch.setattr(stacks_module, "py_spy_path", lambda: None)
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        assert not signal_caught(bare.pid, stacks_module.stacks_signal())
        [result] = collect([bare.pid], run / "stacks", samples=2, interval_s=0.05, timeout_s=2)
        assert result.mechanism is None and "py-spy is not installed" in result.error
        time.sleep(0.2)
        assert bare.poll() is None, "the stack signal kills a process without the handler: it must not be sent"
    finally:
        bare.kill()
        bare.wait()


def test_hook_chains_to_the_users_sitecustomize_and_leaves_sys_path_clean(hooked, tmp_path):
    _run, env, start = hooked
    theirs = tmp_path / "user_site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITECUSTOMIZE = 'ran'\n")
    code = """
        import builtins, os, signal, sys
        caught = int(open('/proc/self/status').read().split('SigCgt:')[1].split()[0], 16)
        sig = int(os.environ['RGT_STACKS_SIGNAL'])
        print(getattr(builtins, 'USER_SITECUSTOMIZE', None), bool(caught >> (sig - 1) & 1),
              any(p.endswith('rank_hook') for p in sys.path), flush=True)
    """
    proc = start(code, {"PYTHONPATH": f"{env['PYTHONPATH']}{os.pathsep}{theirs}"})
    assert proc.wait(timeout=10) == 0
    assert proc.stdout.read().split() == ["ran", "True", "False"]


def test_forked_child_rearms_with_its_own_file_and_exit_cleans_up(hooked):
    run, _env, start = hooked
    code = """
        import os, time
        pid = os.fork()
        if pid == 0:
            def fetch_sample():
                time.sleep(30)
            fetch_sample()
            os._exit(0)
        print(pid, flush=True)
        time.sleep(30)
    """
    parent = start(code, {"RANK": "0"})
    child = int(parent.stdout.readline())
    _wait_file(run / "stacks" / f"{child}.txt", '"forked": true')
    [sampled] = collect([child], run / "stacks", samples=1, timeout_s=5)
    assert sampled.role == "worker" and sampled.main_frames[0].function == "fetch_sample"
    quick = start("print('bye')")
    assert quick.wait(timeout=10) == 0
    assert not (run / "stacks" / f"{quick.pid}.txt").exists(), "a process never sampled leaves no file"
    os.kill(child, signal.SIGKILL)


# ------------------------------------------------------------------ the verdict on hand-made stacks


def _frames(*spec: str) -> list[Frame]:
    """'file:line:function' innermost first."""
    return [Frame(file=s.rsplit(":", 2)[0], line=int(s.rsplit(":", 2)[1]), function=s.rsplit(":", 2)[2])
            for s in spec]


ALL_REDUCE = (f"{SITE}/torch/distributed/distributed_c10d.py:3252:all_reduce",
              f"{SITE}/torch/distributed/c10d_logger.py:83:wrapper")


def _rank(rank: int, frames: list[Frame], *, moving: bool = False, role: str = "rank", pid: int | None = None,
          ppid: int = 1, world: int = 8) -> ProcessStacks:
    return ProcessStacks(pid=pid or 1000 + rank, ppid=ppid, role=role, rank=rank, local_rank=rank % world,
                         world_size=world, local_world_size=world, mechanism="signal", samples=3, moving=moving,
                         threads=[ThreadStack(thread="0x1", main=True, frames=frames)])


def test_the_odd_rank_in_its_dataloader_is_named_with_the_workers_line():
    waiting = _frames(*ALL_REDUCE, "/job/train.py:88:main", "/job/train.py:120:<module>")
    loading = _frames(f"{SITE}/torch/utils/data/dataloader.py:733:_next_data",
                      f"{SITE}/torch/utils/data/dataloader.py:708:__next__", "/job/train.py:80:main")
    worker = _frames("/job/dataset.py:41:__getitem__", f"{SITE}/torch/utils/data/_utils/fetch.py:52:fetch")
    processes = [_rank(r, waiting) for r in (0, 1, 2, 4, 5, 6, 7)] + [_rank(3, loading)]
    processes.append(_rank(3, worker, role="worker", pid=2003, ppid=1003))
    report = judge(processes)
    assert report.verdict == ("ranks 0–2, 4–7 wait in `all_reduce` at `train.py:88`; rank 3 is in "
                              "`DataLoader.__next__` → `dataset.py:41` (`__getitem__`, worker pid 2003) (DATA-11)")
    assert (report.finding, report.odd_ranks, report.collective) == ("odd_ranks", [3], "all_reduce")
    assert report.entry.id == "DATA-11" and report.entry.file == "references/training/data-pipeline.md"
    assert report.entry_title.startswith("`DataLoader timed out")


def test_a_rank_in_another_collective_points_to_rank_conditional_code():
    others = _frames(*ALL_REDUCE, "/job/train.py:58:main")
    odd = _frames(f"{SITE}/torch/distributed/distributed_c10d.py:5356:barrier",
                  f"{SITE}/torch/distributed/c10d_logger.py:83:wrapper", "/job/train.py:60:main")
    report = judge([_rank(r, odd if r == 2 else others, world=4) for r in range(4)])
    assert report.verdict.startswith("ranks 0, 1, 3 wait in `all_reduce` at `train.py:58`; rank 2 waits in `barrier`")
    assert report.entry.id == "DIST-13"


def test_progressing_all_waiting_and_gone_ranks():
    step = _frames("/job/train.py:30:step")
    assert judge([_rank(r, step, moving=True, world=4) for r in range(4)]).verdict.startswith("all 4 ranks progressing")
    assert judge([_rank(r, step, world=4) for r in range(4)], log_grew=True).finding == "progressing"
    waiting = [_rank(r, _frames(*ALL_REDUCE, "/job/train.py:88:main")) for r in range(8)]
    report = judge(waiting)
    assert report.finding == "all_waiting" and report.verdict.startswith("all 8 ranks wait in `all_reduce`")
    assert report.entry.id == "DIST-14"
    gone = judge(waiting[:3] + waiting[4:])
    assert gone.finding == "rank_gone" and gone.odd_ranks == [3] and "rank 3 has no process" in gone.verdict
    assert gone.entry.id == "DIST-12"


def test_place_and_ranges():
    assert rank_ranges([0, 1, 2, 4, 5, 6, 7]) == "ranks 0–2, 4–7"
    assert rank_ranges([3]) == "rank 3" and rank_ranges([0, 2, 3]) == "ranks 0, 2, 3"
    place = place_of(_frames(f"{SITE}/torch/_tensor.py:626:backward", "/job/train.py:70:train_step"))
    assert (place.activity, place.site, place.function) == ("backward", "train.py:70", "train_step")


KILLED_LOG = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
kill3.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_04:04:30
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 1683)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1683
[2]:
  time      : 2026-11-27_04:04:30
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 1686)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1686
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_04:04:30
  host      : localhost
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 1695)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1695
======================================================
"""


def test_torchruns_failure_summary_names_the_rank_that_failed_first():
    root = torchrun_root_cause(KILLED_LOG)
    assert (root.rank, root.pid, root.exitcode, root.signal, root.stopped_after) == (3, 1695, -9, "SIGKILL", [0, 1])
    assert root.text == "rank 3 (pid 1695) failed first: exit code -9 (SIGKILL); torchrun then stopped ranks 0, 1"
    report = judge([], root_cause=root)
    assert report.finding == "ended" and report.entry.id == "MON-06"
    assert torchrun_root_cause("step 5/10 loss 0.1\n") is None


# ------------------------------------------------------------------ flight recorder


def _dump(rank: int, ops: list[tuple[str, list]], completed: int) -> dict:
    entries = [{"collective_seq_id": i + 1, "profiling_name": f"gloo:{op}", "input_sizes": sizes,
                "input_dtypes": ["Float"] * len(sizes), "is_p2p": False, "process_group": ["0", "default_pg"],
                "state": "scheduled"} for i, (op, sizes) in enumerate(ops)]
    return {"version": "2.10", "entries": entries, "pg_config": {"": {"ranks": "[0, 1, 2, 3]"}},
            "pg_status": {"0": {"last_enqueued_collective": str(len(ops)),
                                "last_completed_collective": str(completed)}}}


def test_flight_recorder_names_size_mismatch_and_the_rank_that_never_entered(tmp_path):
    good = [("all_reduce", [[4]])] * 2 + [("all_reduce", [[1]]), ("barrier", [])]
    bad = [("all_reduce", [[4]])] * 2 + [("all_reduce", [[2]])]
    for rank in (0, 2, 3):
        (tmp_path / f"rank{rank}-stall.json").write_text(json.dumps(_dump(rank, good, 3)))
    (tmp_path / "rank1-stall.json").write_text(json.dumps(_dump(1, bad, 2)))
    report = analyze(read_dumps(tmp_path))
    assert report.summary == ("collective #3 differs in sizes: rank 1 [[2]]; ranks 0, 2, 3 [[1]]; rank 1 never "
                              "entered collective #4 (barrier) that ranks 0, 2, 3 entered")
    assert [(m.seq, m.aspect) for m in report.mismatches] == [(3, "sizes")]
    assert {r.rank: (r.last_enqueued, r.last_completed) for r in report.ranks}[1] == (3, 2)


def test_flight_recorder_reports_a_rank_without_dump_and_refuses_pickled_classes(tmp_path):
    ops = [("all_reduce", [[4]])] * 3
    for rank in (0, 1, 2):
        (tmp_path / f"rank{rank}-exit.json").write_text(json.dumps(_dump(rank, ops, 2)))
    (tmp_path / "nccl_trace_rank_3").write_bytes(pickle.dumps(Path("/etc/passwd")))  # a class: refused
    report = analyze(read_dumps(tmp_path))
    assert report.no_dump == [3] and report.summary.endswith("no dump from rank 3 (it died or was stopped before "
                                                             "writing one)")
    env = recorder_env(tmp_path, {"TORCH_FR_BUFFER_SIZE": "50"})
    assert "TORCH_FR_BUFFER_SIZE" not in env and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].endswith("flight_recorder/nccl_trace_rank_")


# ------------------------------------------------------------------ GPU placement on the fake NVML


def test_two_ranks_on_one_gpu_and_an_idle_visible_gpu():
    placement = gpu_placement({7101: 0, 7102: 1, 7103: 2}, ["0,1,2,3"] * 3, shared_gpu().backend)
    assert [(r.rank, r.gpus) for r in placement.ranks] == [(0, [0]), (1, [0]), (2, [1])]
    assert [(g.gpu, g.ranks, g.util_percent) for g in placement.gpus] == [(0, [0, 1], 99), (1, [2], 96), (2, [], 0),
                                                                           (3, [], 0)]
    assert placement.findings == ["ranks 0, 1 share GPU 0 (every rank on cuda:0? set the device from LOCAL_RANK: "
                                  "DIST-01)", "GPUs 2, 3 visible to the run but used by no rank"]
    assert placement_text(placement)[0] == "GPU 0: ranks 0, 1 · 99 % busy"
    only_two = gpu_placement({7101: 0, 7103: 1}, ["0,1"] * 2, shared_gpu().backend)
    assert only_two.findings == [], "each rank has its own GPU and both visible GPUs are used"


def test_container_pids_that_nvml_does_not_know_make_placement_unknown():
    placement = gpu_placement({4242: 0, 4243: 1}, [None, None], shared_gpu().backend)
    assert placement.findings == [] and "PID namespace" in placement.note


def test_run_status_maps_real_rank_processes_through_the_fake(tmp_path, monkeypatch):
    from remote_gpu_trainer.runs import tool as run_tool

    monkeypatch.setenv("RGT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("RGT_HEALTH_FAKE", raising=False)
    launcher = textwrap.dedent("""
        import os, subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],
                                 env={**os.environ, 'RANK': str(r), 'CUDA_VISIBLE_DEVICES': '0,1,2,3'})
                for r in range(3)]
        print(' '.join(str(k.pid) for k in kids), flush=True)
        time.sleep(60)
    """)
    started = run_tool.SPECS[0].call({"argv": [sys.executable, "-c", launcher], "cwd": str(tmp_path)})
    try:
        log = Path(started.log)
        kids = tuple(int(p) for p in _wait_file(log, "\n").split())
        backend = shared_gpu(kids).backend
        reads: list[tuple[str, int]] = []
        for name in ("read_processes", "read_gpu"):  # count what NVML is asked (each GPU once is enough)
            original = getattr(backend, name)
            monkeypatch.setattr(backend, name, lambda i, name=name, original=original: (reads.append((name, i)),
                                                                                        original(i))[1])
        monkeypatch.setattr(run_tool, "default_backend", lambda: backend)
        assert ranks_of([started.pid, *kids])[0] == {kids[0]: 0, kids[1]: 1, kids[2]: 2}
        status = run_tool.SPECS[1].call({"run_id": started.run_id})
        assert status.placement.findings[0].startswith("ranks 0, 1 share GPU 0")
        assert [g.gpu_util_percent for g in status.gpu] == [99, 99, 96]
        assert sorted(reads) == sorted(set(reads)), f"a GPU read twice by one run_status: {sorted(reads)}"
        assert "GPU 0: ranks 0, 1 · 99 % busy" in run_tool.render_status(status)
    finally:
        os.killpg(started.pid, signal.SIGKILL)


def test_forensics_env_arms_the_hook_unless_turned_off(tmp_path):
    from remote_gpu_trainer.runs.hang import forensics_env
    from remote_gpu_trainer.runs.ledger import RunDir

    run = RunDir(tmp_path)
    armed = forensics_env(run, {}, {"PYTHONPATH": "/mine"})
    assert armed["PYTHONPATH"] == f"{tmp_path / 'rank_hook'}{os.pathsep}/mine" and "RGT_FR_DIR" not in armed
    assert (tmp_path / "rank_hook" / "sitecustomize.py").is_file()
    assert forensics_env(run, {"rank_hook": False}, {}) == {}
    recorder = forensics_env(run, {"rank_hook": False, "flight_recorder": True}, {})
    assert recorder["TORCH_FR_BUFFER_SIZE"] == "2000" and "PYTHONPATH" not in recorder


def test_run_stacks_input_needs_exactly_one_target():
    from remote_gpu_trainer.errors import InputError

    with pytest.raises(InputError, match="exactly one of run_id"):
        TOOLS["run_stacks"].call({})
    with pytest.raises(InputError, match="pid"):
        TOOLS["run_stacks"].call({"pid": 1})


def test_placement_survives_an_nvml_worker_that_dies_reading_a_gpu(monkeypatch):
    """NvmlCrash (the worker process died) is a note like a hang, never a traceback out of run_status."""
    from remote_gpu_trainer.nvml_session import NvmlCrash

    backend = shared_gpu().backend

    def dies(index: int):
        raise NvmlCrash(f"GPU {index}", "nvmlDeviceGetUtilizationRates", "SIGKILL")

    monkeypatch.setattr(backend, "read_gpu", dies)  # the fake NVML's read, as a worker killed mid-call ends it
    placement = gpu_placement({7101: 0, 7102: 1, 7103: 2}, ["0,1,2,3"] * 3, backend)
    assert [(r.rank, r.gpus) for r in placement.ranks] == [(0, [0]), (1, [0]), (2, [1])]
    assert all(g.util_percent is None for g in placement.gpus)
    assert "did not answer" in placement.note and "worker process died" in placement.note, placement.note


def test_py_spy_started_by_the_supervisor_is_not_a_process_of_the_run(runs_dir, tmp_path, monkeypatch):
    """At a stall of a run without the rank hook the supervisor runs py-spy: it must not join the run's session
    unmarked, or run_stop would count it (and could kill it) and a dry-run token would go stale when it exits."""
    from remote_gpu_trainer.runs import tool as run_tool
    from remote_gpu_trainer.runs.ledger import RunDir

    bin_dir, seen = tmp_path / "bin", tmp_path / "py-spy.pids"
    bin_dir.mkdir()
    fake = bin_dir / "py-spy"  # a slow stand-in, so the test can look while it runs
    fake.write_text(f"#!/bin/sh\necho $$ >> {seen}\nsleep 4\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    started = run_tool.SPECS[0].call({"argv": [sys.executable, "-c", "import time; time.sleep(60)"],
                                      "cwd": str(tmp_path), "rank_hook": False, "stall_after_s": 1})
    spy = int(_wait_file(seen, "\n", timeout_s=20).split()[0])
    members = run_tool.run_pids(RunDir(runs_dir / started.run_id))
    assert started.pid in members and spy not in members, (spy, members)
    assert os.getsid(spy) != os.getsid(started.pid)


def test_a_py_spy_that_never_answers_costs_the_timeout_once_not_once_per_round(tmp_path, monkeypatch):
    """collect's timeout_s bounds the py-spy phase as a whole: the second sample gets what the first left."""
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")  # a py-spy stuck on a process it cannot read
    fake.chmod(0o755)
    monkeypatch.setattr(stacks_module, "py_spy_path", lambda: str(fake))
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        began = time.monotonic()
        [stacks] = collect([target.pid], None, timeout_s=2.0)
        took = time.monotonic() - began
    finally:
        target.kill()
        target.wait()
    assert "timed out" in (stacks.error or ""), stacks
    assert took < 3.0, f"the py-spy phase took {took:.1f} s with timeout_s=2"


def test_prune_keeps_the_file_of_a_process_being_armed_and_removes_a_gone_ones(tmp_path):
    """The hook creates its file, then writes the record: a file without a record whose pid lives is a process
    being armed (pruning it left a DataLoader worker unreadable under load); one whose pid is gone is litter."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        (tmp_path / f"{live.pid}.txt").write_text("")  # created, record not written yet
        (tmp_path / f"{gone.pid}.txt").write_text("")
        assert stacks_module.prune(tmp_path) == 1
        assert sorted(p.name for p in tmp_path.glob("*.txt")) == [f"{live.pid}.txt"]
    finally:
        live.kill()
        live.wait()
