"""Fact check of the catalog against the packages people install (``run_evals.py facts``).

Each catalog entry quotes error texts (its **Signature:** regexes) and tells the user to run
commands (in **Fix:** and **Verify:**). Both go stale when a package renames a command or rewords a
message, and the reader only finds out at 3 a.m. This module checks them against the real source:

* **strings** — every signature's fixed text (the catalog's own ``Signature.needles``) is looked up
  in the ``.py`` files of torch, transformers, accelerate, huggingface_hub, deepspeed, peft, trl and
  the standard library, and in the printable strings of torch's shared libraries (its C++ messages).
  A hit is PASS with (package, version, file). A miss is SKIP when the text belongs to something not
  here (a package not installed, torch's CUDA build, NCCL, a driver, ssh, a scheduler: "external",
  with the entry's cited source), PASS ("old-version") when the entry names the versions that print
  it, and FAIL otherwise.
* **commands** — ``hf``, ``huggingface-cli``, ``torchrun``, ``python -m torch.distributed.run``,
  ``accelerate`` and ``deepspeed`` invocations in code spans and blocks of Fix/Verify: the console
  script must be one the package ships (its ``entry_points``) and every ``--flag`` must be in its
  ``--help`` (or, for a downloaded wheel that cannot be run, in its source), unless the entry names
  the older version the command needs.
* **version claims** — "since/added in/removed in/as of <package> X": X must not be newer than the
  newest release available here.
* **records** — an entry with a string or command checked against a package must say which
  versions in a ``**Verified with:**`` line (``--record`` writes those lines).

Nothing that is not installed (or downloaded with ``--download``) is ever PASS. Look-ups are cached
per package version under ``~/.cache/remote-gpu-trainer/facts`` so a warm run takes seconds.
"""

from __future__ import annotations

import bisect
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The packages whose messages and commands the catalog quotes, by distribution name.
PACKAGES = ("torch", "transformers", "accelerate", "huggingface_hub", "deepspeed", "peft", "trl")
#: Import names where they differ from the distribution name.
MODULES = {"huggingface_hub": ("huggingface_hub",)}
CACHE_DIR = Path(os.environ.get("RGT_FACTS_CACHE", Path.home() / ".cache" / "remote-gpu-trainer" / "facts"))
_CACHE_VERSION = 5

# Words in an entry that say which package prints its messages (when none is here, a miss is SKIP).
OWNER_HINTS = {
    "transformers": re.compile(r"\btransformers\b|from_pretrained|TrainingArguments|\bTrainer\b|tokeni[sz]er|"
                               r"Token indices|grad_norm|"
                               r"pad_token|\bbert\b|\bllama\b|\bgpt2?\b", re.I),
    "accelerate": re.compile(r"\baccelerate\b|\bAccelerator\b", re.I),
    "huggingface_hub": re.compile(r"huggingface_hub|\bhf download\b|HF_HUB|HF_ENDPOINT"),
    "deepspeed": re.compile(r"deepspeed|\bZeRO\b", re.I),
    "peft": re.compile(r"\bpeft\b|\bLoRA\b|LoraConfig", re.I),
    "trl": re.compile(r"\btrl\b|SFTTrainer|DPOTrainer|GRPO|\bPPO\b|KL divergence|reward model|RLHF"),
}
# Texts printed by something no package here contains: checked only by the entry's cited source.
EXTERNAL = (
    ("NCCL", re.compile(r"nccl|watchdog|ProcessGroup(?:NCCL|Gloo)?\b", re.I)),
    ("torch's CUDA build (not in a CPU wheel)", re.compile(
        r"cuda|cudnn|cublas|cufft|curand|cusolver|cusparse|nvrtc|device-side|\bGPU\b|nvlink|\bhip\b|rocm|"
        r"triton|inductor|flash.?attn|bitsandbytes|apex|xformers|\bsm_?\d", re.I)),
    ("NVIDIA driver / Linux kernel", re.compile(
        r"\bxid\b|nvrm|nvidia|nvml|driver|dmesg|kernel|oom-kill|killed process|segfault|out of memory: kill", re.I)),
    ("ssh / network", re.compile(
        r"\bssh|rsync|\bscp\b|sftp|broken pipe|connection (?:reset|refused|closed|timed out)|host key|publickey|"
        r"getaddrinfo|name or service|network|socket|\bport\b|proxy|ssl|certificate|dns|http|mirror", re.I)),
    ("scheduler / provider / container", re.compile(
        r"slurm|\bsrun\b|sbatch|docker|container|kubernetes|runpod|vast|lambda|autodl|paperspace|spot|preempt|"
        r"quota|billing|jupyter|cancelled|instance", re.I)),
    ("shell / OS / other tools", re.compile(
        r"bash|tmux|nohup|\bapt\b|\bpip\b|conda|\bgit\b|no space left|disk|errno|wandb|tensorboard|nvcc|gcc|"
        r"ninja|undefined symbol|glibc|\bld\b|killed|signal|core dumped|permission denied|read-only|/dev/shm|"
        r"mount|ulimit|systemd|cron|python|numpy|pandas|pil\b|datasets|tokenizers|safetensors|onnx|vllm|"
        r"lightning|timm|wandb|mlflow|opencv|cv2", re.I)),
)
_REPR = re.compile(r"^\W?'\w+': ")
_PKG_WORDS = r"(?:py)?torch|transformers|accelerate|huggingface[_-]hub|deepspeed|peft|trl"
_VERSION_NAMED = re.compile(
    rf"(?:before|older than|prior to|until|up to|[<≤])\s*(?:{_PKG_WORDS})\s*v?\d+(?:\.\d+)*|"
    rf"\b(?:{_PKG_WORDS})\s*(?:<=?|≤|before)\s*v?\d+(?:\.\d+)*|"
    rf"\b(?:{_PKG_WORDS})\s+v?\d+\.x\b|"
    rf"\b(?:{_PKG_WORDS})\s+v?\d+(?:\.\d+)*\s*(?:and|or) (?:older|earlier)", re.I)
