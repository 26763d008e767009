"""The box-side scripts: every script's contract (--help, strict mode, usage errors, shellcheck), then
gpu_health.sh against recorded nvidia-smi outputs and reap_vram_zombies.sh against real processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote_gpu_trainer import hostinfo
from remote_gpu_trainer.health.xid import XID_TABLE

from .test_scripts_support import FAKE_BIN, SCENARIOS, SCRIPTS, fake_env, rows, run_script, shellcheck

SHELL_SCRIPTS = sorted(p.name for p in SCRIPTS.glob("*.sh"))
PY_SCRIPTS = sorted(p.name for p in SCRIPTS.glob("*.py"))
PROMISED = {"gpu_health.sh", "reap_vram_zombies.sh", "mem_monitor.sh", "download_loop.sh", "aggregate_to_fs.sh",
            "setup-china-mirrors.sh", "check_staleness.py", "verify_local.py"}


def test_every_script_the_references_cite_exists():
    assert set(SHELL_SCRIPTS) | set(PY_SCRIPTS) >= PROMISED
    cited = set()
    for md in [*(SCRIPTS.parent / "references").rglob("*.md"), *(SCRIPTS.parent / "profiles").glob("*.md")]:
        cited |= set(re.findall(r"scripts/([\w.-]+\.(?:sh|py))", md.read_text()))
    cited.discard("estimation.py")  # torchtitan's scripts/estimate/estimation.py, a third-party source
    assert cited <= set(SHELL_SCRIPTS) | set(PY_SCRIPTS), cited - set(SHELL_SCRIPTS) - set(PY_SCRIPTS)


@pytest.mark.parametrize("name", sorted(PROMISED))
def test_help_documents_usage_and_exit_status(name):
    result = run_script(name, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout or "usage" in result.stdout
    assert "Exit status" in result.stdout or "exit status" in result.stdout


@pytest.mark.parametrize("name", sorted(PROMISED))
def test_unknown_argument_is_a_usage_error(name):
    result = run_script(name, "--no-such-option")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--no-such-option" in result.stderr


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_bash_scripts_run_in_strict_mode(name):
    text = (SCRIPTS / name).read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert os.access(SCRIPTS / name, os.X_OK), f"{name} is not executable"


def code_lines(text: str):
    """(number, line) of shell code: comments and here-document bodies (help texts) left out."""
    ending = None
    for number, line in enumerate(text.splitlines(), 1):
        if ending is not None:
            ending = None if line.strip() == ending else ending
            continue
        match = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if match:
            ending = match.group(1)
        if not line.lstrip().startswith("#"):
            yield number, line


def test_scripts_never_kill_by_name_or_pattern():
    """No pkill/killall/fuser -k/GPU reset as a command anywhere (GOT-08); help text may name them."""
    command = re.compile(r"(?:^|[;&|(`]|\$\(|\bthen|\bdo|\belse)\s*(?:sudo\s+)?"
                         r"(pkill|killall|fuser\s+-\w*k|nvidia-smi\s+(?:-r|--gpu-reset))\b")
    for path in [*SCRIPTS.glob("*.sh"), *SCRIPTS.glob("templates/*.j2")]:
        for number, line in code_lines(path.read_text()):
            assert not command.search(line), f"{path.name}:{number} runs {command.search(line).group(1)}"
    assert command.search("x; pkill -f train.py") and command.search("  killall python")


def test_no_early_exit_reader_after_a_pipe_under_pipefail():
    """`producer | head` (or grep -q/-m) under `set -o pipefail`: the reader quits early, the producer
    dies of SIGPIPE and the pipeline returns 141, which `set -e` turns into an abort whenever the
    producer's output outgrows the pipe buffer. That crashed mem_monitor.sh in CI; readers that
    consume all input (awk 'NR <= k', sed -n 1p) do not. `head -c N file | ...` reads a file, no pipe."""
    early = re.compile(r"\|\s*(head\b|grep\s+-\w*[qm])")
    for path in [*SCRIPTS.glob("*.sh"), *SCRIPTS.glob("templates/*.j2")]:
        text = path.read_text()
        if "pipefail" not in text:
            continue
        for number, line in code_lines(text):
            assert not early.search(line), f"{path.name}:{number} pipes into {early.search(line).group(1)}"
    assert early.search("ps aux | head -n 3") and early.search("x | grep -q y") and not early.search("awk 'NR<=3'")


def test_shellcheck_is_clean():
    files = [str(p) for p in SCRIPTS.glob("*.sh")]
    files += [str(p) for p in FAKE_BIN.iterdir() if p.read_text().startswith("#!/usr/bin/env bash")]
    result = subprocess.run([shellcheck(), "--severity=style", *files], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout


# --------------------------------------------------------------------------------- gpu_health.sh


def health(scenario: str, *args: str, dmesg: str | None = "dmesg-clean.log", **extra: str):
    env = fake_env(scenario, **extra)
    if dmesg:
        env["FAKE_DMESG_FILE"] = str(SCENARIOS / dmesg)
    return run_script("gpu_health.sh", "--tsv", *args, env=env)


def test_healthy_box_passes_every_check():
    result = health("healthy-h100x2", "--expect-gpus", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    table = rows(result.stdout)
    assert {v for v, _ in table.values()} == {"PASS"}
    for check in ("ecc_uncorrected", "row_remap", "clock_events", "temperature", "persistence", "compute_mode",
                  "pcie_width", "power_limit", "mig", "processes", "xid"):
        assert table[("0", check)][0] == "PASS" and table[("1", check)][0] == "PASS"
    assert table[("1", "temperature")][1] == "31C (slowdown 89C)"
    assert table[("0", "compute_cap")] == ("PASS", "9.0 (NVIDIA H100 80GB HBM3)")
    assert table[("-", "driver")] == ("PASS", "550.54.15")
    assert "overall: PASS" in result.stderr


def test_unreadable_kernel_log_is_unknown_not_pass():
    result = health("healthy-h100x2", dmesg=None)
    assert result.returncode == 3
    assert rows(result.stdout)[("-", "xid")][0] == "UNKNOWN"


def test_throttled_gpu_fails_and_degradations_warn():
    result = health("throttled-h100x2")
    assert result.returncode == 1
    table = rows(result.stdout)
    assert table[("1", "clock_events")] == ("FAIL", "hw_slowdown,hw_thermal_slowdown while idle")
    assert table[("1", "temperature")][0] == "FAIL"
    assert table[("1", "power_limit")] == ("WARN", "500.00W of 700.00W default")
    assert table[("0", "clock_events")] == ("WARN", "sw_thermal_slowdown")
    assert table[("0", "persistence")][0] == "WARN"
    assert table[("0", "pcie_width")] == ("WARN", "x8 of x16")


def test_ecc_errors_and_pending_remap_fail_only_that_gpu():
    result = health("ecc-error-h100x2")
    assert result.returncode == 1
    table = rows(result.stdout)
    assert table[("1", "ecc_uncorrected")] == ("FAIL", "2 volatile uncorrectable")
    assert table[("1", "row_remap")] == ("FAIL", "remap pending")
    assert table[("0", "ecc_uncorrected")][0] == table[("0", "row_remap")][0] == "PASS"


def test_old_driver_falls_back_to_older_field_names(tmp_path):
    log = tmp_path / "calls"
    result = health("old-driver-v100", FAKE_NVSMI_LOG=str(log))
    assert result.returncode == 0, result.stdout
    table = rows(result.stdout)
    assert table[("0", "clock_events")] == ("PASS", "none")  # read through clocks_throttle_reasons.*
    assert table[("0", "retired_pages")][0] == "PASS"  # no row remapping before Ampere
    assert table[("0", "compute_cap")][0] == "SKIP"  # a field this driver does not know
    queries = [line for line in log.read_text().splitlines() if "--query-gpu" in line]
    assert "clocks_event_reasons.hw_slowdown" in queries[0]
    assert "clocks_throttle_reasons.hw_slowdown" in queries[-1] and "remapped_rows" not in queries[-1]


def test_processes_warn_and_fail_with_require_empty():
    assert rows(health("busy-h100x2").stdout)[("0", "processes")] == ("WARN", "1 process(es), 40506 MiB")
    strict = health("busy-h100x2", "--require-empty")
    assert strict.returncode == 1 and rows(strict.stdout)[("0", "processes")][0] == "FAIL"


def test_xids_are_attributed_to_their_gpu():
    table = rows(health("healthy-h100x2", dmesg="dmesg-xids.log").stdout)
    assert table[("0", "xid")] == ("WARN", "Xid 13")
    assert table[("1", "xid")] == ("FAIL", "Xid 79")


def test_xid_classes_match_the_gpu_health_tool():
    text = (SCRIPTS / "gpu_health.sh").read_text()
    body = text[text.index("xid_verdict() {"):]
    arms = dict(re.findall(r"^\s+([\d|*]+)\) echo (\w+) ;;", body, re.M)[:3])
    script = {int(code): verdict for codes, verdict in arms.items() if codes != "*" for code in codes.split("|")}
    tool = {code: info.verdict.value for code, info in XID_TABLE.items() if info.verdict.value != "FAIL"}
    assert script == tool
    assert arms["*"] == "FAIL"


@pytest.mark.parametrize(("scenario", "expect", "code", "entry"), [
    ("no-devices", None, 4, "GOT-13"), ("no-devices", "1", 1, "GOT-13"),
    ("driver-fail", None, 1, "GOT-12"), ("mismatch", None, 1, "GOT-11"),
])
def test_broken_driver_states(scenario, expect, code, entry):
    result = health(scenario, *(["--expect-gpus", expect] if expect else []))
    assert result.returncode == code, result.stdout
    assert entry in result.stdout and "FAIL" in result.stdout


def test_missing_nvidia_smi_means_no_gpu():
    result = health("healthy-h100x2", NVIDIA_SMI="/nonexistent/nvidia-smi")
    assert result.returncode == 4 and "nvidia-smi not found" in result.stdout


def test_hanging_nvidia_smi_fails_fast():
    started = time.monotonic()
    result = health("hang", "--timeout", "1")
    assert time.monotonic() - started < 10
    assert result.returncode == 1 and "no answer within 1s" in result.stdout and "GOT-23" in result.stdout


def test_fewer_gpus_than_expected_fails():
    result = health("healthy-h100x2", "--expect-gpus", "8")
    assert result.returncode == 1 and rows(result.stdout)[("-", "gpu_count")] == ("FAIL", "2 of 8 expected")


def test_human_output_ends_with_the_overall_verdict():
    env = fake_env("ecc-error-h100x2", FAKE_DMESG_FILE=str(SCENARIOS / "dmesg-clean.log"))
    result = run_script("gpu_health.sh", env=env)
    assert result.stdout.splitlines()[0].split() == ["VERDICT", "GPU", "CHECK", "OBSERVED", "NOTE"]
    assert result.stdout.strip().splitlines()[-1] == "overall: FAIL (2 FAIL, 0 UNKNOWN, 0 WARN)"


# -------------------------------------------------------------------------- reap_vram_zombies.sh

HOLD = "import sys, time; handles = [open(p) for p in sys.argv[1:]]; time.sleep(120)"


@pytest.fixture
def devices(tmp_path):
    """Stand-in /dev/nvidia* files: a process that opens them is a 'GPU holder' for the script."""
    folder = tmp_path / "dev"
    folder.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia-uvm"):
        (folder / name).touch()
    return folder


@pytest.fixture
def spawned():
    """Processes a test starts; each is terminated at the end, by its own pid only."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def _orphan(devices: Path, *names: str, setsid: bool = False) -> int:
    """A holder whose launcher exited: started by a shell that exits at once (re-parented to PID 1).
    With ``setsid`` it leads its own session, as a deliberately detached job does."""
    files = " ".join(str(devices / n) for n in names)
    prefix = "setsid " if setsid else ""
    out = subprocess.run(["bash", "-c", f"{prefix}{sys.executable} -c '{HOLD}' {files} >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    _wait_holding(pid, devices)
    return pid


def _wait_holding(pid: int, devices: Path) -> None:
    for _ in range(100):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(devices)) for fd in fds):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never opened a device file")


