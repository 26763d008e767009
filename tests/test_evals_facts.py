"""The catalog fact check (``evals/run_evals.py facts``) against the packages installed here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "evals"))

from harness import facts  # noqa: E402

ENTRY = """# Test file

### TEST-01 — a command

**Symptom:** `boom`

**Root cause:** x.

**Fix:** run `{command}`.

**Verify:** it works.

**Sources:**
- https://github.com/huggingface/huggingface_hub/pull/3404 — x
"""


def _entry(tmp_path: Path, command: str, extra: str = ""):
    sys.path.insert(0, str(ROOT / "tools"))
    from remote_gpu_trainer import catalog

    (tmp_path / "references").mkdir(exist_ok=True)
    (tmp_path / "references" / "t.md").write_text(ENTRY.format(command=command) + extra, encoding="utf-8")
    return catalog.build_catalog(tmp_path, ["references/t.md"]).entries[0]


@pytest.fixture(scope="module")
def installed() -> dict[str, facts.Package]:
    return facts.available_packages(download=False, use_cache=False)


def test_catalog_holds_for_installed_packages(installed, tmp_path_factory) -> None:
    """Every string and command the catalog quotes is found in what is installed, named as an
    older version's, or marked external; nothing FAILs."""
    pytest.importorskip("torch")
    report, entries = facts.run_facts(ROOT, installed)
    failed = [r.line() for r in report.results if r.verdict == "FAIL"]
    assert not failed, "\n".join(failed)
    located = [r for r in report.results if r.kind == "string" and r.status == "found" and r.package == "torch"]
    assert entries > 100 and len(located) > 20


def test_removed_console_script_fails_unless_the_entry_names_the_old_version(installed, tmp_path) -> None:
    if "huggingface_hub" not in installed or installed["huggingface_hub"].version.split(".")[0] == "0":
        pytest.skip("needs huggingface_hub >= 1.0 installed")
    checker = facts.Checker(installed, tmp_path / "cache.json")
    stale = checker.check_entry(_entry(tmp_path, "huggingface-cli download gpt2 --local-dir out"))
    assert [r.status for r in stale if r.kind == "command"] == ["missing"]
    old = checker.check_entry(_entry(tmp_path, "huggingface-cli download gpt2 (before huggingface_hub 1.0)"))
    assert [r.status for r in old if r.kind == "command"] == ["old-version"]
    current = checker.check_entry(_entry(tmp_path, "hf download gpt2 --local-dir out"))
    assert [(r.verdict, r.status) for r in current if r.kind == "command"] == [("PASS", "current")]


def test_unknown_flag_and_unprinted_message_fail(installed, tmp_path) -> None:
    pytest.importorskip("torch")
    checker = facts.Checker(installed, tmp_path / "cache.json")
    flag = checker.check_entry(_entry(tmp_path, "torchrun --nproc-per-node=2 --frobnicate-ranks train.py"))
    assert [(r.verdict, r.detail.split(" not in")[0]) for r in flag if r.kind == "command"] == \
        [("FAIL", "--frobnicate-ranks")]
    results = checker.check_entry(_entry_with_signature(tmp_path, "Quux frobnication exceeded its budget"))
    assert [(r.verdict, r.status) for r in results if r.kind == "string"] == [("FAIL", "missing")]


def _entry_with_signature(tmp_path: Path, message: str):
    sys.path.insert(0, str(ROOT / "tools"))
    from remote_gpu_trainer import catalog

    body = ENTRY.format(command="true").replace("**Symptom:** `boom`",
                                                f"**Symptom:** `{message}`\n\n**Signature:** `{message}`")
    (tmp_path / "references").mkdir(exist_ok=True)
    (tmp_path / "references" / "t.md").write_text(body, encoding="utf-8")
    return catalog.build_catalog(tmp_path, ["references/t.md"]).entries[0]


def test_record_writes_and_refreshes_verified_with(tmp_path) -> None:
    (tmp_path / "references").mkdir()
    path = tmp_path / "references" / "t.md"
    path.write_text(ENTRY.format(command="x") + "\n### TEST-02 — next\n", encoding="utf-8")
    report = facts.Report({}, [facts.Result("TEST-01", "references/t.md", "record", "torch 2.13.0", "FAIL",
                                            "missing")])
    assert facts.record_versions(tmp_path, report) == ["TEST-01"]
    text = path.read_text()
    assert "**Verified with:** torch 2.13.0\n\n### TEST-02" in text
    report.results[0] = facts.Result("TEST-01", "references/t.md", "record", "torch 2.14.0", "PASS", "stale")
    facts.record_versions(tmp_path, report)
    assert path.read_text().count("**Verified with:**") == 1 and "torch 2.14.0" in path.read_text()
