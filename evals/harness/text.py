"""Normalisation and the negation rule shared by every matcher.

Agents answer in markdown with typographic quotes, em dashes and bold text; rubric regexes are
written in plain ASCII. :func:`normalise` brings answers (and prompts, and catalog text) to one form
so a regex like ``don't run`` matches ``Don’t **run**``.

The negation rule decides whether a match is *asserted* or *warned against*. Positive matchers
(``any``, ``all``, ``near``, ``cite``) count only asserted matches, ``deny`` counts only warned-against
ones, and forbid rules fire only on asserted ones. So "never run ``pkill -u``" earns a ``deny`` point
and does not trip the ``pkill`` forbid, while "run ``pkill -u``" does the opposite. The rule is a
heuristic, documented in ``evals/README.md`` ("How negation is decided") and pinned by tests; a match
is negated when any of these holds:

1. **Before the match, in the same clause**, within :data:`WINDOW` characters, there is a negator
   (``never``, ``don't``, ``do not``, ``not``, ``avoid``, ``without``, ``instead of``, ``rather than``,
   ``no need to``, ``stop using``, ``warn against``, ``dangerous to`` …) whose scope reaches the
   match. Clauses end at ``.``/``!``/``?`` followed by a space (not in ``e.g.``/``i.e.``), ``;``, a
   line break and a spaced dash (`` - ``). A negator's scope also ends at a contrast word (``but``,
   ``however``, ``instead``, ``rather``, ``then``, ``just``, ``simply``, ``so``, ``yet``); the scope
   of ``instead of``/``rather than``/``without``/``in place of`` ends at the next comma or colon as
   well ("look without killing: run X" asserts X).
   A colon ends the scope too, unless the words before it point forward ("never do this:", "don't
   run the following:"). A clause opened by ``if``/``when``/``unless``/… ends at its first comma. Negators inside a
   parenthesis that closes before the match do not count. A negator followed by ``forget``,
   ``skip``, ``omit``, ``hesitate``, ``fail``, ``miss``, ``only`` or ``just`` cancels itself
   ("don't forget to …").
2. **Right after the match**, within 30 characters and without a comma or clause end in between,
   the clause says the matched thing is wrong: ``is not``, ``is dangerous``, ``is a myth``,
   ``does not help/fix/…``, ``won't …``, ``kills/signals/matches every/all/other …``; or a shell comment on the
   same line starts with a negator (``pkill -u me  # never``).
3. **Inherited from a lead-in**: in a fenced code block, one of the two non-empty lines before the
   fence (or a comment line just above the match inside the fence) is negated or labelled bad
   ("Don't run:", "Bad:", "❌"); in a list item or a line that starts a clause, the lead-in line
   (ending in ``:`` or a heading) ends in a negated clause.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass
from functools import cached_property

#: How far back (characters) a negator may stand from the match it negates.
WINDOW = 80
#: How far after a match a post-negation ("… is not the fix") may start.
POST_GAP = 30

_TRANSLATE = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-",
    "\u2212": "-", "\u00a0": " ", "\u200b": None, "\u200c": None, "\u200d": None, "\ufeff": None,
})
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_EM_STAR = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![\w*])")
_EM_UNDER = re.compile(r"(?<![\w_])_(?=[^\s_])([^_\n]+?)(?<=[^\s_])_(?![\w_])")
_SPACES = re.compile(r"[ \t\f\v]+")


def normalise(text: str) -> str:
    """NFKC; ASCII quotes and dashes; markdown emphasis removed outside code; runs of spaces
    collapsed (line breaks and code fences kept, because the negation rule reads them)."""
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLATE).replace("\r\n", "\n").replace("\r", "\n")
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
        elif opened:
            fence = opened.group(1)
        else:
            line = _strip_emphasis(line)
        out.append(_SPACES.sub(" ", line).rstrip())
    return "\n".join(out)


def _strip_emphasis(line: str) -> str:
    """Remove ``**bold**``, ``__bold__``, ``*em*`` and ``_em_`` markers outside code spans, so
    ``**Don't** run`` reads as ``Don't run``; ``max_grad_norm`` and ``**kwargs`` in code survive."""
    parts: list[str] = []
    last = 0
    for span in _CODE_SPAN.finditer(line):
        parts.append(_unemphasise(line[last:span.start()]))
        parts.append(span.group(0))
        last = span.end()
    parts.append(_unemphasise(line[last:]))
    return "".join(parts)


def _unemphasise(text: str) -> str:
    previous = None
    while previous != text:
        previous = text
        text = _STRONG.sub(r"\2", text)
    text = _EM_STAR.sub(r"\1", text)
    return _EM_UNDER.sub(r"\1", text)


def compile_regex(pattern: str) -> re.Pattern[str]:
    """Rubric regexes: case-insensitive, ``^``/``$`` per line, applied to normalised text. The
    pattern gets the same character mapping (a curly quote or an en dash in a pattern matches the
    ASCII one in the text) but no emphasis stripping: ``\\w*\\s*`` must stay a regex."""
    return re.compile(unicodedata.normalize("NFKC", pattern).translate(_TRANSLATE), re.IGNORECASE | re.MULTILINE)


# --- the negation rule -------------------------------------------------------------------------

NEGATOR = re.compile(
    r"\b(?:never|don'?t|do not|does not|doesn'?t|did not|didn'?t|must not|mustn'?t|should not|shouldn'?t"
    r"|cannot|can'?t|can not|won'?t|will not|would not|wouldn'?t|isn'?t|aren'?t|wasn'?t|weren'?t|not|nor"
    r"|avoid(?:s|ed|ing)?|refrain from|no need to|no reason to|there is no need"
    r"|stop \w+ing|(?:advise[sd]?|warns?|warned|warning|recommends?|argues?|cautions?|decide) against"
    r"|(?:dangerous|unsafe|risky|harmful|a bad idea|a mistake|wrong|reckless) to"
    r"|without|instead of|rather than|in place of)\b"
    r"|❌|✗|✘|🚫|⛔",
    re.IGNORECASE,
)
#: Negators whose scope is a noun phrase: it also ends at the next comma.
_PREPOSITIONAL = re.compile(r"without|instead of|rather than|in place of", re.IGNORECASE)
#: A negator directly followed by one of these words cancels itself ("don't forget to run X").
_CANCEL = re.compile(r"\s+(?:forget|skip|omit|neglect|hesitate|fail|miss|only|just|worry)\b", re.IGNORECASE)
#: Words that end a negator's scope: what follows is asserted again.
_BREAKER = re.compile(r"\b(?:but|however|instead(?!\s+of)|rather(?!\s+than)|then|just|simply|so|yet)\b", re.IGNORECASE)
#: A colon ends a negator's scope unless the words before it point forward ("never do this:",
#: "don't run the following:", "avoid:"), in which case what follows is what is warned against.
_FORWARD = re.compile(r"(?:\b(?:this|these|that|those|following|like|such as|e\.g|commands?|run|do|use|type"
                      r"|execute|anything|suggestions?|advice|ever|never|don'?t|do not|avoid|not)|[❌✗✘🚫⛔])\W*$",
                      re.IGNORECASE)
_SUBORDINATE = re.compile(r"\s*(?:if|when|whenever|unless|once|after|before|until|because|since|although|though"
                          r"|while|whether)\b", re.IGNORECASE)
_BOUNDARY = re.compile(
    r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)(?<!\bcf)[.!?](?=\s)|[;\n]| --? "
)
_POST = re.compile(
    r"^[^,]{0," + str(POST_GAP) + r"}?(?<![\w'])(?:"
    r"(?:is|are|was|were|would be|will be)\s+(?:not\b|never\b|dangerous|unsafe|wrong|risky|harmful"
    r"|destructive|unnecessary|useless|irrelevant|a myth|a bad idea|a mistake|a red herring|a trap|no fix)"
    r"|(?:isn'?t|aren'?t|wasn'?t|won'?t|will not|would not|wouldn'?t|doesn'?t|does not|do not|don'?t|didn'?t"
    r"|did not|cannot|can'?t|never)\s+(?:\w+\s+)?(?:help|fix|solve|work|matter|apply|cause|resolve|address"
    r"|free|release|end|stop|change|affect|the (?:fix|cause|problem|issue)|a fix|needed|necessary|required)"
    r"|(?:also |would |will )?(?:kills?|signals?|match(?:es)?|hits?)\s+(?:every|all|any|other|unrelated)"
    r"|#\s*(?:never|don'?t|do not|bad|wrong|dangerous|avoid|no\b))",
    re.IGNORECASE,
)
_BAD_LABEL = re.compile(r"^\W*(?:bad|wrong|dangerous|unsafe|incorrect|myth|anti-?pattern|not this|risky)\b"
                        r"|❌|✗|✘|🚫|⛔", re.IGNORECASE)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_COMMENT = re.compile(r"^\s*(?:#|//|--|;)\s*")
_PAREN = re.compile(r"\([^()\n]*\)")


@dataclass(frozen=True)
class Hit:
    """One regex match in a :class:`Doc`: where, what, and whether the negation rule applies."""

    start: int
    end: int
    text: str
    negated: bool
    snippet: str


class Doc:
    """A normalised answer (or prompt) with the line structure the negation rule needs."""

    def __init__(self, raw: str):
        self.raw = raw
        self.text = normalise(raw)
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        self._cache: dict[tuple[int, int], bool] = {}

    @cached_property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    @cached_property
    def fence_of_line(self) -> list[int | None]:
        """For each line inside a fenced block, the index of the fence's opening line."""
        result: list[int | None] = []
        opened_at: int | None = None
        fence = ""
        for index, line in enumerate(self.lines):
            opened = _FENCE.match(line)
            if opened_at is not None:
                if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                    result.append(None)
                    opened_at = None
                    continue
                result.append(opened_at)
            elif opened:
                opened_at, fence = index, opened.group(1)
                result.append(None)
            else:
                result.append(None)
        return result

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self._line_starts, pos) - 1

    def find(self, regex: re.Pattern[str]) -> list[Hit]:
        """Every non-empty match of ``regex``, each with its negation verdict."""
        hits = []
        for m in regex.finditer(self.text):
            if m.end() > m.start():
                hits.append(Hit(m.start(), m.end(), m.group(0), self.negated(m.start(), m.end()),
                                self.snippet(m.start(), m.end())))
        return hits

    def snippet(self, start: int, end: int, context: int = 40) -> str:
        """The match with up to ``context`` characters either side, on one line, for reports."""
        left = max(self.text.rfind("\n", 0, start) + 1, start - context)
        right_nl = self.text.find("\n", end)
        right = min(right_nl if right_nl != -1 else len(self.text), end + context)
        prefix = "…" if left > 0 and self.text[left - 1] != "\n" else ""
        suffix = "…" if right < len(self.text) and self.text[right] != "\n" else ""
        return prefix + self.text[left:right].strip() + suffix

    # -- negation ------------------------------------------------------------------------------

    def negated(self, start: int, end: int) -> bool:
        key = (start, end)
        if key not in self._cache:
            self._cache[key] = self._pre_negated(start) or self._post_negated(end) or self._inherited(start)
        return self._cache[key]

    def clause_start(self, pos: int) -> int:
        """Where the clause holding ``pos`` begins (see the module docstring for the boundaries)."""
        start = 0
        for m in _BOUNDARY.finditer(self.text, max(0, pos - 400), pos):
            start = m.end()
        clause = self.text[start:pos]
        if _SUBORDINATE.match(clause):
            comma = clause.find(",")
            if comma != -1:
                start += comma + 1
        return start

    def _pre_negated(self, pos: int) -> bool:
        start = max(self.clause_start(pos), pos - WINDOW)
        prefix = self.text[start:pos]
        # A parenthesis closed before the match is a side remark: its negators stay inside it.
        previous = None
        while previous != prefix:
            previous = prefix
            prefix = _PAREN.sub(lambda m: " " * len(m.group(0)), prefix)
        return negated_prefix(prefix)

    def _post_negated(self, end: int) -> bool:
        window = self.text[end:end + POST_GAP + 80]
        cut = _BOUNDARY.search(window)
        return bool(_POST.match(window[:cut.start()] if cut else window))

    def _inherited(self, pos: int) -> bool:
        index = self.line_of(pos)
        line_start = self._line_starts[index]
        fence_line = self.fence_of_line[index]
        if fence_line is not None:
            # A comment just above the match inside the fence ("# don't do this:").
            for above in range(index - 1, fence_line, -1):
                text = self.lines[above]
                if not text.strip():
                    continue
                if _COMMENT.match(text):
                    if _lead_in_negated(_COMMENT.sub("", text, count=1)):
                        return True
                    continue
                break
            return any(_lead_in_negated(t) for t in self._lines_before(fence_line, 2))
        if self.clause_start(pos) > line_start:
            return False  # the match's own clause starts mid-line: no lead-in applies
        lead = self._lead_in(index)
        return lead is not None and _lead_in_negated(lead)

    def _lines_before(self, index: int, count: int) -> list[str]:
        found = []
        for above in range(index - 1, -1, -1):
            if self.lines[above].strip():
                found.append(self.lines[above])
                if len(found) == count:
                    break
        return found

    def _lead_in(self, index: int) -> str | None:
        """The line that introduces line ``index``: for a list item, the first line above the list;
        otherwise the previous non-empty line. Only lines ending in ``:`` or headings lead in."""
        in_list = bool(_LIST_ITEM.match(self.lines[index]))
        for above in range(index - 1, -1, -1):
            text = self.lines[above]
            if not text.strip():
                if in_list:
                    continue
                return None
            if in_list and (_LIST_ITEM.match(text) or text.startswith((" ", "\t"))):
                continue
            stripped = text.strip()
            if stripped.endswith(":") or stripped.startswith("#"):
                return stripped
            return None
        return None


def negated_prefix(prefix: str) -> bool:
    """Whether a clause prefix ending right before a match negates it (rule 1)."""
    for m in reversed(list(NEGATOR.finditer(prefix))):
        if _CANCEL.match(prefix, m.end()):
            continue
        scope = prefix[m.end():]
        if _BREAKER.search(scope):
            continue
        if _PREPOSITIONAL.fullmatch(m.group(0)) and ("," in scope or ":" in scope):
            continue
        colon = scope.find(":")
        if colon != -1 and not _FORWARD.search(prefix[:m.end() + colon]):
            continue  # "you don't need a fixed port: use --standalone" asserts what follows
        return True
    return False


def _lead_in_negated(line: str) -> bool:
    """A lead-in line negates what it introduces when its last clause is negated or it is a
    "bad example" label."""
    text = normalise(line).strip().rstrip(":").strip("# ")
    if _BAD_LABEL.search(text):
        return True
    doc_start = 0
    for m in _BOUNDARY.finditer(text):
        doc_start = m.end()
    return negated_prefix(text[doc_start:] + " ")