def reap(devices: Path, *args: str, scenario: str = "healthy-h100x2", **extra: str):
    env = fake_env(scenario, RGT_DEVICE_PREFIX=str(devices / "nvidia"), **extra)
    return run_script("reap_vram_zombies.sh", *args, env=env)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _line(output: str, pid: int) -> str:
    return next(line for line in output.splitlines() if line.strip().startswith(str(pid) + " "))


def test_orphan_is_offered_and_only_killed_with_the_token(devices, spawned):
    orphan = _orphan(devices, "nvidia0", "nvidia-uvm")
    spawned.append(orphan)
    active = subprocess.Popen([sys.executable, "-c", HOLD, str(devices / "nvidia1")])
    spawned.append(active.pid)
    _wait_holding(active.pid, devices)

    dry = reap(devices, "--min-age", "0")
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert "orphan" in _line(dry.stdout, orphan) and "0,uvm" in _line(dry.stdout, orphan)
    assert "active" in _line(dry.stdout, active.pid)
    assert f"would stop (children first): {orphan}" in dry.stdout
    assert _alive(orphan), "a dry run must not signal anything"
    token = re.search(r"--confirm ([0-9a-f]{16})", dry.stdout).group(1)

    wrong = reap(devices, "--min-age", "0", "--kill", "--confirm", "0" * 16)
    assert wrong.returncode == 3 and _alive(orphan)

    real = reap(devices, "--min-age", "0", "--kill", "--confirm", token)
    assert real.returncode == 0, real.stdout
    assert f"SIGTERM {orphan}" in real.stdout
    deadline = time.monotonic() + 5
    while _alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(orphan)
    assert _alive(active.pid), "an active job must never be signalled"


