"""PyTorch's DistributedDataParallel, built without importing the compiler (`torch._dynamo`).

In its default mode DDP touches the compiler twice, both times only to cooperate with it:
- its constructor reads one compiler setting, `torch._dynamo.config.optimize_ddp` (through
  `torch._dynamo.utils.get_optimize_ddp_mode()`), to choose between its C++ reducer and the Python one
  that only compiled autograd uses;
- its forward enters `_inside_ddp_forward`, a context manager wrapped in `torch._disable_dynamo`, which
  imports the compiler on its first call to mark it as not to be traced.
Reading that one setting imported all of `torch._dynamo`: 0.8 s of CPU and 73 MiB resident in each DDP
rank, 40 % of a CPU rank's start (docs/benchmarks.md, "DDP without the compiler's import", stop 66). The
optimizers' own imports of it are avoided the same way already (scalelab/train/optim.py).

While the compiler is not imported, nothing in this process can have changed that setting (it lives in the
compiler's own config module and reads no environment variable), so it holds its default, whose mode is
DEFAULT_MODE (tests/test_ddp_build.py checks that against PyTorch's own answer). `build` then lends the
constructor a stand-in `torch._dynamo` that gives that one answer and imports the real compiler for any
other name it is asked, and builds EagerDistributedDataParallel, whose `_inside_ddp_forward` is the same
context manager without the wrapper: the trainer never compiles its DDP model, so there is no trace to keep
out. The stand-in is process-wide for as long as the constructor runs (its collectives included), so it is
for a rank that builds its DDP on one thread, as the trainer does. Where the compiler is imported already
(an output layer compiled first), PyTorch's own class is built as it is, and where a PyTorch release wraps
the context manager otherwise, EagerDistributedDataParallel is PyTorch's class unchanged. A user's own
script (`--script`) builds its own DDP.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

#: What `torch._dynamo.utils.get_optimize_ddp_mode()` says while `optimize_ddp` holds its default (True).
DEFAULT_MODE = "ddp_optimizer"


def build(module: torch.nn.Module, **kwargs: Any) -> DistributedDataParallel:
    """`DistributedDataParallel(module, **kwargs)`, without importing the compiler where it is not imported yet."""
    if "torch._dynamo" in sys.modules:
        return DistributedDataParallel(module, **kwargs)
    with _compiler_stand_in():
        return EagerDistributedDataParallel(module, **kwargs)


def _unwrapped_forward_context() -> Callable[..., Any] | None:
    """The generator under `_inside_ddp_forward`'s two layers (`contextmanager`'s, then `_disable_dynamo`'s,
    told by its code's file, torch/_compile.py); None where the layers are not those two."""
    inner = getattr(DistributedDataParallel._inside_ddp_forward, "__wrapped__", None)
    code = getattr(inner, "__code__", None)
    if code is None or not code.co_filename.endswith(os.path.join("torch", "_compile.py")):
        return None
    gen = getattr(inner, "__wrapped__", None)
    return gen if inspect.isgeneratorfunction(gen) else None


class EagerDistributedDataParallel(DistributedDataParallel):
    """DistributedDataParallel whose forward's context manager is not wrapped in `torch._disable_dynamo`."""


_FORWARD_CONTEXT = _unwrapped_forward_context()
if _FORWARD_CONTEXT is not None:
    EagerDistributedDataParallel._inside_ddp_forward = contextlib.contextmanager(_FORWARD_CONTEXT)  # type: ignore[method-assign]


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
def _compiler_stand_in() -> Iterator[types.ModuleType]:
    """`torch._dynamo`, as read without an import statement, the stand-in for the block; the real module,
    untouched, where it is imported already. An `import torch._dynamo` in the block imports the real one,
    which then stays."""
    if "torch._dynamo" in sys.modules:
        yield sys.modules["torch._dynamo"]
        return
    utils = _Stand("torch._dynamo.utils", get_optimize_ddp_mode=lambda: DEFAULT_MODE)
    stand = _Stand("torch._dynamo", utils=utils)
    torch._dynamo = stand  # type: ignore[attr-defined]  # torch's own __getattr__ imports it otherwise
    try:
        yield stand
    finally:
        if torch.__dict__.get("_dynamo") is stand:
            del torch._dynamo  # type: ignore[attr-defined]
