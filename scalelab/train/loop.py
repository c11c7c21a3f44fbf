"""The training loop every backend runs: `python -m scalelab.train RUN_DIR`.

It reads the resolved spec from RUN_DIR/spec.json, trains on this rank's slice of each global batch,
and writes one record per step to RUN_DIR/records/rank-R.jsonl (docs/records.md). `train` reads top
to bottom: setup, resume, then per step: the step itself (data, forward, backward + exchange,
optimizer) returning its record, load balancing, validation and the threshold, the stop decision,
the checkpoint. The distributed lines are the `engine.` calls, marked `# distributed`.

Resuming is exact: a checkpoint holds everything that decides the next step (scalelab/train/checkpoint.py),
so a run cancelled or killed and resumed records the same losses as one that was never stopped.

Precision (`--precision`, scalelab/train/precision.py): the forward runs under autocast, the backward through
the precision's scaler where it has one, and the gradients are float32 and unscaled from the end of
the exchange on; validation always runs in float32.

Timing: clocks are read only after the device is synchronised, so each phase is the time the work
took, not the time it took to queue. The first `warmup_steps` steps after every (re)start are marked
`warmup` and excluded from throughput (allocator, caches, cuDNN autotuning, Horovod negotiation).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalelab.core.errors import ScalelabError
from scalelab.core.procs import LAUNCHER_ENV, started_at, watched
from scalelab.core.provenance import machine, software
from scalelab.core.records import RecordWriter, gave_up_records, lost_a_peer, rank_from_env, record_error
from scalelab.core.rundir import RunPaths
from scalelab.core.spec import Spec, read_spec
from scalelab.train import balance
from scalelab.train.batch import Batch
from scalelab.train.checkpoint import (
    identity,
    load_checkpoint,
    restore,
    rng_state,
    save_checkpoint,
)
from scalelab.train.data import Dataset, Prefetcher
from scalelab.train.datasets import build_dataset
from scalelab.train.engines import Engine, make_engine
from scalelab.train.models import PRESETS, build_model, config_with_overrides
from scalelab.train.noise import NoiseMeter
from scalelab.train.optim import eager
from scalelab.train import graphs
from scalelab.train.graphs import StepGraph
from scalelab.train.outloss import resolve as resolve_output_loss
from scalelab.train.track import HOLD_AT_STEP_ENV, hold_for_a_stop_signal  # noqa: F401 - tests import HOLD_AT_STEP_ENV from here
from scalelab.train.memory import current_rss_bytes, is_out_of_memory, memory_fields, oom_message
from scalelab.train.precision import Precision, make_precision
from scalelab.train.profiling import StepProfiler

BUCKET_BATCHES = 50  # length bucketing sorts within windows of this many global batches
# Test aids (tests/test_resume.py, tests/test_local_runs.py), read after each step:
FAIL_AT_STEP_ENV = "SCALELAB_FAIL_AT_STEP"  # STEP: every rank dies (os._exit) after this step
KILL_AT_STEP_ENV = "SCALELAB_KILL_AT_STEP"  # STEP:RANK: that rank sends itself SIGKILL after STEP
RAISE_AT_STEP_ENV = "SCALELAB_RAISE_AT_STEP"  # STEP:RANK: that rank raises a RuntimeError after STEP
HANG_AT_STEP_ENV = "SCALELAB_HANG_AT_STEP"  # STEP:RANK: that rank hangs after STEP (sleeps, signals or not)
# HOLD_AT_STEP_ENV, STEP[:RANK]: wait there for a stop signal, so that a cancel, or a signal to one rank, lands
# at STEP (scalelab/train/track.py's hold_for_a_stop_signal, shared with a script's track.step)


# The launcher watch: a rank started by a supervising launcher (the local backend sets LAUNCHER_ENV to
# its PID:START, scalelab/core/procs.py's watch_value) looks every WATCH_EVERY_S whether that very process
# still runs. When it is gone -
# killed with SIGKILL, where nothing can run in it to stop the ranks - the rank takes the SIGTERM path
# (agreed stop, rank 0 checkpoints, all exit); a rank that has not exited WATCH_GRACE_S later (hung in a
# collective whose peer is gone or hung) exits anyway, so nothing is left running, after recording why
# (`gave_up_records`: its `interrupted` event says the launcher is gone and that it did not stop in time, its
# `end` that it was interrupted): `launch status` then names that cause, not the SIGTERM its agent reads in its
# exit status 143 nor an OOM guess for a peer the agent then killed. Started with `--detach`, the ranks get no
# LAUNCHER_ENV and run on alone.
WATCH_EVERY_S = 2.0
WATCH_GRACE_S = 25.0


#: The signals that stop a rank with a checkpoint: `launch cancel` and a node agent or OOM killer
#: (SIGTERM), Slurm's warning before a time limit or preemption (SIGUSR1), Ctrl-C (SIGINT). Sent to one
#: rank or to all, they mean the same: every rank stops at the step they agree on (issue #37).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class Stop:
    """Set by a stop signal (STOP_SIGNALS), or by the launcher watch: checkpoint, exit."""

    signal: int | None = None
    cause: str | None = None  # why, when not a signal to this rank
    out: RecordWriter | None = None  # this rank's records and where it is, for the launcher watch's last word
    progress: "Progress | None" = None

    @classmethod
    def install(cls) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, cls._handler)

    @classmethod
    def _handler(cls, signum, frame) -> None:
        cls.signal = signum

    @classmethod
    def watch_launcher(cls, value: str | None) -> None:
        """Watch the launcher named by LAUNCHER_ENV's `value` (PID:START) in a daemon thread."""
        if not value:
            return
        if (who := watched(value)) is None:
            print(f"scalelab: warning: {LAUNCHER_ENV}={value!r} is not PID:START; the launcher is not "
                  "watched", file=sys.stderr, flush=True)
            return
        threading.Thread(target=cls._watch, args=who, name="launcher-watch", daemon=True).start()

    @classmethod
    def _watch(cls, pid: int, start: str) -> None:
        while started_at(pid, start):
            time.sleep(WATCH_EVERY_S)
        cls.cause = f"its launcher (pid {pid}) is gone"
        cls.signal = signal.SIGTERM
        print(f"scalelab: {cls.cause}: stopping at the next step with a checkpoint", file=sys.stderr, flush=True)
        time.sleep(WATCH_GRACE_S)
        print(f"scalelab: not stopped {WATCH_GRACE_S:.0f} s after the launcher was gone (a peer hung or gone?): "
              "exiting; the last checkpoint is kept", file=sys.stderr, flush=True)
        if cls.out is not None and cls.progress is not None:
            gave_up_records(cls.out, cls.cause, cls.progress.step, WATCH_GRACE_S, elapsed_s=cls.progress.elapsed)
        os._exit(143)


