"""Measurements of the hardware and the trainer, run inside one process or one rank.

`launch bench` (scalelab/launcher/bench.py) orchestrates these and renders the results; everything here
returns plain dicts so results can be stored as records and compared across machines.

- the yardstick for compute: the machine's dense matrix-multiply rate in float32 and in bfloat16,
  the better of the two (bf16 where the CPU or GPU has bf16 arithmetic, fp32 where it is emulated).
- `memcpy_bandwidth`: bytes/s of a large tensor copy, the yardstick for the gradient exchange on
  one host (loopback all-reduce cannot beat memory).
- `step_benchmark`: one training step (forward + backward + update) of a preset, as the trainer runs
  it, in each precision (fp32, bf16 autocast), with its FLOP rate against the yardstick measured in
  the same process. The precisions' steps and the yardstick's products alternate, so a shared
  machine's noise falls on all of them alike and their ratios hold where the absolute times do not.
- `python -m scalelab.train.bench allreduce ...`: per-rank all-reduce timing under torchrun (torch.distributed
  Gloo) or horovodrun (Horovod Gloo), reporting algbw and busbw as nccl-tests defines them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from scalelab.core.presets import PRESETS, config_with_overrides
from scalelab.core.spec import COMPRESSIONS, Spec
from scalelab.train.data import SyntheticDataset
from scalelab.train.datasets import build_dataset
from scalelab.train.engines import (COMPRESSED_DTYPES, ddp_compression_hook, horovod_compression, keep_until_exit,
                                    start_process_group)
from scalelab.train.links import allreduce_figures, timed
from scalelab.train.loop import make_optimizer
from scalelab.train.models import build_model
from scalelab.train.precision import DTYPES, Precision, make_precision


_time = timed  # one timing loop for the bench and the runs' link records (scalelab/train/links.py)


MATMUL_PRECISIONS = ("fp32", "bf16")  # the yardstick is the better of the two on this machine
GPU_MATMUL_PRECISIONS = ("fp32", "bf16", "fp16")  # a GPU's own rate in each format a step can run in
# `launch gpu-check`'s table: fp32 with TF32 tensor cores besides, the format PyTorch's fp32 matmuls take
# where `torch.set_float32_matmul_precision("high")` (or the older `allow_tf32`) is set.
GPU_CHECK_MATMUL_FORMATS = ("fp32", "tf32", "bf16", "fp16")


def bench_device() -> torch.device:
    """Where the bench runs: the first GPU when there is one (the trainer's `--device auto`), else the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _matmul(precision: str, n: int | None = None, device: torch.device = torch.device("cpu")) -> Callable[[], float]:
    """A function doing one dense n x n product with `precision`'s operands, returning its FLOP/s (2n^3).
    On a GPU the product is 8192^3 (2048^3 would not fill an H100) and timed between synchronisations."""
    n = n or (8192 if device.type == "cuda" else 2048)
    dtype = DTYPES["fp32" if precision == "tf32" else precision]
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, dtype=dtype, device=device)

    def product() -> float:
        with _float32_matmuls(precision):
            _sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            _sync(device)
            return 2 * n**3 / (time.perf_counter() - t0)

    return product