_RELEASE = re.compile(rf"\b({_PKG_WORDS})\s+v?(\d+\.\d+(?:\.\d+)?)\b", re.I)
_CLAIM = re.compile(
    rf"\b(?P<how>since|added in|introduced in|removed in|deprecated in|as of|starting (?:with|in|from)|from)\s+"
    rf"(?P<pkg>{_PKG_WORDS})\s+v?(?P<ver>\d+(?:\.\d+)+)", re.I)
_COMMAND = re.compile(
    r"(?:^|(?<=[\s;&|(`$]))(?P<cmd>hf|huggingface-cli|torchrun|accelerate|deepspeed|"
    r"python3? -m torch\.distributed\.(?:run|launch))(?=\s|$)(?P<rest>[^;&|\n`]*)")
_COMMAND_PACKAGE = {"hf": "huggingface_hub", "huggingface-cli": "huggingface_hub", "torchrun": "torch",
                    "accelerate": "accelerate", "deepspeed": "deepspeed"}
_SUBCOMMANDS = {"hf", "huggingface-cli", "accelerate"}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# Source normalisation: join implicit and ``+`` string concatenation so a message split over
# lines in the source is found whole ("Too many open files. Communication with the" " workers…").
_CONCAT = re.compile(r"""(?<!\\)(["'])\s*(?:\+\s*)?(?:\\\s*)?\n?\s*(?:\+\s*)?[rRbBfFuU]{0,2}\1""")
_PRINTABLE = re.compile(rb"[\x20-\x7e]{6,}")


# --------------------------------------------------------------------------------------------
# Packages and their text


@dataclass
class Package:
    """One package as the check sees it: where its files are, which version, which console scripts."""

    name: str
    version: str
    origin: str
    """'installed', 'downloaded' or 'stdlib'."""
    roots: list[Path]
    """Directories whose .py (and, for torch, lib/*.so) files are its text."""
    scripts: dict[str, str] = field(default_factory=dict)
    """Console script name → entry point (``module:function``)."""
    runnable: bool = False
    """Its console scripts can be run here (installed next to this interpreter)."""

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


