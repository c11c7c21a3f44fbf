"""Scaling models of throughput against the worker count, fitted to a few measured layouts.

Two models of the time per unit of work y(N) = 1 / throughput(N) of N workers, each fitted by
non-negative least squares (so every term means a cost, never a gain), rows weighted by 1/y so
that every measurement's relative error counts the same:

- **ernest** (Venkataraman et al., NSDI 2016): y = θ0 + θ1/N + θ2·log N + θ3·N
  (serial part, parallel part, tree-shaped aggregation, per-worker overhead).
- **comm** (ring all-reduce): y = θ0 + θ1/N + θ2·x(N) + θ3·x(N)/N, with x(N) the ring
  all-reduce time 2(N−1)·α + 2·((N−1)/N)·bytes/B(N), B(N) the link bandwidth of the layout (inside
  one node, or the instance network between nodes). One exchange per step: with a fixed global
  batch that is a fixed cost per unit of work (θ2), with a growing one (each step does N times the
  work) it is divided by N (θ3). Both terms are kept so one model serves either axis (and a
  parameter server, whose serial share shows up in θ0); θ2 and θ3 calibrate the effective bandwidth.
- **ps** (parameter server, `--engine ps`): the same terms with x(N) the parameter-server exchange
  2(N−1)·(α + bytes/(S·B(N))), S shards (one per node), colocated with workers: each shard receives
  its share bytes/S of the gradient from each of the other N−1 workers and sends the new values back,
  so its link carries 2(N−1)·bytes/S where the ring's carries 2((N−1)/N)·bytes: on one node PS is N
  times slower, across S = N nodes they are alike.

The model with the lower leave-one-out (held-out) mean relative error on throughput is chosen.
How far to trust it, and whether a plan uses it at all, is judged by scalelab/costs/calibration.py
from the errors such fits made on published tables it never saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from scalelab.core.errors import DataError

__all__ = [
    "FitError",
    "nnls",
    "LinkModel",
    "ScalingModel",
    "ErnestModel",
    "CommModel",
    "MODELS",
    "ring_allreduce_s",
    "PSModel",
    "ps_exchange_s",
    "FitResult",
    "fit_series",
    "extrapolation",
    "mixed_throughput",
    "pareto_front",
]


# ---- numerics -------------------------------------------------------------------------------


class FitError(DataError):
    """A least-squares fit the arithmetic cannot do: a number in it is not finite (an input overflowed), or
    the SVD did not converge. Why a user error and not numpy's LinAlgError: it comes from the user's numbers
    (`launch plan --gradient-mb 1e305` overflowed the bytes to inf), and the callers name the series."""


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares min ||a x − b||, x >= 0.

    The planner's fits have at most a few columns, so the exact answer is found by trying every support:
    the optimum is the unconstrained least squares on the columns it leaves positive, so of the
    supports whose solution is non-negative the one with the least residual wins. That costs
    microseconds and spares `launch plan` SciPy's import (0.4-1 s of a 2 s budget, docs/benchmarks.md);
    wider problems go to scipy.optimize.nnls (Lawson-Hanson's active set). A problem that cannot be
    solved (not finite, or no convergence) raises FitError.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise FitError("a number of the least-squares fit is not finite (an input too large or too small "
                       "for the arithmetic)")
    try:
        return _nnls(a, b)
    except (np.linalg.LinAlgError, RuntimeError) as exc:  # RuntimeError: SciPy's iteration limit
        raise FitError(f"the least-squares fit did not converge ({exc})") from None


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = a.shape[1]
    if n > _EXACT_NNLS_COLUMNS:
        from scipy import optimize  # here, not at import: see nnls

        return optimize.nnls(a, b)[0]
    best, best_res = np.zeros(n), float(b @ b)
    for mask in range(1, 2 ** n):
        cols = [j for j in range(n) if mask >> j & 1]
        sol = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if np.any(sol < 0):
            continue
        res = float(np.sum((a[:, cols] @ sol - b) ** 2))
        if res < best_res - 1e-12 * max(1.0, best_res):
            best, best_res = np.zeros(n), res
            best[cols] = sol
    return best


_EXACT_NNLS_COLUMNS = 6  # 63 small least-squares solves at the most


@dataclass(frozen=True)
class LinkModel:
    """Bandwidths and latencies for the ring all-reduce (defaults: PCIe-class inside a node,
    the instance network between nodes, else 10 Gbit/s)."""

    gradient_bytes: float = 1.0e6
    intra_gbps: float = 80.0
    inter_gbps: float = 10.0
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 5e-5


def ring_allreduce_s(workers: np.ndarray, nodes: np.ndarray, link: LinkModel) -> np.ndarray:
    """t_ring = 2(N−1)·α + 2·((N−1)/N)·bytes/B, with B and α of the slowest link in the layout."""
    n = np.asarray(workers, dtype=float)
    multi = np.asarray(nodes, dtype=float) > 1
    bw = np.where(multi, link.inter_gbps, link.intra_gbps) * 1e9 / 8.0
    alpha = np.where(multi, link.inter_latency_s, link.intra_latency_s)
    return 2 * (n - 1) * alpha + 2 * ((n - 1) / n) * link.gradient_bytes / bw


def ps_exchange_s(workers: np.ndarray, nodes: np.ndarray, link: LinkModel) -> np.ndarray:
    """t_ps = 2(N−1)·(α + bytes/(S·B)), S = nodes shards: the busiest shard's link is the bottleneck."""
    n, shards = np.asarray(workers, dtype=float), np.asarray(nodes, dtype=float)
    multi = shards > 1
    bw = np.where(multi, link.inter_gbps, link.intra_gbps) * 1e9 / 8.0
    alpha = np.where(multi, link.inter_latency_s, link.intra_latency_s)
    return 2 * (n - 1) * (alpha + link.gradient_bytes / (shards * bw))


