"""The user's training environment and the launch environment on loopback boxes that look like rented ones
(tests/sshbox.py: a clean system python3, the user's torch in ~/venvs/pt, Debian start-up files).

The issue's bar, over MCP: one pre-flight reports the torch/CUDA/NCCL versions of each node's own venv and flags
the node whose venv differs, the node whose login environment sets an NCCL_SOCKET_IFNAME it does not have, and a
head port held by a loopback-only listener; a second one fails a head name no node resolves. Then the tools that
take ``python=``/``activate=`` or find the environment themselves, each through ``host``.

The node whose venv differs holds a FAKE torch package (``2.12.0+cpu``): real torch releases cannot be installed
on this machine, and only its version and a broken ``torch.distributed`` matter to the check. It is labelled in
its own source.
"""

from __future__ import annotations

import subprocess
import sys
import time

import anyio
import pytest

from remote_gpu_trainer.processes.ports import suggest_free_port
from remote_gpu_trainer.registry import all_specs

from .sshbox import LoginEnv

pytestmark = pytest.mark.slow
SPECS = {spec.name: spec for spec in all_specs()}

HEAD, WORKER, IFNAME, OLD = "te-head", "te-worker", "te-ifname", "te-oldvenv"
FAKE_TORCH = {
    "torch/__init__.py": "# FAKE torch for the version-mismatch test (tests/test_training_env_remote.py): real torch\n"
                         "# releases cannot be installed here. It reports 2.12.0, and torch.distributed fails.\n"
                         "__version__ = '2.12.0+cpu'\nfrom . import version\n",
    "torch/version.py": "cuda = None\n",
    "torch/distributed/__init__.py": "raise ImportError('libtorch_distributed.so: cannot open shared object file "
                                     "(FAKE torch)')\n",
}
LAUNCH = """#!/bin/bash
# the user's launch script: activate the training venv, then torchrun
source ~/venvs/{venv}/bin/activate
export NCCL_IB_DISABLE=1
torchrun --nnodes=4 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port} train.py
"""


