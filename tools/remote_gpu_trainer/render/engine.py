"""The jinja2 environment for scripts/templates: strict, shell-safe, loaded on first use.

Strict: ``StrictUndefined`` turns any missing variable into an error before a byte is returned, so a
caller never gets a half-rendered file. Shell-safe: every value goes into a shell template through a
filter that says how it is quoted:

* ``q``    a literal (run names, user commands, paths the caller gave): ``shlex.quote``;
* ``dq``   a profile's shell word such as ``${DATA_DIRECTORY:-/workspace}``, which must expand on the
           box: escaped for the inside of double quotes (``\\``, ``"`` and backquotes), ``$`` kept;
* ``name`` an environment variable name, checked against ``[A-Za-z_][A-Za-z0-9_]*``;
* ``comment`` text for a ``#`` comment line (newlines removed);
* ``qjoin`` a list of literals, each quoted, space-separated (a bash array body or an argv);
* ``shell`` trusted shell code inserted as code: the skill's own profile commands, and launch
           command lines this package assembled word by word with ``shell_words``;
* ``json`` a whole JSON document (DeepSpeed config), keys in the order they were built;
* ``int``  jinja's own, for numbers.

A project test checks that every ``{{ }}`` in a shell template ends in one of these filters.

jinja2 is imported here, lazily: the MCP server starts without it.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from typing import Any

from ..paths import skill_root

TEMPLATE_DIR = "scripts/templates"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quote(value: object) -> str:
    """shlex.quote, plus quotes around a bare word holding '=' (X==ens5 is legal bash but reads like a typo)."""
    text = str(value)
    quoted = shlex.quote(text)
    return f"'{text}'" if quoted == text and "=" in text else quoted


def double_quoted(value: object) -> str:
    """Escape for "...": backslash, double quote and backquote; ``$`` stays so the box expands it."""
    return re.sub(r'([\\"`])', r"\\\1", str(value))


def env_name(value: object) -> str:
    if not _NAME.match(str(value)):
        raise ValueError(f"not an environment variable name: {value!r}")
    return str(value)


def comment(value: object) -> str:
    return " ".join(str(value).split())


def quote_join(values: list[object]) -> str:
    """Each value shell-quoted, space-separated: the body of a bash array or an argument list."""
    return " ".join(shlex.quote(str(v)) for v in values)


def to_json(value: object) -> str:
    """JSON with the caller's key order kept (jinja's own tojson sorts keys and HTML-escapes)."""
    return json.dumps(value, indent=2)


def trusted_shell(value: object) -> str:
    """Shell code inserted as code: the skill's own profile commands (durable_dir_detect) and command
    lines built by :func:`shell_words`; never raw caller input. The name marks every such place."""
    return str(value)


def shell_words(words: list[str | tuple[str]]) -> str:
    """A command line from words: a str is a literal (shell-quoted); a 1-tuple is a word that must
    expand on the box (``("$NODE_RANK",)``), written inside double quotes."""
    parts = []
    for word in words:
        if isinstance(word, tuple):
            parts.append('"' + double_quoted(word[0]) + '"')
        else:
            parts.append(shlex.quote(word))
    return " ".join(parts)


@cache
def environment() -> Any:
    """The shared jinja2 Environment (built once; templates are re-read when they change on disk)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(skill_root() / TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell, YAML and JSON: quoting is explicit, per value, through the filters
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        # bash writes ${#array[@]}: jinja's default comment opener {# would swallow it
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters.update(q=quote, dq=double_quoted, name=env_name, comment=comment, qjoin=quote_join,
                       shell=trusted_shell, json=to_json)
    return env


def template_source(name: str) -> str:
    return (skill_root() / TEMPLATE_DIR / name).read_text(encoding="utf-8")


def undeclared(name: str) -> set[str]:
    """Variables a template (without its includes) reads from the context: jinja2.meta."""
    import jinja2.meta

    return set(jinja2.meta.find_undeclared_variables(environment().parse(template_source(name))))


def render(name: str, context: dict[str, Any]) -> str:
    """Render scripts/templates/<name>; any undefined variable raises (StrictUndefined)."""
    return environment().get_template(name).render(**context)
