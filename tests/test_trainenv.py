"""The training environment and the launch environment, on this machine: the search order, the probe's partial
readings, activation parsing, NCCL's interface syntax, CUDA's device list, NCCL's config files and launch scripts.
Through ssh boxes: tests/test_training_env_remote.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote_gpu_trainer.health.checks import Check
from remote_gpu_trainer.models import Verdict
from remote_gpu_trainer.trainenv.bounded import run_bounded
from remote_gpu_trainer.trainenv.find import find_training_env, parse_activation
from remote_gpu_trainer.trainenv.launch import (
    LaunchEnv,
    Setting,
    cuda_visible_check,
    ifname_checks,
    nccl_ifname_matches,
    read_launch_env,
    visible_devices,
)
from remote_gpu_trainer.trainenv.login import ShellRead, read_login_env, read_sourced_env
from remote_gpu_trainer.trainenv.probe import run_probe
from remote_gpu_trainer.trainenv.script import read_launch_script

# --- activation text --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, kind, value", [
    ("source ~/venvs/pt/bin/activate", "source", "~/venvs/pt/bin/activate"),
    (". /opt/venv/bin/activate", "source", "/opt/venv/bin/activate"),
    ("source '$HOME/my env/bin/activate'", "source", "$HOME/my env/bin/activate"),
    ("conda activate train-3.11", "conda", "train-3.11"),
    ("mamba activate /opt/conda/envs/x", "prefix", "/opt/conda/envs/x"),
    ("source activate old", "conda", "old"),
    ("~/venvs/pt", "prefix", "~/venvs/pt"),
    ("/opt/venv/bin/activate", "source", "/opt/venv/bin/activate"),
])
def test_activations_people_write_are_understood(text, kind, value):
    parsed = parse_activation(text)
    assert (parsed.kind, parsed.value) == (kind, value)


@pytest.mark.parametrize("text", ["source ~/x; touch /tmp/p", "source $(touch /tmp/p)", "source ~/$(id)/activate",
                                  "source `id`", "conda activate 'a;b'", "source venv/bin/activate",
                                  "pip install torch", "source a b", "conda activate ../x", "source 'unterminated"])
def test_anything_else_is_refused_before_a_shell_sees_it(text):
    with pytest.raises(ValueError):
        parse_activation(text)


def test_the_tool_inputs_refuse_a_bad_activation_or_a_relative_python_by_field():
    from remote_gpu_trainer.errors import InputError
    from remote_gpu_trainer.registry import all_specs

    specs = {s.name: s for s in all_specs()}
    for tool in ("skill_info", "repro_scaler_bug", "preflight", "run_start", "fsdp_memory_estimate"):
        base = {"skill_info": {}, "repro_scaler_bug": {"case": "fp16_unscale"}, "preflight": {"hosts": ["a"]},
                "run_start": {"argv": ["true"]}, "fsdp_memory_estimate": {"model": "gpt2"}}[tool]
        with pytest.raises(InputError) as err:
            specs[tool].validate({**base, "activate": "source x; reboot"})
        assert "activate" in str(err.value), tool
        with pytest.raises(InputError) as err:
            specs[tool].validate({**base, "python": "venv/bin/python"})
        assert "python" in str(err.value) and "relative" in str(err.value), tool



@pytest.mark.parametrize("tool, base", [("preflight", {"hosts": ["a"]}), ("host_facts", {}),
                                        ("allreduce_node", None)])
@pytest.mark.parametrize("launch, why", [("x\0y", "NUL"), ("launch.sh", "relative")])
def test_a_launch_path_is_checked_as_python_is_by_field(tool, base, launch, why):
    from remote_gpu_trainer.errors import InputError
    from remote_gpu_trainer.registry import all_specs

    spec = {s.name: s for s in all_specs()}[tool]
    if base is None:  # allreduce_node's other fields are required: take a valid set from its own model
        base = {"head_addr": "127.0.0.1", "port": 29500, "nnodes": 2, "nproc": 1, "backend": "gloo",
                "rdzv_id": "x", "max_bytes": 1 << 20}
    with pytest.raises(InputError) as err:
        spec.validate({**base, "launch": launch})
    assert "launch" in str(err.value) and why in str(err.value), str(err.value)
    assert spec.validate({**base, "launch": "~/launch.sh"}).launch == "~/launch.sh"


def test_digits_python_cannot_read_as_a_number_are_not_numbers(tmp_path):
    assert visible_devices("\u00b2", 8, [None] * 8) == ([], "\u00b2")  # "²".isdigit() is True, int("²") raises
    script = tmp_path / "launch.sh"
    script.write_text("torchrun --master_addr 10.0.0.1 --master_port \u00b2 train.py\n")
    assert read_launch_script(str(script)).endpoint.master_port is None

# --- the probe --------------------------------------------------------------------------------------------------


def _fake_torch(root: Path, init: str, distributed: str | None = None) -> dict[str, str]:
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(init)
    (root / "torch" / "version.py").write_text("cuda = '12.4'\n")
    if distributed is not None:
        (root / "torch" / "distributed").mkdir()
        (root / "torch" / "distributed" / "__init__.py").write_text(distributed)
    return {**os.environ, "PYTHONPATH": str(root)}


def test_a_broken_torch_distributed_keeps_the_versions_already_read(tmp_path):
    env = _fake_torch(tmp_path, "__version__ = '2.9.1+cu124'\nfrom . import version\n",
                      "raise ImportError('undefined symbol: ncclCommSplit')\n")
    reading = run_probe(sys.executable, env, "import")
    assert reading.value("torch", "version") == "2.9.1+cu124" and reading.value("torch", "cuda") == "12.4"
    assert "undefined symbol: ncclCommSplit" in reading.errors()["distributed"]
    assert "cuda" in reading.errors()  # the fake has no torch.cuda: read as an error of that step only


def test_an_import_that_hangs_is_cut_at_the_limit_naming_the_step(tmp_path):
    env = _fake_torch(tmp_path, "import time\ntime.sleep(60)\n")
    reading = run_probe(sys.executable, env, "import", timeout_s=3)
    assert reading.value("find", "found") is True  # found before the import hung
    assert reading.stopped == "import torch did not finish in 3 s"


def test_a_python_that_does_not_exist_is_a_reading_not_a_crash(tmp_path):
    reading = run_probe(str(tmp_path / "nope"), None, "find")
    assert "does not start" in reading.stopped and not reading.steps


# --- the search --------------------------------------------------------------------------------------------------


def _venv(path: Path, torch_version: str | None) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    if torch_version:
        site = next((path / "lib").glob("python3.*")) / "site-packages"
        _fake_torch(site, f"# FAKE torch for the search-order test\n__version__ = '{torch_version}'\n")
        info = site / f"torch-{torch_version}.dist-info"  # what find mode reads, without importing torch
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
    return path / "bin" / "python"


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    return home


def test_the_search_order_and_every_candidate_are_reported(home):
    _venv(home / "venvs" / "a-no-torch", None)
    chosen = _venv(home / "venvs" / "b-torch", "2.8.0")
    _venv(home / ".venv", "2.7.0")
    login = ShellRead({"PATH": "/usr/bin:/bin"}, "bash -l -i")
    env = find_training_env(login=login, local=False)
    assert env.python == str(chosen) and env.source == "common_location" and env.torch == "2.8.0"
    assert env.found_by == "venv ~/venvs/b-torch" and env.display == "~/venvs/b-torch/bin/python"
    wheres = [c.where for c in env.candidates]
    assert wheres[-2:] == ["venv ~/venvs/a-no-torch", "venv ~/venvs/b-torch"]  # stopped at the first with torch
    assert [c.torch for c in env.candidates][-2:] == [None, "2.8.0"]
    assert env.activation["VIRTUAL_ENV"] == str(home / "venvs" / "b-torch")
    assert env.activation["PATH"].startswith(f"{home}/venvs/b-torch/bin:")


def test_the_login_shells_python_comes_before_common_locations(home):
    _venv(home / "venvs" / "a", "2.8.0")
    login_python = _venv(home / "login-venv", "2.6.0")
    login = ShellRead({"PATH": f"{login_python.parent}:/usr/bin", "VIRTUAL_ENV": str(home / "login-venv")},
                      "bash -l -i")
    env = find_training_env(login=login, local=False)
    assert env.source == "login_shell" and env.torch == "2.6.0" and "login shell's PATH" in env.found_by
    assert env.activation["VIRTUAL_ENV"] == str(home / "login-venv")


def test_python_and_activate_win_and_a_missing_one_says_so(home):
    given = _venv(home / "given", "2.5.0")
    assert find_training_env(python=str(given), local=False).source == "python"
    activated = find_training_env(activate=f"source {home}/given/bin/activate", local=False)
    assert activated.source == "activate" and activated.torch == "2.5.0"
    assert activated.activation["VIRTUAL_ENV"] == str(home / "given")
    missing = find_training_env(python="~/nowhere/bin/python", local=False)
    assert missing.errors == {"python": "~/nowhere/bin/python does not exist here"} and not missing.has_torch
    conda = find_training_env(activate="conda activate nosuchenv", local=False)
    assert "no conda env 'nosuchenv'" in conda.errors["activate"]


def test_nothing_with_torch_is_none_with_the_candidates(home, monkeypatch):
    from tests.sshbox import clean_python

    python = clean_python()[0]
    if python is None:
        pytest.skip(clean_python()[1])
    monkeypatch.setattr("remote_gpu_trainer.trainenv.find._search_list", lambda login, local: [
        (python, "common_location", "the system python", {})])
    env = find_training_env(login=ShellRead(None, "bash -l -i", "x"), local=False)
    assert env.source == "none" and env.python is None and [c.torch for c in env.candidates] == [None]
    assert "login shell not read (bash -l -i): x" in env.notes


def test_the_launch_scripts_activation_is_used(home):
    _venv(home / "venvs" / "proj", "2.4.0")
    script = home / "launch.sh"
    script.write_text("#!/bin/bash\nset -e\ncd ~/proj && source ~/venvs/proj/bin/activate\ntorchrun train.py\n")
    env = find_training_env(launch="~/launch.sh", login=ShellRead({"PATH": "/usr/bin"}, "bash -l -i"), local=False)
    assert env.source == "launch_script" and env.torch == "2.4.0"
    assert env.found_by == "launch script ~/launch.sh line 3: source '~/venvs/proj/bin/activate'"


def test_a_sourced_file_runs_as_an_argument_of_our_script(tmp_path):
    odd = tmp_path / "a b; touch pwned #" / "activate"
    odd.parent.mkdir()
    odd.write_text("export RGT_TEST_ACTIVATED=yes\n")
    read = read_sourced_env(str(odd))
    assert read.env["RGT_TEST_ACTIVATED"] == "yes" and not (Path.home() / "pwned").exists()


def test_the_login_shell_is_read_after_its_noise(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".bashrc").write_text('case $- in *i*) ;; *) return;; esac\necho "welcome banner"\n'
                                      "export NCCL_SOCKET_IFNAME=eth9\n")
    (tmp_path / ".profile").write_text('. "$HOME/.bashrc"\n')
    read = read_login_env()
    if read.error and "bash" not in read.how:
        pytest.skip("no bash here")
    assert read.error is None and read.env["NCCL_SOCKET_IFNAME"] == "eth9", read


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (killed, not yet reaped by init) is not alive
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _stop(pid: int) -> None:
    """Test cleanup: end the job this test itself started."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def test_a_job_the_shell_backgrounds_neither_holds_the_call_nor_is_killed(tmp_path):
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    done = run_bounded(["sh", "-c", f'echo hi; sleep 30 & echo $! > "{pidfile}"; exit 0'], 5)
    pid = int(pidfile.read_text())
    try:
        assert time.monotonic() - started < 4
        assert done.returncode == 0 and done.out == b"hi\n"
        assert _alive(pid)  # the user's background job is theirs: not killed
    finally:
        _stop(pid)