class ShareSchedule:
    """Each rank's share of the global batch, step by step, and the speeds measured since the last change.

    A change made at step s takes effect from a step that no rank can have prefetched yet, so every
    rank switches at the same step and the slices still tile the global batch exactly. The changes
    go into checkpoints: they are part of the data position.
    """

    def __init__(self, changes: list[tuple[int, list[int]]]) -> None:
        """`changes`: (first step, shares) pairs in order, starting with (0, the initial shares)."""
        self.changes = [(int(first), [int(n) for n in shares]) for first, shares in changes]
        self.window: list[float] = []  # compute seconds per sample on this rank since the last change

    def at(self, step: int) -> list[int]:
        return next(sh for first, sh in reversed(self.changes) if step >= first)

    def change(self, first_step: int, shares: list[int]) -> None:
        self.changes.append((first_step, shares))
        self.window = []


@dataclass
class Run:
    """What stays fixed while training: the spec and what every rank built from it."""

    spec: Spec
    engine: Engine
    device: torch.device
    dataset: Dataset
    model: torch.nn.Module  # wrapped for the exchange (DDP) where the engine does that
    optimizer: torch.optim.Optimizer  # wrapped (Horovod's DistributedOptimizer) likewise
    global_batch: int
    per_rank: int
    lr_scale: float
    steps_per_epoch: int
    total_steps: int
    slowdown: float
    identity: dict[str, Any]  # what a checkpoint must share with this run
    rank: int
    world: int
    noise: NoiseMeter  # the gradient noise scale, measured as the run trains (scalelab/train/noise.py)
    mem_base: int  # resident bytes before the model was built (CPU; 0 on a GPU: scalelab/train/memory.py)
    precision: Precision  # autocast and, for fp16, the gradient scaler
    role: str = "worker"  # or "server": a ps shard rank of --ps-placement separate, which has no data
    worker: int = 0  # this worker's index among the workers (a server's: its index among the servers)
    workers: int = 1  # ranks that train on data (the world less the server ranks)
    output_loss: str = "full"  # how the output layer and loss run (scalelab/train/outloss.py)
    output_loss_note: str | None = None  # why it is not what --output-loss asked for (compiling failed)
    graph: StepGraph | None = None  # forward and backward as a CUDA graph (scalelab/train/graphs.py)
    graph_note: str | None = None  # why steps run eagerly


