"""The backend-neutral experiment spec.

One `Spec` says everything about a run that does not depend on where it runs: model and preset, data,
engine, layout (nodes x GPUs per node), batch mode, length, threshold, plus a free `backend_options`
mapping that each backend validates itself. It loads from YAML, is overridden by flags, and the
resolved spec is saved as `spec.json` in every run directory, so a run can always be reproduced and
the trainer reads exactly what the launcher decided.

Like submitit's executor parameters, the dataclass fields and their defaults *are* the list of valid
options: an unknown key fails at configuration time and the message lists the valid ones.
"""

from __future__ import annotations

import dataclasses

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalelab.core.engines import ENGINE_HELP, ENGINES, setting_owners  # the engine table (scalelab/core/engines.py)
from scalelab.core.engines import engine as engine_facts
from scalelab.core.errors import SpecError
from scalelab.core.writes import what_it_is
from scalelab.core.options import (
    POSITIVE,
    above,
    at_least,
    at_most,
    build,
    checked,
    coerce_fields,
    one_of,
    option,
)
from scalelab.core.presets import (OUTPUT_LOSSES, PRESETS, RNN_KINDS, config_with_overrides, model_overrides,
                                    path_flag, refuse_unread_fields)
from scalelab.core.rundir import SPEC_FILE, name_problem, write_text

# torch.manual_seed takes at most 64 bits; a bigger seed was accepted here and failed in every rank
MAX_SEED = 2**63 - 1
# Issue #37: `--lr 1e30` and `--threads 100000` were accepted. A learning rate above MAX_LR diverges with
# every optimizer here (Adam's usual range is 1e-4 to 1e-2, SGD's up to about 1); more threads per rank
# than MAX_THREADS exceeds any machine's cores (the local backend holds them to its own cores x 4).
MAX_LR = 10.0
MAX_THREADS = 1024
# `--nodes 99999999999999999999` was answered with a batch-splitting message; `--prefetch 1000000000` was
# taken (every batch ahead is held in memory). The largest clusters have some tens of thousands of nodes
# and no machine 1,024 GPUs (on a CPU, each "GPU" is a worker process); a few batches ahead hide the data time.
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1024
MAX_GPUS = 1_000_000  # more GPUs (or nodes) than any cluster has: a larger count is a typo, not a layout
MAX_PREFETCH = 1024
# `--global-batch 100000000000` reached the ranks, which failed allocating it: ten million samples is past any
# published large-batch training (tens of thousands) and any memory; exchange buffers of more than 64 GiB
# (`--fusion-threshold-mb 1e12` became an exabyte) are larger than any GPU's memory
MAX_BATCH = 10_000_000
MAX_BUFFER_MB = 65_536.0
BATCH_LIMIT = f"must be at most {MAX_BATCH:,} samples (past any published large-batch training and any memory)"
DATA_KINDS = ("synthetic", "task", "text", "shards")
BATCH_MODES = ("strong", "weak")
#: The two axes of a sweep, each `fixed` or `growing`: the global batch (split over the workers, or
#: every worker keeps its batch) and the total work (the same job, or the same work per worker).
SCALING_AXES = ("fixed", "growing")
#: The one map between the two vocabularies: a batch mode's batch axis (strong: the global batch is
#: fixed and split; weak: it grows, every worker keeps its batch). Summaries, CSV tables, sweeps and
#: the planner all translate through this.
BATCH_SCALING = {"strong": "fixed", "weak": "growing"}
#: The older --mode (and a CSV's `mode` column), as both axes at once.
MODE_AXES = {mode: (axis, axis) for mode, axis in BATCH_SCALING.items()}


def scaling_name(batch_scaling: str, work_scaling: str | None = None) -> str:
    """"strong" or "weak" for the two usual pairs of axes, else both axes ("batch-growing-work-fixed"); the work
    axis defaults to the batch's (a run outside a sweep has none of its own). The one name of a sweep's directory,
    its series label and its reports' `mode`. Why: a batch-growing, work-fixed sweep was labelled "weak", which
    means both axes growing."""
    work_scaling = work_scaling or batch_scaling
    named = {axes: mode for mode, axes in MODE_AXES.items()}
    return named.get((batch_scaling, work_scaling), f"batch-{batch_scaling}-work-{work_scaling}")


def batch_mode_of(axis: str) -> str:
    """The batch mode ("strong" | "weak") of a scaling axis ("fixed" | "growing"): `BATCH_SCALING` read backwards."""
    return next(mode for mode, a in BATCH_SCALING.items() if a == axis)
OPTIMIZERS = ("adam", "sgd")
DEVICES = ("auto", "cpu", "cuda")
BALANCE_MODES = ("static", "dynamic")
# Number formats of the training step (scalelab/train/precision.py). fp32: everything in float32; bf16 / fp16:
# forward and backward under autocast, master weights, gradients, optimizer, loss and validation in
# float32; fp16 adds a gradient scaler and needs a GPU. Why fp32 is the default: docs/benchmarks.md.
PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT_PRECISION = "fp32"
# What a run directory's spec.json means without a `precision` key: it was written before there was a
# choice, and every step ran in float32 then.
SAVED_SPEC_PRECISION = "fp32"
# The gradient exchange's format: the all-reduce in fp16 or bf16, gradients cast back to fp32 after it.
COMPRESSIONS = ("none", "fp16", "bf16")
# Where a parameter server's shards keep their parameters and optimizer state: on the CPU (TensorFlow's
# placement for PS tasks: each step copies the gradient there and the new values back) or on the
# workers' device (no copies). The same on a machine without GPUs, apart from the copies.
PS_STATES = ("device", "cpu")
# Where the parameter-server shards run: inside worker ranks (colocated), or in ranks of their own that
# train on no data (separate, TensorFlow's PS tasks): each node then runs its workers and its servers.
PS_PLACEMENTS = ("colocated", "separate")
# Where ranks run; `launcher.backend.BACKENDS` maps each name to its implementation.
BACKEND_NAMES = ("local", "slurm", "k8s", "aws")
# The EC2 type of every node when an aws spec names none: the aws backend's default (scalelab/aws/options.py) and
# what a cost estimate of such a spec prices (scalelab/costs/expected.py).
DEFAULT_AWS_INSTANCE_TYPE = "g4dn.xlarge"  # 1 T4: the cheapest type the default AMI supports (scalelab/aws/render.py)


