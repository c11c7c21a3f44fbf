"""PyTorch's DistributedDataParallel, built without importing the compiler (`torch._dynamo`).

DDP touches the compiler twice, both times only to cooperate with it:
- its constructor reads one compiler setting, `torch._dynamo.config.optimize_ddp` (through
  `torch._dynamo.utils.get_optimize_ddp_mode()`), to choose between its C++ reducer and the Python one
  that only compiled autograd uses;
- its forward enters `_inside_ddp_forward`, a context manager wrapped in `torch._disable_dynamo`, which
  imports the compiler on its first call to mark it as not to be traced.
Reading that one setting imported all of `torch._dynamo`: 0.8 s of CPU and 70 MiB resident in each DDP
rank, 40 % of a CPU rank's start (docs/benchmarks.md, stop 66). The optimizers' own imports of it are
avoided the same way already (scalelab/train/optim.py).

While the compiler is not imported, nothing in this process can have changed that setting (it lives in the
compiler's own config module and reads no environment variable), so it holds its default, whose mode is
DEFAULT_MODE (tests/test_ddp_build.py checks that against PyTorch's own answer). `build` then lends the
constructor a stand-in `torch._dynamo` that gives that one answer and imports the real compiler for
anything else it is asked (slower, never wrong), and builds a subclass whose `_inside_ddp_forward` is the
same context manager without the wrapper: the trainer never compiles its DDP model, so there is no trace to
keep out. Where the compiler is imported already (an output layer compiled first), PyTorch's own class is
built as it is. A user's own script (`--script`) builds its own DDP.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

#: What `torch._dynamo.utils.get_optimize_ddp_mode()` says while `optimize_ddp` holds its default (True).
DEFAULT_MODE = "ddp_optimizer"


def build(module: torch.nn.Module, **kwargs: Any) -> DistributedDataParallel:
    """`DistributedDataParallel(module, **kwargs)`, without importing the compiler where it is not imported yet."""
    if "torch._dynamo" in sys.modules:
        return DistributedDataParallel(module, **kwargs)
    with compiler_stand_in():
        return eager_class()(module, **kwargs)


@functools.cache
def eager_class() -> type[DistributedDataParallel]:
    """DistributedDataParallel with `_inside_ddp_forward` unwrapped; the class itself where that is not a
    wrapped generator as expected (another PyTorch release): then nothing is changed."""
    inside = inspect.unwrap(DistributedDataParallel._inside_ddp_forward)
    if inside is DistributedDataParallel._inside_ddp_forward or not inspect.isgeneratorfunction(inside):
        return DistributedDataParallel
    return type("DistributedDataParallel", (DistributedDataParallel,),
                {"_inside_ddp_forward": contextlib.contextmanager(inside), "__module__": __name__})


class _Stand(types.ModuleType):
    """A module of the compiler as DDP's constructor sees it: the names given here answered, any other one
    read from the real module (`real`, imported then)."""

    def __init__(self, real: str, **names: Any) -> None:
        super().__init__(real)
        self._real = real
        self.__dict__.update(names)

    def __getattr__(self, name: str) -> Any:  # only for names not set above
        return getattr(importlib.import_module(self._real), name)


@contextlib.contextmanager
def compiler_stand_in() -> Iterator[types.ModuleType]:
    """`torch._dynamo`, as `torch._dynamo` reads without an import statement, the stand-in for the block. An
    `import torch._dynamo` in the block imports the real one, which then stays."""
    utils = _Stand("torch._dynamo.utils", get_optimize_ddp_mode=lambda: DEFAULT_MODE)
    stand = _Stand("torch._dynamo", utils=utils)
    torch._dynamo = stand  # type: ignore[attr-defined]  # torch's own __getattr__ imports it otherwise
    try:
        yield stand
    finally:
        if torch.__dict__.get("_dynamo") is stand:
            del torch._dynamo  # type: ignore[attr-defined]
