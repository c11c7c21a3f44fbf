"""All-reduce timing of a layout's links: one definition for `launch bench` and for a run's `link` records.

Why inside a run: a probe (`launch probe`) must measure the links the candidate's layout really uses -
the same engine, transport, allocation and placement as its training - and bring the figures back the
way every measurement comes back, as records. After the last step each rank all-reduces buffers of
`spec.link_probe_mb` sizes; rank 0 records the median time of each with its algorithm and bus
bandwidth as nccl-tests define them (busbw = algbw x 2(n-1)/n), and the scope of the link: `intra`
(every rank on one node: GPU to GPU inside the instance) or `inter` (the ring crosses nodes, whose link
then bounds it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

LINK_REPEATS = 5


def timed(fn: Callable[[], None], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def allreduce_figures(reduce: Callable[[list[torch.Tensor]], None], world: int, mb: float, repeats: int,
                      tensors: int = 1, device: torch.device | str = "cpu") -> dict[str, float]:
    """Median time, algbw and busbw (bytes/s) of all-reducing `mb` MB of float32 in `tensors` tensors."""
    numel = int(mb * 2**20 // 4)
    ts = [torch.ones(max(1, numel // tensors), device=device) for _ in range(tensors)]
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def once() -> None:
        reduce(ts)
        sync()

    t = statistics.median(timed(once, repeats, warmup=2))
    nbytes = sum(x.numel() for x in ts) * 4
    algbw = nbytes / t
    return {"mb": mb, "time_s": t, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world if world > 1 else 0.0}


def link_records(allreduce_: Callable[[torch.Tensor], None], world: int, nodes: int, sizes_mb: list[float],
                 device: torch.device | str = "cpu", repeats: int = LINK_REPEATS) -> list[dict[str, float | str | int]]:
    """One `link` record's fields per size: every rank must call this (each all-reduce is collective)."""

    def reduce(ts: list[torch.Tensor]) -> None:
        for t in ts:
            allreduce_(t)

    scope = "intra" if nodes == 1 else "inter"
    return [{"scope": scope, "nodes": nodes, **allreduce_figures(reduce, world, mb, repeats, device=device)}
            for mb in sizes_mb]
