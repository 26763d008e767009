"""diagnose_error against the REAL catalog: every signature finds its own entry, and realistic logs
reach the right file. While the catalog is being written these list what is still missing."""

from __future__ import annotations

import pytest

from remote_gpu_trainer.catalog import load_catalog
from remote_gpu_trainer.diagnose import diagnose

from .test_diagnose import CASES, read_log


def test_every_signature_routes_its_own_symptom_to_itself():
    """Issue 7/8: an entry's own Symptom text, pasted as is, puts that entry in the top 3."""
    entries = [e for e in load_catalog().entries if e.signatures]
    assert entries, "no entry in the real catalog has a Signature"
    misses = []
    for e in entries:
        top3 = [m.id for m in diagnose(e.symptom_plain, 3).matches]
        if e.id not in top3:
            misses.append(f"{e.file}:{e.line} {e.id}: its Symptom ranks {top3 or 'nothing'}")
    assert not misses, "\n".join(misses) + f"\n{len(misses)} of {len(entries)} entries with a Signature"


@pytest.mark.parametrize("case", CASES, ids=[c["log"] for c in CASES])
def test_realistic_log_reaches_the_right_file(case):
    out = diagnose(read_log(case["log"]), 5)
    ranked = [(m.id, m.file, m.evidence) for m in out.matches]
    assert out.matches and out.matches[0].file in case["files"], \
        f"{case['why']}: expected {case['files']}, got {ranked}"


FOREACH_CHECK = ("Tensors of the same index must be on the same device and the same dtype except `step` tensors "
                 "that can be ")


@pytest.mark.parametrize("ending", [
    "CPU and float32/64 notwithstanding",  # torch 2.11.0+cu130 on an H100 (issue 27)
    "CPU and float32/64, and optimizer states that can be bfloat16 for mixed-precision training",  # torch 2.13
    "CPU and float32 notwithstanding",  # the wording in 2023-2024 reports
])
def test_the_foreach_grouping_text_ranks_amp03_first(ending):
    """bf16 grads into Adam as CUDA users see it: refused by the foreach check before lerp_ (AMP-03)."""
    log = ("  File \"/usr/local/lib/python3.12/dist-packages/torch/optim/adam.py\", line 627, in _multi_tensor_adam\n"
           "    grouped_tensors = Optimizer._group_tensors_by_device_and_dtype(\n"
           "  File \"/usr/local/lib/python3.12/dist-packages/torch/utils/_foreach_utils.py\", line 47, in "
           "_group_tensors_by_device_and_dtype\n"
           "    return torch._C._group_tensors_by_device_and_dtype(tensorlistlist, with_indices)\n"
           f"RuntimeError: {FOREACH_CHECK}{ending}\n")
    out = diagnose(log, 3)
    assert out.matches and out.matches[0].id == "AMP-03", [(m.id, m.evidence) for m in out.matches]
    assert out.matches[0].evidence in ("signature", "root")  # root: the signature on the log's final error line
