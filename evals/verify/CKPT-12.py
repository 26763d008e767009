"""CKPT-12: tied weights (``head.weight is emb.weight``) saved with safetensors. Failure: the usual
workaround for "Some tensors share memory" — clone every tensor, ``save_file``, then ``load_file`` and
``load_state_dict(..., assign=True)`` — silently unties them. Fix: the entry's ``save_model`` /
``load_model``. The Verify is the entry's ``data_ptr`` comparison after loading."""

from __future__ import annotations


def _tied():
    import torch

    model = torch.nn.Module()
    model.emb = torch.nn.Embedding(10, 4)
    model.head = torch.nn.Linear(4, 10, bias=False)
    model.head.weight = model.emb.weight
    return model


def run(case) -> str:
    import safetensors.torch as st

    model = _tied()
    if case.fixed:
        save = case.code("Fix", "safetensors.torch.save_model(model, path)", role="fix")
        load = case.code("Fix", "load_model(model, path)", role="fix")
        namespace = {"safetensors": __import__("safetensors.torch"), "model": model, "path": "model.safetensors"}
        case.exec(save, namespace)
        namespace["model"] = model = _tied()
        case.exec(f"from safetensors.torch import load_model\n{load}", namespace)
    else:
        st.save_file({k: v.clone().contiguous() for k, v in model.state_dict().items()}, "model.safetensors")
        model = _tied()
        model.load_state_dict(st.load_file("model.safetensors"), assign=True)
    return case.exec(f"print({case.code('Verify', 'data_ptr() ==')})", {"model": model})


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "True" for out in outputs)
