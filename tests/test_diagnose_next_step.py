"""diagnose_error tells the next step: the entry's whole fix, and a check built from the log.

Against the real catalog (references/): DIST-14's fix has steps after its first sentence, OOM-01's
Tool field is an example call for llama-3-8b on 8 GPUs, and 42 entries list diagnose_error itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from remote_gpu_trainer.catalog import load_catalog
from remote_gpu_trainer.diagnose import FIX_CHARS, bounded_fix, diagnose
from remote_gpu_trainer.next_step import next_step
from remote_gpu_trainer.paths import skill_root

LOGS = Path(__file__).parent / "fixtures" / "logs"
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.75 GiB. GPU 0 has a total capacity of "
       "23.54 GiB of which 2.61 GiB is free.")


def top(text: str, entry_id: str):
    return next(m for m in diagnose(text, 10).matches if m.id == entry_id)


def test_dist14_returns_the_whole_fix_not_its_first_sentence():
    watchdog = (LOGS / "nccl_watchdog_hang.log").read_text()
    match = top(watchdog, "DIST-14")
    assert match.short_fix == "find the rank that was *not* waiting."
    assert match.fix.startswith("find the rank that was *not* waiting. Then:")
    assert "TORCH_NCCL_DESYNC_DEBUG=1" in match.fix and "py-spy dump" in match.fix  # the steps after it
    assert match.fix == load_catalog(skill_root()).entry("DIST-14").fix.strip()


def test_a_long_fix_is_cut_at_a_line_boundary_with_a_marker():
    lines = [f"- step {n}: " + "x" * 90 for n in range(40)]
    cut = bounded_fix("\n".join(lines), "references/x.md X-01")
    body, marker = cut.rsplit("\n", 1)
    assert len(body) <= FIX_CHARS and body.splitlines() == lines[: len(body.splitlines())]
    assert marker == f"[… fix cut at {FIX_CHARS} characters; the rest is in references/x.md X-01]"


def test_oom_without_a_model_asks_for_it_instead_of_suggesting_llama():
    match = top(OOM, "OOM-01")
    assert "llama" not in match.tool_call and "world_size=8" not in match.tool_call
    assert match.tool_call.startswith("fsdp_memory_estimate(model=..., world_size=...")
    assert "gpu_memory_gib=23.54" in match.tool_call  # read from the message itself
    assert match.needs == ["model", "world_size"]


def test_oom_fills_the_model_and_world_size_the_log_names():
    log = (f"loading model = AutoModelForCausalLM.from_pretrained(\"Qwen/Qwen2.5-7B\")\nWORLD_SIZE=4\n{OOM}")
    match = top(log, "OOM-01")
    assert match.tool_call.startswith('fsdp_memory_estimate(model="Qwen/Qwen2.5-7B", world_size=4,')
    assert match.needs == []


def test_port_check_uses_the_port_from_the_log():
    log = (LOGS / "eaddrinuse_torchrun.log").read_text().replace("29500", "29533")
    calls = [m.tool_call for m in diagnose(log, 5).matches if m.tool_call and "port" in m.tool_call]
    assert calls and all("29533" in c and "29500" not in c for c in calls), calls


@pytest.mark.parametrize("log", sorted(p.name for p in LOGS.glob("*.log")))
def test_the_check_is_never_the_tool_just_run(log):
    for match in diagnose((LOGS / log).read_text(), 10).matches:
        assert not (match.tool_call or "").startswith("diagnose_error"), (match.id, match.tool_call)


def test_next_step_keeps_the_entrys_condition_and_names_placeholders():
    step = next_step(['diagnose_error(text=...)', 'provider_info(provider=..., question="shm size")'], {},
                     "diagnose_error")
    assert step.call == 'provider_info(provider=..., question="shm size")' and step.needs == ("provider",)
    assert next_step(['repro_scaler_bug(case="fp16_unscale")'], {}, "diagnose_error").call == \
        'repro_scaler_bug(case="fp16_unscale")'
    assert next_step(["diagnose_error(text=...)"], {}, "diagnose_error").call is None
    health = next_step(["gpu_health(expect_gpus=8)"], {"gpus_per_node": None}, "diagnose_error")
    assert health.call == "gpu_health()"  # a stranger's GPU count is worse than the tool's default
