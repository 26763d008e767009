#!/usr/bin/env bash
# download_loop.sh — downloads that survive flaky links: every attempt under a wall-clock timeout, a stall
# detector that kills an attempt whose file stops growing (a silently dropped connection blocks a read
# forever, CN-07), retries with backoff that resume instead of restarting, and verification before the
# result is declared done. Three modes: a URL (python3 stdlib, HTTP Range resume, size/sha256 check),
# a Hugging Face repository (huggingface-cli/hf with safe settings, every .safetensors header checked),
# or any command (retried, watched).
set -euo pipefail

readonly EXIT_OK=0 EXIT_FAILED=1 EXIT_USAGE=2 EXIT_VERIFY=3

usage() {
  cat <<'EOF'
Usage:
  download_loop.sh [options] --url URL --out FILE [--sha256 HEX] [--size BYTES]
  download_loop.sh [options] --hf REPO --local-dir DIR [--revision REV] [--repo-type model|dataset|space]
  download_loop.sh [options] [--watch PATH] -- COMMAND [ARGS...]

Each attempt runs under --attempt-timeout; an attempt whose download (the .part file, the
--local-dir, or --watch PATH) does not grow for --stall seconds is killed and retried. Retries
resume: URL mode continues the .part file with an HTTP Range request; huggingface_hub continues
its .incomplete files. The result is verified before exit 0:
  URL:  --size and/or --sha256 when given (the file is only renamed into place after that)
  HF:   no .incomplete leftovers; every .safetensors file has a valid header and its tensors fit
        inside the file (a truncated shard fails here instead of at load time)
  COMMAND: its exit status (stall detection only with --watch PATH)

Options:
  --attempts N           attempts before giving up (default 20)
  --attempt-timeout S    wall-clock limit of one attempt (default 1800)
  --stall S              kill an attempt that made no progress for S seconds (default 300; 0 = off)
  --poll S               how often progress is measured (default 15)
  --backoff S            wait before the 2nd attempt; doubles up to 300 (default 10)
  --network-setup CMD    run in this shell first, e.g. 'source /etc/network_turbo' (a profile's
                         network_setup); --network-teardown CMD runs on exit
  --hf-transfer          keep HF_HUB_ENABLE_HF_TRANSFER as set (default: forced to 0: hf_transfer
                         cannot resume or use proxies, CN-08)
  --log FILE             also append progress lines to FILE
  -h, --help             this help

HF mode exports HF_HUB_DOWNLOAD_TIMEOUT=60 and HF_HUB_ETAG_TIMEOUT=30 unless already set, so one
request fails instead of hanging. Use a read-only token with third-party mirrors (HF_ENDPOINT).

Exit status:
  0  downloaded and verified
  1  every attempt failed or stalled
  2  bad usage
  3  downloaded, but verification failed (size, checksum, truncated or corrupt file)
EOF
}

die_usage() { echo "download_loop.sh: $1" >&2; echo "Try: download_loop.sh --help" >&2; exit "$EXIT_USAGE"; }

URL="" OUT="" SHA256="" SIZE="" HF_REPO="" LOCAL_DIR="" REVISION="" REPO_TYPE="" WATCH=""
ATTEMPTS=20 ATTEMPT_TIMEOUT=1800 STALL=300 POLL=15 BACKOFF=10
NET_SETUP="" NET_TEARDOWN="" HF_TRANSFER=0 LOG=""
CMD=()
need() { [[ $2 -ge 2 ]] || die_usage "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --url) need "$1" $#; URL=$2; shift 2 ;;
    --out) need "$1" $#; OUT=$2; shift 2 ;;
    --sha256) need "$1" $#; SHA256=${2,,}; shift 2 ;;
    --size) need "$1" $#; SIZE=$2; shift 2 ;;
    --hf) need "$1" $#; HF_REPO=$2; shift 2 ;;
    --local-dir) need "$1" $#; LOCAL_DIR=$2; shift 2 ;;
    --revision) need "$1" $#; REVISION=$2; shift 2 ;;
    --repo-type) need "$1" $#; REPO_TYPE=$2; shift 2 ;;
    --watch) need "$1" $#; WATCH=$2; shift 2 ;;
    --attempts) need "$1" $#; ATTEMPTS=$2; shift 2 ;;
    --attempt-timeout) need "$1" $#; ATTEMPT_TIMEOUT=$2; shift 2 ;;
    --stall) need "$1" $#; STALL=$2; shift 2 ;;
    --poll) need "$1" $#; POLL=$2; shift 2 ;;
    --backoff) need "$1" $#; BACKOFF=$2; shift 2 ;;
    --network-setup) need "$1" $#; NET_SETUP=$2; shift 2 ;;
    --network-teardown) need "$1" $#; NET_TEARDOWN=$2; shift 2 ;;
    --hf-transfer) HF_TRANSFER=1; shift ;;
    --log) need "$1" $#; LOG=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; CMD=("$@"); break ;;
    *) die_usage "unknown argument: $1" ;;
  esac