@dataclass
class DataSpec:
    """Where batches come from. `synthetic` measures throughput; `task` is learnable (convergence);
    `text` reads files (parallel text, plain text or labelled lines, by model family); `shards` reads
    the directory `shards` that `launch prep` wrote (token ids, no tokenising at start-up)."""

    kind: str = option("synthetic", "synthetic (throughput), task (learnable, for convergence), text (files) or "
                       "shards (--shards DIR from launch prep; --data shards:DIR says both).",
                       one_of(*DATA_KINDS), flag="--data")
    train_src: str | None = option(None, "Text data: source file (NMT), text file (LM) or LABEL<TAB>text file.",
                                   flag="--train-src")
    train_tgt: str | None = option(None, "Text data: target file for translation.", flag="--train-tgt")
    valid_src: str | None = option(None, "Text data: validation source file (default: held out from training).",
                                   flag="--valid-src")
    valid_tgt: str | None = option(None, "Text data: validation target file.", flag="--valid-tgt")
    train_samples: int = option(4096, "Task data: training samples generated.", POSITIVE, flag="--train-samples")
    valid_samples: int = checked(256, POSITIVE)
    prefetch: int = option(2, "Batches prepared ahead by a background thread; 0 = none.", at_least(0),
                           at_most(MAX_PREFETCH, f"must be at most {MAX_PREFETCH} batches ahead (each is held in "
                                   "memory; a few hide the time to prepare one)"), flag="--prefetch")
    bucket: bool = True
    fixed_length: bool = option(False, "Task data: all samples full length (equal words per rank) [default: variable].",
                                flag="--fixed-length/--variable-length")
    shards: str | None = option(None, "Shards data: the directory `launch prep` wrote (local path or s3://).",
                                flag="--shards")


@dataclass
class EngineSpec:
    """Gradient-exchange settings. Defaults are the fast settings measured in docs/benchmarks.md."""

    name: str = option("ddp", "Gradient exchange: " + "; ".join(f"{n} = {what}" for n, what in ENGINE_HELP.items()) + ".",
                       one_of(*ENGINES), flag="--engine")
    fusion_threshold_mb: float = option(64.0, "Horovod tensor fusion buffer; 0 = no fusion.", at_least(0),
                                        at_most(MAX_BUFFER_MB, f"must be at most {MAX_BUFFER_MB:,.0f} MB (64 GiB, "
                                                "more than any GPU's memory)"), flag="--fusion-threshold-mb")
    cycle_time_ms: float = option(1.0, "Horovod fusion cycle time.", above(0), flag="--cycle-time-ms")
    compression: str = option("none", "Gradient exchange in fp16 or bf16 (DDP comm hook, Horovod compression; "
                              "Horovod: fp16 only). Slower on CPU: docs/benchmarks.md.", one_of(*COMPRESSIONS),
                              flag="--grad-compression")
    # the older spelling of `compression: fp16`, still read
    fp16_allreduce: bool = option(False, "Same as --grad-compression fp16 (the older flag).",
                                  flag="--fp16-allreduce/--no-fp16-allreduce")
    bucket_cap_mb: float = option(25.0, "DDP gradient bucket size.", above(0),
                                  at_most(MAX_BUFFER_MB, f"must be at most {MAX_BUFFER_MB:,.0f} MB (64 GiB, more "
                                          "than any GPU's memory)"), flag="--bucket-cap-mb")
    ps_shards: int | None = option(None, "Parameter-server shards [default: one per node].", POSITIVE,
                                   flag="--ps-shards")
    ps_state: str = option("device", "Where the parameter-server shards keep parameters and optimizer state: the "
                           "workers' device, or the CPU (TensorFlow's PS placement).", one_of(*PS_STATES),
                           flag="--ps-state")
    ps_placement: str = option("colocated", "Parameter-server shards inside the worker ranks, or in server ranks of "
                               "their own (one more rank per node per shard; they train on no data).",
                               one_of(*PS_PLACEMENTS), flag="--ps-placement")

    def servers_per_node(self, nodes: int) -> int:
        """Server ranks on each node: none unless the ps shards run separately (then one per shard)."""
        if not engine_facts(self.name).parameter_server or self.ps_placement != "separate":
            return 0
        return (self.ps_shards or nodes) // nodes

    @property
    def grad_compression(self) -> str:
        """The exchange's format, whichever way the spec said it."""
        return "fp16" if self.fp16_allreduce else self.compression


#: The fields only the built-in trainer reads (its model, data, optimizer, loop, exchange): a --script or
#: --module brings its own, so a value other than the default is refused there rather than silently ignored
#: (`Spec.trainer_settings`; `data` stands for every DataSpec field). What does apply to a script: the
#: backend and its options, the engine and Horovod's fusion settings (horovodrun's environment), the layout,
#: --steps (the progress bar's total), --warmup-steps, --loss-threshold (track.validation), --threads
#: (OMP_NUM_THREADS), --device, --name. `link_probe_mb` is not here: `launch probe` sets it, not the user.
TRAINER_ONLY = ("rnn", "precision", "model_args", "global_batch", "batch_per_worker", "epochs", "optimizer", "lr",
                "lr_warmup_steps", "lr_ref_batch", "clip_grad_norm", "data", "seed", "val_every", "val_batches",
                "checkpoint_every", "interop_threads", "independent_replicas", "balance", "balance_every",
                "emulate_slowdown", "output_loss", "cuda_graph", "profile_steps", "engine.compression",
                "engine.fp16_allreduce", "engine.bucket_cap_mb", "engine.ps_shards", "engine.ps_state",
                "engine.ps_placement")


#: The data settings that only some kinds of data read (scalelab/train/loop.py's `data_options`), each with
#: those kinds and what it is; with another kind the setting was not even looked at: `--train-src foo.txt` with
#: the default synthetic data trained on random batches (exit 0), and so did `--train-samples 100` and
#: `--fixed-length` (synthetic samples are all full length already). `prefetch` is read by every kind.
_TEXT = (("text",), "text read from files")
DATA_READERS: dict[str, tuple[tuple[str, ...], str]] = {
    "train_src": _TEXT, "train_tgt": _TEXT, "valid_src": _TEXT, "valid_tgt": _TEXT,
    "train_samples": (("task",), "a learnable task's generated samples"),
    "valid_samples": (("task",), "a learnable task's generated samples"),
    "fixed_length": (("task",), "a learnable task's generated samples"),
    "bucket": (("task", "text", "shards"), "length bucketing of samples of varying length"),
    "shards": (("shards",), "token ids written by launch prep"),
}