def installed_packages() -> dict[str, Package]:
    """The target packages installed for this interpreter, plus the standard library as ``python``."""
    from importlib import metadata

    found: dict[str, Package] = {}
    for name in PACKAGES:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        modules = MODULES.get(name) or tuple((dist.read_text("top_level.txt") or name).split()) or (name,)
        roots = [Path(str(dist.locate_file(m))) for m in modules]
        roots = [r for r in roots if r.is_dir()] or [Path(str(dist.locate_file(name)))]
        scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
        found[name] = Package(name, dist.version, "installed", roots, scripts, runnable=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found["python"] = Package("python", platform.python_version(), "stdlib", [stdlib])
    return found


def project_package(root: Path) -> Package:
    """This skill's own code (the rgt package, scripts/): the remote layer's and the scripts'
    messages are quoted by entries too. Its version is the checkout's pyproject version."""
    match = re.search(r'(?m)^version\s*=\s*"([^"]+)"', _read(root / "pyproject.toml"))
    roots = [d for d in (root / "tools" / "remote_gpu_trainer", root / "scripts") if d.is_dir()]
    return Package("remote_gpu_trainer", match.group(1) if match else "0", "project", roots)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def downloaded_packages(fetch: bool, names: Iterable[str]) -> dict[str, Package]:
    """Current releases of ``names`` from PyPI (``pip download --no-deps``), unpacked in the cache.
    With ``fetch`` False only what an earlier ``--download`` left in the cache is used."""
    wheels = CACHE_DIR / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    names = list(names)
    if fetch and names:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "-d", str(wheels), *names]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode:
            print(f"note: pip download failed ({done.stderr.strip()[-300:]})")
    found: dict[str, Package] = {}
    for name in names:
        archives = sorted(wheels.glob(f"{name}-*"), key=lambda p: _version_key(_archive_version(p)))
        if archives:
            found[name] = _unpack(name, archives[-1])
    return found


def _archive_version(path: Path) -> str:
    stem = path.name.removesuffix(".tar.gz").removesuffix(".whl").removesuffix(".zip")
    return stem.split("-")[1] if "-" in stem else "0"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:4])


def _unpack(name: str, archive: Path) -> Package:
    version = _archive_version(archive)
    target = CACHE_DIR / "unpacked" / f"{name}-{version}"
    if not (target / ".done").exists():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(target)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(target, filter="data")
        (target / ".done").write_text("")
    module = MODULES.get(name, (name,))[0]
    roots = [p for p in target.glob(f"**/{module}") if p.is_dir() and (p / "__init__.py").exists()][:1] or [target]
    scripts: dict[str, str] = {}
    for ep_file in target.glob("*.dist-info/entry_points.txt"):
        section = ""
        for line in ep_file.read_text().splitlines():
            if line.startswith("["):
                section = line.strip("[] ")
            elif section == "console_scripts" and "=" in line:
                key, value = line.split("=", 1)
                scripts[key.strip()] = value.strip()
    for script in target.glob("*/bin/*"):  # an sdist's scripts= (deepspeed ships bin/deepspeed)
        scripts.setdefault(script.name, str(script.relative_to(target)))
    return Package(name, version, "downloaded", roots, scripts)


class Corpus:
    """A package's text, casefolded, in one string, so each look-up is one ``str.find``."""

    def __init__(self, package: Package):
        self.package = package
        parts: list[str] = []
        self.starts: list[int] = []
        self.files: list[str] = []
        offset = 0
        for root in package.roots:
            for path in sorted(_text_files(package, root)):
                if _NOT_A_PRINTER.search(path.relative_to(root).as_posix()):
                    continue
                text = _file_text(path)
                if not text:
                    continue
                self.starts.append(offset)
                self.files.append(_display(path, root))
                parts.append(text)
                offset += len(text) + 1
        self.text = "\x00".join(parts)

    def file_at(self, offset: int) -> tuple[str, int, int]:
        i = bisect.bisect_right(self.starts, offset) - 1
        end = self.starts[i + 1] - 1 if i + 1 < len(self.starts) else len(self.text)
        return self.files[i], self.starts[i], end

    def locate(self, needles: list[str], fuzzy: int = 0) -> tuple[str, str] | None:
        """(file, text found) for the first file that holds the needles.

        ``fuzzy`` 0: every needle whole. 1: the pieces between the parts a program fills in (numbers,
        quoted names, paths, ``<…>``) all in one file, covering half the text, one of them at least
        10 characters ("Received " … " death signal"). 2: the longest start or end of the longest
        needle cut between words, at least 16 characters and 55 % of it (C++ messages are joined
        from pieces: "PytorchStreamReader failed " + "reading zip archive")."""
        if not needles:
            return None
        if fuzzy == 0:
            name = self._first_file_with(needles)
            return (name, needles[0]) if name else None
        if fuzzy == 1:
            pieces = sorted({p for n in needles for p in _DYNAMIC.split(n) if len(p.strip()) >= 4}, key=len,
                            reverse=True)
            covered = sum(len(p) for p in pieces)
            if not pieces or len(pieces[0]) < 10 or covered * 2 < sum(len(n) for n in needles) \
                    or pieces == needles:
                return None
            name = self._first_file_with(pieces)
            return (name, " … ".join(pieces)) if name else None
        for piece in _fragments(needles[0])[:8]:
            name = self._first_file_with([piece])
            if name:
                return name, piece
        return None

    def _first_file_with(self, needles: list[str]) -> str | None:
        first, rest = needles[0], needles[1:]
        pos, seen = self.text.find(first), 0
        while pos >= 0 and seen < 200:
            name, start, end = self.file_at(pos)
            body = self.text[start:end]
            if all(n in body for n in rest):
                return name
            pos, seen = self.text.find(first, end), seen + 1
        return None


