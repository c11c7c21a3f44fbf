"""How far to trust a throughput prediction beyond the measured GPU counts: models chosen and bands
calibrated on published scaling tables, one whole table left out at a time, bounded by physics.

An extrapolation task is what the planner is asked to do: a series measured at GPU counts
c1 < ... < cn is fitted on its first k counts and predicts the others. Every shipped table is a set
of such series (`reference_tables`): the seeds' tables in scalelab/costs/data and the published
corpus in scalelab/costs/data/corpus (SOURCES.csv names each source).

**Candidate models** of the throughput T(N) from the fitted counts (`candidate_predictions`), each
working on the per-GPU rate p(N) = T(N)/N:

- **naive**: the last measured per-GPU rate carried forward, p(N) = p(ck);
- **decay** and **half-decay**: the per-GPU rate keeps losing, per doubling of the GPUs, what it
  lost per doubling between the last two fitted counts (half of that for half-decay): p(N) =
  p(ck) · exp(λ · g · log2(N/ck)), g = log(p(ck)/p(ck−1)) / log2(ck/ck−1) clipped at 0 (a gain is
  not extrapolated), λ = 1 or 1/2;
- **ernest**, **comm**, **ps**: the NNLS models of scalelab/costs/fitting.py.

Which one a plan uses is chosen by held-out error: the lowest mean |log(pred/true)| over every
task of the tables (each table weighted equally), separately for fits on two counts and on three
or more. To measure it honestly a table is never judged with a choice or a band made with it.

**The band** is in log space and grows with the distance d = log2(N/ck) past the fitted counts and
with how far from linear the fitted counts scale (r, the |log| of the per-GPU rate lost per doubling
across them): log(true/pred) lies in [lo, hi] · (d + δ) · (r + 0.05), δ = 0.5 (a measured point is
off by its noise). lo and hi are conformal over the tables (tables are not interchangeable draws):
each table's own (1 − c') and c' quantiles of log(true/pred) / ((d + δ)(r + 0.05)), c' = 1 − (1 − c)/2,
then the ⌈(n+1)·c⌉-th widest of the n tables'. Log space keeps every band finite and positive, with
two counts too. Then **physics** clips both the prediction and the band: never above linear scaling
from the best measured per-GPU rate (N · max p; data that scales super-linearly raises that rate
itself), never below what the fewest measured GPUs already deliver (for more GPUs than those).

`coverage` judges the whole procedure: every table predicted with the model and band chosen
without it (`launch bench --only planner`; docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import as_file, files
from typing import Sequence

import numpy as np
import pandas as pd

from scalelab.core.errors import DataError
from scalelab.costs.fitting import MODELS, LinkModel, extrapolation, fit_series
from scalelab.costs.tables import read_scaling_csv, with_throughput

__all__ = ["SEED_TABLES", "DEFAULT_CONFIDENCE", "CANDIDATES", "DELTA", "reference_tables", "reference_series",
           "candidate_predictions", "physical_bounds", "all_tasks", "Calibration", "calibrate", "conformal_quantile",
           "predict_band", "next_count", "coverage", "coverage_summary", "k_class"]

#: The seeds' scaling tables shipped in scalelab/costs/data (costs.tables' scaling format).
SEED_TABLES = ("seed001_nmt_scaling.csv", "seed004_sentiment_scaling.csv", "seed004_emr_preprocessing.csv")
CORPUS_PACKAGE = "scalelab.costs.data.corpus"
DEFAULT_CONFIDENCE = 0.9
CANDIDATES = ("naive", "decay", "half-decay", *MODELS)
DELTA = 0.5  # the band's width at a measured count, in doublings
LOSS_FLOOR = 0.05  # the band's width factor of a series that loses nothing per doubling


def k_class(k: int) -> str:
    """The class of a fit by its fitted counts: "2" or "3+" (calibrated apart: two counts say little)."""
    return "2" if k <= 2 else "3+"


# ---- the tables -----------------------------------------------------------------------------------


def _read(package: str, name: str) -> dict[str, pd.DataFrame]:
    with as_file(files(package) / name) as path:
        table = with_throughput(read_scaling_csv(path))
    if "nodes" not in table.columns:
        table["nodes"] = 1
    table["nodes"] = pd.to_numeric(table["nodes"], errors="coerce").fillna(1)
    return {str(label): part[["workers", "nodes", "throughput"]].astype(float).reset_index(drop=True)
            for label, part in table.groupby("label", sort=False)}


@lru_cache(maxsize=1)
def reference_tables() -> dict[str, dict[str, pd.DataFrame]]:
    """Every shipped scaling table (seeds and corpus) -> its series (workers, nodes, throughput)."""
    out = {name: _read("scalelab.costs.data", name) for name in SEED_TABLES}
    corpus = sorted(p.name for p in files(CORPUS_PACKAGE).iterdir() if p.name.endswith(".csv") and p.name != "SOURCES.csv")
    out |= {name[:-4]: _read(CORPUS_PACKAGE, name) for name in corpus}
    return out


def reference_series() -> dict[str, pd.DataFrame]:
    """Every series of the shipped tables, by "table: label"."""
    return {f"{t}: {label}": rows for t, series in reference_tables().items() for label, rows in series.items()}


# ---- models and bounds --------------------------------------------------------------------------------


def _per_gpu(fitted: pd.DataFrame) -> pd.Series:
    """Best measured per-GPU rate at each fitted count, by count."""
    return (fitted["throughput"] / fitted["workers"]).groupby(fitted["workers"]).max().sort_index()


def _interpolated(rate: pd.Series, w: np.ndarray) -> np.ndarray:
    """Per-GPU rate inside (and below) the fitted counts: log-linear in log2 N between them."""
    return np.exp(np.interp(np.log2(w), np.log2(rate.index.to_numpy(float)), np.log(rate.to_numpy(float))))


def candidate_predictions(fitted: pd.DataFrame, workers: Sequence[float], nodes: Sequence[float] | None = None,
                          link: LinkModel | None = None) -> dict[str, np.ndarray]:
    """Throughput at `workers` from each candidate model (module doc) fitted on `fitted` (two or
    more GPU counts), before the physical bounds. At or below the most fitted count every model
    but the NNLS ones interpolates the measured per-GPU rates."""
    w = np.asarray(workers, dtype=float)
    nd = np.ones_like(w) if nodes is None else np.asarray(nodes, dtype=float)
    rate = _per_gpu(fitted)
    ck, last = float(rate.index[-1]), float(rate.iloc[-1])
    d = np.log2(np.maximum(w / ck, 1.0))
    g = min(0.0, math.log(last / rate.iloc[-2]) / math.log2(ck / rate.index[-2]))
    inside = _interpolated(rate, w)
    out = {"naive": np.where(w > ck, w * last, w * inside)}
    for name, lam in (("decay", 1.0), ("half-decay", 0.5)):
        out[name] = np.where(w > ck, w * last * np.exp(lam * g * d), w * inside)
    fit = fit_series("", fitted, link)
    for name in MODELS:
        out[name] = np.nan_to_num(fit.predict(w, nd, name, link), nan=0.0)
    return out


def loss_per_doubling(fitted: pd.DataFrame) -> float:
    """|log| of the per-GPU rate lost (or gained) per doubling of the GPUs across the fitted counts:
    a series far from linear scaling can bend either way beyond them, one close to it barely."""
    rate = _per_gpu(fitted)
    return abs(math.log(rate.iloc[-1] / rate.iloc[0])) / math.log2(rate.index[-1] / rate.index[0])


def band_spread(fitted: pd.DataFrame, workers: Sequence[float]) -> np.ndarray:
    """The band's shape at `workers`: (d + δ) · (loss per doubling + floor), d the doublings past the
    fitted counts; a band is its quantiles times this."""
    d = extrapolation(np.asarray(workers, dtype=float), fitted["workers"])
    return (d + DELTA) * (loss_per_doubling(fitted) + LOSS_FLOOR)


def physical_bounds(fitted: pd.DataFrame, workers: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(floor, ceiling) of the throughput at `workers` GPUs of the measured kind: the ceiling is
    linear scaling from the best measured per-GPU rate, the floor what the fewest measured GPUs
    deliver (for at least that many GPUs; zero below)."""
    w = np.asarray(workers, dtype=float)
    rate = _per_gpu(fitted)
    c1 = float(rate.index[0])
    fewest = float(fitted.loc[fitted["workers"] == c1, "throughput"].max())
    return np.where(w >= c1, fewest, 0.0), w * float(rate.max())


