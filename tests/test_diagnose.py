"""diagnose_error on the fixture catalog: routing of realistic logs, ranking rules, context, MCP and CLI."""

from __future__ import annotations

import io
import json
import re

import pytest

from remote_gpu_trainer import cli
from remote_gpu_trainer import diagnose as diag
from remote_gpu_trainer.catalog import load_catalog
from remote_gpu_trainer.diagnose import MAX_TEXT_CHARS, ScanStats, _Text, diagnose, extract_context, scan_signatures
from remote_gpu_trainer.errors import InputError

from .conftest import ROOT, call_error, call_ok

FIXTURE = ROOT / "tests" / "fixtures" / "skill"
LOGS = ROOT / "tests" / "fixtures" / "logs"
CASES = json.loads((LOGS / "cases.json").read_text())["cases"]


def read_log(name: str) -> str:
    """Bytes as they are on disk: text mode would turn tqdm's \\r into line breaks."""
    return (LOGS / name).read_bytes().decode("utf-8")


@pytest.fixture
def fixture_root(monkeypatch):
    """Point the tool (MCP and CLI paths) at the fixture catalog."""
    monkeypatch.setattr(diag, "skill_root", lambda: FIXTURE)


@pytest.mark.parametrize("case", CASES, ids=[c["log"] for c in CASES])
def test_realistic_logs_are_routed_as_labelled(case):
    out = diagnose(read_log(case["log"]), 10, FIXTURE)
    assert out.matches, out.summary
    top = out.matches[0]
    assert [top.id, top.evidence] == case["fixture"]["top"], [(m.id, m.evidence, m.score) for m in out.matches]
    evidence = {m.id: m.evidence for m in out.matches}
    for entry_id, expected in case["fixture"].get("also", {}).items():
        assert evidence.get(entry_id) == expected, (entry_id, evidence)
    assert (out.first_error.line_number if out.first_error else None) == case["first_error"]


def test_signature_matches_outrank_lexical_ones_and_scores_are_sorted():
    tier = {"root": 4, "error": 3, "downstream": 2, "note": 1, "lexical": 0}
    for case in CASES:
        matches = diagnose(read_log(case["log"]), 25, FIXTURE).matches
        assert [m.score for m in matches] == sorted((m.score for m in matches), reverse=True)
        assert [tier[m.evidence] for m in matches] == sorted((tier[m.evidence] for m in matches), reverse=True)
        for m in matches:
            assert (m.signature is None) == (m.evidence == "lexical")


def test_every_fixture_signature_routes_its_own_symptom_to_itself():
    for e in load_catalog(FIXTURE).entries:
        if e.signatures:
            top3 = [m.id for m in diagnose(e.symptom_plain, 3, FIXTURE).matches]
            assert e.id in top3, (e.id, top3)


def test_entries_without_a_signature_are_found_lexically():
    out = diagnose("Training survives step 1, then dies at step 2 inside optimizer.step(): Adam state exp_avg",
                   5, FIXTURE)
    assert (out.matches[0].id, out.matches[0].evidence, out.matches[0].signature) == ("OOM-03", "lexical", None)
    assert out.summary.startswith("No signature matched")


def test_cascade_printed_before_the_root_error_still_ranks_below_it():
    # Buffered output from other ranks can land before the failing rank's traceback.
    lines = read_log("oom_rank3_cascade.log").splitlines()
    cascade = [ln for ln in lines if "Watchdog caught" in ln or "ChildFailedError" in ln]
    oom = [ln for ln in lines if ln.startswith("[rank3]")]
    out = diagnose("\n".join(cascade + oom), 5, FIXTURE)
    assert [(m.id, m.evidence) for m in out.matches[:3]] == [
        ("OOM-01", "root"), ("DIST-03", "downstream"), ("DIST-02", "downstream")]