@dataclass
class Progress:
    """What changes step by step: saved by a checkpoint, restored by a resume."""

    shares: ShareSchedule
    step: int = 0
    elapsed: float = 0.0
    reached: dict[str, Any] | None = None  # when the loss threshold was first reached
    resumed_from: int | None = None  # None: a fresh start

    @property
    def started_at(self) -> int:
        return self.resumed_from or 0


def train(run_dir: Path) -> str:
    """Run (or resume) the training described by RUN_DIR/spec.json; return why it ended."""
    run = setup(read_spec(run_dir))  # distributed: init, and wrap model + optimizer for the exchange
    spec, engine = run.spec, run.engine
    progress = resume(run_dir, run)
    out = open_records(run_dir, run, progress)
    Stop.out, Stop.progress = out, progress  # the launcher watch's last records, should it have to give up
    reason = "steps" if run.total_steps == spec.steps else "epochs"  # the bound that ends it (both: the fewer steps)
    profiler = StepProfiler(run_dir, spec, run.rank, run.device)  # --profile-steps A:B
    with Prefetcher(batches(run, progress.shares, progress.step), spec.data.prefetch, run.device) as stream:
        while progress.step < run.total_steps:
            profiler.before(progress.step + 1)
            record = guard_memory(run, progress, stream)
            out.write("step", **record, **({"profiled": True} if profiler.active else {}))
            profiler.after(progress.step, out)
            rebalance(run, progress, record, out)
            if spec.val_every and progress.step % spec.val_every == 0 and validate_and_judge(run, progress, out):
                reason = "threshold"
            stop_now = agree_to_stop(engine, progress.step)  # distributed: every rank stops at the same step
            if checkpoint_due(run, progress.step, stop_now, reason):
                checkpoint(run_dir, run, progress, out)  # distributed: every rank hands in its RNG state
            _die_if_asked(progress.step, run.rank)
            if stop_now:
                out.event("interrupted", signal=Stop.signal, step=progress.step, **({"cause": Stop.cause} if Stop.cause else {}))
                reason = "interrupted"
            if reason in ("interrupted", "threshold"):
                break
    if spec.link_probe_mb and reason != "interrupted":
        measure_links(run, out)
    profiler.close(progress.step, out)
    finish(run, progress, out, reason)
    return reason


# ---- setup and resume ----------------------------------------------------------------------------


