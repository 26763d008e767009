"""Which python the training job runs with: given, or found in one documented order, and what its torch is.

The order (:func:`find_training_env`), first match wins:

1. ``python=``: that interpreter (a path on the machine; ``~`` is the box user's home).
2. ``activate=``: ``source FILE`` / ``. FILE`` (FILE is sourced by a fixed script of ours, as ``$1``),
   ``conda activate NAME`` (NAME checked against a pattern, looked up in the conda installs below; conda's
   ``activate.d`` hooks are not run), or a venv / conda prefix directory.
3. The launch script, when one is given: its first ``source …/activate`` or ``conda activate``, else its
   first interpreter called by path (``/…/bin/python``, ``/…/bin/torchrun``).
4. Locally (``rgt`` on your own machine, not a box runtime): the python ``rgt`` runs in, when it has torch.
5. The python on a login shell's PATH (``bash -l -i``, what a terminal on the box gets; a Debian ``.bashrc``
   returns early for ``ssh box cmd``, so a venv it activates is only seen this way), when it has torch.
6. The first with torch of: ``~/venvs/*``, ``~/.venv``, ``~/venv``, ``~/.venvs/*``, ``/workspace/venv``,
   ``/workspace/.venv``; conda envs (``envs/*``) of ``~/miniconda3``, ``~/miniforge3``, ``~/mambaforge``,
   ``~/anaconda3``, ``~/micromamba``, ``/opt/conda``, then those installs' base pythons; the system
   ``/usr/local/bin/python3`` and ``/usr/bin/python3`` (torch in the image's python, or ``pip install --user``
   into ``~/.local``, which a system python sees).
7. The skill runtime's own python (on a box: its venv sees the system's site-packages).

Steps 5-7 check a candidate with the probe's ``find`` mode (no import, tens of milliseconds each). The result
names the interpreter, how it was found and every candidate looked at, so an agent can say "I checked
~/venvs/pt/bin/python (found on the login shell's PATH)" and pass ``python=`` when that is not the job's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from ..hostinfo import is_box_runtime
from ..models import StrictModel
from .login import ShellRead, changed, read_login_env, read_sourced_env
from .probe import Reading, run_probe
from .script import LaunchScript, expand_home, read_launch_script

Source = Literal["python", "activate", "launch_script", "command", "rgt", "login_shell", "common_location", "runtime",
                 "none"]
CONDA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
ACTIVATE_FORMS = ["source ~/venvs/pt/bin/activate", ". /opt/venv/bin/activate", "conda activate myenv",
                  "~/venvs/pt (a venv or conda prefix)"]
#: What an activation changes that a child needs to run in that environment.
ACTIVATION_VARS = ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONPATH", "PYTHONHOME",
                   "LD_LIBRARY_PATH")
CONDA_INSTALLS = ("~/miniconda3", "~/miniforge3", "~/mambaforge", "~/anaconda3", "~/micromamba", "/opt/conda")


def _home_relative(path: str) -> str:
    """A path argument must say where it is: absolute, or from the home directory."""
    if "\0" in path or "\n" in path:
        raise ValueError("holds a NUL byte or a newline")
    if not (path.startswith(("/", "~")) or path == "$HOME" or path.startswith(("$HOME/", "${HOME}"))):
        raise ValueError(f"{path!r} is relative: give an absolute path or one from ~ (the box user's home)")
    rest = path.removeprefix("${HOME}").removeprefix("$HOME")
    if "$" in rest or "`" in rest:
        raise ValueError("only ~ and $HOME are expanded: write the path out")
    return path


@dataclass(frozen=True)
class Activation:
    kind: Literal["source", "conda", "prefix"]
    value: str
    text: str


def parse_activation(text: str) -> Activation:
    """``source FILE`` / ``. FILE`` / ``conda activate NAME`` / a prefix directory; ValueError otherwise."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise ValueError(f"cannot be split like a command line: {err}") from None
    allowed = f"(allowed: {'; '.join(ACTIVATE_FORMS)})"
    if words[:1] in (["source"], ["."]) and words[1:2] == ["activate"] and len(words) <= 3:  # old conda
        return _conda(words[2] if len(words) == 3 else "base", text)
    if words[:1] in (["source"], ["."]) and len(words) == 2:
        return Activation("source", _home_relative(words[1]), text)
    if words[:1] in (["conda"], ["mamba"], ["micromamba"]) and words[1:2] == ["activate"] and len(words) <= 3:
        return _conda(words[2] if len(words) == 3 else "base", text)
    if len(words) == 1:
        path = _home_relative(words[0])
        return Activation("source" if path.endswith("/activate") else "prefix", path, text)
    raise ValueError(f"{text[:120]!r} is not an activation this tool can follow {allowed}")


