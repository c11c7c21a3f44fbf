"""scalelab trainer: LSTM models, data, distributed engines and per-step records."""

from collections.abc import Iterator
from contextlib import contextmanager
import gc


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