@contextlib.contextmanager
def _float32_matmuls(precision: str):
    """float32 products as `precision` names them: "tf32" lets them use TF32 tensor cores, "fp32" keeps
    them in full float32 (PyTorch's default), whatever the process had set; other formats are untouched."""
    if precision not in ("fp32", "tf32"):
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def matmul_rates(formats: tuple[str, ...] = GPU_CHECK_MATMUL_FORMATS, repeats: int = 10, warmup: int = 3,
                 n: int | None = None) -> list[dict]:
    """The dense product rate of this machine's bench device (`_matmul`: 8192^3 on a GPU, each product
    between synchronisations) in each format, their products alternating round by round; one row each
    with the median and the best of `repeats` rounds after `warmup`."""
    device = bench_device()
    products = {p: _matmul(p, n, device) for p in formats}
    for _ in range(warmup):
        for run in products.values():
            run()
    rounds = [{p: run() for p, run in products.items()} for _ in range(repeats)]
    size = n or (8192 if device.type == "cuda" else 2048)
    return [{"precision": p, "n": size, "device": _device_name(device), "repeats": repeats,
             "flops_per_s": statistics.median(r[p] for r in rounds), "best_flops_per_s": max(r[p] for r in rounds)}
            for p in formats]


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def device_facts() -> dict:
    """The GPUs and software this process sees: PyTorch's CUDA properties of each device, the CUDA,
    cuDNN and NCCL versions, and `nvidia-smi`'s name, driver and memory where it is installed."""
    cuda = torch.cuda.is_available()
    facts: dict[str, Any] = {
        "torch": torch.__version__, "cuda_build": torch.version.cuda, "cuda_available": cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": _nccl_version() if cuda else None,
        "bf16_supported": torch.cuda.is_bf16_supported() if cuda else False,
        "devices": [], "nvidia_smi": _nvidia_smi(),
    }
    for i in range(torch.cuda.device_count() if cuda else 0):
        p = torch.cuda.get_device_properties(i)
        facts["devices"].append({"index": i, "name": p.name, "total_memory_bytes": p.total_memory,
                                 "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
                                 "l2_cache_bytes": getattr(p, "L2_cache_size", None)})
    return facts


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _nvidia_smi() -> dict | None:
    """`nvidia-smi`'s view of each GPU (name, driver, memory, clocks, power limit); None without the tool."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    fields = ["name", "driver_version", "memory.total", "memory.used", "clocks.max.sm", "power.limit", "pstate"]
    try:
        proc = subprocess.run([tool, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip()[-500:]}
    gpus = [dict(zip(fields, (v.strip() for v in line.split(",")))) for line in proc.stdout.strip().splitlines()]
    return {"gpus": gpus}


def memcpy_bandwidth(mb: int = 256, repeats: int = 5) -> dict:
    """Bytes moved per second by a large copy (read + write both count), best of `repeats`."""
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    times = _time(lambda: dst.copy_(src), repeats)
    return {"bytes": src.numel() * 4, "bytes_per_s": 2 * src.numel() * 4 / min(times)}


def step_benchmark(preset: str, rnn: str = "fused", batch: int | None = None, steps: int = 10,
                   warmup: int = 3, threads: int | None = None, optimizer: str = "adam",
                   precisions: tuple[str, ...] = ("fp32",)) -> list[dict]:
    """Time the trainer's step on synthetic data in each of `precisions`, one row each; FLOPs from the
    model's documented formula.

    Each round runs one step per precision (on one model and optimizer: the numbers do not change the
    work) and one 2048 x 2048 product per matmul format. Achieved FLOP/s = flops_per_step(batch) /
    median step time; the yardstick is the better format's median product rate, and every efficiency
    and `speedup_vs_fp32` is a median over rounds of that round's ratio: on a shared machine a round's
    load falls on the steps and the products alike.
    """
    device = bench_device()
    formats = GPU_MATMUL_PRECISIONS if device.type == "cuda" else MATMUL_PRECISIONS
    model, b, timed = _steps(preset, rnn, batch, threads, optimizer, precisions, device)
    batch = b.samples
    timed.update({f"matmul_{p}": _matmul(p, device=device) for p in formats})
    for _ in range(warmup):
        for run in timed.values():
            run()
    rounds = [{key: run() for key, run in timed.items()} for _ in range(steps)]
    rates = {p: statistics.median(r[f"matmul_{p}"] for r in rounds) for p in formats}
    best = max(rates, key=rates.get)
    flops = model.flops_per_step(batch)
    common = {"preset": preset, "rnn": rnn, "batch": batch, "threads": torch.get_num_threads(),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "params": sum(p.numel() for p in model.parameters()), "flops_per_step": flops,
              "matmul_flops_per_s": rates[best], "matmul_precision": best,
              **{f"matmul_{p}_flops_per_s": rate for p, rate in rates.items()}}
    return [{**common, "precision": p, **_step_figures(rounds, p, b.words, flops, best, formats)} for p in precisions]


def step_profile(preset: str, rnn: str = "fused", steps: int = 3, threads: int | None = None,
                 precisions: tuple[str, ...] = ("fp32", "bf16"), top: int = 12) -> list[dict]:
    """What a step spends its time on, per precision: `torch.profiler`'s self time of each ATen op per
    step (mean of `steps` profiled steps after one warm-up), the `top` ops by their largest time, then
    the sum over all ops. The steps are `step_benchmark`'s; which oneDNN kernel runs behind an op shows
    with ONEDNN_VERBOSE=1 in the environment."""
    from torch.profiler import ProfilerActivity, profile

    _, _, timed = _steps(preset, rnn, None, threads, "adam", precisions)
    totals: dict[str, dict[str, tuple[float, int]]] = {p: {} for p in precisions}
    for step in timed.values():
        step()
    for _ in range(steps):
        for p, step in timed.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            for e in prof.key_averages():
                if e.key.startswith("aten::"):
                    ms = totals[p].get(e.key, (0.0, 0))[0] + e.self_cpu_time_total / 1e3 / steps
                    totals[p][e.key] = (ms, e.count)
    ops = sorted(set().union(*totals.values()), key=lambda op: -max(t.get(op, (0.0,))[0] for t in totals.values()))
    rows = [{"op": op, **{f"{p}_{k}": totals[p].get(op, (0.0, 0))[i] for p in precisions for i, k in enumerate(("ms", "calls"))}}
            for op in ops[:top]]
    return rows + [{"op": "all ops", **{f"{p}_ms": sum(ms for ms, _ in totals[p].values()) for p in precisions}}]


def _steps(preset: str, rnn: str, batch: int | None, threads: int | None, optimizer: str,
           precisions: tuple[str, ...], device: torch.device = torch.device("cpu"),
           ) -> tuple[torch.nn.Module, Any, dict[str, Callable[[], dict[str, float]]]]:
    """The model, its synthetic batch, and a step function per precision: the trainer's model, optimizer
    and step, sharing one model and optimizer (the numbers do not change the work). On a GPU the output
    layer and loss run as the trainer's default does there (`--output-loss auto`)."""
    from scalelab.train.outloss import resolve

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = PRESETS[preset]
    batch = batch or cfg.default_batch
    model = build_model(cfg, rnn, resolve("auto", device)[0] if device.type == "cuda" else "full").to(device)
    opt = make_optimizer(Spec(optimizer=optimizer), model, 1e-3)  # exactly the trainer's optimizer
    b = build_dataset("synthetic", cfg, 0).get_batch(0, 0, batch, 0, batch).to(device)
    return model, b, {p: _phase_timer(model, opt, b.inputs, make_precision(p, device, rnn), device) for p in precisions}


