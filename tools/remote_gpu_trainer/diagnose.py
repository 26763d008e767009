"""diagnose_error: match a pasted traceback, log tail or dmesg output against the catalog.

How a log is read
    ANSI colour codes are dropped, lines split on ``\\n`` and, inside a line, on ``\\r`` (a tqdm bar
    rewrites itself with ``\\r``, so each redraw and an error printed after it are separate logical
    lines that keep the physical line number a person's editor shows).

How matches are found
    1. Signatures. Every entry's regexes are matched line by line, exactly as the lint checks them
       against the entry's own Symptom. To keep a 1 MB log well under a second, a regex only runs
       on lines that contain its longest required literal, and only if every whole word it requires
       occurs in the log at all (a set lookup); see :func:`catalog.compile_signature`.
    2. Lexical fallback. BM25 over each entry's title, symptom, root cause and fix, queried with the
       words of the log's error lines (or of the whole text when it is short). When no signature
       recognised an error line, it fills the remaining slots, labelled ``lexical``: a suggestion,
       not a recognised error. It also breaks ties between signature matches.

How matches are ranked: the root error before its echoes
    A crash in distributed training prints one root error and then a cascade: torchrun's
    ``ChildFailedError`` wrapper, ``Sending process … closing signal SIGTERM`` to the other ranks,
    NCCL watchdog timeouts on every rank that was waiting for the dead one. Each matching line is
    classed as *downstream* (one of those known follow-ups), *error* (an error marker such as
    ``Error``, ``Traceback``, ``Killed``, ``Xid``, ``NCCL WARN``; Python warnings excluded) or
    *note* (anything else: warnings, info). The earliest error line that any signature matches is
    taken as the root, because the cascade comes after its cause. Tiers, highest first:

    ======== ===== ==========================================================
    root     400+  a signature matched the earliest matching error line
    error    300+  a signature matched another error line
    downstr. 200+  a signature matched only known follow-up lines
    note     100+  a signature matched only non-error lines
    lexical  0–95  no signature matched; BM25 word overlap
    ======== ===== ==========================================================

    Within a tier (at most +95, so tiers never mix): up to +40 for the matching signature's
    specificity (fixed characters it demands, capped at 40), +5 per further matching signature
    (up to +15), up to +40 for BM25 relevance to the log's error lines. Equal scores are ordered
    by the matching line, then the entry ID, so the output is deterministic.

Context (versions, ranks, GPU model, exit codes, signals, Xid codes) is read with cheap regexes
from the first and last 256 KiB, where launch banners and final tracebacks are.
"""

from __future__ import annotations

import math
import os
import re
import threading
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from itertools import accumulate
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from .catalog import Catalog, Entry, Signature, fold, load_catalog, plain_text
from .errors import InputError
from .models import StrictModel
from .next_step import next_step
from .paths import skill_root
from .tables import format_table
from .toolspec import Progress, ToolSpec

MAX_TEXT_CHARS = 4 * 1024 * 1024
MAX_HITS_PER_SIGNATURE = 200
CONTEXT_WINDOW = 256 * 1024
QUERY_WINDOW = 256 * 1024
SHOWN_LINE_CHARS = 300
FIX_CHARS = 1500

Evidence = Literal["root", "error", "downstream", "note", "lexical"]
TIER = {"root": 400.0, "error": 300.0, "downstream": 200.0, "note": 100.0}


# --------------------------------------------------------------------------------------------
# Input and output


class DiagnoseInput(StrictModel):
    text: str | None = Field(
        None,
        description="A pasted traceback, log tail or dmesg lines, as is: rank prefixes, timestamps, "
        "progress bars and colour codes are fine. Up to 4 MiB of text; pass the end of a longer log. "
        "Give text or log_path.",
    )
    log_path: str | None = Field(
        None, min_length=1, max_length=4096,
        description="A log file on the machine the tool runs on (with host: a file on that box); its last "
        "tail_bytes are read. Give text or log_path.")
    tail_bytes: int = Field(1 << 20, ge=1024, le=4 << 20, description="How much of the end of log_path to read.")
    max_results: int = Field(5, ge=1, le=25, description="How many ranked matches to return.")

    @model_validator(mode="after")
    def _one_source(self) -> DiagnoseInput:
        if (self.text is None) == (self.log_path is None):
            raise ValueError("give exactly one of text (the error text) or log_path (a log file to read)")
        return self


def read_tail(path: str, tail_bytes: int) -> str:
    """The last ``tail_bytes`` of a log, from its first whole line: a long log is never read whole.

    ``~`` is the user's home and a relative path is relative to the working directory, which on a box is the
    box user's home (the box's runtime starts there), so ``~/train.log`` and ``train.log`` mean what they mean
    in ``ssh box tail train.log``.
    """
    full = os.path.abspath(os.path.expanduser(path))
    try:
        with open(full, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - tail_bytes))
            data = handle.read(tail_bytes)
    except OSError as err:
        shown = repr(path) if full == path else f"{path!r} ({full})"
        raise InputError("log_path", f"cannot read {shown}: {err.strerror or err}") from None
    if size > tail_bytes and b"\n" in data:
        data = data.split(b"\n", 1)[1]
    return data.decode("utf-8", errors="replace")