def test_a_daemon_holding_stdout_does_not_hang_the_call(tmp_path):
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    done = run_bounded(["sh", "-c", f'echo hi; setsid sleep 30 & echo $! > "{pidfile}"; exit 0'], 5)
    pid = int(pidfile.read_text())
    _stop(pid)
    assert time.monotonic() - started < 4 and done.returncode == 0 and done.out == b"hi\n"
    # and when the shell itself overruns, the daemon in another session still does not stretch the bound
    started = time.monotonic()
    done = run_bounded(["sh", "-c", f'setsid sleep 30 & echo $! > "{pidfile}"; echo partial; sleep 30'], 1)
    _stop(int(pidfile.read_text()))
    assert time.monotonic() - started < 3 and done.returncode is None and done.out == b"partial\n"


def test_a_shell_that_overruns_is_killed_with_its_group_and_reported(tmp_path):
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    done = run_bounded(["sh", "-c", f'sleep 30 & echo $! > "{pidfile}"; echo partial; sleep 30'], 1)
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    try:
        assert time.monotonic() - started < 3
        assert done.returncode is None and done.out == b"partial\n"
        assert not _alive(pid)  # our group: killed with the shell
    finally:
        _stop(pid)


def test_a_bashrc_that_backgrounds_a_job_still_gives_the_login_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".bashrc").write_text('export NCCL_SOCKET_IFNAME=eth9\nsleep 30 &\necho $! > "$HOME/pid"\n')
    (tmp_path / ".profile").write_text('. "$HOME/.bashrc"\n')
    (tmp_path / ".bash_profile").write_text('. "$HOME/.bashrc"\n')
    read = read_login_env(timeout_s=5)
    pid = tmp_path / "pid"
    if pid.exists():
        _stop(int(pid.read_text()))
    if read.error and "bash" not in read.how:
        pytest.skip("no bash here")
    assert read.error is None and read.env["NCCL_SOCKET_IFNAME"] == "eth9", read


