"""CKPT-01, -03, -04, -05, -06, -07, -08, -09, -12 on CPU: what loading a checkpoint prints.

    python evals/repros/ckpt_load_errors.py

Each case writes a small checkpoint to a temporary directory, loads it the way the entry says
fails, and holds the exact exception text against the entry's signatures (see _catalog_check.py).
CKPT-04 needs a checkpoint saved on a GPU; it is written here by registering a storage tagger that
labels CPU storages ``cuda:0``, which is what a GPU-saved file records.
"""

import argparse
import tempfile
import warnings
from pathlib import Path

import torch
from _catalog_check import check, note, raised, summary
from torch import nn


class Net(nn.Module):
    def __init__(self, n: int = 2) -> None:
        super().__init__()
        self.fc = nn.Linear(n, 2)


def ckpt01(tmp: Path) -> None:
    path = tmp / "ckpt.pt"
    torch.save(Net().state_dict(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a copy or a save interrupted half way
    check("CKPT-01", "file cut in half", raised(lambda: torch.load(path, map_location="cpu")))
    path.write_bytes(b"")
    note("0-byte file", raised(lambda: torch.load(path, map_location="cpu")))


def ckpt03(tmp: Path) -> None:
    path = tmp / "ckpt.pt"
    torch.save({"model": Net().state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    check("CKPT-03", "argparse.Namespace", raised(lambda: torch.load(path, map_location="cpu")),
          show="WeightsUnpickler")


def ckpt04(tmp: Path) -> None:
    path = tmp / "gpu.pt"

    def as_cuda(obj):  # what torch's own tagger returns for a storage on GPU 0
        return "cuda:0" if getattr(obj, "device", None) == torch.device("cpu") else None

    torch.serialization.register_package(0, as_cuda, lambda obj, location: None)
    try:
        torch.save(Net().state_dict(), path)
    finally:
        torch.serialization._package_registry[:] = [
            p for p in torch.serialization._package_registry if p[1] is not as_cuda]
    check("CKPT-04", "no map_location", raised(lambda: torch.load(path)))
    sd = torch.load(path, map_location="cpu")
    note("map_location='cpu'", f"loads: {sorted(sd)}")


def ckpt05_07(tmp: Path) -> None:
    import torch.distributed as dist

    path = tmp / "ddp.pt"
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'pg'}", rank=0, world_size=1)
    try:
        torch.save(nn.parallel.DistributedDataParallel(Net()).state_dict(), path)
    finally:
        dist.destroy_process_group()
    sd = torch.load(path)
    check("CKPT-05", "DDP checkpoint, plain model", raised(lambda: Net().load_state_dict(sd)),
          show="Unexpected")
    check("CKPT-07", "the same with strict=False", repr(Net().load_state_dict(sd, strict=False)))
    fixed = torch.nn.modules.utils.consume_prefix_in_state_dict_if_present
    fixed(sd, "module.")
    note("consume_prefix_in_state_dict", str(Net().load_state_dict(sd)))


def ckpt06() -> None:
    sd = torch.compile(Net()).state_dict()  # no compilation happens until the first call
    check("CKPT-06", "compiled checkpoint, plain", raised(lambda: Net().load_state_dict(sd)),
          show="Unexpected")
    check("CKPT-06", "plain checkpoint, compiled",
          raised(lambda: torch.compile(Net()).load_state_dict(Net().state_dict())), show="Missing")


def ckpt08() -> None:
    sd = nn.Linear(2, 3).state_dict()
    check("CKPT-08", "Linear(2,3) into Linear(2,2)", raised(lambda: nn.Linear(2, 2).load_state_dict(sd)),
          show="size mismatch")


def ckpt09() -> None:
    old = Net(2)
    saved = torch.optim.AdamW(old.parameters()).state_dict()
    frozen = Net(2)
    frozen.fc.bias.requires_grad_(False)  # e.g. a layer frozen after the checkpoint was written
    new = torch.optim.AdamW([p for p in frozen.parameters() if p.requires_grad])
    check("CKPT-09", "one parameter less", raised(lambda: new.load_state_dict(saved)))
    groups = torch.optim.AdamW([{"params": [frozen.fc.weight]}, {"params": [frozen.fc.bias]}])
    check("CKPT-09", "two groups instead of one", raised(lambda: groups.load_state_dict(saved)))


def ckpt12(tmp: Path) -> None:
    try:
        from safetensors.torch import save_file
    except ImportError:
        print(f"{'CKPT-12':8} {'tied weights':28} {'skipped':9} | safetensors is not installed")
        return
    import safetensors

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(4, 2)
            self.head = nn.Linear(2, 4, bias=False)
            self.head.weight = self.emb.weight

    text = raised(lambda: save_file(Tied().state_dict(), str(tmp / "m.safetensors")))
    check("CKPT-12", f"tied weights, st {safetensors.__version__}", text, show="Some tensors")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ckpt01(tmp)
        ckpt03(tmp)
        ckpt04(tmp)
        ckpt05_07(tmp)
        ckpt06()
        ckpt08()
        ckpt09()
        ckpt12(tmp)
    raise SystemExit(summary())
