#!/usr/bin/env bash
# setup-china-mirrors.sh — point pip, conda and the Hugging Face endpoint at mirrors reachable from
# mainland China (CN-01..CN-05), reversibly: dry run by default; --apply backs up every file it changes
# and records what it did; --revert puts everything back exactly. Prefer the provider's own mirror or
# proxy when it has one (profiles/<provider>.md: network_setup, env).
set -euo pipefail

readonly EXIT_OK=0 EXIT_FAILED=1 EXIT_USAGE=2 EXIT_STATE=3

usage() {
  cat <<'EOF'
Usage: setup-china-mirrors.sh [--apply | --revert] [--mirror NAME] [--only LIST] [--hf-endpoint URL] [--help]

Without --apply or --revert: a dry run that prints every change it would make.

What --apply changes (each file is backed up first; a file that did not exist is recorded as
created, so --revert deletes it):
  pip    ~/.config/pip/pip.conf (or $PIP_CONFIG_FILE): [global] index-url = <mirror>,
         timeout = 120, retries = 10 (CN-01); other settings in the file are kept
  conda  ~/.condarc: default_channels and custom_channels (conda-forge, pytorch) on the mirror,
         show_channel_urls (CN-03). A new file is written when none exists; an existing one is
         edited with `conda config`, or left alone (with a note) when conda is not installed
  hf     ~/.config/rgt/mirrors.env exports HF_ENDPOINT, sourced from ~/.bashrc by a marked block,
         so every new shell and every job started from it has it before Python starts (CN-05, CN-06)

Options:
  --apply            make the changes (refused when already applied: --revert first)
  --revert           undo the last --apply: restore backups, delete created files, remove the block
  --mirror NAME      tuna (default), ustc, aliyun or bfsu
  --only LIST        comma list of pip, conda, hf (default: all three)
  --hf-endpoint URL  Hugging Face endpoint (default https://hf-mirror.com, a third-party mirror:
                     use read-only tokens with it)
  -h, --help         this help

State and backups: ~/.config/rgt/mirrors/ (state file + one backup per changed file).

Exit status:
  0  dry run printed, changes applied, or reverted
  1  a step failed (the state file lists what was done before it; --revert undoes that)
  2  bad usage
  3  --apply when already applied, or --revert with nothing to revert
EOF
}

die_usage() { echo "setup-china-mirrors.sh: $1" >&2; echo "Try: setup-china-mirrors.sh --help" >&2; exit "$EXIT_USAGE"; }

ACTION=dry
MIRROR=tuna
ONLY=pip,conda,hf
HF_ENDPOINT_URL=https://hf-mirror.com
while [[ $# -gt 0 ]]; do
  case "$1" in
    --apply) [[ $ACTION == dry ]] || die_usage "choose one of --apply and --revert"; ACTION=apply; shift ;;
    --revert) [[ $ACTION == dry ]] || die_usage "choose one of --apply and --revert"; ACTION=revert; shift ;;
    --mirror) [[ $# -ge 2 ]] || die_usage "--mirror needs a name"; MIRROR=$2; shift 2 ;;
    --only) [[ $# -ge 2 ]] || die_usage "--only needs a list"; ONLY=$2; shift 2 ;;
    --hf-endpoint) [[ $# -ge 2 ]] || die_usage "--hf-endpoint needs a URL"; HF_ENDPOINT_URL=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die_usage "unknown argument: $1" ;;
  esac
done

case "$MIRROR" in
  tuna) PIP_URL=https://pypi.tuna.tsinghua.edu.cn/simple; CONDA_BASE=https://mirrors.tuna.tsinghua.edu.cn/anaconda ;;
  ustc) PIP_URL=https://mirrors.ustc.edu.cn/pypi/simple; CONDA_BASE=https://mirrors.ustc.edu.cn/anaconda ;;
  aliyun) PIP_URL=https://mirrors.aliyun.com/pypi/simple/; CONDA_BASE=https://mirrors.aliyun.com/anaconda ;;
  bfsu) PIP_URL=https://mirrors.bfsu.edu.cn/pypi/web/simple; CONDA_BASE=https://mirrors.bfsu.edu.cn/anaconda ;;
  *) die_usage "--mirror must be one of tuna, ustc, aliyun, bfsu (got '$MIRROR')" ;;