class ScalingModel:
    """y(N) = features(N) · θ with θ >= 0, fitted on time per unit work."""

    name = "base"

    def __init__(self, link: LinkModel | None = None) -> None:
        self.link = link or LinkModel()
        self.theta: np.ndarray | None = None

    def features(self, workers: np.ndarray, nodes: np.ndarray, link: LinkModel | None = None) -> np.ndarray:
        raise NotImplementedError

    def fit(self, workers: Sequence[float], nodes: Sequence[float], throughput: Sequence[float]) -> "ScalingModel":
        w, nd, thr = (np.asarray(v, dtype=float) for v in (workers, nodes, throughput))
        y = 1.0 / thr
        a = self.features(w, nd) / y[:, None]  # weights 1/y: relative residuals
        self.theta = nnls(a, np.ones_like(y))
        return self

    def predict(self, workers: Sequence[float], nodes: Sequence[float], link: LinkModel | None = None) -> np.ndarray:
        """Predicted throughput (work per second); inf never, NaN when the model predicts no time."""
        assert self.theta is not None, "fit first"
        y = self.features(np.asarray(workers, float), np.asarray(nodes, float), link) @ self.theta
        with np.errstate(divide="ignore"):
            return np.where(y > 0, 1.0 / np.where(y > 0, y, 1.0), np.nan)


class ErnestModel(ScalingModel):
    name = "ernest"

    def features(self, workers, nodes, link=None):
        w = np.asarray(workers, dtype=float)
        return np.column_stack([np.ones_like(w), 1.0 / w, np.log(w), w])


class CommModel(ScalingModel):
    name = "comm"
    exchange = staticmethod(ring_allreduce_s)

    def features(self, workers, nodes, link=None):
        w = np.asarray(workers, dtype=float)
        ring = self.exchange(w, nodes, link or self.link)
        return np.column_stack([np.ones_like(w), 1.0 / w, ring, ring / w])


class PSModel(CommModel):
    """CommModel's terms with the parameter-server exchange in place of the ring all-reduce."""

    name = "ps"
    exchange = staticmethod(ps_exchange_s)


MODELS: dict[str, type[ScalingModel]] = {"ernest": ErnestModel, "comm": CommModel, "ps": PSModel}


# ---- fitting ----------------------------------------------------------------------------------