#: The parts of a message a program fills in: numbers, quoted names, paths, <placeholders>.
_DYNAMIC = re.compile(r"\d+(?:\.\d+)*|'[^']*'|\"[^\"]*\"|<[^>]*>|\S*/\S*|[(\[=]")


def _fragments(needle: str) -> list[str]:
    """Starts and ends of ``needle`` cut at spaces, longest first, none shorter than 55 % of it or
    16 characters."""
    least = max(16, len(needle) * 55 // 100)
    cuts = [i for i, ch in enumerate(needle) if ch == " "]
    pieces = {needle[:i + 1] for i in cuts} | {needle[i:] for i in cuts}
    return sorted((p for p in pieces if len(p.strip()) >= least and p != needle), key=len, reverse=True)


#: Files whose text is not what a user sees printed: tests, fakes, and the diagnoser's own copies
#: of the catalog's signatures.
_NOT_A_PRINTER = re.compile(r"(?:^|/)(?:tests?|testing|_testing)/|(?:^|/)test_[^/]*$|_test\.py$|fakes?\.py$|"
                            r"(?:^|/)diagnose\.py$|\.sh$")


def _text_files(package: Package, root: Path) -> Iterable[Path]:
    if package.origin == "stdlib":
        skip = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages",
                "pydoc_data", "unittest", "distutils"}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in skip and not d.startswith("__")]
            yield from (Path(dirpath) / f for f in filenames if f.endswith(".py"))
        return
    if package.origin == "project":
        yield from (p for p in root.rglob("*") if p.suffix in (".py", ".sh", ".j2") and p.is_file())
        return
    yield from root.rglob("*.py")
    yield from root.rglob("*.pyi")
    if package.name == "torch":
        yield from (root / "lib").glob("*.so*")
        yield from root.glob("_C*.so")


def _file_text(path: Path) -> str:
    try:
        if path.suffix in (".py", ".pyi", ".sh", ".j2"):
            return _CONCAT.sub("", path.read_text(encoding="utf-8", errors="replace")).casefold()
        data = path.read_bytes()
    except OSError:
        return ""
    return b"\n".join(_PRINTABLE.findall(data)).decode("ascii").casefold()


def _display(path: Path, root: Path) -> str:
    try:
        return f"{root.name}/{path.relative_to(root).as_posix()}"
    except ValueError:
        return path.name


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class Result:
    entry: str
    file: str
    kind: str
    """'string', 'command', 'claim' or 'record'."""
    subject: str
    verdict: str
    """PASS, FAIL or SKIP."""
    status: str
    """found, old-version, external, not-installed, missing, current, stale, …"""
    detail: str = ""
    package: str = ""
    version: str = ""
    where: str = ""

    def line(self) -> str:
        return f"{self.verdict} {self.entry} {self.kind} `{self.subject[:90]}`: {self.status}" + \
            (f" — {self.detail}" if self.detail else "")


