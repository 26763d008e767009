"""The catalog check of ``run_evals.py verify``: every cpu Verify runs on its failure and its fix and
must tell them apart; every figure an entry states is recomputed by the project's tools."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "evals"))
sys.path.insert(0, str(ROOT / "tools"))

from harness import verify  # noqa: E402
from harness.scenarios import run_scenarios  # noqa: E402

from remote_gpu_trainer import catalog  # noqa: E402

FIXTURES = ROOT / "evals" / "verify" / "fixtures"


def _skill_copy(tmp_path: Path) -> Path:
    """A copy of the skill's markdown (what the catalog parser reads) to edit in a test."""
    for name in ("references", "profiles"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "SKILL.md", tmp_path / "SKILL.md")
    return tmp_path


def _replace_entry(root: Path, rel: str, entry_id: str, text: str) -> None:
    path = root / rel
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"### {entry_id} \u2014 "))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("### ") or lines[i].startswith("## "))
    path.write_text("".join(lines[:start]) + text.rstrip() + "\n\n" + "".join(lines[end:]), encoding="utf-8")


# ------------------------------------------------------------------------------------------------
# the whole catalog (what CI checks)


def test_every_cpu_verify_tells_the_failure_from_the_fix() -> None:
    """All cpu scenarios: the Verify reports the failure, and after the fix reports it fixed."""
    pytest.importorskip("torch")
    entries = verify.load_entries(ROOT)
    cpu = [e.id for e in entries if e.verify_on == "cpu"]
    assert len(cpu) >= 5
    outcomes = run_scenarios(ROOT, cpu, jobs=3)
    failed = [o.line() for o in outcomes if not o.ok]
    assert not failed, "\n".join(failed)
    assert {o.entry for o in outcomes} == set(cpu)


def test_every_stated_number_holds_by_the_tools() -> None:
    lines = verify.check_numbers(verify.load_entries(ROOT))
    failed = [str(ln) for ln in lines if not ln.ok]
    assert not failed, "\n".join(failed)
    assert any("OOM-07" in ln.text and "total_bytes" in ln.text for ln in lines)


def test_no_scenario_without_an_entry_and_every_kind_is_known() -> None:
    entries = verify.load_entries(ROOT)
    assert verify.orphan_scenarios(entries) == []
    assert set(verify.needs(entries)) <= set(catalog.VERIFY_ON) and verify.unclassified(entries) == []


def test_an_entry_without_verify_on_fails_the_check(tmp_path: Path) -> None:
    root = _skill_copy(tmp_path)
    path = root / "references" / "monitoring_patterns.md"
    text = path.read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith("**Verify on:**"))
    path.write_text(text.replace(line + "\n", "", 1), encoding="utf-8")
    report = verify.run_verify(root, scenarios=False)
    assert [ln.text.split(":")[0] for ln in report.unclassified] == [
        e.id for e in verify.load_entries(root) if not e.verify_on] and len(report.unclassified) == 1
    assert report.failed == 1 and "no **Verify on:**" in str(report.unclassified[0])


# ------------------------------------------------------------------------------------------------
# a Verify that cannot fail is rejected


def test_dist06_old_report_is_rejected_because_it_cannot_fail(tmp_path: Path) -> None:
    """DIST-06's report before issue 29 divided a rank's bytes by the all-reduced sum: 1/N under DDP too."""
    pytest.importorskip("torch")
    root = _skill_copy(tmp_path)
    _replace_entry(root, "references/training/distributed-launch.md", "DIST-06",
                   (FIXTURES / "DIST-06-old.md").read_text(encoding="utf-8").split("-->", 1)[1])
    old = catalog.build_catalog(root, ["references/training/distributed-launch.md"]).entry("DIST-06")
    assert old.verify_on == "cpu" and "dist.all_reduce(full)" in old.fix
    [outcome] = run_scenarios(root, ["DIST-06"], jobs=3)
    assert not outcome.ok
    assert "cannot fail" in outcome.detail, outcome.detail
    assert "ratio 0.333" in outcome.broken.outputs[0]  # DDP, every rank holds the whole model


def test_a_number_the_tool_does_not_give_fails(tmp_path: Path) -> None:
    root = _skill_copy(tmp_path)
    path = root / "references/training/oom-memory.md"
    text = path.read_text(encoding="utf-8")
    assert "`total_bytes ≈ 41.9 GiB`" in text
    path.write_text(text.replace("`total_bytes ≈ 41.9 GiB`", "`total_bytes ≈ 40.1 GiB`", 1), encoding="utf-8")
    lines = verify.check_numbers(verify.load_entries(root, ["OOM-07"]))
    bad = [ln.text for ln in lines if not ln.ok]
    assert len(bad) == 1 and "total_bytes ≈ 40.1 GiB" in bad[0] and "tool: 41.9 GiB" in bad[0]
    assert "does not state" in bad[0]  # and the prose no longer backs the figure


