"""Measurements of the hardware and the trainer, run inside one process or one rank.

`launch bench` (launcher/bench.py) orchestrates these and renders the results; everything here
returns plain dicts so results can be stored as records and compared across machines.

- `matmul_rate`: the machine's dense float32 matrix-multiply rate, the yardstick for compute.
- `memcpy_bandwidth`: bytes/s of a large tensor copy, the yardstick for the gradient exchange on
  one host (loopback all-reduce cannot beat memory).
- `step_benchmark`: one training step (forward + backward + update) of a preset, as the trainer runs
  it, with its FLOP rate against `matmul_rate` measured in the same process.
- `python -m train.bench allreduce ...`: per-rank all-reduce timing under torchrun (torch.distributed
  Gloo) or horovodrun (Horovod Gloo), reporting algbw and busbw as nccl-tests defines them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from core.presets import PRESETS, config_with_overrides
from core.spec import Spec
from train.data import SyntheticDataset
from train.datasets import build_dataset
from train.loop import make_optimizer
from train.models import build_model


def _time(fn, repeats: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def matmul_rate(n: int = 2048, repeats: int = 5, threads: int | None = None) -> dict:
    """Dense float32 GEMM FLOP/s (2n^3 per n x n product), best of `repeats`."""
    if threads:
        torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    times = _time(lambda: torch.mm(a, b, out=c), repeats)
    return {"n": n, "threads": torch.get_num_threads(), "flops_per_s": 2 * n**3 / min(times)}


def memcpy_bandwidth(mb: int = 256, repeats: int = 5) -> dict:
    """Bytes moved per second by a large copy (read + write both count), best of `repeats`."""
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    times = _time(lambda: dst.copy_(src), repeats)
    return {"bytes": src.numel() * 4, "bytes_per_s": 2 * src.numel() * 4 / min(times)}


def step_benchmark(preset: str, rnn: str = "fused", batch: int | None = None, steps: int = 10,
                   warmup: int = 3, threads: int | None = None, optimizer: str = "adam") -> dict:
    """Time the trainer's step on synthetic data; FLOPs from the model's documented formula.

    Achieved FLOP/s = model.flops_per_step(batch) / median step time; efficiency = that over the
    dense matmul rate measured here, in this process, with the same threads.
    """

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = PRESETS[preset]
    batch = batch or cfg.default_batch

    model = build_model(cfg, rnn)
    opt = make_optimizer(Spec(optimizer=optimizer), model, 1e-3)  # exactly the trainer's optimizer
    data = build_dataset("synthetic", cfg, 0)
    b = data.get_batch(0, 0, batch, 0, batch)

    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}

    def step() -> None:
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        loss = model(**b.inputs)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
            phases[k].append(v)

    times = _time(step, steps, warmup)
    for k in phases:
        phases[k] = phases[k][warmup:]
    med = statistics.median(times)
    flops = model.flops_per_step(batch)
    rate = matmul_rate(threads=threads)["flops_per_s"]
    return {
        "preset": preset, "rnn": rnn, "batch": batch, "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
        "step_s": med, "step_s_min": min(times), "words_per_s": b.words / med,
        "flops_per_step": flops, "flops_per_s": flops / med, "matmul_flops_per_s": rate,
        "efficiency": flops / med / rate,
        **{f"{k}_s": statistics.median(v) for k, v in phases.items()},
    }


# ---- all-reduce, one rank ------------------------------------------------------------------------


def allreduce_rank(engine: str, sizes_mb: list[float], repeats: int, out: str | None, label: str,
                   fp16: bool = False, tensors: int = 1) -> None:
    """All-reduce float32 buffers of each size (split into `tensors` equal tensors, as gradients are)."""
    if engine == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

        def reduce(ts):
            works = [dist.all_reduce(t, async_op=True) for t in ts]
            for w in works:
                w.wait()
    else:
        import horovod.torch as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
        compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
        counter = iter(range(10**9))

        def reduce(ts):
            n = next(counter)
            handles = []
            for i, t in enumerate(ts):
                c, ctx = compression.compress(t)
                handles.append((hvd.allreduce_async_(c, name=f"t{i}.{n}", op=hvd.Sum), c, ctx, t))
            for h, c, ctx, t in handles:
                hvd.synchronize(h)
                if c is not t:
                    t.copy_(compression.decompress(c, ctx))

    results = []
    for mb in sizes_mb:
        numel = int(mb * 2**20 // 4)
        ts = [torch.ones(numel // tensors) for _ in range(tensors)]
        times = _time(lambda: reduce(ts), repeats, warmup=2)
        t = statistics.median(times)
        nbytes = numel // tensors * tensors * 4
        algbw = nbytes / t
        results.append({"label": label, "engine": engine, "ranks": world, "mb": mb, "tensors": tensors,
                        "fp16": fp16, "time_s": t, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world})
    if rank == 0 and out:
        with open(out, "w") as f:
            json.dump(results, f)
    if engine == "ddp":
        dist.barrier()
        dist.destroy_process_group()
    else:
        hvd.shutdown()


# ---- parameter server against all-reduce, one rank ---------------------------------------------------


def _gradient_sets(presets: list[str], extra_mb: list[float]) -> list[tuple[str, list[torch.Tensor]]]:
    """The presets' parameter shapes, and flat sizes split into 16 tensors (a model of that size)."""
    sets = [(p, [torch.ones_like(t) for t in build_model(PRESETS[p]).parameters()]) for p in presets]
    return sets + [(f"{mb:g} MB", [torch.ones(int(mb * 2**20 // 4 // 16)) for _ in range(16)]) for mb in extra_mb]


def ps_exchange_rank(presets: list[str], extra_mb: list[float], repeats: int, out: str | None) -> None:
    """Per gradient set: all-reduce of every tensor, against the ps engine's push + pull (1 and 2 shards)."""
    import torch.distributed as dist

    from core.spec import EngineSpec
    from train.engines import PSEngine

    engine, results = PSEngine(EngineSpec(name="ps")), []  # distributed: torchrun's env:// rendezvous
    for name, grads in _gradient_sets(presets, extra_mb):
        model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros_like(g)) for g in grads])

        def allreduce():
            for w in [dist.all_reduce(g, async_op=True) for g in grads]:
                w.wait()

        row = {"gradients": name, "mb": sum(g.numel() for g in grads) * 4 / 2**20, "ranks": engine.world,
               "allreduce_s": statistics.median(_time(allreduce, repeats, warmup=2))}
        for shards in (1, 2):
            engine.spec = EngineSpec(name="ps", ps_shards=shards)
            engine.wrap(model, None)
            row[f"ps{shards}_s"] = statistics.median(_ps_times(engine, model, grads, repeats))
        results.append(row)
    if engine.rank == 0 and out:
        with open(out, "w") as f:
            json.dump(results, f)
    engine.shutdown()


def _ps_times(engine, model: torch.nn.Module, grads: list[torch.Tensor], repeats: int) -> list[float]:
    """Push + pull seconds (no optimizer: the owners' update is not exchange), after 2 warm-ups."""
    times = []
    for i in range(repeats + 2):
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        push = engine.finish_exchange(None)
        pull = engine.pull()
        if i >= 2:
            times.append(push + pull)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.bench")
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("allreduce", help="time all-reduce on this rank (start with torchrun or horovodrun)")
    a.add_argument("--engine", choices=["ddp", "horovod"], required=True)
    a.add_argument("--sizes-mb", default="1,16,64")
    a.add_argument("--repeats", type=int, default=5)
    a.add_argument("--tensors", type=int, default=1)
    a.add_argument("--fp16", action="store_true")
    a.add_argument("--label", default="")
    a.add_argument("--out")
    q = sub.add_parser("ps-exchange", help="ps push + pull against all-reduce on this rank (start with torchrun)")
    q.add_argument("--presets", default="nmt-tiny,nmt-small")
    q.add_argument("--sizes-mb", default="270")
    q.add_argument("--repeats", type=int, default=5)
    q.add_argument("--out")
    d = sub.add_parser("ddp-buckets", help="exposed exchange per DDP bucket size (start with torchrun)")
    d.add_argument("preset")
    d.add_argument("--bucket-caps-mb", default="1,25,100")
    d.add_argument("--out")
    s = sub.add_parser("step", help="time one preset's training step in this process")
    s.add_argument("preset")
    s.add_argument("--rnn", default="fused")
    s.add_argument("--batch", type=int)
    s.add_argument("--steps", type=int, default=10)
    s.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.what == "ps-exchange":
        ps_exchange_rank(args.presets.split(","), [float(x) for x in args.sizes_mb.split(",")], args.repeats, args.out)
    elif args.what == "ddp-buckets":
        ddp_exposed_exchange(args.preset, [float(x) for x in args.bucket_caps_mb.split(",")], out=args.out)
    elif args.what == "allreduce":
        allreduce_rank(args.engine, [float(x) for x in args.sizes_mb.split(",")], args.repeats, args.out,
                       args.label or args.engine, args.fp16, args.tensors)
    else:
        print(json.dumps(step_benchmark(args.preset, args.rnn, args.batch, args.steps, threads=args.threads)))
    return 0



# ---- seed 003: GEMM and training-step throughput against batch size ------------------------------


def gemm_sweep(hiddens: list[int], batches: list[int], repeats: int = 5, threads: int | None = None) -> list[dict]:
    """GFLOP/s of the LSTM's recurrent multiplies for each hidden size H and batch B.

    The three shapes of seed 003: forward `h (B x H) @ U (H x 4H)` (NN), the backward data
    gradient `delta (B x 4H) @ U^T` (NT here, TN in column-major terms) and the weight update
    `h^T (H x B) @ delta (B x 4H)` (TN). Best of `repeats`.
    """
    if threads:
        torch.set_num_threads(threads)
    out = []
    for H in hiddens:
        U = torch.randn(H, 4 * H)
        for B in batches:
            h, d = torch.randn(B, H), torch.randn(B, 4 * H)
            flops = 2.0 * B * H * 4 * H
            for op, fn in (("NN forward", lambda: h @ U), ("NT backward", lambda: d @ U.t()),
                           ("TN update", lambda: h.t() @ d)):
                reps = max(repeats, int(2e8 // flops))  # enough work to time small shapes
                t = min(_time(lambda: [fn() for _ in range(reps)], repeats)) / reps
                out.append({"hidden": H, "batch": B, "op": op, "gflops": flops / t / 1e9})
    return out


def step_sweep(preset: str, hiddens: list[int], batches: list[int], steps: int = 5,
               threads: int | None = None) -> list[dict]:
    """words/s of one full training step of `preset` for each hidden size and batch size."""

    out = []
    for H in hiddens:
        for B in batches:
            cfg = config_with_overrides(PRESETS[preset], {"hidden_size": H, "embed_size": H})
            r = _step_with_config(cfg, B, steps, threads)
            out.append({"hidden": H, "batch": B, "words_per_s": r["words_per_s"], "step_s": r["step_s"]})
    return out


def _step_with_config(cfg, batch: int, steps: int, threads: int | None) -> dict:

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)

    model = build_model(cfg, "fused")
    opt = make_optimizer(Spec(), model, 1e-3)
    b = SyntheticDataset(cfg, 0).get_batch(0, 0, batch, 0, batch)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(**b.inputs).backward()
        opt.step()

    med = statistics.median(_time(step, steps, warmup=2))
    return {"step_s": med, "words_per_s": b.words / med}


def knee(rows: list[dict], key: str, value: str, share: float = 0.9) -> dict:
    """Per `key` (hidden size), the smallest batch reaching `share` of the best `value` seen."""
    out = {}
    for k in sorted({r[key] for r in rows}):
        rs = sorted((r for r in rows if r[key] == k), key=lambda r: r["batch"])
        best = max(r[value] for r in rs)
        out[k] = next(r["batch"] for r in rs if r[value] >= share * best)
    return out


def ddp_exposed_exchange(preset: str, bucket_caps_mb: list[float], steps: int = 5, out: str | None = None) -> None:
    """Per rank under torchrun: the backward time DDP adds over a backward without gradient sync
    (`no_sync`), for each bucket size, on `preset`'s real parameter set: the exchange DDP could not
    hide behind backward."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel


    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = PRESETS[preset]
    torch.manual_seed(0)
    batch = build_dataset("synthetic", cfg, 0).get_batch(0, 0, cfg.default_batch, 0, cfg.default_batch // dist.get_world_size())
    results = []
    for cap in bucket_caps_mb:
        model = DistributedDataParallel(build_model(cfg), bucket_cap_mb=cap)

        def backward(sync: bool) -> None:
            model.zero_grad(set_to_none=True)
            loss = model(**batch.inputs)
            if sync:
                loss.backward()
            else:
                with model.no_sync():
                    loss.backward()

        with_sync = statistics.median(_time(lambda: backward(True), steps, warmup=2))
        without = statistics.median(_time(lambda: backward(False), steps, warmup=2))
        results.append({"label": f"DDP bucket {cap:g} MB", "preset": preset, "bucket_cap_mb": cap,
                        "step_with_exchange_s": with_sync, "step_without_exchange_s": without,
                        "exposed_exchange_s": with_sync - without})
    if rank == 0 and out:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
