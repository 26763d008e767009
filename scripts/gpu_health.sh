#!/usr/bin/env bash
# gpu_health.sh — GPU pre-flight from nvidia-smi alone: the fallback for `rgt health` / gpu_health when
# the Python package cannot be installed on the box. Read-only: it only queries, never resets or kills.
#
# Verdicts follow the same rules as the gpu_health tool (thresholds from DCGM level-1 diagnostics,
# NVIDIA's Xid catalog and device plugin, Meta GCM): FAIL means "do not train here", WARN "trainable,
# read the note", UNKNOWN "could not read it" (never reported as PASS), SKIP "this GPU/driver lacks it".
set -euo pipefail

readonly EXIT_OK=0 EXIT_FAIL=1 EXIT_USAGE=2 EXIT_UNKNOWN=3 EXIT_NO_GPU=4
readonly IDLE_UTIL=10   # % utilisation below which a GPU counts as idle
readonly TEMP_MARGIN=10 # an idle GPU this close to its slowdown temperature has a cooling problem

usage() {
  cat <<'EOF'
Usage: gpu_health.sh [--expect-gpus N] [--require-empty] [--timeout S] [--tsv] [--help]

Checks every GPU with nvidia-smi: ECC errors, row remapping and page retirement, throttling
(HW slowdown, thermal, power brake), temperature against the GPU's own slowdown threshold,
persistence and compute mode, PCIe link width, power cap, MIG, processes holding VRAM, and
XIDs in the kernel log. Read-only.

Options:
  --expect-gpus N   FAIL when fewer than N GPUs are visible (e.g. a 7-GPU box rented as 8).
  --require-empty   FAIL (instead of WARN) when any process already holds GPU memory.
  --timeout S       seconds each nvidia-smi call may take (default 20); a hang is a FAIL (GOT-23).
  --tsv             machine-readable lines: verdict<TAB>gpu<TAB>check<TAB>observed<TAB>note
  -h, --help        this help

Environment: NVIDIA_SMI, DMESG and JOURNALCTL name the tools to call (defaults: nvidia-smi,
dmesg, journalctl; the kernel log falls back to `journalctl -k -b 0` when dmesg is refused).

Exit status (same as `rgt health`):
  0  PASS or WARN only: trainable (read the warnings)
  1  FAIL: do not train here (includes an nvidia-smi hang and fewer GPUs than --expect-gpus)
  2  bad usage
  3  UNKNOWN: nothing failed, but a signal could not be read (e.g. the kernel log in a container)
  4  no NVIDIA GPU here at all (no nvidia-smi, or no devices) and no --expect-gpus given

Catalog: references/gotchas_universal.md GOT-06..27 explain each finding.
EOF
}

die_usage() { echo "gpu_health.sh: $1" >&2; echo "Try: gpu_health.sh --help" >&2; exit "$EXIT_USAGE"; }

EXPECT=""
REQUIRE_EMPTY=0
TIMEOUT=20
TSV=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --expect-gpus) [[ $# -ge 2 ]] || die_usage "--expect-gpus needs a number"; EXPECT=$2; shift 2 ;;
    --expect-gpus=*) EXPECT=${1#*=}; shift ;;
    --require-empty) REQUIRE_EMPTY=1; shift ;;
    --timeout) [[ $# -ge 2 ]] || die_usage "--timeout needs seconds"; TIMEOUT=$2; shift 2 ;;
    --timeout=*) TIMEOUT=${1#*=}; shift ;;
    --tsv) TSV=1; shift ;;
    -h|--help) usage; exit "$EXIT_OK" ;;
    *) die_usage "unknown argument: $1" ;;
  esac
done
[[ -z "$EXPECT" || "$EXPECT" =~ ^[1-9][0-9]*$ ]] || die_usage "--expect-gpus must be a whole number >= 1, got '$EXPECT'"
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die_usage "--timeout must be whole seconds >= 1, got '$TIMEOUT'"

NVSMI=${NVIDIA_SMI:-nvidia-smi}
DMESG_CMD=${DMESG:-dmesg}
JOURNALCTL=${JOURNALCTL:-journalctl}

# ------------------------------------------------------------------------------------------ results
VERDICTS=() GPUS=() CHECKS=() OBSERVED=() NOTES=()
add() { VERDICTS+=("$1"); GPUS+=("$2"); CHECKS+=("$3"); OBSERVED+=("$4"); NOTES+=("${5:-}"); }