# --- the launch environment ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, matched", [
    ("eth", ["eth0", "eth1"]), ("=eth0", ["eth0"]), ("=eth", []), ("^docker,lo", ["eth0", "eth1", "ib0"]),
    ("^=docker0", ["eth0", "eth1", "ib0", "lo"]), ("ib,=eth1", ["eth1", "ib0"]), ("eth9", []), ("=eth0,=ib0",
                                                                                              ["eth0", "ib0"]),
])
def test_nccl_socket_ifname_is_matched_as_nccl_does(spec, matched):
    assert nccl_ifname_matches(spec, ["docker0", "eth0", "eth1", "ib0", "lo"]) == matched


def _env(**values: str) -> LaunchEnv:
    return LaunchEnv(read_by="test", settings=[Setting(name=k, value=v, source="login shell: bash -l -i",
                                                       interactive_only=True) for k, v in values.items()],
                     nccl_conf_files=[])


def test_interfaces_the_node_lacks_fail_and_a_mismatch_with_the_route_warns():
    addresses = {"lo": ["127.0.0.1"], "ens5": ["10.0.0.5"], "docker0": ["172.17.0.1"]}
    checks = {c.name: c for c in ifname_checks(_env(NCCL_SOCKET_IFNAME="eth", GLOO_SOCKET_IFNAME="ens5,eth0"),
                                                addresses, "ens5")}
    assert checks["nccl_socket_ifname"].verdict is Verdict.FAIL
    assert "docker0, ens5, lo" in checks["nccl_socket_ifname"].explanation
    assert checks["gloo_socket_ifname"].verdict is Verdict.FAIL and "eth0 does not exist" in \
        checks["gloo_socket_ifname"].explanation
    warn = ifname_checks(_env(NCCL_SOCKET_IFNAME="^lo,ens"), addresses, "ens5")[0]
    assert warn.verdict is Verdict.WARN and "would use docker0" in warn.explanation
    assert ifname_checks(_env(NCCL_SOCKET_IFNAME="=ens5"), addresses, "ens5")[0].verdict is Verdict.PASS
    assert ifname_checks(_env(), addresses, "ens5") == []