@dataclass(frozen=True)
class Unread:
    """A setting given other than its default that the spec's other choices leave unread (`Spec.unread_settings`):
    `--fusion-threshold-mb 32` with --engine ddp, `--balance-every 5` with --balance static. Refused as
    `--ps-placement separate` with --engine ddp was, unless it is a default meant for other runs (a config
    file's, a study's base for its other variants), which is set back to the built-in default instead."""

    key: str  # the dotted field: engine.fusion_threshold_mb
    given: str  # as the user gave it: --fusion-threshold-mb 32, or a spec file's key without a flag: data.bucket: false
    needs: str  # what it is read with: --engine horovod
    words: str  # what that is: Horovod's tensor fusion
    instead: str  # what the spec has instead: --engine ddp

    @property
    def flag(self) -> str:
        return self.given.split()[0].rstrip(":")

    def message(self) -> str:
        return (f"{self.given} is for {self.needs} ({self.words}), not {self.instead}; add {self.needs} or leave "
                f"{self.flag} out")


#: The built-in trainer's --stall-timeout-min when none is given: it writes a record at least every step, and its
#: longest silences (a validation, a checkpoint write) are seconds to minutes, so half an hour without any record
#: from any rank is a hang, never a slow run; and 20x the median step time is waited for in any case.
STALL_TIMEOUT_MIN = 30.0

#: A run's length when it gives neither --steps nor --epochs. Only then: `--epochs 3` alone runs 3 epochs, however
#: many steps they are (the default once capped them at 40, silently), see `Spec.from_dict` and the launcher's `build_spec`.
DEFAULT_STEPS = 40
MAX_STEPS = 1_000_000_000  # 1e20 steps was accepted (and priced at $6e15 by --dry-run)


