"""XIDs: parsing kmsg / journal / dmesg lines, matching them to GPUs, and reading the real kernel log."""

from __future__ import annotations

import os

import pytest

from remote_gpu_trainer.health.xid import describe, parse_xids, pci_key, read_kernel_log
from remote_gpu_trainer.models import Verdict

KMSG = [
    "6,1200,5123456789,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
    "4,1201,5123500000,-;NVRM: GPU at PCI:0000:3b:00: GPU-2f1c...",
    "3,1202,7200000000,-;NVRM: Xid (PCI:0000:17:00): 48, pid=4711, name=python, An uncorrectable double bit error",
]


def test_parse_kmsg_records_with_time_since_boot():
    events = parse_xids(KMSG)
    assert [(e.device, e.code) for e in events] == [("PCI:0000:3b:00", 79), ("PCI:0000:17:00", 48)]
    assert events[0].at_s == pytest.approx(5123.456789)
    assert events[0].text.startswith("pid=1234")


def test_parse_journal_and_plain_dmesg_lines():
    lines = ["[ 8123.000456] gpu-node-7 kernel: NVRM: Xid (PCI:0000:b1:00): 119, pid=2211, name=python, Timeout "
             "waiting for RPC from GSP!",
             "NVRM: Xid (PCI:0000:b1:00): 13, Graphics Exception: ESR 0x405840=0x4"]
    events = parse_xids(lines)
    assert [(e.code, e.at_s) for e in events] == [(119, 8123.000456), (13, None)]


def test_pci_ids_from_nvml_and_the_log_match():
    assert pci_key("00000000:3B:00.0") == pci_key("PCI:0000:3b:00") == "0000:3b:00"
    assert pci_key("00000001:3B:00.0") != pci_key("PCI:0000:3b:00")  # another PCI domain


@pytest.mark.parametrize(("code", "verdict"), [(79, Verdict.FAIL), (48, Verdict.FAIL), (95, Verdict.FAIL),
                                               (64, Verdict.FAIL), (63, Verdict.WARN), (13, Verdict.WARN),
                                               (31, Verdict.WARN), (43, Verdict.PASS), (94, Verdict.WARN),
                                               (119, Verdict.FAIL), (9999, Verdict.FAIL)])
def test_xid_verdicts_follow_the_resolution_buckets(code, verdict):
    assert describe(code).verdict is verdict


def test_read_from_a_kmsg_style_file(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("\n".join(["6,1,100,-;Linux version 6.8", *KMSG]) + "\n")
    result = read_kernel_log(str(log), use_journal=False)
    assert result.readable and result.source == str(log) and result.reason == ""
    assert [e.code for e in result.xids] == [79, 48]


def test_unreadable_log_is_not_readable_with_a_reason(tmp_path):
    result = read_kernel_log(str(tmp_path / "missing"), use_journal=False)
    assert not result.readable and result.xids == ()
    assert "kernel log not readable" in result.reason and "missing" in result.reason


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg is not readable by this user")
def test_the_real_kernel_log_is_read_without_blocking():
    result = read_kernel_log(use_journal=False)
    assert result.readable and result.source == "/dev/kmsg"
    assert all(e.code > 0 for e in result.xids)
