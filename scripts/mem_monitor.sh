#!/usr/bin/env bash
# mem_monitor.sh — host-RAM pressure as the OOM killer sees it: this container's cgroup memory (usage,
# working set, limit, peak, OOM kills), /dev/shm and the biggest processes. Not the host's totals:
# `free` inside a container shows the host's RAM, while the kernel kills at the cgroup's limit (GOT-04).
# Read-only.
set -euo pipefail

readonly EXIT_OK=0 EXIT_ALERT=1 EXIT_USAGE=2 EXIT_NO_CGROUP=3
readonly UNLIMITED=$((1 << 60))  # cgroup v1 reports "no limit" as a huge number near 2^63

usage() {
  cat <<'EOF'
Usage: mem_monitor.sh [--once] [--interval S] [--count N] [--csv FILE] [--warn-pct P] [--top K] [--help]

Samples this container's cgroup memory (v2 or v1) and prints one line per sample:
usage (page cache included), working set (usage minus inactive file cache: what cannot simply be
dropped), the effective limit (the smallest limit of this cgroup and its parents), %, OOM kills
so far, /dev/shm use (it counts toward the limit) and the process with the largest RSS. Stops
after --count samples or on Ctrl-C, then prints the peak. Run it beside a training job during
load, train, eval and save to measure the real peak (GOT-04, PAR-04).

Options:
  --once         one detailed snapshot (limit, usage breakdown, top processes) and exit
  --interval S   seconds between samples (default 5)
  --count N      stop after N samples (default: until interrupted)
  --csv FILE     also append one CSV row per sample to FILE (header written when FILE is new)
  --warn-pct P   alert when the working set reaches P % of the limit (default 90)
  --top K        processes to list in --once (default 5)
  -h, --help     this help

Environment: RGT_CGROUP_DIR points at a cgroup directory to read instead of discovering this
process's own (for tests, or to watch another container's cgroup from the host). RGT_PROC_DIR
replaces /proc for the process list only (for tests).

Exit status:
  0  below --warn-pct the whole time and no new OOM kill
  1  the working set reached --warn-pct, or the cgroup's oom_kill counter rose while watching
  2  bad usage
  3  no cgroup memory controller readable: host /proc/meminfo shown instead (limit unknown)
EOF
}

die_usage() { echo "mem_monitor.sh: $1" >&2; echo "Try: mem_monitor.sh --help" >&2; exit "$EXIT_USAGE"; }