@dataclass
class Spec:
    """A complete, backend-neutral description of one training run.

    Each field that has a command-line flag declares it here with `option()` (flag, help, checks):
    the `launch run` / `launch sweep` flags are generated from these declarations
    (`core.options.option_flags`), so a field and its flag cannot drift. The field types are checked
    wherever a spec is built (YAML, JSON, flags: `core.options`), and so are the declared limits;
    `validate` adds what involves several fields.
    """

    backend: str = option("local", "Where it runs: this machine, Slurm, Kubernetes or AWS.", one_of(*BACKEND_NAMES),
                          flag="--backend")
    backend_options: dict[str, Any] = field(default_factory=dict)
    model: str = option("nmt-tiny", "Model preset: nmt-tiny, nmt-small, nmt-seed, rnnlm-*, sentiment-*.",
                        flag="--model")
    rnn: str = option("fused", "fused = nn.LSTM (cuDNN on GPU); stepwise = LSTMCell loop (TF dynamic_rnn).",
                      one_of(*RNN_KINDS), flag="--rnn")
    precision: str = option(DEFAULT_PRECISION, "Number format of forward and backward: bf16 / fp16 = autocast with "
                            "fp32 master weights and loss (fp16: GPU only, with a gradient scaler).",
                            one_of(*PRECISIONS), flag="--precision")
    model_args: dict[str, Any] = field(default_factory=dict)
    engine: EngineSpec = field(default_factory=EngineSpec)
    nodes: int = option(1, "Nodes in the layout.", POSITIVE,
                        at_most(MAX_NODES, f"must be at most {MAX_NODES:,} (more nodes than any cluster has)"),
                        flag="--nodes")
    gpus_per_node: int = option(1, "Ranks per node (one per GPU; a process each on CPU).", POSITIVE,
                                at_most(MAX_GPUS_PER_NODE, f"must be at most {MAX_GPUS_PER_NODE} (more ranks per node "
                                        "than any machine has GPUs or cores)"), flag="--gpus-per-node")
    global_batch: int | None = option(None, "Strong scaling: this global batch is split across workers "
                                      "[default: the preset's].", POSITIVE, at_most(MAX_BATCH, BATCH_LIMIT),
                                      flag="--global-batch")
    batch_per_worker: int | None = option(None, "Samples per worker (rank) and step. In a run or sweep every "
                                          "worker takes this batch, so the global batch grows with the workers (weak "
                                          "scaling in the batch).", POSITIVE, at_most(MAX_BATCH, BATCH_LIMIT), flag="--batch-per-worker")
    steps: int | None = option(DEFAULT_STEPS, "Optimizer steps to run; none with --epochs and no --steps (the "
                                   "epochs decide) (with --script/--module: only the progress bar's and "
                                   "the cost preview's total; your script's own arguments go after `--`).", POSITIVE,
                               at_most(MAX_STEPS, f"must be at most {MAX_STEPS:,} (years of training at any speed)"),
                               flag="--steps")
    epochs: int | None = option(None, "Epochs to run (with --steps: whichever ends first; without --steps: all "
                                "of them).", POSITIVE,
                                flag="--epochs")
    warmup_steps: int = option(5, "Steps excluded from timings after each (re)start.", at_least(0),
                               flag="--warmup-steps")
    optimizer: str = option("adam", "Optimizer: adam or sgd (momentum 0.9).", one_of(*OPTIMIZERS),
                            flag="--optimizer")
    lr: float = option(1e-3, "Learning rate for the reference batch.", above(0),
                       at_most(MAX_LR, f"must be at most {MAX_LR:g} (above that every optimizer here diverges; Adam's "
                               "usual range is 1e-4 to 1e-2)"), flag="--lr")
    lr_warmup_steps: int = option(0, "Steps of linear LR warm-up to the scaled LR.", at_least(0),
                                  flag="--lr-warmup-steps")
    lr_ref_batch: int | None = checked(None, POSITIVE)
    clip_grad_norm: float | None = checked(5.0, above(0))  # None: no clipping
    data: DataSpec = field(default_factory=DataSpec)
    seed: int = option(1234, "Seed for model init, data order and synthetic data.", at_least(0), at_most(MAX_SEED),
                       flag="--seed")
    val_every: int = option(0, "Validate every N steps; 0 = never.", at_least(0), flag="--val-every")
    val_batches: int = option(4, "Validation batches per rank at each validation.", POSITIVE, flag="--val-batches")
    # a loss: cross-entropy is >= 0
    loss_threshold: float | None = option(None, "Stop at the first validation loss <= this; records "
                                          "time-to-threshold.", at_least(0), flag="--loss-threshold")
    checkpoint_every: int = option(0, "Checkpoint every N steps (rank 0 writes) [default: 0 = only on signals].",
                                   at_least(0), flag="--checkpoint-every")
    # How long the launcher following the run lets its ranks write no record at all, once they have stepped, before
    # it ends the run as FAILED naming the silent ranks (a hung rank: every other one waits in its collective, and
    # no timeout of Gloo's ends a wait for a peer that never enters it). None: STALL_TIMEOUT_MIN for the built-in
    # trainer, off for a --script / --module, whose own evaluations may write no record for longer than anyone
    # here can know (scalelab/launcher/runner.py's `stall_timeout_s`).
    stall_timeout_min: float | None = option(None, "End the run as FAILED when no rank has written a record for "
                                             "this many minutes after its first step (a hung rank), naming the "
                                             "silent ranks; never before 20x its median step time; 0 = never "
                                             f"[default: {STALL_TIMEOUT_MIN:g} for the built-in trainer, never for "
                                             "--script/--module].", at_least(0), flag="--stall-timeout-min")
    threads: int | None = option(None, "Intra-op threads per rank [default: cores / ranks per node; a local sweep "
                                 "gives every layout those of its widest layout].", POSITIVE,
                                 at_most(MAX_THREADS, f"must be at most {MAX_THREADS} threads per rank (more than "
                                         "any machine's cores)"), flag="--threads")
    interop_threads: int | None = option(None, "Inter-op threads per rank [default: PyTorch's].", POSITIVE,
                                         at_most(MAX_THREADS, f"must be at most {MAX_THREADS} threads per rank "
                                                 "(more than any machine's cores)"),
                                         flag="--interop-threads")
    independent_replicas: bool = option(False, "Every worker trains its own copy with no gradient exchange: the "
                                        "ideal curve that isolates communication cost.",
                                        flag="--independent-replicas/--exchange")
    balance: str = option("static", "static: equal shares of the global batch; dynamic: shares follow each "
                          "worker's measured speed (mixed hardware).", one_of(*BALANCE_MODES), flag="--balance")
    balance_every: int = option(10, "Steps between rebalancing with --balance dynamic.", POSITIVE,
                                flag="--balance-every")
    emulate_slowdown: list[float] = option([], "Testing aid: make worker i F_i times slower (mixed hardware on one "
                                           "machine).", flag="--emulate-slowdown", metavar="F0,F1,...",
                                           separator=",")
    # After the last step, all-reduce buffers of these sizes (MB) across every rank and record how long
    # each took (`link` records): the bandwidth and latency of the links the layout uses (`launch probe`).
    link_probe_mb: list[float] = field(default_factory=list)
    device: str = option("auto", "Device the ranks compute on [default: auto = GPU when present].",
                         one_of(*DEVICES), flag="--device")
    output_loss: str = option("auto", "How the output layer and its cross-entropy run: full (all float32 logits "
                              "at once), chunked (a chunk of rows at a time, plain PyTorch), compiled "
                              "(torch.compile fuses them); auto = compiled on a GPU, full on a CPU. The "
                              "same loss and gradients; see scalelab/train/outloss.py.",
                              one_of(*OUTPUT_LOSSES), flag="--output-loss")
    cuda_graph: str = option("auto", "auto: on a GPU, capture each step's forward and backward once as a CUDA "
                             "graph and replay it (one launch instead of thousands of small LSTM kernels), where "
                             "the engine, precision and shapes allow (single engine or independent replicas, not "
                             "fp16); off: always eager. The same losses; see scalelab/train/graphs.py.",
                             one_of("auto", "off"), flag="--cuda-graph")
    # "A:B": a torch.profiler trace of steps A..B per rank (profile_range)
    profile_steps: str | None = option(None, "Record a torch.profiler trace of steps A..B on every rank "
                                       "(RUN_DIR/profile/rank-R.json, Chrome trace format; the HTML report links "
                                       "them); those steps are left out of the timings.", flag="--profile-steps",
                                       metavar="A:B")
    name: str | None = option(None, "Run name (prefix of the run directory).", flag="--name")
    # Your own training code as the ranks instead of the built-in trainer (issue 34; `launch run --script
    # train.py -- ARGS`): scalelab/train/script.py runs it under the engine's starter, `scalelab.track` records.
    script: str | None = option(None, "Your own training script to run as every rank, under --engine's starter "
                                "(ddp: torch.distributed's environment; horovod: horovodrun; single: one "
                                "process); its arguments follow `--`. Not with --model.", flag="--script",
                                metavar="FILE")
    module: str | None = option(None, "Like --script, a module run as `python -m MODULE` (from the current "
                                "directory).", flag="--module", metavar="MODULE")
    script_args: list[str] = field(default_factory=list)  # what follows `--` on the command line
    # the folder the script's code lives in (the script's own, or the working directory for --module): what a
    # remote backend ships, size-checked; set by the CLI from --script / --module
    script_dir: str | None = None
    # the working directory `launch run|sweep` started in, for --script / --module (as torchrun: relative paths in
    # the script and its arguments resolve there): every launch of the run, a `launch resume` from elsewhere too,
    # starts the ranks there; set by the CLI
    workdir: str | None = None
    # how this run's total work relates to its sweep's smallest layout (set by `launch sweep`:
    # fixed = the same job, growing = the same work per worker); None for a run outside a sweep
    work_scaling: str | None = checked(None, one_of(*SCALING_AXES))

    # ---- derived values -------------------------------------------------------------------

    @property
    def own_code(self) -> bool:
        """True when the ranks run the user's --script or --module, not the built-in trainer. A name given
        empty counts (`--script "$SCRIPT"` with $SCRIPT unset): `check_code_names` refuses it, where a falsy
        test let the built-in model train in its place."""
        return self.script is not None or self.module is not None

    def check_code_names(self) -> None:
        """Refuse an empty --script or --module in one line, before anything is looked up or started."""
        for flag, value in (("--script", self.script), ("--module", self.module)):
            if value is not None and not str(value).strip():
                what = "the path of your training script" if flag == "--script" else "a module name (pkg.mod)"
                raise SpecError(f"{flag} is empty (an unset shell variable?): give {what}, or leave {flag} out "
                                "to run a built-in model")

    @property
    def script_label(self) -> str | None:
        """The user's code in a few characters (`train.py`, `pkg.mod`): model names and labels of its runs."""
        if self.script:
            return Path(self.script).name
        return self.module

    @property
    def workers(self) -> int:
        """Total ranks: one per GPU (on a machine without GPUs, one process per "GPU")."""
        return self.nodes * self.gpus_per_node

    @property
    def ranks_per_node(self) -> int:
        """Processes per node, what every backend starts: the workers, plus the parameter-server ranks
        of `--ps-placement separate` (they hold the shards and train on no data)."""
        return self.gpus_per_node + self.engine.servers_per_node(self.nodes)

    @property
    def world(self) -> int:
        """Total ranks: the workers and any separate parameter-server ranks."""
        return self.nodes * self.ranks_per_node

    def role_of(self, rank: int) -> tuple[str, int]:
        """("worker", index among the workers) or ("server", index among the ps server ranks)."""
        return rank_role(rank, self.ranks_per_node, self.engine.servers_per_node(self.nodes))

    @property
    def batch_mode(self) -> str:
        """`weak` when the per-worker batch is fixed (the global batch grows with workers)."""
        return "weak" if self.batch_per_worker is not None else "strong"

    @property
    def scaling(self) -> str:
        """The run's two axes by name (`scaling_name`): `batch_mode` where its work axis is the batch's."""
        return scaling_name(BATCH_SCALING[self.batch_mode], self.work_scaling)

    def resolved_global_batch(self, default_batch: int) -> int:
        """Global batch for this layout; `default_batch` is the preset's when neither is given."""
        if self.batch_per_worker is not None:
            return self.batch_per_worker * self.workers
        return self.global_batch if self.global_batch is not None else default_batch

    def known_steps_per_epoch(self) -> int | None:
        """The optimizer steps of one epoch where the spec alone says them (task data: --train-samples; synthetic:
        its pool), as `train.data.Dataset.steps_per_epoch` cuts them; None where the data must be read first (text,
        shards) or holds less than one global batch (the run refuses that). Why: the cost preview of an --epochs
        run counts its steps without reading data or importing torch."""
        batch = self.resolved_global_batch(PRESETS[self.model].default_batch) if self.model in PRESETS else None
        samples = {"task": self.data.train_samples, "synthetic": synthetic_pool_size(batch or 1)}.get(self.data.kind)
        return samples // batch if batch and samples and samples >= batch else None

    def per_worker_batch(self, default_batch: int) -> int:
        g = self.resolved_global_batch(default_batch)
        if g % self.workers:
            raise SpecError(
                f"global batch {g} does not split evenly across {self.workers} workers "
                f"({self.nodes} node(s) x {self.gpus_per_node}); choose a global batch that is a "
                f"multiple of {self.workers} (e.g. {max(self.workers, g // self.workers * self.workers)}), "
                "or use --batch-per-worker for weak scaling"
            )
        return g // self.workers

    def lr_scale(self, default_batch: int) -> float:
        """Linear LR scaling (Goyal et al.; Horovod's lr * hvd.size()) relative to `lr_ref_batch`.

        The reference defaults to the batch the LR was chosen for: the per-worker batch in weak
        mode (so the LR grows with the number of workers) and the global batch in strong mode (the
        optimisation problem does not change with the layout, so neither does the LR).
        """
        ref = self.lr_ref_batch
        if ref is None:
            ref = self.batch_per_worker if self.batch_per_worker is not None else self.resolved_global_batch(default_batch)
        return self.resolved_global_batch(default_batch) / ref

    def profile_range(self) -> tuple[int, int] | None:
        """--profile-steps A:B as (A, B): the first and last step traced, 1-based as step records count."""
        if self.profile_steps is None:
            return None
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(self.profile_steps))
        a, b = (int(m[1]), int(m[2])) if m else (0, 0)
        if not m or a < 1 or b < a:
            raise SpecError(f"--profile-steps takes A:B, the first and last step to trace with 1 <= A <= B "
                            f"(steps count from 1), e.g. 6:8; got {self.profile_steps!r}")
        if self.steps is not None and b > self.steps:
            raise SpecError(f"--profile-steps {a}:{b} ends after the last step ({self.steps}); "
                            f"choose B <= --steps {self.steps}, e.g. --profile-steps {min(a, self.steps)}:{self.steps}")
        return a, b

    # ---- validation ----------------------------------------------------------------------

    def _validate_ps(self) -> None:
        """A colocated shard lives in a worker process, so there can be at most one per worker (separate
        placement: `_validate_separate`). fp16's gradient scaler and 16-bit exchange are refused, not
        half-done: see the messages."""
        if self.engine.ps_placement == "separate":
            self._validate_separate()
        elif self.engine.ps_shards is not None and self.engine.ps_shards > self.workers:
            raise SpecError(
                f"--ps-shards {self.engine.ps_shards} is more than the {self.workers} workers that host the shards; "
                f"use --ps-shards {self.workers} or fewer (default: one per node)"
            )
        if self.precision == "fp16":
            raise SpecError(
                "--engine ps does not train in --precision fp16: the gradient scaler looks for overflow in the "
                "gradients a rank holds, and a parameter-server rank holds only its own shards' (none without a "
                "shard), so ranks could disagree on skipping a step; use --precision bf16 (no scaler) or fp32, "
                "or --engine ddp for fp16"
            )
        if self.engine.grad_compression != "none":
            raise SpecError(
                f"--grad-compression {self.engine.grad_compression} is not implemented for --engine ps (its push "
                "and pull send fp32 tensors); leave --grad-compression out, or use --engine ddp or horovod"
            )

    def _validate_separate(self) -> None:
        """Every node runs the same number of ranks (torchrun's --nproc-per-node, Slurm's tasks per node),
        so the server ranks must spread evenly over the nodes. A server has no data: it has no speed to
        balance by, and no slowdown to emulate."""
        shards = self.engine.ps_shards
        if shards is not None and shards % self.nodes:
            raise SpecError(
                f"--ps-placement separate runs the {shards} shard server(s) spread evenly over the {self.nodes} nodes, "
                f"and {shards} does not divide by {self.nodes}; use a multiple of {self.nodes} for --ps-shards "
                "(default: one per node)"
            )
        if self.balance == "dynamic" or self.emulate_slowdown:
            raise SpecError("--ps-placement separate does not mix with --balance dynamic or --emulate-slowdown "
                            "(server ranks train on no data); leave those out, or use --ps-placement colocated")

    def validate(self, stored: bool = False) -> "Spec":
        """Check everything that can be checked without touching a backend; raise SpecError.

        Field types and limits first (a spec built in code has not been through them), then what
        involves several fields, the preset and the data files. `stored`: the spec is read back from a run
        directory being resumed, not asked for now: a --script run's built-in trainer settings are not refused
        there (runs made before the refusal have them in spec.json, and their script never read them).
        """

        coerce_fields(self)
        if self.own_code:
            return self._validate_own_code(stored)
        check_preset(self.model)
        if not stored:  # a run made before the refusal resumes: its ranks never read the setting
            self._refuse_unread()
        self._check_combinations()
        # typed once, kept typed: `hidden_size: "256"` (or --model-arg hidden_size=256) is saved as 256, not text
        self.model_args = model_overrides(self.model_args, "in model_args")  # SpecError on bad keys or values
        cfg = config_with_overrides(PRESETS[self.model], self.model_args, "in model_args")
        if not stored:  # as `_refuse_unread`: a run made before the refusal still resumes
            refuse_unread_fields(self.model, cfg.family, self.model_args)
        self._check_text_files(cfg.family)
        self.per_worker_batch(cfg.default_batch)  # raises if a strong-scaling batch does not split
        for key in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
            path = getattr(self.data, key)
            if self.data.kind == "text" and path:
                check_text_file(path, path_flag(key))
        self._check_text_contents(cfg.family)
        batch = self.resolved_global_batch(cfg.default_batch)
        if self.data.kind == "task" and self.data.train_samples < batch:  # the ranks' "fewer than one global batch"
            raise SpecError(f"--train-samples {self.data.train_samples} is fewer than one global batch of {batch}: "
                            f"give --train-samples {batch} or more, or a smaller batch")
        if self.steps is not None and self.epochs is None and self.steps <= self.warmup_steps:
            raise SpecError(
                f"--steps {self.steps} is not more than --warmup-steps {self.warmup_steps}: the first "
                f"{self.warmup_steps} steps after every (re)start are not timed, so nothing would be measured; "
                "raise --steps or lower --warmup-steps"
            )
        return self

    def _validate_own_code(self, stored: bool = False) -> "Spec":
        """A --script / --module run: the trainer's own settings do not apply, the layout and engine do. They
        are refused when asked for now; in a stored spec (a resume) they are harmless, as the script ignores
        them."""
        self.check_code_names()
        if self.script is not None and self.module is not None:
            raise SpecError("give --script FILE or --module MODULE, not both")
        if self.module and not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", self.module):
            raise SpecError(f"--module {self.module!r} is not a module name (pkg.mod, as for python -m)")
        if self.name is not None and name_problem(str(self.name)):
            raise SpecError(f"--name {str(self.name)[:40]}... {name_problem(str(self.name))}")
        # (--loss-threshold needs no --val-every: the script validates when it likes, track.validation judges)
        if engine_facts(self.engine.name).one_worker and self.workers != 1:
            raise SpecError(
                f"engine {self.engine.name!r} runs one worker, but the layout has {self.workers} "
                f"({self.nodes} x {self.gpus_per_node}); use --engine ddp or --engine horovod"
            )
        if engine_facts(self.engine.name).parameter_server:
            raise SpecError("--engine ps is the built-in trainer's parameter server; a --script runs under "
                            "--engine ddp, horovod or single")
        given = [] if stored else self.trainer_settings()
        if given:
            one = len(given) == 1
            raise SpecError(f"{', '.join(given)} {'is an option' if one else 'are options'} of the built-in trainer, "
                            "which your own code does not read: give your script its own arguments after `--` "
                            f"(launch run --script FILE -- ARGS), or leave {'it' if one else 'them'} out")
        if not stored:  # Horovod's fusion settings reach a script's horovodrun, and no other engine's ranks
            self._refuse_unread()
        return self

    def unread_settings(self) -> list[Unread]:
        """The settings this spec gives other than their defaults that its other choices leave unread: an
        engine's own (`Engine.settings`: --bucket-cap-mb is DDP's, --fusion-threshold-mb Horovod's, --ps-* the
        parameter server's) with another engine, a data setting without a kind of data that reads it
        (`DATA_READERS`: the text files without --data text, --train-samples and --fixed-length without --data
        task, --shards without --data shards), --balance-every without --balance dynamic. Each was ignored
        without a word (exit 0)."""
        from scalelab.core.options import option_flags

        flags = {f.key: f.name for f in option_flags(Spec)}
        mine, default = self.to_dict(), Spec().to_dict()
        out = []
        for key in [f"engine.{f.name}" for f in dataclasses.fields(EngineSpec)] + \
                   [f"data.{k}" for k in DATA_READERS] + ["balance_every"]:
            value = _dotted(mine, key)
            if value == _dotted(default, key):
                continue
            shown = f"{value:g}" if isinstance(value, float) else value
            given = _flag_text(flags[key], shown) if key in flags else f"{key}: {json.dumps(shown)}"
            if key.startswith("engine."):
                owners = setting_owners(key.split(".", 1)[1])
                if owners and self.engine.name not in [e.name for e in owners]:
                    out.append(Unread(key, given, " or ".join(f"--engine {e.name}" for e in owners),
                                      " or ".join(e.words for e in owners), f"--engine {self.engine.name}"))
            elif key.startswith("data.") and self.data.kind not in DATA_READERS[key[5:]][0]:
                kinds, words = DATA_READERS[key[5:]]
                needs = f"--data {', '.join(kinds[:-1])} or {kinds[-1]}" if len(kinds) > 1 else f"--data {kinds[0]}"
                out.append(Unread(key, given, needs, words, f"--data {self.data.kind}"))
            elif key == "balance_every" and self.balance != "dynamic":
                out.append(Unread(key, given, "--balance dynamic", "shares rebalanced every N steps",
                                  f"--balance {self.balance}"))
        return out

    def drop_setting(self, key: str) -> None:
        """Set dotted field `key` back to its built-in default (a default meant for other runs: `Unread`)."""
        *path, last = key.split(".")
        owner, fresh = self, Spec()
        for part in path:
            owner, fresh = getattr(owner, part), getattr(fresh, part)
        setattr(owner, last, getattr(fresh, last))

    def _refuse_unread(self) -> None:
        unread = self.unread_settings()
        if unread:
            raise SpecError(unread[0].message())

    def trainer_settings(self) -> list[str]:
        """The built-in trainer's settings (`TRAINER_ONLY`) this spec gives other than their defaults, as flags
        with their values (`--lr 0.5`). A default given explicitly cannot be told from one left out, and is
        harmless: it changes nothing either way."""
        from scalelab.core.options import option_flags

        flags = {f.key: f.name for f in option_flags(Spec)} | {"model_args": "--model-arg"}
        mine, default = self.to_dict(), Spec().to_dict()
        out = []
        for key in trainer_only_keys():
            value = _dotted(mine, key)
            if value != _dotted(default, key):
                out.append(_flag_text(flags.get(key, key), value))
        return out

    def _check_text_contents(self, family: str) -> None:
        """What the ranks would refuse in `--data text` files, seen before a run directory exists: parallel files
        of different lengths, sentiment lines without LABEL<TAB> (`core.datafiles`: cheap checks; a huge file is
        checked by its ranks, as before)."""
        from scalelab.core.datafiles import check_labelled, check_parallel

        if self.data.kind != "text":
            return
        if family == "nmt":
            for src, tgt in (("train_src", "train_tgt"), ("valid_src", "valid_tgt")):
                a, b = getattr(self.data, src), getattr(self.data, tgt)
                if a and b:
                    check_parallel(a, b, path_flag(src), path_flag(tgt))
        elif family == "sentiment":
            for key in ("train_src", "valid_src"):
                if path := getattr(self.data, key):
                    check_labelled(path, path_flag(key))

    def _check_text_files(self, family: str) -> None:
        """`--data text` reads one file per family: a pair for translation (`--train-tgt` was not asked for,
        and the run failed in its ranks), one text for the others (a `--train-tgt` beside it was ignored)."""
        if self.data.kind != "text":
            return
        if family == "nmt" and (not self.data.train_tgt or bool(self.data.valid_src) != bool(self.data.valid_tgt)):
            missing = "--train-tgt" if not self.data.train_tgt else ("--valid-tgt" if self.data.valid_src else "--valid-src")
            raise SpecError(f"{self.model} translates: --data text needs parallel files, --train-src and --train-tgt "
                            f"(and --valid-src with --valid-tgt); {missing} is missing")
        if family != "nmt" and (self.data.train_tgt or self.data.valid_tgt):
            flag = "--train-tgt" if self.data.train_tgt else "--valid-tgt"
            raise SpecError(f"{flag} is for translation; {self.model} ({family}) reads one text file, --train-src "
                            f"(and --valid-src): leave {flag} out")

    def _check_combinations(self) -> None:
        if self.name is not None and name_problem(str(self.name)):
            raise SpecError(f"--name {str(self.name)[:40]}... {name_problem(str(self.name))}")
        if self.emulate_slowdown and (len(self.emulate_slowdown) != self.workers or min(self.emulate_slowdown) < 1):
            raise SpecError(
                f"--emulate-slowdown needs one factor >= 1 per worker ({self.workers}), got {self.emulate_slowdown}"
            )
        if any(not 0 < mb <= 4096 for mb in self.link_probe_mb):
            raise SpecError(f"link_probe_mb takes buffer sizes in MB above 0 and at most 4096, got {self.link_probe_mb}")
        if self.independent_replicas and self.balance == "dynamic":
            raise SpecError("--independent-replicas and --balance dynamic do not mix: replicas share no batch")
        if self.global_batch is not None and self.batch_per_worker is not None:
            raise SpecError("give either --global-batch (strong scaling) or --batch-per-worker (weak scaling), not both")
        if self.steps is None and self.epochs is None:
            raise SpecError("give --steps or --epochs (how long to train)")
        if self.loss_threshold is not None and self.val_every == 0:
            raise SpecError("--loss-threshold needs validation: set --val-every N (steps between validations)")
        if engine_facts(self.engine.name).one_worker and self.workers != 1:
            raise SpecError(
                f"engine {self.engine.name!r} runs one worker, but the layout has {self.workers} "
                f"({self.nodes} x {self.gpus_per_node}); use --engine ddp or --engine horovod"
            )
        if engine_facts(self.engine.name).parameter_server:
            self._validate_ps()
        if self.data.kind == "text" and not self.data.train_src:
            raise SpecError("data kind 'text' needs --train-src (and --train-tgt for translation)")
        if (self.data.kind == "shards") != bool(self.data.shards):
            raise SpecError("--data shards reads --shards DIR (a directory written by launch prep): give both, or neither")
        if self.data.kind == "shards" and "://" not in self.data.shards and not Path(self.data.shards, "manifest.json").is_file():
            raise SpecError(f"--shards {self.data.shards} holds no manifest.json: run launch prep --out {self.data.shards} first")
        self._check_precision()
        self.profile_range()

    def _check_precision(self) -> None:
        if self.precision == "fp16" and self.device == "cpu":
            raise SpecError("--precision fp16 needs a GPU (its gradient scaler is CUDA-only here); "
                            "use --precision bf16 on a CPU")
        engine, facts = self.engine, engine_facts(self.engine.name)
        if engine.fp16_allreduce and engine.compression not in ("none", "fp16"):
            raise SpecError(f"--fp16-allreduce and --grad-compression {engine.compression} contradict each other; "
                            "give only --grad-compression")
        if engine.grad_compression != "none" and engine.grad_compression not in facts.compressions:
            raise SpecError(f"--engine {engine.name} cannot exchange {engine.grad_compression} gradients (Horovod 0.28 "
                            f"cannot all-reduce bf16 tensors); use --grad-compression "
                            f"{' or '.join(facts.compressions) or 'none'}, or --engine ddp for bf16")

    # ---- (de)serialisation ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "") -> "Spec":
        """A spec from a mapping (YAML, JSON); `where` (e.g. "in spec file exp.yaml") goes into messages.

        A mapping that gives epochs and no steps runs those epochs (`steps: None`): the built-in DEFAULT_STEPS is
        the length of a run that gives none, not a cap on one that asks for epochs (a study base with
        `epochs: 5` ran 40 steps unless it also said `steps: null`)."""
        if isinstance(raw, dict) and raw.get("epochs") is not None and "steps" not in raw:
            raw = {**raw, "steps": None}
        return build(cls, raw, where)

    def with_overrides(self, overrides: dict[str, Any]) -> "Spec":
        """A copy with dotted keys (`engine.name`, `data.kind`, `nodes`) replaced; None means unset."""
        raw = self.to_dict()
        for key, value in overrides.items():
            if value is None:
                continue
            target = raw
            parts = key.split(".")
            for part in parts[:-1]:
                target = target[part]
            target[parts[-1]] = value
        return Spec.from_dict(raw)


