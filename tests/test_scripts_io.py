"""Box-side scripts that move and check data: mem_monitor.sh, download_loop.sh, aggregate_to_fs.sh,
setup-china-mirrors.sh, check_staleness.py and verify_local.py, each run for real on temp files,
local HTTP servers and real processes."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .test_scripts_support import fake_env, run_script

# ---------------------------------------------------------------------------------- mem_monitor.sh

GIB = 1 << 30


def _cgroup_v2(folder: Path, current: int, limit: str, oom_kill: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.current").write_text(f"{current}\n")
    (folder / "memory.max").write_text(f"{limit}\n")
    (folder / "memory.peak").write_text(f"{current + GIB}\n")
    (folder / "memory.stat").write_text(f"anon {current - GIB}\nfile {GIB}\nshmem 1048576\ninactive_file {GIB // 2}\n")
    (folder / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kill}\n")
    return folder


def _cgroup_v1(folder: Path, usage: int, limit: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (folder / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (folder / "memory.max_usage_in_bytes").write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(f"cache 0\nrss 0\ntotal_cache {GIB}\ntotal_rss {usage - GIB}\n"
                                        f"total_shmem 0\ntotal_inactive_file {GIB}\n")
    (folder / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    return folder


def test_mem_monitor_reads_the_cgroup_limit_not_the_host(tmp_path):
    cg = _cgroup_v2(tmp_path / "cg", current=10 * GIB, limit=str(16 * GIB))
    result = run_script("mem_monitor.sh", "--once", env=fake_env(RGT_CGROUP_DIR=str(cg)))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split(":")[0].strip(): line for line in result.stdout.splitlines()}
    assert "16.00 GiB" in lines["limit"]
    assert "10.00 GiB" in lines["usage"]
    # working set = usage - inactive file cache = 9.5 GiB = 59 % of 16 GiB
    assert "9.50 GiB = 59% of the limit" in lines["working set"]
    assert "11.00 GiB" in lines["peak"] and lines["oom kills"].endswith("0")
    assert "not this container's limit" in result.stdout


def test_mem_monitor_alerts_at_the_threshold(tmp_path):
    cg = _cgroup_v2(tmp_path / "cg", current=15 * GIB, limit=str(16 * GIB))
    result = run_script("mem_monitor.sh", "--once", "--warn-pct", "80", env=fake_env(RGT_CGROUP_DIR=str(cg)))
    assert result.returncode == 1 and "ALERT: working set at 90% of the limit" in result.stdout


def test_mem_monitor_survives_a_process_list_larger_than_a_pipe(tmp_path):
    """CI once failed with exit 141: `sort | head` under pipefail, where head quits after K lines and
    sort, still writing a list bigger than the pipe buffer, dies of SIGPIPE. 3000 processes make the
    sorted list ~100 KB, past the 64 KB pipe buffer, so the old pipeline fails here every time."""
    proc = tmp_path / "proc"
    for pid in range(1000, 4000):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\tpython\nVmRSS:\t{pid} kB\n")
        (proc / str(pid) / "cmdline").write_bytes(b"python\0train.py\0--config\0cfg.yaml\0")
    cg = _cgroup_v2(tmp_path / "cg", current=15 * GIB, limit=str(16 * GIB))
    env = fake_env(RGT_CGROUP_DIR=str(cg), RGT_PROC_DIR=str(proc))
    result = run_script("mem_monitor.sh", "--once", "--top", "2", "--warn-pct", "80", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ALERT: working set at 90% of the limit" in result.stdout
    listed = [line for line in result.stdout.splitlines() if "pid " in line]
    assert [line.split()[3] for line in listed] == ["3999", "3998"]
    sampled = run_script("mem_monitor.sh", "--interval", "1", "--count", "1", env=env)  # 90% >= default 90: alert
    assert sampled.returncode == 1 and "pid 3999" in sampled.stdout, sampled.stdout + sampled.stderr


def test_mem_monitor_cgroup_v1_and_unlimited(tmp_path):
    cg = _cgroup_v1(tmp_path / "v1", usage=4 * GIB, limit=9223372036854771712)
    result = run_script("mem_monitor.sh", "--once", env=fake_env(RGT_CGROUP_DIR=str(cg)))
    assert result.returncode == 0
    assert "cgroup v1" in result.stdout and "none (host RAM" in result.stdout
    assert "working set:  3.00 GiB" in result.stdout and "oom kills:    2" in result.stdout


def test_mem_monitor_samples_to_csv_and_flags_a_new_oom_kill(tmp_path):
    cg = _cgroup_v2(tmp_path / "cg", current=2 * GIB, limit="max")
    csv = tmp_path / "mem.csv"

    def bump():  # the OOM killer strikes after the first sample
        time.sleep(0.6)
        (cg / "memory.events").write_text("oom 2\noom_kill 1\n")

    thread = threading.Thread(target=bump)
    thread.start()
    result = run_script("mem_monitor.sh", "--count", "3", "--interval", "0.5", "--csv", str(csv),
                        env=fake_env(RGT_CGROUP_DIR=str(cg)))
    thread.join()
    assert result.returncode == 1, result.stdout
    assert "OOM KILL (+1)" in result.stdout and "oom kills 0 -> 1" in result.stdout
    rows = csv.read_text().splitlines()
    assert rows[0].startswith("time,usage_bytes,working_set_bytes,limit_bytes")
    assert len(rows) == 4 and rows[1].split(",")[1] == str(2 * GIB)


def test_mem_monitor_finds_this_machines_cgroup():
    result = run_script("mem_monitor.sh", "--once")
    assert result.returncode in (0, 1, 3), result.stderr
    if result.returncode == 3:
        assert "NOT a container limit" in result.stdout
    else:
        assert result.stdout.startswith("cgroup v")


# --------------------------------------------------------------------------------- download_loop.sh


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture
def http_file():
    """A local HTTP server for one payload that honours Range requests. ``behaviour`` controls the first
    request: 'drop' closes the connection half-way, 'stall' sends half and then hangs."""
    payload = os.urandom(300_000)
    state = {"behaviour": "ok", "ranges": [], "requests": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            state["requests"] += 1
            start = 0
            header = self.headers.get("Range")
            state["ranges"].append(header)
            if header:
                start = int(header.split("=")[1].split("-")[0])
                if start >= len(payload):
                    self.send_response(416)
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(payload) - 1}/{len(payload)}")
            else:
                self.send_response(200)
            body = payload[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            first = state["requests"] == 1
            if first and state["behaviour"] in ("drop", "stall"):
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                if state["behaviour"] == "stall":
                    time.sleep(30)
                return  # the connection closes short of Content-Length
            self.wfile.write(body)

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/model.bin"
    state["payload"] = payload
    state["sha256"] = hashlib.sha256(payload).hexdigest()
    yield state
    server.shutdown()


def download(*args: str, timeout: float = 60, **extra: str):
    return run_script("download_loop.sh", "--backoff", "0", "--poll", "1", *args, env=fake_env(**extra),
                      timeout=timeout)


def test_dropped_connection_resumes_with_a_range_request(http_file, tmp_path):
    http_file["behaviour"] = "drop"
    out = tmp_path / "models" / "model.bin"
    result = download("--url", http_file["url"], "--out", str(out), "--sha256", http_file["sha256"],
                      "--size", str(len(http_file["payload"])))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == http_file["payload"]
    assert http_file["ranges"] == [None, f"bytes={len(http_file['payload']) // 2}-"]
    assert "attempt 1 failed" in result.stderr and "sha256 ok" in result.stderr
    assert not out.with_name("model.bin.part").exists()


def test_stalled_download_is_killed_and_resumed(http_file, tmp_path):
    http_file["behaviour"] = "stall"
    out = tmp_path / "model.bin"
    started = time.monotonic()
    result = download("--url", http_file["url"], "--out", str(out), "--stall", "2", "--sha256", http_file["sha256"])
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 20
    assert "no progress for" in result.stderr and out.read_bytes() == http_file["payload"]
    assert http_file["ranges"][1] == f"bytes={len(http_file['payload']) // 2}-"


def test_checksum_mismatch_is_a_verification_failure(http_file, tmp_path):
    out = tmp_path / "model.bin"
    result = download("--url", http_file["url"], "--out", str(out), "--sha256", "0" * 64)
    assert result.returncode == 3 and "sha256 mismatch" in result.stderr
    assert not out.exists() and out.with_name("model.bin.corrupt").exists()


def test_command_mode_retries_until_success_and_gives_up(tmp_path):
    counter = tmp_path / "n"
    flaky = f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; [ $((n+1)) -ge 3 ]"
    ok = download("--attempts", "5", "--", "bash", "-c", flaky)
    assert ok.returncode == 0 and counter.read_text().strip() == "3"
    assert "attempt 3 succeeded" in ok.stderr
    failing = download("--attempts", "2", "--", "false")
    assert failing.returncode == 1 and "all 2 attempts failed" in failing.stderr


def test_attempt_timeout_kills_the_whole_attempt(tmp_path):
    marker = tmp_path / "child-survived"
    command = f"(sleep 3; touch {marker}) & sleep 30"
    result = download("--attempts", "1", "--attempt-timeout", "1", "--", "bash", "-c", command)
    assert result.returncode == 1 and "timed out or stalled" in result.stderr
    time.sleep(3.5)
    assert not marker.exists(), "a child of the attempt outlived the timeout"


def test_hf_mode_uses_safe_settings_and_verifies_shards(tmp_path):
    target = tmp_path / "models" / "tiny"
    result = download("--hf", "org/tiny-model", "--local-dir", str(target), FAKE_HF_MODE="fail_first")
    assert result.returncode == 0, result.stderr
    env = json.loads((target / ".env.json").read_text())
    assert env["HF_HUB_ENABLE_HF_TRANSFER"] == "0"
    assert env["HF_HUB_DOWNLOAD_TIMEOUT"] == "60" and env["HF_HUB_ETAG_TIMEOUT"] == "30"
    assert (target / ".calls").read_text() == "2" and "1 tensors" in result.stderr


@pytest.mark.parametrize(("mode", "message"), [("corrupt", "lies outside"), ("incomplete", "interrupted download")])
def test_hf_mode_rejects_truncated_or_incomplete_downloads(tmp_path, mode, message):
    result = download("--hf", "org/tiny-model", "--local-dir", str(tmp_path / "m"), FAKE_HF_MODE=mode)
    assert result.returncode == 3 and message in result.stderr


def test_network_setup_runs_before_and_teardown_after(tmp_path):
    seen = tmp_path / "seen"
    teardown = tmp_path / "teardown"
    result = download("--network-setup", "export http_proxy=http://10.0.0.1:3128",
                      "--network-teardown", f"touch {teardown}",
                      "--", "bash", "-c", f'echo "$http_proxy" > {seen}')
    assert result.returncode == 0
    assert seen.read_text().strip() == "http://10.0.0.1:3128" and teardown.exists()


def test_download_usage_errors():
    assert download("--url", "http://x/y").returncode == 2  # no --out
    assert download("--hf", "org/model").returncode == 2  # no --local-dir
    assert download("--url", "file:///etc/passwd", "--out", "x").returncode == 2
    assert download("--url", "http://x/y", "--out", "o", "--", "true").returncode == 2


# -------------------------------------------------------------------------------- aggregate_to_fs.sh


@pytest.fixture
def runs(tmp_path):
    src = tmp_path / "runs"
    done = src / "exp-a-s1"
    (done / "checkpoint-10").mkdir(parents=True)
    (done / "checkpoint-20").mkdir()
    (done / "exit_code").write_text("0\n")
    (done / "metrics.jsonl").write_text('{"step": 20, "loss": 0.5}\n')
    (done / "checkpoint-10" / "model.pt").write_bytes(os.urandom(50_000))
    (done / "checkpoint-10" / "COMPLETE").touch()
    (done / "checkpoint-20" / "model.pt").write_bytes(b"half")  # still saving: no marker
    (done / "final.safetensors").write_bytes(os.urandom(20_000))
    (done / "pgid").write_text("4242\n")
    live = src / "exp-b-s1"
    live.mkdir()
    (live / "train.log").write_text("step 5\n")
    (live / "ckpt.tmp.123").write_bytes(b"partial")
    return src


def test_aggregate_copies_small_artifacts_and_verifies(runs, tmp_path):
    dest = tmp_path / "durable"
    result = run_script("aggregate_to_fs.sh", str(runs), str(dest))
    assert result.returncode == 0, result.stdout + result.stderr
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == ["exp-a-s1/MANIFEST.sha256", "exp-a-s1/exit_code", "exp-a-s1/metrics.jsonl",
                      "exp-b-s1/MANIFEST.sha256", "exp-b-s1/train.log"]
    check = subprocess.run(["sha256sum", "-c", "MANIFEST.sha256"], cwd=dest / "exp-a-s1", capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout
    assert "exp-b-s1: no exit_code file" in result.stdout


def test_aggregate_checkpoints_only_when_complete(runs, tmp_path):
    dest = tmp_path / "durable"
    result = run_script("aggregate_to_fs.sh", "--include-checkpoints", str(runs), str(dest))
    assert result.returncode == 0
    assert (dest / "exp-a-s1" / "checkpoint-10" / "model.pt").read_bytes() == \
        (runs / "exp-a-s1" / "checkpoint-10" / "model.pt").read_bytes()
    assert not (dest / "exp-a-s1" / "checkpoint-20").exists()
    assert "checkpoint-20: no COMPLETE marker" in result.stdout
    assert (dest / "exp-a-s1" / "final.safetensors").exists()
    assert not list(dest.rglob("*.tmp*")) and not (dest / "exp-a-s1" / "pgid").exists()
    # a second pass without checkpoints keeps their manifest lines
    again = run_script("aggregate_to_fs.sh", str(runs), str(dest))
    assert "0 copied" in again.stdout
    assert "checkpoint-10/model.pt" in (dest / "exp-a-s1" / "MANIFEST.sha256").read_text()


def test_aggregate_detects_a_corrupted_copy(runs, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real_cp = shutil.which("cp")
    fake_cp = bin_dir / "cp"  # copies, then flips the first byte of the copy
    fake_cp.write_text(f'#!/usr/bin/env bash\n{real_cp} "$@" || exit $?\nlast="${{@: -1}}"\n'
                       'printf "X" | dd of="$last" bs=1 count=1 conv=notrunc 2>/dev/null\n')
    fake_cp.chmod(0o755)
    env = fake_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    result = run_script("aggregate_to_fs.sh", str(runs), str(tmp_path / "durable"), env=env)
    assert result.returncode == 1 and "sha256 differs after copy" in result.stdout


def test_aggregate_expect_lists_missing_runs(runs, tmp_path):
    expect = tmp_path / "expected.txt"
    expect.write_text("exp-a-s1\nexp-b-s1\nexp-c-s1\n")
    result = run_script("aggregate_to_fs.sh", "--expect", str(expect), str(runs), str(tmp_path / "d"))
    assert result.returncode == 3
    assert "missing or without exit_code: exp-b-s1 exp-c-s1" in result.stdout


def test_aggregate_dry_run_copies_nothing(runs, tmp_path):
    dest = tmp_path / "d"
    result = run_script("aggregate_to_fs.sh", "--dry-run", str(runs), str(dest))
    assert result.returncode == 0 and "would copy exp-a-s1/metrics.jsonl" in result.stdout
    assert not dest.exists()


def test_aggregate_refuses_dest_inside_src(runs):
    assert run_script("aggregate_to_fs.sh", str(runs), str(runs / "exp-a-s1")).returncode == 2


# ------------------------------------------------------------------------------ setup-china-mirrors.sh


def _snapshot(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


def mirrors(home: Path, *args: str, **extra: str):
    env = fake_env(HOME=str(home), **extra)
    env.pop("PIP_CONFIG_FILE", None)
    env.pop("PIP_INDEX_URL", None)
    return run_script("setup-china-mirrors.sh", *args, env=env)


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".bashrc").write_text("alias ll='ls -l'\n")
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\nno-cache-dir = true\n")
    return home


def test_mirrors_dry_run_changes_nothing(home):
    before = _snapshot(home)
    result = mirrors(home, "--only", "pip,conda,hf")
    assert result.returncode == 0 and result.stdout.count("would:") == 3
    assert _snapshot(home) == before


def test_mirrors_apply_then_revert_restores_every_byte(home, tmp_path):
    before = _snapshot(home)
    dirs_before = sorted(str(p) for p in home.rglob("*") if p.is_dir())
    env_no_conda = {"PATH": f"/usr/bin:/bin:{Path(sys.executable).parent}"}
    applied = mirrors(home, "--apply", "--mirror", "ustc", **env_no_conda)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    pip_conf = (home / ".config" / "pip" / "pip.conf").read_text()
    assert "index-url = https://mirrors.ustc.edu.cn/pypi/simple" in pip_conf and "no-cache-dir = true" in pip_conf
    assert "https://mirrors.ustc.edu.cn/anaconda/cloud" in (home / ".condarc").read_text()
    shell = subprocess.run(["bash", "-c", f"HOME={home}; . {home}/.bashrc; echo $HF_ENDPOINT"],
                           capture_output=True, text=True)
    assert shell.stdout.strip() == "https://hf-mirror.com"
    assert mirrors(home, "--apply").returncode == 3  # already applied
    reverted = mirrors(home, "--revert")
    assert reverted.returncode == 0, reverted.stdout
    assert _snapshot(home) == before
    assert sorted(str(p) for p in home.rglob("*") if p.is_dir()) == dirs_before
    assert mirrors(home, "--revert").returncode == 3


def test_mirrors_edit_an_existing_condarc_with_conda_config(home, tmp_path):
    (home / ".condarc").write_text("envs_dirs:\n  - /data/envs\n")
    log = tmp_path / "conda.log"
    result = mirrors(home, "--apply", "--only", "conda", FAKE_CONDA_LOG=str(log))
    assert result.returncode == 0
    calls = log.read_text().splitlines()
    main = "https://mirrors.tuna.tsinghua.edu.cn/anaconda/pkgs/main"
    assert f"config --file {home}/.condarc --append default_channels {main}" in calls
    assert any("custom_channels.conda-forge" in c for c in calls)


def test_mirrors_leave_a_condarc_alone_without_conda(home):
    (home / ".condarc").write_text("envs_dirs:\n  - /data/envs\n")
    result = mirrors(home, "--apply", "--only", "conda", PATH=f"/usr/bin:/bin:{Path(sys.executable).parent}")
    assert result.returncode == 0 and "left unchanged" in result.stdout
    assert (home / ".condarc").read_text() == "envs_dirs:\n  - /data/envs\n"


def test_mirrors_reject_unknown_mirror(home):
    result = mirrors(home, "--mirror", "nowhere")
    assert result.returncode == 2 and "tuna, ustc, aliyun, bfsu" in result.stderr


# ------------------------------------------------------------------------------------ check_staleness.py


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "runs" / "exp1"
    folder.mkdir(parents=True)
    (folder / "train.log").write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    return folder


@pytest.fixture
def recorded_group(run_dir):
    """Start a stand-in run: a process group whose members carry RGT_RUN_TOKEN=carried (as run_one's
    jobs do), recorded in RUN_DIR/pgid with RUN_DIR/token=recorded. Killed (by its group id) at the end."""
    started: list[subprocess.Popen] = []

    def start(carried: str, recorded: str) -> subprocess.Popen:
        proc = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True,
                                env={**os.environ, "RGT_RUN_TOKEN": carried})
        started.append(proc)
        (run_dir / "pgid").write_text(f"{proc.pid}\n")
        (run_dir / "token").write_text(f"{recorded}\n")
        return proc

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def staleness(*args: str):
    return run_script("check_staleness.py", *args, env=fake_env("healthy-h100x2"))


def test_fresh_heartbeat_of_a_live_group_is_running(run_dir, recorded_group):
    recorded_group("tok-1", "tok-1")
    (run_dir / "heartbeat").write_text(f"120 {time.time()}\n")
    result = staleness(str(run_dir), "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["state"] == "running"
    assert report["progress"]["source"] == "heartbeat" and report["progress"]["step"] == 120


def test_old_heartbeat_is_stale_and_stopped_group_is_flagged(run_dir, recorded_group):
    proc = recorded_group("tok-2", "tok-2")
    beat = run_dir / "heartbeat"
    beat.write_text("7\n")
    old = time.time() - 900
    os.utime(beat, (old, old))
    stale = staleness(str(run_dir), "--max-age", "600", "--gpu")
    assert stale.returncode == 1 and stale.stdout.startswith("STALE:")
    assert "GPUs idle (0 %)" in stale.stdout
    os.killpg(proc.pid, signal.SIGSTOP)
    time.sleep(0.2)
    stopped = staleness(str(run_dir))
    assert stopped.returncode == 1 and stopped.stdout.startswith("STOPPED:")


def test_reused_group_id_without_the_token_is_not_the_run(run_dir, recorded_group):
    recorded_group("someone-else", "tok-3")
    result = staleness(str(run_dir))
    assert result.returncode == 1 and result.stdout.startswith("DEAD:")
    assert "belongs to other processes" in result.stdout


def test_exit_code_decides_finished_or_failed(run_dir):
    (run_dir / "pgid").write_text("999999\n")
    (run_dir / "exit_code").write_text("0\n")
    assert staleness(str(run_dir)).returncode == 3
    (run_dir / "exit_code").write_text("137\n")
    failed = staleness(str(run_dir))
    assert failed.returncode == 1 and "137=SIGKILL" in failed.stdout
    (run_dir / "exit_code").unlink()
    dead = staleness(str(run_dir))
    assert dead.returncode == 1 and dead.stdout.startswith("DEAD:")


def test_nothing_to_judge_is_unknown(tmp_path):
    assert staleness(str(tmp_path)).returncode == 4


# -------------------------------------------------------------------------------------- verify_local.py


def _safetensors(path: Path, truncate: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    blob = struct.pack("<Q", len(header)) + header + bytes(16)
    path.write_bytes(blob[: len(blob) - truncate])


@pytest.fixture
def artifacts(tmp_path):
    import torch

    run = tmp_path / "run"
    (run / "checkpoint-40").mkdir(parents=True)
    torch.save({"step": 40, "model": {"w": torch.ones(3)}}, run / "checkpoint-40" / "state.pt")
    (run / "checkpoint-40" / "COMPLETE").touch()
    torch.save({"step": 20, "model": {"w": torch.ones(3)}}, run / "early.pt")
    _safetensors(run / "model.safetensors")
    (run / "metrics.jsonl").write_text('{"step": 20, "loss": 1.0}\n{"step": 40, "loss": 0.8}\n')
    (run / "config.json").write_text('{"lr": 0.001}')
    (run / "exit_code").write_text("0\n")
    return run


def verify(*args: str):
    return run_script("verify_local.py", *args, timeout=120)


def test_verify_loads_checkpoints_safely_and_checks_the_step(artifacts, tmp_path):
    manifest = tmp_path / "MANIFEST.sha256"
    result = verify(str(artifacts), "--expect-step", "40", "--require-marker", "COMPLETE", "--write-manifest",
                    str(manifest), "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout
    assert report["torch"] is True
    by_path = {Path(f["path"]).name: f for f in report["findings"]}
    assert by_path["state.pt"]["step"] == 40 and "weights_only=True" in by_path["state.pt"]["what"]
    assert by_path["model.safetensors"]["verdict"] == "PASS"
    assert len(manifest.read_text().splitlines()) == 6
    assert verify("--manifest", str(manifest), "--no-torch").returncode == 0


def test_verify_fails_on_truncation_missing_marker_and_short_runs(artifacts):
    state = artifacts / "checkpoint-40" / "state.pt"
    state.write_bytes(state.read_bytes()[:200])
    (artifacts / "checkpoint-40" / "COMPLETE").unlink()
    _safetensors(artifacts / "model.safetensors", truncate=4)
    with (artifacts / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 41, "lo')
    result = verify(str(artifacts), "--require-marker", "COMPLETE", "--expect-step", "40")
    assert result.returncode == 1
    text = result.stdout
    assert "no COMPLETE marker" in text and "torch.load failed" in text
    assert "lies outside" in text and "last line (truncated write?)" in text
    assert "newest checkpoint is at step 20, expected 40" in text


def test_verify_without_torch_still_catches_a_truncated_save(artifacts):
    state = artifacts / "checkpoint-40" / "state.pt"
    state.write_bytes(state.read_bytes()[:200])
    result = verify(str(state), str(artifacts / "early.pt"), "--no-torch")
    assert result.returncode == 1
    assert "truncated save" in result.stdout and "torch zip archive intact" in result.stdout


def test_verify_refuses_a_pickle_that_needs_weights_only_false(tmp_path):
    import torch

    path = tmp_path / "custom.pt"
    torch.save({"step": 1, "obj": Path("/tmp")}, path)
    result = verify(str(path))
    assert result.returncode == 0 and "WARN" in result.stdout and "weights_only=False" in result.stdout


def test_verify_manifest_mismatch_and_bad_exit_code(artifacts, tmp_path):
    manifest = artifacts / "MANIFEST.sha256"
    manifest.write_text(f"{'0' * 64}  config.json\n")
    (artifacts / "exit_code").write_text("1\n")
    result = verify("--manifest", str(manifest), str(artifacts / "exit_code"))
    assert result.returncode == 1
    assert "sha256 differs" in result.stdout and "exit code '1'" in result.stdout


def test_verify_nothing_recognised_is_exit_3(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert verify(str(tmp_path)).returncode == 3
