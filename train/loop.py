"""The training loop every backend runs: `python -m train RUN_DIR`.

It reads the resolved spec from RUN_DIR/spec.json, trains on this rank's slice of each global batch,
and writes one record per step to RUN_DIR/records/rank-R.jsonl (docs/records.md). Read it top to
bottom: setup, resume, the step (data, forward, backward + exchange, optimizer), validation and the
threshold stop, checkpoints, the end. The distributed lines are the `engine.` calls.

Timing: clocks are read only after the device is synchronised, so each phase is the time the work
took, not the time it took to queue. The first `warmup_steps` steps after every (re)start are marked
`warmup` and excluded from throughput (allocator, caches, cuDNN autotuning, Horovod negotiation).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import torch

from core.errors import ScalelabError
from core.records import RecordWriter
from core.spec import Spec, read_spec
from train import balance
from train.checkpoint import load_checkpoint, restore_rng, save_checkpoint
from train.data import Prefetcher
from train.datasets import build_dataset
from train.engines import make_engine
from train.models import PRESETS, build_model, config_with_overrides

BUCKET_BATCHES = 50  # length bucketing sorts within windows of this many global batches
FAIL_AT_STEP_ENV = "SCALELAB_FAIL_AT_STEP"  # test aid: the process dies (os._exit) after this step


class Stop:
    """Set by SIGTERM/SIGUSR1 (Slurm's warning before a time limit or preemption): checkpoint, exit."""

    signal: int | None = None

    @classmethod
    def install(cls) -> None:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, cls._handler)

    @classmethod
    def _handler(cls, signum, frame) -> None:
        cls.signal = signum


def train(run_dir: Path) -> str:
    """Run (or resume) the training described by RUN_DIR/spec.json; return why it ended."""
    spec = read_spec(run_dir)
    if spec.interop_threads:
        torch.set_num_interop_threads(spec.interop_threads)  # only possible before any parallel work
    engine = make_engine(spec.engine)  # distributed: init process group / hvd.init
    rank, world = engine.rank, engine.world
    device = engine.device(spec.device)
    torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // engine.placement.local_world))
    Stop.install()

    # ---- model, data, optimizer (identical on every rank: same seed) ----------------------------
    torch.manual_seed(spec.seed)
    cfg = config_with_overrides(PRESETS[spec.model], spec.model_args)
    dataset = build_dataset(spec.data.kind, cfg, spec.seed, data_paths(spec, cfg.family), **data_options(spec, rank, world))
    cfg = config_with_overrides(cfg, dataset.model_overrides())  # text data fixes vocabulary / labels
    model = build_model(cfg, spec.rnn).to(device)
    global_batch = spec.resolved_global_batch(cfg.default_batch)
    per_rank = spec.per_worker_batch(cfg.default_batch)
    shares = ShareSchedule([per_rank] * world)
    lr_scale = spec.lr_scale(cfg.default_batch)
    optimizer = make_optimizer(spec, model, spec.lr * lr_scale)

    steps_per_epoch = dataset.steps_per_epoch(global_batch)
    total_steps = spec.steps if spec.steps is not None else spec.epochs * steps_per_epoch
    if spec.epochs is not None and spec.steps is not None:
        total_steps = min(spec.steps, spec.epochs * steps_per_epoch)

    # ---- resume ----------------------------------------------------------------------------------
    ckpt = load_checkpoint(run_dir, map_location=device)
    step, elapsed, reached = 0, 0.0, None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        restore_rng(ckpt)
        step, elapsed, reached = ckpt["step"], ckpt["elapsed_s"], ckpt.get("reached")
    if spec.independent_replicas:
        model, optimizer = engine.replicas(model, optimizer)  # no gradient exchange at all
    else:
        model, optimizer = engine.wrap(model, optimizer, resumed=ckpt is not None)  # distributed
    slowdown = spec.emulate_slowdown[rank] if spec.emulate_slowdown else 1.0

    out = RecordWriter(run_dir, rank, world)
    out.write(
        "start", run_id=Path(run_dir).name, model=spec.model, preset=spec.model, rnn=spec.rnn,
        engine=engine.name, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
        node_rank=engine.placement.node_rank, local_rank=engine.placement.local_rank, device=str(device),
        global_batch=global_batch, batch_this_rank=per_rank, threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(), independent_replicas=spec.independent_replicas,
        balance=spec.balance, emulate_slowdown=slowdown,
        resumed_from_step=step if ckpt is not None else None,
        params=sum(p.numel() for p in model.parameters()),
        grad_bytes=sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
    )
    if ckpt is not None:
        out.event("resume", step=step)

    def batches(first_step: int):
        for s in range(first_step, total_steps):
            lo, hi = balance.offsets(shares.at(s))[rank]
            batch = dataset.get_batch(s // steps_per_epoch, s % steps_per_epoch, global_batch, lo, hi)
            batch.meta["epoch"] = s // steps_per_epoch
            yield batch

    reason = "steps" if spec.steps is not None else "epochs"
    started_at = step
    window: list[float] = []  # compute seconds per sample on this rank since the last rebalance
    with Prefetcher(batches(step), depth=spec.data.prefetch, device=device) as stream:
        while step < total_steps:
            # ---- one step ----------------------------------------------------------------------
            t0 = _clock(device)
            batch = next(stream)
            epoch = batch.meta["epoch"]
            t1 = _clock(device)
            lr = set_lr(optimizer, spec, lr_scale, step)
            model.zero_grad(set_to_none=True)
            loss = model(**batch.inputs)
            t2 = _clock(device)
            emulated_s = _emulate_slower_device(slowdown, t2 - t1)
            # Each engine averages gradients over ranks; with unequal shares, weight each rank's mean
            # loss by its share so the average is still the mean over the whole global batch.
            weight = batch.samples * world / global_batch if not spec.independent_replicas else 1.0
            (loss * weight if weight != 1.0 else loss).backward()  # DDP all-reduces during backward; Horovod starts here
            t2 += emulated_s
            exchange_s = engine.finish_exchange(optimizer)  # distributed: wait for the exchange
            if spec.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad_norm)
            t3 = _clock(device)
            engine.step(optimizer)
            t4 = _clock(device)
            step += 1
            elapsed += t4 - t0
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise ScalelabError(f"training diverged at step {step} (loss {loss_value}); lower --lr")
            out.write(
                "step", step=step, epoch=epoch, warmup=step - started_at <= spec.warmup_steps,
                step_s=t4 - t0, data_s=t1 - t0, forward_s=t2 - t1, backward_s=t3 - t2,
                exchange_s=exchange_s, optimizer_s=t4 - t3, samples=batch.samples, words=batch.words,
                loss=loss_value, lr=lr, **({"emulated_s": emulated_s} if slowdown != 1.0 else {}),
            )

            # ---- dynamic load balancing (mixed hardware) ---------------------------------------
            window.append((t2 - t1) / batch.samples)
            if spec.balance == "dynamic" and world > 1 and step % spec.balance_every == 0:
                speeds = engine.allgather(len(window) / sum(window))  # distributed: samples/s per rank
                new = balance.proportional_shares(global_batch, speeds)
                effective = step + spec.data.prefetch + 2  # later than any batch already prefetched
                shares.change(effective, new)
                out.event("rebalance", step=step, effective_step=effective + 1, shares=new, speeds=speeds)
                window = []

            # ---- validation and the loss threshold ---------------------------------------------
            if spec.val_every and step % spec.val_every == 0:
                val_loss = validate(model, dataset, spec, per_rank, rank, world, device, engine)
                out.write("val", step=step, epoch=epoch, val_loss=val_loss, elapsed_s=elapsed)
                if spec.loss_threshold is not None and reached is None and val_loss <= spec.loss_threshold:
                    reached = {"step": step, "elapsed_s": elapsed, "val_loss": val_loss}
                    out.event("threshold", **reached)
                    reason = "threshold"

            # ---- checkpoint, signals, the fault-injection aid ----------------------------------
            stop_now = engine.any(Stop.signal is not None)  # distributed: every rank stops at the same step
            last = step >= total_steps or reason == "threshold" or stop_now
            if rank == 0 and (stop_now or (spec.checkpoint_every and (step % spec.checkpoint_every == 0 or last))):
                path = save_checkpoint(run_dir, model, optimizer, step=step, elapsed_s=elapsed, reached=reached)
                out.event("checkpoint", step=step, path=str(path))
            if os.environ.get(FAIL_AT_STEP_ENV) == str(step):
                os._exit(17)
            if stop_now:
                out.event("interrupted", signal=Stop.signal, step=step)
                reason = "interrupted"
                break
            if reason == "threshold":
                break

    if spec.loss_threshold is not None and reached is None and reason != "interrupted":
        out.event("threshold_not_reached", step=step, elapsed_s=elapsed, threshold=spec.loss_threshold)
    out.event("end", step=step, reason=reason, elapsed_s=elapsed)
    out.close()
    engine.shutdown()
    return reason


