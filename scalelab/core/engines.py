"""The engines by name, and what starts each one's ranks: the table every layer reads.

An engine is two things: a class in scalelab/train/engines.py (the distributed calls a rank makes,
which needs PyTorch) and a line here (how its ranks are started, which needs none). Launchers, the
spec's checks and the CLI's choices read this table, so none of them names an engine and a new one
started like an existing one needs no change outside these two files. How each starter becomes a
command line, a rank's environment or Horovod's settings is written once, in scalelab/core/launch.py.

This module imports nothing of ours: the spec (scalelab/core/spec.py) takes its list of engines
from it.
"""

from __future__ import annotations

from scalelab.core.errors import SpecError

# What starts an engine's ranks.
PLAIN = "plain"  # one process, `python -m scalelab.train RUN_DIR`: no rendezvous
TORCHRUN = "torchrun"  # one torchrun agent per node; env:// rendezvous (RANK, MASTER_ADDR, ...) on node 0
HOROVODRUN = "horovodrun"  # one horovodrun (or mpirun) for the whole run; Gloo (or MPI) rendezvous, HOROVOD_* settings
STARTERS = (PLAIN, TORCHRUN, HOROVODRUN)

#: Each engine and its starter, in the order the CLI lists them. A new engine: its line here and its
#: class in scalelab/train/engines.py (`make_engine`).
ENGINE_STARTERS: dict[str, str] = {
    "single": PLAIN,
    "ddp": TORCHRUN,
    "horovod": HOROVODRUN,
    "ps": TORCHRUN,
}
ENGINES = tuple(ENGINE_STARTERS)
assert set(ENGINE_STARTERS.values()) <= set(STARTERS)
#: Each engine in a few words: `--engine`'s help is made of this.
ENGINE_HELP: dict[str, str] = {
    "single": "one worker, no exchange",
    "ddp": "torch.distributed DistributedDataParallel",
    "horovod": "Horovod all-reduce",
    "ps": "parameter server (sharded push and pull over torch.distributed)",
}
assert tuple(ENGINE_HELP) == ENGINES


def starter(engine: str) -> str:
    """How `engine`'s ranks start (PLAIN, TORCHRUN or HOROVODRUN): the one place an unknown engine fails,
    so that no backend falls through to some other engine's launcher."""
    try:
        return ENGINE_STARTERS[engine]
    except KeyError:
        raise SpecError(f"unknown engine {engine!r}; valid engines: {', '.join(ENGINES)}") from None
