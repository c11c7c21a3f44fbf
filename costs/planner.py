"""Predict untried layouts from a few measured ones, price them, and say which to buy.

Two scaling models are fitted per series to the time per unit of work y(N) = 1 / throughput(N)
of N workers, each by non-negative least squares (so every term means a cost, never a gain):

- **ernest** (Venkataraman et al., NSDI 2016): y = θ0 + θ1/N + θ2·log N + θ3·N
  (serial part, parallel part, tree-shaped aggregation, per-worker overhead).
- **comm** (ring all-reduce): y = θ0 + θ1/N + θ2·x(N), with x(N) = s(N)·t_ring(N),
  t_ring(N) = 2(N−1)·α + 2·((N−1)/N)·bytes/B(N). B(N) is the link bandwidth of the layout
  (inside one node, or the instance network between nodes), s(N) = 1 in strong scaling (a fixed
  number of steps per unit of work) and 1/N in weak scaling (each step does N times the work).
  θ2 calibrates the effective bandwidth; with the true gradient size it reads as steps per unit.

Rows are weighted by 1/y so that every measurement's relative error counts the same. The model
with the lowest leave-one-out (held-out) mean relative error on throughput is chosen and that
error is reported; the prediction interval is ± the largest held-out error, widened by
1 + log2(distance) outside the measured range (extrapolation is less certain than interpolation).
The next measurement suggested is the untried worker count where the two models disagree most
(query by committee): measuring it settles the question that matters.

Costing: for instance type T with g GPUs, N workers take ceil(N/g) instances; throughput on T is
the model's prediction times the per-GPU speed factor of T's GPU relative to the measured one
(1 for the same GPU; others must be given with --speed, nothing is guessed). Time = work /
throughput; dollars from costs.billing (per second, 60 s minimum, spot with interruptions).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from core.errors import DataError
from costs.billing import Mix, run_cost
from costs.catalog import Catalog, CatalogError

__all__ = [
    "nnls",
    "LinkModel",
    "ScalingModel",
    "ErnestModel",
    "CommModel",
    "ring_allreduce_s",
    "FitResult",
    "fit_series",
    "mixed_throughput",
    "pareto_front",
    "Plan",
    "plan",
]


# ---- numerics -------------------------------------------------------------------------------


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares min ||a x − b||, x >= 0, for a few columns.

    Why enumeration: with ≤ 5 terms there are ≤ 32 supports; the optimum is the unconstrained
    least-squares solution on its support, so the best feasible one over all supports is the
    answer. No scipy needed, and no iteration limits to tune.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    p = a.shape[1]
    best, best_r = np.zeros(p), float(np.sum(b**2))
    for k in range(1, p + 1):
        for support in itertools.combinations(range(p), k):
            cols = list(support)
            x_s, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_s < -1e-12):
                continue
            x = np.zeros(p)
            x[cols] = np.maximum(x_s, 0.0)
            r = float(np.sum((a @ x - b) ** 2))
            if r < best_r - 1e-15 * max(1.0, best_r):
                best, best_r = x, r
    return best


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


class ScalingModel:
    """y(N) = features(N) · θ with θ >= 0, fitted on time per unit work."""

    name = "base"

    def __init__(self, mode: str = "strong", link: LinkModel | None = None) -> None:
        self.mode = mode
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

    def features(self, workers, nodes, link=None):
        w = np.asarray(workers, dtype=float)
        ring = ring_allreduce_s(w, nodes, link or self.link)
        scale = 1.0 / w if self.mode == "weak" else np.ones_like(w)
        return np.column_stack([np.ones_like(w), 1.0 / w, ring * scale])


MODELS: dict[str, type[ScalingModel]] = {"ernest": ErnestModel, "comm": CommModel}


# ---- fitting ----------------------------------------------------------------------------------


@dataclass
class FitResult:
    """Fitted models of one series and how well each predicted measurements it did not see."""

    label: str
    mode: str
    measured: pd.DataFrame  # workers, nodes, throughput
    models: dict[str, ScalingModel]
    held_out_error: dict[str, float | None]  # mean relative error of leave-one-out predictions
    max_held_out_error: dict[str, float | None]
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

    def interval(self, workers: Sequence[float], nodes: Sequence[float], pred: np.ndarray,
                 link: LinkModel | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of the prediction: ± the larger of the largest held-out error and the
        models' disagreement there, widened by 1 + log2(distance) outside the measured range."""
        err = self.max_held_out_error.get(self.chosen)
        err = 0.25 if err is None else err  # nothing held out: admit a wide band
        w = np.asarray(workers, dtype=float)
        gap = np.nan_to_num(self.disagreement(w, nodes, link), nan=0.25)
        lo_w, hi_w = float(self.measured["workers"].min()), float(self.measured["workers"].max())
        dist = np.where(w > hi_w, w / hi_w, np.where(w < lo_w, lo_w / w, 1.0))
        e = np.maximum(np.maximum(err, gap), 0.01) * (1.0 + np.log2(dist))
        return pred * np.maximum(1.0 - e, 0.0), pred * (1.0 + e)


