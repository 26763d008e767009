"""The runtime on a box: this checkout built as a wheel, installed into a venv that sees the box's own torch.

Layout on the box, all under the user's home (no root)::

    ~/.cache/remote-gpu-trainer/<version>/dist/     the wheel (and, with --wheels, its dependencies)
    ~/.cache/remote-gpu-trainer/<version>/venv/     python -m venv --system-site-packages
    ~/.cache/remote-gpu-trainer/<version>/ready     written last: a half-finished install is never used

``<version>`` is the package version plus a hash of every file that goes into the wheel (``0.1.0+1a2b…``),
so a changed checkout is a different version: reported as a mismatch, never used stale. The venv uses
``--system-site-packages`` so the box's own torch and CUDA are what the tools see, and nothing large is
downloaded. Every remote command here is a fixed string or a fixed script of ours; values in it are our
own version and file names, whose characters are checked.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import re
import tarfile
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ..paths import skill_root

PACKAGE = "remote_gpu_trainer"
DIST_NAME = "remote_gpu_trainer"
RUNTIME_BASE = "$HOME/.cache/remote-gpu-trainer"
"""Shell expression for the runtime's parent directory on the box (expanded by the box's ``sh``)."""
SKILL_DIRS = ("references", "profiles", "scripts")
_SAFE = re.compile(r"^[A-Za-z0-9.+_-]+$")
#: The runtime needs none of the MCP SDK: the box only runs tool functions and answers JSON.
_NOT_ON_BOX = ("mcp",)


def _package_dir() -> Path:
    return Path(__file__).resolve().parents[1]


def _payload_files() -> list[tuple[str, Path]]:
    """(path inside the wheel, local file): the package, plus the skill's markdown and scripts under ``_skill/``."""
    files: list[tuple[str, Path]] = []
    package = _package_dir()
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc",) \
                and "_skill" not in path.relative_to(package).parts[:1]:
            files.append((f"{PACKAGE}/{path.relative_to(package).as_posix()}", path))
    root = skill_root()
    skill = [root / "SKILL.md", *(p for d in SKILL_DIRS for p in sorted((root / d).rglob("*")))]
    for path in skill:
        if path.is_file() and "__pycache__" not in path.parts:
            files.append((f"{PACKAGE}/_skill/{path.relative_to(root).as_posix()}", path))
    return files


@functools.cache
def build_hash() -> str:
    digest = hashlib.sha256()
    for name, path in _payload_files():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def runtime_version() -> str:
    """``<package version>+<hash of the build>``: what a box must have for this checkout to talk to it."""
    built = _package_dir() / "_build.json"
    if built.is_file():  # running from an installed runtime: the version it was built as
        import json

        return json.loads(built.read_text())["version"]
    return f"{__version__}+{build_hash()}"


def box_requirements() -> list[str]:
    """The project's dependencies minus those only the local MCP side needs."""
    pyproject = skill_root() / "pyproject.toml"
    if pyproject.is_file():
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    else:
        from importlib import metadata

        deps = [r for r in metadata.requires("remote-gpu-trainer") or [] if "extra ==" not in r]
    return [d for d in deps if re.split(r"[\[<>=!~ ;]", d, maxsplit=1)[0].lower() not in _NOT_ON_BOX]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel_name(version: str | None = None) -> str:
    return f"{DIST_NAME}-{version or runtime_version()}-py3-none-any.whl"


