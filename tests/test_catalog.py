"""The catalog parser and lint, on fixture markdown (tests/fixtures/skill is clean, bad_skill is not)."""

from __future__ import annotations

import os
import random
import re
import shutil
import sys

import pytest

from remote_gpu_trainer import catalog as cat
from remote_gpu_trainer.catalog import (
    Problem,
    code_spans,
    compile_signature,
    first_sentence,
    fold,
    github_slug,
    lint,
    load_catalog,
)
from remote_gpu_trainer.info import SkillInfoInput

from .conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "skill"
BAD = ROOT / "tests" / "fixtures" / "bad_skill"
FIXTURE_TOOLS = {name: object() for name in ("fsdp_memory_estimate", "kill_port_holders", "diagnose_error",
                                             "repro_scaler_bug", "amp_config_check", "gpu_health")}


def _line_of(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(text))


def test_parses_every_fixture_entry():
    c = load_catalog(FIXTURE)
    assert sorted(e.id for e in c.entries) == sorted([
        "OOM-01", "OOM-02", "OOM-03", "DIST-01", "DIST-02", "DIST-03", "DIST-04", "AMP-01", "AMP-02", "AMP-03",
        "DATA-01", "CKPT-01", "CKPT-02", "NODE-01", "SSH-01", "GOT-01", "CN-01", "RUNPOD-01"])
    assert set(c.files) == {"SKILL.md", "profiles/runpod.md", "references/principles.md", "references/china-network.md",
                            "references/gotchas_universal.md", "references/multinode.md", "references/ssh_transport.md",
                            *(f"references/training/{n}.md" for n in ("checkpoint-resume", "data-pipeline",
                                                                        "distributed-launch", "oom-memory",
                                                                        "precision-stability"))}


def test_entry_fields_are_typed_and_complete():
    path = FIXTURE / "references" / "training" / "oom-memory.md"
    e = load_catalog(FIXTURE).entry("OOM-01")
    assert e.file == "references/training/oom-memory.md"
    assert e.title == "CUDA OOM: weights, activations and optimizer state do not fit"
    assert e.group == "GPU memory"
    assert e.line == _line_of(path, "### OOM-01")
    assert e.symptom.startswith("A step dies with\n`torch.OutOfMemoryError: CUDA out of memory.")
    assert [s.pattern for s in e.signatures] == [r"CUDA out of memory\. Tried to allocate", r"torch\.OutOfMemoryError"]
    assert all(s.regex.flags & re.IGNORECASE and s.regex.flags & re.MULTILINE for s in e.signatures)
    assert e.root_cause.startswith("The memory the step needs")
    # The Fix keeps its alternatives list and its code block: a field runs to the next label.
    assert "- shard with FSDP" in e.fix and "model.gradient_checkpointing_enable()" in e.fix
    assert e.verify.startswith("The step completes")
    assert e.tools == ('fsdp_memory_estimate(model="llama-3-8b", world_size=8, strategy="full_shard")',)
    assert e.not_the_cause.startswith("A memory leak")
    assert e.sources == ("https://pytorch.org/docs/stable/notes/cuda.html#memory-management",)
    assert e.field_lines["Sources"] == _line_of(path, "**Sources:**") and "---" not in e.sources[0]
    assert e.short_fix == "Halve the micro-batch and double gradient accumulation."
    assert e.tool_call == e.tools[0]


def test_signatures_on_separate_lines_and_double_backtick_spans():
    c = load_catalog(FIXTURE)
    assert [s.pattern for s in c.entry("OOM-02").signatures] == [
        r"Out of memory: Killed process \d+", r"exitcode\s*:\s*-9\b", r"Signal 9 \(SIGKILL\) received by PID"]
    assert [s.pattern for s in c.entry("DIST-02").signatures] == ["ChildFailedError"]
    amp3 = c.entry("AMP-03")
    assert amp3.signatures[0].pattern == r"torch\.cuda\.amp\.GradScaler\(args\.\.\.\)`? is deprecated"
    assert "FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated." in amp3.symptom_plain


def test_profile_front_matter_is_skipped_and_top_gotchas_are_entries():
    path = FIXTURE / "profiles" / "runpod.md"
    md = load_catalog(FIXTURE).files["profiles/runpod.md"]
    e = load_catalog(FIXTURE).entry("RUNPOD-01")
    assert md.title == "RunPod"
    assert e.group == "Top gotchas" and e.line == _line_of(path, "### RUNPOD-01")
    assert [link.target for link in e.links] == ["../references/training/checkpoint-resume.md#ckpt-01"]
    assert e.tool_call == "scripts/check_gpu.sh"


