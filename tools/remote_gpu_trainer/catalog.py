"""The troubleshooting catalog: every ``### <ID> — <title>`` entry in the skill's markdown as a typed
:class:`Entry`, plus a lint that reports each problem on one line as ``file:line ID: rule: detail``.

The markdown is the source of truth and is written by people, so the parser is forgiving (a broken
entry still yields what could be read, and diagnosis keeps working) while :func:`lint` is strict
(every deviation from the entry contract is reported precisely, so a test can fail on it).

Parsing is lazy and cached: :func:`load_catalog` parses on first use and re-parses only when a
markdown file is added, removed or modified (the cache key is every file's mtime and size), so the
server starts without touching the catalog and an edited entry is picked up on the next call.

Run ``python -m remote_gpu_trainer.catalog [FILE...]`` to lint the skill (or some of its files).
"""

from __future__ import annotations

import ast
import itertools
import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .paths import skill_markdown_files, skill_root

#: Field labels in their required order.
FIELDS = ("Symptom", "Signature", "Root cause", "Fix", "Verify", "Verify on", "Numbers", "Tool", "Not the cause",
          "Sources", "Verified with")
REQUIRED_FIELDS = ("Symptom", "Root cause", "Fix", "Verify", "Sources")

#: The ID prefix each catalog file owns. A file not listed may use any one prefix no other file uses.
PREFIXES = {
    "references/training/distributed-launch.md": "DIST",
    "references/training/precision-stability.md": "AMP",
    "references/training/oom-memory.md": "OOM",
    "references/training/checkpoint-resume.md": "CKPT",
    "references/training/convergence-debugging.md": "CONV",
    "references/training/data-pipeline.md": "DATA",
    "references/training/throughput-profiling.md": "PERF",
    "references/training/by-domain.md": "DOM",
    "references/principles.md": "PRIN",
    "references/lifecycle_checklist.md": "LIFE",
    "references/gotchas_universal.md": "GOT",
    "references/monitoring_patterns.md": "MON",
    "references/multinode.md": "NODE",
    "references/parallel_ablation.md": "PAR",
    "references/spot-resilience.md": "SPOT",
    "references/ssh_transport.md": "SSH",
    "references/china-network.md": "CN",
    "references/self-improvement.md": "SELF",
    "references/idle-billing.md": "IDLE",
    "profiles/runpod.md": "RUNPOD",
    "profiles/lambda.md": "LAMBDA",
    "profiles/autodl.md": "AUTODL",
    "profiles/vastai.md": "VAST",
    "profiles/paperspace.md": "PSPACE",
    "profiles/china.md": "CNCLOUD",
    "profiles/generic-ssh.md": "GENERIC",
    "profiles/local.md": "LOCAL",
}

#: What an entry's Verify needs to run (the first word of **Verify on:**). ``cpu`` entries name the scenario
#: that builds the failure and its fix, ``evals/verify/<ID>.py``, and the catalog check runs it; the others
#: say what is missing on a CPU-only CI box, so the check can list them instead of pretending.
VERIFY_ON = {
    "cpu": "runs here: its scenario builds the failure and the fix, and the check runs the Verify in both",
    "gpu": "needs an NVIDIA GPU and its driver (nvidia-smi, NVML, torch.cuda, NCCL on GPUs)",
    "nodes": "needs several machines, a switch fabric (NVSwitch, InfiniBand) or a scheduler (Slurm)",
    "provider": "needs a provider's account, console, API, billing page or one of its boxes",
    "network": "needs the internet or the user's own network (the Hub, mirrors, a proxy, a tracker's server)",
    "ssh": "needs an SSH server with the user's keys and config (loopback test boxes could stand in; no scenario yet)",
    "run": "is judged on the user's own training run (its logs, loss, throughput, checkpoints); nothing self-contained",
    "pending": "could run on CPU; its scenario is not written yet",
}
#: Units a **Numbers:** claim may use, as multipliers of the tool's raw value (bytes, counts, seconds).
#: Byte units are binary (GiB) or decimal (GB) as written; ``k``/``M``/``B`` are counts (``15 B`` parameters).
NUMBER_UNITS = {"": 1.0, "bytes": 1.0, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40, "kB": 1e3,
                "MB": 1e6, "GB": 1e9, "TB": 1e12, "k": 1e3, "M": 1e6, "B": 1e9, "s": 1.0, "%": 0.01}
#: Default relative tolerance of ``≈`` in a **Numbers:** claim (a figure rounded for prose, not a tool's digits).
APPROX_TOLERANCE = 0.05

#: Signatures may not match these: a regex that fires on any error log routes every log to itself.
GENERIC_PROBES = (
    "", " ", "error", "Error:", "ERROR", "warning", "WARN", "failed", "failure", "exception", "Exception",
    "RuntimeError", "RuntimeError: ", "ValueError", "Traceback (most recent call last):", "killed", "timeout",
    "timed out", "cuda", "nccl", "torch", "python", "nan", "inf", "loss", "rank 0", "[rank0]:", "INFO", "GPU",
)
#: A signature must demand at least this many fixed characters (``NaN`` or ``\d+ GiB`` is not enough).
MIN_SIGNATURE_LITERALS = 6

