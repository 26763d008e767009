"""Structure mode of the eval harness on a small fixture skill (tests/fixtures/evals/): every check
must fire on a deliberately broken copy, and pass on the intact one."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "evals"))

from harness.cli import main  # noqa: E402
from harness.schema import InputError, load_cases  # noqa: E402
from harness.structure import KNOWN_TOOLS, run_structure  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "evals"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A writable copy of the fixture skill, cases and calibration."""
    shutil.copytree(FIXTURES, tmp_path / "evals")
    return tmp_path / "evals"


def edit_case(work: Path, case_id: str, change) -> None:
    path = work / "cases.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        if row["id"] == case_id:
            change(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run(work: Path):
    return run_structure(work / "skill", work / "cases.jsonl", work / "calibration.jsonl")


def reasons(work: Path, case_id: str) -> str:
    line = next(li for li in run(work).lines if li.name == case_id)
    return "; ".join(line.reasons)


def test_fixture_passes(work):
    report = run(work)
    assert report.failed == 0, [str(li) for li in report.lines]
    assert report.passed == len(report.lines) == 5
    assert "note: no case refs profiles/democloud.md" in report.notes
    assert "note: no case names the tool gpu_health" in report.notes


@pytest.mark.parametrize(("change", "expected"), [
    (lambda c: c["refs"][0].update(file="references/missing.md"), "references/missing.md does not exist"),
    (lambda c: c["refs"][0]["ids"].append("DEMO-03"), "has no entry DEMO-03"),
    (lambda c: c["refs"][0]["ids"].append("DEMO-99"), "has no entry DEMO-99"),  # only inside a code fence
    (lambda c: c["refs"][0]["ids"].append("DEMOCLOUD-01"), "(it is in profiles/democloud.md)"),
    (lambda c: c["refs"][0]["grep"].append("fuser -v"), "'fuser -v' does not occur"),
    (lambda c: c["rubric"][3]["cite"][0].update(id="DEMO-02x"), "has no entry DEMO-02x"),
    (lambda c: c["rubric"][3]["cite"][0].update(file="nowhere.md"), "no single skill file matches"),
    (lambda c: c["tools"].append("free_gpu"), "'free_gpu' is not an MCP tool"),
    (lambda c: c["rubric"][0]["any"].append("(unclosed"), "does not compile"),
    (lambda c: c["rubric"][0]["any"].append("x*"), "matches the empty string"),
    (lambda c: c["rubric"][0]["any"].append("nvidia-smi"), "bleeding: point cause regex 'nvidia-smi'"),
    (lambda c: c["forbid"][0]["any"].append("Python processes"), "bleeding: forbid pkill-user"),
    (lambda c: c["rubric"][1].update(near=[["No running", "38 GiB", 40]]), "near ['No running', '38 GiB'] holds"),
    (lambda c: c["rubric"][0].update(weight=0), "'weight' = 0 is outside"),
    (lambda c: c["rubric"][0].update(colour="red"), "unknown key 'colour'"),
    (lambda c: c["rubric"][1].update(id="cause"), "duplicate id 'cause'"),
    (lambda c: c["forbid"][1].update(only_if_missing=["nope"]), "only_if_missing names unknown point 'nope'"),
    (lambda c: c.update(rubric=c["rubric"][2:3]), "needs at least one critical point or two points"),
    (lambda c: c.update(refs=[]), "at least one {file, ids, grep}"),
    (lambda c: c.update(id="Orphan_VRAM"), "not kebab-case"),
    (lambda c: c.update(pass_threshold=1.5), "outside (0.0, 1.0]"),
])
def test_each_case_check_fires(work, change, expected):
    edit_case(work, "orphan-vram", change)
    report = run(work)
    text = "\n".join(str(li) for li in report.lines)
    assert expected in text, text
    assert report.failed >= 1


def test_calibration_label_mismatch_and_missing_labels(work):
    cal = work / "calibration.jsonl"
    rows = [json.loads(li) for li in cal.read_text().splitlines()]
    rows[1]["label"] = "pass"  # the pkill answer, now claimed to pass
    rows[2]["points"] = {"verify": False}  # it does hit verify
    rows.append({"id": "ghost", "label": "pass", "answer": "x"})
    cal.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = run(work)
    lines = {li.name: li for li in report.lines}
    assert "no 'fail' answer" in "; ".join(lines["orphan-vram"].reasons)
    assert "calibration line 2 (the myth) labelled pass but scored fail: " in "; ".join(lines["orphan-vram"].reasons)
    assert "gate pkill-user" in "; ".join(lines["orphan-vram"].reasons)
    assert "point verify expected miss" in "; ".join(lines["port-in-use"].reasons)
    assert "names unknown case 'ghost'" in str(lines["structure:calibration (5 answers)"])


def test_broken_link_and_duplicate_id_in_the_skill(work):
    skill = work / "skill"
    (skill / "SKILL.md").write_text((skill / "SKILL.md").read_text() + "\n[gone](references/gone.md#x)\n")
    demo = skill / "references" / "demo.md"
    demo.write_text(demo.read_text().replace("[DEMO-01](#demo-01)", "[DEMO-01](#demo-11)")
                    + "\n### DEMO-01 — Duplicate\n\n**Symptom:** `x`\n")
    text = "\n".join(str(li) for li in run(work).lines)
    assert "references/gone.md does not exist" in text
    assert "no entry or heading #demo-11" in text
    assert "duplicate-id" in text


def test_malformed_lines_are_unusable_input(work, capsys):
    cases = work / "cases.jsonl"
    cases.write_text(cases.read_text() + "{not json}\n")
    with pytest.raises(InputError, match=r"cases\.jsonl:3: not valid JSON"):
        load_cases(cases)
    args = ["--root", str(work / "skill"), "--cases", str(cases), "--calibration", str(work / "calibration.jsonl")]
    assert main(args) == 2
    assert "cases.jsonl:3: not valid JSON" in capsys.readouterr().err
    cases.write_text('["a list"]\n')
    assert main(args) == 2
    cases.write_text('{"prompt": "no id"}\n')
    assert main(args) == 2
    assert 'cases.jsonl:1: missing or empty "id"' in capsys.readouterr().err


def test_structure_cli_prints_one_line_per_check_and_the_summary_last(work, capsys):
    args = ["--root", str(work / "skill"), "--cases", str(work / "cases.jsonl"),
            "--calibration", str(work / "calibration.jsonl")]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[PASS] orphan-vram" and out[-1] == "5 passed, 0 failed"
    edit_case(work, "port-in-use", lambda c: c["refs"][0]["ids"].append("DEMO-77"))
    assert main(args) == 1
    out = capsys.readouterr().out.splitlines()
    assert "[FAIL] port-in-use: refs: references/demo.md has no entry DEMO-77" in out
    assert out[-1] == "4 passed, 1 failed"
    assert main(["--cases", str(work / "nope.jsonl")]) == 2


def test_known_tools_match_the_contract():
    """The harness's tool list is the MCP contract; every registered tool must be in it."""
    registry = pytest.importorskip("remote_gpu_trainer.registry")
    registered = {spec.name for spec in registry.all_specs() if not spec.internal}
    assert registered <= set(KNOWN_TOOLS), registered - set(KNOWN_TOOLS)
    assert len(KNOWN_TOOLS) == len(set(KNOWN_TOOLS)) == 26


def test_shipped_cases_meet_the_issue_bar():
    """At least 60 cases, each with two or more rubric points, and every MCP tool named by one."""
    cases = load_cases(ROOT / "evals" / "cases.jsonl")
    assert len(cases) >= 60
    assert not [c.id for c in cases if len(c.rubric) < 2]
    assert set(KNOWN_TOOLS) <= {t for c in cases for t in c.tools}
    assert not [c.id for c in cases if c.problems]
