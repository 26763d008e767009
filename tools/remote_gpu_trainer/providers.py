"""provider_info: what each GPU provider's profile says about billing, storage, spot, network, detach.

A profile is ``profiles/<name>.md``: YAML front matter holding the facts a program reads, then the
same eight sections in the same order for the human. Each fact names the source it came from, and a
source is either the provider's own material (``official``) or a user report (``report``); a fact
nobody could check says ``unverified``. That is how an answer can say *how sure* it is and *as of
when*, which matters more here than anywhere: billing rules change without notice.

The tool answers three kinds of request, all read-only and offline (it never calls a provider API):

* a provider only: that profile's facts with their status, its section titles and gotcha IDs;
* a question only: the question is routed by keywords to a few fact fields, and every profile's
  answer is returned side by side;
* both: the same answer for one provider.

Profiles are parsed on first use and cached by modification time, so the server starts fast and a
profile edited on disk is picked up without a restart.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from .errors import InputError, describe_validation_error
from .models import StrictModel
from .paths import skill_root
from .tables import format_table
from .toolspec import Progress, ToolSpec

PROFILE_DIR = "profiles"

#: The body of every profile: these level-2 headings, exactly, in this order.
SECTIONS = (
    "Launch",
    "Storage model",
    "Network",
    "Spot and resume",
    "Teardown and billing",
    "Detach and monitor",
    "Top gotchas",
    "Script overrides",
)
GOTCHA_SECTION = "Top gotchas"

UNVERIFIED = "unverified"
NOT_APPLICABLE = "n/a"

SourceKind = Literal["official", "report"]
#: verified: the provider's (or project's) own docs say so; reported: only user reports say so;
#: unverified: nobody checked; n/a: the question does not apply (e.g. billing on your own box);
#: config: a setting this skill chose, derived from the facts above it.
Status = Literal["verified", "reported", "unverified", "n/a", "config"]
DetachTool = Literal["tmux", "screen", "nohup", "systemd-run", "sbatch", "kubectl"]
ProfileKind = Literal["gpu-cloud", "gpu-marketplace", "platform-family", "self-managed", "own-hardware"]

_SLUG = r"^[a-z0-9][a-z0-9.-]*$"
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Front matter schema (documented key by key in profiles/_schema.md; a test keeps the two in sync)
# ---------------------------------------------------------------------------------------------


class Source(StrictModel):
    """Where a fact came from. ``accessed`` is the date it was read, which dates every fact citing it."""

    id: str = Field(pattern=_SLUG, description="Short handle that facts cite, e.g. rp-pricing")
    url: str = Field(pattern=r"^https?://\S+$")
    title: str = Field(min_length=3)
    kind: SourceKind
    accessed: date


SourceRef = str | list[str]
"""A source id, several ids (a fact spanning several pages or platforms), ``unverified`` or ``n/a``."""


class Fact(StrictModel, Generic[T]):
    """One answerable fact: its value and the source(s) it rests on."""

    value: T
    source: SourceRef = Field(min_length=1)
    note: str | None = None


class StorageTier(StrictModel):
    """One place data can live, and whether it outlives each way a box can go away.

    None means the event does not exist there (no stop state, no spot tier) or is not documented;
    the note says which, so a missing fact is never shown as a yes or a no.
    """

    name: str
    path: str
    survives_stop: bool | None
    survives_destroy: bool | None
    survives_preemption: bool | None
    source: SourceRef = Field(min_length=1)
    note: str | None = None


class Billing(StrictModel):
    stop_compute: Fact[str]
    still_billed: Fact[str]
    stop_everything: Fact[str]
    irreversible: Fact[list[str]]
    granularity: Fact[str]
    low_balance: Fact[str]


class Storage(StrictModel):
    durable_path: Fact[str]
    stop_keeps_data: Fact[bool | None]
    tiers: list[StorageTier] = Field(min_length=1)


class Spot(StrictModel):
    available: Fact[bool]
    offering: Fact[str]
    grace_seconds: Fact[int | None]
    on_preemption: Fact[str]


class Network(StrictModel):
    ssh: Fact[str]
    ports: Fact[str]
    proxy_needed: Fact[bool]
    mirrors: Fact[str]


class Detach(StrictModel):
    tool: Fact[str]
    monitor: Fact[str]


class ScriptOverrides(StrictModel):
    """Values the scripts and launch templates read. Every key is always present; some may be null.

    Values are shell words: ``$VAR`` and ``${VAR:-default}`` are expanded on the GPU box, so a
    template must put them in double quotes, never single quotes.
    """

    durable_dir: str
    durable_dir_detect: str | None
    archive_dir: str | None
    scratch_dir: str
    hf_home: str
    env: dict[str, str]
    network_setup: str | None
    network_teardown: str | None
    detach_tool: DetachTool
    shm_size_note: str
    ssh_user: str
    ssh_port_note: str


NOT_DOCUMENTED = "not documented"
"""The value of a lifecycle fact the provider's pages (listed as its source) do not state."""


