"""The trainer's optimizers (scalelab/train/optim.py): PyTorch's Adam and SGD without the compiler's import.

What could go wrong: a different update (the unwrapped step must run with gradients off, as PyTorch's
wrapper does), a checkpoint that no longer loads into PyTorch's class or back, a subclass that Horovod's
DistributedOptimizer cannot wrap, or `torch._dynamo` imported after all (the start-up saved is gone)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from scalelab.core.spec import Spec
from scalelab.train.loop import make_optimizer
from scalelab.train.optim import eager


def _trained(make, steps: int = 5) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.LSTM(6, 5, num_layers=2)
    opt = make(model)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        out, _ = model(torch.randn(4, 3, 6, generator=gen))
        (out ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


CASES = {
    "adam-fused": (torch.optim.Adam, dict(lr=0.01, fused=True)),
    "adam-foreach": (torch.optim.Adam, dict(lr=0.01, foreach=True)),
    "sgd-momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, foreach=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_updates_and_state_as_pytorchs_class(case: str) -> None:
    cls, kwargs = CASES[case]
    ours, our_opt = _trained(lambda m: eager(cls)(m.parameters(), **kwargs))
    theirs, their_opt = _trained(lambda m: cls(m.parameters(), **kwargs))
    assert type(our_opt) is not cls and isinstance(our_opt, cls)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
        assert a.grad_fn is None
    ours_state, their_state = our_opt.state_dict(), their_opt.state_dict()
    assert ours_state["param_groups"] == their_state["param_groups"]
    for key, value in their_state["state"].items():
        for name, tensor in value.items():
            assert torch.equal(ours_state["state"][key][name], tensor), (key, name)
    # A checkpoint loads either way: PyTorch's class from ours, ours from PyTorch's.
    cls(theirs.parameters(), **kwargs).load_state_dict(ours_state)
    eager(cls)(ours.parameters(), **kwargs).load_state_dict(their_state)
    assert torch.is_grad_enabled()  # the step's grad mode was restored


def test_the_trainers_optimizer_is_the_eager_one() -> None:
    model = torch.nn.Linear(3, 2)
    assert type(make_optimizer(Spec(), model, 0.01)) is eager(torch.optim.Adam)
    assert type(make_optimizer(Spec(optimizer="sgd"), model, 0.01)) is eager(torch.optim.SGD)
    assert eager(torch.optim.Adam) is eager(torch.optim.Adam)  # one subclass: PyTorch hooks its step once


def test_building_stepping_and_checkpointing_import_no_compiler() -> None:
    """In a process of its own (this one may have imported the compiler already): what a rank does with its
    optimizer, and `torch._dynamo` still absent at the end."""
    code = textwrap.dedent("""
        import sys, torch
        from scalelab.core.spec import Spec
        from scalelab.train.loop import make_optimizer
        for name in ("adam", "sgd"):
            model = torch.nn.LSTM(4, 4)
            opt = make_optimizer(Spec(optimizer=name), model, 0.01)
            out, _ = model(torch.randn(2, 2, 4))
            out.sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            opt.load_state_dict(opt.state_dict())
        print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_horovods_distributed_optimizer_wraps_it() -> None:
    """One Horovod rank in a process of its own: DistributedOptimizer subclasses our class, steps through it,
    and still imports no compiler."""
    pytest.importorskip("horovod.torch")
    code = textwrap.dedent("""
        import sys, torch
        import horovod.torch as hvd
        from scalelab.core.spec import Spec
        from scalelab.train.loop import make_optimizer
        from scalelab.train.optim import eager
        hvd.init()
        model = torch.nn.Linear(3, 2)
        opt = hvd.DistributedOptimizer(make_optimizer(Spec(), model, 0.1), named_parameters=model.named_parameters())
        before = model.weight.detach().clone()
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
        assert isinstance(opt, eager(torch.optim.Adam)), type(opt).__mro__
        assert not torch.equal(before, model.weight)
        print("torch._dynamo" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout
