"""One fitted model per measured series: built once, asked many times.

A plan asks the same series for its throughput at many layouts (every worker count, on every
instance type's network, at two confidence levels). `FittedSeries.fit` fits it once: the NNLS
models of scalelab/costs/fitting.py (with their leave-one-out errors, for the next measurement),
where its GPUs sit on nodes, and how much its own measurements spread. `estimate(workers, nodes)`
then answers with a point and a band, in this order of trust:

1. **A measured layout is its measurement** (the mean of its runs), with a band from its own spread:
   the runs' step-time spread and the spread between repeated runs, never narrower than a
   measurement's noise (`calibration.measured_noise`, what a run without step times gets). A model
   never overrides a measurement; where the counts below a measurement predicted something else,
   `notes` says so, and a measured drop is a drop. A measured count placed on more nodes than it was
   measured on keeps its measurement as the point; the crossing widens the band's low end only.
2. **Any other layout** is the model chosen on the published tables, with its band calibrated
   leaving whole sources out, bounded by physics (`calibration.predict_band`).

**Nodes.** A predicted count is placed on nodes as the data places them (`gpus_per_node`): the
measured instance type's GPUs when it is known, else the GPUs per node of the multi-node rows (never
fewer than the most measured on one node), else the most GPUs measured on one node when that is a full
node of the sizes machines are built with (4, 8 or 16), else one node (the plan's notes say how to
place them otherwise). Crossing a node boundary
is what the inter-node term of the comm and ps models prices; `nodes=` asks for a layout explicitly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from scalelab.costs.calibration import (
    CANDIDATES,
    DEFAULT_CONFIDENCE,
    Calibration,
    calibrate,
    candidate_predictions,
    k_class,
    measured_noise,
    physical_bounds,
    predict_band,
)
from scalelab.costs.fitting import FitResult, LinkModel, fit_series

__all__ = ["FittedSeries", "gpus_per_node_of"]

FULL_NODES = (4, 8, 16)  # GPUs in the nodes machines are built with (cloud instances, DGX-1/A100/H100, DGX-2)
SPREAD_COLUMN = "throughput_spread"  # relative spread (std / mean) of a measurement's step times


def gpus_per_node_of(measured: pd.DataFrame, instance_gpus: int | None = None) -> int | None:
    """GPUs per node for placing counts the data does not hold (module doc, "Nodes"); None when
    nothing says (every row on one node, no instance type): such counts stay on one node."""
    if instance_gpus:
        return int(instance_gpus)
    nodes = pd.to_numeric(measured.get("nodes", pd.Series(1, index=measured.index)), errors="coerce").fillna(1)
    multi = nodes > 1
    single = measured.loc[~multi, "workers"]
    if multi.any():  # never fewer than the most GPUs measured on one node
        per_node = int(round(float((measured.loc[multi, "workers"] / nodes[multi]).max())))
        return max(1, per_node, int(single.max()) if len(single) else 0)
    most = int(measured["workers"].max())
    # a full node of the sizes machines are built with (4, 8, 16 GPUs): more GPUs need another node
    return most if most in FULL_NODES else None


@dataclass
class FittedSeries(FitResult):
    """A series fitted once (module doc): the NNLS fits, node placement and measured spreads."""

    gpus_per_node: int | None = None
    spread: dict[int, float] = field(default_factory=dict)  # workers -> relative spread of its measurement

    @classmethod
    def fit(cls, label: str, rows: pd.DataFrame, link: LinkModel | None = None,
            instance_gpus: int | None = None) -> "FittedSeries":
        """Fit `rows` (workers, throughput, optionally nodes and throughput_spread) once."""
        base = fit_series(label, rows, link)
        spread: dict[int, float] = {}
        if SPREAD_COLUMN in rows.columns:
            vals = pd.to_numeric(rows[SPREAD_COLUMN], errors="coerce")
            for w, s in zip(rows["workers"], vals):
                if pd.notna(s) and math.isfinite(float(s)) and s >= 0:
                    spread[int(w)] = max(spread.get(int(w), 0.0), float(s))
        return cls(base.label, base.measured, base.models, base.held_out_error, base.chosen,
                   gpus_per_node_of(base.measured, instance_gpus), spread)

    @property
    def counts(self) -> list[int]:
        return sorted({int(w) for w in self.measured["workers"]})

    def calibration(self, confidence: float = DEFAULT_CONFIDENCE) -> Calibration:
        return calibrate(confidence)[k_class(len(self.counts))]

    def disagreement(self, workers: Sequence[float], nodes: Sequence[float],
                     link: LinkModel | None = None) -> np.ndarray:
        """Largest relative gap between the plan's point and any candidate model it chooses among, each bounded
        by physics as the point is (calibration.CANDIDATES, `physical_bounds`). Why not FitResult's: it compared
        the raw NNLS fits, one of which predicted 32 GPUs at 213 samples/s after 16 had measured 567, and "measure
        next: the models disagree most there (76 % apart)" rested on that."""
        w = np.asarray(workers, dtype=float)
        fitted = self.measured[["workers", "nodes", "throughput"]].astype(float)
        preds = candidate_predictions(fitted, w, nodes, link, self.models)
        floor, ceiling = physical_bounds(fitted, w)
        point = predict_band(fitted, w, nodes, link=link, models=self.models)["predicted"].to_numpy(float)
        gaps = [np.abs(np.clip(p, floor, ceiling) - point) / point for name, p in preds.items() if name in CANDIDATES]
        return np.nanmax(np.vstack(gaps), axis=0) if gaps else np.zeros(len(w))

    def nodes_for(self, workers: int) -> int:
        """Nodes of `workers` GPUs: as measured when it was, else packed onto nodes of gpus_per_node."""
        same = self.measured[self.measured["workers"] == workers]
        if len(same):
            return int(same["nodes"].iloc[0])
        return max(1, math.ceil(workers / self.gpus_per_node)) if self.gpus_per_node else 1

    def estimate(self, workers: Sequence[int], nodes: Sequence[int] | None = None,
                confidence: float = DEFAULT_CONFIDENCE, link: LinkModel | None = None) -> pd.DataFrame:
        """Columns workers, nodes, predicted, low, high, model, basis (measured | model), held_out_error:
        the measurement at a measured layout, the calibrated model elsewhere (module doc)."""
        w = [int(x) for x in workers]
        nd = [self.nodes_for(x) for x in w] if nodes is None else [int(x) for x in nodes]
        band = predict_band(self.measured, w, nd, confidence, link, models=self.models)
        cal = self.calibration(confidence)
        band = band.assign(nodes=nd, basis="model", held_out_error=cal.errors[cal.model])
        for i, (x, n) in enumerate(zip(w, nd)):
            rows = self._measured_rows(x, n)
            if len(rows):
                point, low, high = self._measured_band(x, rows["throughput"].to_numpy(float), cal, confidence)
                if int(rows["nodes"].iloc[0]) < n:  # the same count on more nodes: the crossing in the low end only
                    low = min(low, point * float(band.loc[i, "low"] / band.loc[i, "predicted"]))
                band.loc[i, ["predicted", "low", "high", "basis"]] = [point, low, high, "measured"]
        return band

    def _measured_rows(self, workers: int, nodes: int) -> pd.DataFrame:
        """The measurements of `workers` on `nodes`, else on the most nodes below `nodes` that measured the
        count: the point of a count placed on more nodes than measured is its measurement (no model prices a
        network it never saw, calibration.point_nodes); on fewer nodes the model answers."""
        same = self.measured[self.measured["workers"] == workers]
        fewer = same[same["nodes"] <= nodes]
        return fewer[fewer["nodes"] == fewer["nodes"].max()] if len(fewer) else fewer

    def _measured_band(self, workers: int, values: np.ndarray, cal: Calibration,
                       confidence: float) -> tuple[float, float, float]:
        """(mean, low, high) of a measured layout: its runs' step-time spread and the spread between its
        repeats, never narrower than a measurement's noise (`calibration.measured_noise`: what a run that
        records no step times gets). Not the calibrated extrapolation band at d = 0, whose width grows
        with the series' loss per doubling: a 1-worker measurement of 181,005 words/s had a 95 % low end
        of 3,013 because its 2-worker point dropped."""
        point = float(values.mean())
        lo, hi = measured_noise(cal)
        rel = self.spread.get(workers, 0.0)
        z = _z(confidence)
        low = min(point * math.exp(lo), float(values.min()), point / (1.0 + z * rel))
        high = max(point * math.exp(hi), float(values.max()), point * (1.0 + z * rel))
        best = float((self.measured["throughput"] / self.measured["workers"]).max())
        return point, low, min(high, max(workers * best, point))  # never past linear scaling

    def notes(self, confidence: float = DEFAULT_CONFIDENCE) -> list[str]:
        """What the measurements say against the model: a measured drop, and every measured count
        outside the band the counts below it predicted (the measurement is what the plan uses)."""
        name = self.label or "(unlabelled)"
        rate = self.measured.groupby("workers")["throughput"].mean().sort_index()
        out = [f"series {name}: throughput drops from {int(a)} to {int(b)} workers ({rate[a]:,.0f} -> {rate[b]:,.0f}): "
               "the plan follows the measured drop (negative scaling: a busy host, oversubscribed cores or a slow "
               "link); predictions beyond it follow the measured rates, not a rule that throughput grows"
               for a, b in zip(rate.index[:-1], rate.index[1:]) if rate[b] < rate[a]]
        counts = self.counts
        for i in range(2, len(counts)):
            below = self.measured[self.measured["workers"] <= counts[i - 1]]
            b = predict_band(below, [counts[i]], [self.nodes_for(counts[i])], confidence).iloc[0]
            m = float(rate[counts[i]])
            if not b["low"] <= m <= b["high"]:
                out.append(f"series {name}: at {counts[i]} workers the measurement ({m:,.0f}) lies outside what the "
                           f"counts below it predicted ({b['low']:,.0f}-{b['high']:,.0f}, {b['model']}); the plan "
                           "uses the measurement")
        return out


def _z(confidence: float) -> float:
    """The two-sided normal quantile of `confidence` (a measurement's spread as a band)."""
    from statistics import NormalDist
    return NormalDist().inv_cdf(0.5 + confidence / 2)