@dataclass
class FitResult:
    """Fitted models of one series and how well each predicted measurements it did not see."""

    label: str
    measured: pd.DataFrame  # workers, nodes, throughput
    models: dict[str, ScalingModel]
    held_out_error: dict[str, float | None]  # mean relative error of leave-one-out predictions
    chosen: str

    def predict(self, workers: Sequence[float], nodes: Sequence[float], model: str | None = None,
                link: LinkModel | None = None) -> np.ndarray:
        return self.models[model or self.chosen].predict(workers, nodes, link)

    def disagreement(self, workers: Sequence[float], nodes: Sequence[float],
                     link: LinkModel | None = None) -> np.ndarray:
        """Largest relative gap between the chosen model and any other (0 with one model)."""
        pred = self.predict(workers, nodes, link=link)
        gaps = [np.abs(self.predict(workers, nodes, m, link) - pred) / pred for m in self.models if m != self.chosen]
        return np.nanmax(np.vstack(gaps), axis=0) if gaps else np.zeros(len(pred))


def extrapolation(workers: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """How far outside the measured worker counts: log2(N / most measured) above them,
    log2(fewest measured / N) below, 0 inside."""
    w = np.asarray(workers, dtype=float)
    lo, hi = float(np.min(measured)), float(np.max(measured))
    return np.log2(np.maximum(np.maximum(w / hi, lo / w), 1.0))


def fit_series(label: str, rows: pd.DataFrame, link: LinkModel | None = None) -> FitResult:
    """Fit every model to one series (columns workers, throughput, nodes optional) and pick one."""
    df = rows.copy()
    if "nodes" not in df.columns:
        df["nodes"] = 1
    df["nodes"] = pd.to_numeric(df["nodes"], errors="coerce").fillna(1)
    df = df[["workers", "nodes", "throughput"]].astype(float).reset_index(drop=True)
    if df["workers"].nunique() < 2:
        raise DataError(
            f"series {label or '(unlabelled)'!r} has measurements at {df['workers'].nunique()} worker "
            "count(s); a scaling model needs at least two different worker counts (three or more to "
            "check it on held-out data)"
        )
    models, mean_err = {}, {}
    for name, cls in MODELS.items():
        models[name] = _fitted(label, name, cls(link), df)
        errs = []
        if len(df) >= 3:
            for i in range(len(df)):
                train = df.drop(index=i)
                if train["workers"].nunique() < 2:
                    continue
                m = _fitted(label, name, cls(link), train)
                p = m.predict([df["workers"][i]], [df["nodes"][i]])[0]
                errs.append(abs(p - df["throughput"][i]) / df["throughput"][i] if np.isfinite(p) else 1.0)
        mean_err[name] = float(np.mean(errs)) if errs else None
    scored = [n for n in MODELS if mean_err[n] is not None]
    # Ties (within float noise) go to the model listed first: on one node the ps terms span the ring's.
    best = min((mean_err[n] for n in scored), default=None)
    chosen = next((n for n in scored if mean_err[n] <= best + 1e-9), "comm")  # comm: fewest terms without data
    return FitResult(label, df, models, mean_err, chosen)


def _fitted(label: str, name: str, model: ScalingModel, rows: pd.DataFrame) -> ScalingModel:
    """`model` fitted to `rows`; a fit that cannot be done names its series and model (FitError)."""
    try:
        return model.fit(rows["workers"], rows["nodes"], rows["throughput"])
    except FitError as exc:
        raise FitError(f"series {label or '(unlabelled)'!r} could not be fitted: the {name} model: {exc}") from None


def mixed_throughput(per_worker_throughput: Iterable[float], efficiency: float = 1.0) -> float:
    """Throughput of workers of different speeds in synchronous data parallelism with equal shares:
    every step waits for the slowest, so N·min(speed)·efficiency (seed 004: mixed GPUs are a
    high-cost, low-performance option for exactly this reason)."""
    speeds = list(per_worker_throughput)
    return len(speeds) * min(speeds) * efficiency if speeds else 0.0


def pareto_front(time: Sequence[float], dollars: Sequence[float]) -> np.ndarray:
    """Boolean mask of rows no other row beats on both time and dollars (ties kept once)."""
    t = np.asarray(time, dtype=float)
    d = np.asarray(dollars, dtype=float)
    mask = np.zeros(len(t), dtype=bool)
    best = math.inf
    for i in np.lexsort((d, t)):
        if not (np.isfinite(t[i]) and np.isfinite(d[i])):
            continue
        if d[i] < best - 1e-12:
            mask[i] = True
            best = d[i]
    return mask