def test_match_reports_the_input_line_its_number_and_rank():
    top = diagnose(read_log("oom_rank3_cascade.log"), 3, FIXTURE).matches[0]
    assert top.line.line_number == 85 and top.line.rank == 3
    assert top.line.text.startswith("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB")
    assert top.signature == r"CUDA out of memory\. Tried to allocate" and top.matched_lines == 1
    assert top.short_fix == "Halve the micro-batch and double gradient accumulation."
    # The entry's example model is not the user's: the log names none, so the call asks for it.
    assert top.tool_call == 'fsdp_memory_estimate(model=..., world_size=8, strategy="full_shard", gpu_memory_gib=79.11)'
    assert top.needs == ["model"]
    assert top.file == "references/training/oom-memory.md"


def test_carriage_return_redraws_keep_the_physical_line_number():
    ssh = diagnose(read_log("ssh_broken_pipe.log"), 3, FIXTURE).matches[0]
    assert (ssh.id, ssh.line.line_number) == ("SSH-01", 2)
    # Only the last redraw of the bar, which the message was printed after, is shown.
    assert ssh.line.text.startswith("Epoch 1:  37%|") and ssh.line.text.count("Epoch") == 1
    assert ssh.line.text.endswith("]client_loop: send disconnect: Broken pipe")
    amp = diagnose(read_log("gradscaler_no_inf_checks.log"), 3, FIXTURE).matches[0]
    assert (amp.id, amp.line.line_number) == ("AMP-01", 7)


def test_traceback_source_lines_are_not_the_error_but_a_sourceless_frame_is_followed_by_it():
    quoted = ('Traceback (most recent call last):\n  File "t.py", line 9, in <module>\n'
              '    raise ValueError("Attempting to unscale FP16 gradients.")\n'
              "ValueError: Attempting to unscale FP16 gradients.")
    top = diagnose(quoted, 3, FIXTURE).matches[0]
    assert (top.id, top.evidence, top.line.line_number) == ("AMP-02", "root", 4)
    sourceless = 'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n' \
                 "ValueError: Attempting to unscale FP16 gradients."
    top = diagnose(sourceless, 3, FIXTURE).matches[0]
    assert (top.id, top.evidence, top.line.line_number) == ("AMP-02", "root", 3)


def test_ansi_colour_codes_are_ignored():
    text = "\x1b[1;31mtorch.OutOfMemoryError\x1b[0m: CUDA out of \x1b[1mmemory\x1b[0m. Tried to allocate 2.00 GiB"
    top = diagnose(text, 3, FIXTURE).matches[0]
    assert top.id == "OOM-01" and "\x1b" not in top.line.text


def test_deterministic():
    text = read_log("oom_rank3_cascade.log")
    assert diagnose(text, 10, FIXTURE).model_dump() == diagnose(text, 10, FIXTURE).model_dump()


def test_unknown_error_is_named_as_the_first_error():
    out = diagnose(read_log("unknown_error_wrapped.log"), 5, FIXTURE)
    assert out.first_error.text == "[rank0]: KeyError: 'labels'" and out.first_error.rank == 0
    assert out.summary.endswith("The first error in the input, line 4, matched no signature: [rank0]: KeyError: "
                                "'labels'")
    # When a signature did recognise the first error, the summary does not repeat it.
    assert "first error" not in diagnose(read_log("oom_rank3_cascade.log"), 5, FIXTURE).summary


def test_nothing_recognised():
    out = diagnose("hello world", 5, FIXTURE)
    assert out.matches == [] and out.summary == "Nothing in the catalog matches this text."
    assert "no matches" in diag.render(out)


@pytest.mark.parametrize(("text", "message"), [
    ("", "text: is empty"),
    ("  \n\t ", "text: is empty"),
    ("x" * (MAX_TEXT_CHARS + 1), "text: is 4,194,305 characters; the limit is 4,194,304"),
])
def test_bad_input_names_the_field(text, message):
    with pytest.raises(InputError, match=re.escape(message)):
        diagnose(text, 5, FIXTURE)


# --------------------------------------------------------------------------------------------
# The prefilter: exact, and it really skips work