done

for pair in "attempts:$ATTEMPTS" "attempt-timeout:$ATTEMPT_TIMEOUT" "poll:$POLL"; do
  [[ ${pair#*:} =~ ^[1-9][0-9]*$ ]] || die_usage "--${pair%%:*} must be a whole number >= 1, got '${pair#*:}'"
done
for pair in "stall:$STALL" "backoff:$BACKOFF"; do
  [[ ${pair#*:} =~ ^[0-9]+$ ]] || die_usage "--${pair%%:*} must be a whole number of seconds, got '${pair#*:}'"
done
modes=0
[[ -n "$URL" ]] && modes=$((modes + 1))
[[ -n "$HF_REPO" ]] && modes=$((modes + 1))
[[ ${#CMD[@]} -gt 0 ]] && modes=$((modes + 1))
[[ $modes -eq 1 ]] || die_usage "choose exactly one of --url, --hf or -- COMMAND"
if [[ -n "$URL" ]]; then
  [[ -n "$OUT" ]] || die_usage "--url needs --out FILE"
  [[ "$URL" =~ ^https?://[^[:space:]]+$ ]] || die_usage "--url must be an http(s) URL, got '$URL'"
  [[ -z "$SHA256" || "$SHA256" =~ ^[0-9a-f]{64}$ ]] || die_usage "--sha256 must be 64 hex digits"
  [[ -z "$SIZE" || "$SIZE" =~ ^[0-9]+$ ]] || die_usage "--size must be a number of bytes"
fi
if [[ -n "$HF_REPO" ]]; then
  [[ -n "$LOCAL_DIR" ]] || die_usage "--hf needs --local-dir DIR (download to the persistent volume, then load from that path)"
  [[ "$HF_REPO" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$ ]] || die_usage "--hf must look like owner/name, got '$HF_REPO'"
  [[ -z "$REPO_TYPE" || "$REPO_TYPE" =~ ^(model|dataset|space)$ ]] || die_usage "--repo-type must be model, dataset or space"
fi
[[ -n "$URL" || -z "$OUT$SHA256$SIZE" ]] || die_usage "--out, --sha256 and --size belong to --url mode"

log() {
  local line
  line="$(date '+%Y-%m-%d %H:%M:%S') download_loop: $*"
  echo "$line" >&2
  [[ -z "$LOG" ]] || echo "$line" >>"$LOG"
}

# ------------------------------------------------------------------------------------- network
# shellcheck disable=SC2329  # invoked by the EXIT trap
teardown() { if [[ -n "$NET_TEARDOWN" ]]; then eval "$NET_TEARDOWN" || log "network teardown failed: $NET_TEARDOWN"; fi; }
if [[ -n "$NET_SETUP" ]]; then
  log "network setup: $NET_SETUP"
  eval "$NET_SETUP" || { log "network setup failed: $NET_SETUP"; exit "$EXIT_FAILED"; }
fi
trap teardown EXIT

# ----------------------------------------------------------------------------------- the attempt
# The URL fetcher: resume from the .part file's size with a Range request; a server that ignores
# Range (200 instead of 206) restarts the file from zero instead of appending garbage.
read -r -d '' FETCH_PY <<'PY' || true
import os, sys, urllib.request
url, part = sys.argv[1], sys.argv[2]
have = os.path.getsize(part) if os.path.exists(part) else 0
request = urllib.request.Request(url, headers={"User-Agent": "download_loop.sh", "Range": f"bytes={have}-"} if have
                                 else {"User-Agent": "download_loop.sh"})
try:
    response = urllib.request.urlopen(request, timeout=60)
except urllib.error.HTTPError as err:
    if err.code == 416 and have:  # the range starts at the end: the file is already complete
        sys.exit(0)
    print(f"HTTP {err.code} {err.reason}", file=sys.stderr)
    sys.exit(1)
status = response.status
if status == 206 and have:
    mode = "ab"
else:
    have, mode = 0, "wb"
total = response.headers.get("Content-Length")
expected = have + int(total) if total is not None else None
with open(part, mode) as out:
    while True:
        chunk = response.read1(1 << 20)  # what has arrived: a stall must not lose the bytes before it
        if not chunk:
            break
        out.write(chunk)
        out.flush()
size = os.path.getsize(part)
if expected is not None and size != expected:
    print(f"connection closed early: {size} of {expected} bytes", file=sys.stderr)
    sys.exit(1)
PY

size_of() {  # bytes under a file or directory (0 when missing)
  local s
  s=$(du -sb "$1" 2>/dev/null | cut -f1) || true
  echo "${s:-0}"
}

ATTEMPT_PID=""
stop_attempt() {  # the attempt runs in its own session: signal its whole group, TERM then KILL
  [[ -n "$ATTEMPT_PID" ]] || return 0
  kill -TERM -- "-$ATTEMPT_PID" 2>/dev/null || true
  local i
  for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 -- "-$ATTEMPT_PID" 2>/dev/null || return 0; sleep 0.5; : "$i"; done
  kill -KILL -- "-$ATTEMPT_PID" 2>/dev/null || true
}
trap 'stop_attempt; exit 130' INT TERM

run_attempt() {  # run_attempt WATCH_PATH COMMAND... -> the command's status; 124 = timed out or stalled
  local watch=$1; shift
  setsid timeout -k 10 "$ATTEMPT_TIMEOUT" "$@" &
  ATTEMPT_PID=$!
  local last grew_at checked now size rc=0
  last=$(size_of "$watch")
  grew_at=$SECONDS
  checked=$SECONDS
  while kill -0 "$ATTEMPT_PID" 2>/dev/null; do
    sleep 0.5
    now=$SECONDS
    [[ $((now - checked)) -ge $POLL ]] || continue
    checked=$now
    kill -0 "$ATTEMPT_PID" 2>/dev/null || break
    size=$(size_of "$watch")
    if [[ $size -gt $last ]]; then
      log "progress: $size bytes (+$((size - last)))"
      last=$size; grew_at=$now
    elif [[ $STALL -gt 0 && $((now - grew_at)) -ge $STALL ]]; then
      log "no progress for $((now - grew_at))s (stuck at $size bytes): killing this attempt"
      stop_attempt
      wait "$ATTEMPT_PID" 2>/dev/null || true
      ATTEMPT_PID=""
      return 124
    fi
  done
  wait "$ATTEMPT_PID" || rc=$?
  ATTEMPT_PID=""
  return "$rc"
}

retry() {  # retry WATCH_PATH COMMAND...
  local watch=$1; shift
  local attempt rc wait_s=$BACKOFF
  for attempt in $(seq 1 "$ATTEMPTS"); do
    log "attempt $attempt/$ATTEMPTS: $*"
    rc=0
    run_attempt "$watch" "$@" || rc=$?
    if [[ $rc -eq 0 ]]; then log "attempt $attempt succeeded"; return 0; fi
    case $rc in
      124|137) log "attempt $attempt timed out or stalled" ;;
      *) log "attempt $attempt failed with status $rc" ;;
    esac
    if [[ $attempt -lt $ATTEMPTS ]]; then
      log "waiting ${wait_s}s before retrying"
      sleep "$wait_s"
      wait_s=$(( wait_s * 2 > 300 ? 300 : wait_s * 2 ))
    fi
  done
  log "all $ATTEMPTS attempts failed"
  return 1
}

# ---------------------------------------------------------------------------------- verification
# HF mode: no .incomplete file may remain, and every .safetensors file must be whole. A safetensors file
# is an 8-byte little-endian header length, a JSON header, then the data; every tensor's data_offsets
# must lie inside the file. Checked with the standard library only.
read -r -d '' VERIFY_DIR_PY <<'PY' || true
import json, os, struct, sys
root = sys.argv[1]
bad = files = total = 0
for folder, _dirs, names in os.walk(root):
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith(".incomplete"):
            bad += 1
            print(f"BAD {path}: an interrupted download was left behind")
            continue
        if os.sep + ".cache" + os.sep in path:
            continue
        files += 1
        size = os.path.getsize(path)
        total += size
        if not name.endswith(".safetensors"):
            continue
        try:
            with open(path, "rb") as handle:
                (n,) = struct.unpack("<Q", handle.read(8))
                if n > size - 8:
                    raise ValueError(f"header length {n} exceeds the file ({size} bytes)")
                header = json.loads(handle.read(n))
            data = size - 8 - n
            for tensor, meta in header.items():
                if tensor == "__metadata__":
                    continue
                start, end = meta["data_offsets"]
                if not 0 <= start <= end <= data:
                    raise ValueError(f"tensor {tensor} [{start}, {end}) lies outside the {data} data bytes")
            print(f"ok  {path}: {len(header) - ('__metadata__' in header)} tensors")
        except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as err:
            bad += 1
            print(f"BAD {path}: {err}")
print(f"{files} files, {total} bytes, {bad} bad")
sys.exit(1 if bad or not files else 0)
PY

verify_url() {
  local part="$OUT.part" got
  got=$(size_of "$part")
  if [[ -n "$SIZE" && "$got" != "$SIZE" ]]; then
    log "size mismatch: $got bytes, expected $SIZE"; mv -f "$part" "$OUT.corrupt"; return 1
  fi
  if [[ -n "$SHA256" ]]; then
    got=$(sha256sum "$part" | cut -d' ' -f1)
    if [[ "$got" != "$SHA256" ]]; then
      log "sha256 mismatch: $got, expected $SHA256 (kept as $OUT.corrupt)"; mv -f "$part" "$OUT.corrupt"; return 1
    fi
    log "sha256 ok"
  fi
  mv -f "$part" "$OUT"
  log "done: $OUT ($(size_of "$OUT") bytes)"
}

verify_hf() {
  python3 -c "$VERIFY_DIR_PY" "$LOCAL_DIR" >&2 || { log "verification of $LOCAL_DIR failed (see the BAD lines)"; return 1; }
  log "done: $LOCAL_DIR"
}

# ------------------------------------------------------------------------------------------ main
if [[ -n "$URL" ]]; then
  mkdir -p "$(dirname "$OUT")"
  if [[ -e "$OUT" ]]; then
    log "$OUT exists: verifying it instead of downloading again"
    mv -f "$OUT" "$OUT.part"
  else
    retry "$OUT.part" python3 -c "$FETCH_PY" "$URL" "$OUT.part" || exit "$EXIT_FAILED"
  fi
  verify_url || exit "$EXIT_VERIFY"
  exit "$EXIT_OK"
fi

if [[ -n "$HF_REPO" ]]; then
  if [[ $HF_TRANSFER -eq 0 ]]; then export HF_HUB_ENABLE_HF_TRANSFER=0; fi
  export HF_HUB_DOWNLOAD_TIMEOUT=${HF_HUB_DOWNLOAD_TIMEOUT:-60} HF_HUB_ETAG_TIMEOUT=${HF_HUB_ETAG_TIMEOUT:-30}
  if command -v huggingface-cli >/dev/null 2>&1; then cli=(huggingface-cli download)
  elif command -v hf >/dev/null 2>&1; then cli=(hf download)
  else log "neither huggingface-cli nor hf is installed: pip install -U huggingface_hub"; exit "$EXIT_FAILED"; fi
  args=("$HF_REPO" --local-dir "$LOCAL_DIR")
  [[ -z "$REVISION" ]] || args+=(--revision "$REVISION")
  [[ -z "$REPO_TYPE" ]] || args+=(--repo-type "$REPO_TYPE")
  mkdir -p "$LOCAL_DIR"
  log "endpoint: ${HF_ENDPOINT:-https://huggingface.co (default)}"
  retry "$LOCAL_DIR" "${cli[@]}" "${args[@]}" || exit "$EXIT_FAILED"
  verify_hf || exit "$EXIT_VERIFY"
  exit "$EXIT_OK"
fi

if [[ -z "$WATCH" ]]; then STALL=0; WATCH=/dev/null; fi  # nothing to watch: timeouts and retries only
retry "$WATCH" "${CMD[@]}" || exit "$EXIT_FAILED"
exit "$EXIT_OK"