def _phase_timer(model, opt, inputs: dict, precision: Precision,
                 device: torch.device = torch.device("cpu")) -> Callable[[], dict[str, float]]:
    """A function running one training step in `precision` and returning its phase times. Every clock
    is read after the device is synchronised, so on a GPU a phase is the time its kernels took."""

    def clock() -> float:
        _sync(device)
        return time.perf_counter()

    def step() -> dict[str, float]:
        t0 = clock()
        model.zero_grad(set_to_none=True)
        with precision.autocast():
            loss = model(**inputs)
        t1 = clock()
        precision.backward(loss)
        t2 = clock()
        precision.step(opt, lambda o, apply=None: (apply or type(o).step)(o))  # fp16: the scaler's guarded step
        t3 = clock()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "step": t3 - t0}

    return step


def _step_figures(rounds: list[dict], precision: str, words: int, flops: float, best: str,
                  formats: tuple[str, ...] = MATMUL_PRECISIONS) -> dict:
    """Median step and phases, words/s, FLOP/s, and the per-round ratios (medians) of one precision:
    against the best matmul rate, against each format's, and (`efficiency_own`) against the rate of the
    step's own format, the step's share of what the hardware does in that precision."""
    times = [r[precision] for r in rounds]
    med = statistics.median(t["step"] for t in times)

    def ratio(of) -> float:
        return statistics.median(of(r) for r in rounds)

    return {
        "step_s": med, "step_s_min": min(t["step"] for t in times), "words_per_s": words / med,
        "flops_per_s": flops / med,
        "efficiency": ratio(lambda r: flops / r[precision]["step"] / r[f"matmul_{best}"]),
        **{f"efficiency_{m}_matmul": ratio(lambda r, m=m: flops / r[precision]["step"] / r[f"matmul_{m}"])
           for m in formats},
        **({"efficiency_own": ratio(lambda r: flops / r[precision]["step"] / r[f"matmul_{precision}"])}
           if f"matmul_{precision}" in rounds[0] else {}),
        **({"speedup_vs_fp32": ratio(lambda r: r["fp32"]["step"] / r[precision]["step"])} if "fp32" in rounds[0] else {}),
        **{f"{k}_s": statistics.median(t[k] for t in times) for k in ("forward", "backward", "optimizer")},
    }