UUIDS = ["GPU-3e34e62f-aaaa", "GPU-7b2c0000-bbbb", "GPU-9f1d1111-cccc", "GPU-0a0a2222-dddd"]


@pytest.mark.parametrize("value, shown, bad", [
    ("2", [2], None), ("0,1,2,3", [0, 1, 2, 3], None), ("1,7,2", [1], "7"), ("", [], "(empty)"),
    ("GPU-9f1d", [2], None), ("GPU-3e34e62f-aaaa,3", [0, 3], None), ("GPU-", [], "GPU-"), ("0,0", [0], "0"),
    ("-1", [], "-1"),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, shown, bad):
    assert visible_devices(value, 4, UUIDS) == (shown, bad)


def test_a_hidden_gpu_is_a_warning_and_an_absent_one_a_failure():
    def check(value: str) -> Check:
        return cuda_visible_check(Setting(name="CUDA_VISIBLE_DEVICES", value=value, source="login shell",
                                          interactive_only=True), 4, UUIDS)

    hidden = check("2")
    assert hidden.verdict is Verdict.WARN and hidden.explanation.startswith(
        "login env sets CUDA_VISIBLE_DEVICES=2: ranks see 1 of 4 GPUs (NVML 2)")
    assert check("5").verdict is Verdict.FAIL and "'5' names no GPU" in check("5").explanation
    assert check("0,1,2,3").verdict is Verdict.PASS
    assert cuda_visible_check(None, 4, UUIDS) is None
    unknown = cuda_visible_check(Setting(name="CUDA_VISIBLE_DEVICES", value="GPU-3e34", source="x"), 4, None)
    assert unknown.verdict is Verdict.UNKNOWN


def test_nccl_reads_its_files_after_the_environment_first_file_first(tmp_path):
    conf = tmp_path / "nccl.conf"
    conf.write_text("# comment\nNCCL_IB_DISABLE=1\nNCCL_SOCKET_IFNAME==ens5\nNCCL_IB_DISABLE=0\nnot a setting\n")
    login = ShellRead({**os.environ, "NCCL_CONF_FILE": str(conf), "NCCL_SOCKET_IFNAME": "eth"}, "bash -l -i")
    env = read_launch_env(login)
    assert env.value("NCCL_SOCKET_IFNAME") == "eth"  # the environment wins over the file
    assert env.value("NCCL_IB_DISABLE") == "1" and env.get("NCCL_IB_DISABLE").source.startswith("NCCL_CONF_FILE")
    assert env.nccl_conf_files[0].role.startswith("NCCL_CONF_FILE") and env.nccl_conf_files[1].path == \
        "/etc/nccl.conf"
    assert env.get("NCCL_CONF_FILE").interactive_only  # set by the login shell, not the session


def test_a_launch_script_is_read_not_run(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "launch.sh"
    script.write_text(f"""#!/bin/bash
touch {marker}
export NCCL_SOCKET_IFNAME=ens5 MASTER_PORT=29411
MASTER_ADDR=node-0  # set, not exported
NCCL_DEBUG=INFO nohup torchrun --nnodes=2 --nproc-per-node=8 \\
    --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT train.py &
""")
    parsed = read_launch_script(str(script))
    assert not marker.exists() and parsed.sha256 and parsed.error is None
    assert parsed.exports["NCCL_SOCKET_IFNAME"].text == "ens5" and parsed.exports["NCCL_DEBUG"].line == 5
    endpoint = parsed.endpoint
    assert (endpoint.launcher, endpoint.line, endpoint.master_addr, endpoint.master_port) == ("torchrun", 5,
                                                                                             "node-0", 29411)
    assert endpoint.nnodes == "2" and endpoint.nproc_per_node == "8" and endpoint.unresolved == []
    accelerate = tmp_path / "acc.sh"
    accelerate.write_text("accelerate launch --main_process_ip $HEAD --main_process_port 1234 train.py\n")
    endpoint = read_launch_script(str(accelerate)).endpoint
    assert endpoint.master_port == 1234 and endpoint.unresolved == ["$HEAD"]
    assert read_launch_script(str(tmp_path / "missing.sh")).error.startswith("cannot read")



def test_the_launch_line_is_the_launcher_the_process_tools_recognise(tmp_path):
    """`accelerate config default` is no launch; `python -m torch.distributed.launch` is torchrun's endpoint."""
    script = tmp_path / "launch.sh"
    script.write_text("accelerate config default\n"
                      "accelerate launch --main_process_ip 10.0.0.1 --main_process_port 29600 train.py\n")
    endpoint = read_launch_script(str(script)).endpoint
    assert (endpoint.launcher, endpoint.line, endpoint.master_addr, endpoint.master_port) == ("accelerate", 2,
                                                                                             "10.0.0.1", 29600)
    script.write_text("python -u -m torch.distributed.launch --master_addr 10.0.0.2 --master_port 29601 t.py\n")
    endpoint = read_launch_script(str(script)).endpoint
    assert (endpoint.launcher, endpoint.master_addr, endpoint.master_port) == ("torchrun", "10.0.0.2", 29601)


def test_only_exported_names_and_the_launch_lines_own_prefixes_are_exports(tmp_path):
    """A plain `NAME=value` is a shell variable (no child sees it) unless the name is, or later gets, exported;
    `NAME=value cmd` is that command's alone, except on the launch line, where the launch gets it."""
    script = tmp_path / "launch.sh"
    script.write_text("MASTER_ADDR=10.0.0.9\n"            # 1: a shell variable only
                      "NCCL_DEBUG=INFO\n"                  # 2: exported by line 4
                      "NCCL_IB_DISABLE=1 python prep.py\n"  # 3: prep.py's alone
                      "export NCCL_DEBUG\n"                # 4
                      "NCCL_SOCKET_IFNAME=ens5\n"          # 5: already in the environment
                      "NCCL_P2P_DISABLE=1 nohup torchrun --master_port 29500 train.py\n")  # 6: the launch
    parsed = read_launch_script(str(script), {"NCCL_SOCKET_IFNAME": "eth0", "HOME": "/root"})
    exports = {name: (line.line, line.text) for name, line in parsed.exports.items()}
    assert exports == {"NCCL_DEBUG": (4, "INFO"), "NCCL_SOCKET_IFNAME": (5, "ens5"), "NCCL_P2P_DISABLE": (6, "1")}
    assert parsed.endpoint.master_addr is None  # torchrun never sees an unexported MASTER_ADDR
    script.write_text("MASTER_ADDR=10.0.0.7 torchrun --master_port 29500 train.py\n")
    assert read_launch_script(str(script)).endpoint.master_addr == "10.0.0.7"  # the launch line's own prefix

# --- on a real GPU (the `gpu` marker: skipped where NVML sees none) ----------------------------------------------


@pytest.mark.gpu
def test_on_a_gpu_the_probe_reads_cuda_nccl_and_names():
    env = find_training_env(mode="names")
    assert env.has_torch and env.cuda_available and env.cuda_devices >= 1, env.errors
    assert env.torch_cuda and env.nccl and env.nccl.count(".") == 2 and len(env.gpu_names) == env.cuda_devices
    assert env.distributed and env.nccl_backend and not env.errors


@pytest.mark.gpu
def test_on_a_gpu_our_reading_of_cuda_visible_devices_matches_what_torch_sees():
    """The parser is held to CUDA itself: for each value, torch in a child sees as many devices as we say."""
    from remote_gpu_trainer.health.tool import HealthInput, probe_gpus

    report = probe_gpus(HealthInput(), lambda *a, **k: None)
    uuids = [g.uuid for g in report.gpus]
    count = report.gpus_found
    values = ["0", f"{count}", f"0,{count}", uuids[0][:12], f"{uuids[-1]},0", "", "-1"]
    for value in values:
        shown, _ = visible_devices(value, count, uuids)
        seen = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": value}, capture_output=True, text=True,
                              timeout=120)
        assert int(seen.stdout.strip()) == len(shown), (value, shown, seen.stdout, seen.stderr[-500:])
