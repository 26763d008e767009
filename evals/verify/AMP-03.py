"""AMP-03: both causes of the Adam dtype error, and their fixes. Cause 1: bf16 gradients on fp32
parameters (what FSDP1's ``keep_low_precision_grads=True`` leaves), fixed by the Fix's stop-gap cast of
each gradient to its parameter's dtype. Cause 2: an AdamW that stepped in fp32 (its ``exp_avg`` is fp32),
then ``model.to(torch.bfloat16)``, fixed by building the optimizer after the cast. The Verify is the entry's
set of gradient/parameter/state dtype mismatches, which must be empty; the step's outcome is printed after
it, so the output shows the Verify agrees with what AdamW does."""

from __future__ import annotations


def _step(optimizer) -> str:
    try:
        optimizer.step()
        return "step ok"
    except RuntimeError as exc:
        return f"step failed: {str(exc).splitlines()[0][:80]}"


def run(case) -> str:
    import torch

    torch.manual_seed(0)
    verify = f"print({case.code('Verify', 'for t in [p, *optimizer.state[p].values()]')})"
    out = []

    # cause 1: fp32 parameters, bf16 gradients
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    model(torch.randn(2, 4)).sum().backward()
    for p in model.parameters():  # FSDP1 swaps the gradient's storage; a plain `p.grad = bf16` is refused
        p.grad.data = p.grad.data.to(torch.bfloat16)
    namespace = {"torch": torch, "model": model, "optimizer": optimizer, "params": list(model.parameters())}
    if case.fixed:
        case.exec(case.code("Fix", "for p in params: p.grad = p.grad.to(p.dtype)", role="fix"), namespace)
    out.append(case.exec(verify, namespace).strip())
    out.append(_step(optimizer))

    # cause 2: one fp32 step, then the model is cast to bf16
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.to(torch.bfloat16)
    if case.fixed:  # "rebuild the optimizer after a cast"
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    model(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    out.append(case.exec(verify, {"torch": torch, "optimizer": optimizer}).strip())
    out.append(_step(optimizer))
    return "\n".join(out) + "\n"


def passed(outputs: list[str]) -> bool:
    """The Verify's criterion: every set it printed is empty."""
    return all(line == "set()" for out in outputs for line in out.splitlines() if not line.startswith("step "))