def _conda(name: str, text: str) -> Activation:
    if name.startswith(("/", "~", "$")):
        return Activation("prefix", _home_relative(name), text)
    if not CONDA_NAME.match(name):
        raise ValueError(f"conda env name {name!r} must match {CONDA_NAME.pattern}")
    return Activation("conda", name, text)


def _checked_path(value: str | None) -> str | None:
    return None if value is None else _home_relative(value)


def _checked_activate(value: str | None) -> str | None:
    if value is not None:
        parse_activation(value)
    return value


PythonPath = Annotated[str | None, AfterValidator(_checked_path)]
ActivateText = Annotated[str | None, AfterValidator(_checked_activate)]
LaunchPath = Annotated[str | None, AfterValidator(_checked_path)]
"""A launch script's path: the same rules as python= (absolute or from ~, no NUL), so a bad one is an input
error naming ``launch`` instead of a traceback on every host when the file is opened."""


def python_field() -> object:
    return Field(None, min_length=1, max_length=4096, description=(
        "The training job's interpreter on the machine the tool runs on (absolute or ~ path), e.g. "
        "~/venvs/pt/bin/python. Default: found (launch script, login shell's PATH, ~/venvs/*, conda envs, the "
        "system python; the result says which one and how)"))


def launch_field(description: str) -> object:
    return Field(None, min_length=1, max_length=4096, description=f"{description} (absolute or ~ path)")


def activate_field() -> object:
    return Field(None, min_length=1, max_length=4096, description=(
        "How the job activates its environment, instead of python: 'source ~/venvs/pt/bin/activate' (the file is "
        "sourced by a fixed script, never run as given), 'conda activate NAME', or a venv/conda prefix directory"))


class Candidate(StrictModel):
    python: str
    where: str = Field(description="Why it was a candidate: the login shell's PATH, ~/venvs/pt, conda env x, …")
    torch: str | None = Field(description="torch's version there (from its metadata; 'found' without metadata), "
                              "None: no torch")
    error: str | None = None


class TrainingEnv(StrictModel):
    """The interpreter a training-stack tool checked, how it was found, and what its torch stack is."""

    python: str | None = Field(description="The interpreter checked, as found (a venv's bin/python, not its target)")
    display: str | None = Field(None, description="python with the home directory written as ~ (comparable across "
                                "nodes whose homes differ)")
    source: Source = Field(description="How it was chosen: python, activate, launch_script, command (run_start's "
                           "command names it by path), rgt (the python rgt runs in, locally), login_shell, "
                           "common_location, runtime, none (nothing with torch)")
    found_by: str = Field(description="The same in words, with the line or location")
    python_version: str | None = None
    prefix: str | None = Field(None, description="sys.prefix of that interpreter (the venv or conda env)")
    torch: str | None = Field(None, description="torch.__version__ (imported) or its metadata version (found only)")
    torch_location: str | None = None
    torch_imported: bool = Field(False, description="True when torch was imported (versions below are read, not "
                                 "guessed); False: only found")
    torch_cuda: str | None = Field(None, description="torch.version.cuda (None: a CPU build, or not imported)")
    nccl: str | None = Field(None, description="NCCL version torch was built with (torch.cuda.nccl.version())")
    distributed: bool | None = Field(None, description="torch.distributed imports and is available")
    gloo: bool | None = None
    nccl_backend: bool | None = None
    cuda_available: bool | None = None
    cuda_devices: int | None = None
    gpu_names: list[str] = Field(default_factory=list)
    errors: dict[str, str] = Field(default_factory=dict, description="Step → what failed: python, find, torch, "
                                   "distributed, cuda, nccl, probe (timeout or crash), activate")
    activation: dict[str, str] = Field(default_factory=dict, description="Variables a child gets to run in this "
                                       "environment (PATH first, VIRTUAL_ENV or CONDA_PREFIX)")
    candidates: list[Candidate] = Field(default_factory=list, description="Every interpreter looked at, in order")
    notes: list[str] = Field(default_factory=list)

    @property
    def has_torch(self) -> bool:
        return self.torch is not None and "torch" not in self.errors

    def environ(self) -> dict[str, str]:
        """Our environment with the activation applied: what a child in this training environment gets."""
        return {**os.environ, **self.activation}

    def brief(self) -> str:
        """One line: ``~/venvs/pt/bin/python (login shell …): torch 2.13.0+cpu``."""
        what = f"torch {self.torch}" if self.torch else "no torch"
        return f"{tilde(self.python) if self.python else 'no python'} ({self.found_by}): {what}"


