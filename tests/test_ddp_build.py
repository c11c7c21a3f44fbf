"""scalelab/train/ddp.py: PyTorch's DistributedDataParallel built without importing the compiler, and still
training as PyTorch's own class does. Each check runs in a process of its own: this one may have imported
the compiler already, and importing it here would cost every later test in this worker."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from scalelab.train import ddp


def _python(code: str, tmp_path: Path) -> dict:
    """Run `code` (GROUP first) in a process of its own; its last line, JSON."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(GROUP + code), str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


GROUP = """
    import json, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from scalelab.train import ddp
    def join():
        dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    def compiler():
        return [m for m in sys.modules if m.startswith("torch._dynamo")] + [n for n in vars(torch) if n == "_dynamo"]
"""


def test_the_trainers_ddp_trains_as_pytorchs_and_imports_no_compiler(tmp_path) -> None:
    """The DDP engine's wrap, forward and backward (its context manager marks the active module, as PyTorch's
    does), the bf16 comm hook, `no_sync`, a state dict, static graph with unused parameters, and a constructor
    that raises: the gradients those of PyTorch's own class with the same hook (bf16-rounded; without it under
    `no_sync`), and `torch._dynamo` absent from the process and
    from torch's namespace throughout; then importable, the real one, saying DEFAULT_MODE."""
    out = _python("""
    import os
    from scalelab.core.net import free_port
    from scalelab.core.spec import EngineSpec
    from scalelab.train.engines import ddp_compression_hook, make_engine
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    engine = make_engine(EngineSpec(compression="bf16"))  # joins its group as a torchrun rank does
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    seen = []
    def grads(model):
        model.zero_grad()
        model(x).pow(2).sum().backward()
        return [p.grad.tolist() for p in model.parameters()]
    inner = torch.nn.Linear(3, 2)
    inner.register_forward_hook(lambda *a: seen.append(DDP._get_active_ddp_module()))
    model, _ = engine.wrap(inner, None)
    hooked = grads(model)
    with model.no_sync():
        unsynced = grads(model)
    state = model.state_dict()
    static = ddp.build(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)), static_graph=True,
                       find_unused_parameters=True)
    static(x).sum().backward()
    try:
        ddp.build(torch.nn.ReLU())  # no parameters: PyTorch refuses
        raised = False
    except RuntimeError:
        raised = True
    absent = compiler()
    plain = torch.nn.Linear(3, 2)
    plain.load_state_dict(inner.state_dict())
    theirs = DDP(plain)  # imports the compiler, as PyTorch's class does
    theirs.register_comm_hook(None, ddp_compression_hook("bf16"))
    import torch._dynamo
    print(json.dumps({"absent": absent, "same": hooked == grads(theirs), "unsynced": unsynced == grads(plain),
                      "rounded": hooked != unsynced, "class": type(model).__name__,
                      "active": seen[0] is model, "after": DDP._get_active_ddp_module() is None,
                      "keys": sorted(state), "raised": raised, "real": torch._dynamo.utils.get_optimize_ddp_mode()}))
    """, tmp_path)
    assert out == {"absent": [], "same": True, "unsynced": True, "rounded": True, "class": "EagerDistributedDataParallel", "active": True, "after": True,
                   "keys": ["module.bias", "module.weight"], "raised": True, "real": ddp.DEFAULT_MODE}


def test_anything_else_asked_of_the_stand_in_is_the_real_compilers(tmp_path) -> None:
    """Another name read through the stand-in imports the real compiler, which then stays in torch's namespace;
    with the compiler imported already, the stand-in leaves it as it is and PyTorch's own class is built."""
    out = _python("""
    join()
    with ddp._compiler_stand_in() as stand:
        config = torch._dynamo.config  # not one of the stand-in's answers
        real_utils = torch._dynamo.utils is sys.modules["torch._dynamo.utils"]  # the real module now
    stays = "_dynamo" in vars(torch) and torch._dynamo is sys.modules["torch._dynamo"]
    with ddp._compiler_stand_in() as again:
        untouched = again is sys.modules["torch._dynamo"] is vars(torch)["_dynamo"]
    print(json.dumps({"config": config is sys.modules["torch._dynamo.config"], "real_utils": real_utils,
                      "stays": stays, "untouched": untouched and "_dynamo" in vars(torch),
                      "class": type(ddp.build(torch.nn.Linear(3, 2))) is DDP}))
    """, tmp_path)
    assert out == {"config": True, "real_utils": True, "stays": True, "untouched": True, "class": True}


def test_this_pytorch_gets_the_eager_context_manager() -> None:
    """On the PyTorch of the lock the wrapper is found and unwrapped (elsewhere the class is PyTorch's as it is)."""
    assert ddp._FORWARD_CONTEXT is not None
    assert ddp.EagerDistributedDataParallel._inside_ddp_forward.__wrapped__ is ddp._FORWARD_CONTEXT