def _naive_hits(catalog, text: _Text) -> dict:
    """Every signature on every line (or the whole text when it may span lines): the reference."""
    hits: dict[int, list[tuple[int, str]]] = {}
    joined, starts = text.joined

    def line_of(offset: int) -> int:
        return max(j for j, start in enumerate(starts) if start <= offset)

    for i, e in enumerate(catalog.entries):
        for sig in e.signatures:
            if sig.spans_lines:
                found = sorted({line_of(m.start()) for m in sig.regex.finditer(joined)})
            else:
                found = [j for j, line in enumerate(text.lines) if sig.regex.search(line)]
            hits.setdefault(i, []).extend((j, sig.pattern) for j in found)
    return {i: sorted(h) for i, h in hits.items() if h}


def _benign_log(lines: int) -> str:
    return "\n".join(f"[rank{i % 8}]: 2024-11-05 14:{i % 60:02d}:01,442 INFO step={i} loss={2.3 - i * 1e-5:.5f} "
                     f"lr=2.0e-05 grad_norm=1.23 tokens/s=41873 memory_allocated=61.2GiB" for i in range(lines))


@pytest.mark.parametrize("name", [c["log"] for c in CASES] + ["mixed"])
def test_prefiltered_scan_equals_the_naive_scan(name):
    every_log = "\n".join(read_log(c["log"]) for c in CASES)
    raw = _benign_log(2000) + "\n" + every_log if name == "mixed" else read_log(name)
    catalog, text = load_catalog(FIXTURE), _Text(raw)
    fast = {i: sorted((j, s.pattern) for j, s in h) for i, h in scan_signatures(catalog, text).items()}
    assert fast == _naive_hits(catalog, text)


def test_prefilter_skips_almost_every_regex_on_a_benign_log():
    stats = ScanStats()
    scan_signatures(load_catalog(FIXTURE), _Text(_benign_log(10_000)), stats)
    assert stats.signatures > 25
    assert stats.regex_calls <= 2 and stats.skipped_by_prefilter >= stats.signatures - 2, stats


# --------------------------------------------------------------------------------------------
# Context


def test_context_from_a_torchrun_log():
    c = diagnose(read_log("oom_rank3_cascade.log"), 1, FIXTURE).context
    assert (c.torch_version, c.cuda_version, c.nccl_version, c.python_version) == ("2.5.1+cu124", "12.4", "2.21.5",
                                                                                   "3.11")
    assert c.gpu_models == ["NVIDIA H100 80GB HBM3"]
    assert c.ranks == list(range(8)) and c.local_ranks == list(range(8)) and c.world_size == 8
    assert c.exit_codes == [1] and c.signals == ["SIGTERM"]


def test_context_from_dmesg_and_exit_codes():
    dmesg = diagnose(read_log("dmesg_xid79.log"), 1, FIXTURE).context
    assert dmesg.driver_version == "535.104.05" and dmesg.xid_codes == [79]
    killed = diagnose(read_log("host_oom_sigkill.log"), 1, FIXTURE).context
    assert killed.exit_codes == [-9] and killed.signals == ["SIGKILL"] and killed.torch_version == "2.4.1"


def test_context_from_collect_env_and_nvidia_smi():
    text = """PyTorch version: 2.3.1+cu121
CUDA used to build PyTorch: 12.1
Python version: 3.10.14 (main, Mar 21 2024, 16:24:04) [GCC 11.2.0] (64-bit runtime)
Nvidia driver version: 550.54.15
GPU models and configuration:
GPU 0: NVIDIA A100-SXM4-80GB
GPU 1: NVIDIA GeForce RTX 4090
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
[pip3] nvidia-nccl-cu12==2.20.5
Segmentation fault (core dumped)
bash: line 1: 4242 Killed python train.py
exit code 137"""
    c = extract_context(text)
    assert (c.torch_version, c.cuda_version, c.python_version) == ("2.3.1+cu121", "12.1", "3.10.14")
    assert (c.driver_version, c.driver_cuda_version, c.nccl_version) == ("550.54.15", "12.4", "2.20.5")
    assert c.gpu_models == ["NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"]
    assert c.exit_codes == [137] and c.signals == ["SIGKILL", "SIGSEGV"]