_ID_RE = r"[A-Z]+-\d{2,3}"
_ENTRY_HEADING = re.compile(rf"^### (?P<id>{_ID_RE}) \u2014 (?P<title>\S.*?)\s*$")
# Headings that look like an attempt at an entry, to report them instead of silently skipping them.
_ID_LIKE_HEADING = re.compile(r"^#{1,6}\s+\[?[A-Za-z]{2,}[-_\u2010\u2013]\d{1,4}\b")
_STRICT_ID_HEADING = re.compile(rf"^#{{1,6}} {_ID_RE} \u2014 ")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_LABEL = re.compile(r"^\*\*(?P<name>[A-Za-z][A-Za-z ]*?)\s*:\*\*[ \t]*(?P<rest>.*)$")
_LOOSE_LABEL = re.compile(r"^\*\*(?P<name>[A-Za-z][A-Za-z ]*?)\*\*\s*:[ \t]*(?P<rest>.*)$")
_THEMATIC_BREAK = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_URL = re.compile(r"https?://[^\s<>()`]+[^\s<>()`.,;:]")
_PLACEHOLDER_URL = re.compile(r"NNNN|XXXX|example\.(?:com|org)|/\.\.\.|<|\{", re.I)
_INLINE_LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\(\s*<?(?P<target>[^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
_REF_DEFINITION = re.compile(r"^ {0,3}\[(?P<text>[^\]]+)\]:\s*<?(?P<target>\S+?)>?(?:\s+.*)?$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=[\"']([^\"']+)[\"']", re.I)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_SCRIPT_COMMAND = re.compile(r"^(?:(?:python3?|bash|sh|uv run)\s+)?(?:\./)?(?P<path>scripts/\S+)")
_TOOL_CALL = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*)\s*(?:\((?P<args>.*)\))?$", re.S)
_SCENARIO = re.compile(r"^evals/verify/(?P<id>[A-Z]+-\d{2,3})\.py$")
_CLAIM = re.compile(r"^(?P<path>[A-Za-z_][\w.-]*)\s+(?P<op>contains|==|=|\u2248|~|<=|\u2264|>=|\u2265|<|>)\s*"
                    r"(?P<value>\"[^\"]*\"|true|false|null|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
                    r"(?:\s*(?P<unit>[A-Za-z%]+))?(?:\s*\u00b1\s*(?P<tol>\d+(?:\.\d+)?)\s*%)?$")
_OPS = {"==": "=", "~": "\u2248", "\u2264": "<=", "\u2265": ">="}


@dataclass(frozen=True)
class Problem:
    """One lint finding. ``str()`` is the one-line form tests and the CLI print."""

    file: str
    line: int
    entry: str | None
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.entry or '-'}: {self.rule}: {self.detail}"


@dataclass(frozen=True)
class Signature:
    """A compiled signature regex (re.IGNORECASE | re.MULTILINE, so ``^`` and ``$`` are per line),
    with what the diagnoser needs to skip it cheaply.

    ``needles`` are casefolded ASCII substrings every match must contain (longest first) and
    ``words`` are whole words every match must contain; both are empty when nothing is required.
    ``spans_lines`` is False when no match can contain a newline, so the regex may be run on single
    lines that contain the needle instead of on the whole text.
    """

    pattern: str
    regex: re.Pattern[str]
    line: int
    needles: tuple[str, ...]
    words: frozenset[str]
    literal_chars: int
    """How many fixed characters a match needs: the signature's specificity."""
    spans_lines: bool
    nested_repeats: bool = False
    """An unbounded repeat inside another (``(a+)+``): may backtrack exponentially on a long line."""


@dataclass(frozen=True)
class Claim:
    """One figure an entry states about a tool's result: ``total_bytes ≈ 41.8 GiB``.

    ``path`` is dotted into the tool's structured result (list items by index: ``advice.0.fits_after``);
    ``value`` is already multiplied by its unit, so it compares with the raw result (bytes, counts).
    """

    text: str
    path: str
    op: str
    """``=``, ``≈`` (within ``tolerance``), ``<``, ``<=``, ``>``, ``>=`` or ``contains`` (text)."""
    value: float | bool | str | None
    unit: str
    tolerance: float

    def holds(self, actual: Any) -> bool:
        """Whether the tool's ``actual`` value bears the claim out."""
        if self.op == "contains":
            return isinstance(actual, str) and str(self.value) in actual
        if isinstance(self.value, bool) or self.value is None:
            return actual is self.value  # 0 is not false, "" is not null
        if isinstance(self.value, str):
            return actual == self.value
        if isinstance(actual, bool) or not isinstance(actual, int | float):
            return False
        want = float(self.value)
        return {"=": actual == want, "\u2248": abs(actual - want) <= self.tolerance * abs(want),
                "<": actual < want, "<=": actual <= want, ">": actual > want, ">=": actual >= want}[self.op]

    def show(self, actual: Any) -> str:
        """``actual`` in the claim's unit, for a report line."""
        if isinstance(actual, int | float) and not isinstance(actual, bool) and self.unit:
            return f"{actual / NUMBER_UNITS[self.unit]:.3g} {self.unit}"
        return repr(actual)


@dataclass(frozen=True)
class Numbers:
    """One **Numbers:** bullet: a tool call with literal arguments and what the entry says it returns."""

    call: str
    tool: str
    arguments: Mapping[str, Any]
    claims: tuple[Claim, ...]
    line: int


@dataclass(frozen=True)
class Link:
    """A relative link in the markdown (URLs with a scheme are not collected)."""

    file: str
    line: int
    target: str
    entry: str | None


@dataclass(frozen=True)
class Entry:
    """One catalog entry. Text fields hold the markdown as written (stripped); absent optional
    fields are empty strings, so consumers never need a None check."""

    id: str
    file: str
    title: str
    group: str | None
    line: int
    symptom: str
    signatures: tuple[Signature, ...]
    root_cause: str
    fix: str
    verify: str
    tools: tuple[str, ...]
    not_the_cause: str
    sources: tuple[str, ...]
    links: tuple[Link, ...]
    field_lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    """Line number of each field's label, for precise lint reports."""
    verify_on: str = ""
    """What the Verify needs (a key of :data:`VERIFY_ON`), from **Verify on:**; empty when not stated."""
    verify_scenario: str = ""
    """For ``cpu``: the scenario script (``evals/verify/<ID>.py``) the catalog check runs the Verify with."""
    numbers: tuple[Numbers, ...] = ()
    """Figures the entry states for a concrete setup, each recomputed by a tool in the catalog check."""
    verified_with: str = ""
    """The package versions the entry's quoted strings and commands were last checked against
    (``torch 2.13.0, huggingface_hub 2.4.0``), read by ``evals/run_evals.py facts``."""

    @property
    def symptom_plain(self) -> str:
        """The Symptom as a reader sees it: code spans unwrapped, fence lines dropped."""
        return plain_text(self.symptom)

    @property
    def short_fix(self) -> str:
        """The minimal fix: by convention the Fix field leads with it, so take its first sentence
        (or, when the field opens with a code block, that block's first line)."""
        return first_sentence(self.fix)

    @property
    def tool_call(self) -> str | None:
        """The call that checks or reproduces this problem: the Tool field's first code span."""
        return self.tools[0] if self.tools else None


@dataclass(frozen=True)
class MarkdownFile:
    path: str
    title: str | None
    anchors: frozenset[str]
    links: tuple[Link, ...]


@dataclass(frozen=True)
class Catalog:
    root: Path
    entries: tuple[Entry, ...]
    files: Mapping[str, MarkdownFile]
    problems: tuple[Problem, ...]
    """Everything :func:`lint` reports except the checks that need the tool registry."""
    _by_id: Mapping[str, Entry] = field(repr=False, default_factory=dict)
    derived: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    """Scratch space for consumers (e.g. the diagnoser's index), dropped with the catalog."""

    def entry(self, entry_id: str) -> Entry:
        """The entry with ``entry_id`` (first definition wins if an ID is duplicated)."""
        try:
            return self._by_id[entry_id]
        except KeyError:
            raise KeyError(f"no catalog entry {entry_id!r} under {self.root}") from None

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._by_id


# --------------------------------------------------------------------------------------------
# Markdown helpers


def code_spans(text: str) -> list[tuple[str, int, int]]:
    """CommonMark code spans in ``text`` as (content, start, end). A run of n backticks opens a span
    that only a run of exactly n closes; newlines inside become spaces; one padding space is
    stripped from each side when both are present (so ``` `` a`b `` ``` holds ``a`b``)."""
    spans: list[tuple[str, int, int]] = []
    if "`" not in text:
        return spans
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] == "`":
            i += 2
            continue
        if ch != "`":
            i += 1
            continue
        j = i
        while j < n and text[j] == "`":
            j += 1
        run = j - i
        k = j
        close = -1
        while k < n:
            if text[k] == "`":
                m = k
                while m < n and text[m] == "`":
                    m += 1
                if m - k == run:
                    close = k
                    break
                k = m
            else:
                k += 1
        if close < 0:
            i = j
            continue
        content = text[j:close].replace("\r\n", " ").replace("\n", " ")
        if len(content) >= 2 and content[0] == " " and content[-1] == " " and content.strip():
            content = content[1:-1]
        spans.append((content, i, close + run))
        i = close + run
    return spans