esac
IFS=, read -r -a PARTS <<<"$ONLY"
for part in "${PARTS[@]}"; do
  [[ $part == pip || $part == conda || $part == hf ]] || die_usage "--only takes pip, conda, hf (got '$part')"
done
[[ "$HF_ENDPOINT_URL" =~ ^https?://[^[:space:]\'\"]+$ ]] || die_usage "--hf-endpoint must be an http(s) URL"
wants() { [[ ",$ONLY," == *",$1,"* ]]; }

STATE_DIR="$HOME/.config/rgt/mirrors"
STATE="$STATE_DIR/state"
PIP_CONF=${PIP_CONFIG_FILE:-$HOME/.config/pip/pip.conf}
CONDARC="$HOME/.condarc"
ENV_FILE="$HOME/.config/rgt/mirrors.env"
BASHRC="$HOME/.bashrc"
readonly BLOCK_BEGIN="# >>> rgt mirrors (setup-china-mirrors.sh) >>>"
readonly BLOCK_END="# <<< rgt mirrors <<<"

# ------------------------------------------------------------------------------------------ revert
if [[ $ACTION == revert ]]; then
  [[ -s "$STATE" ]] || { echo "nothing to revert: $STATE does not exist"; exit "$EXIT_STATE"; }
  mapfile -t lines <"$STATE"
  dirs=()
  for (( i=${#lines[@]} - 1; i >= 0; i-- )); do
    IFS='|' read -r kind path backup <<<"${lines[$i]}"
    case "$kind" in
      created) rm -f -- "$path"; echo "removed $path" ;;
      createddir) dirs+=("$path") ;;
      backup) cp -p -- "$backup" "$path"; echo "restored $path" ;;
      *) echo "unknown state line: ${lines[$i]}" >&2 ;;
    esac
  done
  rm -rf -- "$STATE_DIR"
  for dir in "${dirs[@]}"; do  # deepest first: the state file recorded parents before children
    if rmdir -- "$dir" 2>/dev/null; then echo "removed $dir/"; else echo "kept $dir/ (something else is in it now)"; fi
  done
  echo "reverted; open a new shell (or unset HF_ENDPOINT) so the old environment applies again"
  exit "$EXIT_OK"
fi

if [[ $ACTION == apply && -s "$STATE" ]]; then
  echo "already applied ($STATE exists): run --revert first to change or remove the mirrors"
  exit "$EXIT_STATE"
fi

# ------------------------------------------------------------------------------------------ steps
DRY=1; [[ $ACTION == apply ]] && DRY=0
say() { if [[ $DRY -eq 1 ]]; then echo "would: $*"; else echo "$*"; fi; }

make_dirs() {  # make_dirs DIR: mkdir -p, recording each directory it creates so --revert can remove it
  local dir=$1 missing=()
  while [[ ! -d "$dir" ]]; do missing=("$dir" "${missing[@]}"); dir=$(dirname "$dir"); done
  [[ ${#missing[@]} -gt 0 ]] || return 0
  mkdir -p "${missing[-1]}"
  for dir in "${missing[@]}"; do [[ "$dir" == "$STATE_DIR" ]] || echo "createddir|$dir|" >>"$STATE"; done
}

remember() {  # remember PATH: back it up (or record it as created) before the first change
  local path=$1 backup
  if [[ ! -d "$STATE_DIR" ]]; then
    local parent=$STATE_DIR missing=()
    while [[ ! -d "$parent" ]]; do missing=("$parent" "${missing[@]}"); parent=$(dirname "$parent"); done
    mkdir -p "$STATE_DIR"
    for parent in "${missing[@]}"; do [[ "$parent" == "$STATE_DIR" ]] || echo "createddir|$parent|" >>"$STATE"; done
  fi
  make_dirs "$(dirname "$path")"
  if [[ -e "$path" ]]; then
    backup="$STATE_DIR/$(echo "$path" | tr '/' '_').orig"
    cp -p -- "$path" "$backup"
    echo "backup|$path|$backup" >>"$STATE"
  else
    echo "created|$path|" >>"$STATE"
  fi
}

# pip.conf is INI: python3's configparser edits three keys and keeps the rest of the file's settings.
read -r -d '' PIP_PY <<'PY' || true
import configparser, sys
path, url = sys.argv[1], sys.argv[2]
config = configparser.ConfigParser()
config.read(path)
if not config.has_section("global"):
    config.add_section("global")
config["global"]["index-url"] = url
config["global"]["timeout"] = "120"
config["global"]["retries"] = "10"
with open(path, "w") as handle:
    config.write(handle)
PY

step_pip() {
  say "pip: set [global] index-url = $PIP_URL, timeout = 120, retries = 10 in $PIP_CONF"
  [[ -z "${PIP_INDEX_URL:-}" ]] || echo "note: PIP_INDEX_URL=$PIP_INDEX_URL is set in this environment and wins over pip.conf"
  [[ $DRY -eq 1 ]] && return 0
  remember "$PIP_CONF"
  python3 -c "$PIP_PY" "$PIP_CONF" "$PIP_URL"
}

step_conda() {
  local main="$CONDA_BASE/pkgs/main" r="$CONDA_BASE/pkgs/r" msys2="$CONDA_BASE/pkgs/msys2" cloud="$CONDA_BASE/cloud"
  if [[ ! -e "$CONDARC" ]]; then
    say "conda: write $CONDARC with default_channels on $CONDA_BASE/pkgs and conda-forge, pytorch on $cloud"
    [[ $DRY -eq 1 ]] && return 0
    remember "$CONDARC"
    cat >"$CONDARC" <<EOF
# written by setup-china-mirrors.sh (--revert removes it)
channels:
  - defaults
show_channel_urls: true
default_channels:
  - $main
  - $r
  - $msys2
custom_channels:
  conda-forge: $cloud
  pytorch: $cloud
EOF
    return 0
  fi
  if ! command -v conda >/dev/null 2>&1; then
    echo "note: $CONDARC exists and conda is not installed here: left unchanged; set default_channels and custom_channels by hand (CN-03)"
    return 0
  fi
  say "conda: edit $CONDARC with conda config (default_channels, custom_channels conda-forge/pytorch, show_channel_urls)"
  [[ $DRY -eq 1 ]] && return 0
  remember "$CONDARC"
  conda config --file "$CONDARC" --remove-key default_channels >/dev/null 2>&1 || true
  conda config --file "$CONDARC" --append default_channels "$main"
  conda config --file "$CONDARC" --append default_channels "$r"
  conda config --file "$CONDARC" --append default_channels "$msys2"
  conda config --file "$CONDARC" --set custom_channels.conda-forge "$cloud"
  conda config --file "$CONDARC" --set custom_channels.pytorch "$cloud"
  conda config --file "$CONDARC" --set show_channel_urls true
  echo "conda: run 'conda clean -i' once so cached indexes from the old channels are dropped"
}

step_hf() {
  say "hf: write $ENV_FILE (export HF_ENDPOINT=$HF_ENDPOINT_URL) and source it from $BASHRC"
  [[ $DRY -eq 1 ]] && return 0
  remember "$ENV_FILE"
  printf '# written by setup-china-mirrors.sh (--revert removes it)\nexport HF_ENDPOINT=%s\n' "$HF_ENDPOINT_URL" >"$ENV_FILE"
  if [[ -f "$BASHRC" ]] && [[ "$(<"$BASHRC")" == *"$BLOCK_BEGIN"* ]]; then return 0; fi
  remember "$BASHRC"
  # shellcheck disable=SC2016  # $HOME must stay literal: it is expanded by each new shell
  printf '\n%s\n[ -f "$HOME/.config/rgt/mirrors.env" ] && . "$HOME/.config/rgt/mirrors.env"\n%s\n' \
    "$BLOCK_BEGIN" "$BLOCK_END" >>"$BASHRC"
}

[[ $DRY -eq 1 ]] && echo "dry run (nothing is changed; --apply to make these changes, --revert undoes them):"
status=$EXIT_OK
if wants pip; then step_pip || { echo "FAILED: pip step" >&2; status=$EXIT_FAILED; }; fi
if wants conda; then step_conda || { echo "FAILED: conda step" >&2; status=$EXIT_FAILED; }; fi
if wants hf; then step_hf || { echo "FAILED: hf step" >&2; status=$EXIT_FAILED; }; fi
if [[ $DRY -eq 0 ]]; then
  echo "done. Verify: pip config list; conda config --show default_channels custom_channels;"
  echo "  bash -lc 'echo \$HF_ENDPOINT'; python -c \"import huggingface_hub.constants as c; print(c.ENDPOINT)\""
  echo "undo with: $0 --revert"
fi
exit "$status"
