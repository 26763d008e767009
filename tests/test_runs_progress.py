"""Progress parsing from log tails, GPU use of a run's pids on a fake NVML, and the unreachable answer."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from remote_gpu_trainer.health.backend import GpuProcess, Memory
from remote_gpu_trainer.health.fakes import OK_STATUS, FakeBackend, h100
from remote_gpu_trainer.remote.errors import RemoteError
from remote_gpu_trainer.runs.gpu import gpus_idle, run_gpu_use
from remote_gpu_trainer.runs.progress import TAIL_BYTES, parse_progress, progress_of
from remote_gpu_trainer.runs.start import rendezvous_port, split_command
from remote_gpu_trainer.runs.tool import RunStatusInput, status_when_unreachable

CASES = {
    "hf": ("{'loss': 2.3456, 'grad_norm': 1.02, 'learning_rate': 4.5e-05, 'epoch': 0.5}\n"
           " 45%|████▌     | 450/1000 [01:23<01:40,  5.47it/s]",
           dict(step=450, total=1000, loss=2.3456, epoch=0.5, learning_rate=4.5e-05, throughput=5.47, eta_s=100.0)),
    "lightning": ("Epoch 3:  45%|████▌     | 450/1000 [01:23<01:40, 5.47it/s, v_num=0, train_loss=0.123]\r",
                  dict(step=450, total=1000, loss=0.123, epoch=3.0)),
    "accelerate": ("Steps:  12%|█▏        | 120/1000 [00:10<01:20, 11.0it/s, step_loss=0.51, lr=1e-4]",
                   dict(step=120, loss=0.51, learning_rate=1e-4, eta_s=80.0)),
    "torchtitan": ("\x1b[31m[rank0]:[titan] - root - INFO - step: 10  loss:  7.9843  memory: 30.12GiB(31.70%)  "
                   "tps: 5,422  tflops: 310.5\x1b[39m", dict(step=10, loss=7.9843, throughput=5422.0,
                                                            throughput_unit="tokens/s")),
    "plain": ("step 120/1000 | loss 2.314 | lr 3e-4 | 812.5 samples/s",
              dict(step=120, total=1000, loss=2.314, throughput=812.5, throughput_unit="samples/s")),
    "slow_tqdm": (" 3/100 [00:30<16:10, 10.00s/it]", dict(step=3, total=100, throughput=0.1, eta_s=970.0)),
}


@pytest.mark.parametrize("name", CASES)
def test_formats(name):
    text, expected = CASES[name]
    got = parse_progress(text).model_dump()
    assert {k: got[k] for k in expected} == expected


def test_newest_values_win_and_step_total_come_from_one_line():
    text = "step 5/10 loss 3.0\nstep: 7  loss: 2.0\n"
    got = parse_progress(text)
    assert (got.step, got.total, got.loss) == (7, None, 2.0)


def test_val_loss_and_loss_scale_are_not_the_loss():
    assert parse_progress("val_loss=3.0 loss_scale: 65536").loss is None


def test_only_the_tail_of_a_big_log_is_read(tmp_path):
    log = tmp_path / "log"
    with open(log, "wb") as out:
        out.write(b"step 1/9 loss 9.0\n" * 300_000)  # ~5 MB of old progress
        out.write(b"step 9/9 loss 0.25\n")
    got = progress_of(log)
    assert (got.step, got.loss) == (9, 0.25)
    assert got.bytes_read == TAIL_BYTES


def test_gpu_use_of_the_runs_own_pids_on_a_fake_nvml():
    me, other = os.getpid(), 999_999
    gpus = [h100(0, processes=(GpuProcess(me, 3 << 30, ("compute",)),), memory=Memory(80 << 30, 3 << 30, None),
                 utilization_gpu=0),
            h100(1, processes=(GpuProcess(other, 9 << 30, ("compute",)),), utilization_gpu=97)]
    backend = FakeBackend("runs", replace(OK_STATUS, device_count=2), gpus)
    rows, note = run_gpu_use({me}, backend)
    assert note is None
    assert [(r.gpu, r.pid, r.used_bytes, r.gpu_util_percent) for r in rows] == [(0, me, 3 << 30, 0)]
    assert gpus_idle(rows) is True and gpus_idle([]) is None


def test_command_splitting_and_rendezvous_port():
    argv, env = split_command("CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node=2 \\\n  --master-port 29611 "
                              "train.py --lr '1e-4'")
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert argv == ["torchrun", "--nproc-per-node=2", "--master-port", "29611", "train.py", "--lr", "1e-4"]
    assert rendezvous_port(argv, env) == 29611
    assert rendezvous_port(["torchrun", "--standalone", "t.py"], {}) is None
    assert rendezvous_port(["torchrun", "t.py"], {}) == 29500
    assert rendezvous_port(["torchrun", "--rdzv-endpoint=head:29400", "t.py"], {}) == 29400
    assert rendezvous_port(["python", "t.py"], {}) is None


def test_unreachable_names_what_the_provider_makes_likely():
    error = RemoteError("pod.runpod.example", "timeout", "ssh: connect to host timed out", "check the pod")
    status = status_when_unreachable(RunStatusInput(run_id="20260101-000000-x"), error)
    assert status.state == "unreachable" and "timed out" in status.detail
    assert "RunPod" in status.next_step and "preemption" in status.next_step
    plain = status_when_unreachable(RunStatusInput(run_id="20260101-000000-x"),
                                    RemoteError("10.0.0.5", "timeout", "timed out", "retry"))
    assert "provider's console" in plain.next_step
