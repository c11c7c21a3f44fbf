"""The gradient noise scale of a run, measured while it trains (McCandlish et al. 2018, "An Empirical
Model of Large-Batch Training", appendix A).

    B_simple = tr(Σ) / |G|²

Σ is the covariance of one sample's gradient and G the true gradient. A batch twice as large
halves the gradient's variance, so below B_simple a larger batch cuts the steps to a loss almost
in proportion, and above it hardly at all: it is what the planner needs to say how the steps and
samples to a loss threshold change with the global batch (scalelab/costs/convergence.py).

Why this is nearly free in data parallelism: a mean gradient over b samples has
E|g_b|² = |G|² + tr(Σ)/b, and every rank already holds two of them, its own gradient over its
slice (b samples) and the exchanged average over the global batch (B samples). Two equations, two
unknowns (`estimate`): each rank reads its own gradient's norm in a hook on every parameter
(before the exchange overwrites it) and the averaged one after the exchange. With one worker (or
independent replicas) there is no second gradient, so every `PROBE_EVERY` steps the gradient of
the first half of the batch is computed too, at the same parameters before the update (b = B/2
against B; under its own RNG state, so training is unchanged; its seconds are left out of the
step's timings and recorded as `noise_s`).

Each estimate of one step is unbiased but very noisy; tr(Σ) and |G|² are smoothed apart (an
exponential average with bias correction) and their ratio recorded, since the average of ratios
is biased. Records carry the raw pair too (`noise_trace`, `noise_grad_sq`), so reports pool them
over ranks and steps (analysis.scaling). Norms are taken in float32 whatever the gradients' dtype;
a constant loss scale (mixed precision) cancels in the ratio, and a non-finite step is skipped.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

__all__ = ["PROBE_EVERY", "estimate", "Smoother", "NoiseMeter"]

PROBE_EVERY = 4  # one worker: steps between probes (each one forward + backward of half the batch)
SMOOTHING = 0.9  # weight of the past in the exponential averages of tr(Σ) and |G|²


def estimate(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """(tr(Σ), |G|²), unbiased, from the squared norms of two mean gradients over `b_small` and
    `b_big` samples (b_small < b_big): solve E|g_b|² = |G|² + tr(Σ)/b for the two of them."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    return trace, grad_sq


class Smoother:
    """Exponential averages of tr(Σ) and |G|² with Adam's bias correction; `scale` is their ratio."""

    def __init__(self, beta: float = SMOOTHING) -> None:
        self.beta = beta
        self.trace = 0.0
        self.grad_sq = 0.0
        self.count = 0

    def update(self, trace: float, grad_sq: float) -> None:
        if not (math.isfinite(trace) and math.isfinite(grad_sq)):
            return
        self.trace = self.beta * self.trace + (1 - self.beta) * trace
        self.grad_sq = self.beta * self.grad_sq + (1 - self.beta) * grad_sq
        self.count += 1

    @property
    def scale(self) -> float | None:
        """B_simple in samples; None before the first estimate or while |G|² is not positive."""
        if not self.count or self.grad_sq <= 0:
            return None
        return self.trace / self.grad_sq  # both carry the same bias correction: it cancels


def _sq_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Σ |t|² over `tensors`, in float32."""
    return torch.stack([torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors]).square().sum()


class NoiseMeter:
    """Measures B_simple on one rank: `exchanged()` after the gradient exchange (before clipping and
    the update), `fields()` for the step record."""

    def __init__(self, model: torch.nn.Module, world: int, global_batch: int, exchanging: bool,
                 probe_every: int = PROBE_EVERY, workers: int | None = None) -> None:
        """`workers`: the ranks with data when fewer than `world` (ps server ranks have none): one worker
        and its servers have no second gradient to compare, so the worker probes, as alone."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.world, self.global_batch = world, global_batch
        self.data_parallel = exchanging and (workers or world) > 1
        self.probe_every = probe_every
        self.smoother = Smoother()
        self._local: torch.Tensor | None = None  # Σ |this rank's gradient|² of this backward
        self._pending: tuple[float, float] | None = None
        self._probe_s: float | None = None
        if self.data_parallel:
            for p in self.params:
                p.register_hook(self._add_local)

    def _add_local(self, grad: torch.Tensor) -> None:
        """Runs on this rank's own gradient of one parameter, before it is accumulated and exchanged."""
        sq = torch.linalg.vector_norm(grad.detach(), dtype=torch.float32).square()
        self._local = sq if self._local is None else self._local + sq

    def exchanged(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], samples: int, step: int,
                  loss_scale: float = 1.0, grad_sq: float | None = None) -> float:
        """Estimate this step's tr(Σ) and |G|² while the gradients hold the global batch's average;
        return the seconds spent probing (one worker), which the caller leaves out of the step's
        timings. `loss_scale`: a factor the loss was multiplied by (mixed precision), divided out.
        `grad_sq`: |G|² when the engine knows it and no rank holds the whole gradient (parameter server)."""
        local, self._local = self._local, None
        if self.data_parallel:
            if local is not None and samples < self.global_batch:
                # the loss was weighted by samples·world/global_batch (unequal shares): divide it out
                weight = samples * self.world / self.global_batch * loss_scale
                self._pending = estimate(float(local) / weight**2, self._averaged_sq(loss_scale, grad_sq), samples,
                                         self.global_batch)
            return 0.0
        if step % self.probe_every or samples < 2:
            return 0.0
        t0 = time.perf_counter()
        half = samples // 2
        self._pending = estimate(self._half_sq(model, inputs, half), self._averaged_sq(loss_scale, grad_sq), half, samples)
        self._probe_s = time.perf_counter() - t0
        return self._probe_s

    def _averaged_sq(self, loss_scale: float, grad_sq: float | None = None) -> float:
        """|G_B|² of the gradient the parameters hold now (the average over the global batch)."""
        if grad_sq is None:
            grad_sq = float(_sq_norm([p.grad for p in self.params if p.grad is not None]))
        return grad_sq / loss_scale**2

    def _half_sq(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], half: int) -> float:
        """|g|² of the first `half` samples' mean gradient at the current parameters (one extra
        forward and backward of half the batch, under its own RNG state: training is unchanged)."""
        device = self.params[0].device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            loss = model(**{k: v[:half] for k, v in inputs.items()})
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return float(_sq_norm([g.detach() for g in grads if g is not None]))

    def fields(self) -> dict[str, Any]:
        """The noise fields of this step's record: none on a step that estimated nothing."""
        if self._pending is None:
            return {}
        (trace, grad_sq), self._pending = self._pending, None
        self.smoother.update(trace, grad_sq)
        probe, self._probe_s = self._probe_s, None
        return {"noise_scale": self.smoother.scale, "noise_trace": _finite(trace), "noise_grad_sq": _finite(grad_sq),
                **({"noise_s": probe} if probe is not None else {})}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
