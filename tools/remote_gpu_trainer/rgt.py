"""The ``rgt`` command's entry point: ``rgt health`` from the warm health daemon when one answers, else the CLI.

Importing the CLI means importing pydantic and building the tools' models, most of a fresh ``rgt``'s time
(``healthd`` has the numbers and the design). So this module imports only what asking the daemon takes; every
other command, and ``rgt health`` when no daemon answers, goes on to :func:`remote_gpu_trainer.cli.entry`.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    if sys.argv[1:2] == ["health"]:
        from .healthd import answer

        try:
            code = answer(sys.argv[1:])
        except KeyboardInterrupt:
            code = 130
        if code is not None:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except OSError:
                pass
            os._exit(code)  # as cli.entry after an NVML command: nothing needs the interpreter's teardown
    from .cli import entry

    entry()


if __name__ == "__main__":
    main()