def setup(spec: Spec) -> Run:
    """Engine, data, model and optimizer: identical on every rank (same seed), wrapped for the exchange."""
    if spec.interop_threads:
        torch.set_num_interop_threads(spec.interop_threads)  # only possible before any parallel work
    Stop.watch_launcher(os.environ.get(LAUNCHER_ENV))  # before the rendezvous, which may wait for a peer
    engine = make_engine(spec.engine)  # distributed: init process group / hvd.init
    role, index = spec.role_of(engine.rank)  # ps --ps-placement separate: "server" ranks have no data
    device = engine.device(spec.device)
    precision = make_precision(spec.precision, device, spec.rnn)  # before any work: fp16 on a CPU fails here
    torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // engine.placement.local_world))
    Stop.install()
    torch.manual_seed(spec.seed)
    mem_base = current_rss_bytes() if device.type == "cpu" else 0
    cfg = config_with_overrides(PRESETS[spec.model], spec.model_args)
    dataset = build_dataset(spec.data.kind, cfg, spec.seed, data_paths(spec, cfg.family), **data_options(spec, index * (role == "worker"), spec.workers))
    cfg = config_with_overrides(cfg, dataset.model_overrides())  # text data fixes vocabulary / labels
    output_loss, output_loss_note = resolve_output_loss(spec.output_loss, device)  # compiled, or why not
    if output_loss_note and engine.rank == 0:
        print(f"scalelab: note: {output_loss_note}", file=sys.stderr, flush=True)
    model = build_model(cfg, spec.rnn, output_loss).to(device)
    global_batch = spec.resolved_global_batch(cfg.default_batch)
    per_rank = spec.per_worker_batch(cfg.default_batch)
    lr_scale = spec.lr_scale(cfg.default_batch)
    optimizer = make_optimizer(spec, model, spec.lr * lr_scale)
    if spec.independent_replicas:
        model, optimizer = engine.replicas(model, optimizer)  # no gradient exchange at all
    else:
        model, optimizer = engine.wrap(model, optimizer)  # distributed: rank 0's parameters everywhere
    steps_per_epoch = dataset.steps_per_epoch(global_batch)
    slowdown = spec.emulate_slowdown[index] if spec.emulate_slowdown else 1.0
    graph_note = graphs.why_not(spec.cuda_graph, device, engine, spec.precision, spec.rnn, slowdown)
    graph = StepGraph(model, lambda: precision.autocast(cache=False)) if graph_note is None else None
    return Run(
        spec, engine, device, dataset, model, optimizer, global_batch, per_rank, lr_scale, steps_per_epoch,
        total_steps=total_steps(spec, steps_per_epoch),
        slowdown=slowdown, graph=graph, graph_note=graph_note,
        identity=identity(spec, global_batch), rank=engine.rank, world=engine.world,
        precision=precision, noise=NoiseMeter(model, engine.world, global_batch, engine.exchanging, workers=spec.workers),
        role=role, worker=index, workers=spec.workers, mem_base=mem_base,
        output_loss=output_loss, output_loss_note=output_loss_note,
    )


def total_steps(spec: Spec, steps_per_epoch: int) -> int:
    """--steps, --epochs, or the fewer steps of the two when both are given."""
    if spec.epochs is None:
        return spec.steps
    if spec.steps is None:
        return spec.epochs * steps_per_epoch
    return min(spec.steps, spec.epochs * steps_per_epoch)


def resume(run_dir: Path, run: Run) -> Progress:
    """Continue from RUN_DIR/checkpoint.pt when there is one, else start fresh.

    Every rank reads the file itself (ranks share the run directory), after the engine wrapped the
    model and optimizer, so nothing needs broadcasting and Adam's step and moments stay exact.
    """
    ckpt = load_checkpoint(run_dir, run.identity, map_location=run.device)
    if ckpt is None:
        return Progress(ShareSchedule([(0, initial_shares(run))]))
    restore(ckpt, run.model, run.optimizer, run.rank, run_dir)
    run.engine.restored()  # ps --ps-state cpu: the CPU shards take the loaded weights
    run.precision.load_state_dict(ckpt.get("amp"))
    shares = ckpt.get("shares") or [(0, initial_shares(run))]  # none: the batch changed (--allow-changed)
    return Progress(
        ShareSchedule(shares), step=ckpt["step"], elapsed=ckpt["elapsed_s"], reached=ckpt["reached"],
        resumed_from=ckpt["step"],
    )


def initial_shares(run: Run) -> list[int]:
    """Every rank's slice of the global batch: equal for the workers, empty for ps server ranks."""
    return [run.per_rank if run.spec.role_of(r)[0] == "worker" else 0 for r in range(run.world)]


