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

`plan(PlanRequest(...))` runs four steps, each a function of its own: `predict` (fit every series,
predict every worker count), `next_measurement`, `price` (candidates: layout x type x market) and
`recommend` (frontier, cheapest within the deadline, fastest within the budget).

Costing: for instance type T with g GPUs, N workers take ceil(N/g) instances; throughput on T is
the model's prediction times the per-GPU speed factor of T's GPU relative to the measured one
(1 for the same GPU; others must be given with --speed, nothing is guessed). Time = work /
throughput; dollars from costs.billing (per second, 60 s minimum, spot with interruptions).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from analysis.report import to_json_records
from core.errors import DataError
from costs.billing import Mix, run_cost
from costs.catalog import Catalog, CatalogError, InstanceType

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
    "PlanRequest",
    "Plan",
    "plan",
    "predict",
    "next_measurement",
    "price",
    "recommend",
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
class PlanRequest:
    """What to plan: the measurements, the worker counts to predict, and what to price them on.

    `measured` has label, workers, throughput, and optionally nodes and mode. `work` is the amount
    of work (in the throughput's unit, e.g. words) the job needs, to the loss threshold or in all;
    without it there are no times or dollars. `speed` maps a GPU model or instance type to its
    per-GPU speed relative to `measured_on`'s GPU. The spot terms go to costs.billing.run_cost;
    `deadline_h` and `budget_usd` decide which candidates are recommended.
    """

    measured: pd.DataFrame
    predict_workers: Sequence[int]
    catalog: Catalog | None = None
    instance_types: Sequence[str] = ()
    markets: Sequence[str] = ("on-demand",)
    work: float | None = None
    measured_on: str | None = None
    speed: dict[str, float] | None = None
    link: LinkModel | None = None
    interruptions_per_hour: float = 0.0
    checkpoint_interval_s: float = 600.0
    restart_s: float = 180.0
    deadline_h: float | None = None
    budget_usd: float | None = None
    region: str | None = None

    def base_instance(self) -> InstanceType | None:
        """The instance type the measurements were made on, when it is named and a catalog given."""
        return self.catalog.instance(self.measured_on) if (self.catalog and self.measured_on) else None

    def measured_link(self) -> LinkModel:
        """The link model of the measurements: between nodes, the measured instance's network
        when the catalog states it (the fit then calibrates against the link that was used)."""
        link = self.link or LinkModel()
        base = self.base_instance()
        return replace(link, inter_gbps=base.network_gbps) if base is not None and base.network_gbps else link

    def spot_terms(self) -> dict[str, float]:
        return dict(interruptions_per_hour=self.interruptions_per_hour,
                    checkpoint_interval_s=self.checkpoint_interval_s, restart_s=self.restart_s)


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

        return to_json_records(self.candidates if len(self.candidates) else self.predictions)


def plan(request: PlanRequest) -> Plan:
    """Fit and predict, choose the next measurement, price, recommend: the four steps in order."""
    fits, predictions = predict(request)
    nxt = next_measurement(predictions)
    _mark_next(predictions, nxt)
    candidates, notes = price(request, fits, predictions)
    recommendations, more_notes = recommend(candidates, request.deadline_h, request.budget_usd)
    if len(candidates):
        _mark_next(candidates, nxt)
    return Plan(fits, predictions, candidates, recommendations, nxt, notes + more_notes)


# ---- 1. fit and predict -------------------------------------------------------------------------


def predict(request: PlanRequest) -> tuple[dict[str, FitResult], pd.DataFrame]:
    """(fit per series, predictions): every series fitted on its own rows (in its one mode, else
    strong) and predicted at its measured and at the requested worker counts."""
    measured = request.measured
    if "label" not in measured.columns:
        measured = measured.assign(label="")
    if "mode" not in measured.columns:
        measured = measured.assign(mode="strong")
    link = request.measured_link()
    base = request.base_instance()
    wanted = {int(w) for w in request.predict_workers}
    fits: dict[str, FitResult] = {}
    rows: list[dict[str, Any]] = []
    for label, part in measured.groupby("label", sort=False):
        modes = set(part["mode"].fillna("strong"))
        fit = fit_series(str(label), part, modes.pop() if len(modes) == 1 else "strong", link)
        fits[str(label)] = fit
        rows += _prediction_rows(fit, wanted, base.gpus if base is not None else None)
    return fits, pd.DataFrame(rows)


