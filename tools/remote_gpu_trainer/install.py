"""``rgt install``: link the skill into an agent host and register the MCP server, idempotently.

Hosts and scopes (where each host looks, per its docs):

========  =======  ===============================  =======================================
host      scope    skill link                       MCP server registration
========  =======  ===============================  =======================================
claude    user     ~/.claude/skills/<name>          ~/.claude.json  → mcpServers
claude    project  <dir>/.claude/skills/<name>      <dir>/.mcp.json → mcpServers
gemini    user     ~/.gemini/skills/<name>          ~/.gemini/settings.json → mcpServers
gemini    project  <dir>/.gemini/skills/<name>      <dir>/.gemini/settings.json → mcpServers
========  =======  ===============================  =======================================

The link's name equals the skill's ``name`` (the Agent Skills spec requires it), whatever the
clone's directory is called. Existing files are never clobbered: a link pointing elsewhere, a real
directory in the way, or a config file that is not valid JSON is refused with the reason; other keys
in a config file are preserved, and writes are atomic.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from .models import StrictModel
from .paths import skill_root
from .tables import format_table

SKILL_NAME = "remote-gpu-trainer"
SERVER_NAME = "remote-gpu-trainer"  # no underscores: Gemini CLI splits tool names on the first "_"

Host = Literal["claude", "gemini"]
Scope = Literal["user", "project"]


class InstallAction(StrictModel):
    kind: Literal["skill-link", "mcp-config"]
    path: str
    action: Literal["created", "updated", "unchanged", "would-create", "would-update", "refused"]
    detail: str


class InstallReport(StrictModel):
    host: Host
    scope: Scope
    dry_run: bool
    actions: list[InstallAction] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(a.action != "refused" for a in self.actions)


@dataclass(frozen=True)
class _Target:
    skills_dir: Path
    config_file: Path


def _target(host: Host, scope: Scope, home: Path, project_dir: Path) -> _Target:
    base = home if scope == "user" else project_dir
    if host == "claude":
        config = home / ".claude.json" if scope == "user" else project_dir / ".mcp.json"
        return _Target(base / ".claude" / "skills", config)
    return _Target(base / ".gemini" / "skills", base / ".gemini" / "settings.json")


def server_entry(root: Path) -> dict[str, object]:
    """How a host starts the server: this environment's ``mcp`` (absolute, so no venv activation is
    needed) running this checkout's tools/server.py."""
    mcp_exe = Path(sys.executable).with_name("mcp")
    command = str(mcp_exe) if mcp_exe.exists() else (shutil.which("mcp") or "mcp")
    return {"command": command, "args": ["run", str(root / "tools" / "server.py")]}


def _link(link: Path, root: Path, dry_run: bool, force: bool) -> InstallAction:
    def act(action: str, detail: str) -> InstallAction:
        return InstallAction(kind="skill-link", path=str(link), action=action, detail=detail)

    if link.is_symlink():
        if link.resolve() == root:
            return act("unchanged", f"already links to {root}")
        if not force:
            return act("refused", f"links to {os.readlink(link)}, not {root}; pass --force to replace the link")
        if dry_run:
            return act("would-update", f"would re-point from {os.readlink(link)} to {root}")
        link.unlink()
        link.symlink_to(root, target_is_directory=True)
        return act("updated", f"re-pointed to {root}")
    if link.exists():
        return act("refused", "a real file or directory is in the way; move it aside yourself (never deleted)")
    if dry_run:
        return act("would-create", f"would link to {root}")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(root, target_is_directory=True)
    return act("created", f"links to {root}")


def _write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)


def _register(config: Path, entry: dict[str, object], dry_run: bool) -> InstallAction:
    def act(action: str, detail: str) -> InstallAction:
        return InstallAction(kind="mcp-config", path=str(config), action=action, detail=detail)

    data: dict = {}
    if config.exists():
        try:
            data = json.loads(config.read_text() or "{}")
        except json.JSONDecodeError as err:
            return act("refused", f"not valid JSON ({err}); fix it by hand, nothing was changed")
        if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
            return act("refused", "unexpected structure (top level or mcpServers is not an object); nothing changed")
    servers = data.setdefault("mcpServers", {})
    previous = servers.get(SERVER_NAME)
    if previous == entry:
        return act("unchanged", f"mcpServers.{SERVER_NAME} already registered")
    verb = "update" if previous is not None else "create"
    if dry_run:
        return act(f"would-{verb}", f"would set mcpServers.{SERVER_NAME} = {json.dumps(entry)}")
    servers[SERVER_NAME] = entry
    _write_json_atomic(config, data)
    return act(f"{verb}d", f"mcpServers.{SERVER_NAME} = {json.dumps(entry)}")


def install(host: Host, scope: Scope = "user", *, home: Path | None = None, project_dir: Path | None = None,
            root: Path | None = None, dry_run: bool = False, force: bool = False) -> InstallReport:
    root = (root or skill_root()).resolve()
    target = _target(host, scope, home or Path.home(), (project_dir or Path.cwd()).resolve())
    report = InstallReport(host=host, scope=scope, dry_run=dry_run)
    report.actions.append(_link(target.skills_dir / SKILL_NAME, root, dry_run, force))
    report.actions.append(_register(target.config_file, server_entry(root), dry_run))
    return report


def render(report: InstallReport) -> str:
    rows = [[a.kind, a.action, a.path, a.detail] for a in report.actions]
    head = f"{report.host} ({report.scope}){' — dry run, nothing changed' if report.dry_run else ''}"
    return f"{head}\n{format_table(['what', 'action', 'path', 'detail'], rows)}"