def open_records(run_dir: Path, run: Run, progress: Progress) -> RecordWriter:
    """This rank's record file, with the `start` record (and `resume` event) of this launch."""
    spec, engine, model = run.spec, run.engine, run.model
    out = RecordWriter(run_dir, run.rank, run.world)
    out.write(
        "start", run_id=Path(run_dir).name, model=spec.model, preset=spec.model, rnn=spec.rnn,
        engine=engine.name, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
        node_rank=engine.placement.node_rank, local_rank=engine.placement.local_rank, device=str(run.device),
        role=run.role,
        global_batch=run.global_batch, batch_this_rank=run.per_rank if run.role == "worker" else 0, steps_per_epoch=run.steps_per_epoch,
        threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(), independent_replicas=spec.independent_replicas,
        balance=spec.balance, emulate_slowdown=run.slowdown, resumed_from_step=progress.resumed_from,
        precision=spec.precision, grad_compression=spec.engine.grad_compression,
        params=sum(p.numel() for p in model.parameters()), grad_bytes=grad_bytes(model, spec.engine.grad_compression),
        mem_base_bytes=run.mem_base, output_loss=run.output_loss,
        cuda_graph="auto" if run.graph is not None else f"off: {run.graph_note}",
        **({"output_loss_note": run.output_loss_note} if run.output_loss_note else {}),
        **machine(torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else None),
        **(software(torch.__version__) if run.rank == 0 else {}),
    )
    if progress.resumed_from is not None:
        out.event("resume", step=progress.step)
    return out


