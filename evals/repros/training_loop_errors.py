"""CONV-02, -03, -04, -05, -06, -08, -09, -17, AMP-09, DOM-09, PERF-05 and OOM-08 on CPU.

    python evals/repros/training_loop_errors.py

Errors and warnings a single-process training loop raises on its own, each provoked with a
two-parameter model and held against the entry's signatures (warnings are recorded with
``warnings.catch_warnings``; errors are the exception line as a traceback ends).
"""

import warnings

import torch
import torch.nn.functional as F
from _catalog_check import check, exception_text, summary
from torch import nn


def caught(fn) -> str:
    """The exception line, or the warnings the call emitted."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        try:
            fn()
        except Exception as exc:  # the text is what the case is about
            return exception_text(exc)
    return "\n".join(f"{w.category.__name__}: {w.message}" for w in got) or "(nothing)"


def conv02() -> None:
    opt = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    check("CONV-02", "scheduler.step() first", caught(sched.step))


def conv03() -> None:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        loss = model(torch.ones(1, 2)).sum()
    check("CONV-03", "backward of a no_grad loss", caught(loss.backward))


def conv04() -> None:
    model = nn.Linear(2, 1).requires_grad_(False)
    check("CONV-04", "every parameter frozen",
          caught(lambda: torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])))


def conv05() -> None:
    check("CONV-05", "mse_loss [4,1] vs [4]", caught(lambda: F.mse_loss(torch.ones(4, 1), torch.ones(4))))


def conv06() -> None:
    check("CONV-06", "label 5 with 5 classes",
          caught(lambda: F.cross_entropy(torch.zeros(2, 5), torch.tensor([1, 5]))))


def conv08() -> None:
    model = nn.Linear(2, 1)
    model(torch.tensor([[float("inf"), 1.0]])).sum().backward()
    check("CONV-08", "clip with error_if_nonfinite",
          caught(lambda: nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)))


def conv09() -> None:
    opt = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    opt.step()
    check("CONV-09", "scheduler.step(epoch)", caught(lambda: sched.step(1)))


def conv17() -> None:
    w = nn.Parameter(torch.ones(2))
    h = w * 2
    h.sum().backward()
    check("CONV-17", ".grad of a non-leaf", caught(lambda: h.grad))


def amp09() -> None:
    check("AMP-09", "torch.cuda.amp.GradScaler()", caught(torch.cuda.amp.GradScaler))

    def autocast_cuda():
        with torch.autocast("cuda"):
            pass

    check("AMP-09", "autocast('cuda')", caught(autocast_cuda))


def dom09() -> None:
    bn = nn.BatchNorm1d(4).train()
    check("DOM-09", "BatchNorm1d, batch of 1", caught(lambda: bn(torch.ones(1, 4))))


def perf05() -> None:
    def anomaly():
        with torch.autograd.detect_anomaly():
            pass

    check("PERF-05", "detect_anomaly()", caught(anomaly))


def oom08() -> None:
    from torch.utils.checkpoint import checkpoint

    layer = nn.Linear(2, 2)
    check("OOM-08", "checkpoint, no use_reentrant", caught(lambda: checkpoint(layer, torch.ones(1, 2))))
    frozen = nn.Linear(2, 2).requires_grad_(False)
    check("OOM-08", "reentrant, inputs need no grad",
          caught(lambda: checkpoint(frozen, torch.ones(1, 2), use_reentrant=True)))


if __name__ == "__main__":
    print(f"torch {torch.__version__}")
    for case in (conv02, conv03, conv04, conv05, conv06, conv08, conv09, conv17, amp09, dom09, perf05, oom08):
        case()
    raise SystemExit(summary())
