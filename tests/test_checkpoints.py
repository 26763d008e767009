"""Will tonight's checkpoints fit? Free space and inodes against checkpoint size × saves before the horizon, the
filesystem type (tmpfs is lost on a stop), the provider's durable path, the newest checkpoint's integrity and,
when asked, a load test under the run's own python. Small real tmpfs mounts where root may mount them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from remote_gpu_trainer.models import Verdict
from remote_gpu_trainer.runs.checkpoints import checkpoint_outlook
from remote_gpu_trainer.runs.progress import Progress

NIGHT_S = 8 * 3600


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a small real tmpfs (root only); unmounted at the end."""
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        path = tmp_path / name
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def torch_like_zip(path: Path, payload: int, seed: int = 0) -> None:
    """A file laid out like torch.save's zip archive (``<name>/data.pkl`` plus tensor records), stored uncompressed."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{path.stem}/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr(f"{path.stem}/data/0", os.urandom(payload) if seed == 0 else bytes([seed]) * payload)


def test_a_checkpoint_folder_on_a_small_tmpfs_that_will_fill_is_flagged(tmpfs):
    folder = tmpfs("ckpt", "size=1m")
    torch_like_zip(folder / "checkpoint-10.pt", 300_000)
    torch_like_zip(folder / "checkpoint-20.pt", 300_000)
    outlook = checkpoint_outlook(folder, progress=Progress(step=25, total=1000, throughput=2.0,
                                                           throughput_unit="it/s"), horizon_s=NIGHT_S)
    assert outlook.verdict is Verdict.FAIL
    assert outlook.filesystem == "tmpfs" and outlook.lost_on_stop
    assert outlook.save_every_steps == 10 and outlook.newest.endswith("checkpoint-20.pt")
    assert outlook.next_save_in_s == pytest.approx(2.5, abs=0.01)  # step 30 at 2 steps/s
    assert outlook.saves_ahead >= 2 and outlook.needed_bytes > outlook.free_bytes
    assert "will not fit" in outlook.summary and "tmpfs" in outlook.summary
    assert outlook.integrity.startswith("ok")


def test_inodes_run_out_before_bytes(tmpfs):
    folder = tmpfs("ckpt-inodes", "size=64m,nr_inodes=40")
    for step in (100, 200):
        shard = folder / f"checkpoint-{step}"
        shard.mkdir()
        for i in range(10):
            (shard / f"part-{i}.json").write_text("{}")
    outlook = checkpoint_outlook(folder, progress=Progress(step=250, total=10_000, throughput=1.0,
                                                           throughput_unit="it/s"), horizon_s=NIGHT_S)
    assert outlook.verdict is Verdict.FAIL and "inode" in outlook.summary
    assert outlook.files_per_checkpoint == 11  # ten files and the folder itself


def test_keep_last_counts_every_checkpoint_in_the_folder_not_only_the_newest_few_read(tmpfs):
    """keep_last=10 with 10 checkpoints already there: one more save lands before the oldest goes, so one save of
    space is needed, not keep_last + 1 - 3 (saved_checkpoints reads only the newest 3)."""
    folder = tmpfs("ckpt-kept", "size=1400k")
    for step in range(10, 110, 10):
        torch_like_zip(folder / f"checkpoint-{step}.pt", 100_000, seed=step)
        os.utime(folder / f"checkpoint-{step}.pt", (time.time() - 1000 + step, time.time() - 1000 + step))
    outlook = checkpoint_outlook(folder, progress=Progress(step=105, total=10_000, throughput=1.0,
                                                           throughput_unit="it/s"), horizon_s=NIGHT_S, keep_last=10)
    assert outlook.saves_ahead > 8 and outlook.free_bytes < 8 * outlook.newest_bytes
    assert outlook.needed_bytes == outlook.newest_bytes, outlook.summary
    assert outlook.verdict is Verdict.WARN and "fits" in outlook.summary, outlook.summary  # WARN: tmpfs, RAM


def test_truncated_checkpoints_are_found_by_their_headers(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    torch_like_zip(good / "step_100.pt", 10_000)
    assert checkpoint_outlook(good, progress=None, horizon_s=NIGHT_S).integrity.startswith("ok")
    cut = tmp_path / "cut"
    cut.mkdir()
    data = (good / "step_100.pt").read_bytes()
    (cut / "step_100.pt").write_bytes(data[: len(data) - 200])
    outlook = checkpoint_outlook(cut, progress=None, horizon_s=NIGHT_S)
    assert outlook.verdict is Verdict.FAIL and "central directory" in outlook.integrity

    import json
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [256], "data_offsets": [0, 1024]}}).encode()
    tensors = tmp_path / "st"
    tensors.mkdir()
    (tensors / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 1024)
    assert checkpoint_outlook(tensors, progress=None, horizon_s=NIGHT_S).integrity.startswith("ok")
    (tensors / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 1000)
    short = checkpoint_outlook(tensors, progress=None, horizon_s=NIGHT_S)
    assert short.verdict is Verdict.FAIL and "1024" in short.integrity and "1000" in short.integrity


def test_a_load_test_runs_only_when_asked_and_under_the_given_python(tmp_path):
    torch = pytest.importorskip("torch")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    torch.save({"w": torch.ones(3)}, folder / "last.pt")
    assert checkpoint_outlook(folder, progress=None, horizon_s=NIGHT_S).load_test is None
    outlook = checkpoint_outlook(folder, progress=None, horizon_s=NIGHT_S, python=sys.executable, load_test=True)
    assert outlook.load_test.startswith("loaded") and sys.executable in outlook.load_test


def test_a_folder_outside_the_providers_volume_is_flagged_from_the_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNPOD_POD_ID", "pod-1")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    torch_like_zip(folder / "checkpoint-1.pt", 1000)
    outlook = checkpoint_outlook(folder, progress=None, horizon_s=NIGHT_S)
    assert outlook.verdict is Verdict.WARN
    assert any("/workspace" in f and "runpod" in f.lower() for f in outlook.findings), outlook.findings


TQDM = """import sys, time
for step in range(1, 26):
    print(f" {step * 100 // 1000}%|  | {step}/1000 [00:12<08:07,  2.00it/s]", flush=True)