class DiagnoseContext(StrictModel):
    torch_version: str | None = None
    cuda_version: str | None = Field(None, description="CUDA torch was built with, or the toolkit's (nvcc)")
    driver_version: str | None = None
    driver_cuda_version: str | None = Field(None, description="Highest CUDA the driver supports (nvidia-smi)")
    nccl_version: str | None = None
    python_version: str | None = None
    gpu_models: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list, description="Global ranks named in the text")
    local_ranks: list[int] = Field(default_factory=list)
    world_size: int | None = None
    exit_codes: list[int] = Field(default_factory=list)
    signals: list[str] = Field(default_factory=list, description="Named or implied by exit codes (-9, 137 → SIGKILL)")
    xid_codes: list[int] = Field(default_factory=list, description="NVIDIA Xid error codes (dmesg NVRM lines)")
    model: str | None = Field(None, description="Model named in the text (from_pretrained(...), "
                              "--model_name_or_path, _name_or_path)")
    ports: list[int] = Field(default_factory=list, description="Ports named in the text (listen on :P, port: P, "
                             "MASTER_PORT, --master_port)")
    gpu_memory_gib: float | None = Field(None, description="GPU total capacity from an OOM message, GiB")
    gpus_per_node: int | None = Field(None, description="--nproc_per_node / LOCAL_WORLD_SIZE named in the text")


class InputLine(StrictModel):
    line_number: int = Field(description="1-based line number in the input")
    text: str
    rank: int | None = Field(None, description="Rank from the line's prefix ([rank3]:, [default3]:)")


class Match(StrictModel):
    id: str = Field(description="Catalog entry ID, e.g. OOM-03")
    file: str = Field(description="Entry's file relative to the skill root")
    title: str
    score: float = Field(description="Ranking score: 400+ root, 300+ error, 200+ downstream, 100+ note, under 100 "
                         "lexical (relative word overlap); within a tier, signature specificity and relevance")
    evidence: Evidence = Field(description="root: matched the earliest matching error line (likely cause); "
                               "error: another error line; downstream: only known follow-up lines "
                               "(torchrun wrapper, NCCL watchdog); note: only non-error lines; lexical: no "
                               "signature matched, ranked by word overlap (a suggestion)")
    line: InputLine | None = Field(None, description="The input line that matched")
    signature: str | None = Field(None, description="The regex that matched (null for lexical matches)")
    matched_lines: int = Field(0, description="How many input lines the entry's signatures matched")
    short_fix: str = Field(description="The entry's minimal fix (first sentence of its Fix)")
    fix: str = Field(description=f"The entry's whole Fix as written (markdown), up to {FIX_CHARS} characters, cut "
                     "at a line boundary with a marker naming the entry when longer")
    tool_call: str | None = Field(None, description="Next check: the entry's tool call (never diagnose_error "
                                  "itself) with the model, world size, port, GPU count taken from the text; "
                                  "'...' marks an argument listed in needs. null when the entry names no other check")
    needs: list[str] = Field(default_factory=list, description="Arguments of tool_call the text does not name: "
                             "supply them (e.g. model) before calling it")


class DiagnoseOutput(StrictModel):
    summary: str = Field(description="What matched where, and the first error when no signature recognised it")
    matches: list[Match]
    first_error: InputLine | None = Field(None, description="Earliest exception or fatal line in the input, "
                                          "whether or not the catalog knows it")
    context: DiagnoseContext
    lines_scanned: int
    catalog_entries: int


# --------------------------------------------------------------------------------------------
# Line classes


@cache
def _patterns() -> dict[str, re.Pattern[str]]:
    """Compiled on first use so importing the server costs nothing."""
    return {
        "ansi": re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"),
        # Lines that report a failure rather than cause it: torchrun's failure summary, the SIGTERM it
        # sends the surviving ranks, and the NCCL watchdog tearing down ranks that waited for a dead one.
        "downstream": re.compile(
            r"ChildFailedError|Sending process \d+ closing signal|Watchdog caught collective operation timeout"
            r"|ran for \d+ milliseconds before timing out|Some NCCL operations have failed or timed out"
            r"|taking the entire process down|watchdog thread terminated|communicator was aborted"
            r"|Heartbeat monitor timed out|watchdog got stuck|detected by watchdog|Timeout at NCCL work"
            r"|failed \(exitcode: -?\d+\) local_rank"
            r"|^\s*exitcode\s*: -?\d+ \(pid|^\s*traceback\s*: Signal \d+|Received \S*SIGTERM death signal", re.I),
        "error": re.compile(
            r"error|exception|traceback|fatal|fail|killed|abort|segmentation fault|core dumped|\bxid\b"
            r"|out of memory|\boom\b|panic|timed out|timeout|refused|denied|cannot|can't|unable to|no such"
            r"|not found|illegal|invalid|broken pipe|assert|\bnan\b|signal \d|\bSIG[A-Z]{3,4}\b"
            r"|exit ?code|exit status|\bWARN\b|no space left", re.I),
        "warning": re.compile(r"\b(?:[A-Z]\w*)?Warning\b"),
        "hard_error": re.compile(r"Error|Exception|Traceback|FATAL|Killed"),
        # The head of a Python exception message, or a line that is fatal on its own.
        "exception": re.compile(
            r"^\s*(?:\[(?:rank|default)\d+\]:\s*)?(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b"
            r"(?::|\s*$)|Segmentation fault|^\s*Killed\s*$|NVRM: Xid|NCCL WARN|\bFATAL\b|Killed process \d+"
            r"|core dumped|\bBus error\b|^\s*(?:ERROR|FATAL|CRITICAL):"),
        "rank": re.compile(r"\[(?:rank|default)(\d+)\]|\[Rank (\d+)\]"),
        "frame": re.compile(r"^\s*(?:\[(?:rank|default)\d+\]:)?\s*File \".*\", line \d+"),
        "token": re.compile(r"[a-z0-9_]{2,}"),
    }