finish() {
  local i worst=PASS n_fail=0 n_warn=0 n_unknown=0
  if [[ $TSV -eq 1 ]]; then
    for i in "${!VERDICTS[@]}"; do
      printf '%s\t%s\t%s\t%s\t%s\n' "${VERDICTS[$i]}" "${GPUS[$i]}" "${CHECKS[$i]}" "${OBSERVED[$i]}" "${NOTES[$i]}"
    done
  else
    printf '%-8s %-4s %-20s %-34s %s\n' VERDICT GPU CHECK OBSERVED NOTE
    for i in "${!VERDICTS[@]}"; do
      printf '%-8s %-4s %-20s %-34s %s\n' "${VERDICTS[$i]}" "${GPUS[$i]}" "${CHECKS[$i]}" "${OBSERVED[$i]}" "${NOTES[$i]}"
    done
  fi
  for i in "${!VERDICTS[@]}"; do
    case "${VERDICTS[$i]}" in
      FAIL) n_fail=$((n_fail + 1)) ;;
      WARN) n_warn=$((n_warn + 1)) ;;
      UNKNOWN) n_unknown=$((n_unknown + 1)) ;;
    esac
  done
  local code=$EXIT_OK
  if [[ $n_fail -gt 0 ]]; then worst=FAIL; code=$EXIT_FAIL
  elif [[ $n_unknown -gt 0 ]]; then worst=UNKNOWN; code=$EXIT_UNKNOWN
  elif [[ $n_warn -gt 0 ]]; then worst=WARN
  fi
  if [[ ${1:-} == no_gpu ]]; then worst=FAIL; code=$EXIT_NO_GPU; fi
  local summary="overall: $worst ($n_fail FAIL, $n_unknown UNKNOWN, $n_warn WARN)"
  if [[ $TSV -eq 1 ]]; then echo "# $summary" >&2; else echo "$summary"; fi
  exit "$code"
}

no_gpu() {  # $1 observed, $2 note: no usable GPU stack; FAIL exit 1 when GPUs were expected, else exit 4
  add FAIL - gpu_count "$1" "$2"
  if [[ -n "$EXPECT" ]]; then finish; else finish no_gpu; fi
}

# ------------------------------------------------------------------------------------ nvidia-smi
NVSMI_OUT=""
NVSMI_RC=0
run_nvsmi() {  # runs nvidia-smi under a deadline; output in NVSMI_OUT, status in NVSMI_RC
  NVSMI_RC=0
  NVSMI_OUT=$(timeout -k 2 "$TIMEOUT" "$NVSMI" "$@" 2>&1) || NVSMI_RC=$?
}

classify_nvsmi_failure() {  # after a failed call: add the matching finding and finish
  case "$NVSMI_OUT" in
    *"No devices were found"*) no_gpu "nvidia-smi: No devices were found" \
        "driver loaded but no GPU attached to this container/VM (GOT-13)" ;;
    *"version mismatch"*) add FAIL - driver "Driver/library version mismatch" \
        "user-space NVML and kernel module differ: reboot or reload the driver (GOT-11)"; finish ;;
    *"couldn't communicate with the NVIDIA driver"*) add FAIL - driver "nvidia-smi cannot reach the driver" \
        "kernel module not loaded or broken (GOT-12)"; finish ;;
  esac
  if [[ $NVSMI_RC -eq 124 || $NVSMI_RC -eq 137 ]]; then
    add FAIL - nvidia_smi "no answer within ${TIMEOUT}s" \
      "a driver call is stuck (D state): look for XID 79 in dmesg; a reset or reboot is needed (GOT-23)"
    finish
  fi
  add FAIL - nvidia_smi "exit $NVSMI_RC: $(head -n 1 <<<"$NVSMI_OUT")" "nvidia-smi failed (GOT-12, GOT-17)"
  finish
}

if ! command -v "$NVSMI" >/dev/null 2>&1; then
  where="no /dev/nvidia* device files"
  compgen -G '/dev/nvidia[0-9]*' >/dev/null && where="/dev/nvidia* exist: the user-space tools are missing"
  no_gpu "nvidia-smi not found" "$where (GOT-17)"
fi

