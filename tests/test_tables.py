"""Tables wrap, never cut: a command line or finding is the fact that identifies a target (run name, rendezvous id)."""

from __future__ import annotations

from remote_gpu_trainer.health.tool import reap_vram_zombies, render_zombies
from remote_gpu_trainer.health.zombies import ReapInput
from remote_gpu_trainer.processes.safekill import KillTarget, age_text, target_table, whole_command
from remote_gpu_trainer.tables import format_table
from remote_gpu_trainer.toolspec import no_progress

COMMAND = ("/opt/venv/bin/python -m torch.distributed.run --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
           "--rdzv-endpoint 10.0.0.1:29400 --rdzv-id llama-70b-sft-2026-11-27-a1b2c3d4e5f6 train.py "
           "--config configs/llama-70b.yaml --run-name llama-70b-sft-experiment-with-a-long-name-2026-11-27")


def _cells(table: str, column: int) -> str:
    """The text of one column over every line of a table body, joined by spaces."""
    _header, rule, *body = table.splitlines()
    starts = [i for i, ch in enumerate(rule) if ch == "-" and (i == 0 or rule[i - 1] == " ")]
    start = starts[column]
    end = starts[column + 1] if column + 1 < len(starts) else None
    return " ".join(line[start:end].strip() for line in body if line[start:end].strip())


def test_a_wrapped_column_keeps_every_word_whole():
    table = format_table(["pid", "command"], [[4242, COMMAND]], wrap=["command"], width=80)
    assert max(len(line) for line in table.splitlines()) <= 100  # wrapped, about the width asked
    assert len(table.splitlines()) > 3
    assert _cells(table, 1) == COMMAND  # nothing cut, no word broken


def test_without_wrap_a_table_is_as_before():
    assert format_table(["a", "b"], [[1, "x y"]]) == "a  b\n-  ---\n1  x y"


def test_kill_targets_show_age_and_the_whole_command():
    target = KillTarget(pid=4242, ppid=1, name="python", command=COMMAND, user="me", uid=1000, status="sleeping",
                        age_s=3 * 3600 + 5 * 60, why="holds tcp 0.0.0.0:29400 LISTEN", action="would_signal")
    table = target_table([target])
    assert "3 h 05 min" in table and _cells(table, 7) == COMMAND


def test_long_commands_are_kept_up_to_8_kib_and_say_what_was_left_out():
    assert whole_command(COMMAND) == COMMAND
    long = "python -c '" + "x = 1; " * 2000 + "'"
    kept = whole_command(long)
    assert kept.startswith(long[:8192]) and kept.endswith(f"(+{len(long) - 8192} characters)")
    assert [age_text(s) for s in (None, 5, 600, 7200, 200000)] == ["-", "5 s", "10 min", "2 h 00 min", "2 d 07 h"]


def test_the_zombie_dry_run_shows_age_and_whole_commands(monkeypatch):
    monkeypatch.setenv("RGT_HEALTH_FAKE", "zombie-orphan-namespaced")
    report = reap_vram_zombies(ReapInput(), no_progress)
    text = render_zombies(report)
    orphan = next(h for h in report.holders if h.pid == 2001)
    assert orphan.command == "python train.py --local-rank 0" and orphan.age_s
    row = next(line for line in text.splitlines() if " 2001 " in line)
    assert age_text(orphan.age_s) in row and row.rstrip().endswith("python train.py --local-rank 0")