def loss_benchmark(preset: str, batch: int | None = None, precision: str = "fp32",
                   losses: tuple[str, ...] = ("full", "chunked"), steps: int = 8, warmup: int = 2,
                   threads: int | None = None) -> list[dict]:
    """Whole training steps of `preset` with each output-loss implementation (scalelab/train/outloss.py),
    their steps alternating round by round in this process, on models with the same weights.

    One row per implementation: median step and words/s, the median per-round ratio to `full` (a shared
    machine's load falls on every implementation of a round alike), and the loss of the first step (the
    same weights and batch: the implementations must agree)."""
    from scalelab.train.outloss import resolve

    if threads:
        torch.set_num_threads(threads)
    cfg = PRESETS[preset]
    batch = batch or cfg.default_batch
    b = build_dataset("synthetic", cfg, 0).get_batch(0, 0, batch, 0, batch)
    prec = make_precision(precision, torch.device("cpu"), "fused")
    steps_by, first = {}, {}
    for name in losses:
        torch.manual_seed(0)
        impl, _ = resolve(name, torch.device("cpu"))
        model = build_model(cfg, "fused", impl)
        steps_by[name] = _phase_timer(model, make_optimizer(Spec(), model, 1e-3), b.inputs, prec)
        with torch.no_grad(), prec.autocast():
            first[name] = float(model(**b.inputs))
    for _ in range(warmup):
        for step in steps_by.values():
            step()
    rounds = [{name: step()["step"] for name, step in steps_by.items()} for _ in range(steps)]
    out = []
    for name in losses:
        med = statistics.median(r[name] for r in rounds)
        out.append({"preset": preset, "batch": batch, "precision": precision, "output_loss": name,
                    "step_s": med, "words_per_s": b.words / med, "loss": first[name],
                    "speedup_vs_full": statistics.median(r["full"] / r[name] for r in rounds) if "full" in rounds[0] else None})
    return out


# ---- all-reduce, one rank ------------------------------------------------------------------------