# Fields, newest names first; an older driver rejects a field by name and the query is retried
# with its older alias, or without it (that check then reads SKIP).
FIELDS=(index name uuid pci.bus_id driver_version compute_cap persistence_mode compute_mode
  temperature.gpu utilization.gpu memory.used memory.total power.limit power.default_limit
  clocks_event_reasons.hw_slowdown clocks_event_reasons.hw_thermal_slowdown
  clocks_event_reasons.hw_power_brake_slowdown clocks_event_reasons.sw_thermal_slowdown
  ecc.mode.current ecc.errors.uncorrected.volatile.total retired_pages.pending
  remapped_rows.pending remapped_rows.failure pcie.link.width.current pcie.link.width.max mig.mode.current)
declare -A ALIAS=(
  [clocks_event_reasons.hw_slowdown]=clocks_throttle_reasons.hw_slowdown
  [clocks_event_reasons.hw_thermal_slowdown]=clocks_throttle_reasons.hw_thermal_slowdown
  [clocks_event_reasons.hw_power_brake_slowdown]=clocks_throttle_reasons.hw_power_brake_slowdown
  [clocks_event_reasons.sw_thermal_slowdown]=clocks_throttle_reasons.sw_thermal_slowdown
)
declare -A COLUMN=()  # canonical field name -> column index in the query result

