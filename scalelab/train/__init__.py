"""scalelab trainer: LSTM models, data, distributed engines and per-step records."""

from collections.abc import Iterator
from contextlib import contextmanager
import gc
import os
import sys
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
    """Leave a rank's process with `code` once its output is flushed, skipping the interpreter's teardown.

    Every rank entry point (the trainer, the script runner, the bench's per-rank commands) ends here: the
    teardown runs C++ static destructors while Gloo's (or Horovod's) threads may still be joinable, which
    aborts the process now and then ("terminate called without an active exception", exit -6) after it had
    done its work, and the launcher or torchrun would report a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