def test_detached_session_leader_and_young_orphans_are_not_offered(devices, spawned):
    leader = _orphan(devices, "nvidia0", setsid=True)
    spawned.append(leader)
    orphan = _orphan(devices, "nvidia1")
    spawned.append(orphan)
    result = reap(devices, "--min-age", "3600")
    assert result.returncode == 0, result.stdout
    assert "leads its own session" in _line(result.stdout, leader)
    assert "not offered" in _line(result.stdout, orphan)
    assert "nothing to reap" in result.stdout


def test_kill_needs_a_token_and_force_needs_kill(devices):
    assert reap(devices, "--kill").returncode == 2
    assert reap(devices, "--force").returncode == 2


def test_nvidia_smi_host_pids_are_never_mapped_onto_local_pids(devices, spawned, tmp_path):
    """In a container nvidia-smi's pids are host pids: even when a local process has the same number,
    it is a different process and must be reported as namespaced, not as that local holder."""
    active = subprocess.Popen([sys.executable, "-c", HOLD, str(devices / "nvidia0")])
    spawned.append(active.pid)
    _wait_holding(active.pid, devices)
    scenario = json.loads((SCENARIOS / "busy-h100x2.json").read_text())
    scenario["compute_apps"][0]["pid"] = str(active.pid)
    path = tmp_path / "collide.json"
    path.write_text(json.dumps(scenario))
    env = fake_env(None, FAKE_NVSMI_SCENARIO=str(path), RGT_DEVICE_PREFIX=str(devices / "nvidia"))
    result = run_script("reap_vram_zombies.sh", env=env)
    in_container = "inside a container" in result.stdout.splitlines()[1]
    assert in_container == hostinfo.in_container()
    listed = next(line for line in result.stdout.splitlines() if line.strip().startswith(f"pid {active.pid}"))
    if in_container:
        assert "HOST PIDs" in result.stdout and "namespaced" in listed and "class active" not in listed
    else:
        assert "local holder, class active" in listed