ONCE=0
INTERVAL=5
COUNT=0
CSV=""
WARN_PCT=90
TOP=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --once) ONCE=1; shift ;;
    --interval) [[ $# -ge 2 ]] || die_usage "--interval needs seconds"; INTERVAL=$2; shift 2 ;;
    --count) [[ $# -ge 2 ]] || die_usage "--count needs a number"; COUNT=$2; shift 2 ;;
    --csv) [[ $# -ge 2 ]] || die_usage "--csv needs a file"; CSV=$2; shift 2 ;;
    --warn-pct) [[ $# -ge 2 ]] || die_usage "--warn-pct needs a percentage"; WARN_PCT=$2; shift 2 ;;
    --top) [[ $# -ge 2 ]] || die_usage "--top needs a number"; TOP=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die_usage "unknown argument: $1" ;;
  esac
done
[[ "$INTERVAL" =~ ^[0-9]+(\.[0-9]+)?$ && "$INTERVAL" != 0 ]] || die_usage "--interval must be seconds > 0, got '$INTERVAL'"
[[ "$COUNT" =~ ^[0-9]+$ ]] || die_usage "--count must be a whole number, got '$COUNT'"
[[ "$WARN_PCT" =~ ^[0-9]+$ && $WARN_PCT -ge 1 && $WARN_PCT -le 100 ]] || die_usage "--warn-pct must be 1-100, got '$WARN_PCT'"
[[ "$TOP" =~ ^[0-9]+$ ]] || die_usage "--top must be a whole number, got '$TOP'"

# ------------------------------------------------------------------------------- cgroup discovery
VERSION=""   # 2 or 1
CGDIR=""     # this process's memory cgroup directory
CGROOT=""    # the controller's mount point: limits are looked up from CGDIR up to here

discover() {
  if [[ -n "${RGT_CGROUP_DIR:-}" ]]; then
    CGDIR=$RGT_CGROUP_DIR; CGROOT=$RGT_CGROUP_DIR
    if [[ -f $CGDIR/memory.current ]]; then VERSION=2; elif [[ -f $CGDIR/memory.usage_in_bytes ]]; then VERSION=1; fi
    return 0
  fi
  local line rel mnt fields opts fstype rest
  # v2: "0::/path"; v1: "N:memory[,...]:/path"
  while IFS= read -r line; do
    if [[ $line == 0::* ]]; then rel=${line#0::}
      mnt=""
      while IFS= read -r fields; do
        rest=${fields#* - }; fstype=${rest%% *}
        [[ $fstype == cgroup2 ]] || continue
        read -r _ _ _ _ mnt _ <<<"$fields"
        break
      done </proc/self/mountinfo
      if [[ -n "$mnt" ]]; then
        for CGDIR in "$mnt$rel" "$mnt"; do
          [[ -f $CGDIR/memory.current ]] && { VERSION=2; CGROOT=$mnt; return 0; }
        done
      fi
    fi
  done </proc/self/cgroup
  while IFS=: read -r _ ctrls rel; do
    [[ ,$ctrls, == *,memory,* ]] || continue
    while IFS= read -r fields; do
      rest=${fields#* - }; fstype=${rest%% *}; opts=${rest##* }
      [[ $fstype == cgroup && ,$opts, == *,memory,* ]] || continue
      read -r _ _ _ _ mnt _ <<<"$fields"
      for CGDIR in "$mnt$rel" "$mnt"; do
        [[ -f $CGDIR/memory.usage_in_bytes ]] && { VERSION=1; CGROOT=$mnt; return 0; }
      done
    done </proc/self/mountinfo
  done </proc/self/cgroup
  CGDIR=""
}
discover

num() { local v; v=$(cat "$1" 2>/dev/null) || { echo ""; return; }; echo "${v%%[[:space:]]*}"; }
stat_key() {  # stat_key FILE KEY -> value of "KEY value" lines
  local k v
  while read -r k v; do [[ $k == "$2" ]] && { echo "$v"; return; }; done <"$1" 2>/dev/null
  echo ""
}

host_total() { local k v _; while read -r k v _; do [[ $k == MemTotal: ]] && { echo $((v * 1024)); return; }; done </proc/meminfo; }
host_available() { local k v _; while read -r k v _; do [[ $k == MemAvailable: ]] && { echo $((v * 1024)); return; }; done </proc/meminfo; }

effective_limit() {  # smallest limit from CGDIR up to the controller root; empty = unlimited
  local dir=$CGDIR best="" v file=memory.max
  [[ $VERSION == 1 ]] && file=memory.limit_in_bytes
  while :; do
    v=$(num "$dir/$file")
    if [[ "$v" =~ ^[0-9]+$ && $v -lt $UNLIMITED ]]; then
      if [[ -z "$best" || $v -lt $best ]]; then best=$v; fi
    fi
    [[ "$dir" == "$CGROOT" || "$dir" == / || -z "$dir" ]] && break
    dir=${dir%/*}
  done
  echo "$best"
}

# One sample into globals: USAGE WS LIMIT PEAK ANON FILE SHMEM OOMK
sample() {
  if [[ $VERSION == 2 ]]; then
    USAGE=$(num "$CGDIR/memory.current")
    PEAK=$(num "$CGDIR/memory.peak")
    ANON=$(stat_key "$CGDIR/memory.stat" anon)
    FILE=$(stat_key "$CGDIR/memory.stat" file)
    SHMEM=$(stat_key "$CGDIR/memory.stat" shmem)
    INACTIVE=$(stat_key "$CGDIR/memory.stat" inactive_file)
    OOMK=$(stat_key "$CGDIR/memory.events" oom_kill)
  else
    USAGE=$(num "$CGDIR/memory.usage_in_bytes")
    PEAK=$(num "$CGDIR/memory.max_usage_in_bytes")
    ANON=$(stat_key "$CGDIR/memory.stat" total_rss); [[ -n "$ANON" ]] || ANON=$(stat_key "$CGDIR/memory.stat" rss)
    FILE=$(stat_key "$CGDIR/memory.stat" total_cache); [[ -n "$FILE" ]] || FILE=$(stat_key "$CGDIR/memory.stat" cache)
    SHMEM=$(stat_key "$CGDIR/memory.stat" total_shmem); [[ -n "$SHMEM" ]] || SHMEM=$(stat_key "$CGDIR/memory.stat" shmem)
    INACTIVE=$(stat_key "$CGDIR/memory.stat" total_inactive_file)
    [[ -n "$INACTIVE" ]] || INACTIVE=$(stat_key "$CGDIR/memory.stat" inactive_file)
    OOMK=$(stat_key "$CGDIR/memory.oom_control" oom_kill)
  fi
  USAGE=${USAGE:-0}; INACTIVE=${INACTIVE:-0}
  WS=$(( USAGE > INACTIVE ? USAGE - INACTIVE : USAGE ))
  LIMIT=$(effective_limit)
}

shm_used() { local line; line=$(df -B1 --output=used,size /dev/shm 2>/dev/null | tail -n 1) || { echo "- -"; return; }; echo "$line"; }

top_processes() {  # top_processes K -> "rss_bytes pid command" lines, largest first
  local dir pid k v _ rss proc=${RGT_PROC_DIR:-/proc}
  for dir in "$proc"/[0-9]*; do
    pid=${dir##*/}
    rss=""
    while read -r k v _; do [[ $k == VmRSS: ]] && { rss=$((v * 1024)); break; }; done <"$dir/status" 2>/dev/null || continue
    [[ -n "$rss" ]] || continue
    echo "$rss $pid $(tr '\0' ' ' <"$dir/cmdline" 2>/dev/null | cut -c1-80)"
  done | sort -rn | awk -v k="$1" 'NR <= k'  # awk reads to the end: `head` would quit early and,
                                               # under pipefail, sort's SIGPIPE (141) would abort us
}

gib() {  # bytes -> GiB with two decimals, in integer arithmetic
  [[ "$1" =~ ^[0-9]+$ ]] || { echo "-"; return; }
  local hundredths=$(( ($1 * 100 + 536870912) / 1073741824 ))
  printf '%d.%02d' $((hundredths / 100)) $((hundredths % 100))
}
pct() { if [[ "$1" =~ ^[0-9]+$ && "$2" =~ ^[0-9]+$ && $2 -gt 0 ]]; then echo $(( $1 * 100 / $2 )); else echo "-"; fi; }

# ------------------------------------------------------------------------------------------ output
if [[ -z "$VERSION" ]]; then
  total=$(host_total); avail=$(host_available)
  echo "no cgroup memory controller readable: showing the host's /proc/meminfo (NOT a container limit)"
  echo "host: total $(gib "$total") GiB, available $(gib "$avail") GiB"
  top_processes "$TOP" | while read -r rss pid cmd; do printf '  %8s GiB  pid %-8s %s\n' "$(gib "$rss")" "$pid" "$cmd"; done
  exit "$EXIT_NO_CGROUP"
fi

sample
FIRST_OOM=${OOMK:-0}
limit_text() { if [[ -n "$LIMIT" ]]; then echo "$(gib "$LIMIT") GiB"; else echo "none (host RAM $(gib "$(host_total)") GiB is the limit)"; fi; }

if [[ $ONCE -eq 1 ]]; then
  read -r shm_u shm_s <<<"$(shm_used)"
  echo "cgroup v$VERSION: $CGDIR"
  echo "limit:        $(limit_text)"
  echo "usage:        $(gib "$USAGE") GiB (includes page cache)"
  echo "working set:  $(gib "$WS") GiB = $(pct "$WS" "${LIMIT:-$(host_total)}")% of the limit  (anon $(gib "$ANON"), file cache $(gib "$FILE"), shmem $(gib "$SHMEM"))"
  echo "peak:         $(gib "$PEAK") GiB (kernel's high-water mark for this cgroup)"
  echo "oom kills:    ${OOMK:-unknown}"
  echo "/dev/shm:     $(gib "$shm_u") of $(gib "$shm_s") GiB used (counts toward the limit; GOT-05)"
  echo "host RAM:     $(gib "$(host_total)") GiB total — context only, not this container's limit"
  echo "largest processes (RSS):"
  top_processes "$TOP" | while read -r rss pid cmd; do printf '  %8s GiB  pid %-8s %s\n' "$(gib "$rss")" "$pid" "$cmd"; done
  p=$(pct "$WS" "${LIMIT:-$(host_total)}")
  [[ "$p" =~ ^[0-9]+$ && $p -ge $WARN_PCT ]] && { echo "ALERT: working set at ${p}% of the limit (>= ${WARN_PCT}%)"; exit "$EXIT_ALERT"; }
  exit "$EXIT_OK"
fi

if [[ -n "$CSV" && ! -s "$CSV" ]]; then
  echo "time,usage_bytes,working_set_bytes,limit_bytes,pct,peak_bytes,anon_bytes,file_bytes,shmem_bytes,oom_kills,shm_used_bytes,top_pid,top_rss_bytes,top_cmd" >>"$CSV"
fi
echo "cgroup v$VERSION $CGDIR · limit $(limit_text) · every ${INTERVAL}s$([[ $COUNT -gt 0 ]] && echo ", $COUNT samples")"
printf '%-19s %9s %9s %5s %9s %6s %9s  %s\n' TIME USAGE_GIB WS_GIB PCT PEAK_GIB OOMK SHM_GIB "TOP PROCESS"
MAX_WS=0
ALERT=0
n=0
summary() {
  local code=$EXIT_OK
  echo "samples: $n · max working set $(gib "$MAX_WS") GiB ($(pct "$MAX_WS" "${LIMIT:-$(host_total)}")% of the limit) · kernel peak $(gib "$PEAK") GiB · oom kills ${FIRST_OOM} -> ${OOMK:-?}"
  if [[ $ALERT -eq 1 ]]; then code=$EXIT_ALERT; fi
  exit "$code"
}
trap summary INT TERM
while :; do
  sample
  read -r shm_u _ <<<"$(shm_used)"
  read -r top_rss top_pid top_cmd <<<"$(top_processes 1)"
  p=$(pct "$WS" "${LIMIT:-$(host_total)}")
  [[ $WS -gt $MAX_WS ]] && MAX_WS=$WS
  note=""
  if [[ "$p" =~ ^[0-9]+$ && $p -ge $WARN_PCT ]]; then ALERT=1; note=" ALERT >= ${WARN_PCT}%"; fi
  if [[ "${OOMK:-0}" =~ ^[0-9]+$ && ${OOMK:-0} -gt $FIRST_OOM ]]; then ALERT=1; note+=" OOM KILL (+$((OOMK - FIRST_OOM)))"; fi
  now=$(date '+%Y-%m-%dT%H:%M:%S')
  printf '%-19s %9s %9s %5s %9s %6s %9s  %s\n' "$now" "$(gib "$USAGE")" "$(gib "$WS")" "$p" "$(gib "$PEAK")" \
    "${OOMK:--}" "$(gib "$shm_u")" "pid ${top_pid:-?} $(gib "${top_rss:-}") GiB ${top_cmd:0:40}$note"
  if [[ -n "$CSV" ]]; then
    printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,"%s"\n' "$now" "$USAGE" "$WS" "${LIMIT:-}" "$p" "${PEAK:-}" "${ANON:-}" \
      "${FILE:-}" "${SHMEM:-}" "${OOMK:-}" "${shm_u:-}" "${top_pid:-}" "${top_rss:-}" "${top_cmd//\"/\'}" >>"$CSV"
  fi
  n=$((n + 1))
  [[ $COUNT -gt 0 && $n -ge $COUNT ]] && break
  sleep "$INTERVAL"
done
summary