# ------------------------------------------------------------------------------------------------
# the parser's side: Verify on, Numbers, claims

ENTRY = """# t

### TEST-01 — a thing

**Symptom:** `boom`

**Root cause:** x uses 41.8 GiB.

**Fix:** y.

**Verify:** z.

{extra}
**Sources:**
- https://github.com/huggingface/huggingface_hub/pull/3404 — x
"""


def _parse(tmp_path: Path, extra: str) -> tuple[catalog.Entry, list[str]]:
    (tmp_path / "references").mkdir(exist_ok=True)
    (tmp_path / "references" / "t.md").write_text(ENTRY.format(extra=extra), encoding="utf-8")
    built = catalog.build_catalog(tmp_path, ["references/t.md"])
    return built.entries[0], [f"{p.rule}: {p.detail}" for p in built.problems]


@pytest.mark.parametrize(("extra", "kind", "scenario", "problem"), [
    ("**Verify on:** gpu\n", "gpu", "", None),
    ("**Verify on:** provider — the billing page\n", "provider", "", None),
    ("**Verify on:** cpu — `evals/verify/TEST-01.py` builds both\n", "cpu", "evals/verify/TEST-01.py", None),
    ("**Verify on:** cpu\n", "cpu", "", "`cpu` names its scenario"),
    ("**Verify on:** cpu — `evals/verify/OTHER-01.py`\n", "cpu", "", "`cpu` names its scenario"),
    ("**Verify on:** gpu — `evals/verify/TEST-01.py`\n", "gpu", "", "a scenario is for `cpu` entries"),
    ("**Verify on:** a laptop\n", "", "", "the first word is one of"),
])
def test_verify_on(tmp_path: Path, extra: str, kind: str, scenario: str, problem: str | None) -> None:
    entry, problems = _parse(tmp_path, extra)
    assert (entry.verify_on, entry.verify_scenario) == (kind, scenario)
    assert (problem is None and not problems) or (problem and any(problem in p for p in problems)), problems


def test_numbers_field_parses_calls_and_claims(tmp_path: Path) -> None:
    entry, problems = _parse(tmp_path, '**Numbers:**\n- `fsdp_memory_estimate(model="llama-2-13b", world_size=7, '
                             'activation_checkpointing=true)`: `total_bytes ≈ 41.8 GiB ± 2%` · `fits = false`\n')
    assert not problems
    [numbers] = entry.numbers
    assert numbers.tool == "fsdp_memory_estimate" and numbers.arguments["activation_checkpointing"] is True
    total, fits = numbers.claims
    assert (total.path, total.op, total.unit, total.tolerance) == ("total_bytes", "\u2248", "GiB", 0.02)
    assert total.holds(41.8 * 2**30) and total.holds(42.5 * 2**30) and not total.holds(43 * 2**30)
    assert fits.holds(False) and not fits.holds(True) and not fits.holds(0)


@pytest.mark.parametrize("bullet", [
    "- `fsdp_memory_estimate(model=...)`: `fits = false`",   # a placeholder cannot be recomputed
    "- `fsdp_memory_estimate(model=\"x\")`: `fits is false`",  # not a claim
    "- `fsdp_memory_estimate(model=\"x\")`: `total_bytes ≈ 4 parsecs`",  # unknown unit
    "- `fsdp_memory_estimate(model=\"x\")`",  # no figure
    "the estimate says 41.8 GiB",  # not a bullet
])
def test_numbers_field_rejects_what_cannot_be_checked(tmp_path: Path, bullet: str) -> None:
    entry, problems = _parse(tmp_path, f"**Numbers:**\n{bullet}\n")
    assert entry.numbers == () and any(p.startswith("numbers-format") for p in problems), problems


def test_claims_compare_text_and_bounds() -> None:
    contains = catalog.parse_claim('profile.billing.still_billed.value contains "$0.20/GB/month"')
    assert contains and contains.holds("at $0.20/GB/month (twice)") and not contains.holds("$0.10/GB/month")
    below = catalog.parse_claim("headroom_bytes < 0 GiB")
    assert below and below.holds(-5) and not below.holds(0)
    assert catalog.parse_claim("fits < true") is None