# ---- tasks --------------------------------------------------------------------------------------------


def _series_tasks(table: str, label: str, rows: pd.DataFrame) -> list[dict]:
    """Every extrapolation task of one series: fit its first k counts (k = 2 .. n−1), predict the rest."""
    counts = sorted({int(w) for w in rows["workers"]})
    out = []
    for k in range(2, len(counts)):
        fitted = rows[rows["workers"] <= counts[k - 1]]
        test = rows[rows["workers"] > counts[k - 1]]
        preds = candidate_predictions(fitted, test["workers"], test["nodes"])
        floor, ceiling = physical_bounds(fitted, test["workers"])
        spread = band_spread(fitted, test["workers"])
        for i, (_, r) in enumerate(test.iterrows()):
            task = {"table": table, "series": label, "fit_counts": k, "workers": int(r["workers"]),
                    "distance": math.log2(r["workers"] / counts[k - 1]), "true": float(r["throughput"]),
                    "spread": float(spread[i]),
                    "floor": float(floor[i]), "ceiling": float(ceiling[i])}
            out.append(task | {f"pred_{m}": float(np.clip(p[i], floor[i], ceiling[i])) for m, p in preds.items()})
    return out


@lru_cache(maxsize=1)
def all_tasks() -> pd.DataFrame:
    """Every extrapolation task of every shipped table, with each candidate's bounded prediction."""
    rows = [t for table, series in reference_tables().items() for label, part in series.items()
            for t in _series_tasks(table, label, part)]
    df = pd.DataFrame(rows)
    return df.assign(k_class=df["fit_counts"].map(k_class))