def test_headings_fields_and_links_inside_code_blocks_are_ignored():
    c = load_catalog(FIXTURE)
    assert "NOT-01" not in c
    assert [link.target for link in c.files["references/principles.md"].links] == ["training/oom-memory.md#oom-01"]


def test_entry_without_optional_fields():
    e = load_catalog(FIXTURE).entry("OOM-03")
    assert e.signatures == ()
    assert e.tools == ('fsdp_memory_estimate(model=..., world_size=1, strategy="ddp")',)
    assert e.not_the_cause == "" and e.group == "GPU memory"


def test_anchors_are_entry_ids_and_github_slugs():
    anchors = load_catalog(FIXTURE).files["references/training/distributed-launch.md"].anchors
    assert {"dist-01", "port-and-rendezvous", "dist-01--port-29500-already-in-use-eaddrinuse"} <= anchors


def test_entry_lookup():
    assert cat.entry("DIST-01", FIXTURE).title.startswith("Port 29500")
    with pytest.raises(KeyError, match="no catalog entry 'DIST-99'"):
        cat.entry("DIST-99", FIXTURE)


def test_fixture_catalog_lints_clean():
    assert [str(p) for p in lint(FIXTURE, FIXTURE_TOOLS)] == []


# Every problem the bad fixture holds, as (file, line, entry, rule). Exact: a missed problem or a
# spurious one fails the test.
OOM = "references/training/oom-memory.md"
BAD_EXPECTED = [
    ("SKILL.md", 3, None, "link-anchor"),        # #oom-99 does not exist
    ("SKILL.md", 3, None, "link-target"),        # references/missing.md
    ("SKILL.md", 4, None, "link-anchor"),        # #OOM-04 must be lowercase
    ("SKILL.md", 5, None, "link-target"),        # ../../../README.md escapes the skill
    ("profiles/newcloud.md", 22, "OTHER-01", "id-prefix"),  # second prefix in one file
    ("profiles/newcloud.md", 35, "OOM-12", "id-prefix"),    # prefix owned by oom-memory.md
    ("references/training/distributed-launch.md", 22, "DIST-02", "signature-backtracking"),  # (?:\w+\s*)+
    (OOM, 3, None, "entry-heading"),             # OOM-1: one digit
    (OOM, 7, None, "entry-heading"),             # hyphen instead of em dash
    (OOM, 11, None, "entry-heading"),            # level 2
    (OOM, 13, "OOM-04", "missing-field"),        # no Root cause
    (OOM, 17, "OOM-04", "empty-field"),          # Fix is empty
    (OOM, 28, "OOM-05", "signature-regex"),
    (OOM, 43, "OOM-06", "signature-symptom"),
    (OOM, 58, "OOM-07", "signature-generic"),    # `\d+ GiB`: 4 fixed characters
    (OOM, 58, "OOM-07", "signature-generic"),    # `error` matches 'error'
    (OOM, 75, "OOM-08", "field-order"),
    (OOM, 79, "OOM-08", "duplicate-field"),
    (OOM, 84, "OOM-09", "missing-field"),        # Sources (spelt Source)
    (OOM, 88, "OOM-09", "field-label"),          # Root Cause
    (OOM, 92, "OOM-09", "field-label"),          # **Verify**:
    (OOM, 94, "OOM-09", "field-label"),          # **Source:**
    (OOM, 99, "OOM-10", "text-before-fields"),
    (OOM, 101, "OOM-10", "symptom-code"),
    (OOM, 103, "OOM-10", "signature-symptom"),
    (OOM, 103, "OOM-10", "signature-text"),      # "or maybe" between the spans
    (OOM, 111, "OOM-10", "tool-format"),         # no code span
    (OOM, 114, "OOM-10", "sources-format"),      # URL without a bullet
    (OOM, 115, "OOM-10", "sources-format"),      # bullet without a URL
    (OOM, 116, "OOM-10", "sources-placeholder"),
    (OOM, 128, "OOM-11", "tool-args"),           # gpu_health(bogus=1)
    (OOM, 128, "OOM-11", "tool-format"),         # gpu_health(1): positional
    (OOM, 128, "OOM-11", "tool-format"),         # nvidia-smi -q
    (OOM, 128, "OOM-11", "tool-script"),         # scripts/missing.sh
    (OOM, 128, "OOM-11", "tool-unknown"),        # no_such_tool()
    (OOM, 133, "OOM-05", "duplicate-id"),
    (OOM, 144, "OOM-05", "link-anchor"),         # distributed-launch.md#dist-09
    (OOM, 144, "OOM-05", "link-target"),         # ../gone.md
    (OOM, 146, "DIST-01", "duplicate-id"),
    (OOM, 146, "DIST-01", "id-prefix"),
    (OOM, 161, None, "field-outside-entry"),
    (OOM, 164, None, "unclosed-fence"),
]