def classify(line: str) -> str:
    """downstream, error or note (see the module docstring)."""
    p = _patterns()
    if p["downstream"].search(line):
        return "downstream"
    if p["error"].search(line) and not (p["warning"].search(line) and not p["hard_error"].search(line)):
        return "error"
    return "note"


# --------------------------------------------------------------------------------------------
# The prepared input

_WORD_BYTES = b"abcdefghijklmnopqrstuvwxyz0123456789_"
_NON_WORD_TO_SPACE = bytes(c if c in _WORD_BYTES else 32 for c in range(256))


class _Text:
    """The input split into logical lines, with a folded copy for literal prefilters."""

    def __init__(self, raw: str):
        text = _patterns()["ansi"].sub("", raw) if "\x1b" in raw else raw
        text = text.replace("\r\n", "\n")
        physical = text.split("\n")
        if "\r" in text:
            self.lines: list[str] = []
            self.numbers: list[int] | None = []
            for number, line in enumerate(physical, 1):
                for part in line.split("\r"):
                    if part.strip() or "\r" not in line:
                        self.lines.append(part)
                        self.numbers.append(number)
        else:
            self.lines, self.numbers = physical, None
        self.physical_lines = len(physical)
        self.folded = fold("\n".join(self.lines))
        # Line starts in the folded text (folding non-ASCII text can change lengths, not newlines).
        self.starts = [0, *accumulate(len(x) + 1 for x in self.folded.split("\n"))][:-1]
        self._words: set[bytes] | None = None
        self._joined: tuple[str, list[int]] | None = None
        self._classes: dict[int, str] = {}

    @property
    def joined(self) -> tuple[str, list[int]]:
        """The logical lines joined by newlines, and each line's start offset in it."""
        if self._joined is None:
            self._joined = ("\n".join(self.lines), [0, *accumulate(len(x) + 1 for x in self.lines)][:-1])
        return self._joined

    @property
    def words(self) -> set[bytes]:
        """Every maximal [a-z0-9_] run of the folded text, as bytes: a byte-table translate and a
        split cost a few ms per MB where a regex split costs ~50 ms."""
        if self._words is None:
            self._words = set(self.folded.encode("utf-8", "replace").translate(_NON_WORD_TO_SPACE).split())
        return self._words

    def number(self, index: int) -> int:
        return self.numbers[index] if self.numbers is not None else index + 1

    def line_class(self, index: int) -> str:
        """classify(), except that a line continuing an exception's message (``\tMissing key(s)
        in state_dict`` under ``RuntimeError: Error(s) in loading state_dict``) is an error line and
        the source line a traceback quotes under ``File "…", line N`` is not."""
        if index not in self._classes:
            line, p = self.lines[index], _patterns()
            kind = classify(line)
            if index and p["frame"].search(self.lines[index - 1]) and not p["exception"].search(line):
                kind = "note"  # source code a traceback quotes (raise ValueError("…")), not the error
            elif kind == "note" and self._continues_exception(index):
                kind = "error"
            self._classes[index] = kind
        return self._classes[index]

    def _continues_exception(self, index: int, reach: int = 8) -> bool:
        pattern = _patterns()["exception"]
        for back in range(index - 1, max(-1, index - 1 - reach), -1):
            line = self.lines[back]
            if not line.strip():
                return False
            if pattern.search(line):
                return classify(line) != "downstream"
        return False

    def lines_containing(self, needle: str, start: int = 0) -> Iterable[int]:
        """Indexes of lines whose folded text contains ``needle``, in order, each once, from the
        line that holds folded offset ``start``."""
        pos = self.folded.find(needle, start)
        while pos >= 0:
            index = bisect_right(self.starts, pos) - 1
            yield index
            nxt = self.starts[index + 1] if index + 1 < len(self.starts) else len(self.folded)
            pos = self.folded.find(needle, nxt)

    def input_line(self, index: int) -> InputLine:
        text = self.lines[index].strip()
        if len(text) > SHOWN_LINE_CHARS:
            text = text[: SHOWN_LINE_CHARS - 1] + "…"
        rank = _patterns()["rank"].search(self.lines[index])
        return InputLine(line_number=self.number(index), text=text,
                         rank=int(rank.group(1) or rank.group(2)) if rank else None)


# --------------------------------------------------------------------------------------------
# Signature scan


@dataclass
class ScanStats:
    """What the scan did, for tests and the benchmark to check the prefilter really prefilters."""

    signatures: int = 0
    skipped_by_prefilter: int = 0
    regex_calls: int = 0


