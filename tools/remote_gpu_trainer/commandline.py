"""A command line split like a shell would split it, never run by one.

``run_start(command=…)`` and a one-string ``notify`` (``"notify-me {message}"``) are split here with
:mod:`shlex`: quotes and escapes work as in a shell, but pipes, ``&&``, redirections and ``$(...)`` are
refused with a message that says so, because a caller's text must never become shell code. A program that
needs a shell is run as one explicitly (``bash -c '…'`` as argv words), which is the caller's own choice.
"""

from __future__ import annotations

import shlex

SHELL_WORDS = frozenset({"|", "||", "&&", "&", ";", ";;", ">", ">>", "<", "<<", "2>", "2>&1", "&>", "|&"})
SHELL_MARKS = ("$(", "`", "${", "$((")


def shell_words(text: str) -> list[str]:
    """The words of ``text`` as ``sh`` would split them (comments dropped). Raises ValueError, in words a person
    can act on, for text that cannot be split or that uses shell syntax."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        words = shlex.split(text, comments=True)
    except ValueError as err:
        raise ValueError(f"cannot be split like a shell command line: {err}") from None
    for word in words:
        if word in SHELL_WORDS or any(mark in word for mark in SHELL_MARKS):
            raise ValueError(f"uses shell syntax ({word!r}); commands are never run through a shell. Pass one "
                             "program as argv, or put the pipeline in a script and run that script")
    return words
