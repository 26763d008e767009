#!/usr/bin/env bash
# The GPU suite in one call (about 6-7 minutes on one H100/H200; a hard budget of 450 s for the steps).
#
#   bash bench/gpu_suite.sh                 # from a checkout; results under $OUT (default ./gpu-suite-out)
#
# Needs only python3 with torch (CUDA build) and nvidia-ml-py on the box; everything else comes from
# wheels carried in .whl/ (bench/gpu_wheels.sh downloads them; RGT_SUITE_WHEELS=dir for another folder),
# installed with
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site:$PWD/tools
# Without a GPU every CUDA step skips; RGT_SUITE_FAKE_NVML=<scenario> then runs the NVML steps against
# the C-level fake libnvidia-ml of the tests (needs gcc and nvml.h), to try the script on a CPU box.
#
# Output: $OUT/main.log (the whole console, kept even if the run is cut), $OUT/gpu-suite.tgz (every
# step's files, written after each step) and, printed last, the markdown section for bench/RESULTS.md.
#
# Adding a step: write a function step_<name> that writes its files under "$STEP_DIR" (its exit status
# is the step's result; 77 means skipped) and add "<name> <timeout_s> [optional]" to STEPS below.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-suite-out}
WORK=${RGT_SUITE_WORK:-/tmp/rgt-gpu-suite}
SITE=$WORK-site
BUDGET_S=${RGT_SUITE_BUDGET_S:-450}  # RGT_SUITE_SKIP="hf_memory bench_health": step names to leave out
PY=${PYTHON:-python3}
mkdir -p "$OUT"
rm -rf "$WORK" && mkdir -p "$WORK"
exec > >(tee "$OUT/main.log") 2>&1
T0=$(date +%s)
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1 RGT_CACHE_DIR="$WORK/rgt-cache" RGT_RUNS_DIR="$WORK/rgt-runs"
unset PYTHONDONTWRITEBYTECODE  # as on a user's machine: bytecode cached after the first import
# No step leaves a warm health daemon behind (healthd.py): bench/gpu_health.py and the gpu test that measure and
# check it start their own in a private runtime directory and stop them.
export RGT_NO_DAEMON=1

STEPS=(
  "env 30"
  "install 90"
  "pytest_nvml 100"
  "health 45"
  "bench_health 100"
  "hf_memory 175"
  "repro_cuda 120"
  "orphan 60"
  "pytest_gpu 150 optional"
  "supervised_run 70 optional"
  "verify_gpu 50 optional"
)

have_cuda() { [ "$(cat "$WORK/cuda" 2>/dev/null)" = "yes" ]; }
have_nvml() { [ "$(cat "$WORK/nvml" 2>/dev/null)" = "yes" ]; }

step_env() {
  { date -u +"date %Y-%m-%dT%H:%M:%SZ"; uname -srm; nproc | sed 's/^/cpus /'; } | tee "$STEP_DIR/env.txt"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode,persistence_mode --format=csv \
      | tee -a "$STEP_DIR/env.txt"
  else
    echo "nvidia-smi: not installed" | tee -a "$STEP_DIR/env.txt"
  fi
  "$PY" - <<'PY' 2>&1 | tee -a "$STEP_DIR/env.txt"
import sys
print("python", sys.version.split()[0])
try:
    import torch
    cuda = torch.cuda.is_available()
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", cuda,
          torch.cuda.get_device_name(0) if cuda else "")
except Exception as err:
    print("torch: not importable:", err)
try:
    from importlib.metadata import version
    import pynvml  # noqa: F401
    print("nvidia-ml-py", version("nvidia-ml-py"))
except Exception as err:
    print("nvidia-ml-py:", type(err).__name__, err)
PY
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
    && echo yes > "$WORK/cuda" || echo no > "$WORK/cuda"
}

