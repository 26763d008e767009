"""notify reaches a person: placeholders filled per event, the command as words or one string (never a shell),
the CLI's --notify with dashes in it and --command; the idle guard's notify before and after a stop."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.runs.tool import SPECS, RunStartInput

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
RECORDER = str(FIXTURES / "notify_record.py")
TOOLS = {spec.name: spec for spec in SPECS}


@pytest.fixture(autouse=True)
def _own_ledger(runs_dir):
    """Every test here gets its own run ledger (conftest.runs_dir)."""


def records(path: Path, count: int, timeout_s: float = 30.0) -> list[dict]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not (path.exists() and len(path.read_text().splitlines()) >= count):
        time.sleep(0.1)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_state(run_id: str, states: tuple[str, ...], timeout_s: float = 30.0):
    end = time.monotonic() + timeout_s
    status = TOOLS["run_status"].call({"run_id": run_id})
    while status.state not in states and time.monotonic() < end:
        time.sleep(0.2)
        status = TOOLS["run_status"].call({"run_id": run_id})
    assert status.state in states, status.model_dump_json(indent=1)[:2000]
    return status


def test_notify_placeholders_are_filled_per_event_and_the_environment_is_kept(tmp_path):
    notes = tmp_path / "notes.jsonl"
    script = "print('step 7/10 loss 0.5', flush=True)\nraise SystemExit(3)\n"
    started = TOOLS["run_start"].call({
        "argv": [sys.executable, "-c", script], "cwd": str(tmp_path), "name": "nightly",
        "notify": [sys.executable, RECORDER, str(notes), "{state}", "{run_id}", "{host}", "{step}", "{message}"]})
    wait_state(started.run_id, ("failed",))
    [note] = records(notes, 1)
    state, run_id, host, step, message = note["argv"]
    assert (state, run_id, host, step) == ("failed", started.run_id, socket.gethostname(), "7")
    assert started.run_id in message and "nightly" in message and "exit code 3" in message
    # no catalog signature in this log: the person gets its last line, not a word-overlap guess at an entry
    assert message.endswith("no catalog signature in the log; it ends: step 7/10 loss 0.5")
    assert note["env"]["RGT_RUN_STATE"] == "failed" and note["env"]["RGT_RUN_ID"] == started.run_id
    assert note["env"]["RGT_MESSAGE"] == message


def test_notify_as_one_string_is_split_like_a_shell_but_never_run_by_one():
    assert RunStartInput(argv=["true"], notify=["notify-me {message}"]).notify == ["notify-me", "{message}"]
    assert RunStartInput(argv=["true"], notify=["notify-me --title 'GPU box' {message}"]).notify == [
        "notify-me", "--title", "GPU box", "{message}"]
    words = ["bash", "-c", 'notify-me "$1"', "_", "{message}"]  # the message as an argument, not as code
    assert RunStartInput(argv=["true"], notify=words).notify == words
    with pytest.raises(InputError, match="notify"):
        TOOLS["run_start"].validate({"argv": ["true"], "notify": ["notify-me {message} | tee /tmp/x"]})
    with pytest.raises(InputError, match="shell code"):  # a log line in the message must not run as code
        TOOLS["run_start"].validate({"argv": ["true"], "notify": ["bash", "-c", "notify-me '{message}'"]})
    with pytest.raises(InputError, match=r"\{mesage\}"):
        TOOLS["run_start"].validate({"argv": ["true"], "notify": ["notify-me", "{mesage}"]})


def _meta(runs_dir: Path, out: str) -> dict:
    run_id = json.loads(out)["run_id"]
    return json.loads((runs_dir / run_id / "meta.json").read_text())


def test_cli_notify_takes_one_string_or_words_with_dashes_and_command_works(tmp_path, runs_dir, capsys):
    common = ["--cwd", str(tmp_path), "--skip-checks", "port", "gpus", "disk", "--json"]
    assert cli.main(["run", "start", "--notify", "notify-me {message}", *common, "--", "true"]) == 0
    assert _meta(runs_dir, capsys.readouterr().out)["notify"] == ["notify-me", "{message}"]

    assert cli.main(["run", "start", "--notify", "bash", "-c", 'notify-me "$1"', "_", "{message}", *common,
                     "--", "true"]) == 0
    assert _meta(runs_dir, capsys.readouterr().out)["notify"] == ["bash", "-c", 'notify-me "$1"', "_", "{message}"]

    assert cli.main(["run", "start", "--command", "python3 -c 'print(41 + 1)'", *common]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    wait_state(run_id, ("succeeded",))
    assert TOOLS["run_logs"].call({"run_id": run_id}).text == "42\n"