def _prediction_rows(fit: FitResult, wanted: set[int], gpus_per_node: int | None) -> list[dict[str, Any]]:
    """One row per worker count (measured or wanted) of one series, with its interval."""
    grid = sorted(wanted | {int(w) for w in fit.measured["workers"]})
    nodes = [_measured_nodes(fit.measured, w, gpus_per_node) for w in grid]
    pred = fit.predict(grid, nodes)
    lo, hi = fit.interval(grid, nodes, pred)
    gap = fit.disagreement(grid, nodes)
    rows = []
    for i, w in enumerate(grid):
        meas = fit.measured[fit.measured["workers"] == w]["throughput"]
        rows.append({
            "label": fit.label, "workers": w, "nodes": nodes[i],
            "predicted_throughput": float(pred[i]), "interval_low": float(lo[i]), "interval_high": float(hi[i]),
            "model": fit.chosen, "held_out_error": fit.held_out_error[fit.chosen],
            "measured_throughput": float(meas.mean()) if len(meas) else None,
            "disagreement": float(gap[i]) if np.isfinite(gap[i]) else None,
            "predicted": w in wanted,
        })
    return rows


def _measured_nodes(measured: pd.DataFrame, workers: int, gpus_per_node: int | None) -> int:
    """Nodes for a worker count: as measured when it was; else packed onto nodes of the measured
    instance's GPU count; else one node (nothing says otherwise)."""
    same = measured[measured["workers"] == workers]
    if len(same):
        return int(same["nodes"].iloc[0])
    return math.ceil(workers / gpus_per_node) if gpus_per_node else 1


# ---- 2. the next measurement --------------------------------------------------------------------


def next_measurement(predictions: pd.DataFrame) -> dict[str, Any] | None:
    """The untried (series, workers) where the models disagree most, or None (query by committee:
    measuring it settles which model to trust)."""
    untried = predictions[predictions["measured_throughput"].isna()] if len(predictions) else predictions
    if not len(untried) or not untried["disagreement"].notna().any():
        return None
    r = untried.loc[untried["disagreement"].idxmax()]
    return {"label": r["label"], "workers": int(r["workers"]), "disagreement": float(r["disagreement"]),
            "why": f"the models disagree most there ({r['disagreement']:.0%} apart); measuring it "
                   "tells which one to trust"}


def _mark_next(rows: pd.DataFrame, nxt: dict[str, Any] | None) -> None:
    """Add the column next_measurement: true on the rows of the suggested (series, workers)."""
    rows["next_measurement"] = False
    if nxt is not None:
        rows.loc[(rows["label"] == nxt["label"]) & (rows["workers"] == nxt["workers"]), "next_measurement"] = True


# ---- 3. price -----------------------------------------------------------------------------------