class _GpuHealthSpec:
    input_model = SkillInfoInput  # any strict model: gpu_health(bogus=1) must fail validation


def test_bad_fixture_reports_exactly_its_problems():
    problems = lint(BAD, {"gpu_health": _GpuHealthSpec})
    assert [(p.file, p.line, p.entry, p.rule) for p in problems] == BAD_EXPECTED, "\n".join(map(str, problems))


def test_problem_lines_are_readable():
    problems = {str(p) for p in lint(BAD, {"gpu_health": _GpuHealthSpec})}
    assert ("references/training/oom-memory.md:146 DIST-01: duplicate-id: already defined at "
            "references/training/distributed-launch.md:3") in problems
    assert "references/training/oom-memory.md:94 OOM-09: field-label: unknown field **Source:** (did you mean " \
           "**Sources:**?)" in problems
    assert str(Problem("a.md", 3, None, "r", "d")) == "a.md:3 -: r: d"


def test_lint_can_report_on_some_files_only():
    problems = lint(BAD, {"gpu_health": _GpuHealthSpec}, files=["SKILL.md"])
    assert {p.file for p in problems} == {"SKILL.md"} and len(problems) == 4


def test_tool_call_arguments_accept_json_literals_and_placeholders():
    from remote_gpu_trainer.catalog import _check_tool_call

    tools = {"skill_info": _GpuHealthSpec}
    assert _check_tool_call("skill_info(probe_torch=true, timeout_s=30)", tools) is None
    assert _check_tool_call("skill_info(timeout_s=...)", tools) is None
    assert _check_tool_call("skill_info", tools) is None
    assert _check_tool_call("skill_info(timeout_s=0)", tools)[0] == "tool-args"


def test_cache_is_reused_until_a_file_changes(tmp_path):
    root = tmp_path / "skill"
    shutil.copytree(FIXTURE, root)
    first = load_catalog(root)
    assert load_catalog(root) is first
    path = root / "references" / "ssh_transport.md"
    path.write_text(path.read_text().replace("A dropped SSH session kills", "A dropped SSH session ends"))
    os.utime(path, ns=(first.root.stat().st_mtime_ns, path.stat().st_mtime_ns + 10**9))
    second = load_catalog(root)
    assert second is not first and second.entry("SSH-01").title.startswith("A dropped SSH session ends")
    (root / "references" / "new.md").write_text("# New\n\n### NEW-01 — t\n\n**Symptom:** `x`\n")
    assert "NEW-01" in load_catalog(root)


@pytest.mark.parametrize(("text", "expected"), [
    ("`a` and `b`", ["a", "b"]),
    ("`` a`b `` and ``` x ```", ["a`b", "x"]),
    ("first ` pairs with `second`", ["pairs with"]),  # one padding space stripped each side
    ("a `` b ` c", []),  # runs of different lengths never close each other
    ("escaped \\` tick, `span`", ["span"]),
    ("`multi\nline`", ["multi line"]),
])
def test_code_spans(text, expected):
    assert [content for content, _, _ in code_spans(text)] == expected


@pytest.mark.parametrize(("fix", "short"), [
    ("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`. Then retry.",
     "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`."),
    ("Use e.g. `x` first. More text.", "Use e.g. `x` first."),
    ("Call `torch.cuda.empty_cache()` once\nafter eval. Rest.", "Call `torch.cuda.empty_cache()` once after eval."),
    ("Export the variable:\n\n```bash\nexport NCCL_P2P_DISABLE=1\n```",
     "Export the variable: `export NCCL_P2P_DISABLE=1`"),
    ("```python\nmodel = model.float()\n```\nthen retry", "model = model.float()"),
    ("```python\nimport os, torch\n# atomic\ndef atomic_save(obj, path):\n```", "def atomic_save(obj, path):"),
    ("either\n1. `use_orig_params=True`, or\n2. one dtype per unit", "either `use_orig_params=True`, or"),
    ("1. Lower the batch. Then more.\n2. Second", "Lower the batch."),
    ("Pick by where it failed:\n- at load → OOM-02,\n  OOM-07;\n- at step 2 → OOM-03",
     "Pick by where it failed: at load → OOM-02, OOM-07;"),
    ("x" * 400, "x" * 299 + "…"),
])
def test_short_fix_is_the_first_sentence(fix, short):
    assert first_sentence(fix) == short


def test_github_slug():
    assert github_slug("OOM-03 — Step-2 OOM: Adam state") == "oom-03--step-2-oom-adam-state"
    assert github_slug("Use `torch.compile` **carefully**") == "use-torchcompile-carefully"
    assert github_slug("[link](x.md) text") == "link-text"