@dataclass
class Report:
    packages: dict[str, Package]
    results: list[Result] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.results)

    def table(self, entries: int) -> dict[str, Any]:
        strings = [r for r in self.results if r.kind == "string"]
        commands = [r for r in self.results if r.kind == "command"]
        external = [r for r in strings if r.status == "external"]
        return {
            "entries": entries,
            "entries_checked": len({r.entry for r in self.results if r.verdict == "PASS"}),
            "signatures": len(strings),
            "strings_located": sum(r.status == "found" for r in strings),
            "strings_old_version": sum(r.status == "old-version" for r in strings),
            "strings_external": len(external),
            "strings_not_installed": sum(r.status == "not-installed" for r in strings),
            "strings_failed": sum(r.verdict == "FAIL" for r in strings),
            "commands": len(commands),
            "commands_ok": sum(r.verdict == "PASS" for r in commands),
            "commands_failed": sum(r.verdict == "FAIL" for r in commands),
            "commands_skipped": sum(r.verdict == "SKIP" for r in commands),
            "claims": sum(r.kind == "claim" for r in self.results),
            "records_missing": sum(r.kind == "record" and r.verdict == "FAIL" for r in self.results),
            "external_by_kind": _counts(r.detail.split(";")[0] for r in external),
        }

    def to_json(self, entries: int) -> dict[str, Any]:
        return {
            "packages": {k: {"version": p.version, "origin": p.origin} for k, p in self.packages.items()},
            "summary": {"passed": self.count("PASS"), "failed": self.count("FAIL"), "skipped": self.count("SKIP")},
            "table": self.table(entries),
            "results": [asdict(r) for r in self.results],
        }


