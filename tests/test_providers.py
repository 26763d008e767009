"""provider_info / `rgt provider`: provider aliases, question routing, comparison rows with their
verification status, the MCP tool and the CLI table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.errors import InputError
from remote_gpu_trainer.providers import (
    TOPICS,
    ProviderInfoInput,
    load_profile,
    load_profiles,
    provider_info,
    resolve_provider,
    route_question,
)

from .conftest import ROOT, call_error, call_ok

ALL = {"autodl", "china", "generic-ssh", "lambda", "local", "paperspace", "runpod", "vastai"}


def ask(provider: str | None = None, question: str | None = None, root: Path = ROOT):
    return provider_info(ProviderInfoInput(provider=provider, question=question), lambda *a: None, root=root)


# --- routing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "topic"),
    [
        ("what stops billing?", "billing"),
        ("am I still charged for the disk when the meter is off", "billing"),
        ("what survives a stop?", "survival"),
        ("will I lose data if the box goes away", "survival"),
        ("spot grace period", "spot"),
        ("what happens when an interruptible instance is preempted", "spot"),
        ("huggingface downloads are slow, do I need a proxy or mirror", "network"),
        ("pip install from China", "network"),
        ("keep training alive in tmux after SSH drops", "detach"),
        ("what is irreversible", "teardown"),
        ("where should checkpoints go", "paths"),
        ("DataLoader bus error, how big is shm", "shm"),
        ("is there a CLI", "api"),
        ("关机后还扣费吗", "billing"),
        ("释放实例后数据会丢失吗", "survival"),
        ("需要学术加速吗", "network"),
    ],
)
def test_questions_route_to_the_right_topic_first(question, topic):
    assert route_question(question)[0] == topic


def test_routing_uses_word_boundaries():
    # "ip" must not fire inside "pipeline", "spot" not inside "hotspot", "hf" not inside "shelf"
    assert route_question("pipeline hotspot on the shelf") == []


def test_every_topic_field_exists_in_every_profile():
    for profile in load_profiles(ROOT).values():
        for topic in TOPICS:
            for key in topic.fields:
                value = profile.front
                for part in key.split("."):
                    value = getattr(value, part)  # AttributeError = a topic routes to a field that does not exist


# --- providers and aliases ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "name"),
    [("vast", "vastai"), ("vast.ai", "vastai"), ("VastAI", "vastai"), ("RunPod", "runpod"), ("k8s", "generic-ssh"),
     ("slurm", "generic-ssh"), ("lambda labs", "lambda"), ("own box", "local"), ("pai-dsw", "china")],
)
def test_aliases_resolve(alias, name):
    assert resolve_provider(alias, load_profiles(ROOT)).name == name


def test_unknown_provider_is_an_input_error_listing_the_known_ones():
    with pytest.raises(InputError) as exc:
        ask("coreweave-ish")
    assert exc.value.field == "provider"
    assert {entry.split(" ")[0] for entry in exc.value.allowed} == ALL


def test_aliases_are_unique_across_profiles():
    seen: dict[str, str] = {}
    for profile in load_profiles(ROOT).values():
        for name in [profile.name, *profile.front.aliases]:
            assert name not in seen, f"{name} is claimed by {seen.get(name)} and {profile.name}"
            seen[name] = profile.name


# --- the four modes ---------------------------------------------------------------------------


def test_no_arguments_lists_every_provider_with_fact_counts():
    info = ask()
    assert info.mode == "index"
    assert {p.provider for p in info.providers} == ALL
    runpod = next(p for p in info.providers if p.provider == "runpod")
    assert runpod.file == "profiles/runpod.md" and runpod.fact_status["verified"] > 0
    assert {t.name for t in info.topics} == {t.name for t in TOPICS}


def test_provider_only_returns_its_facts_sections_and_gotchas():
    info = ask("vast.ai")
    assert info.mode == "profile" and info.provider == "vastai"
    assert info.profile is not None and info.profile.catalog_prefix == "VAST"
    assert info.sections[0] == "Launch" and info.sections[-1] == "Script overrides"
    assert [g.id for g in info.gotchas][:2] == ["VAST-01", "VAST-02"]
    facts = {r.fact for r in info.rows}
    assert {"billing.stop_compute", "spot.grace_seconds", "network.proxy_needed", "detach.tool"} <= facts


def test_question_only_compares_every_provider_with_status_and_date():
    info = ask(question="what stops billing")
    assert info.mode == "compare" and info.matched_topics[0] == "billing"
    stop_rows = {r.provider: r for r in info.rows if r.fact == "billing.stop_compute"}
    assert set(stop_rows) == ALL
    runpod = stop_rows["runpod"]
    assert runpod.status == "verified" and runpod.as_of is not None and runpod.source_urls
    assert stop_rows["local"].status == "n/a" and stop_rows["local"].as_of is None
    low_balance = {r.provider: r.status for r in info.rows if r.fact == "billing.low_balance"}
    assert "unverified" in low_balance.values()  # the table shows what nobody could check


def test_status_follows_the_kind_of_source():
    """A fact resting on a user report is 'reported', never 'verified'."""
    profiles = load_profiles(ROOT)
    for row in ask(question="what survives a stop, and spot, proxy, tmux, billing").rows:
        if row.status in ("verified", "reported"):
            profile = profiles[row.provider]
            kinds = {s.kind for s in profile.front.sources if s.url in row.source_urls}
            assert (row.status == "verified") == (kinds == {"official"}), row


def test_survival_rows_spell_out_each_event():
    info = ask("runpod", "what survives a stop or a terminate")
    assert info.mode == "answer" and info.provider == "runpod"
    tiers = {r.fact: r.answer for r in info.rows if r.fact.startswith("storage.tiers[")}
    assert "stop kept, destroy LOST" in tiers["storage.tiers[volume disk]"]
    assert "destroy kept" in tiers["storage.tiers[network volume]"]


def test_provider_and_question_answers_for_that_provider_only_with_related_gotchas():
    info = ask("autodl", "huggingface is slow, proxy?")
    assert {r.provider for r in info.rows} == {"autodl"}
    assert info.matched_topics[0] == "network"
    assert next(r for r in info.rows if r.fact == "network.proxy_needed").answer.startswith("yes")
    assert all(g.id.startswith("AUTODL-") for g in info.gotchas)


def test_script_override_rows_are_config_not_provider_claims():
    info = ask(question="where should checkpoints go")
    rows = [r for r in info.rows if r.fact == "script_overrides.durable_dir"]
    assert len(rows) == len(ALL) and {r.status for r in rows} == {"config"}
    assert next(r for r in rows if r.provider == "runpod").answer == "/workspace"


def test_unknown_question_lists_the_topics_instead_of_failing():
    info = ask(question="what colour is the logo")
    assert info.mode == "unrouted" and not info.rows
    assert "billing" in info.message and {t.name for t in info.topics} == {t.name for t in TOPICS}


# --- caching ------------------------------------------------------------------------------------


def test_profiles_are_reread_when_the_file_changes(tmp_path):
    (tmp_path / "profiles").mkdir()
    copy = tmp_path / "profiles" / "runpod.md"
    shutil.copy(ROOT / "profiles" / "runpod.md", copy)
    first = load_profile(copy)
    assert load_profile(copy) is first  # unchanged file: cached object
    copy.write_text(copy.read_text().replace("name: RunPod", "name: RunPod (edited)", 1))
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert load_profile(copy).front.name == "RunPod (edited)"
    assert ask("runpod", root=tmp_path).message.startswith("RunPod (edited)")


# --- MCP and CLI --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_mcp_tool_compares_providers(client):
    data = await call_ok(client, "provider_info", {"question": "what survives a stop?"})
    assert data["mode"] == "compare"
    assert {r["provider"] for r in data["rows"]} == ALL
    assert all(r["status"] in ("verified", "reported", "unverified", "n/a", "config") for r in data["rows"])


@pytest.mark.anyio
async def test_mcp_tool_is_read_only_and_rejects_unknown_provider(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert tools["provider_info"].annotations.read_only_hint is True
    text = await call_error(client, "provider_info", {"provider": "nope"})
    assert "provider" in text and "runpod" in text


def test_cli_positional_provider_prints_a_table(capsys):
    assert cli.main(["provider", "runpod"]) == 0
    out = capsys.readouterr().out
    assert "billing.stop_compute" in out and "RUNPOD-01" in out and "durable_dir: /workspace" in out


def test_cli_question_table_and_json(capsys):
    assert cli.main(["provider", "--question", "what stops billing"]) == 0
    out = capsys.readouterr().out
    assert "provider" in out.splitlines()[3] and "vastai" in out and "unverified" in out
    assert cli.main(["provider", "vast", "--question", "spot grace", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["provider"] == "vastai" and data["matched_topics"] == ["spot"]


def test_cli_unknown_provider_exits_2(capsys):
    assert cli.main(["provider", "nope"]) == 2
    assert "unknown provider" in capsys.readouterr().err


def test_importing_the_tool_does_not_import_yaml():
    code = "import remote_gpu_trainer.providers, sys; print('yaml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_fact_shared_by_two_topics_is_listed_once():
    rows = ask("runpod").rows
    keys = [r.fact for r in rows]
    assert len(keys) == len(set(keys)) and "billing.stop_everything" in keys
    compare = ask(question="what stops billing and what is irreversible").rows
    pairs = [(r.provider, r.fact) for r in compare]
    assert len(pairs) == len(set(pairs))