class DetectRule(StrictModel):
    """One documented sign, visible from inside the box, that it runs on this provider.

    Exactly one of ``env`` (a variable the provider sets in the box's environment) or ``file`` (a path
    it creates) is given, and the rule cites the provider page that documents it: the idle tools name
    the provider from these rules only, never from a hostname or a guess.
    """

    env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    file: str | None = Field(None, pattern=r"^/\S+$")
    source: SourceRef = Field(min_length=1)
    note: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> DetectRule:
        if (self.env is None) == (self.file is None):
            raise ValueError("a detect rule names exactly one of env or file")
        return self


class BoxAction(StrictModel):
    """Stop or terminate: the command from inside the box and from the user's machine, and its effect.

    A command the provider does not document is ``not documented`` (its source then lists the pages
    read), never a guess. ``inside`` commands are shell words: ``$VAR`` is the provider's variable.
    """

    inside: Fact[str]
    outside: Fact[str]
    keeps: Fact[str]
    wipes: Fact[str]
    still_bills: Fact[str]


class Lifecycle(StrictModel):
    """What the idle tools need: how to recognise the provider from inside a box, and what stop and
    terminate do. Stop is what an idle guard may run; terminate is shown, never run."""

    detect: list[DetectRule]
    detect_note: str | None = None
    stop: BoxAction
    terminate: BoxAction


class ProfileFrontMatter(StrictModel):
    provider: str = Field(pattern=_SLUG)
    name: str
    aliases: list[str]
    kind: ProfileKind
    covers: list[str] = Field(min_length=1)
    catalog_prefix: str = Field(pattern=r"^[A-Z]+$")
    last_verified: date
    api_cli: Fact[str]
    billing: Billing
    storage: Storage
    spot: Spot
    network: Network
    detach: Detach
    script_overrides: ScriptOverrides
    lifecycle: Lifecycle
    sources: list[Source] = Field(min_length=1)

    @model_validator(mode="after")
    def _sources_resolve(self) -> ProfileFrontMatter:
        """Every cited source exists, ids are unique, and ``last_verified`` is the newest source date.

        Listing a source no fact cites is allowed: the body text and gotcha entries rest on sources too.
        """
        ids = [s.id for s in self.sources]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate source ids: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
        cited = {ref for _key, source in _citations(self) for ref in _refs(source)}
        unknown = cited - set(ids) - {UNVERIFIED, NOT_APPLICABLE}
        if unknown:
            raise ValueError(f"facts cite unknown sources: {sorted(unknown)}")
        for key, source in _citations(self):
            if isinstance(source, list) and ({UNVERIFIED, NOT_APPLICABLE} & set(source) or not source):
                raise ValueError(f"{key}: a source list holds source ids only, not unverified or n/a")
        newest = max(s.accessed for s in self.sources)
        if self.last_verified != newest:
            raise ValueError(f"last_verified {self.last_verified} must equal the newest source date {newest}")
        return self


