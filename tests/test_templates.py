"""The box-side templates (run_one, run_queue, health_patrol): declared variables match what each
template reads, every value is quoted, every template renders with every profile to a script that
parses and is shellcheck-clean, bad variables are refused, and the rendered scripts really work:
run_one detaches, logs and resumes a tiny CPU job; run_queue spreads jobs over GPU sets with their
own ports; health_patrol tells running, stale, stopped and finished apart without counting itself."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.providers import profile_paths
from remote_gpu_trainer.render import engine
from remote_gpu_trainer.render.templates import CONTEXT_NAMES, TEMPLATES, render_script, shell_checks

from .test_scripts_support import SCRIPTS, fake_env, shellcheck

TEMPLATE_DIR = SCRIPTS / "templates"
PROFILES = [p.stem for p in profile_paths()]
SAFE_FILTERS = ("q", "dq", "name", "comment", "int", "qjoin", "shell")


def _minimal(name: str) -> dict:
    return {"run_one": {"run_name": "exp1", "command": "python train.py --out \"$RGT_RUN_DIR\""},
            "run_queue": {"queue_name": "sweep", "gpu_sets": ["0", "1"], "jobs": ["python train.py --seed 1"]},
            "health_patrol": {"run_name": "exp1"}}[name]


def test_declared_variables_are_exactly_what_each_template_reads():
    """Every declared variable is read, and nothing else is (jinja2.meta, includes followed)."""
    for name, template in TEMPLATES.items():
        declared = {v.name for v in template.variables}
        source = (TEMPLATE_DIR / template.file).read_text()
        read = engine.undeclared(template.file)
        for partial in re.findall(r'\{% include "([^"]+)" %\}', source):
            read |= engine.undeclared(partial)
        assert declared | {"generated", "profile"} <= read <= declared | CONTEXT_NAMES, (name, read ^ declared)
    for partial in ("_lib.sh.j2", "_durable_dir.sh.j2"):
        assert engine.undeclared(partial) <= CONTEXT_NAMES, partial


def test_every_value_in_a_shell_template_goes_through_a_quoting_filter():
    expression = re.compile(r"\{\{(.*?)\}\}", re.S)
    for path in [*TEMPLATE_DIR.glob("*.sh.j2"), *TEMPLATE_DIR.glob("*.sbatch.j2")]:
        for match in expression.finditer(path.read_text()):
            body = match.group(1).strip()
            last = body.rsplit("|", 1)[-1].strip().split("(")[0] if "|" in body else None
            assert last in SAFE_FILTERS, f"{path.name}: {{{{ {body} }}}} is not quoted by a safe filter"


@pytest.mark.parametrize("provider", PROFILES)
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_template_renders_with_every_profile(name, provider):
    _, _, text = render_script(name, _minimal(name), provider)
    checks = {c.name: c for c in shell_checks(text)}
    assert checks["bash_syntax"].verdict == "PASS", checks["bash_syntax"].observed
    assert checks["shellcheck"].verdict == "PASS", checks["shellcheck"].observed
    assert f"provider={provider}" in text
    if name != "health_patrol":
        assert 'export HF_HOME="' in text  # paths from the profile's script_overrides


def test_rendered_help_works_before_any_setting_is_evaluated(tmp_path):
    # lambda's durable_dir needs LAMBDA_FS_NAME; --help must not.
    _, _, text = render_script("run_queue", _minimal("run_queue"), "lambda")
    script = tmp_path / "q.sh"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "LAMBDA_FS_NAME"}
    out = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0 and "Usage: run_queue.sh" in out.stdout


def test_rendered_scripts_pass_shellcheck_at_style_severity(tmp_path):
    extra = {"run_one": {"env": {"WANDB_MODE": "offline"}, "hf_offline": True, "nccl_socket_ifname": "=ens5"},
             "run_queue": {"env": {"WANDB_MODE": "offline"}, "omp_num_threads": 4, "keep_waiting": True},
             "health_patrol": {"on_alert": "curl -fsS -d \"$RGT_ALERT\" https://example.invalid/hook",
                               "expect_gpus": 8}}
    for name in TEMPLATES:
        _, _, text = render_script(name, {**_minimal(name), **extra[name]}, "vastai")
        path = tmp_path / f"{name}.sh"
        path.write_text(text)
        out = subprocess.run([shellcheck(), "--severity=style", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


@pytest.mark.parametrize(("name", "variables", "provider", "field", "fragment"), [
    ("run_one", {"run_name": "x", "command": "true", "bogus": 1}, "runpod", "variables", "unknown variable(s) bogus"),
    ("run_one", {"command": "true"}, "runpod", "variables", "missing required variable(s) run_name"),
    ("run_one", {"run_name": "x", "command": "true"}, None, "variables", "missing required variable(s) run_dir"),
    ("run_one", {"run_name": "x y", "command": "true"}, "runpod", "variables.run_name", "letters, digits"),
    ("run_one", {"run_name": "x", "command": ""}, "runpod", "variables", "missing required"),
    ("run_one", {"run_name": "x", "command": "true", "run_dir": "~/runs"}, None, "variables.run_dir", "not expanded"),
    ("run_one", {"run_name": "x", "command": "true", "gpus": "0;rm -rf /"}, "runpod", "variables.gpus",
     "CUDA_VISIBLE_DEVICES"),
    ("run_one", {"run_name": "x", "command": "true", "env": {"RGT_RUN_DIR": "/x"}}, "runpod", "variables.env",
     "reserved"),
    ("run_one", {"run_name": "x", "command": "true", "env": {"A-B": "1"}}, "runpod", "variables.env",
     "not an environment variable name"),
    ("run_one", {"run_name": "x", "command": "true", "max_restarts": 500}, "runpod", "variables.max_restarts",
     "between 0 and 100"),
    ("run_one", {"run_name": "x", "command": "true", "hf_offline": "yes"}, "runpod", "variables.hf_offline",
     "true or false"),
    ("run_queue", {"queue_name": "q", "gpu_sets": ["0,1", "1,2"]}, "runpod", "variables.gpu_sets", "PAR-01"),
    ("run_queue", {"queue_name": "q", "gpu_sets": []}, "runpod", "variables.gpu_sets", "list of 1 to 64"),
    ("health_patrol", {"run_name": "x", "interval_s": 0}, "runpod", "variables.interval_s", "between 1"),
    ("run_one", {"run_name": "x", "command": "true"}, "nowhere-cloud", "provider", "unknown provider"),
])
def test_bad_variables_are_refused_with_the_field_named(name, variables, provider, field, fragment):
    with pytest.raises(InputError) as caught:
        render_script(name, variables, provider)
    assert caught.value.field == field and fragment in str(caught.value), str(caught.value)


def test_missing_variables_error_lists_the_required_ones():
    with pytest.raises(InputError) as caught:
        render_script("run_one", {}, None)
    text = str(caught.value)
    assert "required: run_name, command, run_dir" in text and "gpus (optional)" in text


def test_hostile_values_stay_literal(tmp_path):
    marker = tmp_path / "pwned"
    command = f"echo 'it''s fine' > {tmp_path}/out; echo $((1+1)) >> {tmp_path}/out"
    _, _, text = render_script("run_one", {"run_name": "x", "command": command, "run_dir": str(tmp_path / "run"),
                                           "env": {"NOTE": f"$(touch {marker}) `touch {marker}` \" ' \\"}}, None)
    assert shell_checks(text)[0].verdict == "PASS"
    function = text[text.index("training_env() {"):]
    function = function[: function.index("\n}\n") + 3]
    out = subprocess.run(["bash", "-c", function + 'training_env; printf "%s" "$NOTE"'], capture_output=True,
                         text=True, check=True)
    assert not marker.exists(), "an env value was executed"
    assert out.stdout == f"$(touch {marker}) `touch {marker}` \" ' \\"


# ------------------------------------------------------------------------------ run_one, for real

TRAIN = '''
import json, os, sys, time
total, delay = int(sys.argv[1]), float(sys.argv[2])
run = os.environ["RGT_RUN_DIR"]
ckpt = os.path.join(run, "ckpt.json")
step = 0
if os.path.exists(ckpt):
    step = json.load(open(ckpt))["step"]
    print(f"resumed from step {step} (RGT_RESUME={os.environ['RGT_RESUME']})")
print("unbuffered:", os.environ.get("PYTHONUNBUFFERED"), "gpus:", os.environ.get("CUDA_VISIBLE_DEVICES"))
while step < total:
    time.sleep(delay)
    step += 1
    with open(ckpt + ".tmp", "w") as handle:
        json.dump({"step": step}, handle)
    os.replace(ckpt + ".tmp", ckpt)
    with open(os.environ["RGT_HEARTBEAT_FILE"], "w") as handle:
        handle.write(f"{step} {time.time()}")
    print(f"step {step}")
print("training complete")
'''


class Run:
    """A rendered run_one.sh in a temp directory, and the helpers to drive it."""

    def __init__(self, folder: Path, total: int, delay: float, **variables):
        self.folder = folder
        self.dir = folder / "run"
        (folder / "train.py").write_text(TRAIN)
        command = f"{sys.executable} train.py {total} {delay}"
        _, _, text = render_script("run_one", {"run_name": "tiny", "command": command, "run_dir": str(self.dir),
                                               "gpus": "0", **variables}, None)
        self.script = folder / "run_one.sh"
        self.script.write_text(text)
        self.script.chmod(0o755)

    def __call__(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.script), *args], capture_output=True, text=True, timeout=timeout,
                              cwd="/", env=fake_env())

    def step(self) -> int:
        try:
            return int((self.dir / "heartbeat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def wait_step(self, at_least: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.step() < at_least:
            assert time.monotonic() < deadline, f"stuck at step {self.step()}: {self.log()}"
            time.sleep(0.05)

    def wait_exit_code(self, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while not (self.dir / "exit_code").exists():
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.05)
        return (self.dir / "exit_code").read_text().strip()

    def log(self) -> str:
        return (self.dir / "train.log").read_text() if (self.dir / "train.log").exists() else ""

    def pgid(self) -> int:
        return int((self.dir / "pgid").read_text())

    def kill(self) -> None:
        try:
            os.killpg(self.pgid(), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.fixture
def make_run(tmp_path):
    runs: list[Run] = []

    def make(total: int = 20, delay: float = 0.1, **variables) -> Run:
        folder = tmp_path / f"r{len(runs)}"
        folder.mkdir()
        run = Run(folder, total, delay, **variables)
        runs.append(run)
        return run

    yield make
    for run in runs:  # never leave processes behind
        run.kill()


def _group_alive(pgid: int) -> bool:
    """A live (non-zombie) process is in group ``pgid``. Zombies count as gone: they hold nothing and
    wait for whoever adopted them (PID 1 here) to reap them."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_run_one_detaches_logs_and_resumes_after_a_kill(make_run):
    run = make_run(total=40, delay=0.1)
    started = time.monotonic()
    result = run("start")
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.monotonic() - started < 5, "start must return at once, not wait for the job"
    pgid = run.pgid()
    stat = Path(f"/proc/{pgid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    assert int(fields[3]) == pgid, "the supervisor leads its own session (setsid)"
    run.wait_step(5)
    assert run("status").returncode == 0 and "running" in run("status").stdout
    assert "unbuffered: 1 gpus: 0" in run.log() and "step 5" in run.log()

    again = run("start")
    assert again.returncode == 3 and "already running" in again.stdout

    os.killpg(pgid, signal.SIGKILL)  # a crash: no exit code written
    deadline = time.monotonic() + 5
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    reached = run.step()
    status = run("status")
    assert status.returncode == 1 and "dead" in status.stdout

    assert run("start").returncode == 0
    assert run.wait_exit_code() == "0"
    log = run.log()
    assert f"resumed from step {reached} (RGT_RESUME=1)" in log
    assert "previous attempt died without an exit code" in log
    assert log.count("step 1\n") == 1, "the second start must not begin again from step 0"
    assert "training complete" in log
    final = run("status")
    assert final.returncode == 3 and "finished, exit code 0" in final.stdout
    assert (run.dir / "attempts").read_text().strip() == "2"


def test_run_one_stop_sends_sigterm_to_the_group_and_records_it(make_run):
    run = make_run(total=500, delay=0.1, stop_grace_s=10)
    assert run("start").returncode == 0
    run.wait_step(2)
    pgid = run.pgid()
    stopped = run("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not _group_alive(pgid)
    assert run.wait_exit_code() == "143"
    assert (run.dir / "state").read_text().strip() == "stopped"
    assert run("status").returncode == 1
    assert run("stop").stdout.strip() == "not running"


def test_run_one_restarts_a_failing_command_until_the_budget_is_spent(make_run, tmp_path):
    run = make_run(max_restarts=2, restart_delay_s=1)
    text = run.script.read_text().replace(f"COMMAND='{sys.executable} train.py 20 0.1'", "COMMAND='exit 7'")
    run.script.write_text(text)
    assert run("start").returncode == 0
    assert run.wait_exit_code(timeout=20) == "7"
    log = run.log()
    assert log.count("command exited with status 7") == 3 and "restart 2 of 2" in log
    assert (run.dir / "state").read_text().strip() == "failed"


def test_run_one_reused_group_id_is_not_mistaken_for_the_run(make_run):
    run = make_run()
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        run.dir.mkdir(parents=True)
        (run.dir / "pgid").write_text(f"{other.pid}\n")
        (run.dir / "token").write_text("some-old-token\n")
        status = run("status")
        assert status.returncode == 1 and "dead" in status.stdout
        assert run("stop").stdout.strip() == "not running"
        assert other.poll() is None, "a process outside the run must never be signalled"
    finally:
        other.kill()
        other.wait()


# ----------------------------------------------------------------------------- run_queue, for real


def test_run_queue_spreads_jobs_over_gpu_sets_with_their_own_ports(tmp_path):
    queue_dir = tmp_path / "queue"
    job = (f"{sys.executable} -c \"import os, time; time.sleep(0.3); "
           "open(os.environ['RGT_JOB_DIR'] + '/seen', 'w').write("
           "os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + os.environ['RGT_PORT'] + ' ' + os.environ['OMP_NUM_THREADS'])\"")
    _, _, text = render_script("run_queue", {"queue_name": "sweep", "gpu_sets": ["0", "1"], "queue_dir": str(queue_dir),
                                             "jobs": [job] * 4 + ["exit 3"], "base_port": 29710}, None)
    script = tmp_path / "run_queue.sh"
    script.write_text(text)

    def q(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=60)

    assert "init: 5 job(s) added" in q("init").stdout
    assert "init: 0 job(s) added, 5 already known" in q("init").stdout
    assert "added 0006-extra" in q("add", job, "extra").stdout
    try:
        assert "2 worker(s) started" in q("start").stdout
        deadline = time.monotonic() + 40
        while q("status").returncode == 0:
            assert time.monotonic() < deadline, q("status").stdout
            time.sleep(0.2)
        status = q("status")
        assert status.returncode == 1 and "0 pending, 0 running, 5 done, 1 failed" in status.stdout
        seen = [(queue_dir / "runs" / d.name / "seen").read_text().split() for d in (queue_dir / "runs").iterdir()
                if (queue_dir / "runs" / d.name / "seen").exists()]
        assert len(seen) == 5
        assert {gpus for gpus, _, _ in seen} == {"0", "1"}
        assert {(gpus, port) for gpus, port, _ in seen} == {("0", "29710"), ("1", "29711")}
        assert {threads for _, _, threads in seen} == {str(max(1, os.cpu_count() // 2))}
        assert (queue_dir / "runs" / "0005-job005" / "exit_code").read_text().strip() == "3"
        assert "requeued 0005-job005" in q("requeue-failed").stdout
    finally:
        q("stop", "--force")


@pytest.mark.parametrize("slow_mkdir", [False, True], ids=["while-the-job-runs", "during-the-workers-bookkeeping"])
def test_run_queue_stop_puts_the_running_job_back(tmp_path, slow_mkdir):
    """`stop` signals the worker's whole process group, the worker's own short commands (mkdir, mv, date) included.
    One of them killed by the SIGTERM ends the worker under `set -e`; the job it had claimed must still go back to
    pending, not stay in running/ until the next start. A slow `mkdir` of the job's folder holds the worker there."""
    queue_dir = tmp_path / "queue"
    _, _, text = render_script("run_queue", {"queue_name": "q", "gpu_sets": ["0"], "queue_dir": str(queue_dir),
                                             "jobs": ["sleep 30"], "stop_grace_s": 10}, None)
    script = tmp_path / "q.sh"
    script.write_text(text)
    env = dict(os.environ)
    if slow_mkdir:
        shims = tmp_path / "shims"
        shims.mkdir()
        real_mkdir = subprocess.run(["bash", "-c", "command -v mkdir"], capture_output=True, text=True).stdout.strip()
        (shims / "mkdir").write_text(f'#!/bin/bash\ncase "$*" in */runs/*) sleep 5;; esac\nexec {real_mkdir} "$@"\n')
        (shims / "mkdir").chmod(0o755)
        env["PATH"] = f"{shims}:{env['PATH']}"

    def q(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=60, env=env)

    q("init")
    try:
        q("start")
        deadline = time.monotonic() + 10
        while not list((queue_dir / "running" / "0").glob("*.job")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        if slow_mkdir:
            time.sleep(0.5)  # the worker is now inside the slow mkdir of the job's folder
        stop = q("stop")
        assert stop.returncode == 0, stop.stdout
        assert [p.name for p in (queue_dir / "pending").glob("*.job")] == ["0001-job001.job"]
        assert not list((queue_dir / "running" / "0").glob("*.job"))
    finally:
        q("stop", "--force")


def test_run_queue_claims_are_atomic_under_contention(tmp_path):
    """Eight claimers race for 40 jobs: every job is taken exactly once."""
    queue_dir = tmp_path / "queue"
    _, _, text = render_script("run_queue", {"queue_name": "q", "gpu_sets": [str(i) for i in range(8)],
                                             "queue_dir": str(queue_dir), "jobs": ["true"] * 40}, None)
    script = tmp_path / "q.sh"
    script.write_text(text)
    subprocess.run(["bash", str(script), "init"], check=True, capture_output=True)
    body = text.split('case "${1:-}" in\n  init)')[0]  # the functions, without the command dispatch
    claimer = tmp_path / "claimer.sh"
    claimer.write_text(body + 'layout\nwhile f=$(claim "$1"); do echo "$f"; done\n')
    claimers = [subprocess.Popen(["bash", str(claimer), str(slot)], stdout=subprocess.PIPE, text=True)
                for slot in range(8)]
    taken = [line for c in claimers for line in c.communicate(timeout=60)[0].split()]
    assert len(taken) == 40 and len(set(taken)) == 40


# --------------------------------------------------------------------------- health_patrol, for real


def test_health_patrol_tells_running_stale_stopped_and_finished_apart(make_run, tmp_path):
    run = make_run(total=60, delay=0.1)
    _, _, text = render_script("health_patrol", {"run_name": "tiny", "run_dir": str(run.dir), "interval_s": 1,
                                                 "heartbeat_max_age_s": 5, "min_free_gb": 0}, None)
    patrol = run.folder / "health_patrol.sh"
    patrol.write_text(text)
    env = fake_env("healthy-h100x2", FAKE_DMESG_FILE=str(SCRIPTS.parent / "tests/fixtures/nvidia-smi/dmesg-clean.log"),
                   GPU_HEALTH_CMD=f"{SCRIPTS / 'gpu_health.sh'} --tsv")

    def poll() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(patrol), "once"], capture_output=True, text=True, timeout=60, env=env)

    assert poll().returncode == 4  # never started
    assert run("start").returncode == 0
    run.wait_step(3)
    ok = poll()
    assert ok.returncode == 0 and " running " in ok.stdout and "gpu ok" in ok.stdout, ok.stdout
    env_ecc = {**env, "FAKE_NVSMI_SCENARIO": str(SCRIPTS.parent / "tests/fixtures/nvidia-smi/ecc-error-h100x2.json")}
    sick = subprocess.run(["bash", str(patrol), "once"], capture_output=True, text=True, timeout=60, env=env_ecc)
    assert sick.returncode == 1 and "ALERT: GPU health FAIL" in sick.stdout and "GOT-19" in sick.stdout, sick.stdout

    os.killpg(run.pgid(), signal.SIGSTOP)  # a silent hang: alive, no progress (MON-04 verify)
    try:
        stopped = poll()
        assert stopped.returncode == 1 and " stopped " in stopped.stdout
        beat = run.dir / "heartbeat"
        old = time.time() - 60
        os.utime(beat, (old, old))
        os.kill(run.pgid(), signal.SIGCONT)  # the supervisor runs again, the python child stays stopped
        stale = poll()
        assert stale.returncode == 1 and " stale " in stale.stdout and "MON-04" in stale.stdout
    finally:
        os.killpg(run.pgid(), signal.SIGCONT)
    assert run.wait_exit_code() == "0"
    done = poll()
    assert done.returncode == 3 and "finished" in done.stdout and "exit 0" in done.stdout


def test_health_patrol_loop_reports_the_end_and_never_counts_itself(make_run):
    run = make_run(total=15, delay=0.1)
    _, _, text = render_script("health_patrol", {"run_name": "tiny", "run_dir": str(run.dir), "interval_s": 1,
                                                 "min_free_gb": 0}, None)
    patrol = run.folder / "health_patrol.sh"
    patrol.write_text(text)
    env = fake_env(None, PATH=f"/usr/bin:/bin:{Path(sys.executable).parent}")
    assert run("start").returncode == 0
    started = subprocess.run(["bash", str(patrol), "start"], capture_output=True, text=True, timeout=30, env=env)
    assert started.returncode == 0, started.stdout
    patrol_pgid = int((run.dir / "patrol" / "pgid").read_text())
    try:
        # the patrol's own command line names neither the run's command nor its script
        cmdline = Path(f"/proc/{patrol_pgid}/cmdline").read_bytes().decode()
        assert "train.py" not in cmdline
        assert run.wait_exit_code() == "0"
        deadline = time.monotonic() + 15
        while _group_alive(patrol_pgid):
            assert time.monotonic() < deadline, (run.dir / "patrol" / "patrol.log").read_text()
            time.sleep(0.1)
        log = (run.dir / "patrol" / "patrol.log").read_text()
        assert "finished" in log and "exit 0" in log and "the run has ended (finished); patrol exits" in log
    finally:
        try:
            os.killpg(patrol_pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