def price(request: PlanRequest, fits: dict[str, FitResult],
          predictions: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(candidates, notes): every predicted (series, workers) on every instance type x market, with
    hours and dollars. Nothing is priced without `work`; a type whose per-GPU speed is unknown, or
    a market without a price, is left out with a note saying what to give."""
    notes: list[str] = []
    if request.instance_types and request.catalog is None:
        raise CatalogError("pricing candidates needs a price catalog")
    if request.instance_types and request.work is None:
        notes.append("no --work given: predicted throughput only; give the job's work (in the "
                     "throughput unit, e.g. words to the loss threshold) for hours and dollars")
        return pd.DataFrame(), notes
    rows: list[dict[str, Any]] = []
    for name in request.instance_types:
        rows += _price_type(request, name, fits, predictions, notes)
    return pd.DataFrame(rows), notes


def _price_type(request: PlanRequest, name: str, fits: dict[str, FitResult], predictions: pd.DataFrame,
                notes: list[str]) -> list[dict[str, Any]]:
    """Candidate rows of one instance type: the throughput predicted over its network, scaled by
    its GPU's speed, with ceil(workers / GPUs) instances."""
    inst = request.catalog.instance(name)
    base = request.base_instance()
    factor = _speed_factor(inst, base, request.speed or {})
    if factor is None:
        notes.append(f"{name}: its GPU ({inst.gpu_model or 'unknown'}) differs from the measured one "
                     f"({base.gpu_model if base else 'unknown: give --measured-on'}); "
                     f"give --speed {inst.gpu_model or name}=FACTOR to price it")
        return []
    link = request.measured_link()
    link = replace(link, inter_gbps=inst.network_gbps or link.inter_gbps)
    rows: list[dict[str, Any]] = []
    for label, fit in fits.items():
        for _, pr in predictions[predictions["label"] == label].iterrows():
            w = int(pr["workers"])
            count = math.ceil(w / inst.gpus)
            thr = float(fit.predict([w], [count], link=link)[0]) * factor
            lo, hi = fit.interval([w], [count], np.array([thr]), link=link)
            layout = {"label": label, "workers": w, "instance_type": name, "instances": count,
                      "idle_gpus": count * inst.gpus - w}
            estimate = {"predicted_throughput": thr, "interval_low": float(lo[0]), "interval_high": float(hi[0]),
                        "model": fit.chosen, "held_out_error": fit.held_out_error[fit.chosen],
                        "measured": bool(pd.notna(pr["measured_throughput"])) and request.measured_on in (None, name)}
            rows += _market_rows(request, layout, estimate, notes)
    return rows


def _market_rows(request: PlanRequest, layout: dict[str, Any], estimate: dict[str, Any],
                 notes: list[str]) -> list[dict[str, Any]]:
    """One candidate row per market: hours and dollars at the predicted throughput, and at the low
    end of its interval (hours_high, dollars_high)."""
    mix = Mix(((layout["instances"], layout["instance_type"]),))
    slowest = max(estimate["interval_low"], 1e-300)
    rows = []
    for market in request.markets:
        try:
            cost = run_cost(request.work / estimate["predicted_throughput"], mix, request.catalog, market,
                            request.region, label=layout["label"], **request.spot_terms())
            slow = run_cost(request.work / slowest, mix, request.catalog, market, request.region,
                            **request.spot_terms())
        except CatalogError as exc:
            if str(exc) not in notes:
                notes.append(str(exc))
            continue
        rows.append({**layout, "market": market, **estimate,
                     "hours": cost.hours, "hours_high": slow.hours, "usd_per_hour": cost.usd_per_hour,
                     "dollars": cost.dollars, "dollars_high": slow.dollars,
                     "expected_interruptions": cost.expected_interruptions})
    return rows


def _speed_factor(inst: InstanceType, base: InstanceType | None, speed: dict[str, float]) -> float | None:
    """Per-GPU speed of `inst` relative to the measured instance: as given, 1 for the same GPU (or
    an on-premise rate), else None (unknown: not guessed)."""
    for key in (inst.name, inst.gpu_model):
        if key and key in speed:
            return float(speed[key])
    if base is None or inst.name == base.name or (inst.gpu_model and inst.gpu_model == base.gpu_model):
        return 1.0
    if inst.provider == "rate":
        return 1.0
    return None


# ---- 4. recommend -------------------------------------------------------------------------------


def recommend(candidates: pd.DataFrame, deadline_h: float | None,
              budget_usd: float | None) -> tuple[dict[str, dict[str, Any] | None], list[str]]:
    """(recommendations, notes): the cheapest candidate within the deadline and the fastest within
    the budget, or without either the cheapest and the fastest overall. Adds the columns pareto
    (on the cost-time frontier) and recommendation (why a row is recommended) to `candidates`."""
    recs: dict[str, dict[str, Any] | None] = {}
    notes: list[str] = []
    if not len(candidates):
        return recs, notes
    candidates["pareto"] = pareto_front(candidates["hours"], candidates["dollars"])
    candidates["recommendation"] = None
    limits = (  # (recommendation, column, its limit, best by, why there is none)
        ("cheapest_within_deadline", "hours", deadline_h, "dollars", lambda: f"no layout finishes within "
         f"{deadline_h:g} h; the fastest takes {candidates['hours'].min():.2f} h"),
        ("fastest_within_budget", "dollars", budget_usd, "hours", lambda: f"no layout costs at most "
         f"${budget_usd:,.2f}; the cheapest costs ${candidates['dollars'].min():,.2f}"),
    )
    for key, column, limit, by, why_none in limits:
        if limit is not None:
            recs[key] = _pick(candidates, candidates[candidates[column] <= limit], by, key.replace("_", " "))
            if recs[key] is None:
                notes.append(why_none())
    if deadline_h is None and budget_usd is None:
        recs["cheapest"] = _pick(candidates, candidates, "dollars", "cheapest")
        recs["fastest"] = _pick(candidates, candidates, "hours", "fastest")
    return recs, notes


def _pick(all_rows: pd.DataFrame, ok: pd.DataFrame, by: str, tag: str) -> dict[str, Any] | None:
    """The best row of `ok` by `by` (ties: the other measure), tagged in `all_rows`; None if none."""
    if ok.empty:
        return None
    other = "hours" if by == "dollars" else "dollars"
    idx = ok.sort_values([by, other], kind="stable").index[0]
    prev = all_rows.at[idx, "recommendation"]
    all_rows.at[idx, "recommendation"] = tag if prev is None else f"{prev}; {tag}"

    return to_json_records(all_rows.loc[[idx]].drop(columns=["recommendation"]))[0]