def _counts(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# --------------------------------------------------------------------------------------------
# The checker


class Checker:
    """Runs the four checks over catalog entries against ``packages``, with a look-up cache."""

    def __init__(self, packages: dict[str, Package], cache_path: Path | None = None):
        self.packages = packages
        self.corpora: dict[str, Corpus] = {}
        self.cache_path = cache_path if cache_path is not None else CACHE_DIR / "lookups.json"
        self.cache: dict[str, Any] = {}
        try:
            loaded = json.loads(self.cache_path.read_text())
            if loaded.get("v") == _CACHE_VERSION:
                self.cache = loaded
        except (OSError, ValueError):
            pass
        self.cache.setdefault("v", _CACHE_VERSION)
        self.dirty = False

    def save(self) -> None:
        if self.dirty:
            try:
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.cache_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.cache))
                tmp.replace(self.cache_path)
            except OSError:
                pass

    # -- look-ups ---------------------------------------------------------------------------

    def _cached(self, key: str, compute: Any) -> Any:
        if key not in self.cache:
            self.cache[key] = compute()
            self.dirty = True
        return self.cache[key]

    def locate(self, package: Package, needles: list[str], fuzzy: int = 0) -> list[str] | None:
        key = f"find{fuzzy}|{package.label}|{package.origin}|" + "\x1f".join(needles)

        def compute() -> str | None:
            if package.name not in self.corpora:
                self.corpora[package.name] = Corpus(package)
            found = self.corpora[package.name].locate(needles, fuzzy)
            return list(found) if found else None

        # The checkout's own code changes under its version number: never cached.
        return compute() if package.origin == "project" else self._cached(key, compute)

    def help_text(self, package: Package, argv: list[str]) -> str | None:
        """``argv --help`` of an installed console script (None when it cannot be run)."""
        key = f"help|{package.label}|" + " ".join(argv)

        def compute() -> str | None:
            exe = Path(sys.executable).parent / argv[0]
            head = [str(exe)] if exe.exists() else ([sys.executable, "-m", "torch.distributed.run"]
                                                    if argv[0] == "torchrun" else None)
            if head is None:
                return None
            env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
            try:
                done = subprocess.run([*head, *argv[1:], "--help"], capture_output=True, text=True,
                                      timeout=120, env=env)
            except (OSError, subprocess.TimeoutExpired):
                return None
            return done.stdout + done.stderr

        return self._cached(key, compute)

    # -- checks ------------------------------------------------------------------------------

    def check_entry(self, entry: Any) -> list[Result]:
        results: list[Result] = []
        text = "\n".join((entry.title, entry.symptom, entry.root_cause, entry.fix, entry.verify,
                          entry.not_the_cause))
        for sig in entry.signatures:
            results.append(self.check_signature(entry, sig, text))
        for cmd, flags, sub in commands_in(entry.fix + "\n" + entry.verify):
            results.append(self.check_command(entry, cmd, sub, flags, text))
        for m in _CLAIM.finditer(text):
            results.append(self.check_claim(entry, m))
        results.extend(self.check_record(entry, results))
        return results

    def check_signature(self, entry: Any, sig: Any, text: str) -> Result:
        def result(verdict: str, status: str, detail: str = "", pkg: Package | None = None, where: str = "") \
                -> Result:
            return Result(entry.id, entry.file, "string", sig.pattern, verdict, status, detail,
                          pkg.name if pkg else "", pkg.version if pkg else "", where)

        needles = sorted({n for n in sig.needles if len(n.strip()) >= 4}, key=len, reverse=True)
        if not needles or len(needles[0]) < 6:
            return result("SKIP", "no-literal", "the signature has no fixed text long enough to look up")
        if _REPR.search(sig.pattern):
            return result("SKIP", "printed-value", "a printed Python value (a dict's repr), not a message text")
        def search(fuzzy: int) -> Result | None:
            for pkg in self.packages.values():
                if fuzzy and pkg.origin == "project":
                    continue  # the checkout's own messages are quoted whole
                hit = self.locate(pkg, needles, fuzzy)
                if hit:
                    where, found = hit
                    if not fuzzy:
                        return result("PASS", "found", f"{pkg.label} ({pkg.origin}) {where}", pkg, where)
                    return result("PASS", "found-part", f"{pkg.label} ({pkg.origin}) {where} holds {found!r}; "
                                  "the rest is filled in at run time", pkg, where)
            return None

        here = ", ".join(p.label for p in self.packages.values())
        context = f"{sig.pattern}\n{entry.title}\n{entry.symptom}"
        owners = [name for name, hint in OWNER_HINTS.items() if hint.search(context)]
        missing = [o for o in owners if o not in self.packages]
        found = search(0) or (None if missing else search(1))
        if found:
            return found
        if missing:
            return result("SKIP", "not-installed", f"printed by {', '.join(missing)}, not here (use --download)")
        for kind, pattern in EXTERNAL:
            if pattern.search(context):
                src = entry.sources[0] if entry.sources else "no source"
                return result("SKIP", "external", f"{kind}; quoted from {src}")
        found = search(2)
        if found:
            return found
        named = _VERSION_NAMED.search(text) or self._older_release_named(text)
        if named:
            return result("PASS", "old-version", f"not in {here}; the entry names {named.group(0)!r}")
        return result("FAIL", "missing", f"not in {here}, and the entry names no version that prints it")

    def _older_release_named(self, text: str) -> re.Match[str] | None:
        """A mention like "trl 0.11.4" of a release older than the one here."""
        for m in _RELEASE.finditer(text):
            pkg = self.packages.get(_canonical(m.group(1)))
            if pkg and _version_key(m.group(2)) < _version_key(pkg.version):
                return m
        return None

    def check_command(self, entry: Any, cmd: str, sub: str | None, flags: list[str], text: str) -> Result:
        shown = " ".join([cmd, *([sub] if sub else []), *flags])
        pkg_name = "torch" if cmd.startswith("python") else _COMMAND_PACKAGE[cmd]
        pkg = self.packages.get(pkg_name)

        def result(verdict: str, status: str, detail: str = "") -> Result:
            return Result(entry.id, entry.file, "command", shown, verdict, status, detail,
                          pkg_name, pkg.version if pkg else "")

        if pkg is None:
            return result("SKIP", "not-installed", f"{pkg_name} not here (use --download)")
        old = _names_older_version(text, pkg_name, cmd)
        if cmd.startswith("python"):
            module = cmd.split()[-1].split(".")[-1]
            if not any((root / "distributed" / f"{module}.py").exists() for root in pkg.roots):
                return result("PASS" if old else "FAIL", "old-version" if old else "missing",
                              f"torch/distributed/{module}.py not in {pkg.label}")
            argv = ["torchrun"]
        else:
            if cmd not in pkg.scripts:
                if old:
                    return result("PASS", "old-version", f"not a console script of {pkg.label}; entry names {old!r}")
                return result("FAIL", "missing", f"{pkg.label} ships no `{cmd}` (it ships: "
                              f"{', '.join(sorted(pkg.scripts)) or 'none'})")
            argv = [cmd]
        if sub:
            argv.append(sub)
        if pkg.runnable:
            help_text = self.help_text(pkg, argv)
            if help_text is None:
                return result("SKIP", "not-runnable", f"`{' '.join(argv)} --help` could not run")
            if sub and re.search(r"(?i)no such (?:command|option)|invalid choice|unrecognized", help_text):
                return result("FAIL", "missing", f"`{cmd} {sub}` is not a command of {pkg.label}")
            missing = [f for f in flags if not _flag_in(f, help_text)]
            where = f"`{' '.join(argv)} --help` of {pkg.label}"
        else:
            if pkg.name not in self.corpora:
                self.corpora[pkg.name] = Corpus(pkg)
            body = self.corpora[pkg.name].text
            missing = [f for f in flags if not _flag_in(f, body)]
            where = f"the source of {pkg.label} (downloaded, not run)"
        if missing:
            if old:
                return result("PASS", "old-version", f"{', '.join(missing)} not in {where}; entry names {old!r}")
            return result("FAIL", "missing", f"{', '.join(missing)} not in {where}")
        return result("PASS", "current", f"script and {len(flags)} flag(s) in {where}")

    def check_claim(self, entry: Any, m: re.Match[str]) -> Result:
        name = _canonical(m.group("pkg"))
        pkg = self.packages.get(name)
        subject = m.group(0)
        if pkg is None:
            return Result(entry.id, entry.file, "claim", subject, "SKIP", "not-installed", f"{name} not here", name)
        if _version_key(m.group("ver")) > _version_key(pkg.version):
            return Result(entry.id, entry.file, "claim", subject, "FAIL", "future",
                          f"names {name} {m.group('ver')}, newer than the newest here ({pkg.label})", name, pkg.version)
        return Result(entry.id, entry.file, "claim", subject, "PASS", "consistent",
                      f"{m.group('ver')} ≤ {pkg.label}", name, pkg.version)

    def check_record(self, entry: Any, results: list[Result]) -> list[Result]:
        used = {(r.package, r.version) for r in results
                if r.verdict == "PASS" and r.status in ("found", "found-part", "current") and r.package
                and r.package != "remote_gpu_trainer"}  # the checkout's own code: no release to record
        if not used:
            return []
        recorded = dict(_RECORD_ITEM.findall(getattr(entry, "verified_with", "")))
        wanted = ", ".join(f"{n} {v}" for n, v in sorted(used))
        if not recorded:
            return [Result(entry.id, entry.file, "record", wanted, "FAIL", "missing",
                           "no **Verified with:** line; run `run_evals.py facts --record`")]
        absent = sorted(n for n, _ in used if n not in recorded)
        if absent:
            return [Result(entry.id, entry.file, "record", wanted, "FAIL", "incomplete",
                           f"**Verified with:** names no version of {', '.join(absent)}; run `facts --record`")]
        stale = [f"{n} {recorded[n]} → {v}" for n, v in sorted(used) if recorded[n] != v]
        if stale:
            return [Result(entry.id, entry.file, "record", wanted, "PASS", "stale",
                           "facts still hold; recorded versions differ: " + ", ".join(stale))]
        return [Result(entry.id, entry.file, "record", wanted, "PASS", "current")]