def tilde(path: str | Path | None) -> str:
    """``/home/u/venvs/pt`` → ``~/venvs/pt``, as a person writes it."""
    text = str(path)
    home = os.path.expanduser("~")
    return "~" + text[len(home):] if home not in ("", "/") and (text == home or text.startswith(home + "/")) else text


@dataclass
class _Choice:
    python: str | None
    source: Source
    found_by: str
    activation: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def prefix_activation(prefix: Path) -> dict[str, str]:
    """PATH and VIRTUAL_ENV / CONDA_PREFIX for a venv or conda prefix, as its activate script would set."""
    env = {"PATH": os.pathsep.join(p for p in (str(prefix / "bin"), os.environ.get("PATH", "")) if p)}
    if (prefix / "conda-meta").is_dir():
        env["CONDA_PREFIX"] = str(prefix)
    elif (prefix / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(prefix)
    return env


def _bin_python(bin_dir: Path) -> Path:
    for name in ("python", "python3"):
        if (bin_dir / name).exists():
            return bin_dir / name
    return bin_dir / "python"


def _interpreter_choice(path: str, source: Source, found_by: str) -> _Choice:
    """An interpreter given by path: its venv/conda prefix's activation when it lives in one."""
    python = Path(expand_home(path))
    if python.name in ("torchrun", "accelerate", "deepspeed"):
        python = _bin_python(python.parent)
    prefix = python.parent.parent
    activation = prefix_activation(prefix) if python.parent.name == "bin" and (
        (prefix / "pyvenv.cfg").is_file() or (prefix / "conda-meta").is_dir()) else {}
    error = None if os.access(python, os.X_OK) and python.is_file() else f"{tilde(python)} does not exist here"
    return _Choice(str(python), source, found_by, activation, error)


def conda_prefixes() -> list[Path]:
    """Conda installs on this machine: $CONDA_EXE's, then the usual places."""
    found = []
    exe = os.environ.get("CONDA_EXE")
    if exe:
        found.append(Path(exe).parent.parent)
    found += [Path(expand_home(p)) for p in CONDA_INSTALLS]
    return [p for p in dict.fromkeys(found) if p.is_dir()]


def _activation_choice(activation: Activation, source: Source, found_by: str) -> _Choice:
    if activation.kind == "conda":
        for base in conda_prefixes():
            prefix = base if activation.value == "base" else base / "envs" / activation.value
            if prefix.is_dir():
                env = {**prefix_activation(prefix), "CONDA_PREFIX": str(prefix), "CONDA_DEFAULT_ENV": activation.value}
                return _Choice(str(_bin_python(prefix / "bin")), source,
                               f"{found_by}: conda env {tilde(prefix)} (its activate.d hooks were not run)", env)
        return _Choice(None, source, found_by, error=f"no conda env {activation.value!r} in "
                       f"{', '.join(CONDA_INSTALLS)} or $CONDA_EXE's install")
    path = Path(expand_home(activation.value))
    if activation.kind == "prefix":
        if not path.is_dir():
            return _Choice(None, source, found_by, error=f"{tilde(path)} is not a directory here")
        return _Choice(str(_bin_python(path / "bin")), source, found_by, prefix_activation(path))
    if not path.is_file():
        return _Choice(None, source, found_by, error=f"{tilde(path)} does not exist here")
    read = read_sourced_env(str(path))
    if read.env is None:
        return _Choice(None, source, found_by, error=read.error)
    after = read.env
    python = shutil.which("python", path=after.get("PATH")) or shutil.which("python3", path=after.get("PATH"))
    if python is None:
        return _Choice(None, source, found_by, error=f"no python on PATH after sourcing {tilde(path)}")
    return _Choice(python, source, found_by, changed(dict(os.environ), after))


def _from_script(launch: str, login_env: dict[str, str] | None, notes: list[str]) -> _Choice | None:
    script: LaunchScript = read_launch_script(launch, login_env)
    if script.error and script.sha256 is None:
        notes.append(f"launch script: {script.error}")
        return None
    where = f"launch script {tilde(script.path)}"
    if script.activation is not None:
        try:
            activation = parse_activation(script.activation.text)
        except ValueError as err:
            notes.append(f"{where} line {script.activation.line}: {err}")
        else:
            return _activation_choice(activation, "launch_script",
                                      f"{where} line {script.activation.line}: {script.activation.text}")
    if script.interpreter is not None:
        return _interpreter_choice(script.interpreter.text, "launch_script",
                                   f"{where} line {script.interpreter.line} calls it by path")
    notes.append(f"{where} activates nothing and calls no interpreter by path: it uses the python on its PATH")
    return None


def _search_list(login: ShellRead | None, local: bool) -> list[tuple[str, Source, str, dict[str, str]]]:
    """(python, source, where, activation) to try in order (steps 4-7 of the module docstring)."""
    found: list[tuple[str, Source, str, dict[str, str]]] = []
    if local:
        found.append((sys.executable, "rgt", "the python rgt runs in", {}))
    if login is not None and login.env is not None:
        path = login.env.get("PATH", "")
        for name in ("python", "python3"):
            python = shutil.which(name, path=path)
            if python:
                activation = {k: login.env[k] for k in ACTIVATION_VARS if k in login.env}
                found.append((python, "login_shell", f"`{name}` on the login shell's PATH ({login.how})", activation))
                break
    home = Path(os.path.expanduser("~"))
    venvs = [*sorted(home.glob("venvs/*")), home / ".venv", home / "venv", *sorted(home.glob(".venvs/*")),
             Path("/workspace/venv"), Path("/workspace/.venv")]
    for prefix in venvs:
        found.append((str(_bin_python(prefix / "bin")), "common_location", f"venv {tilde(prefix)}",
                      prefix_activation(prefix)))
    installs = conda_prefixes()
    for base in installs:
        for prefix in sorted((base / "envs").glob("*")):
            found.append((str(_bin_python(prefix / "bin")), "common_location", f"conda env {tilde(prefix)}",
                          {**prefix_activation(prefix), "CONDA_DEFAULT_ENV": prefix.name}))
    for base in installs:
        found.append((str(_bin_python(base / "bin")), "common_location", f"conda base {tilde(base)}",
                      {**prefix_activation(base), "CONDA_DEFAULT_ENV": "base"}))
    for system in ("/usr/local/bin/python3", "/usr/bin/python3"):
        found.append((system, "common_location", "the system python (it also sees pip --user packages in "
                      "~/.local)", {}))
    found.append((sys.executable, "runtime", "the skill runtime's own python", {}))
    seen: set[str] = set()
    usable = []
    for python, source, where, activation in found:
        if python in seen or not (os.path.isfile(python) and os.access(python, os.X_OK)):
            continue
        seen.add(python)
        usable.append((python, source, where, activation))
    return usable


def _torch_of(reading: Reading) -> str | None:
    if not reading.value("find", "found"):
        return None
    return reading.value("find", "version") or "found"


def find_training_env(python: str | None = None, activate: str | None = None, launch: str | None = None, *,
                      mode: Literal["find", "import", "names"] = "find", timeout_s: float = 60.0,
                      login: ShellRead | None = None, local: bool | None = None) -> TrainingEnv:
    """The training environment (module docstring for the order), probed in ``mode``.

    ``login``: a login-shell reading the caller already has (else it is read when the search needs it);
    ``local``: whether the python rgt runs in comes first (default: yes unless this is a box runtime).
    """
    local = (not is_box_runtime()) if local is None else local
    notes: list[str] = []
    candidates: list[Candidate] = []
    choice: _Choice | None = None
    reading: Reading | None = None
    if python:
        choice = _interpreter_choice(python, "python", "python= as given")
    elif activate:
        choice = _activation_choice(parse_activation(activate), "activate", f"activate={activate!r}")
    elif launch:
        if login is None:
            login = read_login_env()
        choice = _from_script(launch, login.env, notes)
    if choice is None:
        if login is None and not (local and _has_torch_here()):
            login = read_login_env()
        if login is not None and login.error:
            notes.append(f"login shell not read ({login.how}): {login.error}")
        for candidate, source, where, activation in _search_list(login, local):
            reading = run_probe(candidate, {**os.environ, **activation}, "find", min(timeout_s, 30.0))
            torch = _torch_of(reading)
            candidates.append(Candidate(python=candidate, where=where, torch=torch,
                                        error=next(iter(reading.errors().values()), None)))
            if torch:
                choice = _Choice(candidate, source, where, activation)
                break
            reading = None
    if choice is None:
        return TrainingEnv(python=None, source="none", found_by="no interpreter with torch was found",
                           candidates=candidates, notes=notes)
    env = TrainingEnv(python=choice.python, display=tilde(choice.python) if choice.python else None,
                      source=choice.source, found_by=choice.found_by,
                      activation=choice.activation, candidates=candidates, notes=notes)
    if choice.error or choice.python is None:
        env.errors["python" if choice.source == "python" else "activate"] = choice.error or "no python"
        return env
    if reading is None or mode != "find":  # the search's own reading is a find-mode one
        reading = run_probe(choice.python, env.environ(), mode, timeout_s)
    apply_reading(env, reading)
    return env


def _has_torch_here() -> bool:
    """Whether the python rgt runs in can import torch, without importing it (a local call's fast path)."""
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def apply_reading(env: TrainingEnv, reading: Reading) -> None:
    """Copy a probe's reading into ``env``; a missing step leaves its fields None."""
    env.python_version = reading.value("python", "version")
    env.prefix = reading.value("python", "prefix")
    if reading.value("find", "found"):
        env.torch = reading.value("find", "version") or "found"
        env.torch_location = reading.value("find", "location")
    elif "find" in reading.steps and "error" not in reading.steps["find"]:
        env.errors["find"] = f"torch is not installed for {tilde(env.python)}"
    if "torch" in reading.steps and "error" not in reading.steps["torch"]:
        env.torch_imported = True
        env.torch = reading.value("torch", "version") or env.torch
        env.torch_location = reading.value("torch", "location") or env.torch_location
        env.torch_cuda = reading.value("torch", "cuda")
    if "distributed" in reading.steps and "error" not in reading.steps["distributed"]:
        env.distributed = reading.value("distributed", "available")
        env.gloo = reading.value("distributed", "gloo")
        env.nccl_backend = reading.value("distributed", "nccl")
    elif "distributed" in reading.steps:
        env.distributed = False
    if "cuda" in reading.steps and "error" not in reading.steps["cuda"]:
        env.cuda_available = reading.value("cuda", "available")
        env.cuda_devices = reading.value("cuda", "devices")
        env.gpu_names = reading.value("cuda", "names") or []
    env.nccl = reading.value("nccl", "version")
    env.errors.update(reading.errors())
