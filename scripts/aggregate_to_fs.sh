#!/usr/bin/env bash
# aggregate_to_fs.sh — copy run results to durable storage and prove the copies are whole, before anybody
# decides to stop or destroy the box (SPOT-04, PAR-07). Small artifacts (configs, metrics, logs,
# exit codes) always; checkpoints only when asked, and only complete ones (a COMPLETE marker, no
# .tmp leftovers: SPOT-06). Every copied file is written under a temporary name, renamed into place
# and compared with its source by sha256; each run gets a MANIFEST.sha256 that `sha256sum -c` can
# re-check later. Never deletes anything, on either side.
set -euo pipefail

readonly EXIT_OK=0 EXIT_COPY_FAILED=1 EXIT_USAGE=2 EXIT_INCOMPLETE=3

usage() {
  cat <<'EOF'
Usage: aggregate_to_fs.sh [options] SRC DEST

SRC is a directory of runs (each subdirectory is one run: runs/<run_id>/...), or with --single one
run directory. DEST is the durable location; each run lands in DEST/<run_id>/.

Options:
  --single               SRC itself is one run
  --include-checkpoints  also copy checkpoints (directories named checkpoint*, ckpt*, step_*,
                         global_step*, and *.pt *.pth *.bin *.safetensors *.ckpt *.distcp files);
                         a checkpoint directory is copied only when it holds the --marker file
  --marker NAME          completion marker of a checkpoint directory (default COMPLETE); use
                         --marker '' to copy unmarked directories (e.g. HF Trainer checkpoint-N)
  --expect FILE          run ids expected (one per line): missing runs, and runs without an
                         exit_code file at DEST, make the exit status 3
  --verify MODE          sha256 (default) or size
  --dry-run              list what would be copied; copy nothing
  -h, --help             this help

Skipped always: names containing .tmp (a save in progress), pgid files, and anything under a
checkpoint directory that lacks its marker. Unchanged files (same size and mtime as the copy at
DEST) are not copied again, but still verified.

Exit status:
  0  everything selected was copied and verified
  1  a copy or a verification failed (details above the summary)
  2  bad usage
  3  copied and verified, but --expect lists runs that are missing or have no exit_code at DEST
EOF
}

die_usage() { echo "aggregate_to_fs.sh: $1" >&2; echo "Try: aggregate_to_fs.sh --help" >&2; exit "$EXIT_USAGE"; }

