#!/usr/bin/env bash
# reap_vram_zombies.sh — find processes that still hold GPU memory after their job died, and (only when
# asked, with a confirmation token) stop them. The fallback for the reap_vram_zombies tool when the
# Python package cannot be installed. Dry run by default.
#
# Evidence comes from this machine's /proc: a process is a GPU holder only if it has /dev/nvidiaN open.
# nvidia-smi's PIDs are host PIDs inside a container (the driver has no notion of PID namespaces), so
# they are reported, never mapped onto local PIDs: a local process with the same number is a different
# process. Only "orphans" are offered: alive, re-parented to PID 1 or a subreaper because the launcher
# exited, not a setsid/daemon session leader, not a systemd service, owned by you, old enough.
set -euo pipefail

readonly EXIT_CLEAN=0 EXIT_FOUND=1 EXIT_USAGE=2 EXIT_CHANGED=3
readonly ADOPTERS=" init systemd tini dumb-init docker-init catatonit s6-svscan runit runsvdir containerd-shim containerd-shim-runc-v2 conmon pause "

usage() {
  cat <<'EOF'
Usage: reap_vram_zombies.sh [--min-age S] [--kill --confirm TOKEN [--grace S] [--force]] [--help]

Lists the local processes that hold an NVIDIA device file (/dev/nvidiaN), classifies each one
(active job, orphan of a dead launcher, zombie, stuck in D state), and shows what nvidia-smi says
holds VRAM. Without --kill nothing is signalled (dry run). A dry run that finds orphans prints a
TOKEN; pass it back with --kill to stop exactly those processes (children first, SIGTERM, then
SIGKILL only with --force after the grace period). If anything changed in between (a process
exited, a PID was reused), the token no longer matches and nothing is killed.

Options:
  --min-age S      an orphan younger than S seconds is not offered (default 60: it may be starting)
  --kill           stop the orphans of the dry run; requires --confirm
  --confirm TOKEN  the token printed by the dry run
  --grace S        seconds to wait after SIGTERM (default 10)
  --force          SIGKILL whatever survives the grace period
  -h, --help       this help

Never signalled: active jobs, other users' processes, processes younger than --min-age, zombies
(their parent must reap them) and D-state processes (signals cannot reach them; a GPU reset or
reboot is the user's call). Never uses pkill/killall or kills by name or port.

Environment: NVIDIA_SMI (default nvidia-smi); RGT_DEVICE_PREFIX (default /dev/nvidia) for tests.

Exit status:
  0  nothing to reap (dry run), or every target is gone (--kill)
  1  orphans found (dry run: rerun with --kill --confirm TOKEN), or some target survived (--kill)
  2  bad usage
  3  --confirm TOKEN does not match the current orphans: run the dry run again

Catalog: references/gotchas_universal.md GOT-06 (orphans), GOT-07 (container PIDs), GOT-08 (pkill).
EOF
}

die_usage() { echo "reap_vram_zombies.sh: $1" >&2; echo "Try: reap_vram_zombies.sh --help" >&2; exit "$EXIT_USAGE"; }

MIN_AGE=60
GRACE=10
KILL=0
FORCE=0
CONFIRM=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --min-age) [[ $# -ge 2 ]] || die_usage "--min-age needs seconds"; MIN_AGE=$2; shift 2 ;;
    --grace) [[ $# -ge 2 ]] || die_usage "--grace needs seconds"; GRACE=$2; shift 2 ;;
    --confirm) [[ $# -ge 2 ]] || die_usage "--confirm needs the token from the dry run"; CONFIRM=$2; shift 2 ;;
    --kill) KILL=1; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die_usage "unknown argument: $1" ;;
  esac
done
[[ "$MIN_AGE" =~ ^[0-9]+$ ]] || die_usage "--min-age must be whole seconds, got '$MIN_AGE'"
[[ "$GRACE" =~ ^[0-9]+$ ]] || die_usage "--grace must be whole seconds, got '$GRACE'"
[[ $KILL -eq 0 || -n "$CONFIRM" ]] || die_usage "--kill needs --confirm TOKEN from a dry run (run without --kill first)"
[[ $KILL -eq 1 || -z "$CONFIRM" ]] || die_usage "--confirm is only used with --kill"
[[ $KILL -eq 1 || $FORCE -eq 0 ]] || die_usage "--force is only used with --kill"

NVSMI=${NVIDIA_SMI:-nvidia-smi}
PREFIX=${RGT_DEVICE_PREFIX:-/dev/nvidia}
MY_UID=$(id -u)
TICKS=$(getconf CLK_TCK 2>/dev/null || echo 100)
SELF=$$

in_container() {
  [[ -e /.dockerenv || -e /run/.containerenv ]] && return 0
  local cgroup
  cgroup=$(cat /proc/1/cgroup 2>/dev/null) || return 1
  [[ $cgroup =~ docker|kubepods|containerd|libpod|lxc|crio ]]
}

# ---------------------------------------------------------------------------------- /proc readers
# stat fields after "(comm)": state ppid pgrp session ... starttime is field 22 overall (20th here).
declare -A ST_STATE=() ST_PPID=() ST_PGRP=() ST_SID=() ST_START=()
read_stat() {  # read_stat PID -> fills ST_* for PID; fails if the process is gone
  local raw rest
  raw=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  rest=${raw##*) }
  # shellcheck disable=SC2086  # word splitting of the numeric fields is the point
  set -- $rest
  local pid=${raw%% *}
  ST_STATE[$pid]=$1; ST_PPID[$pid]=$2; ST_PGRP[$pid]=$3; ST_SID[$pid]=$4; ST_START[$pid]=${20}
}
uid_of() {
  local key real _
  while read -r key real _; do [[ $key == Uid: ]] && { echo "$real"; return 0; }; done <"/proc/$1/status"
  echo "?"
}
comm_of() { cat "/proc/$1/comm" 2>/dev/null || echo "?"; }
cmd_of() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | cut -c1-120; }
age_of() {  # seconds since the process started
  local up
  up=$(cut -d' ' -f1 /proc/uptime); up=${up%.*}
  echo $(( up - ${ST_START[$1]} / TICKS ))
}
service_of() {  # the systemd *.service this process runs in, if any: then PID 1 really is its parent
  local line
  while IFS= read -r line; do [[ $line == *.service ]] && { echo "${line##*/}"; return 0; }; done <"/proc/$1/cgroup"
  echo ""
}

# --------------------------------------------------------------------------------- local holders
declare -A DEVICES=()   # pid -> "0,1,uvm"
UNREADABLE=0
for dir in /proc/[0-9]*; do
  pid=${dir#/proc/}
  [[ $pid == "$SELF" ]] && continue
  listing=$(ls -l "$dir/fd" 2>/dev/null) || { [[ -d $dir ]] && UNREADABLE=$((UNREADABLE + 1)); continue; }
  devs=""
  while IFS= read -r line; do
    target=${line##* -> }
    [[ $target == "$PREFIX"* ]] || continue
    suffix=${target#"$PREFIX"}
    if [[ $suffix =~ ^[0-9]+$ ]]; then devs+="${devs:+,}$suffix"; elif [[ $suffix == -uvm ]]; then devs+="${devs:+,}uvm"; fi
  done <<<"$listing"
  [[ -n "$devs" ]] && DEVICES[$pid]=$devs
done

# -------------------------------------------------------------------------------------- classify
declare -A CLASS=() WHY=()
CANDIDATES=()
classify() {
  local pid=$1 state ppid parent unit tries=0
  read_stat "$pid" || return 1
  state=${ST_STATE[$pid]}
  while [[ $state == D && $tries -lt 10 ]]; do  # a brief D state is normal (I/O); 1 s of it is "stuck"
    sleep 0.1; tries=$((tries + 1)); read_stat "$pid" || return 1; state=${ST_STATE[$pid]}
  done
  if [[ $state == Z ]]; then CLASS[$pid]=zombie; WHY[$pid]="exited; parent ${ST_PPID[$pid]} must reap it"; return 0; fi
  if [[ $state == D ]]; then CLASS[$pid]=uninterruptible; WHY[$pid]="D state >1 s: blocked in the driver; only a GPU reset/reboot frees it"; return 0; fi
  ppid=${ST_PPID[$pid]}
  parent=$(comm_of "$ppid")
  CLASS[$pid]=active
  if [[ $ppid != 1 && $ADOPTERS != *" $parent "* ]]; then WHY[$pid]="parent $ppid ($parent) is alive"; return 0; fi
  unit=$(service_of "$pid")
  if [[ -n "$unit" ]]; then WHY[$pid]="started by systemd unit $unit"; return 0; fi
  if [[ ${ST_SID[$pid]} == "$pid" ]]; then WHY[$pid]="leads its own session (a detached job: setsid/daemon)"; return 0; fi
  if read_stat "$ppid" 2>/dev/null && [[ ${ST_PGRP[$pid]} == "${ST_PGRP[$ppid]}" ]]; then
    WHY[$pid]="in its parent's process group (started by PID 1's entrypoint)"; return 0
  fi
  CLASS[$pid]=orphan
  WHY[$pid]="re-parented to $ppid ($parent): its launcher exited"
}

children_of() {  # direct children of $1 among the scanned holders
  local pid
  for pid in "${!DEVICES[@]}"; do [[ ${ST_PPID[$pid]:-} == "$1" ]] && echo "$pid"; done
  return 0
}

for pid in "${!DEVICES[@]}"; do classify "$pid" || unset "DEVICES[$pid]"; done

for pid in $(printf '%s\n' "${!DEVICES[@]}" | sort -n); do
  [[ ${CLASS[$pid]} == orphan ]] || continue
  owner=$(uid_of "$pid")
  age=$(age_of "$pid")
  if [[ $owner != "$MY_UID" ]]; then WHY[$pid]+="; owned by uid $owner: not offered"; continue; fi
  if [[ $age -lt $MIN_AGE ]]; then WHY[$pid]+="; only ${age}s old (< --min-age $MIN_AGE): not offered"; continue; fi
  CANDIDATES+=("$pid")
done

# Targets: each candidate plus its GPU-holding descendants, deepest first (children before parents).
TARGETS=()
add_tree() {
  local child
  for child in $(children_of "$1"); do
    [[ $(uid_of "$child") == "$MY_UID" ]] && add_tree "$child"
  done
  TARGETS+=("$1")
}
for pid in "${CANDIDATES[@]}"; do add_tree "$pid"; done

token() {
  local pid
  for pid in "${TARGETS[@]}"; do echo "$pid:${ST_START[$pid]}:$(uid_of "$pid")"; done | sort | sha256sum | cut -c1-16
}

# ----------------------------------------------------------------------------------------- report
CONTAINER=0; in_container && CONTAINER=1
echo "reap_vram_zombies.sh — $([[ $KILL -eq 1 ]] && echo "KILL run" || echo "dry run (nothing is signalled)")"
echo "host: $(hostname 2>/dev/null || echo '?')$([[ $CONTAINER -eq 1 ]] && echo ', inside a container')"
if [[ ${#DEVICES[@]} -eq 0 ]]; then
  echo "local processes holding ${PREFIX}N: none"
else
  echo "local processes holding ${PREFIX}N:"
  printf '  %-8s %-8s %-16s %-8s %-12s %s\n' PID AGE_S CLASS UID DEVICES "WHY / COMMAND"
  for pid in $(printf '%s\n' "${!DEVICES[@]}" | sort -n); do
    printf '  %-8s %-8s %-16s %-8s %-12s %s\n' "$pid" "$(age_of "$pid")" "${CLASS[$pid]}" "$(uid_of "$pid")" \
      "${DEVICES[$pid]}" "${WHY[$pid]}"
    printf '  %-8s %s\n' "" "$(cmd_of "$pid")"
  done
fi
[[ $UNREADABLE -gt 0 ]] && echo "note: $UNREADABLE processes' open files are unreadable (other users); run as root to see them"

if command -v "$NVSMI" >/dev/null 2>&1 \
    && apps=$(timeout -k 2 20 "$NVSMI" --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits 2>/dev/null); then
  if [[ -z "${apps//[[:space:]]/}" ]]; then
    echo "nvidia-smi: no process holds VRAM"
  else
    echo "nvidia-smi lists these VRAM holders$([[ $CONTAINER -eq 1 ]] && echo ' (HOST PIDs: not this container'"'"'s, never mapped onto local PIDs)'):"
    while IFS=',' read -r pid mem uuid; do
      pid=${pid// /}; mem=${mem// /}; uuid=${uuid// /}
      if [[ $CONTAINER -eq 1 ]]; then note="host pid (namespaced); see the local holders above"
      elif [[ -n "${DEVICES[$pid]:-}" ]]; then note="local holder, class ${CLASS[$pid]}"
      elif [[ -d /proc/$pid ]]; then note="exists here but no ${PREFIX}N open that we can read"
      else note="phantom: no such local process; a leaked context frees on GPU reset or restart"; fi
      printf '  pid %-9s %8s MiB  %s  %s\n' "$pid" "$mem" "$uuid" "$note"
    done <<<"$apps"
  fi
else
  echo "nvidia-smi: not available or failed; only the local /proc scan is shown"
fi

if [[ ${#TARGETS[@]} -eq 0 ]]; then
  echo "nothing to reap: no orphan of yours holds a GPU"
  [[ $KILL -eq 1 && -n "$CONFIRM" ]] && { echo "the token no longer matches anything: nothing was killed"; exit "$EXIT_CHANGED"; }
  exit "$EXIT_CLEAN"
fi
TOKEN=$(token)
if [[ $KILL -eq 0 ]]; then
  echo "would stop (children first): ${TARGETS[*]}"
  echo "to stop them: $0 --kill --confirm $TOKEN$([[ $MIN_AGE != 60 ]] && echo " --min-age $MIN_AGE")  (add --force to SIGKILL survivors)"
  exit "$EXIT_FOUND"
fi
if [[ "$CONFIRM" != "$TOKEN" ]]; then
  echo "the orphans changed since the dry run (token $CONFIRM, now $TOKEN): nothing was killed; run the dry run again"
  exit "$EXIT_CHANGED"
fi

# --------------------------------------------------------------------------------------- kill
declare -A START_AT_TOKEN=()
for pid in "${TARGETS[@]}"; do START_AT_TOKEN[$pid]=${ST_START[$pid]}; done
same_process() { read_stat "$1" 2>/dev/null && [[ ${ST_START[$1]} == "${START_AT_TOKEN[$1]}" && ${ST_STATE[$1]} != Z ]]; }
for pid in "${TARGETS[@]}"; do
  if same_process "$pid"; then kill -TERM "$pid" 2>/dev/null && echo "SIGTERM $pid" || echo "SIGTERM $pid failed"; fi
done
waited=0
alive() { local pid n=0; for pid in "${TARGETS[@]}"; do same_process "$pid" && n=$((n + 1)); done; echo "$n"; }
while [[ $(alive) -gt 0 && $waited -lt $((GRACE * 10)) ]]; do sleep 0.1; waited=$((waited + 1)); done
if [[ $(alive) -gt 0 && $FORCE -eq 1 ]]; then
  for pid in "${TARGETS[@]}"; do same_process "$pid" && kill -KILL "$pid" 2>/dev/null && echo "SIGKILL $pid"; done
  waited=0
  while [[ $(alive) -gt 0 && $waited -lt 50 ]]; do sleep 0.1; waited=$((waited + 1)); done
fi
left=()
for pid in "${TARGETS[@]}"; do same_process "$pid" && left+=("$pid"); done
if [[ ${#left[@]} -gt 0 ]]; then
  echo "still alive after ${GRACE}s: ${left[*]}$([[ $FORCE -eq 0 ]] && echo ' (add --force to SIGKILL them)')"
  exit "$EXIT_FOUND"
fi
echo "stopped: ${TARGETS[*]}; check VRAM again with: nvidia-smi --query-gpu=index,memory.used --format=csv"
exit "$EXIT_CLEAN"