def synthetic_pool_size(global_batch: int) -> int:
    """Training samples of synthetic data (one epoch) for a global batch: 4 batches, at least 1,024. Here, for
    `train.data.SyntheticDataset` and `Spec.known_steps_per_epoch` both, so the preview's epochs are the run's."""
    return max(4 * global_batch, 1024)


def check_preset(name: str) -> None:
    """SpecError unless `name` is a model preset: `launch run` (validate) and `launch memory` / `launch prep`
    (core.flags.spec_from_flags) say it the same way."""
    if name not in PRESETS:
        raise SpecError(f"unknown model preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")


def rank_role(rank: int, ranks_per_node: int, servers_per_node: int) -> tuple[str, int]:
    """("worker", i) or ("server", i) for a global rank: on every node the workers come first (so rank
    0 is a worker and writes checkpoints) and the parameter-server ranks last."""
    node, local = divmod(rank, ranks_per_node)
    workers_per_node = ranks_per_node - servers_per_node
    if local < workers_per_node:
        return "worker", node * workers_per_node + local
    return "server", node * servers_per_node + local - workers_per_node


def server_rank(server: int, ranks_per_node: int, servers_per_node: int) -> int:
    """The global rank of parameter server `server` (the inverse of `rank_role`)."""
    node, j = divmod(server, servers_per_node)
    return node * ranks_per_node + ranks_per_node - servers_per_node + j


