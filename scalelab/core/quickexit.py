"""Process start and end without the interpreter's overheads, for the processes that import PyTorch: the ranks
(scalelab/train) and torchrun's agent (scalelab/core/torchrun.py).

Here, in core, so that both can use them: train imports core, never the reverse.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn


@contextmanager
def collector_paused(collect: bool = False) -> Iterator[None]:
    """Python's cyclic garbage collector off for a block that makes many long-lived objects (PyTorch's and
    `torch._dynamo`'s imports: it walked them again and again while they loaded, docs/benchmarks.md, tenth
    stop); `collect`: one collection at the end, for what the block left behind. Restored as it was."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collect:
            gc.collect()
        if was_on:
            gc.enable()


def exit_without_teardown(code: int) -> NoReturn:
    """Leave the process with `code` once its output is flushed, skipping the interpreter's teardown.

    Every rank entry point (the trainer, the script runner, the bench's per-rank commands) ends here: the
    teardown runs C++ static destructors while Gloo's (or Horovod's) threads may still be joinable, which
    aborts the process now and then ("terminate called without an active exception", exit -6) after it had
    done its work, and the launcher or torchrun would report a failure. torchrun's agent ends here too: its
    teardown of what `import torch` made took about 0.45 s of every launch (scalelab/core/torchrun.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
