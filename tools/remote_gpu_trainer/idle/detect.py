"""Which provider is this box on, from documented signs only; and the provider's stop command as argv.

Each profile lists its detect rules (``lifecycle.detect``: an environment variable or a file, each
citing the provider page that documents it). A box matches a profile when any of its rules holds.
Variables are looked up in this process's environment and in ``/etc/environment``: vast.ai documents
that SSH sessions see its variables only through that file.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..providers import NOT_APPLICABLE, NOT_DOCUMENTED, UNVERIFIED, BoxAction, Profile, _refs

ETC_ENVIRONMENT = Path("/etc/environment")


def etc_environment(path: Path = ETC_ENVIRONMENT) -> dict[str, str]:
    """``NAME=value`` lines of /etc/environment (pam_env syntax: optional quotes, no expansion)."""
    found: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[7:].strip()
        name, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            found[name] = value.strip().strip("'\"")
    return found


def box_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """/etc/environment overlaid by this process's environment (the live value wins)."""
    return {**etc_environment(), **(os.environ if environ is None else environ)}


@dataclass(frozen=True)
class Detection:
    provider: str | None
    how: str
    """``given`` by the caller, ``detected`` from a rule, or ``unknown``."""
    evidence: str
    source_urls: tuple[str, ...] = ()


def detect(profiles: Mapping[str, Profile], env: Mapping[str, str]) -> Detection:
    """The first profile (by name) with a rule that holds here, or unknown with what was checked."""
    checked = []
    for name, profile in sorted(profiles.items()):
        for rule in profile.front.lifecycle.detect:
            holds = bool(env.get(rule.env)) if rule.env else Path(rule.file or "").exists()
            what = f"${rule.env}" if rule.env else rule.file or ""
            checked.append(what)
            if holds:
                urls = tuple(s.url for r in _refs(rule.source) if (s := profile.source_for(r)))
                return Detection(name, "detected", f"{what} is set" if rule.env else f"{what} exists", urls)
    return Detection(None, "unknown", "none of the documented signs is present (checked: "
                     f"{', '.join(checked) or 'nothing'}); pass provider=<name>")


_PROGRAM = re.compile(r"^[a-z][a-z0-9_.-]*$")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def runnable(action: BoxAction) -> bool:
    """Whether ``action.inside`` is a documented command a guard may run (not a placeholder or prose)."""
    fact = action.inside
    words = fact.value.split()
    return (fact.source not in (UNVERIFIED, NOT_APPLICABLE) and fact.value != NOT_DOCUMENTED and bool(words)
            and bool(_PROGRAM.match(words[0])) and "<" not in fact.value)


def inside_argv(action: BoxAction, env: Mapping[str, str]) -> list[str]:
    """The inside command as argv with the provider's ``$VARS`` filled in from ``env``.

    Never run through a shell. Raises ValueError naming what is missing (not documented, a variable
    not set here)."""
    if not runnable(action):
        raise ValueError(f"no documented command stops this box from inside it ({action.inside.value})")
    argv = []
    for word in shlex.split(action.inside.value):
        missing = [m.group(1) or m.group(2) for m in _VAR.finditer(word) if not env.get(m.group(1) or m.group(2))]
        if missing:
            raise ValueError(f"${missing[0]} is not set on this box, so `{action.inside.value}` cannot name it")
        argv.append(_VAR.sub(lambda m: env[m.group(1) or m.group(2)], word))
    return argv