def check_text_file(path: str | os.PathLike, flag: str) -> Path:
    """An existing, readable file whose start is text (no NUL bytes, UTF-8): a data or spec file given by
    mistake as a binary (a checkpoint, an archive) is named before any rank starts."""
    p = Path(path)
    if not p.is_file():
        kind = what_it_is(p)  # a directory or a FIFO is said as such, not as "not found"
        check = f" (check {flag})" if flag.startswith("--") else ""
        if kind == "missing":
            raise SpecError(f"data file not found: {p}{check}" if check else f"{flag} not found: {p}")
        raise SpecError(f"{'data file' if check else flag} {p} is {kind}, not a regular file: give the file itself{check}")
    try:
        with p.open("rb") as f:
            head = f.read(8192)
    except OSError as exc:
        raise SpecError(f"cannot read {p} ({exc.strerror}); check {flag}") from None
    if b"\0" in head or not _utf8_prefix(head, complete=len(head) < 8192):
        raise SpecError(f"{p} is not a text file (binary or not UTF-8); check {flag}")
    if flag.startswith("--") and len(head) < 8192 and not head.strip():  # the whole file, and no text in it
        raise SpecError(f"data file {p} is empty (no line of text): check {flag}, or fill the file")
    return p


def _utf8_prefix(data: bytes, complete: bool) -> bool:
    """True if `data` is UTF-8, allowing a character cut off at the end when it is only a file's start."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return not complete and exc.start >= len(data) - 3
    return True


def read_yaml_mapping(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """A YAML (or JSON) file that must hold a mapping: missing, binary, empty, invalid or a list are one
    clear SpecError naming the file; `what` says which kind of file ("spec file", "study file")."""
    import yaml

    from scalelab.core.yamltext import BeyondLimitsError, load_yaml, yaml_problem  # YAML 1.2 numbers, unique keys

    p = check_text_file(path, what)
    try:
        text = p.read_text(encoding="utf-8")
        raw = load_yaml(text)
    except BeyondLimitsError as exc:
        raise SpecError(f"{what} {p}: {exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{what} {p} is not valid YAML: {yaml_problem(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read {what} {p} as UTF-8 text ({exc})") from None
    if p.suffix.lower() == ".json":
        strict_json(text, p, what)
    if raw is None:
        raise SpecError(f"{what} {p} is empty: give at least one key (see the examples/ folder)")
    if not isinstance(raw, dict):
        raise SpecError(f"{what} {p} must be a mapping of key: value, got a {type(raw).__name__}")
    return raw


def strict_json(text: str, path: Path, what: str) -> None:
    """A .json file must be JSON, not merely YAML: YAML reads `{"nodes": 2,}` (a trailing comma) and
    single quotes without a word, so a JSON spec that any JSON tool would refuse was accepted (issue #37).
    The message names the line and column."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        before = text[:exc.pos].rstrip()
        if before.endswith(",") and text[exc.pos:exc.pos + 1] in ("}", "]"):
            line = before.count("\n") + 1
            column = len(before) - (before.rfind("\n") + 1)
            raise SpecError(f"{what} {path} is not valid JSON: a trailing comma at line {line}, column {column} "
                            f"(before the closing {text[exc.pos]} at line {exc.lineno}); remove it") from None
        raise SpecError(f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}; "
                        "correct it (or name the file .yaml to write YAML)") from None
    except (ValueError, RecursionError):  # past Python's limits: load_yaml has said so already
        pass


