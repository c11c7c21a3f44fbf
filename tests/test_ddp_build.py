"""scalelab/train/ddp.py: PyTorch's DistributedDataParallel built without importing the compiler, and still
training as PyTorch's own class does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from scalelab.train import ddp


def _python(code: str, tmp_path: Path) -> dict:
    """Run `code` in a process of its own (this one may have imported the compiler already); its last line, JSON."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


GROUP = """
    import json, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from scalelab.train import ddp
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
"""


def test_the_default_mode_is_pytorchs_own_answer() -> None:
    """The one answer the stand-in gives, against the compiler's own (PyTorch's default configuration)."""
    import torch._dynamo.utils

    assert torch._dynamo.utils.get_optimize_ddp_mode() == ddp.DEFAULT_MODE


def test_built_trained_and_no_compiler_imported(tmp_path) -> None:
    """Built, forward and backward through DDP (its context manager marks the active module, as PyTorch's
    does), gradients equal to PyTorch's own class's; `torch._dynamo` absent from the process and from torch's
    namespace afterwards, and importable as the real one then."""
    out = _python(GROUP + """
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    seen = []
    def grads(model):
        model.zero_grad()
        model(x).pow(2).sum().backward()
        return [p.grad.tolist() for p in model.parameters()]
    inner = torch.nn.Linear(3, 2)
    inner.register_forward_hook(lambda *a: seen.append(DDP._get_active_ddp_module()))
    model = ddp.build(inner, bucket_cap_mb=1)
    ours = grads(model)
    absent = [m for m in sys.modules if m.startswith("torch._dynamo")] + [n for n in vars(torch) if n == "_dynamo"]
    theirs = grads(DDP(inner, bucket_cap_mb=1))  # imports the compiler, as PyTorch's class does
    import torch._dynamo
    print(json.dumps({"absent": absent, "same": ours == theirs, "ddp": isinstance(model, DDP),
                      "active": seen[0] is model, "after": seen[0] is not None and DDP._get_active_ddp_module() is None,
                      "real": torch._dynamo.utils.get_optimize_ddp_mode()}))
    """, tmp_path)
    assert out == {"absent": [], "same": True, "ddp": True, "active": True, "after": True, "real": ddp.DEFAULT_MODE}


def test_anything_else_asked_of_the_stand_in_is_the_real_compilers(tmp_path) -> None:
    """Another name read through the stand-in imports the real compiler, which then stays; and with the
    compiler imported already, PyTorch's own class is built as it is."""
    out = _python(GROUP + """
    with ddp.compiler_stand_in() as stand:
        config = torch._dynamo.config  # not one of the stand-in's answers
        mode = torch._dynamo.utils.get_optimize_ddp_mode()  # the real module now
    import torch._dynamo.config as real_config
    model = ddp.build(torch.nn.Linear(3, 2))
    print(json.dumps({"config": config is real_config, "stays": torch._dynamo is sys.modules["torch._dynamo"],
                      "mode": mode, "class": type(model) is DDP}))
    """, tmp_path)
    assert out == {"config": True, "stays": True, "mode": ddp.DEFAULT_MODE, "class": True}


def test_the_eager_class_is_one_subclass_of_pytorchs() -> None:
    cls = ddp.eager_class()
    assert cls is ddp.eager_class() and issubclass(cls, torch.nn.parallel.DistributedDataParallel)
    assert cls is not torch.nn.parallel.DistributedDataParallel  # this PyTorch wraps the context manager