def unwrap_code_spans(text: str) -> str:
    out, last = [], 0
    for content, start, end in code_spans(text):
        out.append(text[last:start])
        out.append(content)
        last = end
    out.append(text[last:])
    return "".join(out)


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """Every piece of code in ``markdown``, in order, as (kind, code): a fenced block gives its info
    string's first word (``python``, ``bash``, or ``""``) and its lines; a code span outside fences gives
    ``"span"`` and its content. The catalog check runs these, so they are exactly what the reader sees."""
    found: list[tuple[str, str]] = []
    fence: str | None = None
    info, body, prose = "", [], []
    for line in markdown.splitlines():
        opened = _FENCE.match(line)
        if fence is None and opened:
            found += [("span", c) for c, _, _ in code_spans("\n".join(prose))]
            prose = []
            fence, info, body = opened.group(1), (opened.group(2).split() or [""])[0], []
        elif fence is not None and opened and opened.group(1)[0] == fence[0] \
                and len(opened.group(1)) >= len(fence) and not opened.group(2).strip():
            found.append((info, "\n".join(body) + "\n"))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    found += [("span", c) for c, _, _ in code_spans("\n".join(prose))]
    return found


def plain_text(markdown: str) -> str:
    """Markdown as text a person would paste: code spans unwrapped, code fence lines dropped."""
    kept = [line for line in markdown.splitlines() if not _FENCE.match(line)]
    return unwrap_code_spans("\n".join(kept))


_ABBREVIATIONS = re.compile(r"(?:\be\.g|\bi\.e|\betc|\bvs|\bcf|\bapprox|\bNo)\.$", re.I)


def first_sentence(markdown: str, limit: int = 300) -> str:
    """The first sentence of the first paragraph, never cut inside a code span. A lead-in that is
    not a sentence ("Set the allocator option:", "either") gets what it introduces: the first line
    of a code block that does something (not an import or comment), or the first list item; a
    field that opens with a code block gives that line. Shortened with '…' past ``limit``."""
    lines = markdown.strip().splitlines()
    end = 0
    while end < len(lines) and lines[end].strip() and not _FENCE.match(lines[end]) \
            and not (end and _BULLET.match(lines[end])):
        end += 1
    text = _BULLET.sub("", " ".join(ln.strip() for ln in lines[:end]), count=1)
    spans = [(s, e) for _, s, e in code_spans(text)]
    for m in re.finditer(r"[.!?](?=\s+[A-Z`*(\[])", text):
        if not any(s < m.end() <= e for s, e in spans) and not _ABBREVIATIONS.search(text[: m.end()]):
            return _shorten(text[: m.end()], limit)
    if not text or not text.endswith((".", "!", "?")):  # a lead-in ("either", "Set it:") or nothing
        code, item = _introduced(lines[end:])
        text = f"{text} `{code}`" if text and code else f"{text} {item}" if text and item else text or code
    return _shorten(text, limit)


