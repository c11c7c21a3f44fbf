"""How far to trust a throughput prediction beyond the measured GPU counts: models chosen and bands
calibrated on published scaling tables, one whole *source* left out at a time, bounded by physics.

An extrapolation task is what the planner is asked to do: a series measured at GPU counts
c1 < ... < cn is fitted on its first k counts and predicts the others. Every shipped table is a set
of such series (`reference_tables`): the seeds' tables in scalelab/costs/data and the published
corpus in scalelab/costs/data/corpus (SOURCES.csv names each table's source and its `origin`: the
publisher, benchmark suite or issue thread it comes from). Tables of one origin share hardware
habits and methodology, so they teach a model their shape together: everything here is judged and
calibrated leaving a whole origin out, never one table of it.

**Candidate models** of the throughput T(N) from the fitted counts (`candidate_predictions`), each
working on the per-GPU rate p(N) = T(N)/N:

- **naive**: the last measured per-GPU rate carried forward, p(N) = p(ck);
- **decay** and **half-decay**: the per-GPU rate keeps losing, per doubling of the GPUs, what it
  lost per doubling over the last fitted doubling (half of that for half-decay): p(N) =
  p(ck) · exp(λ · g · log2(N/ck)), g = log(p(ck)/p(cj)) / log2(ck/cj) clipped at 0, λ = 1 or 1/2, cj the
  fitted count nearest ck/2, 1 GPU only when no other (`_base`: in a dense table the last step alone is
  mostly noise). With cj = ck−1 and unclipped, this is the naive *trend* rule that every figure is compared
  with (`trend_rule`);
- **ernest**, **comm**, **ps**: the NNLS models of scalelab/costs/fitting.py (comm and ps see nodes:
  crossing a node boundary is what their inter-node term prices);
- **blends**: the geometric mean of two of the above (`decay+comm`, `decay+ps`, `decay+half-decay`):
  an empirical trend and a physical model err on different tables, and their mean transfers better
  than either (docs/benchmarks.md has the figures).

**Physics and the data, not hope** (`physical_bounds`): no prediction above linear scaling from the
best measured per-GPU rate; beyond the most measured count the per-GPU rate does not rise above the
last measured one, a rise at its end included (seed 001's noisy 7 -> 8 GPU uptick once let the band
climb back to linear scaling from 1 GPU at 128); while the measured throughput never fell,
more GPUs are not predicted to deliver less than the most measured count did (`floor`), but a measured
drop is followed (negative scaling is real: oversubscribed hosts, slow links), down to the exchange's
floor, which the band's low end keeps too (`exchange_floor`: a step grows at most as N − 1 beyond the
most measured count; across nodes never measured, over the link model's `network_ratio`). A point is
predicted on no more nodes than any fitted count used (`point_nodes`): a first crossing is priced by the
band alone. Inside the measured counts the measurement is the answer (scalelab/costs/model.py), with
its own spread as its band (`measured_noise` at least).

**Which model** a plan uses is chosen by held-out error: the lowest mean |log(pred/true)| over the
training tasks, each origin weighted equally, separately for fits on two counts and on three or more.
With three or more counts one model leads whichever origin is left out (node-decay, by 8-21 %). With
two counts the leaders are within 0.1-6 % of each other and which one leads flips with the origin left
out, so the point is the geometric mean of the two best (`POINT_MODELS`; named `a&b`): on held-out
sources its error is below the naive trend rule's, where the single best one's was above it.

**The band** is in log space: log(true/pred) lies in [lo, hi] · s, s = (d + δ) · (r + 0.05), d the
doublings past the fitted counts, δ = 0.5 (a measured point is off by its noise) and r the |log| of
the per-GPU rate lost per doubling across the fitted counts (a series far from linear can bend either
way). lo and hi are quantiles of the scores log(true/pred)/s over the training origins (each origin
weighted equally), taken at a level ℓ that is itself chosen by leaving one origin out *inside* the
training origins: the smallest ℓ whose bands, made without an origin, hold on at least `confidence` plus
a margin m of 1 − `confidence` of the held-out origins' tasks pooled (split-conformal across sources).
The margin, a guard for sources unlike ours, is chosen per class of fits (2, 3+) from `MARGINS` (0 to a
third) by the same rule one level up, again from the training origins only (`_choose_margins`, nested
leave-one-origin-out): each training origin is predicted with the model, ℓ and band made without it (and
without the origin held out outside), and the margin is the smallest whose bands held on `confidence` of
those tasks pooled, the largest if none did. So the band is as wide as it had to be on sources it had
not seen, not on the ones it learnt from, and no held-out figure chose its margin. The shipped
calibration chooses its margin so over every origin, kept in a file like the tasks (`_margins_cache`).
Fits on three or more counts are calibrated apart for predictions that cross onto more nodes than any
fitted count used, and the two bands are then ordered as physics orders them (`_ordered_by_nodes`): the
same GPUs on more nodes are never given a higher band.

**Fits on two counts** (`CAPPED`) reach up to physics' cap: their high end is the last per-GPU rate
carried forward, raised by the measurement's noise (`band_ceiling`), never linear scaling from the best
rate; their whole miss rate is on the low side (lo at 1 − ℓ), one band for every prediction. Two counts
say how much was lost once, not whether it is lost again: the decay models are too pessimistic as often
(a first doubling's loss that is not repeated) as a series collapses later (an input pipeline or a
slow network at the first node crossing), and physics bounds only the first.

**Between measured counts** (`interior_band`): a count left out between two measured ones is predicted
by interpolating the per-GPU rate, and its band is learnt on such predictions (every shipped series' inner
counts, each left out in turn), split-conformal across origins, at d = the doublings to the nearest
measured count; its high end may pass linear scaling by that band (the measured neighbours are noisy too).
It was a measured count's band (d = 0): 69 % held at 90 %; now 90 % (`interior_coverage`, each origin's
band learnt without it).

`coverage` judges the whole procedure: every origin predicted with the model, margin and band chosen
without it (`launch bench --only planner`; docs/benchmarks.md has the figures per source).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib.resources import as_file, files
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from scalelab.core.errors import DataError
from scalelab.costs.fitting import MODELS, LinkModel, ScalingModel, extrapolation
from scalelab.costs.registry import names
from scalelab.costs.tables import read_scaling_csv, with_throughput

__all__ = ["SEED_TABLES", "DEFAULT_CONFIDENCE", "CANDIDATES", "DELTA", "reference_tables", "reference_series",
           "origin_of", "candidate_predictions", "fit_models", "trend_rule", "physical_bounds", "band_spread",
           "all_tasks", "Calibration", "calibrate", "conformal_quantile", "predict_band", "band_ceiling", "next_count", "coverage",
           "exchange_floor", "network_ratio", "point_nodes", "measured_noise",
           "coverage_summary", "k_class", "band_class", "POINT_MODELS", "CAPPED", "interior_tasks", "interior_band",
           "interior_coverage"]

#: The seeds' scaling tables shipped in scalelab/costs/data (costs.tables' scaling format).
SEED_TABLES = ("seed001_nmt_scaling.csv", "seed004_sentiment_scaling.csv", "seed004_emr_preprocessing.csv")
CORPUS_PACKAGE = "scalelab.costs.data.corpus"
DEFAULT_CONFIDENCE = 0.9
BLENDS = {"decay+comm": ("decay", "comm"), "decay+ps": ("decay", "ps"), "decay+half-decay": ("decay", "half-decay"),
          "node-decay+comm": ("node-decay", "comm")}
CANDIDATES = names("worker-count", choosable=True)  # scalelab/costs/registry.py: one registry of every model
DELTA = 0.5  # the band's width at a measured count, in doublings
LOSS_FLOOR = 0.05  # the band's width factor of a series that loses nothing per doubling
_LEVELS = np.concatenate([np.linspace(0.9, 0.99, 19), [0.995, 0.998, 1.0]])  # the band's inner levels tried
#: the margins tried, per class of fits: the share of the miss rate the inner level must hold beyond
#: `confidence` (`_levels`), a guard for sources unlike all of ours. Which one a calibration uses is
#: itself chosen leaving one origin out among its training origins (`_choose_margins`): the smallest whose
#: bands held on `confidence` of the origins left out, the largest when none did
MARGINS = (0.0, 0.1, 1 / 6, 1 / 4, 1 / 3)
#: models whose geometric mean is the point, per class of fits: with two counts the leading models are
#: within 0.1-6 % of each other's held-out error and which one leads flips with the source left out
#: (docs/benchmarks.md), so the two best are combined; with three or more one model leads every time
POINT_MODELS = {"2": 2, "3+": 1}
#: classes whose band reaches up to the physical cap (module doc, "The band"): with two counts the
#: decay models are as often too pessimistic (a first doubling's loss that is not repeated) as the
#: series collapses later, and physics bounds the upside where nothing bounds the downside
CAPPED = frozenset({"2"})


def k_class(k: int) -> str:
    """The class of a fit by its fitted counts: "2" or "3+" (calibrated apart: two counts say little)."""
    return "2" if k <= 2 else "3+"


ACROSS = " across nodes"


def band_class(k: int | str, crosses_nodes: bool) -> str:
    """The band's class: the fit's class, and whether the prediction crosses onto more nodes than any
    fitted count used (the network is then paid for the first time: the published tables' widest misses)."""
    return (k if isinstance(k, str) else k_class(k)) + (ACROSS if crosses_nodes else "")


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


@lru_cache(maxsize=1)
def _origins() -> dict[str, str]:
    sources = pd.read_csv(files(CORPUS_PACKAGE) / "SOURCES.csv")
    origin = sources["origin"] if "origin" in sources.columns else pd.Series([None] * len(sources))
    # without an origin, the repository (or address) before "@" is one: its tables share a method
    return {str(t): str(o) if isinstance(o, str) and o else str(src).split("@")[0]
            for t, o, src in zip(sources["table"], origin, sources["source"])}


def origin_of(table: str) -> str:
    """The independent source a shipped table comes from: SOURCES.csv's `origin`; a seed is its own
    (seed 004's two tables are one origin)."""
    if table.startswith("seed"):
        return table.split("_")[0]
    return _origins().get(table, table)


def reference_series() -> dict[str, pd.DataFrame]:
    """Every series of the shipped tables, by "table: label"."""
    return {f"{t}: {label}": rows for t, series in reference_tables().items() for label, rows in series.items()}


# ---- models and bounds --------------------------------------------------------------------------------


def _per_gpu(fitted: pd.DataFrame) -> pd.Series:
    """Mean measured per-GPU rate at each fitted count, by count."""
    return (fitted["throughput"] / fitted["workers"]).groupby(fitted["workers"]).mean().sort_index()


def _interpolated(rate: pd.Series, w: np.ndarray) -> np.ndarray:
    """Per-GPU rate inside (and below) the fitted counts: log-linear in log2 N between them."""
    return np.exp(np.interp(np.log2(w), np.log2(rate.index.to_numpy(float)), np.log(rate.to_numpy(float))))


def _last_loss(rate: pd.Series) -> float:
    """log of the per-GPU rate's change per doubling between the last two fitted counts (< 0: a loss)."""
    return math.log(rate.iloc[-1] / rate.iloc[-2]) / math.log2(rate.index[-1] / rate.index[-2])


def _base(rate: pd.Series) -> int:
    """Where the decay's recent loss is measured from: the fitted count nearest (in doublings) to half
    the last, not the 1-GPU count while another one is fitted (1 -> 2 GPUs adds the whole exchange, a
    loss that later doublings do not repeat). Why not the last step: in a dense table (1, 2, ..., 8 GPUs)
    the last step is a fifth of a doubling, where a measurement's noise is the whole of it; seed 001's
    7 -> 8 GPU uptick (+2.5 % per GPU) made every decay model carry no loss at all, and 16-64 GPUs came
    out linear from 8 after 1 -> 8 had lost 31 % per GPU. With counts a doubling apart it is the last step."""
    counts = rate.index.to_numpy(float)
    allowed = [i for i in range(len(counts) - 1) if counts[i] > 1] or [0]
    return min(allowed, key=lambda i: abs(math.log2(counts[-1] / counts[i]) - 1.0))


def _recent_loss(rate: pd.Series, since: int | None = None) -> float:
    """log of the per-GPU rate's change per doubling over the last fitted doubling (`_base`), or from
    fitted count number `since` (< 0: a loss)."""
    i = _base(rate) if since is None else since
    return math.log(rate.iloc[-1] / rate.iloc[i]) / math.log2(rate.index[-1] / rate.index[i])


def _node_loss(fitted: pd.DataFrame, rate: pd.Series) -> float:
    """The decay's loss per doubling, unless the last fitted step is the first to cross onto several
    nodes: that step pays the network once (a ring's bytes per GPU barely grow with more nodes), so
    it is not carried forward; a crossing inside the last doubling (8 GPUs on one node, then 12 and 16
    on two) is not either: the loss is measured from the first count on several nodes."""
    nodes = fitted.groupby("workers")["nodes"].max().sort_index() if "nodes" in fitted.columns else None
    if nodes is None or nodes.iloc[-1] <= 1 or nodes.iloc[_base(rate)] > 1:
        return min(0.0, _recent_loss(rate))
    if nodes.iloc[-2] <= 1:
        return 0.0
    return min(0.0, _recent_loss(rate, since=int(np.flatnonzero(nodes.to_numpy(float) > 1)[0])))


def fit_models(fitted: pd.DataFrame, link: LinkModel | None = None) -> dict[str, ScalingModel]:
    """The NNLS models of scalelab/costs/fitting.py fitted once on `fitted` (workers, nodes, throughput)."""
    nodes = fitted["nodes"] if "nodes" in fitted.columns else np.ones(len(fitted))
    return {name: cls(link).fit(fitted["workers"], nodes, fitted["throughput"]) for name, cls in MODELS.items()}


def trend_rule(fitted: pd.DataFrame, workers: Sequence[float]) -> np.ndarray:
    """The naive rule every figure is compared with: the last two per-GPU rates' trend carried forward
    (unbounded; inside the fitted counts, the measured rates interpolated)."""
    w = np.asarray(workers, dtype=float)
    rate = _per_gpu(fitted)
    ck = float(rate.index[-1])
    d = np.log2(np.maximum(w / ck, 1.0))
    return np.where(w > ck, w * rate.iloc[-1] * np.exp(_last_loss(rate) * d), w * _interpolated(rate, w))


def candidate_predictions(fitted: pd.DataFrame, workers: Sequence[float], nodes: Sequence[float] | None = None,
                          link: LinkModel | None = None,
                          models: dict[str, ScalingModel] | None = None) -> dict[str, np.ndarray]:
    """Throughput at `workers` from each candidate model (module doc) fitted on `fitted` (two or
    more GPU counts), before the physical bounds. At or below the most fitted count every model
    but the NNLS ones interpolates the measured per-GPU rates. `models`: the NNLS fits, when made."""
    w = np.asarray(workers, dtype=float)
    nd = point_nodes(fitted, np.ones_like(w) if nodes is None else np.asarray(nodes, dtype=float))
    rate = _per_gpu(fitted)
    ck, last = float(rate.index[-1]), float(rate.iloc[-1])
    d = np.log2(np.maximum(w / ck, 1.0))
    g = min(0.0, _recent_loss(rate))
    inside = _interpolated(rate, w)
    out = {"naive": np.where(w > ck, w * last, w * inside)}
    for name, lam in (("decay", 1.0), ("half-decay", 0.5)):
        out[name] = np.where(w > ck, w * last * np.exp(lam * g * d), w * inside)
    out["node-decay"] = np.where(w > ck, w * last * np.exp(_node_loss(fitted, rate) * d), w * inside)
    for name, model in (models or fit_models(fitted, link)).items():
        out[name] = np.nan_to_num(model.predict(w, nd, link), nan=0.0)
    floor, ceiling = physical_bounds(fitted, w)
    for name, (a, b) in BLENDS.items():
        pa, pb = (np.clip(out[m], floor, ceiling) for m in (a, b))
        out[name] = np.sqrt(np.maximum(pa, 1e-300) * np.maximum(pb, 1e-300))
    return out


def point_nodes(fitted: pd.DataFrame, nodes: np.ndarray) -> np.ndarray:
    """The nodes a point is predicted on: as asked, but never more than any fitted count used. No model can
    price a network it never saw: comm and ps fitted on one node priced the first crossing from assumed link
    speeds (8 GPUs at 104,305 words/s on one node, 80,357 on eight; 2 workers measured at 132,295 on one node
    "predicted" 112,622 on two), so the point stays as on the fitted nodes and the crossing is priced by the
    band's low end only (its class, `band_class`, and `exchange_floor`)."""
    most = float(fitted["nodes"].max()) if "nodes" in fitted.columns else 1.0
    return np.minimum(np.asarray(nodes, dtype=float), max(most, 1.0))


def network_ratio(link: LinkModel | None = None) -> float:
    """How many times slower the network between nodes may be than the links inside one (bandwidth or
    latency, whichever is worse; at least 1): what a first crossing can cost a step at most, by the link
    model's figures (`--intra-gbps`, the instance's network; defaults 80 against 10 Gbit/s, 5 against 50 µs)."""
    link = link or LinkModel()
    return max(1.0, link.intra_gbps / link.inter_gbps, link.inter_latency_s / link.intra_latency_s)


def exchange_floor(fitted: pd.DataFrame, workers: Sequence[float], crosses: Sequence[bool] | None = None,
                   ratio: float = 1.0) -> np.ndarray:
    """The least throughput physics allows beyond the most fitted count ck (0 inside the fitted counts but at
    a measured count placed on more nodes): a step is compute plus exchange; with more workers each one's
    compute shrinks (fixed global batch) or stays (growing), and a ring's or a parameter server's exchange
    grows at most as N − 1 (its latency terms; its bytes per worker less), so t(N) <= t(ck)·(N − 1)/(ck − 1)
    and T(N) >= T(ck)·(ck − 1)/(N − 1). On the same links: a prediction onto more nodes than any fitted count
    used (`crosses`) may pay a network `ratio` times slower, so its floor is divided by it (at a measured
    count so placed: T(c)/ratio). No published task fell below the floor without the ratio (520
    predictions, 15 sources, crossing ones included: the closest at 1.0x, Keras-TensorFlow's LSTM 4 -> 8
    GPUs, the closest crossing at 1.9x). Before, a 2-count series with a measured drop was given a low end
    of 0.03 words/s at 16 workers, 4 million times below its measurement."""
    w = np.asarray(workers, dtype=float)
    rate = _per_gpu(fitted)
    ck = float(rate.index[-1])
    total = rate * rate.index.to_numpy(float)
    beyond = np.where(w > ck, float(total.iloc[-1]) * (ck - 1) / np.maximum(w - 1, 1.0), 0.0)
    cross = np.zeros(len(w), dtype=bool) if crosses is None else np.asarray(crosses, dtype=bool)
    at = np.array([float(total.get(x, 0.0)) for x in w]) if len(w) else np.zeros(0)
    least = np.where(cross & (w <= ck), at, beyond)
    return np.where(cross, least / max(ratio, 1.0), least)


def loss_per_doubling(fitted: pd.DataFrame) -> float:
    """|log| of the per-GPU rate lost (or gained) per doubling of the GPUs across the fitted counts:
    a series far from linear scaling can bend either way beyond them, one close to it barely."""
    rate = _per_gpu(fitted)
    return abs(math.log(rate.iloc[-1] / rate.iloc[0])) / math.log2(rate.index[-1] / rate.index[0])


def band_spread(fitted: pd.DataFrame, workers: Sequence[float], between: bool = False) -> np.ndarray:
    """The band's shape at `workers`: (d + δ) · (loss per doubling + floor), d the doublings past the
    fitted counts (0 inside them); a band is its quantiles times this. `between`: d the doublings to the
    nearest fitted count instead, the shape of `interior_band` (an unmeasured count between two measured
    ones is that far from a measurement, not 0)."""
    w = np.asarray(workers, dtype=float)
    d = nearest_distance(w, fitted["workers"]) if between else extrapolation(w, fitted["workers"])
    return (d + DELTA) * (loss_per_doubling(fitted) + LOSS_FLOOR)


def nearest_distance(workers: np.ndarray, fitted: Sequence[float]) -> np.ndarray:
    """Doublings from each of `workers` to the nearest of the `fitted` counts (0 at a fitted count)."""
    counts = np.unique(np.asarray(fitted, dtype=float))
    return np.min(np.abs(np.log2(np.asarray(workers, dtype=float)[:, None] / counts[None, :])), axis=1)


def inside(fitted: pd.DataFrame, workers: Sequence[float]) -> np.ndarray:
    """Which of `workers` lie strictly between the fewest and most fitted counts and were not fitted."""
    w = np.asarray(workers, dtype=float)
    counts = np.unique(fitted["workers"].to_numpy(float))
    return (w > counts[0]) & (w < counts[-1]) & ~np.isin(w, counts)


def band_ceiling(fitted: pd.DataFrame, workers: Sequence[float], hi: float | np.ndarray,
                 measured_hi: float | None = None) -> np.ndarray:
    """The band's high end may pass the point's ceiling by the noise of the measurement it rests on,
    never linear scaling from the best per-GPU rate. With `measured_hi` (the fit's class's hi, as model.py's
    measured band takes it; fits on three or more counts) that noise is, beyond the most measured count, the
    measured point's own (`measured_noise`), so high(N)/N <= high(ck)/ck: efficiency never recovers. It was
    the extrapolation band at d = 0, δ · (r + floor), which grows with the series' loss per doubling:
    seed 001's 8 GPUs measured +1.3 % high and 9 GPUs got 2.9 % over the last per-GPU rate. Fits on two
    counts (`CAPPED`, no `measured_hi`) keep it: their whole high end is this cap, and the measured noise
    there widened their calibrated band past issue 33's bar (median half-width 20.7 % against 20 %)."""
    w = np.asarray(workers, dtype=float)
    _, ceiling = physical_bounds(fitted, w)
    beyond = w > float(fitted["workers"].max())
    if measured_hi is None:
        return _cap(ceiling, hi, _noise(fitted), w * float(_per_gpu(fitted).max()))
    his = np.where(beyond, measured_hi, hi)
    return _cap(ceiling, his, _cap_noise(fitted, w), w * float(_per_gpu(fitted).max()))


def _cap_noise(fitted: pd.DataFrame, workers: np.ndarray) -> np.ndarray:
    """The noise `band_ceiling` raises the ceiling by for fits on three or more counts: a measurement's own
    (δ · `LOSS_FLOOR`, as `measured_noise`) beyond the most measured count, `_noise` below it."""
    beyond = np.asarray(workers, dtype=float) > float(fitted["workers"].max())
    return np.where(beyond, DELTA * LOSS_FLOOR, _noise(fitted))


def measured_noise(cal: Calibration) -> tuple[float, float]:
    """(lo, hi) log half-widths of a measured layout whose runs say nothing of their spread (one run, no step
    times): the calibrated band at a measured count (d = 0) of a series that loses nothing per doubling,
    δ · `LOSS_FLOOR`. Not δ · (r + floor) as before: r is how far the series bends beyond its counts, which
    says nothing of how noisy a measurement is, and a series with a measured drop (r = 1.7) got a band from
    its own 1-worker measurement down to 1/60 of it at 95 % and 1/1,900 at 99 %."""
    return min(cal.lo, 0.0) * DELTA * LOSS_FLOOR, max(cal.hi, 0.0) * DELTA * LOSS_FLOOR


def _noise(fitted: pd.DataFrame) -> float:
    """The spread of the band at a measured count (d = 0): δ · (loss per doubling + floor)."""
    return DELTA * (loss_per_doubling(fitted) + LOSS_FLOOR)


def _cap(ceiling: np.ndarray, hi: float | np.ndarray, noise: float | np.ndarray, linear: np.ndarray) -> np.ndarray:
    """`band_ceiling`'s rule on known parts: the point's ceiling raised by the noise, at most linear scaling."""
    return np.minimum(ceiling * np.exp(np.maximum(hi, 0.0) * noise), linear)


def _band_ends(pred: np.ndarray, lo_s: np.ndarray, hi_s: np.ndarray, ceiling: np.ndarray,
               cap: np.ndarray, least: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of a band of log half-widths lo_s <= 0 <= hi_s around `pred`, bounded by physics (the low
    end never below `least`, `exchange_floor`) and never excluding the point (hi_s = inf: up to the cap, a
    `CAPPED` class): `predict_band` and `coverage` both make their bands here."""
    low = np.minimum(np.minimum(np.maximum(pred * np.exp(lo_s), least), ceiling), pred)
    hi_s = np.asarray(hi_s, dtype=float)
    up = np.where(np.isinf(hi_s), cap, pred * np.exp(np.where(np.isinf(hi_s), 0.0, hi_s)))
    high = np.maximum(np.minimum(up, cap), pred)
    return low, high


def physical_bounds(fitted: pd.DataFrame, workers: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(floor, ceiling) of the throughput at `workers` GPUs of the measured kind. Ceiling: linear
    scaling from the best measured per-GPU rate, and beyond the most measured count from the last
    measured rate (a rise at the end is not carried on: efficiency does not recover with more GPUs,
    and a last step's uptick is as often noise). Floor (beyond the most measured count only):
    what that count delivered, while the measured throughput never fell; once it fell, the exchange's
    floor (`exchange_floor`: the step grows at most as N − 1)."""
    w = np.asarray(workers, dtype=float)
    rate = _per_gpu(fitted)
    ck = float(rate.index[-1])
    total = rate * rate.index.to_numpy(float)
    beyond = np.where(w > ck, w * float(rate.iloc[-1]), np.inf)
    ceiling = np.minimum(w * float(rate.max()), beyond)
    never_fell = bool((np.diff(total.to_numpy(float)) >= 0).all())
    floor = np.where((w > ck) & never_fell, float(total.iloc[-1]), exchange_floor(fitted, w))
    return np.minimum(floor, ceiling), ceiling


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
        trend = trend_rule(fitted, test["workers"])
        crosses = test["nodes"].to_numpy(float) > float(fitted["nodes"].max())
        linear = test["workers"].to_numpy(float) * float(_per_gpu(fitted).max())
        least = exchange_floor(fitted, test["workers"], crosses, network_ratio())
        noise = (np.full(len(test), _noise(fitted)) if k_class(k) in CAPPED
                 else _cap_noise(fitted, test["workers"].to_numpy(float)))  # band_ceiling's, per class
        for i, (_, r) in enumerate(test.iterrows()):
            task = {"table": table, "origin": origin_of(table), "series": label, "fit_counts": k,
                    "workers": int(r["workers"]), "distance": math.log2(r["workers"] / counts[k - 1]),
                    "crosses_nodes": bool(crosses[i]), "true": float(r["throughput"]), "spread": float(spread[i]),
                    "floor": float(floor[i]), "ceiling": float(ceiling[i]), "pred_trend": float(trend[i]),
                    "noise": float(noise[i]), "linear": float(linear[i]), "least": float(least[i])}
            out.append(task | {f"pred_{m}": float(max(np.clip(p[i], floor[i], ceiling[i]), 1e-300))
                               for m, p in preds.items()})
    return out


def _interior_splits():
    """(table, origin, series, count, fitted, true) of every shipped series' inner counts, each left out."""
    for table, series in reference_tables().items():
        for label, part in series.items():
            counts = sorted({int(w) for w in part["workers"]})
            for c in counts[1:-1]:
                test = part[part["workers"] == c]
                yield table, origin_of(table), label, c, part[part["workers"] != c], test


@lru_cache(maxsize=1)
def interior_tasks() -> pd.DataFrame:
    """Every interpolation task of every shipped series of three or more counts: one count between its
    fewest and most left out, predicted from the others as a plan predicts it (the interpolated per-GPU
    rate, every non-NNLS candidate's answer inside the fitted counts), scored log(true/pred)/s with s the
    band's spread there. A few hundred predictions: made when first asked, not kept in a file."""
    rows = []
    for table, origin, label, c, fitted, test in _interior_splits():
        pred = c * float(_interpolated(_per_gpu(fitted), np.array([float(c)]))[0])
        spread = float(band_spread(fitted, [c], between=True)[0])
        true = float(test["throughput"].mean())
        rows.append({"table": table, "origin": origin, "series": label, "workers": c,
                     "true": true, "pred": pred, "score": math.log(true / pred) / spread})
    return pd.DataFrame(rows)


@lru_cache(maxsize=64)
def interior_band(confidence: float = DEFAULT_CONFIDENCE, exclude: str | None = None) -> tuple[float, float]:
    """(lo, hi) of the interior tasks' scores, every origin but `exclude`, two-sided at `confidence` (split
    conformal across the origins: a band learnt without the source it is judged on, `interior_coverage`).
    Before, a count between two measured ones had a measured count's band (±2-5 %) and was outside it in 10
    of 22 predictions on published tables new to the planner (DeepLearningExamples, CSC's benchmarks)."""
    tasks = interior_tasks()
    scores = tasks.loc[tasks["origin"] != exclude, "score"].to_numpy(float)
    tail = (1.0 - confidence) / 2
    return min(-conformal_quantile(-scores, 1.0 - tail), 0.0), max(conformal_quantile(scores, 1.0 - tail), 0.0)


def interior_coverage(confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Every interior task predicted as a plan predicts it (`predict_band`), with the model and bands learnt
    without its origin: origin, table, series, workers, error ((pred − true)/true), half_width
    ((high − low)/2/pred) and covered (`launch bench --only planner`, docs/benchmarks.md)."""
    rows = []
    for table, origin, label, c, fitted, test in _interior_splits():
        b = predict_band(fitted, [c], [float(test["nodes"].max())], confidence, exclude=origin).iloc[0]
        true = float(test["throughput"].mean())
        rows.append({"origin": origin, "table": table, "series": label, "workers": c,
                     "error": (b["predicted"] - true) / true, "covered": b["low"] <= true <= b["high"],
                     "half_width": (b["high"] - b["low"]) / 2 / b["predicted"]})
    return pd.DataFrame(rows)


@lru_cache(maxsize=1)
def all_tasks() -> pd.DataFrame:
    """Every extrapolation task of every shipped table, with each candidate's bounded prediction.
    Fitting them takes seconds, so they are kept in a file keyed by the corpus and this code
    (`_tasks_cache`): every `launch plan` after the first reads it instead."""
    cache = _tasks_cache()
    if cache is not None and cache.is_file():
        try:
            kept = pd.read_csv(cache, dtype={"k_class": str, "table": str, "origin": str, "series": str})
            needed = {"table", "origin", "k_class", "true", "spread", "ceiling", "noise", "linear", "least",
                      "crosses_nodes", "pred_trend", *(f"pred_{m}" for m in CANDIDATES)}
            if len(kept) and needed <= set(kept.columns) and kept[sorted(needed - {"table", "origin",
                                                                                    "k_class"})].notna().all().all():
                return kept
        except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError):
            pass  # a damaged cache is made again
    rows = [t for table, series in reference_tables().items() for label, part in series.items()
            for t in _series_tasks(table, label, part)]
    df = pd.DataFrame(rows)
    df = df.assign(k_class=df["fit_counts"].map(k_class))
    if cache is not None:
        _write_cache(cache, df)
    return df


CACHE_ENV = "SCALELAB_CACHE"  # where derived data is kept [default: ~/.cache/scalelab]; "off" keeps none


def _tasks_cache() -> Path | None:
    """The file of the tasks for this corpus and this code: named by a hash of every shipped table,
    SOURCES.csv and the modules that compute the tasks, so a change to any of them makes it anew."""
    where = os.environ.get(CACHE_ENV, "")
    if where.lower() == "off":
        return None
    digest = hashlib.sha256()
    for package in ("scalelab.costs.data", CORPUS_PACKAGE):
        for entry in sorted(files(package).iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".csv"):
                digest.update(entry.name.encode() + entry.read_bytes())
    for module in ("calibration.py", "fitting.py", "registry.py", "tables.py"):
        digest.update((files("scalelab.costs") / module).read_bytes())
    base = Path(where) if where else Path.home() / ".cache" / "scalelab"
    return base / f"calibration-tasks-{digest.hexdigest()[:20]}.csv"


def _write_cache(path: Path, df: pd.DataFrame) -> None:
    """Write the tasks atomically; a cache that cannot be written (read-only or full disk) is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        df.to_csv(tmp, index=False)
        os.replace(tmp, path)
    except OSError:
        pass


# ---- calibration ----------------------------------------------------------------------------------------


def conformal_quantile(values: Sequence[float], confidence: float) -> float:
    """The ⌈(n+1)·c⌉-th smallest of n scores (split conformal); inf when n is too small for c."""
    if not 0 < confidence < 1:
        raise DataError(f"a confidence level is between 0 and 1 (e.g. 0.9), got {confidence}")
    s = np.sort(np.asarray(values, dtype=float))
    rank = math.ceil((len(s) + 1) * confidence)
    return float(s[rank - 1]) if rank <= len(s) else math.inf


#: values sorted, and the weighted share of values at or below each (`_quantile_at`'s steps)
QuantileTable = tuple[np.ndarray, np.ndarray]


def _quantile_table(values: np.ndarray, weights: np.ndarray) -> QuantileTable:
    """Sorted once, for many quantiles of the same values (`_levels` asks each origin's at every level)."""
    order = np.argsort(values)
    v, cw = values[order], np.cumsum(weights[order])
    return v, cw / cw[-1]


def _quantile_at(table: QuantileTable, q: float) -> float:
    """The smallest value whose weighted share of values at or below it is at least q."""
    v, share = table
    return float(v[min(int(np.searchsorted(share, q - 1e-12)), len(v) - 1)])


def _origin_weights(origins: np.ndarray) -> np.ndarray:
    """Each task's weight in the band's quantiles: the same for every task, since the coverage asked
    for is over predictions pooled (weighting origins equally let two small, wild user threads set
    every band's tails: their worst 1 % became everybody's 5 %)."""
    return np.ones(len(origins))


def _band_at(scores: np.ndarray, weights: np.ndarray, level: float, capped: bool = False) -> tuple[float, float]:
    """(lo, hi) of the scores at a two-sided `level` (each tail (1 − level)/2), lo <= 0 <= hi. A capped
    class's band reaches up to the physical cap, so its whole miss rate 1 − level is on the low side
    (hi then only sets the cap's noise allowance, as for every class)."""
    return _band_from(_quantile_table(scores, weights), level, capped)


def _band_from(table: QuantileTable, level: float, capped: bool = False) -> tuple[float, float]:
    """`_band_at` of the scores sorted in `table`."""
    tail = (1.0 - level) / 2
    if level >= 1.0:
        return min(0.0, float(table[0][0])), max(0.0, float(table[0][-1]))
    low_tail = 1.0 - level if capped else tail
    return min(0.0, _quantile_at(table, low_tail)), max(0.0, _quantile_at(table, 1.0 - tail))


#: per task of a capped class: log(true/pred), log(ceiling/pred), the noise, log(linear/pred)
Upper = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _upper_ok(up: Upper, hi: float) -> np.ndarray:
    """Whether each task's truth lies under its capped band's high end (`band_ceiling`'s rule)."""
    le, to_ceiling, noise, to_linear = up
    return le <= np.maximum(np.minimum(to_ceiling + max(hi, 0.0) * noise, to_linear), 0.0) + 1e-9


#: per origin: the other origins' scores as a quantile table, its own tasks' scores and (capped) `Upper`
HeldOut = list[tuple[QuantileTable, np.ndarray, Upper | None]]


def _held_out(scores: np.ndarray, origins: np.ndarray, up: Upper | None = None) -> HeldOut:
    """Each origin left out once: made once for every level `_levels` tries."""
    parts = []
    for o in np.unique(origins):
        out = origins == o
        table = _quantile_table(scores[~out], _origin_weights(origins[~out]))
        parts.append((table, scores[out], None if up is None else tuple(a[out] for a in up)))
    return parts


def _held_out_coverage(parts: HeldOut, level: float) -> float:
    """Share of tasks covered when each origin's band is made from the other origins at `level`
    (a part with `Upper`: a capped class's tasks, whose high end is the cap)."""
    covered = total = 0
    for table, own, up in parts:
        lo, hi = _band_from(table, level, up is not None)
        above = own <= hi + 1e-12 if up is None else _upper_ok(up, hi)
        covered += int(((own >= lo - 1e-12) & above).sum())
        total += len(own)
    return covered / total


def _levels(scores: np.ndarray, origins: np.ndarray, confidence: float, up: Upper | None = None,
            margins: Sequence[float] = MARGINS) -> dict[float, float]:
    """Per margin m: the smallest inner level whose leave-one-origin-out bands hold on `confidence`
    plus m of the miss rate of the tasks pooled (1.0 when none does): the sources a user brings may
    resemble none of ours more than ours resemble each other."""
    if len(np.unique(origins)) < 2:
        return {m: 1.0 for m in margins}
    targets = {m: confidence + (1.0 - confidence) * m for m in margins}
    levels = sorted({*np.linspace(confidence, 0.99, 19), *_LEVELS[_LEVELS >= confidence]})
    parts = _held_out(scores, origins, up)
    out: dict[float, float] = {}
    for level in levels:
        held = _held_out_coverage(parts, level)
        out |= {m: float(level) for m, t in targets.items() if m not in out and held >= t}
        if len(out) == len(targets):
            break
    return {m: out.get(m, 1.0) for m in margins}


@dataclass(frozen=True)
class Calibration:
    """For one class of fits ("2" or "3+"): the point's models (`models`, combined by their geometric
    mean; `model` names them), the mean held-out |log error| per model (the combination's too), the
    band's quantiles of log(true/pred)/s, the inner level they were taken at and the margin that level
    was chosen with (`MARGINS`), how many tables and origins they were learnt from, and whether the
    band's high end is the physical cap (`capped`)."""

    k_class: str
    model: str
    errors: dict[str, float]
    lo: float
    hi: float
    tables: int
    origins: int = 0
    level: float = 0.0
    models: tuple[str, ...] = ()
    capped: bool = False
    margin: float = 0.0

    @property
    def members(self) -> tuple[str, ...]:
        """The models whose geometric mean is the point (the one model when `models` is not given)."""
        return self.models or (self.model,)


def _combined(preds: dict[str, np.ndarray] | pd.DataFrame, models: Sequence[str], prefix: str = "") -> np.ndarray:
    """The geometric mean of `models`' predictions (columns `prefix + name` of a frame, or a dict)."""
    logs = [np.log(np.maximum(np.asarray(preds[prefix + m], dtype=float), 1e-300)) for m in models]
    return np.exp(np.mean(logs, axis=0))


def _mean_error(preds: dict[str, np.ndarray], true: np.ndarray, codes: np.ndarray, model: str | Sequence[str]) -> float:
    """Mean |log(pred/true)| of `model` (or the geometric mean of several) over the tasks of each
    origin (`codes`: each task's origin as 0, 1, ...), averaged over the origins."""
    pred = _combined(preds, [model] if isinstance(model, str) else model)
    err = np.abs(np.log(pred / true))
    return float((np.bincount(codes, weights=err) / np.bincount(codes)).mean())


def _point_models(part: pd.DataFrame, cls: str) -> tuple[tuple[str, ...], dict[str, float]]:
    """The models of the point of class `cls` (`POINT_MODELS` of least held-out error) and every
    model's held-out error, the combination's included. On arrays taken from `part` once: this runs
    for every pair of origins left out."""
    preds = {m: part["pred_" + m].to_numpy(float) for m in CANDIDATES}
    true = part["true"].to_numpy(float)
    codes = np.unique(part["origin"].to_numpy(str), return_inverse=True)[1]
    errs = {m: _mean_error(preds, true, codes, m) for m in CANDIDATES}
    ranked = sorted(CANDIDATES, key=lambda m: (errs[m], CANDIDATES.index(m)))
    models = tuple(ranked[:POINT_MODELS.get(cls, 1)])
    if len(models) > 1:
        errs["&".join(models)] = _mean_error(preds, true, codes, models)
    return models, errs


def _calibrated(sub: pd.DataFrame, cls: str, models: tuple[str, ...], errs: dict[str, float], key: str,
                confidence: float) -> dict[float, Calibration]:
    """Per margin of `MARGINS`: the band of class `cls` from the tasks `sub`, at the level chosen
    leaving one origin out inside."""
    pred = _combined(sub, models, "pred_")
    le = np.log(sub["true"].to_numpy(float) / pred)
    scores = le / sub["spread"].to_numpy(float)
    origins = sub["origin"].to_numpy(str)
    capped = cls in CAPPED
    up = (le, np.log(sub["ceiling"].to_numpy(float) / pred), sub["noise"].to_numpy(float),
          np.log(sub["linear"].to_numpy(float) / pred)) if capped else None
    out = {}
    for margin, level in _levels(scores, origins, confidence, up).items():
        lo, hi = _band_at(scores, _origin_weights(origins), level, capped)
        out[margin] = Calibration(key, "&".join(models), errs, lo, hi, sub["table"].nunique(),
                                  len(np.unique(origins)), level, models, capped, margin)
    return out


@lru_cache(maxsize=512)
def _by_margin(confidence: float, exclude: frozenset[str]) -> dict[float, dict[str, Calibration]]:
    """Per margin of `MARGINS`, per band class: the calibration from every task but those of the
    origins `exclude` (`calibrate`'s, its margin not yet chosen)."""
    tasks = all_tasks()
    tasks = tasks[~tasks["origin"].isin(exclude)]
    out: dict[float, dict[str, Calibration]] = {m: {} for m in MARGINS}
    for cls, part in tasks.groupby("k_class"):
        cls = str(cls)
        models, errs = _point_models(part, cls)
        for across in (False, True):
            sub = part[part["crosses_nodes"] == across]
            if cls in CAPPED or sub["origin"].nunique() < 2:  # the class's band as a whole
                sub = part
            for margin, cal in _calibrated(sub, cls, models, errs, band_class(cls, across), confidence).items():
                out[margin][band_class(cls, across)] = cal
        for cals in out.values():
            same, across = (cals[band_class(cls, x)] for x in (False, True))
            cals[band_class(cls, False)], cals[band_class(cls, True)] = _ordered_by_nodes(same, across)
    return out


def _ordered_by_nodes(same: Calibration, across: Calibration) -> tuple[Calibration, Calibration]:
    """The bands of a fit's class on its fitted nodes and across more, made to agree with physics: the
    same GPUs spread over more nodes pay the network too, so are never faster. Calibrated apart, the
    fewer crossing tasks' quantiles put the high end of 16 GPUs on two nodes above the same 16 on one
    (docs/benchmarks.md, 2026-12-06): the high end on the fitted nodes is raised to the crossing one's
    (lowering the crossing one instead cost more width: the nested margin grew), and the crossing
    band's low end is at most the other's."""
    return replace(same, hi=max(same.hi, across.hi)), replace(across, lo=min(same.lo, across.lo))


def _choose_margins(confidence: float, exclude: frozenset[str]) -> dict[str, float]:
    """Per class of fits: the smallest margin of `MARGINS` whose calibrations, each made without one
    more origin, held on at least `confidence` of that origin's tasks, pooled over the origins not in
    `exclude` (the largest margin when none did). Nothing of the origins in `exclude` is read."""
    tasks = all_tasks()
    tasks = tasks[~tasks["origin"].isin(exclude)]
    covered: dict[str, dict[float, int]] = {}
    count: dict[str, int] = {}
    for origin, part in tasks.groupby("origin", sort=True):
        inner = _by_margin(confidence, exclude | {str(origin)})
        known = [band_class(k, bool(x)) in inner[MARGINS[0]] for k, x in zip(part["k_class"], part["crosses_nodes"])]
        part = part[np.array(known, dtype=bool)]  # a class no other origin has is not judged
        for margin, cal in inner.items():
            judged = _judge(part, cal)
            for cls, hits in judged.groupby(part["k_class"].to_numpy(str))["covered"]:
                covered.setdefault(str(cls), {}).setdefault(margin, 0)
                covered[str(cls)][margin] += int(hits.sum())
        for cls, n in part["k_class"].astype(str).value_counts().items():
            count[str(cls)] = count.get(str(cls), 0) + int(n)
    out = {}
    for cls, hits in covered.items():
        held = [m for m in MARGINS if hits.get(m, 0) >= confidence * count[cls] - 1e-9]
        out[cls] = held[0] if held else MARGINS[-1]
    return out


def _margins_cache() -> Path | None:
    """The file of the shipped calibration's margins (`_choose_margins` over every origin), by
    confidence: keyed like `_tasks_cache`, so `launch plan` does not judge every origin again."""
    tasks = _tasks_cache()
    return None if tasks is None else tasks.with_name(tasks.name.replace("calibration-tasks-", "calibration-margins-")
                                                      .replace(".csv", ".json"))


def _shipped_margins(confidence: float) -> dict[str, float]:
    """`_choose_margins` over every origin, read from `_margins_cache` when it was made before."""
    path, key = _margins_cache(), repr(float(confidence))
    kept: dict = {}
    if path is not None and path.is_file():
        try:
            kept = json.loads(path.read_text())
            got = kept.get(key)
            classes = {str(c) for c in all_tasks()["k_class"].unique()}
            if (isinstance(got, dict) and set(got) == classes
                    and all(isinstance(v, (int, float)) and v in MARGINS for v in got.values())):
                return {str(k): float(v) for k, v in got.items()}
        except (OSError, ValueError, UnicodeDecodeError, AttributeError):
            kept = {}  # a damaged cache is made again
    chosen = _choose_margins(confidence, frozenset())
    if path is not None:
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:  # a name of its own: two processes (or nodes) never share it
                f.write(json.dumps((kept if isinstance(kept, dict) else {}) | {key: chosen}))
            os.replace(tmp, path)
        except OSError:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
    return chosen


@lru_cache(maxsize=64)
def calibrate(confidence: float = DEFAULT_CONFIDENCE, exclude: str | None = None) -> dict[str, Calibration]:
    """Per class of fits: the point's models by held-out error and their band, from every task but
    those of origin `exclude` (module doc: the band's level is chosen leaving one origin out inside,
    with the margin chosen leaving one origin out among the same training origins, `_choose_margins`).
    A capped class is calibrated as a whole, its key across nodes the same band: with the high end at
    the cap, splitting it by node crossings made the bands wider, not truer (docs/benchmarks.md)."""
    if not 0 < confidence < 1:
        raise DataError(f"a confidence level is between 0 and 1 (e.g. 0.9), got {confidence}")
    out = frozenset() if exclude is None else frozenset({exclude})
    margins = _shipped_margins(confidence) if exclude is None else _choose_margins(confidence, out)
    cals = _by_margin(confidence, out)
    return {key: cals[margins.get(key.removesuffix(ACROSS), MARGINS[-1])][key] for key in cals[MARGINS[0]]}


def predict_band(fitted: pd.DataFrame, workers: Sequence[float], nodes: Sequence[float] | None = None,
                 confidence: float = DEFAULT_CONFIDENCE, link: LinkModel | None = None,
                 exclude: str | None = None, models: dict[str, ScalingModel] | None = None) -> pd.DataFrame:
    """Throughput at `workers` from `fitted` (rows of two or more GPU counts): columns predicted,
    low, high (the band at `confidence`, finite and physically bounded), model, floor, ceiling.
    This is the model's answer everywhere, measured counts included (scalelab/costs/model.py puts the
    measurements first). A count on more nodes than any fitted one used is predicted as on those nodes
    (`point_nodes`) with the crossing class's band, its low end at least `exchange_floor` over the link's
    `network_ratio`."""
    fitted = fitted.assign(nodes=fitted["nodes"] if "nodes" in fitted.columns else 1)[["workers", "nodes", "throughput"]]
    fitted = fitted.astype(float)
    k = fitted["workers"].nunique()
    if k < 2:
        raise DataError(f"a scaling prediction needs measurements at two or more GPU counts, got {k}")
    cals = calibrate(confidence, exclude)
    w = np.asarray(workers, dtype=float)
    nd = np.ones_like(w) if nodes is None else np.asarray(nodes, dtype=float)
    crosses = nd > float(fitted["nodes"].max())
    used = [cals[band_class(k, bool(c))] for c in crosses]
    lo, hi = np.array([c.lo for c in used]), np.array([c.hi for c in used])
    preds = candidate_predictions(fitted, w, nodes, link, models)
    floor, ceiling = physical_bounds(fitted, w)
    bounded = {m: np.clip(p, floor, ceiling) for m, p in preds.items()}  # each bounded, as in the tasks
    points = {c.members: _combined(bounded, c.members) for c in used}
    pred = np.array([points[c.members][i] for i, c in enumerate(used)]) if len(used) else np.zeros(0)
    pred = np.clip(pred, floor, ceiling)
    spread = band_spread(fitted, w)
    hi_s = np.where([c.capped for c in used], np.inf, hi * spread) if len(used) else np.zeros(0)
    lo_s, cap = lo * spread, band_ceiling(fitted, w, hi, None if k_class(k) in CAPPED else cals[k_class(k)].hi)
    between = inside(fitted, w)
    if between.any():  # between measured counts: the interpolation's own band (`interior_band`), whose high
        ilo, ihi = interior_band(confidence, exclude)  # end may pass linear scaling by its spread, as a hidden
        inner = band_spread(fitted, w, between=True)  # count did (its measured neighbours are noisy too)
        lo_s, hi_s = np.where(between, ilo * inner, lo_s), np.where(between, ihi * inner, hi_s)
        cap = np.where(between, _cap(ceiling, ihi, inner, np.inf), cap)
    low, high = _band_ends(pred, lo_s, hi_s, ceiling, cap, exchange_floor(fitted, w, crosses, network_ratio(link)))
    return pd.DataFrame({"workers": w, "predicted": pred, "low": low, "high": high, "model": [c.model for c in used],
                         "floor": floor, "ceiling": ceiling})


def next_count(fitted: pd.DataFrame, wanted: Sequence[float]) -> int | None:
    """With two measured counts, the third to measure: of the wanted counts above them, the one nearest the
    doubling of the most measured count, else that doubling itself (asked only for counts between the two,
    2 and 3 of 1 and 4, there was none); it shows whether efficiency keeps decaying. None with three or
    more counts."""
    counts = sorted({int(w) for w in fitted["workers"]})
    if len(counts) >= 3:
        return None
    above = [int(w) for w in wanted if w > counts[-1]] or [2 * counts[-1]]
    return min(above, key=lambda w: abs(math.log2(w / (2 * counts[-1]))))


# ---- judging the procedure ----------------------------------------------------------------------------


def _judge(part: pd.DataFrame, cal: dict[str, Calibration]) -> pd.DataFrame:
    """Tasks `part` predicted with the calibrations `cal` (by band class): model, error, naive_error,
    half_width, finite and covered, on `part`'s index (`coverage`'s columns). On the columns' arrays:
    it runs for every origin left out at every margin, so pandas' per-call cost was most of its time."""
    used = [cal[band_class(k, bool(x))] for k, x in zip(part["k_class"].to_numpy(str), part["crosses_nodes"].to_numpy())]
    members = [c.members for c in used]
    pred = np.zeros(len(part))
    for models in set(members):
        pick = np.array([m == models for m in members], dtype=bool)
        pred[pick] = _combined({m: part["pred_" + m].to_numpy(float)[pick] for m in models}, models)
    spread = part["spread"].to_numpy(float)
    his = np.array([c.hi for c in used], dtype=float)
    lo = np.array([c.lo for c in used], dtype=float) * spread
    hi = np.where(np.array([c.capped for c in used], dtype=bool), np.inf, his * spread)
    ceiling = part["ceiling"].to_numpy(float)
    measured_his = np.where(np.array([c.capped for c in used], dtype=bool), his,  # band_ceiling's
                            np.array([cal[k].hi for k in part["k_class"].to_numpy(str)], dtype=float))
    cap = _cap(ceiling, measured_his, part["noise"].to_numpy(float), part["linear"].to_numpy(float))
    low, high = _band_ends(pred, lo, hi, ceiling, cap, part["least"].to_numpy(float))
    true = part["true"].to_numpy(float)
    return pd.DataFrame({
        "model": [c.model for c in used], "margin": [c.margin for c in used], "error": pred / true - 1,
        "naive_error": part["pred_trend"].to_numpy(float) / true - 1, "half_width": (high - low) / 2 / pred,
        "finite": np.isfinite(high), "covered": (low <= true * (1 + 1e-9)) & (true <= high * (1 + 1e-9))},
        index=part.index)


def coverage(confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Every task of every table, predicted with the model and band calibrated without its whole
    origin (the margin too, `_choose_margins`): table, origin, series, fit_counts, workers, model,
    margin, error ((pred − true)/true), naive_error (the trend rule's), half_width ((high − low)/2/pred),
    finite and covered."""
    tasks = all_tasks()
    parts = []
    for origin, part in tasks.groupby("origin", sort=False):
        judged = _judge(part, calibrate(confidence, origin))
        parts.append(pd.concat([part[["table", "origin", "series", "fit_counts", "k_class", "workers", "distance",
                                      "crosses_nodes"]], judged], axis=1))
    return pd.concat(parts, ignore_index=True)


def coverage_summary(predictions: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Predictions, coverage, median half-width, mean absolute error and the naive trend rule's, of
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