def allreduce_rank(engine: str, sizes_mb: list[float], repeats: int, out: str | None, label: str,
                   compression: str = "none", tensors: int = 1) -> None:
    """All-reduce float32 buffers of each size (split into `tensors` equal tensors, as gradients are),
    sent as they are or cast to fp16 / bf16 and back (`compression`), as the engines send gradients."""
    if engine == "ddp":
        import torch.distributed as dist

        start_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        dtype = COMPRESSED_DTYPES.get(compression)

        def reduce(ts):
            sent = [t.to(dtype) for t in ts] if dtype else ts
            works = [dist.all_reduce(t, async_op=True) for t in sent]
            for w in works:
                w.wait()
            if dtype:
                for t, low in zip(ts, sent):
                    t.copy_(low)
    else:
        import horovod.torch as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
        compressor = horovod_compression(hvd, compression)
        counter = iter(range(10**9))

        def reduce(ts):
            n = next(counter)
            handles = []
            for i, t in enumerate(ts):
                c, ctx = compressor.compress(t)
                handles.append((hvd.allreduce_async_(c, name=f"t{i}.{n}", op=hvd.Sum), c, ctx, t))
            for h, c, ctx, t in handles:
                hvd.synchronize(h)
                if c is not t:
                    t.copy_(compressor.decompress(c, ctx))

    results = [{"label": label, "engine": engine, "ranks": world, "tensors": tensors, "compression": compression,
                **allreduce_figures(reduce, world, mb, repeats, tensors)} for mb in sizes_mb]
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

    from scalelab.core.spec import EngineSpec
    from scalelab.train.engines import PSEngine

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
    p = argparse.ArgumentParser(prog="python -m scalelab.train.bench")
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("allreduce", help="time all-reduce on this rank (start with torchrun or horovodrun)")
    a.add_argument("--engine", choices=["ddp", "horovod"], required=True)
    a.add_argument("--sizes-mb", default="1,16,64")
    a.add_argument("--repeats", type=int, default=5)
    a.add_argument("--tensors", type=int, default=1)
    a.add_argument("--compression", choices=COMPRESSIONS, default="none")
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
    d.add_argument("--compression", choices=COMPRESSIONS, default="none")
    d.add_argument("--out")
    s = sub.add_parser("step", help="time one preset's training step in this process")
    s.add_argument("preset")
    s.add_argument("--rnn", default="fused")
    s.add_argument("--batch", type=int)
    s.add_argument("--steps", type=int, default=10)
    s.add_argument("--threads", type=int)
    s.add_argument("--precisions", default="fp32,bf16", help="comma-separated; their steps alternate")
    o = sub.add_parser("loss", help="time whole steps with each --output-loss implementation, alternating")
    o.add_argument("preset")
    o.add_argument("--batch", type=int)
    o.add_argument("--precision", default="fp32")
    o.add_argument("--losses", default="full,chunked")
    o.add_argument("--steps", type=int, default=8)
    o.add_argument("--threads", type=int)
    sub.add_parser("device", help="the GPUs, driver and CUDA/cuDNN/NCCL versions this process sees (JSON)")
    m = sub.add_parser("matmul", help="dense product rates of the bench device per format (JSON)")
    m.add_argument("--precisions", default=",".join(GPU_CHECK_MATMUL_FORMATS))
    m.add_argument("--repeats", type=int, default=10)
    m.add_argument("--n", type=int)
    f = sub.add_parser("profile", help="self time per op of one preset's step, fp32 beside bf16 (torch.profiler)")
    f.add_argument("preset")
    f.add_argument("--rnn", default="fused")
    f.add_argument("--steps", type=int, default=3)
    f.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.what == "device":
        print(json.dumps(device_facts()))
    elif args.what == "matmul":
        print(json.dumps(matmul_rates(tuple(args.precisions.split(",")), args.repeats, n=args.n)))
    elif args.what == "ps-exchange":
        ps_exchange_rank(args.presets.split(","), [float(x) for x in args.sizes_mb.split(",")], args.repeats, args.out)
    elif args.what == "ddp-buckets":
        ddp_exposed_exchange(args.preset, [float(x) for x in args.bucket_caps_mb.split(",")], out=args.out,
                             compression=args.compression)
    elif args.what == "allreduce":
        allreduce_rank(args.engine, [float(x) for x in args.sizes_mb.split(",")], args.repeats, args.out,
                       args.label or args.engine, args.compression, args.tensors)
    elif args.what == "loss":
        print(json.dumps(loss_benchmark(args.preset, args.batch, args.precision, tuple(args.losses.split(",")),
                                        args.steps, threads=args.threads)))
    elif args.what == "profile":
        for row in step_profile(args.preset, args.rnn, args.steps, args.threads):
            print(json.dumps(row))
    else:
        print(json.dumps(step_benchmark(args.preset, args.rnn, args.batch, args.steps, threads=args.threads,
                                        precisions=tuple(args.precisions.split(",")))))
    return 0



# ---- seed 003: GEMM and training-step throughput against batch size ------------------------------


#: The recurrent multiplies of seed 003, named as the seed and cuBLAS name them (column-major BLAS: the op letters
#: say which operand is transposed): forward U h is NN, backward U^T delta is TN, update delta h^T is NT. PyTorch
#: is row-major, so the same products are written h @ U, delta @ U.T and h.T @ delta below.
GEMM_OPS = ("NN forward", "TN backward", "NT update")

#: `progress(done, total, rows)` after each measured point of a sweep (its rows), so a long study says where it is.
Progress = Callable[[int, int, list[dict]], None]


