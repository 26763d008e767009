"""`rgt install` and the host manifests: exact links and config, idempotent, never clobbering."""

from __future__ import annotations

import json
import os
import tomllib

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer.install import SERVER_NAME, SKILL_NAME, install, server_entry

from .conftest import ROOT


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _tree(base):
    return sorted(str(p.relative_to(base)) for p in base.rglob("*"))


@pytest.mark.parametrize(("host", "scope", "link", "config"), [
    ("claude", "user", "home/.claude/skills/remote-gpu-trainer", "home/.claude.json"),
    ("claude", "project", "proj/.claude/skills/remote-gpu-trainer", "proj/.mcp.json"),
    ("gemini", "user", "home/.gemini/skills/remote-gpu-trainer", "home/.gemini/settings.json"),
    ("gemini", "project", "proj/.gemini/skills/remote-gpu-trainer", "proj/.gemini/settings.json"),
])
def test_install_creates_exactly_the_link_and_config_and_is_idempotent(tmp_path, home, host, scope, link, config):
    proj = tmp_path / "proj"
    proj.mkdir()
    first = install(host, scope, project_dir=proj)
    assert [a.action for a in first.actions] == ["created", "created"]
    link_path, config_path = tmp_path / link, tmp_path / config
    assert link_path.is_symlink() and link_path.resolve() == ROOT
    assert json.loads(config_path.read_text()) == {"mcpServers": {SERVER_NAME: server_entry(ROOT)}}
    created = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink()}
    assert created == {link, config}
    before = _tree(tmp_path)
    again = install(host, scope, project_dir=proj)
    assert [a.action for a in again.actions] == ["unchanged", "unchanged"]
    assert _tree(tmp_path) == before


def test_dry_run_changes_nothing(tmp_path, home):
    report = install("claude", "user", dry_run=True)
    assert [a.action for a in report.actions] == ["would-create", "would-create"]
    assert _tree(home) == []


def test_other_config_keys_are_preserved(home):
    config = home / ".gemini" / "settings.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"theme": "dark", "mcpServers": {"other": {"command": "x"}}}))
    install("gemini", "user")
    data = json.loads(config.read_text())
    assert data["theme"] == "dark" and data["mcpServers"]["other"] == {"command": "x"}
    assert SERVER_NAME in data["mcpServers"]


def test_invalid_json_config_is_refused_untouched(home):
    config = home / ".claude.json"
    config.write_text("{not json")
    report = install("claude", "user")
    assert not report.ok
    assert report.actions[1].action == "refused"
    assert config.read_text() == "{not json"


def test_a_real_directory_in_the_way_is_never_deleted(home):
    in_the_way = home / ".claude" / "skills" / SKILL_NAME
    in_the_way.mkdir(parents=True)
    (in_the_way / "mine.txt").write_text("keep")
    report = install("claude", "user")
    assert report.actions[0].action == "refused"
    assert (in_the_way / "mine.txt").read_text() == "keep"


def test_foreign_link_needs_force(tmp_path, home):
    link = home / ".claude" / "skills" / SKILL_NAME
    link.parent.mkdir(parents=True)
    os.symlink(tmp_path, link)
    assert install("claude", "user").actions[0].action == "refused"
    assert install("claude", "user", force=True).actions[0].action == "updated"
    assert link.resolve() == ROOT


def test_cli_install_json_and_exit_codes(home, capsys):
    assert cli.main(["install", "--gemini", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["host"] == "gemini" and report["scope"] == "user"
    (home / ".claude.json").write_text("[]")
    assert cli.main(["install", "--claude"]) == 1  # refused: unexpected structure


def test_manifests_parse_and_point_at_the_server():
    mcp_json = json.loads((ROOT / ".mcp.json").read_text())["mcpServers"][SERVER_NAME]
    assert mcp_json["args"] == ["run", "tools/server.py"]  # a project server runs in the project dir
    gemini = json.loads((ROOT / "gemini-extension.json").read_text())
    assert "_" not in next(iter(gemini["mcpServers"]))
    assert gemini["mcpServers"][SERVER_NAME]["args"][-1] == "${extensionPath}/tools/server.py"
    assert (ROOT / gemini["contextFileName"]).is_file()
    assert (ROOT / "tools" / "server.py").is_file()


def test_the_claude_plugin_is_defined_by_its_marketplace_entry_alone():
    """Claude Code 2.1.197, tried for real: with a .claude-plugin/plugin.json at the root, a
    ~/.claude/skills link to this checkout (what `rgt install --claude` makes) loads as a plugin
    and starts a second, failing copy of the server; plugin.json beside a marketplace entry that
    names components fails to load ("conflicting manifests"); and ${CLAUDE_PLUGIN_ROOT:-.} in the
    plugin's .mcp.json expanded to ".". So: no plugin.json, one strict:false marketplace entry with
    the server inline under ${CLAUDE_PLUGIN_ROOT}."""
    assert not (ROOT / ".claude-plugin" / "plugin.json").exists()
    marketplace = json.loads((ROOT / ".claude-plugin" / "marketplace.json").read_text())
    (entry,) = marketplace["plugins"]
    assert entry["name"] == SKILL_NAME and entry["source"] == "./" and entry["strict"] is False
    assert entry["mcpServers"][SERVER_NAME]["args"] == ["run", "${CLAUDE_PLUGIN_ROOT}/tools/server.py"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    gemini = json.loads((ROOT / "gemini-extension.json").read_text())
    assert entry["version"] == gemini["version"] == version