def test_cuda_version_from_the_torch_wheel_tag():
    assert extract_context("Successfully installed torch-2.4.0+cu118").cuda_version == "11.8"


def test_rank_ranges_render_compactly():
    assert diag._ranges([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"


# --------------------------------------------------------------------------------------------
# MCP and CLI


@pytest.mark.anyio
async def test_mcp_tool_diagnoses_a_log(client, fixture_root):
    data = await call_ok(client, "diagnose_error", {"text": read_log("oom_rank3_cascade.log"), "max_results": 3})
    ids = [m["id"] for m in data["matches"]]
    assert ids[0] == "OOM-01" and set(ids[1:]) == {"DIST-03", "DIST-02"}
    assert data["matches"][0]["line"]["rank"] == 3 and data["context"]["world_size"] == 8


@pytest.mark.anyio
async def test_mcp_tool_rejects_bad_input(client, fixture_root):
    assert "text" in await call_error(client, "diagnose_error", {"text": ""})
    assert "max_results" in await call_error(client, "diagnose_error", {"text": "x", "max_results": 0})


@pytest.mark.anyio
async def test_mcp_tool_is_read_only(client):
    tool = next(t for t in (await client.list_tools()).tools if t.name == "diagnose_error")
    assert tool.annotations.read_only_hint is True and tool.annotations.destructive_hint is False
    assert set(tool.input_schema["properties"]) == {"text", "log_path", "tail_bytes", "max_results", "host"}


def test_cli_reads_a_file(fixture_root, capsys):
    assert cli.main(["diagnose", str(LOGS / "eaddrinuse_torchrun.log"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    top = data["matches"][0]
    assert top["id"] == "DIST-01" and top["tool_call"] == "kill_port_holders(ports=[29500])"


def test_cli_reads_stdin_and_prints_a_table(fixture_root, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(read_log("unscale_fp16.log")))
    assert cli.main(["diagnose", "--max-results", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("AMP-02 matches the earliest recognised error, at line 11. 1 more signature match.\n")
    assert "fix:\n     Keep parameters in fp32" in out and "context: Python 3.10" in out


def test_cli_rejects_an_oversized_file(fixture_root, capsys, tmp_path):
    big = tmp_path / "big.log"
    big.write_text("x" * (MAX_TEXT_CHARS + 10))
    assert cli.main(["diagnose", str(big)]) == cli.EXIT_INPUT_ERROR
    assert "text: is 4,194,314 characters" in capsys.readouterr().err


@pytest.mark.parametrize(("line", "kind"), [
    ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB.", "error"),
    ("[rank0]:[E1105 14:16:31.123 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=1893, OpType=ALLREDUCE) ran for 600041 milliseconds before timing out.", "downstream"),
    ("[rank0]:[E1105 ProcessGroupNCCL.cpp:1785] [PG ID 0 Rank 0] Exception (either an error or timeout) detected by "
     "watchdog at work: 1893", "downstream"),
    ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "downstream"),
    ("W1105 14:16:32.017000 140213 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 3412 closing "
     "signal SIGTERM", "downstream"),
    ("E0901 22:11:47.201000 api.py:869] failed (exitcode: -9) local_rank: 0 (pid: 3321) of binary: /usr/bin/python",
     "downstream"),
    ("  traceback : Signal 9 (SIGKILL) received by PID 3321", "downstream"),
    ("[Sun Sep  1 22:11:46 2024] Out of memory: Killed process 3321 (python) total-vm:183510204kB", "error"),
    ("node-1:2210:2397 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 172.17.0.1<40129> failed",
     "error"),
    ("/workspace/train.py:58: FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated.", "note"),
    ("UserWarning: TypedStorage is deprecated. It will be removed in the future and UntypedStorage will be the only "
     "storage class.", "note"),
    ("2024-11-05 14:02:19,310 INFO train.py:91 step=10 loss=2.31", "note"),
])
def test_line_classes(line, kind):
    assert diag.classify(line) == kind