def timing_spread(times: list[float]) -> float:
    """The spread of repeated timings: their interquartile range over their median (0.1 = 10 %). One outlier
    on each side does not move it; a point whose repeats disagree this much is noise, not a knee."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(times)


def gemm_sweep(hiddens: list[int], batches: list[int], repeats: int = 5, threads: int | None = None,
               progress: Progress | None = None) -> list[dict]:
    """GFLOP/s of the LSTM's recurrent multiplies for each hidden size H and batch B, on the CPU.

    The three shapes of seed 003 (`GEMM_OPS`, the seed's names): forward `h (B x H) @ U (H x 4H)` (NN),
    the backward data gradient `delta (B x 4H) @ U^T` (TN in the seed's column-major terms) and the weight
    update `h^T (H x B) @ delta (B x 4H)` (NT). Best of `repeats`, with the spread of the repeats
    (`timing_spread`) so that a reader can tell a dip from noise.
    """
    if threads:
        torch.set_num_threads(threads)
    out, total = [], len(hiddens) * len(batches)
    for H in hiddens:
        U = torch.randn(H, 4 * H)
        for B in batches:
            h, d = torch.randn(B, H), torch.randn(B, 4 * H)
            flops = 2.0 * B * H * 4 * H
            point = []
            for op, fn in zip(GEMM_OPS, (lambda: h @ U, lambda: d @ U.t(), lambda: h.t() @ d)):
                reps = max(repeats, int(2e8 // flops))  # enough work to time small shapes
                times = [t / reps for t in _time(lambda: [fn() for _ in range(reps)], repeats)]
                point.append({"hidden": H, "batch": B, "op": op, "gflops": flops / min(times) / 1e9,
                              "spread": timing_spread(times)})
            out += point
            if progress:
                progress(len(out) // len(GEMM_OPS), total, point)
    return out


def step_sweep(preset: str, hiddens: list[int], batches: list[int], steps: int = 5,
               threads: int | None = None, progress: Progress | None = None) -> list[dict]:
    """words/s of one full training step of `preset` for each hidden size and batch size (median of
    `steps`), with the spread of the steps' times (`timing_spread`)."""

    out, total = [], len(hiddens) * len(batches)
    for H in hiddens:
        for B in batches:
            cfg = config_with_overrides(PRESETS[preset], {"hidden_size": H, "embed_size": H})
            r = _step_with_config(cfg, B, steps, threads)
            out.append({"hidden": H, "batch": B, "words_per_s": r["words_per_s"], "step_s": r["step_s"],
                        "spread": r["spread"]})
            if progress:
                progress(len(out), total, out[-1:])
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

    times = _time(step, steps, warmup=2)
    med = statistics.median(times)
    return {"step_s": med, "words_per_s": b.words / med, "spread": timing_spread(times)}


def ddp_exposed_exchange(preset: str, bucket_caps_mb: list[float], steps: int = 5, out: str | None = None,
                         compression: str = "none") -> None:
    """Per rank under torchrun: the backward time DDP adds over a backward without gradient sync
    (`no_sync`), for each bucket size, on `preset`'s real parameter set: the exchange DDP could not
    hide behind backward. With `compression`, the trainer's comm hook sends the gradients in fp16 / bf16."""
    import torch.distributed as dist

    from scalelab.train import ddp


    start_process_group("gloo")
    rank = dist.get_rank()
    cfg = PRESETS[preset]
    torch.manual_seed(0)
    batch = build_dataset("synthetic", cfg, 0).get_batch(0, 0, cfg.default_batch, 0, cfg.default_batch // dist.get_world_size())
    results = []
    for cap in bucket_caps_mb:
        model = keep_until_exit(ddp.build(build_model(cfg), bucket_cap_mb=cap))
        hook = ddp_compression_hook(compression)
        if hook is not None:
            model.register_comm_hook(None, hook)

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
        label = f"DDP bucket {cap:g} MB" + (f", {compression} compression" if hook else "")
        results.append({"label": label, "preset": preset, "bucket_cap_mb": cap, "compression": compression,
                        "step_with_exchange_s": with_sync, "step_without_exchange_s": without,
                        "exposed_exchange_s": with_sync - without})
    if rank == 0 and out:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # As a rank (`allreduce`, `ps-exchange`, `ddp-buckets` under torchrun or horovodrun) it leaves as the trainer's
    # ranks do: a rank that had written its results once aborted in the interpreter's teardown (exit -6, 2026-12-02).
    from scalelab.train import exit_without_teardown

    exit_without_teardown(main())