def fit_series(label: str, rows: pd.DataFrame, mode: str = "strong",
               link: LinkModel | None = None) -> FitResult:
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
    models, mean_err, max_err = {}, {}, {}
    for name, cls in MODELS.items():
        models[name] = cls(mode, link).fit(df["workers"], df["nodes"], df["throughput"])
        errs = []
        if len(df) >= 3:
            for i in range(len(df)):
                train = df.drop(index=i)
                if train["workers"].nunique() < 2:
                    continue
                m = cls(mode, link).fit(train["workers"], train["nodes"], train["throughput"])
                p = m.predict([df["workers"][i]], [df["nodes"][i]])[0]
                errs.append(abs(p - df["throughput"][i]) / df["throughput"][i] if np.isfinite(p) else 1.0)
        mean_err[name] = float(np.mean(errs)) if errs else None
        max_err[name] = float(np.max(errs)) if errs else None
    scored = [n for n in MODELS if mean_err[n] is not None]
    chosen = min(scored, key=lambda n: mean_err[n]) if scored else "comm"  # fewest terms without data
    return FitResult(label, mode, df, models, mean_err, max_err, chosen)


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


# ---- the plan -----------------------------------------------------------------------------------


@dataclass
class Plan:
    """Predictions per (series, workers), priced candidates, frontier, recommendations."""

    fits: dict[str, FitResult]
    predictions: pd.DataFrame
    candidates: pd.DataFrame
    recommendations: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    next_measurement: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per row for --format json: candidates when priced, else predictions."""
        from analysis.report import to_json_records

        return to_json_records(self.candidates if len(self.candidates) else self.predictions)


def plan(
    measured: pd.DataFrame,
    predict_workers: Sequence[int],
    catalog: Catalog | None = None,
    instance_types: Sequence[str] = (),
    markets: Sequence[str] = ("on-demand",),
    work: float | None = None,
    measured_on: str | None = None,
    speed: dict[str, float] | None = None,
    link: LinkModel | None = None,
    interruptions_per_hour: float = 0.0,
    checkpoint_interval_s: float = 600.0,
    restart_s: float = 180.0,
    deadline_h: float | None = None,
    budget_usd: float | None = None,
    region: str | None = None,
) -> Plan:
    """Fit per series, predict `predict_workers`, price them on `instance_types` x `markets`.

    `measured` has label, workers, throughput, and optionally nodes and mode. `work` is the amount
    of work (in the throughput's unit, e.g. words) the job needs, to the loss threshold or in all;
    without it there are no times or dollars. `speed` maps a GPU model or instance type to its
    per-GPU speed relative to `measured_on`'s GPU.
    """
    speed = dict(speed or {})
    link = link or LinkModel()
    notes: list[str] = []
    if "label" not in measured.columns:
        measured = measured.assign(label="")
    if "mode" not in measured.columns:
        measured = measured.assign(mode="strong")
    base_inst = catalog.instance(measured_on) if (catalog and measured_on) else None
    if base_inst is not None and base_inst.network_gbps:
        link = LinkModel(link.gradient_bytes, link.intra_gbps, base_inst.network_gbps,
                         link.intra_latency_s, link.inter_latency_s)

    fits: dict[str, FitResult] = {}
    pred_rows: list[dict[str, Any]] = []
    for label, part in measured.groupby("label", sort=False):
        modes = set(part["mode"].fillna("strong"))
        mode = modes.pop() if len(modes) == 1 else "strong"
        fit = fit_series(str(label), part, mode, link)
        fits[str(label)] = fit
        grid = sorted(set(int(w) for w in predict_workers) | set(int(w) for w in fit.measured["workers"]))
        gpn = base_inst.gpus if base_inst is not None else None
        nodes = [_measured_nodes(fit.measured, w, gpn) for w in grid]
        pred = fit.predict(grid, nodes)
        lo, hi = fit.interval(grid, nodes, pred)
        gap = fit.disagreement(grid, nodes)
        for i, w in enumerate(grid):
            meas = fit.measured[fit.measured["workers"] == w]["throughput"]
            pred_rows.append({
                "label": str(label), "workers": w, "nodes": nodes[i],
                "predicted_throughput": float(pred[i]), "interval_low": float(lo[i]), "interval_high": float(hi[i]),
                "model": fit.chosen, "held_out_error": fit.held_out_error[fit.chosen],
                "measured_throughput": float(meas.mean()) if len(meas) else None,
                "disagreement": float(gap[i]) if np.isfinite(gap[i]) else None,
                "predicted": w in set(int(x) for x in predict_workers),
            })
    predictions = pd.DataFrame(pred_rows)

    nxt = None
    untried = predictions[predictions["measured_throughput"].isna()] if len(predictions) else predictions
    if len(untried) and untried["disagreement"].notna().any():
        r = untried.loc[untried["disagreement"].idxmax()]
        nxt = {"label": r["label"], "workers": int(r["workers"]), "disagreement": float(r["disagreement"]),
               "why": f"the models disagree most there ({r['disagreement']:.0%} apart); measuring it "
                      "tells which one to trust"}
    predictions["next_measurement"] = False
    if nxt is not None:
        predictions.loc[(predictions["label"] == nxt["label"]) & (predictions["workers"] == nxt["workers"]),
                        "next_measurement"] = True

    cand_rows: list[dict[str, Any]] = []
    if instance_types and catalog is None:
        raise CatalogError("pricing candidates needs a price catalog")
    if instance_types and work is None:
        notes.append("no --work given: predicted throughput only; give the job's work (in the "
                     "throughput unit, e.g. words to the loss threshold) for hours and dollars")
    elif instance_types:
        for t in instance_types:
            inst = catalog.instance(t)
            factor = _speed_factor(inst, base_inst, speed)
            if factor is None:
                notes.append(f"{t}: its GPU ({inst.gpu_model or 'unknown'}) differs from the measured one "
                             f"({base_inst.gpu_model if base_inst else 'unknown: give --measured-on'}); "
                             f"give --speed {inst.gpu_model or t}=FACTOR to price it")
                continue
            t_link = LinkModel(link.gradient_bytes, link.intra_gbps, inst.network_gbps or link.inter_gbps,
                               link.intra_latency_s, link.inter_latency_s)
            for label, fit in fits.items():
                sel = predictions[(predictions["label"] == label)]
                for _, pr in sel.iterrows():
                    w = int(pr["workers"])
                    count = math.ceil(w / inst.gpus)
                    thr = float(fit.predict([w], [count], link=t_link)[0]) * factor
                    lo, hi = fit.interval([w], [count], np.array([thr]), link=t_link)
                    for market in markets:
                        try:
                            cost = run_cost(work / thr, Mix(((count, t),)), catalog, market, region,
                                            label=label, interruptions_per_hour=interruptions_per_hour,
                                            checkpoint_interval_s=checkpoint_interval_s, restart_s=restart_s)
                            slow = run_cost(work / max(float(lo[0]), 1e-300), Mix(((count, t),)), catalog, market,
                                            region, interruptions_per_hour=interruptions_per_hour,
                                            checkpoint_interval_s=checkpoint_interval_s, restart_s=restart_s)
                        except CatalogError as exc:
                            if str(exc) not in notes:
                                notes.append(str(exc))
                            continue
                        cand_rows.append({
                            "label": label, "workers": w, "instance_type": t, "instances": count,
                            "idle_gpus": count * inst.gpus - w, "market": market,
                            "predicted_throughput": thr, "interval_low": float(lo[0]), "interval_high": float(hi[0]),
                            "model": fit.chosen, "held_out_error": fit.held_out_error[fit.chosen],
                            "measured": bool(pd.notna(pr["measured_throughput"]))
                            and (measured_on is None or measured_on == t),
                            "hours": cost.hours, "hours_high": slow.hours, "usd_per_hour": cost.usd_per_hour,
                            "dollars": cost.dollars, "dollars_high": slow.dollars,
                            "expected_interruptions": cost.expected_interruptions,
                        })
    candidates = pd.DataFrame(cand_rows)
    recs: dict[str, dict[str, Any] | None] = {}
    if len(candidates):
        candidates["pareto"] = pareto_front(candidates["hours"], candidates["dollars"])
        candidates["recommendation"] = None
        if deadline_h is not None:
            ok = candidates[candidates["hours"] <= deadline_h]
            recs["cheapest_within_deadline"] = _pick(candidates, ok, "dollars", "cheapest within deadline")
            if recs["cheapest_within_deadline"] is None:
                notes.append(f"no layout finishes within {deadline_h:g} h; the fastest takes "
                             f"{candidates['hours'].min():.2f} h")
        if budget_usd is not None:
            ok = candidates[candidates["dollars"] <= budget_usd]
            recs["fastest_within_budget"] = _pick(candidates, ok, "hours", "fastest within budget")
            if recs["fastest_within_budget"] is None:
                notes.append(f"no layout costs at most ${budget_usd:,.2f}; the cheapest costs "
                             f"${candidates['dollars'].min():,.2f}")
        if deadline_h is None and budget_usd is None:
            recs["cheapest"] = _pick(candidates, candidates, "dollars", "cheapest")
            recs["fastest"] = _pick(candidates, candidates, "hours", "fastest")
        candidates["next_measurement"] = False
        if nxt is not None:
            candidates.loc[(candidates["label"] == nxt["label"]) & (candidates["workers"] == nxt["workers"]),
                           "next_measurement"] = True
    return Plan(fits, predictions, candidates, recs, nxt, notes)


def _pick(all_rows: pd.DataFrame, ok: pd.DataFrame, by: str, tag: str) -> dict[str, Any] | None:
    if ok.empty:
        return None
    other = "hours" if by == "dollars" else "dollars"
    idx = ok.sort_values([by, other], kind="stable").index[0]
    prev = all_rows.at[idx, "recommendation"]
    all_rows.at[idx, "recommendation"] = tag if prev is None else f"{prev}; {tag}"
    from analysis.report import to_json_records

    return to_json_records(all_rows.loc[[idx]].drop(columns=["recommendation"]))[0]


def _measured_nodes(measured: pd.DataFrame, workers: int, gpus_per_node: int | None) -> int:
    """Nodes for a worker count: as measured when it was; else packed onto nodes of the measured
    instance's GPU count; else one node (nothing says otherwise)."""
    same = measured[measured["workers"] == workers]
    if len(same):
        return int(same["nodes"].iloc[0])
    return math.ceil(workers / gpus_per_node) if gpus_per_node else 1


def _speed_factor(inst: Any, base: Any, speed: dict[str, float]) -> float | None:
    for key in (inst.name, inst.gpu_model):
        if key and key in speed:
            return float(speed[key])
    if base is None or inst.name == base.name or (inst.gpu_model and inst.gpu_model == base.gpu_model):
        return 1.0
    if inst.provider == "rate":
        return 1.0
    return None