def fake_torch_venv(fleet, alias: str, name: str = "old"):
    """``~/venvs/<name>`` on the box: a venv of the box's python whose only package is the FAKE torch above."""
    box = fleet.boxes[alias]
    venv = box.home / "venvs" / name
    subprocess.run([fleet.train_base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3.*")) / "site-packages"
    for relative, text in FAKE_TORCH.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(text)
    return venv


@pytest.fixture(scope="module")
def env_fleet(ssh_fleet):
    """Four boxes: the head, a plain worker, a worker whose ~/.config/train/env (sourced by .bashrc) names an
    interface it lacks, and a worker whose launch script activates another venv (FAKE torch 2.12.0)."""
    logins = {HEAD: LoginEnv(), WORKER: LoginEnv(), OLD: LoginEnv(),
              IFNAME: LoginEnv(env_file={"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth9"})}
    for number, (alias, login) in enumerate(logins.items()):
        if alias not in ssh_fleet.boxes:
            ssh_fleet.add(alias, scenario="healthy-8xh100", login=login,
                          server="asyncssh" if number == 1 else None)
            ssh_fleet.install_runtime(alias)
    if not (ssh_fleet.boxes[OLD].home / "venvs" / "old").exists():
        fake_torch_venv(ssh_fleet, OLD)
    return ssh_fleet


def _loopback_holder(port: int) -> subprocess.Popen:
    code = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('127.0.0.1', {port})); s.listen(); print('ready', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert holder.stdout.readline().strip() == "ready"
    return holder


async def _preflight(client, arguments: dict, timeout_s: float = 240) -> dict:
    """Over MCP as a client that gives up after a minute would call it: start, then poll the job."""
    result = (await client.call_tool("preflight", {**arguments, "wait_s": 0})).structured_content
    deadline = time.monotonic() + timeout_s
    while not result["done"] and time.monotonic() < deadline:
        await anyio.sleep(0.5)
        result = (await client.call_tool("preflight", {"job_id": result["job_id"]})).structured_content
    assert result["done"], result
    done = await client.call_tool("preflight", {"job_id": result["job_id"]})
    return {**done.structured_content, "text": done.content[0].text}


@pytest.fixture(scope="module")
def preflight(env_fleet):
    """One pre-flight over MCP of the four boxes, the head's port held by a listener on 127.0.0.1 only."""
    from mcp import Client

    from remote_gpu_trainer.server import build_server

    port = suggest_free_port(29400, 500)
    for alias in (HEAD, WORKER, IFNAME, OLD):
        venv = "old" if alias == OLD else "pt"
        (env_fleet.boxes[alias].home / "launch.sh").write_text(LAUNCH.format(venv=venv, port=port))
    holder = _loopback_holder(port)

    async def go() -> dict:
        async with Client(build_server(), mode="legacy") as client:
            return await _preflight(client, {"hosts": [HEAD, WORKER, IFNAME, OLD], "port": port, "timeout_s": 120,
                                             "checkpoint_dir": "/tmp", "launch": "~/launch.sh"})

    try:
        result = anyio.run(go)
    finally:
        holder.kill()
        holder.wait()
    result["holder_pid"] = holder.pid
    print(result["text"])  # the per-node report, as a person reads it (pytest -s)
    return result


def _rows(result: dict) -> dict[str, dict]:
    return {r["host"]: r for r in result["hosts"]}


def _checks(row: dict) -> dict[str, dict]:
    return {c["name"]: c for c in row["checks"]}


def test_each_node_reports_the_versions_of_its_own_venv(preflight, env_fleet):
    rows = _rows(preflight)
    for host in (HEAD, WORKER, IFNAME):
        training = rows[host]["facts"]["torch"]
        assert training["python"] == str(env_fleet.boxes[host].train_python)
        assert training["source"] == "launch_script" and "launch.sh line 3" in training["found_by"]
        assert training["torch"].startswith("2.13") and training["torch_imported"] and training["distributed"]
        torch = _checks(rows[host])["torch"]
        assert torch["verdict"] == "PASS" and "torch 2.13" in torch["observed"] and "CUDA none" in torch["observed"]
        assert "NCCL -" in torch["observed"]  # a CPU build: no NCCL, said so rather than guessed
        assert "~/venvs/pt/bin/python" in torch["observed"]


def test_the_node_whose_venv_differs_is_flagged_with_what_could_be_read(preflight):
    old = _rows(preflight)[OLD]
    training = old["facts"]["torch"]
    assert training["display"] == "~/venvs/old/bin/python" and training["torch"] == "2.12.0+cpu"
    assert training["torch_imported"] and training["distributed"] is False
    assert "cannot open shared object file" in training["errors"]["distributed"]  # the partial reading survived
    torch = _checks(old)["torch"]
    assert torch["verdict"] == "FAIL" and "torch 2.12.0+cpu" in torch["observed"]
    assert "torch.distributed does not" in torch["explanation"]
    assert "runtime" not in torch["explanation"].replace("not the skill's runtime", "")  # never "install it there"
    across = {c["name"]: c for c in preflight["fleet_checks"]}
    assert across["torch_version"]["verdict"] == "FAIL" and across["torch_version"]["hosts"] == [OLD]
    assert "2.12.0+cpu (CUDA none): te-oldvenv" in across["torch_version"]["observed"]
    assert across["training_python"]["hosts"] == [OLD]
    assert across["launch_script"]["verdict"] == "WARN" and across["launch_script"]["hosts"] == [OLD]


def test_a_login_env_interface_the_node_lacks_fails_that_node(preflight):
    rows = _rows(preflight)
    ifname = rows[IFNAME]
    check = _checks(ifname)["nccl_socket_ifname"]
    assert check["verdict"] == "FAIL" and check["observed"].startswith("NCCL_SOCKET_IFNAME=eth9 (login shell")
    assert "no interface on this node matches it" in check["explanation"] and check["entry"]["id"] == "NODE-01"
    setting = next(s for s in ifname["facts"]["launch_env"]["settings"] if s["name"] == "NCCL_SOCKET_IFNAME")
    assert setting["interactive_only"] is True  # .bashrc's file: `ssh node cmd` never sees it
    # the node's own value and our recommendation are two different things, each shown as what it is
    assert ifname["nccl_socket_ifname"] == "eth9" and ifname["route_iface"] == "lo"
    assert rows[WORKER]["nccl_socket_ifname"] is None
    assert preflight["nccl_env"]["NCCL_SOCKET_IFNAME"] == "=lo"
    across = {c["name"]: c for c in preflight["fleet_checks"]}
    assert across["env NCCL_SOCKET_IFNAME"]["hosts"] == [IFNAME]
    assert "env NCCL_IB_DISABLE" not in across  # the same export in every launch script


def test_a_loopback_only_holder_of_the_port_is_named_and_still_reached(preflight):
    rows = _rows(preflight)
    port = _checks(rows[HEAD])["head_port"]
    assert port["verdict"] == "FAIL" and f"pid {preflight['holder_pid']}" in port["observed"]
    assert "127.0.0.1:" in port["observed"] and "loopback only" in port["observed"]
    assert "listens on loopback only" in port["explanation"]
    holder = rows[HEAD]["facts"]["port_holders"][0]
    assert holder["loopback_only"] and "time.sleep(300)" in holder["command"]  # the whole command line
    reach = _checks(rows[WORKER])["head_reachable"]
    assert reach["verdict"] == "PASS" and "holding it answered" in reach["explanation"]  # a verdict, not UNKNOWN


def test_the_launch_scripts_endpoint_is_checked(preflight):
    endpoint = _checks(_rows(preflight)[WORKER])["launch_endpoint"]
    assert endpoint["verdict"] == "PASS" and "torchrun at launch script line 5" in endpoint["observed"]


def test_the_report_shows_every_finding_per_host_and_separates_cannot_check(preflight):
    assert preflight["verdict"] == "FAIL"
    summary = preflight["summary"]
    assert summary.startswith("FAIL: 4 host(s) — fail on 3: ")
    for part in (f"{HEAD} (head_port)", f"{IFNAME} (nccl_socket_ifname)", f"{OLD} (torch, torch_version)"):
        assert part in summary, summary
    text = preflight["text"]
    assert "findings per host" in text and "NCCL_SOCKET_IFNAME=eth9 (login shell" in text
    assert "suggested environment (our recommendation" in text and "export NCCL_SOCKET_IFNAME==lo" in text
    long_line = next(line for line in text.splitlines() if "nccl_socket_ifname:" in line)
    assert len(long_line) <= 112  # wrapped, and the rest follows on the next lines, not cut
    assert "'no socket interface found'" in " ".join(text.split())


def test_a_head_name_no_node_resolves_is_a_failure(env_fleet):
    from mcp import Client

    from remote_gpu_trainer.server import build_server

    async def go() -> dict:
        async with Client(build_server(), mode="auto") as client:
            return await _preflight(client, {"hosts": [HEAD, WORKER], "head_addr": "no-such-head.invalid",
                                             "port": suggest_free_port(29400, 500), "checkpoint_dir": "/tmp",
                                             "timeout_s": 90})

    result = anyio.run(go)
    for row in result["hosts"]:
        route = _checks(row)["route_to_head"]
        assert route["verdict"] == "FAIL" and "no-such-head.invalid does not resolve" in route["observed"], route
        assert "head_reachable" not in _checks(row)  # one finding for one cause
    assert result["verdict"] == "FAIL"


# --- the tools that take the environment, through host -------------------------------------------------------


def call(tool: str, **arguments):
    return SPECS[tool].call(arguments)


def test_gpu_health_and_skill_info_say_when_the_login_env_hides_gpus(env_fleet):
    env_fleet.add("te-cvd", scenario="healthy-8xh100",
                  login=LoginEnv(env_file={"NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "2"}))
    env_fleet.install_runtime("te-cvd")
    health = call("gpu_health", host="te-cvd")
    check = next(c for c in health.host_checks if c.name == "cuda_visible_devices")
    assert check.verdict.value == "WARN" and "ranks see 1 of 8 GPUs" in check.explanation
    assert "login env sets CUDA_VISIBLE_DEVICES=2" in check.explanation
    assert health.verdict.value == "WARN"
    info = call("skill_info", host="te-cvd")
    assert info.cuda_visible_devices.verdict.value == "WARN" and "1 of 8" in info.cuda_visible_devices.explanation
    plain = call("gpu_health", host=WORKER)
    assert not any(c.name == "cuda_visible_devices" for c in plain.host_checks)


def test_skill_info_reports_the_users_torch_and_how_it_was_found(env_fleet):
    found = call("skill_info", host=WORKER)
    assert found.training_env.source == "login_shell" and found.training_env.display == "~/venvs/pt/bin/python"
    torch = next(b for b in found.backends if b.name == "torch")
    assert torch.available and torch.version.startswith("2.13") and "login shell" in torch.detail
    assert [c.where for c in found.training_env.candidates][:1] == ["`python` on the login shell's PATH (bash -l -i)"]
    chosen = call("skill_info", host=OLD, python="~/venvs/old/bin/python", probe_torch=True)
    assert chosen.training_env.source == "python" and chosen.training_env.torch == "2.12.0+cpu"
    assert "distributed" in chosen.training_env.errors  # a partial reading, not "no torch"
    activated = call("skill_info", host=OLD, activate="source ~/venvs/pt/bin/activate")
    assert activated.training_env.display == "~/venvs/pt/bin/python" and activated.training_env.torch.startswith("2.13")
    assert activated.training_env.activation["VIRTUAL_ENV"].endswith("/venvs/pt")


def test_a_sourced_file_is_data_never_shell_code(env_fleet):
    home = env_fleet.boxes[WORKER].home
    marker = home / "pwned"  # the fixed script runs in the home directory: a relative `touch` would land here
    odd = home / "odd; touch pwned #" / "activate"
    odd.parent.mkdir(exist_ok=True)
    odd.write_text(f'export PATH="{env_fleet.boxes[WORKER].train_python.parent}:$PATH"\n')
    info = call("skill_info", host=WORKER, activate=f"source '{odd}'")
    assert info.training_env.source == "activate" and info.training_env.torch.startswith("2.13")
    assert not marker.exists()
    for hostile in ("source ~/x; touch pwned", "source ~/$(touch pwned)", "conda activate 'x;touch pwned'",
                    "source `touch pwned`"):
        with pytest.raises(Exception) as err:
            call("skill_info", host=WORKER, activate=hostile)
        assert "activate" in str(err.value), err.value
    assert not marker.exists()


def test_repro_and_amp_confirm_run_in_the_environment_they_are_given(env_fleet):
    report = call("repro_scaler_bug", host=WORKER, case="fp16_unscale", device="cpu",
                  python=str(env_fleet.boxes[WORKER].train_python))
    assert report.reproduced >= 1 and report.training_env.source == "python"
    missing = call("repro_scaler_bug", host=OLD, case="fp16_unscale", device="cpu", python="/usr/bin/python3")
    assert missing.verdict.value == "SKIP" and missing.torch_missing
    assert "remote-gpu-trainer[torch]" not in missing.torch_missing  # never into the skill's own venv on a box
    confirmed = call("amp_config_check", host=WORKER, precision="fp16", model_dtype="fp16", confirm=True,
                     device="cpu")
    assert confirmed.confirmations and confirmed.training_env.display == "~/venvs/pt/bin/python"


def test_measured_memory_runs_under_the_boxs_training_python(env_fleet):
    out = call("fsdp_memory_estimate", host=WORKER, model="gpt2", measure=True, seq_len=64, micro_batch_size=1,
               measure_timeout_s=300)
    assert out.measured is not None and out.measured.peak_bytes > 0, out.measured_skipped
    assert out.training_env.source == "login_shell"


def test_run_start_runs_a_bare_python_in_the_users_environment(env_fleet):
    box = env_fleet.boxes[WORKER]
    (box.home / "which.py").write_text("import sys, torch\nprint('python', sys.executable, 'torch', torch.__version__)"
                                       "\n")
    started = call("run_start", host=WORKER, argv=["python", "which.py"], cwd=str(box.home), name="which")
    assert started.training_env.source == "login_shell"
    deadline = time.monotonic() + 60
    status = call("run_status", run_id=started.run_id, host=WORKER)
    while status.state not in ("succeeded", "failed") and time.monotonic() < deadline:
        time.sleep(0.3)
        status = call("run_status", run_id=started.run_id, host=WORKER)
    log = call("run_logs", run_id=started.run_id, host=WORKER, lines=5).text
    assert status.state == "succeeded", log
    assert f"python {box.home}/venvs/pt/bin/python torch 2.13" in log


def test_nothing_leaks_onto_the_runtime_python(env_fleet):
    """The runtime's own python still has no torch: everything above ran in the user's environment."""
    from remote_gpu_trainer.remote.runtime import runtime_version

    python = f'"$HOME/.cache/remote-gpu-trainer/{runtime_version()}/venv/bin/python"'
    done = env_fleet.ssh(WORKER, f"{python} -c 'import importlib.util as u; print(u.find_spec(\"torch\"))'")
    assert done.stdout.strip() == "None", done.stdout + done.stderr