_RECORD_ITEM = re.compile(r"([A-Za-z_][\w.-]*)\s+v?(\d+(?:\.\d+)+\S*?)(?=[,;)\s]|$)")


def _canonical(word: str) -> str:
    word = word.lower().replace("-", "_")
    return "torch" if word == "pytorch" else word


def _names_older_version(text: str, pkg: str, cmd: str) -> str | None:
    """The phrase by which the entry says ``cmd`` needs an older ``pkg`` (e.g. "before huggingface_hub
    1.0"), or None."""
    words = pkg.replace("_", "[_-]")
    m = re.search(rf"(?:before|older|prior to|until|up to|<)\s*{words}\s*v?\d+(?:\.\d+)*|"
                  rf"{words}\s*(?:<|before)\s*v?\d+(?:\.\d+)*", text, re.I)
    return m.group(0) if m else None


def _flag_in(flag: str, text: str) -> bool:
    variants = {flag, flag.replace("_", "-"), flag.replace("-", "_").replace("__", "--")}
    if not text.startswith("--") and text == text.casefold():  # a corpus: argparse names or dest
        variants |= {f'"{flag.lstrip("-").replace("-", "_")}"'.casefold()}
        return any(v.casefold() in text for v in variants)
    return any(re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", text) for v in variants)


def commands_in(markdown: str) -> list[tuple[str, list[str], str | None]]:
    """(command, its --flags, subcommand) for each package command in the code of ``markdown``."""
    from remote_gpu_trainer.catalog import code_spans  # the one parser of the catalog's markdown

    snippets = [c for c, _, _ in code_spans(markdown)]
    fence = None
    for line in markdown.splitlines():
        m = _FENCE.match(line)
        if m:
            fence = None if fence else m.group(1)
        elif fence:
            snippets.append(line.split(" #", 1)[0])
    found: list[tuple[str, list[str], str | None]] = []
    for snippet in snippets:
        for m in _COMMAND.finditer(snippet):
            cmd = re.sub(r"^python3? ", "python ", m.group("cmd"))
            tokens = m.group("rest").split()
            sub = None
            if cmd in _SUBCOMMANDS and tokens and re.fullmatch(r"[a-z][a-z-]+", tokens[0]):
                sub = tokens[0]
            flags: list[str] = []
            for tok in tokens:
                if tok.endswith(".py") or tok in ("...", "…"):
                    break  # the training script: later flags are the script's own
                if tok.startswith("--") and len(tok) > 2:
                    flags.append(tok.split("=", 1)[0].rstrip(",.;:)"))
            found.append((cmd, list(dict.fromkeys(flags)), sub))
    unique: dict[tuple[str, tuple[str, ...], str | None], None] = {}
    for cmd, flags, sub in found:
        unique[(cmd, tuple(flags), sub)] = None
    return [(c, list(f), s) for c, f, s in unique]


# --------------------------------------------------------------------------------------------
# Entry point used by the CLI and the test


def available_packages(download: bool = False, use_cache: bool = True) -> dict[str, Package]:
    """Installed packages; with ``download`` the current wheels of the others (fetched now), and
    with ``use_cache`` wheels an earlier ``--download`` left in the cache."""
    packages = installed_packages()
    others = [n for n in PACKAGES if n not in packages]
    if download or use_cache:
        packages.update(downloaded_packages(download, others))
    ordered = {n: packages[n] for n in (*PACKAGES, "python") if n in packages}
    return ordered


def run_facts(root: Path, packages: dict[str, Package], cache_path: Path | None = None,
              only: Iterable[str] = ()) -> tuple[Report, int]:
    """Check every catalog entry under ``root`` (or the ``only`` IDs). Returns the report and the
    number of entries read."""
    tools = str(Path(__file__).resolve().parents[2] / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    from remote_gpu_trainer import catalog, paths

    rels = [p.as_posix() for p in paths.skill_markdown_files(root)]
    entries = [e for e in catalog.build_catalog(root, rels).entries if not only or e.id in set(only)]
    packages = {**packages, "remote_gpu_trainer": project_package(root)}
    checker = Checker(packages, cache_path)
    report = Report(checker.packages)
    for entry in entries:
        report.results.extend(checker.check_entry(entry))
    checker.save()
    return report, len(entries)


def record_versions(root: Path, report: Report) -> list[str]:
    """Write or refresh ``**Verified with:**`` in each entry whose record check asked for one and
    that has no FAIL. Each file is re-read right before it is written (others edit it too)."""
    wanted: dict[tuple[str, str], str] = {}
    failing = {(r.file, r.entry) for r in report.results if r.verdict == "FAIL" and r.kind != "record"}
    for r in report.results:
        if r.kind == "record" and r.status != "current" and (r.file, r.entry) not in failing:
            wanted[(r.file, r.entry)] = r.subject
    changed: list[str] = []
    for rel in sorted({f for f, _ in wanted}):
        path = root / rel
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        for (f, entry_id), versions in wanted.items():
            if f == rel and _set_record(lines, entry_id, versions):
                changed.append(entry_id)
        path.write_text("".join(lines), encoding="utf-8")
    return changed


def _set_record(lines: list[str], entry_id: str, versions: str) -> bool:
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"### {entry_id} \u2014 ")), None)
    if start is None:
        return False
    end, fence = len(lines), False
    for i in range(start + 1, len(lines)):
        if _FENCE.match(lines[i]):
            fence = not fence
        elif not fence and re.match(r"#{1,3} ", lines[i]):
            end = i
            break
    record = f"**Verified with:** {versions}\n"
    for i in range(start, end):
        if lines[i].startswith("**Verified with:**"):
            lines[i] = record
            return True
    last = max(i for i in range(start, end) if lines[i].strip())
    lines[last + 1:last + 1] = ["\n", record]
    return True