def _introduced(lines: list[str]) -> tuple[str, str]:
    """(first code line, first list item) of the block that follows a lead-in; one of them empty."""
    rest = [ln for ln in lines if ln.strip()]
    if rest and _FENCE.match(rest[0]):
        code = list(itertools.takewhile(lambda ln: not _FENCE.match(ln), rest[1:]))
        # The first line that does something: imports and comments say little on their own.
        telling = [ln.strip() for ln in code if not re.match(r"\s*(?:#|//|import |from \S+ import )", ln)]
        return (telling or [ln.strip() for ln in code] or [""])[0], ""
    if rest and _BULLET.match(rest[0]):
        item = [_BULLET.sub("", rest[0], count=1).strip()]
        item += [ln.strip() for ln in itertools.takewhile(lambda ln: ln[:1] in (" ", "\t"), rest[1:])]
        return "", " ".join(item)
    return "", ""


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text lowercased, punctuation dropped, spaces → '-'.
    (So ``OOM-03 — Step-2 OOM`` becomes ``oom-03--step-2-oom``.)"""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", unwrap_code_spans(heading)).replace("*", "")
    kept = [
        ch for ch in text.lower()
        if ch.isalnum() or ch in "_- " or unicodedata.category(ch).startswith("M")
    ]
    return "".join(kept).replace(" ", "-")


# --------------------------------------------------------------------------------------------
# Signatures


# Non-ASCII characters that re.IGNORECASE matches against ASCII letters (a test checks every code
# point). casefold() already maps the Kelvin sign to k and the long s to s, but turns the dotted
# capital I into "i" + a combining dot and leaves the dotless i alone, so those are mapped first.
CASE_TRAPS = (("\u0130", "i"), ("\u0131", "i"))


def fold(text: str) -> str:
    """Casefold the way the signature prefilter needs: an ASCII literal that a case-insensitive
    regex matches in ``text`` is always a substring of ``fold(text)``. (str.replace, not
    str.translate: translate costs ~85 ms on a megabyte of non-ASCII text, replace ~1 ms.)"""
    if text.isascii():
        return text.lower()
    for char, ascii_char in CASE_TRAPS:
        if char in text:
            text = text.replace(char, ascii_char)
    return text.casefold()


@dataclass
class _Shape:
    runs: list[str] = field(default_factory=list)
    literal_chars: int = 0
    newline: bool = False
    unbounded: bool = False
    """Contains a repeat without an upper bound (``+``, ``*``, ``{n,}``)."""
    nested: bool = False
    """An unbounded repeat inside another, e.g. ``(a+)+``: the shape of catastrophic backtracking."""

    def absorb(self, inner: _Shape) -> None:
        self.newline |= inner.newline
        self.unbounded |= inner.unbounded
        self.nested |= inner.nested


# Character-class categories that include "\n".
_NEWLINE_CATEGORIES = ("SPACE", "NOT_WORD", "NOT_DIGIT", "LINEBREAK")


def _analyse(pattern: str) -> _Shape:
    """What every match of ``pattern`` must contain, and whether a match can contain a newline.

    Walks the parse tree from CPython's own regex parser (``re._parser``): a literal run is
    required when it sits at top level, in a group, or in a repeat with minimum ≥ 1; alternations
    contribute no required run, only their weakest branch's character count. Whatever the walk
    does not understand counts as "nothing required, may span lines", which is always safe: the
    regex then runs on the whole text.
    """
    try:
        from re import _constants as c
        from re import _parser
        tree = _parser.parse(pattern, re.IGNORECASE | re.MULTILINE)
    except Exception:  # pragma: no cover - parser internals changed or unavailable
        return _Shape(newline=True)
    dotall = bool(tree.state.flags & re.DOTALL)
    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT)

    def class_has_newline(items: Any) -> bool:
        negate = any(op is c.NEGATE for op, _ in items)
        found = False
        for op, av in items:
            if op is c.LITERAL:
                found |= av == 10
            elif op is c.RANGE:
                found |= av[0] <= 10 <= av[1]
            elif op is c.CATEGORY:
                name = str(av)
                found |= any(k in name for k in _NEWLINE_CATEGORIES) and "NOT_SPACE" not in name \
                    and "NOT_LINEBREAK" not in name
            elif op is not c.NEGATE:
                return True
        return found != negate

    def walk(seq: Any, shape: _Shape) -> None:
        current: list[str] = []

        def flush() -> None:
            if current:
                shape.runs.append("".join(current))
                current.clear()

        for op, av in seq:
            if op is c.LITERAL:
                shape.literal_chars += 1
                shape.newline |= av == 10
                if chr(av).isascii():
                    current.append(chr(av).lower())
                    continue
            flush()
            if op is c.LITERAL:
                continue
            if op is c.NOT_LITERAL:
                shape.newline |= av != 10
            elif op is c.ANY:
                shape.newline |= dotall
            elif op is c.IN:
                shape.newline |= class_has_newline(av)
            elif op is c.SUBPATTERN or op is c.ATOMIC_GROUP:
                if op is c.SUBPATTERN and av[1] & re.DOTALL:
                    shape.newline = True
                walk(av[-1] if op is c.SUBPATTERN else av, shape)
            elif op in repeats:
                low, high, body = av
                inner = _Shape()
                walk(body, inner)
                shape.absorb(inner)
                if high == c.MAXREPEAT:
                    shape.nested |= inner.unbounded
                    shape.unbounded = True
                if low >= 1:
                    shape.runs += inner.runs
                    shape.literal_chars += inner.literal_chars * low
            elif op is c.BRANCH:
                branches = [_Shape() for _ in av[1]]
                for branch, body in zip(branches, av[1], strict=True):
                    walk(body, branch)
                    shape.absorb(branch)
                shape.literal_chars += min(b.literal_chars for b in branches)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                inner = _Shape()
                walk(av[1], inner)
                shape.absorb(inner)
            elif op is not c.AT:
                shape.newline = True  # group references, conditionals: assume the worst
        flush()

    shape = _Shape()
    walk(tree, shape)
    return shape


_WORD_SPLIT = re.compile(r"[^a-z0-9_]+")


def compile_signature(pattern: str, line: int) -> Signature:
    """Compile (raises re.error) and derive the prefilter and the specificity."""
    regex = re.compile(pattern, re.IGNORECASE | re.MULTILINE)
    shape = _analyse(pattern)
    words: set[str] = set()
    for run in shape.runs:
        # Only pieces with a non-word character on both sides inside the run are whole words.
        words.update(piece for piece in _WORD_SPLIT.split(run)[1:-1] if len(piece) >= 3)
    needles = tuple(sorted({r for r in shape.runs if len(r) >= 3}, key=lambda r: (-len(r), r)))
    return Signature(pattern, regex, line, needles, frozenset(words), shape.literal_chars, shape.newline,
                     shape.nested)


# --------------------------------------------------------------------------------------------
# Parsing


@dataclass
class _Draft:
    """An entry while its file is being read: field lines are collected, checked and typed later."""

    id: str
    title: str
    group: str | None
    line: int
    broken: bool = False
    fields: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    order: list[tuple[str, int]] = field(default_factory=list)
    current: str | None = None
    stray_reported: bool = False


def _skip_front_matter(lines: list[str]) -> int:
    """Index of the first line after YAML front matter (``---`` … ``---`` at the very top)."""
    if lines and lines[0].strip() == "---":
        for i in range(1, len(lines)):
            if lines[i].strip() in ("---", "..."):
                return i + 1
    return 0


def _canonical_field(name: str) -> str | None:
    lowered = name.strip().lower()
    return next((f for f in FIELDS if f.lower() == lowered), None)


def _near_field(name: str) -> str | None:
    """A known field the unknown label ``name`` was probably meant to be (plural/singular, spacing)."""
    key = re.sub(r"[\s_-]+", "", name.lower()).rstrip("s")
    return next((f for f in FIELDS if re.sub(r"\s+", "", f.lower()).rstrip("s") == key), None)


def _blank_code_spans(line: str) -> str:
    """``line`` with code spans blanked out, so a link or label inside code is not read as one."""
    for _, start, end in reversed(code_spans(line)):
        line = line[:start] + " " * (end - start) + line[end:]
    return line


class _FileParser:
    """One pass over one file: title, heading anchors, entries with their field lines, relative
    links, and the problems only this file can show. Lines inside code fences are never read as
    headings, labels or links."""

    def __init__(self, rel: str, text: str):
        self.rel = rel
        self.lines = text.splitlines()
        self.problems: list[Problem] = []
        self.drafts: list[_Draft] = []
        self.links: list[Link] = []
        self.title: str | None = None
        self.anchors: set[str] = set()
        self._slug_counts: dict[str, int] = {}

    def problem(self, line: int, entry: str | None, rule: str, detail: str) -> None:
        self.problems.append(Problem(self.rel, line, entry, rule, detail))

    def parse(self) -> None:
        group: str | None = None
        draft: _Draft | None = None
        fence: str | None = None
        orphan_reported = False
        for index in range(_skip_front_matter(self.lines), len(self.lines)):
            lineno, line = index + 1, self.lines[index]
            opened = _FENCE.match(line)
            if fence is not None:
                if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence) \
                        and not opened.group(2).strip():
                    fence = None
                self._append(draft, lineno, line)
                continue
            if opened:
                fence = opened.group(1)
                self._append(draft, lineno, line)
                continue
            self._collect_links(draft, lineno, line)
            heading = _HEADING.match(line)
            if heading:
                level, text = len(heading.group(1)), (heading.group(2) or "").strip()
                self._add_anchor(text)
                if level == 1 and self.title is None:
                    self.title = text
                elif level == 2:
                    group = text
                draft = self._heading(level, line, text, lineno, group)
                orphan_reported = False
                continue
            label = _LABEL.match(line) or _LOOSE_LABEL.match(line)
            known = _canonical_field(label.group("name")) if label else None
            if draft is None:
                if known and not orphan_reported:
                    self.problem(lineno, None, "field-outside-entry",
                                 f"**{known}:** is not under a '### <ID> — <title>' heading")
                    orphan_reported = True
            elif label and known:
                self._start_field(draft, label, known, lineno)
            else:
                near = _near_field(label.group("name")) if label else None
                if near and not draft.broken:
                    self.problem(lineno, draft.id, "field-label",
                                 f"unknown field **{label.group('name')}:** (did you mean **{near}:**?)")
                self._append(draft, lineno, line)
        if fence is not None:
            self.problem(len(self.lines), draft.id if draft else None, "unclosed-fence",
                         f"the code fence {fence} is never closed")

    def _add_anchor(self, heading_text: str) -> None:
        """GitHub de-duplicates repeated heading slugs as slug, slug-1, slug-2, …"""
        slug = github_slug(heading_text)
        seen = self._slug_counts.get(slug, 0)
        self._slug_counts[slug] = seen + 1
        self.anchors.add(f"{slug}-{seen}" if seen else slug)

    def _collect_links(self, draft: _Draft | None, lineno: int, line: str) -> None:
        if "<a " in line or "<A " in line:
            self.anchors.update(a.lower() for a in _HTML_ANCHOR.findall(line))
        if "](" not in line and "]:" not in line:
            return
        visible = _blank_code_spans(line)
        targets = [m.group("target") for m in _INLINE_LINK.finditer(visible)]
        ref = _REF_DEFINITION.match(visible)
        if ref:
            targets.append(ref.group("target"))
        owner = draft.id if draft and not draft.broken else None
        self.links += [Link(self.rel, lineno, t, owner) for t in targets if t and not _SCHEME.match(t)]

    def _heading(self, level: int, line: str, text: str, lineno: int, group: str | None) -> _Draft | None:
        """Start an entry for a valid entry heading; report headings that try to be one and fail."""
        strict = _ENTRY_HEADING.match(line)
        if strict:
            draft = _Draft(strict.group("id"), strict.group("title"), group, lineno)
            self.drafts.append(draft)
            self.anchors.add(draft.id.lower())
            return draft
        if _STRICT_ID_HEADING.match(line):
            self.problem(lineno, None, "entry-heading", f"entry headings are level 3 ('### '), not {'#' * level}")
        elif level == 3 and _ID_LIKE_HEADING.match(line):
            self.problem(lineno, None, "entry-heading",
                         f"expected '### <PREFIX>-<NN> — <title>' (uppercase prefix, 2–3 digits, em dash "
                         f"with a space each side), got {line.strip()!r}")
            # Swallow the malformed entry's fields so they are not reported again as orphans.
            return _Draft(text.split()[0], text, group, lineno, broken=True)
        return None

    def _start_field(self, draft: _Draft, label: re.Match[str], known: str, lineno: int) -> None:
        name = label.group("name").strip()
        if draft.broken:
            pass
        elif label.re is _LOOSE_LABEL:
            self.problem(lineno, draft.id, "field-label", f"write **{known}:** (colon inside the bold)")
        elif name != known:
            self.problem(lineno, draft.id, "field-label", f"write **{known}:**, not **{name}:**")
        if known in draft.fields and not draft.broken:
            self.problem(lineno, draft.id, "duplicate-field", f"**{known}:** appears twice")
        draft.fields.setdefault(known, [])
        draft.order.append((known, lineno))
        draft.current = known
        if label.group("rest").strip():
            draft.fields[known].append((lineno, label.group("rest")))

    def _append(self, draft: _Draft | None, lineno: int, line: str) -> None:
        if draft is None:
            return
        if draft.current is not None:
            draft.fields[draft.current].append((lineno, line))
        elif line.strip() and not draft.broken and not draft.stray_reported:
            self.problem(lineno, draft.id, "text-before-fields",
                         "text between the heading and the first field belongs to no field")
            draft.stray_reported = True


def _field_text(lines: list[tuple[int, str]]) -> str:
    # A thematic break after the last field separates entries; it is not part of the field.
    return "\n".join(line for _, line in lines if not _THEMATIC_BREAK.match(line)).strip()


def _parse_signatures(draft: _Draft, rel: str, problems: list[Problem]) -> tuple[Signature, ...]:
    """Code spans of the Signature field, each compiled; stray prose is reported, not guessed at."""
    sigs: list[Signature] = []
    for lineno, line in draft.fields.get("Signature", []):
        for content, _, _ in code_spans(line):
            try:
                sigs.append(compile_signature(content, lineno))
            except re.error as err:
                problems.append(Problem(rel, lineno, draft.id, "signature-regex",
                                        f"`{content}` does not compile: {err}"))
        stray = _BULLET.sub("", _blank_code_spans(line)).replace("\u00b7", " ").strip()
        if stray and not _THEMATIC_BREAK.match(line):
            problems.append(Problem(rel, lineno, draft.id, "signature-text",
                                    f"text outside code spans: {stray[:60]!r} (one regex per `code span`, "
                                    f"separated by ' · ' or new lines)"))
    return tuple(sigs)


def _check_signatures(entry: Entry, problems: list[Problem]) -> None:
    """Each signature must be specific, and at least one must match the entry's own Symptom (as
    plain text: code spans unwrapped), the same way the diagnoser matches a pasted log."""
    for sig in entry.signatures:
        generic = next((probe for probe in GENERIC_PROBES if sig.regex.search(probe)), None)
        if generic is not None:
            problems.append(Problem(entry.file, sig.line, entry.id, "signature-generic",
                                    f"`{sig.pattern}` matches the generic text {generic!r}"))
        elif sig.literal_chars < MIN_SIGNATURE_LITERALS:
            problems.append(Problem(entry.file, sig.line, entry.id, "signature-generic",
                                    f"`{sig.pattern}` demands only {sig.literal_chars} fixed characters "
                                    f"(at least {MIN_SIGNATURE_LITERALS})"))
        if sig.nested_repeats:
            problems.append(Problem(entry.file, sig.line, entry.id, "signature-backtracking",
                                    f"`{sig.pattern}` nests unbounded repeats (like `(a+)+`), which can take "
                                    "exponential time on a long log line; bound the inner or outer repeat"))
    symptom = entry.symptom_plain
    if entry.signatures and not any(s.regex.search(symptom) for s in entry.signatures):
        problems.append(Problem(entry.file, entry.signatures[0].line, entry.id, "signature-symptom",
                                "no signature matches the entry's own Symptom (code-span backticks removed)"))


def _parse_sources(draft: _Draft, rel: str, problems: list[Problem]) -> tuple[str, ...]:
    urls: list[str] = []
    for lineno, line in draft.fields.get("Sources", []):
        if not line.strip() or _THEMATIC_BREAK.match(line):
            continue
        found = _URL.findall(line)
        if _BULLET.match(line):
            if not found:
                problems.append(Problem(rel, lineno, draft.id, "sources-format", "bullet has no http(s) URL"))
        elif line[:1] not in (" ", "\t"):  # indented lines continue the bullet above
            problems.append(Problem(rel, lineno, draft.id, "sources-format",
                                    f"expected '- <URL> — note' bullets, got {line.strip()[:60]!r}"))
        for url in found:
            if _PLACEHOLDER_URL.search(url):
                problems.append(Problem(rel, lineno, draft.id, "sources-placeholder", f"placeholder URL {url}"))
            urls.append(url)
    return tuple(urls)


def _parse_verify_on(draft: _Draft, text: str, rel: str, problems: list[Problem]) -> tuple[str, str]:
    """(kind, scenario) from **Verify on:** — ``cpu — `evals/verify/DIST-06.py` …``, ``gpu``, ``provider`` …"""
    if not text:
        return "", ""
    line = draft.fields["Verify on"][0][0] if draft.fields.get("Verify on") else draft.line
    word = re.match(r"[a-z-]+", plain_text(text).strip().lower())
    kind = word.group(0) if word else ""
    if kind not in VERIFY_ON:
        problems.append(Problem(rel, line, draft.id, "verify-on",
                                f"starts with {kind or text[:20]!r}; the first word is one of {', '.join(VERIFY_ON)}"))
        return "", ""
    scenarios = [c.strip() for c, _, _ in code_spans(text) if c.strip().startswith("evals/verify/")]
    if kind != "cpu":
        if scenarios:
            problems.append(Problem(rel, line, draft.id, "verify-on",
                                    f"names {scenarios[0]} but says {kind}: a scenario is for `cpu` entries"))
        return kind, ""
    wanted = f"evals/verify/{draft.id}.py"
    if scenarios != [wanted]:
        problems.append(Problem(rel, line, draft.id, "verify-on",
                                f"`cpu` names its scenario in one code span: `{wanted}`"))
        return kind, ""
    return kind, wanted


def parse_tool_call(span: str) -> tuple[str, dict[str, Any]] | None:
    """(name, keyword literals) of ``name(key=literal, …)``; JSON spellings (true/null) allowed, ``...``
    kept as Ellipsis. None when ``span`` is not such a call."""
    match = _TOOL_CALL.match(span)
    if not match:
        return None
    if not (match.group("args") or "").strip():
        return match.group("name"), {}
    try:
        call = ast.parse(span, mode="eval").body
        if not isinstance(call, ast.Call) or call.args or any(kw.arg is None for kw in call.keywords):
            return None
        return match.group("name"), {kw.arg: ast.literal_eval(_JsonConstants().visit(kw.value))
                                     for kw in call.keywords if kw.arg}
    except (SyntaxError, ValueError):
        return None


def parse_claim(span: str) -> Claim | None:
    """A **Numbers:** claim like ``total_bytes ≈ 41.8 GiB``, ``fits = false`` or
    ``profile.billing.still_billed.value contains "$0.20/GB/month"``; None when it is not one."""
    m = _CLAIM.match(span.strip())
    if not m:
        return None
    op, raw, unit = _OPS.get(m.group("op"), m.group("op")), m.group("value"), m.group("unit") or ""
    if unit not in NUMBER_UNITS:
        return None
    value: float | bool | str | None
    if raw.startswith('"'):
        value = raw[1:-1]
    elif raw in ("true", "false", "null"):
        value = {"true": True, "false": False, "null": None}[raw]
    else:
        value = float(raw) * NUMBER_UNITS[unit]
    if (op == "contains") != isinstance(value, str) or (isinstance(value, bool | None) and op != "="):
        return None
    tolerance = float(m.group("tol")) / 100 if m.group("tol") else APPROX_TOLERANCE if op == "\u2248" else 0.0
    return Claim(span.strip(), m.group("path"), op, value, unit, tolerance)


def _parse_numbers(draft: _Draft, rel: str, problems: list[Problem]) -> tuple[Numbers, ...]:
    """**Numbers:** bullets: ``- `tool(args)`: `claim` · `claim` …`` (a bullet may continue on indented lines)."""
    bullets: list[tuple[int, str]] = []
    for lineno, line in draft.fields.get("Numbers", []):
        if _BULLET.match(line):
            bullets.append((lineno, _BULLET.sub("", line, count=1)))
        elif line.strip() and bullets and line[:1] in (" ", "\t"):
            bullets[-1] = (bullets[-1][0], f"{bullets[-1][1]} {line.strip()}")
        elif line.strip() and not _THEMATIC_BREAK.match(line):
            problems.append(Problem(rel, lineno, draft.id, "numbers-format",
                                    f"expected '- `tool(args)`: `claim` · `claim`' bullets, got {line.strip()[:60]!r}"))
    found: list[Numbers] = []
    for lineno, text in bullets:
        spans = [c.strip() for c, _, _ in code_spans(text)]
        call = parse_tool_call(spans[0]) if spans else None
        if call is None or any(v is Ellipsis for v in call[1].values()):
            problems.append(Problem(rel, lineno, draft.id, "numbers-format",
                                    "a bullet starts with a tool call whose arguments are all literals (no ...)"))
            continue
        claims = [parse_claim(c) for c in spans[1:]]
        bad = [c for c, parsed in zip(spans[1:], claims, strict=True) if parsed is None]
        if bad or not claims:
            problems.append(Problem(rel, lineno, draft.id, "numbers-format",
                                    f"`{bad[0]}` is not `path op value [unit]`" if bad else "the call states no figure"
                                    f" (units: {', '.join(u for u in NUMBER_UNITS if u)})"))
            continue
        found.append(Numbers(spans[0], call[0], call[1], tuple(c for c in claims if c), lineno))
    return tuple(found)


def _build_entry(draft: _Draft, rel: str, links: list[Link], problems: list[Problem]) -> Entry:
    text = {name: _field_text(lines) for name, lines in draft.fields.items()}
    field_lines = {name: lineno for name, lineno in reversed(draft.order)}  # first occurrence wins
    for name in REQUIRED_FIELDS:
        if name not in draft.fields:
            problems.append(Problem(rel, draft.line, draft.id, "missing-field", f"no **{name}:**"))
        elif not text[name]:
            problems.append(Problem(rel, field_lines[name], draft.id, "empty-field", f"**{name}:** is empty"))
    rank = {name: i for i, name in enumerate(FIELDS)}
    for (before, _), (after, lineno) in zip(draft.order, draft.order[1:], strict=False):
        if rank[after] < rank[before]:
            problems.append(Problem(rel, lineno, draft.id, "field-order",
                                    f"**{after}:** comes after **{before}:**; the order is {', '.join(FIELDS)}"))
            break
    symptom = text.get("Symptom", "")
    if symptom and not code_spans(symptom) and not any(_FENCE.match(ln) for ln in symptom.splitlines()):
        problems.append(Problem(rel, field_lines["Symptom"], draft.id, "symptom-code",
                                "the Symptom quotes no error or log text in a `code span` or code block"))
    tools = tuple(c.strip() for c, _, _ in code_spans(text.get("Tool", "")) if c.strip())
    if text.get("Tool") and not tools:
        problems.append(Problem(rel, field_lines["Tool"], draft.id, "tool-format",
                                "**Tool:** names no `tool_call(...)` or `scripts/…` path in a code span"))
    verify_on, scenario = _parse_verify_on(draft, text.get("Verify on", ""), rel, problems)
    entry = Entry(
        id=draft.id, file=rel, title=draft.title, group=draft.group, line=draft.line, symptom=symptom,
        signatures=_parse_signatures(draft, rel, problems), root_cause=text.get("Root cause", ""),
        fix=text.get("Fix", ""), verify=text.get("Verify", ""), tools=tools,
        not_the_cause=text.get("Not the cause", ""), sources=_parse_sources(draft, rel, problems),
        links=tuple(link for link in links if link.entry == draft.id), field_lines=field_lines,
        verify_on=verify_on, verify_scenario=scenario, numbers=_parse_numbers(draft, rel, problems),
        verified_with=text.get("Verified with", ""),
    )
    _check_signatures(entry, problems)
    return entry


def parse_file(root: Path, rel: str) -> tuple[MarkdownFile, list[Entry], list[Problem]]:
    """Parse one markdown file (``rel`` is relative to ``root``, POSIX style)."""
    parser = _FileParser(rel, (root / rel).read_text(encoding="utf-8", errors="replace"))
    parser.parse()
    entries = [_build_entry(d, rel, parser.links, parser.problems) for d in parser.drafts if not d.broken]
    md = MarkdownFile(rel, parser.title, frozenset(parser.anchors), tuple(parser.links))
    return md, entries, parser.problems


# --------------------------------------------------------------------------------------------
# Whole-catalog checks and loading


def _check_ids(entries: list[Entry], problems: list[Problem]) -> None:
    """IDs are unique across the skill; each file uses one prefix, and a prefix belongs to one file
    (the contract's file for it, if it has one)."""
    first: dict[str, Entry] = {}
    owner = {prefix: rel for rel, prefix in PREFIXES.items()}
    used: dict[str, str] = {}  # file → first prefix seen there
    for e in entries:
        def report(rule: str, detail: str, e: Entry = e) -> None:
            problems.append(Problem(e.file, e.line, e.id, rule, detail))

        prefix = e.id.split("-")[0]
        if e.id in first:
            report("duplicate-id", f"already defined at {first[e.id].file}:{first[e.id].line}")
        first.setdefault(e.id, e)
        expected = PREFIXES.get(e.file)
        if expected and prefix != expected:
            report("id-prefix", f"entries in {e.file} use the prefix {expected}-")
        elif owner.setdefault(prefix, e.file) != e.file:
            report("id-prefix", f"the prefix {prefix}- belongs to {owner[prefix]}")
        elif used.setdefault(e.file, prefix) != prefix:
            report("id-prefix", f"one prefix per file: {e.file} already uses {used[e.file]}-")


def _anchors(root: Path, rel: str, files: Mapping[str, MarkdownFile]) -> frozenset[str] | None:
    if rel in files:
        return files[rel].anchors
    try:
        return parse_file(root, rel)[0].anchors
    except (OSError, ValueError):
        return None


def _check_links(root: Path, files: Mapping[str, MarkdownFile], problems: list[Problem]) -> None:
    for md in files.values():
        for link in md.links:
            path_part, _, anchor = link.target.partition("#")
            if path_part:
                target = (root / md.path).parent / unquote(path_part)
                try:
                    resolved = target.resolve()
                except OSError:
                    resolved = target
                if not resolved.is_relative_to(root):
                    problems.append(Problem(md.path, link.line, link.entry, "link-target",
                                            f"{link.target} points outside the skill"))
                    continue
                if not resolved.exists():
                    problems.append(Problem(md.path, link.line, link.entry, "link-target",
                                            f"{link.target}: {resolved.relative_to(root).as_posix()} does not exist"))
                    continue
                target_rel = resolved.relative_to(root).as_posix()
            else:
                target_rel = md.path
            if not anchor:
                continue
            if anchor != anchor.lower():
                problems.append(Problem(md.path, link.line, link.entry, "link-anchor",
                                        f"{link.target}: anchors are lowercase (#{anchor.lower()})"))
                continue
            if not target_rel.endswith(".md"):
                continue
            anchors = _anchors(root, target_rel, files)
            if anchors is not None and unquote(anchor) not in anchors:
                problems.append(Problem(md.path, link.line, link.entry, "link-anchor",
                                        f"{link.target}: no entry or heading #{anchor} in {target_rel}"))


def build_catalog(root: Path, rels: Iterable[str]) -> Catalog:
    """Parse ``rels`` under ``root`` and run every check that needs no tool registry."""
    root = root.resolve()
    files: dict[str, MarkdownFile] = {}
    entries: list[Entry] = []
    problems: list[Problem] = []
    for rel in rels:
        md, file_entries, file_problems = parse_file(root, rel)
        files[rel] = md
        entries += file_entries
        problems += file_problems
    _check_ids(entries, problems)
    _check_links(root, files, problems)
    by_id: dict[str, Entry] = {}
    for e in entries:
        by_id.setdefault(e.id, e)  # a duplicate is reported; the first definition stays reachable
    problems.sort(key=lambda p: (p.file, p.line, p.rule, p.detail))
    return Catalog(root, tuple(entries), files, tuple(problems), by_id)


_lock = threading.Lock()
_cached: dict[Path, tuple[tuple[Any, ...], Catalog]] = {}


def _fingerprint(root: Path, rels: list[str]) -> tuple[Any, ...]:
    stamps = []
    for rel in rels:
        try:
            st = (root / rel).stat()
            stamps.append((rel, st.st_mtime_ns, st.st_size))
        except OSError:
            stamps.append((rel, None, None))
    return tuple(stamps)


def load_catalog(root: Path | None = None) -> Catalog:
    """The parsed catalog for the skill at ``root`` (default: this skill), re-parsed only when a
    markdown file was added, removed or changed since the last call (about 1 ms to check)."""
    root = (root or skill_root()).resolve()
    rels = [p.as_posix() for p in skill_markdown_files(root)]
    key = _fingerprint(root, rels)
    with _lock:
        hit = _cached.get(root)
        if hit and hit[0] == key:
            return hit[1]
        catalog = build_catalog(root, rels)
        _cached[root] = (key, catalog)
        return catalog


def entry(entry_id: str, root: Path | None = None) -> Entry:
    """Look up one entry by ID, e.g. ``entry("OOM-03").short_fix``."""
    return load_catalog(root).entry(entry_id)


# --------------------------------------------------------------------------------------------
# Tool references


class _JsonConstants(ast.NodeTransformer):
    """Accept JSON spellings (true, false, null) in tool-call examples: MCP arguments are JSON."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        values = {"true": True, "false": False, "null": None}
        return ast.Constant(values[node.id]) if node.id in values else node


def _check_tool_call(span: str, tools: Mapping[str, Any]) -> tuple[str, str] | None:
    """(rule, why) when ``span`` is not a valid call of a registered tool, None when it is.

    Literal keyword arguments are validated against the tool's input model, so a renamed parameter
    or an out-of-range example in the markdown fails the lint. Omitted arguments and ``...``
    placeholders are fine: the Tool field shows how to call, not a complete call.
    """
    match = _TOOL_CALL.match(span)
    if not match:
        return "tool-format", f"`{span}` is neither an MCP tool call like `gpu_health()` nor a scripts/ path"
    name = match.group("name")
    if name not in tools:
        return "tool-unknown", f"`{name}` is not a registered MCP tool (registered: {', '.join(sorted(tools))})"
    parsed = parse_tool_call(span)
    if parsed is None:
        return "tool-format", f"`{span}`: arguments must be keyword=literal (... as a placeholder)"
    arguments = parsed[1]
    if not arguments:
        return None
    model = getattr(tools[name], "input_model", None)
    if model is None:
        return None
    from pydantic import ValidationError

    try:
        model.model_validate({k: v for k, v in arguments.items() if v is not Ellipsis})
    except ValidationError as err:
        # A missing field, or a whole-model check (loc ()), cannot be judged while an argument is a placeholder.
        placeholders = any(v is Ellipsis for v in arguments.values())
        bad = [e for e in err.errors(include_url=False)
               if e["type"] != "missing" and not (placeholders and not e["loc"])]
        if bad:
            return "tool-args", f"`{span}`: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in bad)
    return None


def check_tools(catalog: Catalog, tools: Mapping[str, Any]) -> list[Problem]:
    """Problems with **Tool:** fields: unknown tools, bad arguments, missing scripts/ paths.

    ``tools`` maps tool name → ToolSpec (anything with ``input_model``), normally from the registry;
    literal arguments are validated against the tool's input model, ``...`` counts as a placeholder.
    """
    problems = []
    for e in catalog.entries:
        line = e.field_lines.get("Tool", e.line)
        for numbers in e.numbers:
            found = _check_tool_call(numbers.call, tools)
            if found:
                problems.append(Problem(e.file, numbers.line, e.id, *found))
        for span in e.tools:
            script = _SCRIPT_COMMAND.match(span)
            if script:
                path = script.group("path")
                if not (catalog.root / path).is_file():
                    problems.append(Problem(e.file, line, e.id, "tool-script", f"{path} does not exist"))
                continue
            found = _check_tool_call(span, tools)
            if found:
                problems.append(Problem(e.file, line, e.id, *found))
    return problems


def lint(root: Path | None = None, tools: Mapping[str, Any] | None = None,
         files: Iterable[str] | None = None) -> list[Problem]:
    """Every problem in the catalog, sorted by file and line. ``tools`` (name → ToolSpec) enables
    the **Tool:** checks; ``files`` limits the report to some files (the whole skill is still
    parsed, since IDs and links are checked across files)."""
    catalog = load_catalog(root)
    problems = list(catalog.problems)
    if tools is not None:
        problems += check_tools(catalog, tools)
    if files is not None:
        wanted = set(files)
        problems = [p for p in problems if p.file in wanted]
    return sorted(problems, key=lambda p: (p.file, p.line, p.rule, p.detail))


@cache
def registered_tools() -> dict[str, Any]:
    from .registry import all_specs

    return {s.name: s for s in all_specs()}


def main(argv: list[str] | None = None) -> int:
    """``python -m remote_gpu_trainer.catalog [--root DIR] [--no-tools] [FILE...]``: print one line per
    problem and a count per rule; exit 1 if there are problems."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m remote_gpu_trainer.catalog", description=main.__doc__)
    parser.add_argument("files", nargs="*", help="markdown files to report on (default: all); the whole skill "
                        "is still parsed, since IDs and links are checked across files")
    parser.add_argument("--root", type=Path, default=None, help="skill root (default: this skill)")
    parser.add_argument("--no-tools", action="store_true", help="skip checking **Tool:** against the registry")
    args = parser.parse_args(argv)
    root = (args.root or skill_root()).resolve()
    files = []
    for name in args.files:
        path = Path(name).resolve()
        files.append(path.relative_to(root).as_posix() if path.is_relative_to(root) else name)
    problems = lint(root, None if args.no_tools else registered_tools(), files or None)
    catalog = load_catalog(root)
    for p in problems:
        print(p)
    rules = Counter(p.rule for p in problems)
    print(f"{len(problems)} problem(s) in {len(catalog.files)} files, {len(catalog.entries)} entries"
          + (": " + ", ".join(f"{rule} {n}" for rule, n in rules.most_common()) if rules else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
