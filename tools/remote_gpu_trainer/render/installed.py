"""The rendered Accelerate config, read by the accelerate installed on this host.

keys.py pins the key set to one accelerate release; the box a user launches from may have another.
An older accelerate rejects a top-level key it does not know yet ("had unknown keys"), so the only
way to be sure the file loads *there* is to load it with that accelerate's own reader. accelerate
imports torch, so it is imported here, on first use, and only when it is installed.
"""

from __future__ import annotations

import importlib.util
import tempfile
from importlib import metadata
from pathlib import Path

from ..health.checks import Check
from ..models import EntryRef, Verdict
from . import keys

E_KEYS = EntryRef(file="references/training/distributed-launch.md", id="DIST-30")
NAME = "accelerate_here"


def accelerate_loads(text: str, check_host: bool) -> Check:
    """Load ``text`` with this host's ``accelerate`` config reader: PASS, FAIL with its error, or SKIP."""
    threshold = "accelerate's own config reader accepts the file"
    if not check_host:
        return Check(name=NAME, verdict=Verdict.SKIP, observed="check_host=false", threshold=threshold,
                     explanation="run on the box you launch from to load the file with its accelerate")
    if importlib.util.find_spec("accelerate") is None:
        return Check(name=NAME, verdict=Verdict.SKIP, observed="accelerate is not installed here",
                     threshold=threshold, explanation=f"keys were checked against accelerate "
                     f"{keys.ACCELERATE_VERSION}; render on the box you launch from to load it with its accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    version = metadata.version("accelerate")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "accelerate_config.yaml"
        path.write_text(text)
        try:
            config = load_config_from_file(str(path))
        except Exception as error:  # whatever accelerate raises is the finding
            message = str(error).replace(str(path), "accelerate_config.yaml")
            return Check(name=NAME, verdict=Verdict.FAIL, observed=f"accelerate {version}: {message}",
                         threshold=threshold, entry=E_KEYS,
                         explanation=f"keys were checked against accelerate {keys.ACCELERATE_VERSION}; this host's "
                         f"accelerate {version} refuses the file: upgrade it, or drop the key it names")
    kind = getattr(config.distributed_type, "value", config.distributed_type)
    return Check(name=NAME, verdict=Verdict.PASS, observed=f"accelerate {version} loads it as {kind}",
                 threshold=threshold, explanation="loaded with this host's accelerate")