SINGLE=0 CKPTS=0 MARKER=COMPLETE EXPECT="" VERIFY=sha256 DRY=0
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --single) SINGLE=1; shift ;;
    --include-checkpoints) CKPTS=1; shift ;;
    --marker) [[ $# -ge 2 ]] || die_usage "--marker needs a file name (or '')"; MARKER=$2; shift 2 ;;
    --expect) [[ $# -ge 2 ]] || die_usage "--expect needs a file"; EXPECT=$2; shift 2 ;;
    --verify) [[ $# -ge 2 ]] || die_usage "--verify needs sha256 or size"; VERIFY=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die_usage "unknown option: $1" ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
[[ ${#ARGS[@]} -eq 2 ]] || die_usage "give SRC and DEST"
SRC=${ARGS[0]%/}
DEST=${ARGS[1]%/}
[[ -d "$SRC" ]] || die_usage "SRC '$SRC' is not a directory"
[[ "$VERIFY" == sha256 || "$VERIFY" == size ]] || die_usage "--verify must be sha256 or size, got '$VERIFY'"
[[ -z "$EXPECT" || -r "$EXPECT" ]] || die_usage "--expect file '$EXPECT' is not readable"
[[ "$MARKER" != */* ]] || die_usage "--marker is a file name, not a path"
src_real=$(cd "$SRC" && pwd -P)
if [[ -d "$DEST" ]]; then
  dest_real=$(cd "$DEST" && pwd -P)
  [[ "$dest_real" != "$src_real" && "$dest_real" != "$src_real"/* ]] || die_usage "DEST must not be SRC or inside it"
fi

shopt -s globstar dotglob nullglob

is_ckpt_dir_name() { [[ "$1" == checkpoint* || "$1" == ckpt* || "$1" == step_* || "$1" == global_step* ]]; }
is_ckpt_file() { [[ "$1" =~ \.(pt|pth|bin|safetensors|ckpt|distcp)$ ]]; }

size_of() { stat -c %s "$1"; }
digest() { sha256sum "$1" | cut -d' ' -f1; }

COPIED=0 UNCHANGED=0 SKIPPED=0 FAILED=0
declare -a SKIP_NOTES=() FAIL_NOTES=()

copy_one() {  # copy_one SRC_FILE DEST_FILE -> copies (if changed) and verifies
  local from=$1 to=$2 tmp
  if [[ $DRY -eq 1 ]]; then echo "  would copy ${from#"$SRC"/} ($(size_of "$from") bytes)"; COPIED=$((COPIED + 1)); return 0; fi
  mkdir -p "$(dirname "$to")"
  if [[ -f "$to" && $(size_of "$to") == $(size_of "$from") && $(stat -c %Y "$to") == $(stat -c %Y "$from") ]]; then
    UNCHANGED=$((UNCHANGED + 1))
  else
    tmp="$(dirname "$to")/.$(basename "$to").rgt-partial.$$"
    if ! cp -p -- "$from" "$tmp" || ! mv -f -- "$tmp" "$to"; then
      rm -f -- "$tmp"
      FAILED=$((FAILED + 1)); FAIL_NOTES+=("copy failed: $from"); return 1
    fi
    COPIED=$((COPIED + 1))
  fi
  if [[ $(size_of "$to") != $(size_of "$from") ]]; then
    FAILED=$((FAILED + 1)); FAIL_NOTES+=("size differs after copy: $to"); return 1
  fi
  if [[ $VERIFY == sha256 ]]; then
    local a b
    a=$(digest "$from"); b=$(digest "$to")
    if [[ "$a" != "$b" ]]; then FAILED=$((FAILED + 1)); FAIL_NOTES+=("sha256 differs after copy: $to"); return 1; fi
    MANIFEST_LINES+=("$b  ${to#"$DEST/$RUN_ID"/}")
  fi
}

write_manifest() {  # merge this pass's verified lines into the run's manifest (earlier entries stay)
  local manifest=$1 line path dir
  dir=$(dirname "$manifest")
  declare -A entries=()
  if [[ -f "$manifest" ]]; then
    while IFS= read -r line; do
      path=${line#*  }
      [[ -f "$dir/$path" ]] && entries[$path]=$line
    done <"$dir/MANIFEST.sha256"
  fi
  for line in "${MANIFEST_LINES[@]}"; do entries[${line#*  }]=$line; done
  printf '%s\n' "${entries[@]}" | sort -k2 >"$manifest.tmp"
  mv -f "$manifest.tmp" "$manifest"
}

aggregate_run() {  # aggregate_run RUN_DIR RUN_ID
  local run=$1 f rel top
  RUN_ID=$2
  MANIFEST_LINES=()
  local before_c=$COPIED before_u=$UNCHANGED before_s=$SKIPPED before_f=$FAILED
  [[ $DRY -eq 0 ]] || echo "run $RUN_ID:"
  declare -A bad_ckpt=()
  for f in "$run"/**; do
    [[ -f "$f" && ! -L "$f" ]] || continue
    rel=${f#"$run"/}
    if [[ "$rel" == *.tmp* || "$rel" == */.*.rgt-partial.* || "$(basename "$rel")" == pgid ]]; then
      SKIPPED=$((SKIPPED + 1)); continue
    fi
    top=${rel%%/*}
    if [[ "$rel" == */* ]] && is_ckpt_dir_name "$top"; then
      if [[ $CKPTS -eq 0 ]]; then SKIPPED=$((SKIPPED + 1)); continue; fi
      if [[ -n "$MARKER" && ! -f "$run/$top/$MARKER" ]]; then
        [[ -n "${bad_ckpt[$top]:-}" ]] || SKIP_NOTES+=("$RUN_ID/$top: no $MARKER marker (incomplete or still saving): not copied")
        bad_ckpt[$top]=1; SKIPPED=$((SKIPPED + 1)); continue
      fi
    elif is_ckpt_file "$rel" && [[ $CKPTS -eq 0 ]]; then
      SKIPPED=$((SKIPPED + 1)); continue
    fi
    copy_one "$f" "$DEST/$RUN_ID/$rel" || true
  done
  if [[ $DRY -eq 0 && $VERIFY == sha256 && ${#MANIFEST_LINES[@]} -gt 0 ]]; then write_manifest "$DEST/$RUN_ID/MANIFEST.sha256"; fi
  [[ $DRY -eq 1 ]] || echo "run $RUN_ID: $((COPIED - before_c)) copied, $((UNCHANGED - before_u)) unchanged," \
    "$((SKIPPED - before_s)) skipped, $((FAILED - before_f)) failed"
  [[ -f "$run/exit_code" ]] || SKIP_NOTES+=("$RUN_ID: no exit_code file: still running, or it died without one")
}

if [[ $DRY -eq 0 ]]; then mkdir -p "$DEST"; fi
echo "aggregate_to_fs.sh: $SRC -> $DEST$([[ $DRY -eq 1 ]] && echo ' (dry run: nothing is copied)')"
if [[ $SINGLE -eq 1 ]]; then
  aggregate_run "$SRC" "$(basename "$src_real")"
else
  runs=0
  for run in "$SRC"/*/; do
    run=${run%/}
    [[ -L "$run" ]] && continue
    aggregate_run "$run" "$(basename "$run")"
    runs=$((runs + 1))
  done
  [[ $runs -gt 0 ]] || echo "no run directories under $SRC (use --single for one run directory)"
fi

for note in "${SKIP_NOTES[@]}"; do echo "note: $note"; done
for note in "${FAIL_NOTES[@]}"; do echo "FAILED: $note"; done

MISSING=()
if [[ -n "$EXPECT" ]]; then
  while IFS= read -r id || [[ -n "$id" ]]; do
    id=${id%%#*}; id=${id//[[:space:]]/}
    [[ -n "$id" ]] || continue
    if [[ $DRY -eq 1 ]]; then [[ -f "$SRC/$id/exit_code" ]] || MISSING+=("$id"); continue; fi
    [[ -f "$DEST/$id/exit_code" ]] || MISSING+=("$id")
  done <"$EXPECT"
  if [[ ${#MISSING[@]} -gt 0 ]]; then echo "expected runs missing or without exit_code: ${MISSING[*]}"; fi
fi

verb=copied; [[ $DRY -eq 1 ]] && verb="to copy"
echo "summary: $COPIED $verb, $UNCHANGED unchanged, $SKIPPED skipped, $FAILED failed (verify: $VERIFY)"
[[ $FAILED -eq 0 ]] || exit "$EXIT_COPY_FAILED"
[[ ${#MISSING[@]} -eq 0 ]] || exit "$EXIT_INCOMPLETE"
exit "$EXIT_OK"
