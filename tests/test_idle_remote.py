"""run_pull and box_idle end to end through a loopback SSH box (tests/sshbox.py): the box's custody
record is written over ssh, and box_idle on the box then counts the pulled run as copied off."""

from __future__ import annotations

import json
import time

from remote_gpu_trainer.idle.tool import SPECS

BOX_IDLE, RUN_PULL = SPECS[0], SPECS[2]


def test_pull_through_ssh_verifies_and_box_idle_then_sees_it_copied(ssh_fleet, tmp_path):
    ssh_fleet.add("idlebox", scenario="idle-8xh100")
    ssh_fleet.install_runtime("idlebox")
    home = ssh_fleet.boxes["idlebox"].home
    run = home / ".cache" / "remote-gpu-trainer" / "runs" / "run-1"
    (run / "ckpt").mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"pgid": None}))
    (run / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": time.time() - 60}))
    (run / "ckpt" / "last.pt").write_bytes(b"w" * 100_000)

    before = BOX_IDLE.call({"window_s": 0, "host": "idlebox"})
    assert before.verdict == "idle" and before.unsynced_count == 3 and not before.terminate_safe

    pulled = RUN_PULL.call({"host": "idlebox", "run_id": "run-1", "dest": str(tmp_path / "local")})
    assert pulled.verdict == "verified", pulled.rsync_tail
    assert pulled.verified == 3 and pulled.recorded_on_box == 3
    assert (tmp_path / "local" / "run-1" / "ckpt" / "last.pt").read_bytes() == b"w" * 100_000

    after = BOX_IDLE.call({"window_s": 0, "host": "idlebox"})
    assert after.unsynced_count == 0 and after.terminate_safe
