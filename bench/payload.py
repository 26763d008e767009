"""MCP payload per tool call: the text content now vs the pretty JSON it used to be.

Every tool is called on the README's examples (its Tools table and the commands it shows) through
an in-memory MCP client, the way an agent host calls it. For each call this prints the bytes of
``json.dumps(structuredContent, indent=2)`` (the "before": the text content was that pretty JSON)
and the bytes of the text content now (the tool's ``render_text`` summary), then the medians.
It also asserts that nothing was lost: the structured content equals the tool's own model dump.

GPU tools run on the named fake NVML scenario ``healthy-8xh100`` (this benchmark measures payload
size, not hardware), so the figures are the same on a laptop and a GPU box.

    python bench/payload.py            # all examples (runs torch for the repro examples)
    python bench/payload.py --no-torch # skip the examples that start torch
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

TORCH_TOOLS = {"repro_scaler_bug"}
EXAMPLES: list[tuple[str, dict[str, Any]]] = [
    ("skill_info", {}),
    ("gpu_health", {"expect_gpus": 8}),
    ("reap_vram_zombies", {}),
    ("kill_port_holders", {"ports": [29500, "29510-29520"]}),
    ("port_status", {"port": 29500}),
    ("fsdp_memory_estimate", {"model": "llama-3-8b", "world_size": 8, "strategy": "full_shard",
                              "seq_len": 4096, "gpu_memory_gib": 80}),
    ("repro_scaler_bug", {"case": "fp16_unscale"}),
    ("amp_config_check", {"model_dtype": "fp16", "precision": "fp16"}),
    ("diagnose_error", {"text": (ROOT / "tests/fixtures/logs/oom_rank3_cascade.log").read_text()}),
    ("provider_info", {"provider": "runpod"}),
    ("provider_info", {"question": "what stops billing"}),
    ("render_launch", {"launcher": "torchrun", "nproc_per_node": 8, "nnodes": 2, "script": "train.py",
                       "master_addr": "10.0.0.1", "check_host": False}),
    ("render_launch", {"launcher": "deepspeed", "nproc_per_node": 8, "nnodes": 2, "script": "train.py",
                       "strategy": "zero3", "master_addr": "10.0.0.1", "check_host": False}),
    ("render_template", {"name": "run_one", "provider": "runpod",
                         "variables": {"run_name": "llama-sft", "command": "torchrun --nproc-per-node 8 train.py"}}),
    ("render_template", {"name": "health_patrol", "provider": "runpod", "variables": {"run_name": "llama-sft"}}),
]


async def measure(skip_torch: bool) -> list[tuple[str, int, int]]:
    from mcp import Client

    from remote_gpu_trainer.registry import all_specs
    from remote_gpu_trainer.server import build_server

    specs = {s.name: s for s in all_specs()}
    rows = []
    async with Client(build_server()) as client:
        for name, arguments in EXAMPLES:
            if skip_torch and name in TORCH_TOOLS:
                continue
            result = await client.call_tool(name, arguments)
            text = "".join(c.text for c in result.content if getattr(c, "type", "") == "text")
            if result.is_error:
                raise SystemExit(f"{name}({arguments}) failed: {text}")
            structured = result.structured_content
            model = specs[name].output_model
            # Nothing lost: the structured content is a whole dump of the tool's output model (plus the
            # framework's stamps for remote tools, e.g. host).
            own = {k: v for k, v in structured.items() if k in model.model_fields}
            assert model.model_validate(own).model_dump(mode="json") == own, name
            assert set(own) == set(model.model_fields), f"{name}: fields missing from structured content"
            before = len(json.dumps(structured, indent=2).encode())
            rows.append((name, before, len(text.encode())))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-torch", action="store_true", help="skip the examples that start torch")
    args = parser.parse_args()
    os.environ.setdefault("RGT_HEALTH_FAKE", "healthy-8xh100")
    rows = anyio.run(measure, args.no_torch)
    width = max(len(n) for n, _, _ in rows)
    print(f"{'tool':<{width}}  {'pretty JSON':>11}  {'text now':>8}  ratio")
    for name, before, after in rows:
        print(f"{name:<{width}}  {before:>11,}  {after:>8,}  {after / before:5.2f}")
    before_median = statistics.median(b for _, b, _ in rows)
    after_median = statistics.median(a for _, _, a in rows)
    print(f"{'median':<{width}}  {before_median:>11,.0f}  {after_median:>8,.0f}  {after_median / before_median:5.2f}"
          f"   ({len(rows)} calls; goal: median text <= 2,048 bytes)")


if __name__ == "__main__":
    main()