step_install() {
  local wheels=${RGT_SUITE_WHEELS:-$ROOT/.whl}
  if ls "$wheels"/*.whl >/dev/null 2>&1; then
    rm -rf "$SITE"  # beside $WORK, not in it: the tarball keeps results, not 50 MB of packages
    local installed=yes
    if ! timeout 80 "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$wheels"/*.whl; then
      echo "not every wheel fits $("$PY" -V) (wheels for several versions?): pip picks one per package"
      rm -rf "$SITE"
      # shellcheck disable=SC2046
      timeout 80 "$PY" -m pip install -q --no-index --no-deps --find-links "$wheels" --upgrade --target "$SITE" \
        $(find "$wheels" -maxdepth 1 -type f -name '*.whl' -printf '%f\n' | cut -d- -f1 | sort -u) || installed=no
    fi
    if [ "$installed" = no ]; then  # a half-filled folder would shadow what the python has
      echo "the wheels in $wheels do not install on $("$PY" -V): using what this python already has"
      rm -rf "$SITE"
      export PYTHONPATH="$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}"
    else
      export PYTHONPATH="$SITE:$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}"
    fi
  else
    echo "no wheels in $wheels: using what this python already has"
    export PYTHONPATH="$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}"
  fi
  echo "PYTHONPATH=$PYTHONPATH" > "$WORK/pythonpath"
  if [ -n "${RGT_SUITE_FAKE_NVML:-}" ]; then  # a CPU box: the NVML steps against the C-level fake
    "$PY" - "$RGT_SUITE_FAKE_NVML" "$WORK/fake-nvml" > "$WORK/fake-env" <<'PY' || return 1
import sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.nvml_fake import build, environment, write_scenario
work = Path(sys.argv[2])
env = environment(build(work / "lib"), write_scenario(sys.argv[1], work / "scenario.nvml"))
print("\n".join(f"export {k}='{v}'" for k, v in env.items()))
PY
    # shellcheck source=/dev/null
    . "$WORK/fake-env" && cat "$WORK/fake-env"
  fi
  "$PY" -m remote_gpu_trainer info 2>&1 | tee "$STEP_DIR/info.txt" | head -20
  "$PY" -c "from remote_gpu_trainer.nvml_session import nvml_status; import sys; s = nvml_status(30); \
print(s.detail); sys.exit(0 if s.ok else 1)" && echo yes > "$WORK/nvml" || echo no > "$WORK/nvml"
  [ "${installed:-yes}" = yes ]
}

step_pytest_nvml() {  # alone and first: a native fault in the in-process adapter test ends pytest
  have_nvml || { echo "no NVML here"; return 77; }
  "$PY" -m pytest -m gpu tests/test_health_gpu.py -o addopts= -q -rA -p no:cacheprovider 2>&1 \
    | tee "$STEP_DIR/pytest.txt" | tail -25
  return "${PIPESTATUS[0]}"
}

step_pytest_gpu() {  # every other gpu-marked file (the repro cases on CUDA are the repro_cuda step), each in
  # its own pytest process: a CUDA context an earlier file's test left in pytest would be a foreign GPU holder
  have_cuda || { echo "no CUDA here"; return 77; }
  local rc=0 file
  for file in tests/test_memory_gpu.py tests/test_hang_gpu.py tests/test_runs_gpu.py tests/test_trainenv.py; do
    "$PY" -m pytest -m gpu "$file" -o addopts= -q -rA -p no:cacheprovider 2>&1 | tee -a "$STEP_DIR/pytest.txt" \
      | tail -12
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
  return $rc
}

step_health() {
  local expect=""
  command -v nvidia-smi >/dev/null && expect="--expect-gpus $(nvidia-smi -L | grep -c '^GPU')"
  # shellcheck disable=SC2086
  "$PY" -m remote_gpu_trainer health $expect 2>"$STEP_DIR/health.err" | tee "$STEP_DIR/health.txt"
  local rc=${PIPESTATUS[0]}
  # shellcheck disable=SC2086
  "$PY" -m remote_gpu_trainer health $expect --json > "$STEP_DIR/health.json" 2>/dev/null
  echo "exit $rc"
  if [ "$rc" = 4 ] && ! have_nvml; then return 77; fi  # no GPU here: the answer is right, the step moot
  [ "$rc" -le 3 ]  # 0 PASS/WARN, 1 FAIL, 3 UNKNOWN are answers; 4 (no GPU) on a GPU box and crashes are not
}

step_bench_health() {
  "$PY" bench/gpu_health.py --runs 7 2>&1 | tee "$STEP_DIR/bench.txt"
  return "${PIPESTATUS[0]}"
}

step_repro_cuda() {
  have_cuda || { echo "no CUDA here"; return 77; }
  "$PY" -m remote_gpu_trainer repro all --variant all --device cuda --json > "$STEP_DIR/repro.json" \
    2> "$STEP_DIR/repro.err"
  local rc=$?
  "$PY" - "$STEP_DIR/repro.json" <<'PY' | tee "$STEP_DIR/repro.txt"
import json, sys
d = json.load(open(sys.argv[1]))
print(f"torch {d.get('torch_version')} on {d.get('device')}: {d.get('reproduced')} reproduced, "
      f"{d.get('problems')} problems, {d.get('seconds')} s")
for r in d.get("results", []):
    where = f" [{r['device_note']}]" if r.get("device_note") else ""
    print(f"{r['case']}/{r['variant']}: {r['status']} fixed={r['fixed_ok']}{where} :: {(r.get('message') or '')[:120]}")
PY
  return $rc
}

step_orphan() {
  have_cuda || { echo "no CUDA here"; return 77; }
  "$PY" bench/gpu_orphan.py --gib 2 --work "$STEP_DIR/orphan" 2>&1 | tee "$STEP_DIR/orphan.txt"
  local rc=${PIPESTATUS[0]}
  command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid,used_memory --format=csv \
    | tee -a "$STEP_DIR/orphan.txt"
  return "$rc"
}

step_supervised_run() {  # run_start -> run_status -> box_idle on the real GPU
  have_cuda || { echo "no CUDA here"; return 77; }
  cat > "$STEP_DIR/train_small.py" <<'PY'
import time, torch
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(1, 301):
    loss = model(torch.randn(128, 2048, device="cuda")).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 50 == 0:
        print(f"step {step}/300 loss {loss.item():.4f}", flush=True)
    time.sleep(0.02)
print("done")
PY
  "$PY" -m remote_gpu_trainer run start --name suite --json -- "$PY" "$STEP_DIR/train_small.py" \
    > "$STEP_DIR/run_start.json" 2> "$STEP_DIR/run_start.err" || { cat "$STEP_DIR/run_start.err"; return 1; }
  local rid
  rid=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$STEP_DIR/run_start.json")
  sleep 6
  "$PY" -m remote_gpu_trainer run status "$rid" 2>&1 | tee "$STEP_DIR/run_status.txt"
  "$PY" -m remote_gpu_trainer idle --window-s 3 --interval-s 1 2>&1 | tee "$STEP_DIR/idle_busy.txt"
  local state=""
  for _ in $(seq 40); do  # it trains for ~10-20 s and ends by itself
    state=$("$PY" -m remote_gpu_trainer run status "$rid" --json 2>/dev/null \
      | "$PY" -c "import json,sys; print(json.load(sys.stdin).get('state',''))")
    case $state in starting|running) sleep 1 ;; *) break ;; esac
  done
  "$PY" -m remote_gpu_trainer run status "$rid" 2>&1 | tail -8 | tee "$STEP_DIR/run_status_end.txt"
  [ "$state" = "succeeded" ]
}

step_hf_memory() {  # real Hugging Face classes: torch.cuda.max_memory_allocated against rgt mem (issue 28)
  have_cuda || { echo "no CUDA here"; return 77; }
  "$PY" bench/hf_memory_gpu.py --budget-s 150 --json-out "$STEP_DIR/hf_memory.json" 2>&1 \
    | grep -v loss_type | tee "$STEP_DIR/hf_memory.txt" | tail -30
  return "${PIPESTATUS[0]}"
}

step_verify_gpu() {  # the catalog claims issue 29 could only read on CPU (evals/verify/_gpu_checks.py)
  have_cuda || { echo "no CUDA here"; return 77; }
  "$PY" evals/verify/_gpu_checks.py 2>&1 | tee "$STEP_DIR/verify.txt"
  local rc=${PIPESTATUS[0]}
  "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 evals/verify/_gpu_checks.py --nccl 2>&1 \
    | tee -a "$STEP_DIR/verify.txt" | tail -5
  [ "$rc" = 0 ] && [ "${PIPESTATUS[0]}" = 0 ]
}

# --- the runner ---------------------------------------------------------------------------------------

save() { tar czf "$OUT/gpu-suite.tgz" -C "$(dirname "$WORK")" "$(basename "$WORK")" 2>/dev/null; }
trap save EXIT
printf 'step\tresult\tseconds\ttimeout_s\n' > "$WORK/steps.tsv"
for entry in "${STEPS[@]}"; do
  read -r name limit optional <<< "$entry"
  elapsed=$(( $(date +%s) - T0 ))
  left=$(( BUDGET_S - elapsed ))
  if [[ " ${RGT_SUITE_SKIP:-} " == *" $name "* ]]; then  # a rerun leaves out steps measured before
    printf '%s\tskipped (RGT_SUITE_SKIP)\t0\t%s\n' "$name" "$limit" >> "$WORK/steps.tsv"
    echo "=== $name: skipped (RGT_SUITE_SKIP)"
    continue
  fi
  if [ "$left" -lt 15 ] || { [ -n "${optional:-}" ] && [ "$left" -lt "$limit" ]; }; then
    printf '%s\tskipped (budget: %ss left)\t0\t%s\n' "$name" "$left" "$limit" >> "$WORK/steps.tsv"
    echo "=== $name: skipped, $left s of the ${BUDGET_S} s budget left"
    continue
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  STEP_DIR="$WORK/$name"
  mkdir -p "$STEP_DIR"
  echo
  echo "=== $name (t+${elapsed}s, limit ${limit}s)"
  [ -f "$WORK/pythonpath" ] && export "$(cat "$WORK/pythonpath")"
  # shellcheck source=/dev/null
  [ -f "$WORK/fake-env" ] && . "$WORK/fake-env"
  started=$(date +%s)
  export STEP_DIR WORK PY
  if [ "$name" = "env" ] || [ "$name" = "install" ]; then  # they set the environment of the later steps
    "step_$name"
    rc=$?
  else
    timeout --kill-after=10 "$limit" bash -c "$(declare -f have_cuda have_nvml "step_$name"); step_$name"
    rc=$?
  fi
  took=$(( $(date +%s) - started ))
  case $rc in 0) result=ok ;; 77) result=skipped ;; 124|137) result="timeout (${limit}s)" ;; *) result="FAILED (exit $rc)" ;; esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$took" "$limit" >> "$WORK/steps.tsv"
  echo "=== $name: $result in ${took}s"
  save
done

echo
echo "=== RESULTS.md section (t+$(( $(date +%s) - T0 ))s)"
"$PY" bench/gpu_suite_report.py "$WORK" "$(( $(date +%s) - T0 ))" | tee "$OUT/results-section.md"
save