def build_wheel() -> tuple[str, bytes]:
    """This checkout as a pure-Python wheel, in memory (no build backend, no network): name and bytes."""
    version = runtime_version()
    info = f"{DIST_NAME}-{version}.dist-info"
    entries: list[tuple[str, bytes]] = [(name, path.read_bytes()) for name, path in _payload_files()]
    entries.append((f"{PACKAGE}/_build.json", f'{{"version": "{version}"}}\n'.encode()))
    metadata_text = "\n".join(["Metadata-Version: 2.1", "Name: remote-gpu-trainer", f"Version: {version}",
                               "Requires-Python: >=3.11", *(f"Requires-Dist: {r}" for r in box_requirements())])
    entries.append((f"{info}/METADATA", (metadata_text + "\n").encode()))
    entries.append((f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: remote-gpu-trainer\n"
                                     b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    # `rgt` inside the runtime's venv, to rerun a tool by hand on the box
    entries.append((f"{info}/entry_points.txt", b"[console_scripts]\nrgt = remote_gpu_trainer.cli:main\n"))
    record = [_record_line(name, data) for name, data in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in entries:
            wheel.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return wheel_name(version), buffer.getvalue()


def dist_tarball(extra_wheels: Sequence[Path] = ()) -> bytes:
    """The wheel plus any dependency wheels, as one tar stream for ``tar -xf - -C dist``."""
    name, data = build_wheel()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member, blob in [(name, data), *((p.name, p.read_bytes()) for p in extra_wheels)]:
            info = tarfile.TarInfo(member)
            info.size = len(blob)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(blob))
    return buffer.getvalue()


def _checked(value: str) -> str:
    if not _SAFE.match(value):
        raise ValueError(f"unsafe value for a remote script: {value!r}")
    return value


def serve_command(version: str | None = None) -> str:
    """The one remote command of a session: exec the runtime's JSON-lines server, or say what is missing.

    Wrapped in ``sh -c '…'`` so it works whatever the user's login shell is (fish, csh, …).
    Exit 90 means "no runtime of this version"; stderr lists the versions that are there.
    """
    version = _checked(version or runtime_version())
    script = (f'd="{RUNTIME_BASE}/{version}"; '
              'if [ -f "$d/ready" ]; then exec "$d/venv/bin/python" -m remote_gpu_trainer.remote.serve; fi; '
              f'echo "rgt-runtime-missing: {version}; installed: '
              f'$(ls "{RUNTIME_BASE}" 2>/dev/null | grep + | tr "\\n" " ")" >&2; exit 90')
    return f"sh -c '{script}'"


def upload_command(version: str | None = None) -> str:
    version = _checked(version or runtime_version())
    return (f"sh -c 'd=\"{RUNTIME_BASE}/{version}/dist\"; rm -rf \"$d\" && mkdir -p \"$d\" "
            "&& tar -xf - -C \"$d\"'")


#: Minimum Python for the runtime (the package uses 3.11 features such as StrEnum and tomllib).
PYTHON_CANDIDATES = ("python3.13", "python3.12", "python3.11", "python3")


def _requirements_met_check() -> str:
    """Python (for ``-c "…"``) that exits 0 when every requirement of the runtime is installed in a satisfying
    version, judged with the packaging library that pip itself carries; anything else (a missing package, no
    pip, an error) exits non-zero and pip resolves as usual. The requirements travel as base64 JSON, so no
    character of theirs reaches the shell."""
    blob = base64.b64encode(json.dumps(box_requirements()).encode()).decode()
    return ("import base64, json, sys; from importlib.metadata import version; "
            "from pip._vendor.packaging.requirements import Requirement; "
            f"reqs = [Requirement(r) for r in json.loads(base64.b64decode('{blob}'))]; "
            "sys.exit(0 if all(r.specifier.contains(version(r.name), prereleases=True) for r in reqs "
            "if not r.marker or r.marker.evaluate()) else 1)")


def install_script(version: str | None = None, offline: bool = False) -> str:
    """Shell script (run with ``sh -s``) that builds the venv and installs the uploaded wheel; idempotent.

    Progress lines start with ``rgt-step:``; failures end with a ``rgt-fail: <kind>`` line on stderr.
    """
    version = _checked(version or runtime_version())
    wheel = _checked(wheel_name(version))
    index = '--no-index --find-links "$d/dist"' if offline else ""
    candidates = " ".join(PYTHON_CANDIDATES)
    return f"""set -u
d="{RUNTIME_BASE}/{version}"
fail() {{ echo "rgt-fail: $1" >&2; exit 92; }}
if [ -f "$d/ready" ]; then echo "rgt-step: already installed"; exit 0; fi
py=""
for c in {candidates}; do
  p=$(command -v "$c" 2>/dev/null) || continue
  if "$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then py="$p"; break; fi
done
if [ -z "$py" ]; then
  echo "rgt-fail: no_python $(python3 --version 2>&1 | head -c 80)" >&2; exit 91
fi
echo "rgt-step: python $py"
rm -rf "$d/venv"
# A box whose python has its own pip (seen through --system-site-packages) needs no pip copied into the venv:
# ensurepip costs seconds of CPU per box, which a fleet install pays on every box at once.
if "$py" -m venv --without-pip --system-site-packages "$d/venv" 2>"$d/venv.err" \
    && "$d/venv/bin/python" -c "import pip" >/dev/null 2>&1; then
  echo "rgt-step: venv ready (using the box's pip)"
else
  rm -rf "$d/venv"
  if ! "$py" -m venv --system-site-packages "$d/venv" 2>>"$d/venv.err"; then
    rm -rf "$d/venv"
    "$py" -m venv --without-pip --system-site-packages "$d/venv" 2>>"$d/venv.err" \
      || {{ cat "$d/venv.err" >&2; fail venv; }}
  fi
  echo "rgt-step: venv ready"
fi
# pip's resolver costs about 2 CPU-seconds per box even when every dependency is already there (a fleet pays
# it on every box at once): when they all are, install only the wheel. --no-compile: the first import on the
# box compiles what it uses; compiling every module here is CPU per box as well.
deps=""
if "$d/venv/bin/python" -c "{_requirements_met_check()}" 2>/dev/null; then
  deps="--no-deps"; echo "rgt-step: dependencies already present"
fi
"$d/venv/bin/python" -m pip install --disable-pip-version-check --no-input --no-compile -q $deps {index} \
  "$d/dist/{wheel}" >"$d/pip.log" 2>&1 || {{ tail -n 20 "$d/pip.log" >&2; fail pip; }}
echo "rgt-step: package installed"
"$d/venv/bin/python" -c "import remote_gpu_trainer.remote.serve" 2>"$d/import.err" \
  || {{ cat "$d/import.err" >&2; fail import; }}
touch "$d/ready"
echo "rgt-step: ready"
"""


def status_script(version: str | None = None) -> str:
    """Lists the runtimes on the box (one ``rgt-version: <v> ready|partial`` line each) and its python."""
    version = _checked(version or runtime_version())
    return f"""b="{RUNTIME_BASE}"
for d in "$b"/*+*; do
  [ -d "$d" ] || continue
  if [ -f "$d/ready" ]; then s=ready; else s=partial; fi
  echo "rgt-version: ${{d##*/}} $s"
done
if [ -x "$b/{version}/venv/bin/python" ]; then
  echo "rgt-python: $("$b/{version}/venv/bin/python" -c 'import sys; print(sys.version.split()[0])')"
fi
df -Pk "$HOME" 2>/dev/null | tail -n 1 | awk '{{print "rgt-free-kib: " $4}}'
"""


def remove_script() -> str:
    """Removes every runtime version (directories named ``<version>+<hash>``), never runs/ or guard/ data."""
    return f"""b="{RUNTIME_BASE}"
for d in "$b"/*+*; do
  [ -d "$d" ] || continue
  rm -rf "$d" && echo "rgt-removed: ${{d##*/}}"
done
"""