@pytest.mark.parametrize(("pattern", "needles", "words", "literal_chars", "spans_lines"), [
    (r"(?:torch\.)?OutOfMemoryError: CUDA out of memory\. Tried",
     ("outofmemoryerror: cuda out of memory. tried",), {"cuda", "out", "memory"}, 43, False),
    (r"EADDRINUSE", ("eaddrinuse",), set(), 10, False),
    (r"Xid \(PCI:[^)]*\): 79\b", ("xid (pci:", "): 79"), {"pci"}, 14, True),  # [^)] also matches a newline
    (r"foo\s+bar", ("bar", "foo"), set(), 6, True),
    (r"foo.*bar", ("bar", "foo"), set(), 6, False),
    (r"(?s)foo.*bar", ("bar", "foo"), set(), 6, True),
    (r"abc|defgh", (), set(), 3, False),
    (r"(abc){2}defg", ("defg", "abc"), set(), 10, False),  # a repeat counts its minimum
])
def test_signature_analysis(pattern, needles, words, literal_chars, spans_lines):
    sig = compile_signature(pattern, 1)
    assert (sig.needles, set(sig.words), sig.literal_chars, sig.spans_lines) == (
        needles, words, literal_chars, spans_lines)


@pytest.mark.parametrize(("pattern", "nested"), [
    (r"(a+)+b", True), (r"(?:\s+\S+)*X", True), (r"(?:(?:a)*b)+", True),
    (r"foo.*bar", False), (r"(?:ab|cd)+", False), (r"(x{1,3})+", False), (r"(x+){1,3}", False),
])
def test_nested_unbounded_repeats_are_flagged(pattern, nested):
    assert compile_signature(pattern, 1).nested_repeats is nested


def test_prefilter_never_rejects_a_matching_line():
    """Property: whenever a signature matches a line, the line (folded) holds its needles and words."""
    patterns = [r"CUDA out of memory\. Tried to allocate [\d.]+ [GM]iB", r"(?:torch\.)?OutOfMemoryError",
                r"Signal 9 \(SIGKILL\) received by PID \d+", r"failed to listen on .*Address already in use",
                r"Kernel Module\s+\d+", r"NCCL WARN NET/Socket", r"state_dict: \"module\."]
    seeds = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB",
             "traceback : Signal 9 (SIGKILL) received by PID 3321",
             "[c10d] The server socket has failed to listen on [::]:29500 (errno: 98 - Address already in use).",
             "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05", "x NCCL WARN NET/Socket : y",
             'Unexpected key(s) in state_dict: "module.model.embed_tokens.weight"']
    traps = ["\u0130", "\u0131", "\u017f", "\u212a", "\u00e9", "\u2588", "\u00df"]
    lookalikes = {"s": "\u017f", "k": "\u212a", "K": "\u212a", "i": "\u0131", "I": "\u0130"}
    rng = random.Random(1234)
    sigs = [compile_signature(p, 1) for p in patterns]
    checked = 0
    for _ in range(3000):
        line = list(rng.choice(seeds))
        for _ in range(rng.randint(0, 3)):
            i = rng.randrange(len(line))
            choice = rng.random()
            if choice < 0.4:
                line[i] = line[i].swapcase()
            elif choice < 0.7:
                line.insert(i, rng.choice(traps))
            else:
                line[i] = lookalikes.get(line[i], line[i])
        text = "".join(line)
        folded = fold(text)
        words = set(re.split(r"[^a-z0-9_]+", folded))
        for sig in sigs:
            if sig.regex.search(text):
                checked += 1
                assert all(n in folded for n in sig.needles), (sig.pattern, text)
                assert sig.words <= words, (sig.pattern, text)
    assert checked > 1000  # the property was exercised, not vacuously true


def test_case_traps_cover_every_non_ascii_char_that_matches_an_ascii_letter():
    """re.IGNORECASE lets a few non-ASCII characters match ASCII letters (the Kelvin sign matches k);
    fold() must map each of them to that letter or the literal prefilter would miss a match."""
    every_char = "".join(chr(c) for c in range(0x80, sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)
    for letter in "abcdefghijklmnopqrstuvwxyz":
        for char in re.findall(letter, every_char, re.IGNORECASE):
            assert fold(char) == letter, (hex(ord(char)), letter)


def test_command_line_report(capsys):
    assert cat.main(["--root", str(FIXTURE), "--no-tools"]) == 0
    assert capsys.readouterr().out.strip() == "0 problem(s) in 12 files, 18 entries"
    assert cat.main(["--root", str(BAD), "--no-tools", str(BAD / "SKILL.md")]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("SKILL.md:3 -: link-anchor: ") and len(lines) == 5
    assert lines[-1].endswith(": link-anchor 2, link-target 2")
