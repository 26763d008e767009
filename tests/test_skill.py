"""SKILL.md: valid per the Agent Skills spec and routes to every reference, profile and tool."""

from __future__ import annotations

import re
import shutil

import yaml
from skills_ref import validate

from remote_gpu_trainer.registry import all_specs

from .conftest import ROOT

SKILL = (ROOT / "SKILL.md").read_text()
FRONT, BODY = re.match(r"^---\n(.*?)\n---\n(.*)$", SKILL, re.S).groups()
META = yaml.safe_load(FRONT)


def test_skills_ref_validator_accepts_it(tmp_path):
    # The spec requires name == directory name; a clone's directory name varies, so validate a copy
    # under the name a user installs it as (what `rgt install` links).
    skill_dir = tmp_path / META["name"]
    skill_dir.mkdir()
    shutil.copy(ROOT / "SKILL.md", skill_dir / "SKILL.md")
    assert validate(skill_dir) == []


def test_front_matter_follows_our_rules():
    assert META["name"] == "remote-gpu-trainer"
    assert set(META) <= {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
    description = META["description"]
    assert 200 <= len(description) <= 1024
    assert "<" not in description and ">" not in description
    for trigger in ("FSDP", "GradScaler", "out of memory", "NCCL", "zombie", "29500", "RunPod", "AutoDL",
                    "Attempting to unscale FP16 gradients", "No inf checks were recorded"):
        assert trigger in description, trigger
    assert all(isinstance(v, str) for v in META.get("metadata", {}).values())


def test_body_is_under_500_lines():
    assert len(BODY.splitlines()) < 500


def _linked_paths() -> set[str]:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", BODY)
    spans = re.findall(r"`((?:scripts|references|profiles)/[^`\s]+)`", BODY)
    return set(links) | set(spans)


def test_every_path_named_exists():
    missing = sorted(p for p in _linked_paths() if not (ROOT / p).exists())
    assert not missing, missing


def test_every_reference_file_and_profile_is_reachable():
    named = _linked_paths()
    files = sorted(p.relative_to(ROOT).as_posix() for d in ("references", "profiles") for p in (ROOT / d).rglob("*.md"))
    unreachable = [f for f in files if f not in named]
    assert not unreachable, unreachable


def test_every_tool_the_server_exposes_is_named():
    unnamed = [s.name for s in all_specs() if not s.internal and f"`{s.name}(" not in BODY]
    assert not unnamed, unnamed


def test_destructive_tools_require_consent():
    assert "consent" in BODY and "confirm_token" in BODY
    for spec in all_specs():
        if spec.destructive:
            assert f"{spec.name}(" in BODY