class ShareSchedule:
    """Each rank's share of the global batch, step by step.

    A change made at step s takes effect from a step that no rank can have prefetched yet, so every
    rank switches at the same step and the slices still tile the global batch exactly.
    """

    def __init__(self, shares: list[int]) -> None:
        self.changes: list[tuple[int, list[int]]] = [(0, shares)]

    def at(self, step: int) -> list[int]:
        return next(sh for first, sh in reversed(self.changes) if step >= first)

    def change(self, first_step: int, shares: list[int]) -> None:
        self.changes.append((first_step, shares))


def _emulate_slower_device(factor: float, forward_s: float) -> float:
    """Testing aid for mixed hardware on one machine: make this rank `factor` times slower by
    sleeping for the extra compute time of forward + backward (backward ~ 2x forward)."""
    if factor == 1.0:
        return 0.0
    extra = (factor - 1.0) * 3 * forward_s
    time.sleep(extra)
    return extra


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
    nmt-small on the benchmark machine, docs/benchmarks.md), falling back where it is unsupported."""
    if spec.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, foreach=True)
    try:
        return torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(model.parameters(), lr=lr, foreach=True)


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
def validate(model, dataset, spec: Spec, per_rank: int, rank: int, world: int, device, engine) -> float:
    """Mean loss over the first `val_batches` x global batch validation samples, on every layout.

    The subset is cut into global-batch-sized pieces and each piece split across ranks as training
    batches are, so 1 worker and 8 workers judge the loss threshold on exactly the same samples.
    """
    model.eval()
    pieces = dataset.valid_batches(per_rank, 0, 1, max_batches=spec.val_batches * world)
    total, weight = 0.0, 0
    for batch in pieces[rank::world]:
        total += float(model(**batch.to(device).inputs)) * batch.samples
        weight += batch.samples
    model.train()
    total, weight = engine.mean(total), engine.mean(weight)  # distributed: sums over ranks / world
    return total / weight

def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m train RUN_DIR  (normally started by `launch`)", file=sys.stderr)
        return 2
    try:
        reason = train(Path(argv[0]))
    except ScalelabError as exc:
        print(f"scalelab: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0 if reason != "interrupted" else 143