time.sleep(600)
"""


def test_run_status_and_box_idle_show_the_verdict(tmpfs, tmp_path, monkeypatch):
    from remote_gpu_trainer.registry import all_specs

    monkeypatch.setenv("RGT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RGT_GUARD_DIR", str(tmp_path / "guard"))
    monkeypatch.setenv("RGT_CUSTODY_DIR", str(tmp_path / "custody"))
    monkeypatch.delenv("RGT_HEALTH_FAKE", raising=False)
    tools = {spec.name: spec for spec in all_specs()}
    folder = tmpfs("ckpt-run", "size=1m")
    torch_like_zip(folder / "checkpoint-10.pt", 300_000)
    torch_like_zip(folder / "checkpoint-20.pt", 300_000)
    started = tools["run_start"].call({"argv": [sys.executable, "-c", TQDM], "cwd": str(tmp_path),
                                       "checkpoint_dir": str(folder), "save_every_steps": 10})
    try:
        end = time.monotonic() + 30
        status = tools["run_status"].call({"run_id": started.run_id})
        while not (status.progress and status.progress.step == 25) and time.monotonic() < end:
            time.sleep(0.2)
            status = tools["run_status"].call({"run_id": started.run_id})
        assert status.checkpoints and status.checkpoints.verdict is Verdict.FAIL, status.checkpoints
        idle = tools["box_idle"].call({"window_s": 0})
        [row] = [r for r in idle.runs if r.run_id == started.run_id]
        assert row.checkpoints and row.checkpoints.verdict is Verdict.FAIL
        assert "will not fit" in tools["box_idle"].render_text(idle)
    finally:
        os.kill(started.pid, 9)