def _facts(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Fact]]:
    """(dotted key, fact) for every Fact in the model, in declaration order."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, Fact):
            yield key, value
        elif isinstance(value, BaseModel) and not isinstance(value, ScriptOverrides):
            yield from _facts(value, f"{key}.")


def _refs(source: SourceRef) -> list[str]:
    return [source] if isinstance(source, str) else list(source)


def _citations(front: ProfileFrontMatter) -> Iterator[tuple[str, SourceRef]]:
    for key, fact in _facts(front):
        yield key, fact.source
    for tier in front.storage.tiers:
        yield f"storage.tiers[{tier.name}]", tier.source
    for rule in front.lifecycle.detect:
        yield f"lifecycle.detect[{rule.env or rule.file}]", rule.source


def schema_keys() -> list[str]:
    """Every documented front-matter key, dotted; a Fact counts as one key (its shape is documented once)."""

    def walk(model: type[BaseModel], prefix: str) -> Iterator[str]:
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            annotation = field.annotation
            is_list = getattr(annotation, "__origin__", None) is list
            inner = getattr(annotation, "__args__", (None,))[0] if is_list else None
            if isinstance(annotation, type) and issubclass(annotation, BaseModel) and not issubclass(annotation, Fact):
                yield key
                yield from walk(annotation, f"{key}.")
            elif isinstance(inner, type) and issubclass(inner, BaseModel):
                yield key
                yield from walk(inner, f"{key}[].")
            else:
                yield key

    return list(walk(ProfileFrontMatter, "")) + [f"fact.{name}" for name in Fact.model_fields]


# ---------------------------------------------------------------------------------------------
# Loading and parsing
# ---------------------------------------------------------------------------------------------


class ProfileError(ValueError):
    """A profile file that does not follow profiles/_schema.md. A bug in the skill, not bad user input."""


class GotchaRef(StrictModel):
    id: str
    title: str


@dataclass(frozen=True)
class Profile:
    front: ProfileFrontMatter
    sections: tuple[str, ...]
    gotchas: tuple[GotchaRef, ...]
    path: Path

    @property
    def name(self) -> str:
        return self.front.provider

    def source_for(self, ref: str) -> Source | None:
        return next((s for s in self.front.sources if s.id == ref), None)


_GOTCHA_HEADING = re.compile(r"^### ([A-Z]+-\d{2}) \u2014 (\S.*)$")
_CACHE: dict[Path, tuple[int, Profile]] = {}


def split_front_matter(text: str) -> tuple[str, str]:
    """(front matter YAML, body). The file must open with ``---`` and close the block with ``---``."""
    if not text.startswith("---\n"):
        raise ProfileError("must start with a '---' line opening the YAML front matter")
    end = text.find("\n---\n", 3)
    if end < 0:
        raise ProfileError("front matter is not closed by a '---' line")
    return text[4 : end + 1], text[end + 5 :]


def _headings(body: str) -> Iterator[tuple[int, str]]:
    """(level, text) of level-2 and level-3 headings outside fenced code blocks."""
    fence: str | None = None
    for line in body.splitlines():
        stripped = line.strip()
        marker = stripped[:3]
        if marker in ("```", "~~~"):
            fence = None if fence == marker else (fence or marker)
            continue
        if fence:
            continue
        if line.startswith("## "):
            yield 2, line[3:].strip()
        elif line.startswith("### "):
            yield 3, line.rstrip()


def parse_profile(text: str, path: Path) -> Profile:
    """Validate one profile's text. Raises ProfileError naming the first problem."""
    import yaml  # lazy: only profile readers pay for it

    raw_front, body = split_front_matter(text)
    try:
        data = yaml.safe_load(raw_front)
    except yaml.YAMLError as err:
        raise ProfileError(f"front matter is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ProfileError("front matter must be a YAML mapping")
    try:
        front = ProfileFrontMatter.model_validate(data)
    except ValidationError as err:
        raise ProfileError(f"front matter: {describe_validation_error(err)}") from None
    if front.provider != path.stem:
        raise ProfileError(f"provider {front.provider!r} must equal the file name {path.stem!r}")

    sections: list[str] = []
    gotchas: list[GotchaRef] = []
    for level, heading in _headings(body):
        if level == 2:
            sections.append(heading)
        elif sections and sections[-1] == GOTCHA_SECTION:
            match = _GOTCHA_HEADING.match(heading)
            if not match:
                raise ProfileError(f"gotcha heading {heading!r} is not '### {front.catalog_prefix}-NN \u2014 title'")
            if not match.group(1).startswith(f"{front.catalog_prefix}-"):
                raise ProfileError(f"gotcha {match.group(1)} must use the prefix {front.catalog_prefix}-")
            gotchas.append(GotchaRef(id=match.group(1), title=match.group(2).strip()))
    if tuple(sections) != SECTIONS:
        raise ProfileError(f"sections must be exactly {list(SECTIONS)} in that order, found {sections}")
    ids = [g.id for g in gotchas]
    if len(set(ids)) != len(ids):
        raise ProfileError(f"duplicate gotcha ids: {ids}")
    return Profile(front=front, sections=tuple(sections), gotchas=tuple(gotchas), path=path)


def load_profile(path: Path) -> Profile:
    """Parse ``path``, reusing the cached result while the file's mtime is unchanged."""
    mtime = path.stat().st_mtime_ns
    cached = _CACHE.get(path)
    if cached and cached[0] == mtime:
        return cached[1]
    try:
        profile = parse_profile(path.read_text(encoding="utf-8"), path)
    except ProfileError as err:
        raise ProfileError(f"{path.name}: {err}") from None
    _CACHE[path] = (mtime, profile)
    return profile


def profile_paths(root: Path | None = None) -> list[Path]:
    """Profile files, sorted; names starting with '_' (the schema) are documentation, not profiles."""
    directory = (root or skill_root()) / PROFILE_DIR
    return sorted(p for p in directory.glob("*.md") if not p.name.startswith("_"))


def load_profiles(root: Path | None = None) -> dict[str, Profile]:
    return {p.stem: load_profile(p) for p in profile_paths(root)}


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def resolve_provider(name: str, profiles: dict[str, Profile]) -> Profile:
    """Find a profile by name or alias ("vast", "vast.ai" → vastai). Unknown → InputError listing names."""
    import difflib  # only on a miss

    wanted = _normalise(name)
    for profile in profiles.values():
        if wanted == profile.name or wanted in (_normalise(a) for a in profile.front.aliases):
            return profile
    known = [f"{p.name} ({', '.join(p.front.aliases)})" if p.front.aliases else p.name for p in profiles.values()]
    names = {_normalise(a): p.name for p in profiles.values() for a in (p.name, *p.front.aliases)}
    near = list(dict.fromkeys(names[n] for n in difflib.get_close_matches(wanted, names, n=3, cutoff=0.6)))
    hint = f"; did you mean {' or '.join(near)}?" if near else "."
    raise InputError("provider", f"unknown provider {name!r}{hint} For any box you reach over SSH (your own "
                     "cloud VM, a university cluster, a provider without a profile) use 'generic-ssh'", allowed=known)


# ---------------------------------------------------------------------------------------------
# Question routing
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topic:
    name: str
    title: str
    patterns: tuple[str, ...]
    """Regexes, case-insensitive. ASCII words are matched on word boundaries; CJK terms anywhere."""
    fields: tuple[str, ...]
    """Dotted front-matter keys answered for this topic, in display order."""
    example: str


TOPICS: tuple[Topic, ...] = (
    Topic("billing", "What stops the meter, and what keeps billing",
          (r"bill\w*", r"meter\w*", r"charg\w*", r"costs?", r"pay\w*", r"pric\w*", r"invoice\w*",
           r"money", r"spend\w*", r"expensive", "计费", "扣费", "收费", "费用"),
          ("billing.stop_compute", "billing.still_billed", "billing.stop_everything", "billing.granularity",
           "billing.low_balance"),
          "what stops billing?"),
    Topic("survival", "What survives a stop, a destroy, a preemption",
          (r"surviv\w*", r"persist\w*", r"lose", r"losing", r"lost", r"wip\w*", r"eras\w*", r"data",
           r"disks?", r"volumes?", r"storage", "数据", "保留", "丢失"),
          ("storage.stop_keeps_data", "storage.tiers"),
          "what survives a stop?"),
    Topic("teardown", "Irreversible actions",
          (r"irreversib\w*", r"destroy\w*", r"terminat\w*", r"delet\w*", r"releas\w*", r"undo\w*",
           r"permanent\w*", r"tear ?down", "释放", "销毁", "删除"),
          ("billing.irreversible", "billing.stop_everything"),
          "what cannot be undone?"),
    Topic("spot", "Spot / interruptible capacity and the warning you get",
          (r"spot", r"preempt\w*", r"interrupt\w*", r"evict\w*", r"bid\w*", r"outbid", r"grace",
           r"sigterm", r"reclaim\w*", "抢占", "竞价"),
          ("spot.available", "spot.offering", "spot.grace_seconds", "spot.on_preemption"),
          "how much warning before a spot preemption?"),
    Topic("network", "Proxies and mirrors for GitHub, PyPI and Hugging Face",
          (r"prox(y|ies)", r"mirrors?", r"china", r"chinese", r"gfw", r"hugging ?face", r"hf_endpoint",
           r"hf", r"github", r"pypi", r"pip", r"downloads?", r"slow", "代理", "镜像", "学术加速", "下载"),
          ("network.proxy_needed", "network.mirrors"),
          "huggingface downloads are slow, do I need a proxy?"),
    Topic("access", "SSH and exposed ports",
          (r"ssh", r"scp", r"sftp", r"rsync", r"ports?", r"expos\w*", r"tunnel\w*", r"firewall\w*",
           r"tensorboard", r"jupyter", r"connect\w*", r"ip", "端口"),
          ("network.ssh", "network.ports"),
          "how do I reach TensorBoard on the box?"),
    Topic("detach", "Keeping a job alive when SSH drops, and watching it",
          (r"detach\w*", r"tmux", r"screen", r"nohup", r"background", r"disconnect\w*", r"hang ?up",
           r"sighup", r"daemon\w*", r"keep (\w+ )?(alive|running)", r"drop(s|ped)?", r"monitor\w*",
           "后台", "断开", "守护"),
          ("detach.tool", "detach.monitor"),
          "how do I keep training running after SSH disconnects?"),
    Topic("paths", "Where to write checkpoints and caches",
          (r"paths?", r"director(y|ies)", r"where", r"folders?", r"checkpoints?", r"hf_home", r"cache",
           r"workspace", r"save", "路径", "目录"),
          ("storage.durable_path", "script_overrides.durable_dir", "script_overrides.archive_dir",
           "script_overrides.scratch_dir", "script_overrides.hf_home"),
          "where should checkpoints go?"),
    Topic("shm", "Shared memory (/dev/shm) for DataLoader workers",
          (r"shm", r"shared memory", r"bus error", r"dataloader"),
          ("script_overrides.shm_size_note",),
          "how big is /dev/shm?"),
    Topic("api", "API and command-line tools",
          (r"api", r"cli", r"command[- ]line", r"sdk", r"automat\w*", r"programmatic\w*"),
          ("api_cli",),
          "is there a CLI to stop instances?"),
)
_TOPICS_BY_NAME = {t.name: t for t in TOPICS}


def _compiled(pattern: str) -> re.Pattern[str]:
    bounded = pattern.isascii()
    return re.compile(rf"(?<![\w]){pattern}(?![\w])" if bounded else pattern, re.IGNORECASE)


_TOPIC_RES = {t.name: [_compiled(p) for p in t.patterns] for t in TOPICS}


def route_question(question: str) -> list[str]:
    """Topic names the question is about, most keyword hits first; empty when nothing matches."""
    scores = {name: sum(len(rx.findall(question)) for rx in res) for name, res in _TOPIC_RES.items()}
    order = [t.name for t in TOPICS]
    return sorted((n for n, s in scores.items() if s), key=lambda n: (-scores[n], order.index(n)))


# ---------------------------------------------------------------------------------------------
# Answers
# ---------------------------------------------------------------------------------------------


class AnswerRow(StrictModel):
    provider: str
    topic: str
    fact: str = Field(description="Dotted front-matter key, e.g. billing.stop_compute")
    answer: str
    status: Status
    as_of: date | None = Field(description="When the cited source was read (the oldest, if several); null when "
                               "unverified, n/a or config")
    source_urls: list[str] = Field(default_factory=list)


class TopicInfo(StrictModel):
    name: str
    title: str
    facts: list[str]
    example: str


class ProviderSummary(StrictModel):
    provider: str
    name: str
    kind: str
    aliases: list[str]
    covers: list[str]
    last_verified: date
    file: str
    fact_status: dict[str, int] = Field(description="How many facts are verified, reported, unverified, n/a")


class ProviderInfoInput(StrictModel):
    provider: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Profile name or alias: runpod, lambda, autodl, vastai (vast, vast.ai), paperspace, "
        "china (other Chinese platforms), generic-ssh (ssh, slurm, kubernetes), local (own box). "
        "Omit to compare all providers.",
        examples=["runpod", "vast.ai"],
    )
    question: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="Free-text question, e.g. 'what stops billing', 'what survives a stop', 'spot grace period', "
        "'do I need a proxy for huggingface', 'how to keep training after SSH drops'. Routed by keywords "
        "to fact fields; an unrecognised question lists the topics that can be compared.",
        examples=["what stops billing?"],
    )


