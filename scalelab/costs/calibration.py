"""How far to trust a throughput prediction: conformal calibration on extrapolation tasks.

An extrapolation task is what the planner is asked to do: a series measured at worker counts
w1 < ... < wn is fitted on its first k counts and predicts the others. Its score is the relative
error in units of the band's shape (`FitResult.band_scale`),

    score = |pred − true| / true / ((0.5 + d) · (g + r + 0.05)),

d = log2(w / w_k) beyond the fitted counts, g the disagreement of the scaling models at w (two
points leave them free to differ), r the fitted series' loss of efficiency per doubling: errors grow
with the distance, where the models disagree and on series far from ideal scaling. A prediction
then holds the truth with the stated confidence when its band is q · band_scale, q being the
conformal quantile of the scores: the ⌈(n+1)·c'⌉-th smallest of n.

The scores come from every scaling table the project ships (`REFERENCE_TABLES`: seed 001's five
series, seed 004's training and preprocessing tables; every k) and from the series itself (its own
tasks on the counts measured so far). Tables are not interchangeable draws (one may bend where the
others do not), and the aim is a band that holds on every table, not on average over them: so q is
the largest of the quantiles computed with one reference table left out each time, at the stricter
level c' = 1 − (1 − c)/2 (the 95 % quantile for a 90 % band). `coverage` measures the result
honestly: every table is predicted with a quantile calibrated without it, leave one table out
(`launch bench --only planner`; docs/benchmarks.md has the figures, and which tables fall short).
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib.resources import as_file, files
from typing import Sequence

import numpy as np
import pandas as pd

from scalelab.core.errors import DataError
from scalelab.costs.fitting import LinkModel, extrapolation, fit_series
from scalelab.costs.tables import read_scaling_csv, with_throughput

__all__ = ["REFERENCE_TABLES", "DEFAULT_CONFIDENCE", "reference_series", "task_errors", "scores",
           "conformal_quantile", "calibrated_quantile", "coverage", "coverage_summary"]

#: Published scaling tables shipped in scalelab/costs/data (costs.tables' scaling format): the calibration set.
REFERENCE_TABLES = ("seed001_nmt_scaling.csv", "seed004_sentiment_scaling.csv", "seed004_emr_preprocessing.csv")
DEFAULT_CONFIDENCE = 0.9


@lru_cache(maxsize=1)
def reference_series() -> dict[str, pd.DataFrame]:
    """Every series of the shipped tables, by "table: label"."""
    out = {}
    for name in REFERENCE_TABLES:
        with as_file(files("scalelab.costs.data") / name) as path:
            table = with_throughput(read_scaling_csv(path))
        for label, part in table.groupby("label", sort=False):
            out[f"{name}: {label}"] = part.reset_index(drop=True)
    return out


def task_errors(rows: pd.DataFrame, link: LinkModel | None = None, upto: int | None = None) -> pd.DataFrame:
    """Every extrapolation task of one series (workers, throughput, nodes optional): fit on its
    first k distinct worker counts (k = 2 .. n−1), predict the counts above, up to the `upto`-th
    count (default all). Columns: fit_counts, workers, error ((pred − true) / true), distance and
    scale (the band's shape there, `FitResult.band_scale`)."""
    counts = sorted({int(w) for w in rows["workers"]})[:upto]
    out = []
    for k in range(2, len(counts)):
        fit = fit_series("", rows[rows["workers"] <= counts[k - 1]], link)
        test = rows[(rows["workers"] > counts[k - 1]) & (rows["workers"] <= counts[-1])]
        nodes = test["nodes"].to_numpy(dtype=float) if "nodes" in test.columns else np.ones(len(test))
        pred = fit.predict(test["workers"], nodes)
        true = test["throughput"].to_numpy(dtype=float)
        out.append(pd.DataFrame({"fit_counts": k, "workers": test["workers"].to_numpy(),
                                 "error": np.where(np.isfinite(pred), (pred - true) / true, np.inf),
                                 "distance": extrapolation(test["workers"], counts[:k]),
                                 "scale": fit.band_scale(test["workers"], nodes)}))
    cols = ["fit_counts", "workers", "error", "distance", "scale"]
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def scores(tasks: pd.DataFrame) -> np.ndarray:
    """The conformal scores of tasks: |error| / scale."""
    return (tasks["error"].abs() / tasks["scale"]).to_numpy(dtype=float)


def conformal_quantile(values: Sequence[float], confidence: float) -> float:
    """The ⌈(n+1)·c⌉-th smallest of n scores (split conformal); inf when n is too small for c."""
    if not 0 < confidence < 1:
        raise DataError(f"a confidence level is between 0 and 1 (e.g. 0.9), got {confidence}")
    s = np.sort(np.asarray(values, dtype=float))
    rank = math.ceil((len(s) + 1) * confidence)
    return float(s[rank - 1]) if rank <= len(s) else math.inf


@lru_cache(maxsize=1)
def _reference_scores() -> dict[str, np.ndarray]:
    return {name: scores(task_errors(rows)) for name, rows in reference_series().items()}


def calibrated_quantile(own: pd.DataFrame | None, confidence: float = DEFAULT_CONFIDENCE,
                        link: LinkModel | None = None, exclude: str | None = None) -> float:
    """q for a series `own` (its measured rows; None: reference only): the largest quantile at
    the level 1 − (1 − `confidence`)/2 over the reference tables left out one at a time, each with
    the series' own scores (module doc: why both). `exclude` leaves one reference series out
    altogether (to measure coverage on it)."""
    level = 1.0 - (1.0 - confidence) / 2
    ref = {k: v for k, v in _reference_scores().items() if k != exclude}
    mine = scores(task_errors(own, link)) if own is not None else np.array([])
    if len(ref) < 2:
        return conformal_quantile(np.concatenate([*ref.values(), mine]), level)
    return max(conformal_quantile(np.concatenate([*(v for k, v in ref.items() if k != out), mine]), level)
               for out in ref)


def coverage(confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Each reference series predicted from its first k counts, for every k, with the band the
    planner would give (calibrated without that series): one row per prediction with series,
    fit_counts, workers, error, half_width and covered."""
    parts = []
    for name, series in reference_series().items():
        counts = sorted({int(w) for w in series["workers"]})
        tasks = task_errors(series)
        for k, part in tasks.groupby("fit_counts"):
            q = calibrated_quantile(series[series["workers"] <= counts[int(k) - 1]], confidence, exclude=name)
            half = q * part["scale"]
            parts.append(part.assign(series=name, half_width=half, covered=part["error"].abs() <= half))
    return pd.concat(parts, ignore_index=True)


def coverage_summary(predictions: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Predictions, coverage, median half-width and mean absolute error of `coverage`'s rows,
    overall or per group of `by`."""
    def one(part: pd.DataFrame) -> pd.Series:
        return pd.Series({"predictions": len(part), "coverage": float(part["covered"].mean()),
                          "median_half_width": float(part["half_width"].median()),
                          "mape": float(part["error"].abs().mean())})
    if not by:
        return one(predictions).to_frame().T
    return predictions.groupby(list(by), sort=False).apply(one, include_groups=False).reset_index()