def batches(run: Run, shares: ShareSchedule, first_step: int) -> Iterator[Batch]:
    """This rank's slice of every global batch from `first_step` on: the data position is the step."""
    for s in range(first_step, run.total_steps):
        lo, hi = balance.offsets(shares.at(s))[run.rank]
        if lo == hi:  # a ps server rank: no data, nothing to read
            batch = Batch({}, samples=0, words=0)
        else:
            batch = run.dataset.get_batch(s // run.steps_per_epoch, s % run.steps_per_epoch, run.global_batch, lo, hi)
        batch.meta["epoch"] = s // run.steps_per_epoch
        yield batch


# ---- one step ------------------------------------------------------------------------------------


def guard_memory(run: Run, progress: Progress, stream: Prefetcher) -> dict[str, Any]:
    """`train_step`, with PyTorch's out-of-memory traceback turned into the one message of
    scalelab/train/memory.py (batch per rank, asked and free, the fixes) in this rank's error record."""
    try:
        return train_step(run, progress, stream)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise ScalelabError(oom_message(exc, run.per_rank, run.spec.precision, run.device, progress.step + 1)) from None


def train_step(run: Run, progress: Progress, stream: Prefetcher) -> dict[str, Any]:
    """One optimizer step on this rank's slice of the global batch; returns its `step` record."""
    spec, engine, device, model, optimizer = run.spec, run.engine, run.device, run.model, run.optimizer
    t0 = _clock(device)
    batch = next(stream)
    t1 = _clock(device)
    lr = set_lr(optimizer, spec, run.lr_scale, progress.step)
    loss = run.graph.forward_backward(batch.inputs, progress.step + 1) if run.graph and batch.samples else None
    graphed = loss is not None  # forward and backward replayed as one CUDA graph: timed together
    if not graphed:
        model.zero_grad(set_to_none=not (run.graph and run.graph.owns_grads))
    forward_extra = backward_extra = 0.0  # a ps server rank (no data) computes nothing: the push gives it gradients
    if batch.samples and not graphed:
        with run.precision.autocast():
            loss = model(**batch.inputs)  # fp32: the models take the cross-entropy of float32 logits
    t2 = _clock(device)
    if loss is not None and not graphed:
        if run.slowdown != 1.0:  # the forward and backward of a device `slowdown` times slower
            forward_extra, backward_extra = slower_device_extra(run.slowdown, t2 - t1)
            time.sleep(forward_extra)
            t2 += forward_extra  # in forward_s; the backward's sleep, before its gradients reach the exchange, in backward_s
            time.sleep(backward_extra)
        # Each engine averages gradients over ranks; with unequal shares, weight each rank's mean
        # loss by its share so the average is still the mean over the whole global batch.
        weight = batch.samples * run.world / run.global_batch if not spec.independent_replicas else 1.0
        run.precision.backward(loss * weight if weight != 1.0 else loss)  # DDP all-reduces in here; Horovod starts
    exchange_s = engine.finish_exchange(optimizer)  # distributed: wait for the exchange
    run.precision.unscale(optimizer)  # from here on the gradients are fp32 and unscaled
    probe_s = run.noise.exchanged(model, batch.inputs, batch.samples, progress.step + 1,
                                  grad_sq=engine.grad_sq())  # B_simple (scalelab/train/noise.py)
    t0, t1, t2 = t0 + probe_s, t1 + probe_s, t2 + probe_s  # one worker's probe is not part of the step
    if spec.clip_grad_norm:
        engine.clip_grad_norm(model, spec.clip_grad_norm)  # distributed for sharded gradients (ps)
    t3 = _clock(device)
    applied, pull_s = run.precision.step(optimizer, engine.step)  # fp16: skipped on overflow; ps: update, then pull
    t4 = _clock(device)
    if pull_s is not None:  # parameter server: exchange = push + pull, not part of the optimizer's time
        exchange_s, t3 = (exchange_s or 0.0) + pull_s, t3 + pull_s
    progress.step += 1
    progress.elapsed += t4 - t0
    loss_value = float(loss.detach()) if loss is not None else None
    if loss_value is not None and not math.isfinite(loss_value):
        raise ScalelabError(f"training diverged at step {progress.step} (loss {loss_value}); lower --lr")
    return dict(
        step=progress.step, epoch=batch.meta["epoch"],
        warmup=progress.step - progress.started_at <= spec.warmup_steps  # the capture's step is one too
        or graphed and run.graph.captured_at == progress.step,
        step_s=t4 - t0, data_s=t1 - t0, forward_s=t2 - t1, backward_s=None if graphed else t3 - t2, exchange_s=exchange_s,
        optimizer_s=t4 - t3, samples=batch.samples, words=batch.words, loss=loss_value, lr=lr,
        **({"emulated_s": forward_extra + backward_extra} if run.slowdown != 1.0 else {}), **run.noise.fields(),
        **({"role": run.role} if run.role != "worker" else {}),
        **run.precision.record(applied), **memory_fields(device),
        **({"graphed": True} if graphed else {}),
        **({"graph_note": note} if run.graph and (note := run.graph.take_note()) else {}),
    )


def rebalance(run: Run, progress: Progress, record: dict[str, Any], out: RecordWriter) -> None:
    """Dynamic load balancing (mixed hardware): every `balance_every` steps, shares follow speeds."""
    shares = progress.shares
    if record["samples"]:  # a ps server rank has no speed to measure
        shares.window.append(record["forward_s"] / record["samples"])
    if run.spec.balance != "dynamic" or run.world == 1 or progress.step % run.spec.balance_every:
        return
    speeds = run.engine.allgather(len(shares.window) / sum(shares.window))  # distributed: samples/s per rank
    new = balance.proportional_shares(run.global_batch, speeds)
    effective = progress.step + run.spec.data.prefetch + 2  # later than any batch already prefetched
    shares.change(effective, new)
    out.event("rebalance", step=progress.step, effective_step=effective + 1, shares=new, speeds=speeds)


def validate_and_judge(run: Run, progress: Progress, out: RecordWriter) -> bool:
    """Record the validation loss; True when it reaches the loss threshold for the first time."""
    val_loss = validate(run)
    epoch = (progress.step - 1) // run.steps_per_epoch
    out.write("val", step=progress.step, epoch=epoch, val_loss=val_loss, elapsed_s=progress.elapsed)
    threshold = run.spec.loss_threshold
    if threshold is None or progress.reached is not None or val_loss > threshold:
        return False
    progress.reached = {"step": progress.step, "elapsed_s": progress.elapsed, "val_loss": val_loss}
    out.event("threshold", **progress.reached)
    return True


def agree_to_stop(engine: Engine, step: int) -> bool:
    """True on every rank when any rank got a stop signal (a cancel, Slurm's warning, a signal to that one
    rank): all stop here."""
    hold_for_a_stop_signal(step, engine.rank, lambda: Stop.signal is not None)  # a test aid
    return engine.any(Stop.signal is not None)  # distributed


def checkpoint_due(run: Run, step: int, stop_now: bool, reason: str) -> bool:
    """Always before stopping on a signal (so `launch resume` can continue); with --checkpoint-every N,
    every N steps and at the end."""
    every = run.spec.checkpoint_every
    return stop_now or (bool(every) and (step % every == 0 or step >= run.total_steps or reason == "threshold"))


def checkpoint(run_dir: Path, run: Run, progress: Progress, out: RecordWriter) -> None:
    """Rank 0 writes the checkpoint. Every rank must call this: each hands in its RNG states."""
    gathered = [run.engine.gather(t) for t in rng_state()]  # distributed: [kind][rank]
    run.engine.consolidate(run.optimizer)  # distributed for ps: every shard's optimizer state to rank 0
    if run.rank != 0:
        return
    path = save_checkpoint(
        run_dir, run.model, run.optimizer, identity=run.identity, step=progress.step, elapsed_s=progress.elapsed,
        reached=progress.reached, shares=progress.shares.changes, rng=[list(states) for states in zip(*gathered)],
        amp=run.precision.state_dict(),
    )
    out.event("checkpoint", step=progress.step, path=str(path))


def measure_links(run: Run, out: RecordWriter) -> None:
    """The layout's links after training (`spec.link_probe_mb`): every rank all-reduces, rank 0 records."""
    from scalelab.train.links import link_records

    figures = link_records(run.engine.allreduce_, run.world, run.spec.nodes, run.spec.link_probe_mb, run.device)
    for fields in figures if run.rank == 0 else []:
        out.write("link", **fields)


def finish(run: Run, progress: Progress, out: RecordWriter, reason: str) -> None:
    if run.spec.loss_threshold is not None and progress.reached is None and reason != "interrupted":
        out.event("threshold_not_reached", step=progress.step, elapsed_s=progress.elapsed,
                  threshold=run.spec.loss_threshold)
    out.event("end", step=progress.step, reason=reason, elapsed_s=progress.elapsed)
    out.close()
    run.engine.shutdown()


# ---- helpers -------------------------------------------------------------------------------------


def _die_if_asked(step: int, rank: int) -> None:
    """Test aids: every rank exits at FAIL_AT_STEP; one rank is SIGKILLed at KILL_AT_STEP (STEP:RANK); one
    rank raises an exception that is not ours at RAISE_AT_STEP (STEP:RANK), as a library's bug would; one rank
    hangs at HANG_AT_STEP (STEP:RANK), as on a dead filesystem or a deadlock: its stop signals set the flag and
    the sleep goes on, so only SIGKILL ends it (the stall timeout's case)."""
    if os.environ.get(FAIL_AT_STEP_ENV) == str(step):
        os._exit(17)
    if os.environ.get(KILL_AT_STEP_ENV) == f"{step}:{rank}":
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(RAISE_AT_STEP_ENV) == f"{step}:{rank}":
        raise RuntimeError(f"injected fault after step {step} ({RAISE_AT_STEP_ENV})")
    if os.environ.get(HANG_AT_STEP_ENV) == f"{step}:{rank}":
        while True:
            time.sleep(3600)


def slower_device_extra(factor: float, forward_s: float) -> tuple[float, float]:
    """Testing aid for mixed hardware on one machine (--emulate-slowdown): the seconds to sleep after this rank's
    forward and before its backward so that each takes `factor` times as long, as on a device that much slower
    (its backward estimated at 2x its forward: it cannot be timed apart from the exchange it overlaps).

    Why apart: the whole extra (3x the forward's) was slept after the forward and timed as part of `forward_s`,
    which the dynamic balancer measures speed from, so a 1.78x slower worker measured 1 + 3 x 0.78 = 3.3x slower
    and got shares of ~[16, 48] where ~[23, 41] balance it."""
    return (factor - 1.0) * forward_s, (factor - 1.0) * 2 * forward_s


def data_paths(spec: Spec, family: str) -> dict[str, str]:
    """The spec's file flags under the loader's names: one-file families read --train-src as `train`."""
    paths = {k: v for k in ("train_src", "train_tgt", "valid_src", "valid_tgt") if (v := getattr(spec.data, k))}
    if family != "nmt":
        paths = {k.replace("_src", ""): v for k, v in paths.items() if not k.endswith("_tgt")}
    return paths


def data_options(spec: Spec, rank: int = 0, world: int = 1) -> dict:
    """The spec's data settings that apply to its kind of data (shards: this rank's of `world`)."""
    bucket = {"bucket_batches": BUCKET_BATCHES if spec.data.bucket else 0}
    if spec.data.kind == "task":
        return {"num_train": spec.data.train_samples, "num_valid": spec.data.valid_samples,
                "fixed_length": spec.data.fixed_length, **bucket}
    if spec.data.kind == "text":
        return bucket
    if spec.data.kind == "shards":
        return {"directory": spec.data.shards, "rank": rank, "world": world, **bucket}
    return {}


def make_optimizer(spec: Spec, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam with the fused kernel (one pass over all parameters: 5.7 ms instead of 22 ms per step for
    nmt-small on the benchmark machine, docs/benchmarks.md), falling back where it is unsupported; or SGD
    with momentum. Both in classes that do not import `torch._dynamo` (scalelab/train/optim.py says why)."""
    if spec.optimizer == "sgd":
        return eager(torch.optim.SGD)(model.parameters(), lr=lr, momentum=0.9, foreach=True)
    try:
        return eager(torch.optim.Adam)(model.parameters(), lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return eager(torch.optim.Adam)(model.parameters(), lr=lr, foreach=True)


def set_lr(optimizer: torch.optim.Optimizer, spec: Spec, scale: float, step: int) -> float:
    """Linear warm-up from the base LR to base x scale over `lr_warmup_steps` (Goyal et al. 2017)."""
    if spec.lr_warmup_steps and step < spec.lr_warmup_steps:
        lr = spec.lr * (1 + (scale - 1) * (step + 1) / spec.lr_warmup_steps)
    else:
        lr = spec.lr * scale
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


@torch.no_grad()
def validate(run: Run) -> float:
    """Mean loss over the first `val_batches` x global batch validation samples, on every layout, in
    float32 whatever the training precision (no autocast): one yardstick for the loss threshold.

    The subset is cut into global-batch-sized pieces and each piece split across ranks as training
    batches are, so 1 worker and 8 workers judge the loss threshold on exactly the same samples.
    """
    model, index, workers = run.model, run.worker, run.workers
    model.eval()
    pieces = run.dataset.valid_batches(run.per_rank, 0, 1, max_batches=run.spec.val_batches * workers)
    total, weight = 0.0, 0
    for batch in pieces[index::workers] if run.role == "worker" else []:  # ps server ranks: none
        total += float(model(**batch.to(run.device).inputs)) * batch.samples
        weight += batch.samples
    model.train()
    total, weight = run.engine.mean(total), run.engine.mean(weight)  # distributed: sums over ranks / world
    return total / weight


def grad_bytes(model: torch.nn.Module, compression: str) -> int:
    """Bytes of gradient one rank sends into the exchange per step: fp32, or 2 bytes with compression."""
    return sum(p.numel() * (p.element_size() if compression == "none" else 2)
               for p in model.parameters() if p.requires_grad)


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m scalelab.train RUN_DIR  (normally started by `launch`)"
    if argv in (["-h"], ["--help"]):
        print(usage)
        return 0
    if len(argv) != 1:
        print(usage, file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    try:
        reason = train(run_dir)
    except ScalelabError as exc:  # the launcher reads this record, not the line in the log
        if RunPaths(run_dir).spec.is_file():
            record_error(run_dir, str(exc))
        else:  # not a run directory (read_spec's error): no record to make one for, so the line goes to stderr
            print(f"scalelab: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - not ours (a library, a bug): its traceback to the log, its
        # last line to an error record, so that the user reads it first, not torchrun's or horovodrun's dump
        traceback.print_exc()
        record_error(run_dir, fatal_line(exc, run_dir), peer_lost=lost_a_peer(exc))
        return 1
    return 0 if reason != "interrupted" else 143


def fatal_line(exc: BaseException, run_dir: Path) -> str:
    """The one line for an exception that is not a ScalelabError: its type and message (the last line of
    its traceback), which rank, and where the traceback is."""
    rank, _ = rank_from_env()
    said = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return f"rank {rank}: {said[-1] if said else type(exc).__name__} (its traceback: `launch logs {Path(run_dir).name}`)"