# ---- calibration ----------------------------------------------------------------------------------------


def conformal_quantile(values: Sequence[float], confidence: float) -> float:
    """The ⌈(n+1)·c⌉-th smallest of n scores (split conformal); inf when n is too small for c."""
    if not 0 < confidence < 1:
        raise DataError(f"a confidence level is between 0 and 1 (e.g. 0.9), got {confidence}")
    s = np.sort(np.asarray(values, dtype=float))
    rank = math.ceil((len(s) + 1) * confidence)
    return float(s[rank - 1]) if rank <= len(s) else math.inf


@dataclass(frozen=True)
class Calibration:
    """For one class of fits ("2" or "3+"): the model chosen by held-out error, its mean held-out
    |log error| per model, and the band's quantiles of log(true/pred)/(d + δ)."""

    k_class: str
    model: str
    errors: dict[str, float]
    lo: float
    hi: float
    tables: int


def _mean_error(part: pd.DataFrame, model: str) -> float:
    """Mean |log(pred/true)| of `model` over the tasks of each table, averaged over the tables."""
    return float(np.mean([np.mean(np.abs(np.log(g[f"pred_{model}"] / g["true"]))) for _, g in part.groupby("table")]))


@lru_cache(maxsize=64)
def calibrate(confidence: float = DEFAULT_CONFIDENCE, exclude: str | None = None) -> dict[str, Calibration]:
    """Per class of fits: the model with the lowest held-out error and its band, from every table's
    tasks but `exclude`'s. Tables are not interchangeable draws (one bends where others do not), so
    the band is conformal over tables: each table's own c' quantiles of the scores, c' = 1 − (1 − c)/2
    each side, then the ⌈(n+1)·c⌉-th widest of the n tables' (the band holds on a share c of the
    tables, not on average over them)."""
    tasks = all_tasks()
    tasks = tasks[tasks["table"] != exclude]
    level = 1.0 - (1.0 - confidence) / 2
    out = {}
    for cls, part in tasks.groupby("k_class"):
        errs = {m: _mean_error(part, m) for m in CANDIDATES}
        model = min(CANDIDATES, key=lambda m: (errs[m], CANDIDATES.index(m)))
        his, los = [], []
        for _, g in part.groupby("table"):
            score = (np.log(g["true"] / g[f"pred_{model}"]) / g["spread"]).to_numpy(float)
            his.append(max(0.0, float(np.quantile(score, level))))
            los.append(min(0.0, float(np.quantile(score, 1 - level))))
        n = len(his)
        rank = min(n, math.ceil((n + 1) * confidence))
        out[str(cls)] = Calibration(str(cls), model, errs, sorted(los)[n - rank], sorted(his)[rank - 1], n)
    return out


