"""The trainer's optimizers, in classes whose methods do not import the compiler (`torch._dynamo`).

Every `torch.optim` optimizer imports `torch._dynamo` the first time it is built or stepped, only to tell
the compiler where not to trace: `add_param_group`, `zero_grad`, `state_dict` and `load_state_dict` are
wrapped in `torch._disable_dynamo`, which imports it on its first call, and `step` in
`_use_grad_for_differentiable`, which imports it to call `torch._dynamo.graph_break()`, a no-op outside a
compiled region. The import is the biggest part of a CPU rank's start-up: 2.5-3.7 s of CPU instead of
6.0-6.3 s for import, build and three steps of an Adam, and 80 MB less resident (docs/benchmarks.md,
eleventh stop). The trainer never calls its optimizer from compiled code (only the output layer's loss is
compiled, `scalelab/train/outloss.py`), so `eager(cls)` gives a subclass whose methods are those same
functions unwrapped, with `step` still run with gradients off (`differentiable=False`), as the wrapper did.
Horovod's `DistributedOptimizer` subclasses it in turn, so its step reaches these. DDP's constructor imported
the compiler of its own accord until stop 66 (scalelab/train/ddp.py avoids that too). The CPU memory
prediction's errors did not move (docs/benchmarks.md has them before and after).

Where a PyTorch release wraps these differently (nothing to unwrap), the optimizer is PyTorch's class as
it is: slower to start, never wrong. A user's own script (`--script`) builds its own optimizers.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

# The Optimizer methods wrapped in `torch._disable_dynamo` (torch/optim/optimizer.py).
UNWRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


@functools.cache
def eager(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """`cls` with its step and the UNWRAPPED methods as plain functions (one subclass per class: PyTorch hooks
    a class's `step` for its profiler the first time one is built); `cls` itself where any of them is not
    wrapped as expected (another PyTorch release): then nothing is changed."""
    step = inspect.unwrap(cls.step)  # through PyTorch's profiler hook and `_use_grad_for_differentiable`
    methods: dict[str, Any] = {name: inspect.unwrap(getattr(torch.optim.Optimizer, name)) for name in UNWRAPPED}
    if step is cls.step or any(fn is getattr(torch.optim.Optimizer, name) for name, fn in methods.items()):
        return cls

    @functools.wraps(step)
    def eager_step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"step": eager_step, **methods, "__module__": __name__})