Hits = dict[int, list[tuple[int, Signature]]]


def scan_signatures(catalog: Catalog, text: _Text, stats: ScanStats | None = None) -> Hits:
    """Entry index → [(line index, signature)] for every signature hit, lines ascending.

    Equivalent to running every regex on every line (a test compares the two), but a regex is
    skipped unless every whole word it requires occurs in the text (set lookup) and its longest
    required literal does (substring search); then it runs only on the lines holding that literal.
    A literal that turns out to be common (more than PER_LINE_LIMIT lines) hands over to one pass of
    the regex engine over the rest of the text, which finds the same lines: a match cannot span lines
    unless ``spans_lines``, and those signatures always take the whole-text pass.
    """
    stats = stats or ScanStats()
    hits: dict[int, list[tuple[int, Signature]]] = {}
    for entry_index, sig, words in _index(catalog).signatures:
        stats.signatures += 1
        if (words and not words <= text.words) or (sig.needles and sig.needles[0] not in text.folded):
            stats.skipped_by_prefilter += 1
            continue
        found = _whole_text_lines(sig, text, 0, stats) if sig.spans_lines else _candidate_lines(sig, text, stats)
        if found:
            hits.setdefault(entry_index, []).extend((index, sig) for index in found)
    for entry_hits in hits.values():
        entry_hits.sort(key=lambda h: h[0])
    return hits


PER_LINE_LIMIT = 64


def _candidate_lines(sig: Signature, text: _Text, stats: ScanStats) -> list[int]:
    candidates = text.lines_containing(sig.needles[0]) if sig.needles else range(len(text.lines))
    found: list[int] = []
    for n, index in enumerate(candidates):
        if n == PER_LINE_LIMIT:
            rest = _whole_text_lines(sig, text, text.joined[1][index], stats, MAX_HITS_PER_SIGNATURE - len(found))
            return found + rest
        stats.regex_calls += 1
        if sig.regex.search(text.lines[index]):
            found.append(index)
            if len(found) >= MAX_HITS_PER_SIGNATURE:
                break
    return found


def _whole_text_lines(sig: Signature, text: _Text, pos: int, stats: ScanStats,
                      limit: int = MAX_HITS_PER_SIGNATURE) -> list[int]:
    """Lines where matches of ``sig`` start, searching the joined text from offset ``pos``."""
    stats.regex_calls += 1
    joined, starts = text.joined
    found: list[int] = []
    for m in sig.regex.finditer(joined, pos):
        index = bisect_right(starts, m.start()) - 1
        if not found or found[-1] != index:
            found.append(index)
            if len(found) >= limit:
                break
    return found


# --------------------------------------------------------------------------------------------
# Lexical index (BM25)

_STOPWORDS = frozenset(re.split(
    r"\s+",
    "the and for with that this from are was were not but you your can its has have had into when then than "
    "all any one two use using used via per out off only also more most some such each which what where while "
    "will would could should may might must does did done just like get got set see run runs ran been being "
    "how why who them they their there here over under about after before again same other these those because "
    "every both few own very too it is in of to on at by as or be if no so an do up we",
))


class BM25:
    """Okapi BM25 (k1=1.2, b=0.75) with per-document term weights precomputed, so a query costs
    one dictionary lookup per distinct query word."""

    def __init__(self, docs: list[Counter[str]], k1: float = 1.2, b: float = 0.75):
        self.n = len(docs)
        lengths = [sum(d.values()) for d in docs]
        average = (sum(lengths) / self.n) if self.n else 1.0
        df = Counter(term for d in docs for term in d)
        self.idf = {t: math.log(1 + (self.n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
        self.postings: dict[str, list[tuple[int, float]]] = {}
        for i, (doc, length) in enumerate(zip(docs, lengths, strict=True)):
            norm = k1 * (1 - b + b * length / (average or 1.0))
            for term, tf in doc.items():
                self.postings.setdefault(term, []).append((i, self.idf[term] * tf * (k1 + 1) / (tf + norm)))

    def scores(self, terms: Iterable[str]) -> tuple[list[float], list[int]]:
        """Scores per document, and how many distinct query terms each document contains."""
        scores = [0.0] * self.n
        matched = [0] * self.n
        for term in set(terms):
            for doc, weight in self.postings.get(term, ()):
                scores[doc] += weight
                matched[doc] += 1
        return scores, matched


def tokens(text: str) -> list[str]:
    return [t for t in _patterns()["token"].findall(fold(text)) if t not in _STOPWORDS]


@dataclass(frozen=True)
class _Index:
    signatures: tuple[tuple[int, Signature, frozenset[bytes]], ...]
    """(entry index, signature, its required words as bytes, to compare with _Text.words)"""
    bm25: BM25
    doc_terms: tuple[frozenset[str], ...]


_index_lock = threading.Lock()


def _index(catalog: Catalog) -> _Index:
    """Built once per parsed catalog (a catalog edit makes a new Catalog, hence a new index)."""
    with _index_lock:
        built = catalog.derived.get("diagnose")
        if built is None:
            docs = []
            for e in catalog.entries:
                words = tokens(" ".join([e.title, e.title, e.group or "", e.symptom_plain, e.symptom_plain,
                                         plain_text(e.root_cause), plain_text(e.fix)]))
                docs.append(Counter(words))
            sigs = tuple((i, s, frozenset(w.encode() for w in s.words))
                         for i, e in enumerate(catalog.entries) for s in e.signatures)
            built = _Index(sigs, BM25(docs), tuple(frozenset(d) for d in docs))
            catalog.derived["diagnose"] = built
        return built


def _query_lines(text: _Text) -> list[int]:
    """Lines whose words form the lexical query: all of a short input; otherwise the error lines
    in the last QUERY_WINDOW characters (at most 200, where a crash is) plus the last 20 lines."""
    n = len(text.lines)
    if n <= 50:
        return [i for i in range(n) if text.lines[i].strip()]
    found: set[int] = set()
    tail = max(0, len(text.folded) - QUERY_WINDOW)
    for marker in ("error", "exception", "traceback", "fatal", "fail", "killed", "warn", "xid", "abort",
                   "timed out", "out of memory", "refused", "denied", "no such", "not found"):
        found.update(text.lines_containing(marker, tail))
    errors = sorted(i for i in found if text.line_class(i) == "error")[-200:]
    tail = [i for i in range(max(0, n - 20), n) if text.lines[i].strip()]
    return sorted(set(errors) | set(tail))


def _first_error(text: _Text) -> int | None:
    """Earliest exception or fatal line that is not a known follow-up, or None."""
    found: set[int] = set()
    markers = ("error", "exception", "interrupt", "segmentation fault", "killed", "nvrm: xid", "nccl warn", "fatal")
    for marker in markers:
        found.update(text.lines_containing(marker))
    pattern = _patterns()["exception"]
    for index in sorted(found):
        if pattern.search(text.lines[index]) and text.line_class(index) != "downstream":
            return index
    return None


# --------------------------------------------------------------------------------------------
# Ranking


def _best_line(text: _Text, lines: list[int], terms: frozenset[str], bm25: BM25) -> int | None:
    best, best_score = None, 0.0
    for index in lines:
        score = sum(bm25.idf.get(t, 0.0) for t in set(tokens(text.lines[index])) & terms)
        if score > best_score:
            best, best_score = index, score
    return best


def rank_matches(catalog: Catalog, text: _Text, max_results: int) -> list[Match]:
    index = _index(catalog)
    hits = scan_signatures(catalog, text)
    query_lines = _query_lines(text)
    query = [t for i in query_lines for t in tokens(text.lines[i])]
    lexical, overlap = index.bm25.scores(query)
    top_lexical = max(lexical, default=0.0) or 1.0
    error_hits = [i for entry_hits in hits.values() for i, _ in entry_hits if text.line_class(i) == "error"]
    root_line = min(error_hits) if error_hits else None

    matches: list[tuple[float, int, str, Match]] = []
    for entry_index, entry_hits in hits.items():
        e = catalog.entries[entry_index]
        classes = [(i, sig, text.line_class(i)) for i, sig in entry_hits]
        if any(i == root_line for i, _, _ in classes):
            evidence, chosen = "root", next((i, s) for i, s, _ in classes if i == root_line)
        else:
            evidence = next(c for c in ("error", "downstream", "note") if any(k == c for _, _, k in classes))
            chosen = next((i, s) for i, s, k in classes if k == evidence)
        distinct = len({s.pattern for _, s in entry_hits})
        score = (TIER[evidence] + 40 * min(chosen[1].literal_chars, 40) / 40 + 5 * min(distinct - 1, 3)
                 + 40 * lexical[entry_index] / top_lexical)
        matches.append((round(score, 2), chosen[0], e.id,
                        _match(e, score, evidence, text.input_line(chosen[0]), chosen[1].pattern,
                               len({i for i, _ in entry_hits}))))
    matches.sort(key=lambda m: (-m[0], m[1], m[2]))
    result = [m[3] for m in matches[:max_results]]

    # Lexical suggestions only when no signature recognised an error line: next to a recognised
    # error they are noise, but when only a wrapper or nothing matched they point somewhere useful.
    if len(result) < max_results and not any(m.evidence in ("root", "error") for m in result):
        seen = {m.id for m in result}
        order = sorted(range(len(catalog.entries)), key=lambda i: (-lexical[i], catalog.entries[i].id))
        for i in order:
            if len(result) >= max_results or lexical[i] < 0.3 * top_lexical or not overlap[i]:
                break
            e = catalog.entries[i]
            if e.id in seen:
                continue
            line = _best_line(text, query_lines, index.doc_terms[i], index.bm25)
            result.append(_match(e, 95 * lexical[i] / top_lexical, "lexical",
                                 text.input_line(line) if line is not None else None, None, 0))
    return result


def _match(e: Entry, score: float, evidence: str, line: InputLine | None, signature: str | None,
           matched_lines: int) -> Match:
    return Match(id=e.id, file=e.file, title=e.title, score=round(score, 2), evidence=evidence, line=line,
                 signature=signature, matched_lines=matched_lines, short_fix=e.short_fix,
                 fix=bounded_fix(e.fix, f"{e.file} {e.id}"))


def bounded_fix(markdown: str, where: str, limit: int = FIX_CHARS) -> str:
    """The Fix as written; past ``limit`` characters, cut after the last whole line that fits and say
    where the rest is (a cut mid-line could end inside a command the reader would then run)."""
    text = markdown.strip()
    if len(text) <= limit:
        return text
    kept: list[str] = []
    size = 0
    for line in text.splitlines():
        if size + len(line) + 1 > limit and kept:
            break
        kept.append(line[:limit])
        size += len(line) + 1
    return "\n".join(kept) + f"\n[… fix cut at {limit} characters; the rest is in {where}]"


def with_next_steps(catalog: Catalog, matches: list[Match], context: DiagnoseContext) -> list[Match]:
    """Fill each match's ``tool_call``/``needs`` from its entry and what the text names."""
    known = context.model_dump()
    known["port"] = context.ports[0] if context.ports else None
    for m in matches:
        step = next_step(catalog.entry(m.id).tools, known, just_ran="diagnose_error")
        m.tool_call, m.needs = step.call, list(step.needs)
    return matches


# --------------------------------------------------------------------------------------------
# Context


@cache
def _context_patterns() -> dict[str, list[tuple[re.Pattern[str], bool]]]:
    """key → [(pattern, needs a word boundary before the match)]. Every pattern starts with a literal
    so the regex engine can skip ahead with a fast substring search; a leading ``\\b`` (which
    would disable that) is checked on the match instead."""
    v = r"(\d+\.\d+(?:\.\d+)?)"
    specs = {
        "torch_version": [r"PyTorch version:\s*(\d+\.\d+\.\d+\S*)",
                          r"\btorch(?:==|-|\s+version\s*[:=]?\s*|\.__version__\W*|\s+)"
                          r"(\d+\.\d+\.\d+(?:\+[a-z0-9.]+|(?:a|b|rc|\.dev)\d+)*)"],
        "cuda_version": [r"CUDA used to build PyTorch:\s*(\d+\.\d+)", r"Cuda compilation tools, release (\d+\.\d+)",
                         r"torch\.version\.cuda\W*(\d+\.\d+)", r"+cu(\d{3})\b"],
        "driver_version": [r"Driver Version:\s*" + v, r"river version:\s*" + v, r"Kernel Module\s+" + v],
        "driver_cuda_version": [r"CUDA Version:\s*(\d+\.\d+)"],
        "nccl_version": [r"NCCL version:?\s*(\d+\.\d+\.\d+)", r"nccl[\w-]*(?:==|\s+)(\d+\.\d+\.\d+)"],
        "python_version": [r"Python version:\s*(3\.\d+(?:\.\d+)?)", r"\bPython (3\.\d+(?:\.\d+)?)\b",
                           r"/python(3\.\d+)/"],
        "gpu_models": [rf"\b({vendor}(?: (?:GeForce|RTX|Quadro|TITAN))* (?:[A-Z]{{1,3}}\d{{1,4}}[A-Z]?|\d{{4}})"
                       r"(?:[- ](?:Ti|SUPER|Ada Generation|Ada|SXM\d?|PCIE|PCIe|NVL|HBM\de?|\d+GB))*)\b"
                       for vendor in ("NVIDIA", "Tesla", "Quadro")],
        "ranks": [r"[rank(\d+)\]", r"[default(\d+)\]", r"[Rank (\d+)\]", r"\brank\s*[:=]\s*(\d+)",
                  r"\bRANK=(\d+)"],
        "local_ranks": [r"\blocal_rank\s*[:=]\s*(\d+)", r"\bLOCAL_RANK=(\d+)"],
        "world_size": [r"\bworld_size\s*[:=]?\s*(\d+)", r"\bworld size\s*[:=]?\s*(\d+)", r"\bWORLD_SIZE=(\d+)",
                       r"\bnranks (\d+)", r"\bnRanks (\d+)"],
        "exit_codes": [r"\bexitcode\s*:\s*(-?\d+)", r"\bexit code[:= ]+(-?\d+)", r"\bexit status[:= ]+(-?\d+)",
                       r"exited with (?:exit )?code (-?\d+)", r"non-zero exit status (-?\d+)"],
        "signals": [r"\b(SIG(?:KILL|TERM|SEGV|BUS|ABRT|HUP|INT|ILL|FPE|PIPE|USR1|USR2|XCPU))\b"],
        # What a shell or PyTorch prints instead of the signal's name.
        "SIGSEGV": [r"(Segmentation fault)"], "SIGBUS": [r"(Bus error)"], "SIGKILL": [r"(Killed)[ \t]*$"],
        "SIGABRT": [r"(Aborted \(core dumped\))"],
        "xid_codes": [r"\bXid \([^)]*\): (\d+)"],
        "model": [r"from_pretrained\(\s*[\"']([\w.\-/]+)[\"']",
                  r"--model[_-]name[_-]or[_-]path[= ]+[\"']?([\w.\-/]+)",
                  r"model_name_or_path[\"']?\s*[:=]\s*[\"']?([\w.\-/]+)",
                  r"_name_or_path[\"']?\s*:\s*[\"']([\w.\-/]+)"],
        "ports": [r"listen on \S*:(\d{2,5})\b", r"\bport: (\d{2,5})\b", r"\bMASTER_PORT=(\d{2,5})\b",
                  r"--master[_-]port[= ](\d{2,5})\b"],
        "gpu_memory_gib": [r"total capacity of (\d+(?:\.\d+)?) GiB"],
        "gpus_per_node": [r"--nproc[_-]per[_-]node[= ](\d+)", r"\bnproc_per_node\s*[:=]\s*(\d+)",
                          r"\bLOCAL_WORLD_SIZE=(\d+)", r"\blocal_world_size\s*[:=]\s*(\d+)"],
    }

    def compiled(pattern: str) -> tuple[re.Pattern[str], bool]:
        boundary = pattern.startswith(r"\b")
        body = pattern[2:] if boundary else pattern
        body = re.escape(body[0]) + body[1:] if body[0] in "[+" else body  # a literal [ or + leads
        return re.compile(body, re.MULTILINE), boundary

    return {key: [compiled(p) for p in patterns] for key, patterns in specs.items()}


def _matches(text: str, pattern: re.Pattern[str], boundary: bool) -> Iterable[re.Match[str]]:
    for m in pattern.finditer(text):
        if not boundary or m.start() == 0 or not (text[m.start() - 1].isalnum() or text[m.start() - 1] == "_"):
            yield m


_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
                 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}


def extract_context(text: str) -> DiagnoseContext:
    """Versions, ranks, GPU models, exit codes, signals and Xid codes named in ``text``."""
    if len(text) > 2 * CONTEXT_WINDOW:
        text = text[:CONTEXT_WINDOW] + "\n" + text[-CONTEXT_WINDOW:]
    pats = _context_patterns()

    def first(key: str) -> str | None:
        return next((m.group(1) for p, b in pats[key] for m in _matches(text, p, b)), None)

    def every(key: str) -> list[str]:
        # findall stays in C; only patterns that need a boundary check pay for match objects.
        return [v for p, b in pats[key] for v in ([m.group(1) for m in _matches(text, p, b)] if b else p.findall(text))]

    cuda = first("cuda_version")
    if cuda and "." not in cuda:  # +cu121 → 12.1
        cuda = f"{cuda[:-1]}.{cuda[-1]}"
    exit_codes = sorted({int(x) for x in every("exit_codes")})[:16]
    signals = set(every("signals")) | {name for name in ("SIGSEGV", "SIGBUS", "SIGKILL", "SIGABRT") if first(name)}
    for code in exit_codes:
        number = -code if code < 0 else code - 128 if 128 < code < 160 else None
        if number in _SIGNAL_NAMES:
            signals.add(_SIGNAL_NAMES[number])
    ints = lambda key: sorted({int(x) for x in every(key)})  # noqa: E731
    world = ints("world_size")
    return DiagnoseContext(
        torch_version=first("torch_version"), cuda_version=cuda, driver_version=first("driver_version"),
        driver_cuda_version=first("driver_cuda_version"), nccl_version=first("nccl_version"),
        python_version=first("python_version"),
        gpu_models=sorted(dict.fromkeys(m.strip() for m in every("gpu_models")))[:8],
        ranks=ints("ranks")[:64], local_ranks=ints("local_ranks")[:64], world_size=max(world) if world else None,
        exit_codes=exit_codes, signals=sorted(signals), xid_codes=ints("xid_codes")[:16],
        model=first("model"), ports=[p for p in dict.fromkeys(int(x) for x in every("ports")) if 0 < p < 65536][:16],
        gpu_memory_gib=float(first("gpu_memory_gib") or 0) or None,
        gpus_per_node=int(first("gpus_per_node") or 0) or None,
    )


# --------------------------------------------------------------------------------------------
# The tool


def diagnose(text: str, max_results: int = 5, root: Path | None = None) -> DiagnoseOutput:
    """Rank catalog entries for ``text``; see the module docstring for how."""
    if len(text) > MAX_TEXT_CHARS:
        raise InputError("text", f"is {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,} (4 MiB). Pass the "
                         "end of the log, e.g. `tail -c 1000000 train.log | rgt diagnose`")
    if not text.strip():
        raise InputError("text", "is empty: paste the traceback, log tail or dmesg lines")
    catalog = load_catalog(root or skill_root())
    prepared = _Text(text)
    context = extract_context(text)
    matches = with_next_steps(catalog, rank_matches(catalog, prepared, max_results), context)
    first_error = _first_error(prepared)
    return DiagnoseOutput(
        summary=_summary(catalog, matches, prepared, first_error),
        matches=matches,
        first_error=prepared.input_line(first_error) if first_error is not None else None,
        context=context,
        lines_scanned=len(prepared.lines),
        catalog_entries=len(catalog.entries),
    )


def _summary(catalog: Catalog, matches: list[Match], text: _Text, first_error: int | None) -> str:
    """One or two sentences an agent can act on: what matched where, and the first error in the
    input when no signature recognised it (the likely root cause the catalog does not know)."""
    if not catalog.entries:
        return f"The catalog under {catalog.root} has no entries, so nothing can be recognised."
    recognised = [m for m in matches if m.evidence != "lexical"]
    first = ""
    if first_error is not None:
        number = text.number(first_error)
        if number not in {m.line.line_number for m in recognised if m.line}:
            first = (f" The first error in the input, line {number}, matched no signature: "
                     f"{text.input_line(first_error).text[:160]}")
    if not recognised:
        if matches:
            return (f"No signature matched; {len(matches)} entr{'y' if len(matches) == 1 else 'ies'} ranked by word "
                    f"overlap (suggestions: check them against the log).{first}")
        return f"Nothing in the catalog matches this text.{first}"
    top = recognised[0]
    where = "the input"
    if top.line:
        where = f"line {top.line.line_number}" + (f" (rank {top.line.rank})" if top.line.rank is not None else "")
    lead = {
        "root": f"{top.id} matches the earliest recognised error, at {where}.",
        "error": f"{top.id} matches an error at {where}.",
        "downstream": f"Only follow-up lines matched ({top.id} at {where}): if no rank printed its own error "
                      "above them, the hang or wrapper itself is the problem.",
        "note": f"Only non-error lines matched ({top.id} at {where}).",
    }[top.evidence]
    others = len(recognised) - 1
    return lead + (f" {others} more signature match{'es' if others != 1 else ''}." if others else "") + first


def render(out: DiagnoseOutput) -> str:
    shown: dict[int, int] = {}
    if not out.matches:
        body = "no matches"
    else:
        rows = [[n, m.id, f"{m.score:.1f}", m.evidence, m.line.line_number if m.line else "-", m.file]
                for n, m in enumerate(out.matches, 1)]
        blocks = [format_table(["#", "entry", "score", "evidence", "line", "file"], rows)]
        # input line number -> the match that showed it first
        for n, m in enumerate(out.matches, 1):
            detail = [f"{n}. {m.id} — {m.title}"]
            if m.line and m.line.line_number in shown:
                detail.append(f"   matched: line {m.line.line_number}, as #{shown[m.line.line_number]}")
            elif m.line:
                shown[m.line.line_number] = n
                text = m.line.text if n == 1 or len(m.line.text) <= 160 else m.line.text[:159] + "…"
                detail.append(f"   matched: {text}")
            if n == 1:  # the likely cause gets its whole fix; the others their first step (--json has all)
                detail.append("   fix:\n" + "\n".join("     " + line for line in m.fix.splitlines()))
            else:
                detail.append(f"   fix:     {m.short_fix}")
            if m.tool_call:
                pronoun = "it" if len(m.needs) == 1 else "them"
                needs = f"  (supply {', '.join(m.needs)}: the log does not name {pronoun})"
                detail.append(f"   check:   {m.tool_call}" + (needs if m.needs else ""))
            blocks.append("\n".join(detail))
        body = "\n\n".join(blocks)
    c = out.context
    facts = [
        f"torch {c.torch_version}" if c.torch_version else "", f"CUDA {c.cuda_version}" if c.cuda_version else "",
        f"driver {c.driver_version}" if c.driver_version else "", f"NCCL {c.nccl_version}" if c.nccl_version else "",
        f"Python {c.python_version}" if c.python_version else "", ", ".join(c.gpu_models),
        f"ranks {_ranges(c.ranks)}" if c.ranks else "", f"world size {c.world_size}" if c.world_size else "",
        f"exit codes {', '.join(map(str, c.exit_codes))}" if c.exit_codes else "", " ".join(c.signals),
        f"Xid {', '.join(map(str, c.xid_codes))}" if c.xid_codes else "",
    ]
    context = " · ".join(f for f in facts if f) or "nothing recognised"
    first = ""
    if out.first_error and out.first_error.line_number not in shown:
        first = f"\nfirst error: line {out.first_error.line_number}: {out.first_error.text}"
    elif out.first_error:
        first = f"\nfirst error: line {out.first_error.line_number} (#{shown[out.first_error.line_number]} above)"
    return f"{out.summary}\n\n{body}\n\ncontext: {context}{first}\n({out.lines_scanned} lines, " \
           f"{out.catalog_entries} catalog entries)"


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 3, 7] → '0-3, 7'."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _run(args: DiagnoseInput, progress: Progress) -> DiagnoseOutput:
    text = args.text if args.text is not None else read_tail(args.log_path or "", args.tail_bytes)
    return diagnose(text, args.max_results)


SPECS = [
    ToolSpec(
        name="diagnose_error",
        cli="diagnose",
        title="Diagnose an error from a traceback or log",
        description=(
            "Match a pasted traceback, log tail or dmesg output against the skill's troubleshooting "
            "catalog. Returns ranked entries (ID, file, the input line that matched, the minimal fix, "
            "the tool call that confirms it), the first error line, and context read from the text "
            "(torch/CUDA/NCCL/driver/Python versions, ranks, GPU model, exit codes, signals, Xid). The "
            "root error ranks above its cascade (torchrun ChildFailedError, NCCL watchdog timeouts). "
            "Call it on any error text before answering; read the matched entry for the full fix. "
            "Give the text, or log_path to read the end (tail_bytes) of a log file; with host, a file on that "
            "box. Read-only: it never runs anything on the machine."
        ),
        input_model=DiagnoseInput,
        output_model=DiagnoseOutput,
        run=_run,
        read_only=True,
        render_text=render,
        cli_file_field="text",
        remote=True,
    )
]