class ProviderInfo(StrictModel):
    mode: Literal["index", "profile", "compare", "answer", "unrouted"]
    message: str
    provider: str | None = None
    question: str | None = None
    matched_topics: list[str] = Field(default_factory=list)
    rows: list[AnswerRow] = Field(default_factory=list)
    profile: ProfileFrontMatter | None = None
    sections: list[str] = Field(default_factory=list)
    gotchas: list[GotchaRef] = Field(default_factory=list)
    providers: list[ProviderSummary] = Field(default_factory=list)
    topics: list[TopicInfo] = Field(default_factory=list)
    file: str | None = None


def _lookup(front: ProfileFrontMatter, key: str) -> Any:
    value: Any = front
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _text(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return "; ".join(_text(v) for v in value)
    return str(value)


def _status(profile: Profile, ref: SourceRef) -> tuple[Status, date | None, list[str]]:
    """Verified only when every cited source is official; dated by the oldest one (the weakest link)."""
    if ref == UNVERIFIED:
        return "unverified", None, []
    if ref == NOT_APPLICABLE:
        return "n/a", None, []
    sources = [profile.source_for(r) for r in _refs(ref)]
    assert all(sources)  # guaranteed by ProfileFrontMatter._sources_resolve
    kinds = {s.kind for s in sources if s}
    status: Status = "verified" if kinds == {"official"} else "reported"
    return status, min(s.accessed for s in sources if s), [s.url for s in sources if s]


def _survival(tier: StorageTier) -> str:
    def word(flag: bool | None) -> str:
        return {True: "kept", False: "LOST", None: "n/a"}[flag]

    text = (f"{tier.name} ({tier.path}): stop {word(tier.survives_stop)}, destroy {word(tier.survives_destroy)}, "
            f"preemption {word(tier.survives_preemption)}")
    return f"{text}. {tier.note}" if tier.note else text


def rows_for(profile: Profile, topic: Topic) -> list[AnswerRow]:
    """The rows answering ``topic`` from one profile, each with its verification status and date."""
    rows = []
    for key in topic.fields:
        value = _lookup(profile.front, key)
        if key == "storage.tiers":
            for tier in value:
                status, as_of, urls = _status(profile, tier.source)
                rows.append(AnswerRow(provider=profile.name, topic=topic.name, fact=f"storage.tiers[{tier.name}]",
                                      answer=_survival(tier), status=status, as_of=as_of, source_urls=urls))
        elif isinstance(value, Fact):
            status, as_of, urls = _status(profile, value.source)
            answer = _text(value.value) + (f" ({value.note})" if value.note else "")
            rows.append(AnswerRow(provider=profile.name, topic=topic.name, fact=key, answer=answer,
                                  status=status, as_of=as_of, source_urls=urls))
        else:  # a script_overrides value: the skill's setting, not a provider fact
            rows.append(AnswerRow(provider=profile.name, topic=topic.name, fact=key, answer=_text(value),
                                  status="config", as_of=None))
    return rows


def _summary(profile: Profile, root: Path) -> ProviderSummary:
    counts: dict[str, int] = {}
    for _key, ref in _citations(profile.front):
        status = _status(profile, ref)[0]
        counts[status] = counts.get(status, 0) + 1
    f = profile.front
    return ProviderSummary(provider=f.provider, name=f.name, kind=f.kind, aliases=f.aliases, covers=f.covers,
                           last_verified=f.last_verified, file=profile.path.relative_to(root).as_posix(),
                           fact_status=counts)


def _topic_infos() -> list[TopicInfo]:
    return [TopicInfo(name=t.name, title=t.title, facts=list(t.fields), example=t.example) for t in TOPICS]


def _unique(rows: list[AnswerRow]) -> list[AnswerRow]:
    """Drop repeats of a (provider, fact) pair: topics share fields (teardown reuses stop_everything)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for row in rows:
        if (row.provider, row.fact) not in seen:
            seen.add((row.provider, row.fact))
            out.append(row)
    return out


def _related_gotchas(profile: Profile, topics: list[str]) -> list[GotchaRef]:
    res = [rx for name in topics for rx in _TOPIC_RES[name]]
    return [g for g in profile.gotchas if any(rx.search(g.title) for rx in res)]


def provider_info(args: ProviderInfoInput, progress: Progress, root: Path | None = None) -> ProviderInfo:
    root = (root or skill_root()).resolve()
    profiles = load_profiles(root)
    chosen = resolve_provider(args.provider, profiles) if args.provider else None
    scope = [chosen] if chosen else list(profiles.values())

    if args.question is None and chosen is None:
        return ProviderInfo(mode="index", message=f"{len(profiles)} provider profiles; pass provider and/or question",
                            providers=[_summary(p, root) for p in scope], topics=_topic_infos())

    if args.question is None:
        assert chosen is not None
        rows = _unique([row for topic in TOPICS for row in rows_for(chosen, topic)])
        return ProviderInfo(mode="profile", message=f"{chosen.front.name}: last verified {chosen.front.last_verified}",
                            provider=chosen.name, rows=rows, profile=chosen.front, sections=list(chosen.sections),
                            gotchas=list(chosen.gotchas), file=chosen.path.relative_to(root).as_posix())

    topics = route_question(args.question)
    if not topics:
        listing = ", ".join(f"{t.name} ({t.example})" for t in TOPICS)
        return ProviderInfo(mode="unrouted", provider=chosen.name if chosen else None, question=args.question,
                            message=f"No fact field matches this question. Topics that can be compared: {listing}",
                            topics=_topic_infos())

    rows = _unique([row for name in topics for p in scope for row in rows_for(p, _TOPICS_BY_NAME[name])])
    if chosen:
        return ProviderInfo(mode="answer", provider=chosen.name, question=args.question, matched_topics=topics,
                            rows=rows, gotchas=_related_gotchas(chosen, topics),
                            message=f"{chosen.front.name}: {', '.join(_TOPICS_BY_NAME[t].title for t in topics)}",
                            file=chosen.path.relative_to(root).as_posix())
    return ProviderInfo(mode="compare", question=args.question, matched_topics=topics, rows=rows,
                        message=f"{len(scope)} providers compared on: {', '.join(topics)}")


# ---------------------------------------------------------------------------------------------
# CLI rendering
# ---------------------------------------------------------------------------------------------

_WRAP = 64


def _wrapped(rows: list[list[str]], wrap_col: int) -> list[list[str]]:
    """Split the long column over several lines so the table stays readable in a terminal."""
    out: list[list[str]] = []
    for row in rows:
        lines = textwrap.wrap(row[wrap_col], _WRAP) or [""]
        out.append([*row[:wrap_col], lines[0], *row[wrap_col + 1 :]])
        out.extend(["" if i != wrap_col else line for i in range(len(row))] for line in lines[1:])
    return out


def _fact_table(rows: list[AnswerRow], with_provider: bool) -> str:
    headers = (["provider"] if with_provider else []) + ["fact", "answer", "status", "as of"]
    body = [([r.provider] if with_provider else []) + [r.fact, r.answer, r.status, str(r.as_of or "-")]
            for r in rows]
    return format_table(headers, _wrapped(body, 2 if with_provider else 1))


def render(info: ProviderInfo) -> str:
    if info.mode == "index":
        table = format_table(
            ["provider", "name", "kind", "last verified", "facts (verified/reported/unverified)", "file"],
            [[p.provider, p.name, p.kind, p.last_verified,
              f"{p.fact_status.get('verified', 0)}/{p.fact_status.get('reported', 0)}/"
              f"{p.fact_status.get('unverified', 0)}", p.file] for p in info.providers])
        examples = "rgt provider runpod   ·   rgt provider --question 'what stops billing'"
        return f"{info.message}\n\n{table}\n\nexample: {examples}"
    if info.mode == "unrouted":
        table = format_table(["topic", "compares", "example question"],
                             [[t.name, ", ".join(t.facts), t.example] for t in info.topics])
        return f"{info.message.split('.')[0]}.\n\n{table}"
    parts = [info.message + (f"  ({info.file})" if info.file else "")]
    if info.mode == "profile":
        parts.append(_fact_table(info.rows, with_provider=False))
        parts.append("sections: " + " · ".join(info.sections))
        parts.append("gotchas:\n" + "\n".join(f"  {g.id}  {g.title}" for g in info.gotchas))
        if info.profile:
            overrides = info.profile.script_overrides.model_dump()
            parts.append("script overrides:\n" + "\n".join(f"  {k}: {v}" for k, v in overrides.items()))
        return "\n\n".join(parts)
    for name in info.matched_topics:
        topic_rows = [r for r in info.rows if r.topic == name]
        parts.append(f"{_TOPICS_BY_NAME[name].title}\n{_fact_table(topic_rows, with_provider=info.mode == 'compare')}")
    if info.gotchas:
        parts.append("related gotchas:\n" + "\n".join(f"  {g.id}  {g.title}" for g in info.gotchas))
    return "\n\n".join(parts)


SPECS = [
    ToolSpec(
        name="provider_info",
        cli="provider",
        title="GPU provider facts: billing, storage survival, spot, network, detach",
        description=(
            "Answer questions about a GPU provider from the skill's provider profiles (RunPod, Lambda, "
            "AutoDL, vast.ai, Paperspace, other Chinese platforms, bare SSH/Slurm/Kubernetes, your own box). "
            "With a provider: its facts, section titles and gotcha IDs. With a question ('what stops "
            "billing', 'what survives a stop', 'spot grace', 'proxy for huggingface'): a side-by-side table "
            "across providers. Every answer carries its status (verified from the provider's own docs, "
            "reported by users, or unverified) and the date it was checked; say so when you relay it. "
            "Read-only and offline: never calls a provider API and never stops, starts or bills anything."
        ),
        input_model=ProviderInfoInput,
        output_model=ProviderInfo,
        run=provider_info,
        read_only=True,
        render_text=render,
        cli_positional="provider",
    )
]
