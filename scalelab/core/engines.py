"""The engines by name and the facts every layer needs about them: the table every layer reads.

An engine is two things: a class in scalelab/train/engines.py (the distributed calls a rank makes,
which needs PyTorch) and an `Engine` line here: the name of its starter (how its ranks start: a
`Starter` of scalelab/core/launch.py, which writes the command lines, the rank environment, what Slurm
runs before srun and which Kubernetes workload) and the facts other layers ask about it - that it runs
one worker, that its buckets hold a second copy of the gradients (memory), that its exchange runs
inside the backward (reports), which gradient compressions it takes, that it is the parameter server
(its ps_* settings). No module compares an engine's name: it asks `engine(name)` for a fact, so a new
engine started like an existing one needs no change outside these two files.

This module imports nothing of ours but the errors: the spec (scalelab/core/spec.py) takes its list of
engines from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.core.errors import SpecError

# The starters' names (their objects: scalelab/core/launch.py, STARTERS).
PLAIN = "plain"  # one process, `python -m scalelab.train RUN_DIR`: no rendezvous
TORCHRUN = "torchrun"  # one torchrun agent per node; env:// rendezvous (RANK, MASTER_ADDR, ...) on node 0
HOROVODRUN = "horovodrun"  # one horovodrun (or mpirun) for the whole run; Gloo (or MPI) rendezvous, HOROVOD_* settings


@dataclass(frozen=True)
class Engine:
    """One engine's facts. `starter`: the name of its `Starter` (scalelab/core/launch.py)."""

    name: str
    starter: str
    help: str  # a few words: `--engine`'s help is made of these
    one_worker: bool = False  # exactly one worker, no exchange (a layout of more is refused)
    gradient_copy: bool = False  # its buckets hold a second copy of the gradients (costs/memory.py)
    exchange_in_backward: bool = False  # the exchange overlaps the backward: no separate time (reports say so)
    compressions: tuple[str, ...] = ("fp16", "bf16")  # the --grad-compression formats it can exchange in
    parameter_server: bool = False  # the --ps-* settings are its (shards, placement, state)
    # the EngineSpec fields only it reads (`--fusion-threshold-mb` with --engine ddp was ignored without a word):
    # one given to another engine is refused (`core.spec.Spec.unread_settings`), naming this engine
    settings: tuple[str, ...] = ()
    words: str = ""  # what those settings are in a few words, for those messages: "Horovod's tensor fusion"


#: Every engine, in the order the CLI lists them. A new engine: its line here and its class in
#: scalelab/train/engines.py (`make_engine`).
ENGINE_TABLE: dict[str, Engine] = {e.name: e for e in (
    Engine("single", PLAIN, "one worker, no exchange", one_worker=True),
    Engine("ddp", TORCHRUN, "torch.distributed DistributedDataParallel", gradient_copy=True,
           exchange_in_backward=True, settings=("bucket_cap_mb",), words="DistributedDataParallel's buckets"),
    Engine("horovod", HOROVODRUN, "Horovod all-reduce", compressions=("fp16",),  # Horovod 0.28: no bf16 all-reduce
           settings=("fusion_threshold_mb", "cycle_time_ms"), words="Horovod's tensor fusion"),
    Engine("ps", TORCHRUN, "parameter server (sharded push and pull over torch.distributed)", parameter_server=True,
           settings=("ps_shards", "ps_state", "ps_placement"), words="the parameter server"),
)}
ENGINES = tuple(ENGINE_TABLE)
ENGINE_STARTERS: dict[str, str] = {name: e.starter for name, e in ENGINE_TABLE.items()}
ENGINE_HELP: dict[str, str] = {name: e.help for name, e in ENGINE_TABLE.items()}


def setting_owners(setting: str) -> list[Engine]:
    """The engines that read EngineSpec field `setting`; none for a setting every engine reads."""
    return [e for e in ENGINE_TABLE.values() if setting in e.settings]


def engine(name: str) -> Engine:
    """The facts of engine `name`: the one place an unknown engine fails, so that no layer guesses."""
    try:
        return ENGINE_TABLE[name]
    except KeyError:
        raise SpecError(f"unknown engine {name!r}; valid engines: {', '.join(ENGINES)}") from None


def starter(name: str) -> str:
    """The name of the starter of engine `name` (its object: `scalelab.core.launch.starter_of`)."""
    return engine(name).starter


def known_fact(name: object, fact: str) -> bool:
    """A fact of an engine named in a table that may come from elsewhere (a CSV's engine column): False for a
    name that is no engine of ours."""
    known = ENGINE_TABLE.get(str(name))
    return bool(getattr(known, fact)) if known is not None else False