def load_spec(path: str | os.PathLike) -> Spec:
    """Load a spec from YAML (or JSON); the file may hold only the keys it wants to change, but not none.
    It may say what the flags say (`engine: horovod`, `data: task`, `loss-threshold: 4.3`): `flag_words`."""
    return Spec.from_dict(flag_words(read_yaml_mapping(path, "spec file")), where=f"in spec file {path}")


def trainer_only_keys() -> list[str]:
    """`TRAINER_ONLY` as dotted keys, `data` spelled out as each DataSpec field's (`data.kind`, ...)."""
    data = [f"data.{f.name}" for f in dataclasses.fields(DataSpec)]
    return [k for key in TRAINER_ONLY for k in (data if key == "data" else [key])]


def _dotted(raw: dict[str, Any], key: str) -> Any:
    """The value at a dotted key (`engine.compression`) of a spec's mapping."""
    for part in key.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def _flag_text(name: str, value: Any) -> str:
    """A setting as the user would have given it: `--lr 0.5`, `--independent-replicas`, `--model-arg k=v`."""
    if isinstance(value, bool):
        return name if value else f"{name}=false"
    if isinstance(value, dict):
        return " ".join(f"{name} {k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return f"{name} {','.join(str(v) for v in value)}"
    return f"{name} {value}"


def flag_words(raw: dict[str, Any]) -> dict[str, Any]:
    """A spec mapping with the flags' words read as the fields they set: a section given one word
    (`engine: horovod`, `data: task`) sets the section's field whose flag is named like it (`--engine`,
    `--data`), and a key that is a flag's name and no field's (`loss-threshold`, `--fusion-threshold-mb`)
    becomes the field it sets. Anything else is left for `Spec.from_dict` to judge (an unknown key is
    still named as one)."""
    from scalelab.core.options import option_flags

    flags = {f.name.lstrip("-"): f.key for f in option_flags(Spec)}
    fields = {f.name for f in dataclasses.fields(Spec)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        k = str(key)
        if k in fields and not isinstance(value, dict) and flags.get(k, "").startswith(k + "."):
            dotted = flags[k]  # engine: horovod -> engine.name
        elif k not in fields and k.lstrip("-") in flags:
            dotted = flags[k.lstrip("-")]  # loss-threshold: 4.3 -> loss_threshold
        else:
            dotted = k
        head, _, rest = dotted.partition(".")
        if rest:
            value = {rest: value}
        if isinstance(value, dict) and isinstance(out.get(head), dict):
            value = {**out[head], **value}
        out[head] = value
    return out


def save_spec(spec: Spec, run_dir: Path) -> Path:
    """spec.json of the run, written atomically: a crash or a full disk leaves the previous one whole."""
    return write_text(Path(run_dir) / SPEC_FILE, spec.to_json() + "\n")


def read_spec(run_dir: str | os.PathLike) -> Spec:
    path = Path(run_dir) / "spec.json"
    if not path.is_file():
        raise SpecError(f"{run_dir} is not a run directory: {path} is missing")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path} is corrupt ({exc}); re-run the experiment or restore the file") from None
    if isinstance(raw, dict):
        raw.setdefault("precision", SAVED_SPEC_PRECISION)
    return Spec.from_dict(raw, where=f"in {path}")