def predict_band(fitted: pd.DataFrame, workers: Sequence[float], nodes: Sequence[float] | None = None,
                 confidence: float = DEFAULT_CONFIDENCE, link: LinkModel | None = None,
                 exclude: str | None = None) -> pd.DataFrame:
    """Throughput at `workers` from `fitted` (rows of two or more GPU counts): columns predicted,
    low, high (the band at `confidence`, finite and physically bounded), model, floor, ceiling."""
    fitted = fitted.assign(nodes=fitted["nodes"] if "nodes" in fitted.columns else 1)[["workers", "nodes", "throughput"]]
    fitted = fitted.astype(float)
    k = fitted["workers"].nunique()
    if k < 2:
        raise DataError(f"a scaling prediction needs measurements at two or more GPU counts, got {k}")
    cal = calibrate(confidence, exclude)[k_class(k)]
    w = np.asarray(workers, dtype=float)
    pred = candidate_predictions(fitted, w, nodes, link)[cal.model]
    floor, ceiling = physical_bounds(fitted, w)
    pred = np.clip(pred, floor, ceiling)
    spread = band_spread(fitted, w)
    low = np.clip(pred * np.exp(np.minimum(cal.lo, 0.0) * spread), floor, ceiling)
    high = np.clip(pred * np.exp(np.maximum(cal.hi, 0.0) * spread), floor, ceiling)
    return pd.DataFrame({"workers": w, "predicted": pred, "low": np.minimum(low, pred),
                         "high": np.maximum(high, pred), "model": cal.model, "floor": floor, "ceiling": ceiling})


def next_count(fitted: pd.DataFrame, wanted: Sequence[float]) -> int | None:
    """With two measured counts, the third to measure: the doubling of the most measured count (or
    the largest wanted count below it), which shows whether efficiency keeps decaying; None with
    three or more counts or nothing wanted above them."""
    counts = sorted({int(w) for w in fitted["workers"]})
    above = sorted(int(w) for w in wanted if w > counts[-1])
    if len(counts) >= 3 or not above:
        return None
    return min(above, key=lambda w: abs(math.log2(w / (2 * counts[-1]))))


# ---- judging the procedure ----------------------------------------------------------------------------


def coverage(confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Every task of every table, predicted with the model and band calibrated without that table:
    table, series, fit_counts, workers, model, error ((pred − true)/true), naive_error, half_width
    ((high − low)/2/pred), finite and covered."""
    tasks = all_tasks()
    parts = []
    for table, part in tasks.groupby("table", sort=False):
        cal = calibrate(confidence, table)
        rows = []
        for _, t in part.iterrows():
            c = cal[t["k_class"]]
            pred = t[f"pred_{c.model}"]
            s = t["spread"]
            low = min(max(pred * math.exp(min(c.lo, 0.0) * s), t["floor"]), pred)
            high = max(min(pred * math.exp(max(c.hi, 0.0) * s), t["ceiling"]), pred)
            rows.append({"table": table, "series": t["series"], "fit_counts": t["fit_counts"], "k_class": t["k_class"],
                         "workers": t["workers"], "model": c.model, "error": pred / t["true"] - 1,
                         "naive_error": t["pred_naive"] / t["true"] - 1, "half_width": (high - low) / 2 / pred,
                         "finite": bool(math.isfinite(high)), "covered": bool(low <= t["true"] * (1 + 1e-9)
                                                                               and t["true"] <= high * (1 + 1e-9))})
        parts.append(pd.DataFrame(rows))
    return pd.concat(parts, ignore_index=True)


def coverage_summary(predictions: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Predictions, coverage, median half-width, mean absolute error and the naive rule's, of
    `coverage`'s rows, overall or per group of `by`."""
    def one(part: pd.DataFrame) -> pd.Series:
        return pd.Series({"predictions": len(part), "coverage": float(part["covered"].mean()),
                          "median_half_width": float(part["half_width"].median()),
                          "mape": float(part["error"].abs().mean()),
                          "naive_mape": float(part["naive_error"].abs().mean()),
                          "infinite": int((~part["finite"]).sum())})
    if not by:
        return one(predictions).to_frame().T
    return predictions.groupby(list(by), sort=False).apply(one, include_groups=False).reset_index()
