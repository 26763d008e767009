#!/usr/bin/env bash
# Wheels a bare GPU box lacks, for bench/gpu_suite.sh: every runtime dependency in pyproject.toml except
# torch and nvidia-ml-py (the box has those), and pytest, with their dependencies, for CPython $PYVER
# (default 3.12) on manylinux x86_64, into .whl/. python-hostlist ships no wheel, so it is built here.
#
#   bash bench/gpu_wheels.sh                  # PYVER=3.12 DEST=.whl (PYVER="3.11 3.12": both)
#   CHECK_PYTHON=/path/to/python3.12 bash bench/gpu_wheels.sh   # also install them into a temp dir
#                                             # with that python and import the CLI without torch
# On the box: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#             export PYTHONPATH=/tmp/site:$PWD/tools
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYVER=${PYVER:-3.12}
DEST=${DEST:-$ROOT/.whl}
PY=${PYTHON:-python3}
mkdir -p "$DEST"

mapfile -t REQS < <("$PY" - "$ROOT/pyproject.toml" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
for dep in deps:
    name = re.split(r"[\[<>=!~; ]", dep, maxsplit=1)[0].lower()
    if name not in ("torch", "nvidia-ml-py", "python-hostlist"):
        print(dep)
PY
)
REQS+=("pytest>=8")  # the suite runs the gpu-marked tests; a bare box has no pytest
echo "for CPython $PYVER: ${REQS[*]} + python-hostlist"
for version in $PYVER; do  # PYVER="3.11 3.12" fetches for both; the suite installs what fits its python
  "$PY" -m pip download --quiet --only-binary=:all: --python-version "$version" --implementation cp \
    --abi "cp${version/./}" --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$DEST" "${REQS[@]}"
done
hostlist=$(grep -o '"python-hostlist[^"]*"' "$ROOT/pyproject.toml" | tr -d '"')
"$PY" -m pip wheel --quiet --no-deps -w "$DEST" "$hostlist"
wheels=("$DEST"/*.whl)
printf '  %s\n' "${wheels[@]##*/}"
echo "${#wheels[@]} wheels, $(du -sh "$DEST" | cut -f1) in $DEST"

if [ -n "${CHECK_PYTHON:-}" ]; then  # the install the box does, and what imports without torch
  target=$(mktemp -d)
  trap 'rm -rf "$target"' EXIT
  "$CHECK_PYTHON" -m pip install --quiet --no-index --no-deps --target "$target" "$DEST"/*.whl
  PYTHONPATH="$target:$ROOT/tools" "$CHECK_PYTHON" -s - <<'PY'
import importlib.util, sys
assert importlib.util.find_spec("torch") is None, "this check must run without torch"
import remote_gpu_trainer.cli  # noqa: F401
from remote_gpu_trainer.registry import all_specs
from remote_gpu_trainer.server import build_server
specs = all_specs()
build_server()
print(f"python {sys.version.split()[0]}: remote_gpu_trainer.cli imports, {len(specs)} tools register, "
      "the MCP server builds, all without torch")
PY
  PYTHONPATH="$target:$ROOT/tools" "$CHECK_PYTHON" -s -m remote_gpu_trainer health | tail -3 || true
fi
