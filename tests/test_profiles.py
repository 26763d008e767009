"""profiles/*.md: every profile validates against the front-matter model, has the eight sections in
order and well-formed gotcha entries with sources; profiles/_schema.md documents exactly the model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from remote_gpu_trainer import providers
from remote_gpu_trainer.catalog import FIELDS as CATALOG_FIELDS
from remote_gpu_trainer.providers import (
    SECTIONS,
    ProfileError,
    load_profile,
    parse_profile,
    profile_paths,
    schema_keys,
)

from .conftest import ROOT

PROFILES = ROOT / "profiles"
EXPECTED = {
    "runpod": "RUNPOD",
    "lambda": "LAMBDA",
    "autodl": "AUTODL",
    "vastai": "VAST",
    "paperspace": "PSPACE",
    "china": "CNCLOUD",
    "generic-ssh": "GENERIC",
    "local": "LOCAL",
}
FIELD_ORDER = list(CATALOG_FIELDS)  # the catalog parser's one list of field labels, in order
REQUIRED_FIELDS = {"Symptom", "Root cause", "Fix", "Verify", "Sources"}
SOURCE_LINE = re.compile(r"^- https?://\S+ \u2014 .+\(accessed (\d{4}-\d{2}-\d{2})\)$")


def _paths() -> list[Path]:
    return profile_paths(ROOT)


def _entries(path: Path) -> dict[str, str]:
    """Gotcha id -> entry text (up to the next level-2/3 heading), read straight from the file."""
    body = providers.split_front_matter(path.read_text(encoding="utf-8"))[1]
    section = body.split("\n## Top gotchas\n", 1)[1].split("\n## ", 1)[0]
    chunks = re.split(r"^### ", section, flags=re.M)[1:]
    return {chunk.split(" ", 1)[0]: chunk for chunk in chunks}


def _fields(entry: str) -> list[tuple[str, str]]:
    """(field name, text) of each ``**Field:**`` paragraph, in order."""
    parts = re.split(r"^\*\*([A-Za-z ]+):\*\*", entry, flags=re.M)
    return [(parts[i], parts[i + 1].strip()) for i in range(1, len(parts), 2)]


def test_the_expected_profiles_exist_with_their_prefixes():
    found = {p.stem: load_profile(p).front.catalog_prefix for p in _paths()}
    assert found == EXPECTED


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_profile_validates_and_has_sections_in_order(path):
    profile = load_profile(path)
    assert profile.sections == SECTIONS
    assert profile.front.provider == path.stem
    assert 4 <= len(profile.gotchas) <= 10, [g.id for g in profile.gotchas]
    numbers = [int(g.id.rsplit("-", 1)[1]) for g in profile.gotchas]
    assert numbers == list(range(1, len(numbers) + 1)), "gotcha ids are numbered 01, 02, ... without gaps"


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_every_gotcha_has_required_fields_in_order_and_dated_sources(path):
    profile = load_profile(path)
    entries = _entries(path)
    assert list(entries) == [g.id for g in profile.gotchas]
    for gotcha_id, entry in entries.items():
        fields = _fields(entry)
        names = [name for name, _ in fields]
        assert set(names) >= REQUIRED_FIELDS, (gotcha_id, names)
        assert names == sorted(names, key=FIELD_ORDER.index), (gotcha_id, names)
        sources = dict(fields)["Sources"].splitlines()
        assert sources, f"{gotcha_id}: no sources"
        for line in sources:
            match = SOURCE_LINE.match(line.strip())
            assert match, f"{gotcha_id}: source line {line!r} lacks a URL, a note or an access date"
            assert match.group(1) <= str(profile.front.last_verified)


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_signatures_compile_and_match_their_symptom(path):
    for gotcha_id, entry in _entries(path).items():
        fields = dict(_fields(entry))
        if "Signature" not in fields:
            continue
        patterns = re.findall(r"`([^`]+)`", fields["Signature"])
        assert patterns, gotcha_id
        compiled = [re.compile(p, re.IGNORECASE) for p in patterns]
        symptom = " ".join(fields["Symptom"].split())  # a wrapped line is one line when rendered
        assert any(rx.search(symptom) for rx in compiled), f"{gotcha_id}: no signature matches the Symptom"


def _cell_flag(cell: str) -> bool | None:
    """'yes ...' -> True, 'no ...' / '**no**' -> False, anything else (n/a, not documented) -> None."""
    match = re.match(r"(yes|no)\b", cell.replace("*", "").strip().lower())
    return None if not match else match.group(1) == "yes"


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_storage_table_and_script_overrides_agree_with_front_matter(path):
    """The human sections show the same tiers, survival flags and override keys the program reads."""
    profile = load_profile(path)
    body = providers.split_front_matter(path.read_text(encoding="utf-8"))[1]
    storage = body.split("\n## Storage model\n", 1)[1].split("\n## ", 1)[0]
    table = [[c.strip() for c in line.strip().strip("|").split("|")]
             for line in storage.splitlines() if line.startswith("|")]
    header = [c.lower() for c in table[0]]
    assert header[:2] == ["tier", "path"] and header[-1] == "notes", header
    for i, column in enumerate(("survives stop", "survives destroy", "survives preemption"), start=2):
        assert header[i].startswith(column), f"{path.name}: column {i} is {header[i]!r}, not {column!r}"
    rows = {row[0]: row for row in table[2:]}
    assert list(rows) == [t.name for t in profile.front.storage.tiers], "table rows = front-matter tiers, same order"
    for tier in profile.front.storage.tiers:
        flags = [_cell_flag(cell) for cell in rows[tier.name][2:5]]
        assert flags == [tier.survives_stop, tier.survives_destroy, tier.survives_preemption], (path.name, tier.name)
    overrides = body.split("\n## Script overrides\n", 1)[1]
    for key in providers.ScriptOverrides.model_fields:
        assert f"`{key}`" in overrides, f"{path.name}: '{key}' is not explained under Script overrides"


def test_local_links_to_references_resolve():
    for path in _paths():
        for target, anchor in re.findall(r"\]\((\.\./references/[^)#\s]+)(?:#([^)\s]+))?\)", path.read_text()):
            file = (path.parent / target).resolve()
            assert file.is_file(), f"{path.name}: link to missing {target}"
            if anchor:
                ids = {m.lower() for m in re.findall(r"^### ([A-Z]+-\d{2}) \u2014", file.read_text(), flags=re.M)}
                assert anchor in ids, f"{path.name}: {target}#{anchor} names no entry"


# --- the schema document and the model stay in sync ----------------------------------------------


def _documented_keys() -> set[str]:
    """First-column backticked keys of the tables in _schema.md."""
    text = (PROFILES / "_schema.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([a-z_.\[\]]+)` \|", text, flags=re.M))


def test_every_model_key_is_documented_and_every_documented_key_exists():
    model = set(schema_keys())
    documented = _documented_keys()
    assert model - documented == set(), "keys missing from profiles/_schema.md"
    assert documented - model == set(), "profiles/_schema.md documents keys the model does not have"
    assert "storage.tiers[].survives_destroy" in model and "fact.source" in model  # the walk reaches nesting


def test_schema_lists_the_sections_in_order():
    text = (PROFILES / "_schema.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\d+\. `## ([^`]+)`", text, flags=re.M)
    assert tuple(listed) == SECTIONS


def test_schema_file_is_not_loaded_as_a_profile():
    assert all(not p.name.startswith("_") for p in _paths())


# --- the validator rejects what it must (fixture profile built from a real one) ------------------


@pytest.fixture
def runpod_text() -> str:
    return (PROFILES / "runpod.md").read_text(encoding="utf-8")


def _parse(text: str, name: str = "runpod") -> providers.Profile:
    return parse_profile(text, Path(f"{name}.md"))


def test_fixture_parses_unchanged(runpod_text):
    assert _parse(runpod_text).front.catalog_prefix == "RUNPOD"


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("catalog_prefix: RUNPOD\n", "catalog_prefix: RUNPOD\nregion_notes: x\n", "region_notes"),
        ("billing:\n", "billing:\n  refunds: {value: x, source: unverified}\n", "refunds"),
        ("last_verified: 2026-11-22", "last_verified: 2026-11-01", "last_verified"),
        ("provider: runpod", "provider: runpod2", "file name"),
    ],
    ids=["unknown-top-level-key", "unknown-nested-key", "stale-last-verified", "name-mismatch"],
)
def test_bad_front_matter_is_rejected(runpod_text, old, new, complaint):
    assert old in runpod_text
    with pytest.raises(ProfileError, match=complaint):
        _parse(runpod_text.replace(old, new, 1))


def test_a_fact_citing_an_unknown_source_is_rejected(runpod_text):
    text = re.sub(r"(api_cli:\n  value: .*\n  source: )\S+", r"\1no-such-page", runpod_text, count=1)
    assert text != runpod_text
    with pytest.raises(ProfileError, match="no-such-page"):
        _parse(text)


def test_a_source_list_cannot_hide_unverified(runpod_text):
    text = re.sub(r"(api_cli:\n  value: .*\n  source: )(\S+)", r"\1[\2, unverified]", runpod_text, count=1)
    with pytest.raises(ProfileError, match="source ids only"):
        _parse(text)


def test_a_missing_section_is_rejected(runpod_text):
    text = runpod_text.replace("\n## Detach and monitor\n", "\n### Detach and monitor\n", 1)
    with pytest.raises(ProfileError, match="sections must be exactly"):
        _parse(text)


def test_reordered_sections_are_rejected(runpod_text):
    text = runpod_text.replace("\n## Network\n", "\n## Networking\n", 1)
    with pytest.raises(ProfileError, match="Networking"):
        _parse(text)


def test_a_gotcha_with_the_wrong_prefix_or_heading_is_rejected(runpod_text):
    with pytest.raises(ProfileError, match="prefix RUNPOD-"):
        _parse(runpod_text.replace("### RUNPOD-01 \u2014", "### VAST-01 \u2014", 1))
    with pytest.raises(ProfileError, match="is not"):
        _parse(runpod_text.replace("### RUNPOD-01 \u2014", "### RUNPOD-01 -", 1))


def test_headings_inside_code_fences_are_ignored(runpod_text):
    text = runpod_text.replace("\n## Network\n", "\n```\n## Not a section\n```\n\n## Network\n", 1)
    assert _parse(text).sections == SECTIONS


def test_front_matter_must_be_delimited():
    with pytest.raises(ProfileError, match="must start"):
        _parse("# no front matter\n")
    with pytest.raises(ProfileError, match="not closed"):
        _parse("---\nprovider: runpod\n")