query_gpus() {
  local bad i list tries=0
  while [[ $tries -le ${#FIELDS[@]} ]]; do
    tries=$((tries + 1))
    list=$(IFS=,; echo "${FIELDS[*]}")
    run_nvsmi --query-gpu="$list" --format=csv,noheader,nounits
    if [[ $NVSMI_RC -eq 0 ]]; then return 0; fi
    if [[ "$NVSMI_OUT" =~ Field\ \"([^\"]+)\"\ is\ not\ a\ valid\ field ]]; then
      bad=${BASH_REMATCH[1]}
      for i in "${!FIELDS[@]}"; do
        [[ "${FIELDS[$i]}" == "$bad" ]] || continue
        if [[ -n "${ALIAS[$bad]:-}" ]]; then FIELDS[i]=${ALIAS[$bad]}; unset "ALIAS[$bad]"; else unset "FIELDS[$i]"; fi
      done
      FIELDS=("${FIELDS[@]}")
      continue
    fi
    classify_nvsmi_failure
  done
  classify_nvsmi_failure
}

query_gpus
for i in "${!FIELDS[@]}"; do
  name=${FIELDS[$i]}
  name=${name/clocks_throttle_reasons./clocks_event_reasons.}
  COLUMN[$name]=$i
done
mapfile -t ROWS <<<"$NVSMI_OUT"
[[ -n "${ROWS[0]:-}" ]] || ROWS=()

# --------------------------------------------------------------------------- helpers on one row
ROW=()
val() {  # value of a field in the current row; "SKIP" when the driver does not know the field
  local col=${COLUMN[$1]:-}
  if [[ -z "$col" ]]; then echo SKIP; return; fi
  local v=${ROW[$col]:-}
  v=${v#"${v%%[![:space:]]*}"}
  echo "${v%"${v##*[![:space:]]}"}"
}
unread() { [[ "$1" == SKIP || "$1" == "[N/A]" || "$1" == "N/A" || "$1" == "[Not Supported]" || -z "$1" ]]; }
is_int() { [[ "$1" =~ ^[0-9]+$ ]]; }
int_of() { local x=${1%%.*}; echo "${x:-0}"; }

# Temperature thresholds: `nvidia-smi -q -d TEMPERATURE` prints them per PCI bus id.
declare -A SLOWDOWN=() SHUTDOWN=()
run_nvsmi -q -d TEMPERATURE
if [[ $NVSMI_RC -eq 0 ]]; then
  bus=""
  while IFS= read -r line; do
    if [[ "$line" =~ ^GPU\ ([0-9A-Fa-f:.]+) ]]; then bus=${BASH_REMATCH[1]^^}; fi
    if [[ "$line" =~ GPU\ Slowdown\ Temp[[:space:]]*:\ ([0-9]+)\ C ]]; then SLOWDOWN[$bus]=${BASH_REMATCH[1]}; fi
    if [[ "$line" =~ GPU\ Shutdown\ Temp[[:space:]]*:\ ([0-9]+)\ C ]]; then SHUTDOWN[$bus]=${BASH_REMATCH[1]}; fi
  done <<<"$NVSMI_OUT"
fi

# Processes holding VRAM, per GPU uuid. In a container these are host PIDs: counted, never mapped
# onto local PIDs (GOT-07).
declare -A APPS=() APPS_MIB=()
APPS_READ=1
run_nvsmi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits
if [[ $NVSMI_RC -eq 0 ]]; then
  while IFS=',' read -r uuid pid mem; do
    uuid=${uuid// /}; pid=${pid// /}; mem=${mem// /}
    [[ -n "$uuid" && "$pid" =~ ^[0-9]+$ ]] || continue
    APPS[$uuid]=$(( ${APPS[$uuid]:-0} + 1 ))
    is_int "$mem" && APPS_MIB[$uuid]=$(( ${APPS_MIB[$uuid]:-0} + mem ))
  done <<<"$NVSMI_OUT"
else
  APPS_READ=0
fi

# XIDs in the kernel log of this boot, per PCI bus ("PCI:0000:18:00"); unreadable → UNKNOWN (GOT-26).
KLOG_READ=1
if ! KLOG=$("$DMESG_CMD" 2>/dev/null); then
  KLOG_READ=0
  if command -v "$JOURNALCTL" >/dev/null 2>&1 && KLOG=$("$JOURNALCTL" -k -b 0 --no-pager -q 2>/dev/null) \
      && [[ -n "$KLOG" ]]; then
    KLOG_READ=1
  fi
fi
xid_verdict() {  # the gpu_health tool's table (health/xid.py): a test keeps the two in sync
  case "$1" in
    43) echo PASS ;;
    8|13|31|45|63|68|92|94) echo WARN ;;
    *) echo FAIL ;;
  esac
}

# ------------------------------------------------------------------------------------------ checks
COUNT=${#ROWS[@]}
if [[ $COUNT -eq 0 ]]; then no_gpu "0 GPUs listed" "nvidia-smi listed no GPU (GOT-13)"; fi
if [[ -n "$EXPECT" && $COUNT -lt $EXPECT ]]; then
  add FAIL - gpu_count "$COUNT of $EXPECT expected" "fewer GPUs than rented: check CUDA_VISIBLE_DEVICES, then ask the provider (DIST-05)"
elif [[ -n "$EXPECT" && $COUNT -gt $EXPECT ]]; then
  add WARN - gpu_count "$COUNT (expected $EXPECT)" "more GPUs than expected: a different machine type, or set CUDA_VISIBLE_DEVICES"
else
  add PASS - gpu_count "$COUNT" ""
fi
IFS=',' read -r -a ROW <<<"${ROWS[0]}"
add PASS - driver "$(val driver_version)" "NVIDIA driver version (compare its CUDA version with torch.version.cuda, GOT-14)"
if [[ $KLOG_READ -eq 0 ]]; then
  add UNKNOWN - xid "kernel log unreadable" "dmesg is restricted here (containers, dmesg_restrict): XIDs cannot be checked (GOT-26)"
fi
if [[ $APPS_READ -eq 0 ]]; then
  add UNKNOWN - processes "query-compute-apps failed" "could not list processes holding VRAM"
fi

for row in "${ROWS[@]}"; do
  IFS=',' read -r -a ROW <<<"$row"
  g=$(val index)
  util=$(val utilization.gpu)
  idle=1
  if is_int "$util" && [[ $util -ge $IDLE_UTIL ]]; then idle=0; fi
  load="idle"; [[ $idle -eq 1 ]] || load="busy (${util}%)"
  bus=$(val pci.bus_id); bus=${bus^^}

  # Uncorrectable ECC since the last reset: the GPU returns wrong data or faults (GOT-19).
  ecc=$(val ecc.errors.uncorrected.volatile.total)
  if unread "$ecc"; then
    mode=$(val ecc.mode.current)
    if [[ "$mode" == Disabled ]]; then add WARN "$g" ecc "ECC disabled" "memory errors go undetected on this GPU (GOT-19)"
    else add SKIP "$g" ecc_uncorrected "$ecc" "no ECC on this GPU"; fi
  elif is_int "$ecc" && [[ $ecc -gt 0 ]]; then
    add FAIL "$g" ecc_uncorrected "$ecc volatile uncorrectable" "do not train here: reset the GPU or change the box (GOT-19)"
  else
    add PASS "$g" ecc_uncorrected "$ecc" ""
  fi

  # Row remapping (Ampere+) and page retirement (older): pending needs a reset, failure needs service.
  pending=$(val remapped_rows.pending)
  failure=$(val remapped_rows.failure)
  if [[ "$failure" == Yes ]]; then
    add FAIL "$g" row_remap "remap failure" "the GPU could not remap a bad row: replace it (GOT-20)"
  elif [[ "$pending" == Yes ]]; then
    add FAIL "$g" row_remap "remap pending" "a reset is needed before the GPU is safe to use (GOT-20)"
  elif unread "$pending"; then
    retired=$(val retired_pages.pending)
    if [[ "$retired" == Yes ]]; then add FAIL "$g" retired_pages "retirement pending" "reset the GPU to retire the bad pages (GOT-20)"
    elif unread "$retired"; then add SKIP "$g" row_remap "not reported" "neither row remapping nor page retirement is reported"
    else add PASS "$g" retired_pages "no pending retirement" ""; fi
  else
    add PASS "$g" row_remap "none pending" ""
  fi

  # Throttling: hardware slowdown, HW thermal or power brake on an idle GPU is a fault (GOT-24).
  hw=""
  for reason in hw_slowdown hw_thermal_slowdown hw_power_brake_slowdown; do
    [[ "$(val "clocks_event_reasons.$reason")" == Active ]] && hw+="${hw:+,}$reason"
  done
  sw=$(val clocks_event_reasons.sw_thermal_slowdown)
  if [[ -n "$hw" && $idle -eq 1 ]]; then
    add FAIL "$g" clock_events "$hw while idle" "hardware slowdown without load: cooling or power fault (GOT-24)"
  elif [[ -n "$hw" ]]; then
    add WARN "$g" clock_events "$hw, $load" "clocks cut by hardware under load: check cooling and power (GOT-24)"
  elif [[ "$sw" == Active ]]; then
    add WARN "$g" clock_events "sw_thermal_slowdown" "the driver lowers clocks to stay under the temperature target (GOT-24)"
  elif unread "$(val clocks_event_reasons.hw_slowdown)"; then
    add SKIP "$g" clock_events "not reported" "this driver reports no throttle reasons"
  else
    add PASS "$g" clock_events "none" ""
  fi

  # Temperature against this GPU's own thresholds, never a hard-coded number.
  temp=$(val temperature.gpu)
  slow=${SLOWDOWN[$bus]:-}
  shut=${SHUTDOWN[$bus]:-}
  if ! is_int "$temp"; then
    add UNKNOWN "$g" temperature "$temp" "temperature unreadable"
  elif [[ -n "$shut" && $temp -ge $shut ]]; then
    add FAIL "$g" temperature "${temp}C >= shutdown ${shut}C" "the GPU is at its shutdown temperature (GOT-24)"
  elif [[ -n "$slow" && $temp -ge $slow && $idle -eq 1 ]]; then
    add FAIL "$g" temperature "${temp}C >= slowdown ${slow}C, idle" "an idle GPU this hot has a cooling fault (GOT-24)"
  elif [[ -n "$slow" && $temp -ge $slow ]]; then
    add WARN "$g" temperature "${temp}C >= slowdown ${slow}C, $load" "clocks will drop: check airflow (GOT-24)"
  elif [[ -n "$slow" && $idle -eq 1 && $temp -ge $((slow - TEMP_MARGIN)) ]]; then
    add WARN "$g" temperature "${temp}C, idle, slowdown ${slow}C" "hot while idle: cooling may be weak (GOT-24)"
  elif [[ -z "$slow" ]]; then
    add SKIP "$g" temperature "${temp}C" "this driver prints no slowdown threshold; clock_events decides"
  else
    add PASS "$g" temperature "${temp}C (slowdown ${slow}C)" ""
  fi

  # Modes: persistence off makes every NVML/CUDA start slow (GOT-25); Exclusive_Process allows one
  # context per GPU (GOT-09); Prohibited allows none.
  pm=$(val persistence_mode)
  if [[ "$pm" == Disabled ]]; then add WARN "$g" persistence "Disabled" "slow first CUDA call and nvidia-smi; root can enable it (GOT-25)"
  elif unread "$pm"; then add SKIP "$g" persistence "$pm" ""
  else add PASS "$g" persistence "$pm" ""; fi
  cm=$(val compute_mode)
  case "$cm" in
    Default) add PASS "$g" compute_mode "$cm" "" ;;
    Prohibited) add FAIL "$g" compute_mode "$cm" "no process may use this GPU (GOT-09)" ;;
    Exclusive_Process|Exclusive_Thread) add WARN "$g" compute_mode "$cm" "one CUDA context per GPU: one rank per GPU, nothing else (GOT-09)" ;;
    *) add SKIP "$g" compute_mode "$cm" "" ;;
  esac

  # PCIe link narrower than the slot: host-device copies and NCCL over PCIe slow down (GOT-27).
  width=$(val pcie.link.width.current)
  wmax=$(val pcie.link.width.max)
  if is_int "$width" && is_int "$wmax" && [[ $width -lt $wmax ]]; then
    add WARN "$g" pcie_width "x$width of x$wmax" "degraded link: reseat or ask the provider (GOT-27)"
  elif is_int "$width"; then add PASS "$g" pcie_width "x$width" ""
  else add SKIP "$g" pcie_width "$width" ""; fi

  # A power cap below the default: a silent provider limit, slower than the GPU's rating.
  plim=$(val power.limit)
  pdef=$(val power.default_limit)
  if ! unread "$plim" && ! unread "$pdef" && [[ $(int_of "$plim") -lt $(int_of "$pdef") ]]; then
    add WARN "$g" power_limit "${plim}W of ${pdef}W default" "power-capped below the default: expect lower clocks"
  elif ! unread "$plim"; then add PASS "$g" power_limit "${plim}W" ""
  else add SKIP "$g" power_limit "$plim" ""; fi

  # Compute capability decides whether bf16 runs natively (>= 8.0, Ampere) or emulated and slow (AMP-10).
  cc=$(val compute_cap)
  if [[ "$cc" =~ ^([0-9]+)\.([0-9]+)$ ]]; then
    if [[ ${BASH_REMATCH[1]} -ge 8 ]]; then add PASS "$g" compute_cap "$cc ($(val name))" "bf16 runs natively"
    else add PASS "$g" compute_cap "$cc ($(val name))" "no native bf16: train in fp16 with a GradScaler, or fp32 (AMP-10)"; fi
  else
    add SKIP "$g" compute_cap "$cc" "this driver does not report the compute capability (nvidia-smi >= 510 does)"
  fi

  mig=$(val mig.mode.current)
  if [[ "$mig" == Enabled ]]; then add WARN "$g" mig "Enabled" "each process sees one MIG slice: select it with CUDA_VISIBLE_DEVICES=MIG-<uuid>"
  elif unread "$mig"; then add SKIP "$g" mig "$mig" ""
  else add PASS "$g" mig "$mig" ""; fi

  # Processes already holding memory on this GPU (PIDs are host PIDs in containers: not mapped).
  uuid=$(val uuid)
  if [[ $APPS_READ -eq 1 ]]; then
    n=${APPS[$uuid]:-0}
    if [[ $n -gt 0 ]]; then
      note="another job is using this GPU; in a container nvidia-smi shows host PIDs, so find local holders with reap_vram_zombies.sh (GOT-06, GOT-07)"
      if [[ $REQUIRE_EMPTY -eq 1 ]]; then add FAIL "$g" processes "$n process(es), ${APPS_MIB[$uuid]:-?} MiB" "$note"
      else add WARN "$g" processes "$n process(es), ${APPS_MIB[$uuid]:-?} MiB" "$note"; fi
    else
      add PASS "$g" processes "none" ""
    fi
  fi

  # XIDs logged for this GPU since boot.
  if [[ $KLOG_READ -eq 1 ]]; then
    key="PCI:${bus:4:7}"   # 00000000:18:00.0 -> PCI:0000:18:00
    worst=PASS
    codes=""
    while IFS= read -r line; do
      [[ "$line" =~ NVRM:\ Xid\ \(([^\)]*)\):\ ([0-9]+) ]] || continue
      dev=${BASH_REMATCH[1]^^}
      code=${BASH_REMATCH[2]}
      [[ "$dev" == "${key^^}"* ]] || continue
      codes+="${codes:+,}$code"
      v=$(xid_verdict "$code")
      if [[ $v == FAIL ]]; then worst=FAIL; elif [[ $v == WARN && $worst == PASS ]]; then worst=WARN; fi
    done <<<"$KLOG"
    if [[ -z "$codes" ]]; then add PASS "$g" xid "none this boot" ""
    elif [[ $worst == FAIL ]]; then add FAIL "$g" xid "Xid $codes" "a fatal XID this boot: reset or reboot before training (GOT-18, GOT-22)"
    elif [[ $worst == WARN ]]; then add WARN "$g" xid "Xid $codes" "application-level or recorded XIDs: usually the job, not the GPU (GOT-21)"
    else add PASS "$g" xid "Xid $codes (informational)" ""; fi
  fi
done

finish
