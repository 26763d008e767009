"""Unit tests of the eval harness's text rules and matchers (evals/harness/text.py, scoring.py).

Each negation test comes in pairs: the same forbidden command quoted in a warning (must not be
penalised) and recommended (must be), so a rule that always says "negated" or never does fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evals"))

from harness.schema import parse_case
from harness.scoring import score_answer
from harness.text import Doc, compile_regex, normalise

PKILL = r"pkill\s+(-9\s+)?-u"


def negated(text: str, pattern: str = PKILL) -> list[bool]:
    return [h.negated for h in Doc(text).find(compile_regex(pattern))]


def make_case(rubric: list[dict], forbid: list[dict] | None = None, **extra) -> object:
    obj = {"id": "t", "prompt": "p", "tags": ["t"], "refs": [], "tools": [], "rubric": rubric,
           "forbid": forbid or [], **extra}
    case = parse_case(obj)
    assert not case.problems, case.problems
    return case


# --- normalisation ---------------------------------------------------------------------------------

def test_normalise_quotes_dashes_emphasis_and_spaces():
    assert normalise("**Don’t** run “this” — ever") == "Don't run \"this\" - ever"
    assert normalise("a\u00a0\u00a0b\u200b\tc") == "a b c"
    assert normalise("__bold__ and *em* and _em_") == "bold and em and em"


def test_normalise_keeps_code_spans_fences_and_identifiers():
    assert normalise("set `max_grad_norm` and f(**kwargs)") == "set `max_grad_norm` and f(**kwargs)"
    assert normalise("use max_grad_norm and CUDA_VISIBLE_DEVICES") == "use max_grad_norm and CUDA_VISIBLE_DEVICES"
    fenced = "```python\nx = f(**kw) * 2  # _a_ **b**\n```"
    assert normalise(fenced) == fenced.replace("  #", " #")  # only runs of spaces collapse


def test_regexes_are_case_insensitive_and_normalised():
    assert compile_regex(r"optim\w*\s*=\s*x*y").pattern == r"optim\w*\s*=\s*x*y"  # no emphasis stripping
    assert compile_regex("GRADSCALER").search("use torch.amp.GradScaler")
    assert compile_regex("Don’t").search("don't")


# --- negation: pairs of warned-against vs recommended ---------------------------------------------

@pytest.mark.parametrize("text", [
    "Never run `pkill -9 -u $USER python`; use reap_vram_zombies(dry_run=true).",
    "Don't do pkill -u me here.",
    "**Do not** use `pkill -9 -u $USER python` on a shared box.",
    "Avoid pkill -u me: it kills other users' jobs.",
    "Run the dry run instead of pkill -u me.",
    "There is no need to pkill -u me.",
    "Stop using pkill -u me.",
    "I'd warn against pkill -u me.",
    "It is dangerous to pkill -u me on shared nodes.",
    "Never kill by pattern, e.g. pkill -u me.",
    "Never reset or kill everything (pkill -u me) on a shared box.",
    "`pkill -9 -u $USER python` is dangerous here.",
    "`pkill -u me` does not fix the cause.",
    "`pkill -u me` kills every job you own.",
    "pkill -u me   # never do this",
    "Do not run any of these:\n- killall python\n- pkill -u me",
    "Don't do this:\n\n```bash\npkill -9 -u $USER python\n```",
    "Bad:\n```bash\npkill -9 -u $USER python\n```",
    "```bash\n# don't:\npkill -9 -u $USER python\n```",
    "### What not to do\n- pkill -u me",
    "Never do this: pkill -u me.",
    "Don't run the following: pkill -u me.",
    "❌ pkill -u me",
])
def test_warnings_are_negated(text):
    assert negated(text) and all(negated(text)), text


@pytest.mark.parametrize("text", [
    "Just run `pkill -9 -u $USER python` to clear it.",
    "Run pkill -u me, then relaunch.",
    "Don't forget to run pkill -u me first.",
    "Instead of rebooting, run pkill -u me.",
    "Rather than waiting, pkill -u me.",
    "Don't panic; pkill -u me will clear it.",
    "Don't reboot - pkill -u me instead.",
    "If that does not help, pkill -u me.",
    "Don't wait, but pkill -u me right away.",
    "Never mind the warning. pkill -u me.",
    "Run this:\n\n```bash\npkill -9 -u $USER python\n```",
    "Steps:\n- check nvidia-smi\n- pkill -u me",
    "Not the cause: disk space.\npkill -u me fixes it.",
    "Look without killing: pkill -u me.",
    "You don't need a fixed port at all: pkill -u me.",
    "Use the dry run (not the force flag) and pkill -u me afterwards.",
])
def test_recommendations_are_not_negated(text):
    assert negated(text) and not any(negated(text)), text


def test_negation_window_is_limited():
    far = "Never use fp16 " + "with a long explanation about many other things that go on " * 2 + "and pkill -u me"
    assert negated(far) == [False]
    near = "Never, on a box that others share, pkill -u me"
    assert negated(near) == [True]


def test_post_negation_needs_the_match_as_subject():
    assert negated("bf16 is not supported on V100", "bf16") == [True]
    assert negated("Use bf16, it is not affected by overflow", "bf16") == [False]
    assert negated("bf16 doesn't need a GradScaler", "bf16") == [False]


# --- matchers ----------------------------------------------------------------------------------

def test_any_counts_only_asserted_matches():
    case = make_case([{"id": "sharded", "critical": True, "text": "Use ShardedGradScaler",
                       "any": ["ShardedGradScaler"]}, {"id": "x", "text": "x", "any": ["xyzzy"]}])
    good = score_answer(case, "With FSDP use ShardedGradScaler from torch.distributed.fsdp.")
    bad = score_answer(case, "Don't use ShardedGradScaler; the plain one is fine.")
    assert good.points[0].passed and good.points[0].how == "any"
    assert "ShardedGradScaler" in good.points[0].evidence
    assert not bad.points[0].passed and bad.critical_missed == ["sharded"]
    assert bad.points[0].note and "only negated" in bad.points[0].note


def test_all_needs_every_regex():
    case = make_case([{"id": "both", "text": "both", "all": ["fp32", "autocast"]},
                      {"id": "y", "text": "y", "any": ["y"]}])
    assert score_answer(case, "Keep fp32 weights and use autocast.").points[0].passed
    result = score_answer(case, "Keep fp32 weights.")
    assert not result.points[0].passed and "missing autocast" in result.points[0].note


def test_near_respects_distance_and_order():
    point = {"id": "n", "text": "n", "near": [["SIGTERM", "SIGKILL", 30]]}
    case = make_case([point, {"id": "y", "text": "y", "any": ["zzz"]}])
    assert score_answer(case, "Send SIGTERM, then SIGKILL.").points[0].passed
    assert score_answer(case, "SIGKILL only after SIGTERM.").points[0].passed  # either order
    far = "Send SIGTERM. " + "x" * 40 + " SIGKILL"
    assert not score_answer(case, far).points[0].passed
    # A keyword list far apart does not satisfy near; a negated half does not either.
    assert not score_answer(case, "Never SIGTERM, SIGKILL.").points[0].passed


def test_deny_needs_a_negated_occurrence_and_no_asserted_one():
    case = make_case([{"id": "warn", "text": "warns", "deny": [PKILL, "killall"]},
                      {"id": "y", "text": "y", "any": ["zzz"]}])
    assert score_answer(case, "Never run pkill -u me.").points[0].passed
    assert not score_answer(case, "Use reap_vram_zombies.").points[0].passed  # not mentioned at all
    mixed = score_answer(case, "Never run pkill -u me. Use killall python instead.")
    assert not mixed.points[0].passed and "asserted" in mixed.points[0].note


def test_cite_accepts_id_and_link_forms_but_not_neighbours():
    case = make_case([{"id": "c", "text": "cites", "cite": [{"file": "x.md", "id": "AMP-03"}]},
                      {"id": "y", "text": "y", "any": ["zzz"]}])
    for text in ("See AMP-03.", "see [AMP-03](references/training/precision-stability.md#amp-03)", "(amp-03)",
                 "so the loss never changes (AMP-03)."):
        assert score_answer(case, text).points[0].passed, text
    for text in ("See AMP-030.", "See XAMP-03.", "See AMP-3.", "This is not AMP-03.", "rather than the AMP-03 fix"):
        assert not score_answer(case, text).points[0].passed, text


def test_point_passes_on_any_matcher():
    case = make_case([{"id": "p", "text": "p", "any": ["bf16"], "near": [["keep", "fp32", 20]]},
                      {"id": "y", "text": "y", "any": ["zzz"]}])
    assert score_answer(case, "switch to bf16").points[0].how == "any"
    assert score_answer(case, "keep the master weights fp32").points[0].how == "near"


# --- forbid rules and the case score ---------------------------------------------------------------

def forbid_case(**forbid):
    rubric = [{"id": "fix", "weight": 3, "text": "fix", "any": ["fp32"]},
              {"id": "why", "weight": 1, "text": "why", "any": ["master weights"]}]
    return make_case(rubric, [{"id": "f", "text": "disable clipping", "any": [r"max_grad_norm\s*=\s*0"], **forbid}])


def test_forbid_penalty_is_subtracted_only_when_asserted():
    case = forbid_case()
    clean = score_answer(case, "Keep fp32 master weights.")
    assert clean.score == 1.0 and clean.passed
    warned = score_answer(case, "Keep fp32 master weights. Setting max_grad_norm=0 does not fix it.")
    assert warned.score == 1.0 and not warned.violations
    bad = score_answer(case, "Keep fp32 master weights and set max_grad_norm=0.")
    assert bad.score == 0.75 and bad.passed and bad.violations[0].id == "f"
    assert "max_grad_norm=0" in bad.violations[0].evidence


def test_gate_fails_the_case_whatever_the_score():
    result = score_answer(forbid_case(gate=True, penalty=0.1), "Keep fp32 master weights; set max_grad_norm=0.")
    assert result.score == pytest.approx(0.9) and result.gate and not result.passed
    assert any(r.startswith("gate f") for r in result.reasons())


def test_only_if_missing_applies_when_every_named_point_is_missed():
    case = forbid_case(only_if_missing=["fix"], penalty=0.5)
    with_fix = score_answer(case, "Use fp32; also max_grad_norm=0 if you like.")
    assert not with_fix.violations and with_fix.skipped_forbids == ["f"]
    alone = score_answer(case, "Set max_grad_norm=0 and keep the master weights.")
    assert [v.id for v in alone.violations] == ["f"] and alone.score == 0.0


def test_threshold_and_critical():
    rubric = [{"id": "a", "critical": True, "text": "a", "any": ["alpha"]}, {"id": "b", "text": "b", "any": ["beta"]},
              {"id": "c", "text": "c", "any": ["gamma"]}]
    case = make_case(rubric, pass_threshold=0.6)
    assert score_answer(case, "alpha beta").passed  # 2/3 ≥ 0.6
    assert not score_answer(case, "alpha").passed  # 1/3
    missed_critical = score_answer(case, "beta gamma")
    assert missed_critical.score == pytest.approx(0.6667, abs=1e-4) and not missed_critical.passed
    assert missed_critical.critical_missed == ["a"]


def test_score_is_clamped_at_zero():
    case = make_case([{"id": "a", "text": "a", "any": ["alpha"]}, {"id": "b", "text": "b", "any": ["beta"]}],
                     [{"id": "x", "text": "x", "any": ["bad"], "penalty": 1.0}])
    assert score_answer(case, "bad").score == 0.0


class FakeSemantic:
    def __init__(self, cos: float):
        self.cos = cos

    def best(self, gloss, doc):
        return self.cos, "a paraphrase"


def test_semantic_gives_half_credit_to_eligible_points_only():
    rubric = [{"id": "crit", "critical": True, "text": "c", "any": ["alpha"]},
              {"id": "soft", "text": "s", "any": ["beta"], "sem_threshold": 0.5},
              {"id": "warn", "text": "w", "deny": ["pkill"]},
              {"id": "off", "text": "o", "any": ["gamma"], "semantic": False}]
    case = make_case(rubric, [{"id": "f", "text": "f", "any": ["delta"]}])
    result = score_answer(case, "nothing matches, delta", FakeSemantic(0.9))
    credit = {p.id: p.credit for p in result.points}
    assert credit == {"crit": 0.0, "soft": 0.5, "warn": 0.0, "off": 0.0}
    assert result.points[1].how == "semantic" and not result.points[1].passed
    assert [v.id for v in result.violations] == ["f"]  # forbids are never semantic
    low = score_answer(case, "nothing", FakeSemantic(0.4))
    assert all(p.credit == 0 for p in low.points)
