"""Predict untried layouts from a few measured ones, price them, and say which to buy.

What a user asks is which layout reaches loss X by a deadline at the least cost. The answer has
three parts, each with an interval at one stated level (`confidence`, 90 % by default):

- **throughput** of N workers: the model with the lowest held-out error on published scaling tables
  (the naive last-efficiency rule, efficiency decay, or the NNLS models of scalelab/costs/fitting.py),
  its band calibrated on them one whole table left out at a time, finite even from two measured
  counts and never beyond linear scaling or below the fewest measured GPUs (scalelab/costs/calibration.py).
- **steps to the threshold** at the layout's global batch B(N): S(B) = S_min (1 + B_noise/B) from
  runs at two or more global batches, or from one run and its measured noise scale
  (scalelab/costs/convergence.py). B(N) follows the series' batch axis: fixed (the global batch is split)
  or growing (every worker keeps its batch, B = b·N).
- **time**: S(B) times the layout's step time at that batch (B · words per sample / throughput),
  plus the start-up and the share of validation, checkpoints and probes the runs measured:
  the wall time from launch to the threshold, which is what is billed. `work` (--work) replaces
  S(B)·B by one fixed amount of work for every layout (the planner's old model), without overheads.

The throughput and steps bands are each taken at 1 − (1 − c)/2 when combined, so the time band
holds with at least c. Recommendations judge a candidate by its band's bad end: "cheapest with at
least c chance of finishing by the deadline" (hours_high within it) and "fastest with at least c
chance of staying within the budget" (dollars_high within it).

`plan(PlanRequest(...))` runs four steps, each a function of its own: `predict` (fit every series,
predict every worker count and global batch), `next_measurement` (the untried worker count where
the models disagree most: query by committee), `price` (candidates: layout x type x market) and
`recommend` (frontier, and the two recommendations).

Costing: for instance type T with g GPUs, N workers take ceil(N/g) instances; throughput on T is
the model's prediction times the per-GPU speed factor of T relative to the measured type, and every
candidate row says what that factor rests on (`speed_basis`: measured, probe, estimate or user;
scalelab/costs/speed.py). Estimates from the catalog's specs have their band widened (`speed_widening`); a
type whose speed has no basis is not priced, and a note says what to give. Dollars come from
costs.billing (per second, 60 s minimum, spot interruptions per instance of each type).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np
import pandas as pd

from scalelab.analysis.report import to_json_records
from scalelab.core.errors import DataError
from scalelab.core.terminal import dollars_text
from scalelab.costs.billing import Mix, RunCost, cost_at_rate, run_cost
from scalelab.costs.calibration import DEFAULT_CONFIDENCE, next_count
from scalelab.costs.catalog import Catalog, CatalogError, InstanceType
from scalelab.costs.convergence import ConvergenceFit, fit_convergence
from scalelab.costs.fitting import FitError, LinkModel, pareto_front
from scalelab.costs.memory import HEADROOM, MemoryModel, overflows
from scalelab.costs.model import FittedSeries
from scalelab.costs.speed import Speed, resolve_speed
from scalelab.costs.steptime import Layout, predict_layouts

__all__ = ["Overheads", "PlanRequest", "Plan", "Candidate", "plan", "predict", "predict_convergence", "next_measurement",
           "resolve_candidate", "price", "recommend", "fitting_candidates", "finishing_candidates", "never_finishing",
           "nearest_never_text", "candidate_text"]


# ---- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Overheads:
    """What a run pays besides its training steps: the start-up (launch to the first step) and
    validation, checkpoints and noise probes as a share of the training time (measured in runs)."""

    startup_s: float = 0.0
    share: float = 0.0

    def wall_s(self, train_s: float) -> float:
        return self.startup_s + train_s * (1.0 + self.share)


RUNS = "the runs"  # PlanRequest.source of measurements read from run directories
NOT_PREDICTED = ": its throughput is not predicted"  # the end of a series' note where it cannot be fitted


@dataclass
class PlanRequest:
    """What to plan: the measurements, the worker counts and batches to predict, what to price.

    `measured` has label, workers, throughput, and optionally nodes, global_batch, batch_scaling
    (fixed | growing), convergence (the label of its series in `convergence`) and
    words_per_sample (throughput units per sample). `convergence` has the runs that reached the
    threshold (costs.convergence.CONVERGENCE_COLUMNS); `predict_batch` the global batches to
    predict steps for. `work` is a fixed amount of work (in the throughput's unit) for every layout
    instead of the steps to the threshold. `speed` maps a GPU model or instance type to its per-GPU
    speed relative to `measured_on`'s GPU; `probe_speed` maps instance types to their measured
    per-GPU throughput (measured_on's included), `precision` is the runs' (fp32, bf16, fp16), what
    speed estimates from GPU specs scale by (scalelab/costs/speed.py). The spot terms go to costs.billing.run_cost
    (interruptions per instance-hour); `deadline_h` and `budget_usd` decide the recommendations.
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
    checkpoint_write_s: float = 0.0
    deadline_h: float | None = None
    budget_usd: float | None = None
    region: str | None = None
    confidence: float = DEFAULT_CONFIDENCE
    convergence: pd.DataFrame | None = None
    predict_batch: Sequence[int] = ()
    overheads: Overheads = field(default_factory=Overheads)
    probe_speed: dict[str, float] | None = None
    precision: str = "fp32"
    memory: dict[str, MemoryModel] = field(default_factory=dict)  # label -> what it trains: GPU memory fit
    layouts: Sequence[Layout] = ()  # named layouts on named instances (NODESxGPUS@INSTANCES, mixed fleets)
    source: str = "the table"  # where `measured` came from (a CSV's name, or RUNS), for the messages

    def base_instance(self) -> InstanceType | None:
        """The instance type the measurements were made on, when it is named and a catalog given."""
        if not (self.catalog and self.measured_on):
            return None
        try:
            return self.catalog.instance(self.measured_on)
        except CatalogError:  # a local variant or cluster without a rate: nothing is priced relative to it
            return None

    def measured_link(self) -> LinkModel:
        """The link model of the measurements: between nodes, the measured instance's network
        when the catalog states it (the fit then calibrates against the link that was used)."""
        link = self.link or LinkModel()
        base = self.base_instance()
        return replace(link, inter_gbps=base.network_gbps) if base is not None and base.network_gbps else link

    def spot_terms(self) -> dict[str, float]:
        return dict(interruptions_per_hour=self.interruptions_per_hour,
                    checkpoint_interval_s=self.checkpoint_interval_s, restart_s=self.restart_s,
                    checkpoint_write_s=self.checkpoint_write_s)

    @property
    def each_level(self) -> float:
        """The level of each of two bands combined into one at `confidence` (Bonferroni)."""
        return 1.0 - (1.0 - self.confidence) / 2


@dataclass
class Plan:
    """Predictions per (series, workers) and per (series, global batch), priced candidates,
    frontier, recommendations."""

    fits: dict[str, FittedSeries]
    predictions: pd.DataFrame
    candidates: pd.DataFrame
    recommendations: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    next_measurement: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    convergence: dict[str, ConvergenceFit] = field(default_factory=dict)
    batch_predictions: pd.DataFrame = field(default_factory=pd.DataFrame)
    confidence: float = DEFAULT_CONFIDENCE
    #: why a type, a market or a series got no price (each also a note): when nothing is priced, these and
    #: only these are the error; the fit's notes (a measured drop, a third count to measure) answer nothing
    unpriced: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per row for --format json and plan.json, each naming its `table`: the
        batch predictions when batches were asked for and the priced candidates when priced (both
        when both were asked for: neither answer hides the other); else the throughput predictions."""
        tables = [("steps_to_threshold", self.batch_predictions), ("candidates", self.candidates)]
        chosen = [(name, t) for name, t in tables if len(t)] or [("throughput", self.predictions)]
        return [{"table": name, **row} for name, t in chosen if len(t) for row in to_json_records(t)]


def plan(request: PlanRequest) -> Plan:
    """Fit and predict, choose the next measurement, price, recommend: the four steps in order. Named
    layouts (`request.layouts`) are predicted by the step-time model and priced and recommended the same way."""
    if request.layouts:
        return _plan_layouts(request)
    convergence, batches, notes = predict_convergence(request)
    unfitted: list[str] = []
    fits, predictions = predict(request, notes, unfitted)
    if not fits and unfitted and not len(batches):  # the arithmetic failed: no second GPU count would help
        raise FitError("; ".join(unfitted))
    if not fits and len(request.measured) and not len(batches):
        # nothing at all can be predicted: that is the error, with what to do about it
        raise DataError(notes[-1].removesuffix(NOT_PREDICTED) + "; measure it at a second GPU count "
                        "(`launch sweep --workers 1,2`, or another row in the CSV)" + _layout_table_hint(request.measured))
    if not len(request.measured) and not len(batches):
        raise DataError("nothing to plan from: no measured throughput (a run that reached its loss threshold inside "
                        "its warm-up measured no speed: run it with fewer --warmup-steps or a lower threshold; a script "
                        "whose steps counted no items has none: pass them, track.step(items=len(batch), ...)) and no "
                        "--predict-batch for the steps to the threshold")
    nxt = _two_count_next(fits, request.predict_workers) or next_measurement(predictions)
    _mark_next(predictions, nxt)
    unpriced: list[str] = []
    candidates, more = price(request, fits, predictions, convergence, unpriced)
    recommendations, last = recommend(candidates, request.deadline_h, request.budget_usd, request.confidence)
    if len(candidates):
        _mark_next(candidates, nxt)
    return Plan(fits, predictions, candidates, recommendations, nxt, notes + more + last, convergence, batches,
                request.confidence, unpriced)


def _layout_table_hint(measured: pd.DataFrame) -> str:
    """For a table of named layouts (a row per series, each with its instance type: seed 004's money-speed
    table), where worker-count series cannot be fitted: how to plan it instead."""
    if "instance_type" not in measured.columns or "label" not in measured.columns:
        return ""
    if measured["label"].value_counts().max() > 1:
        return ""
    r = measured.iloc[0]
    nodes = int(r["nodes"]) if "nodes" in measured.columns and pd.notna(r["nodes"]) else 1
    inst = str(r["instance_type"])
    example = f"{nodes}x{int(r['workers']) // nodes}@" + (inst if any(c in inst for c in "*+") else f"{nodes}*{inst}")
    return (f"; each series of this table is one layout on named instances: plan them with --predict LAYOUTS "
            f"(the step-time model, e.g. --predict {example})")


def _plan_layouts(request: PlanRequest) -> Plan:
    """The plan of named layouts (`launch plan --predict`): each layout's throughput and band from the
    step-time model (scalelab/costs/steptime.py, fitted once), its time for the table's work (or `work`),
    priced by the one dollar rule on the instances it names, and recommended as every candidate is."""
    if request.catalog is None:
        raise CatalogError("predicting layouts on instance types needs a price catalog")
    said: list[str] = []
    request = replace(request, layouts=_distinct_layouts(request.layouts, said))
    rows, notes = predict_layouts(request.measured, request.layouts, request.catalog, request.confidence,
                                  request.source, time_based="time_s" in request.measured.columns)
    notes[:0] = said
    rows = rows.assign(label=request.source)
    if request.work is not None:  # the work given, over the predicted throughput and its band
        rows = rows.assign(predicted_time_s=request.work / rows["predicted_throughput"],
                           time_low_s=request.work / rows["throughput_high"],
                           time_high_s=request.work / rows["throughput_low"], work=request.work)
    if "predicted_time_s" not in rows.columns:
        notes.append("the table gives throughput, not the time of a fixed job: give --work (the job's work in the "
                     "table's unit) to price the layouts")
        return Plan({}, rows, pd.DataFrame(), {}, None, notes, {}, pd.DataFrame(), request.confidence)
    unpriced: list[str] = []
    candidates = pd.DataFrame([row for layout, (_, r) in zip(request.layouts, rows.iterrows())
                               for row in _layout_markets(request, layout, r, notes, unpriced)])
    recommendations, more = recommend(candidates, request.deadline_h, request.budget_usd, request.confidence) \
        if len(candidates) else ({}, [])
    return Plan({}, rows, candidates, recommendations, None, notes + more, {}, pd.DataFrame(), request.confidence,
                unpriced)


def _distinct_layouts(layouts: Sequence[Layout], notes: list[str]) -> list[Layout]:
    """Each layout once, in the order given: the same nodes, GPUs per node, instances (in any order) and
    balance twice were two identical rows of the table and of the frontier. A note says which were merged."""
    seen: dict[tuple, list[Layout]] = {}
    for layout in layouts:
        key = (layout.nodes, layout.gpus_per_node, tuple(sorted(layout.node_types)), layout.balance)
        seen.setdefault(key, []).append(layout)
    for same in seen.values():
        texts = list(dict.fromkeys(s.text for s in same))
        if len(same) > 1:
            notes.append(f"--predict names {texts[0]} {len(same)} times"
                         + (f" (as {', '.join(texts)})" if len(texts) > 1 else "") + ": planned once")
    return [same[0] for same in seen.values()]


def _price_note(name: str, market: str, found: Any) -> str:
    """The note naming a price's source and date: one wording for priced types and named layouts."""
    return (f"price of {name} ({market}): ${found.usd_per_hour:g}/h, {found.source}"
            + (f", observed {found.observed}" if found.observed else ""))


def _note_once(notes: list[str], line: str) -> None:
    if line not in notes:
        notes.append(line)


def _layout_markets(request: PlanRequest, layout: Layout, r: pd.Series, notes: list[str],
                    unpriced: list[str]) -> list[dict[str, Any]]:
    """One candidate row per market of one named layout, dollars by the one rule (costs.billing.run_cost);
    a market without a price is a note, and one of the plan's `unpriced` causes."""
    mix = Mix.parse(layout.instances, request.catalog, nodes=layout.nodes)
    out = []
    for market in request.markets:
        try:
            cost = {k: run_cost(float(r[col]), mix, request.catalog, market, request.region, str(r["label"]),
                                **request.spot_terms())
                    for k, col in (("point", "predicted_time_s"), ("low", "time_low_s"), ("high", "time_high_s"))}
        except CatalogError as exc:
            _note_once(notes, f"{layout.text}: not priced {market}: {exc}")
            _note_once(unpriced, f"{layout.text}: not priced {market}: {exc}")
            continue
        for t in dict.fromkeys(layout.node_types):
            _note_once(notes, _price_note(t, market, request.catalog.price(t, market, request.region)))
        shares = {k: r[k] for k in ("compute_share", "exchange_share", "data_share") if k in r and pd.notna(r[k])}
        out.append({"label": r["label"], "layout": layout.text, "workers": layout.workers, "nodes": layout.nodes,
                    "instances": mix.count(), "instance_type": str(mix), "balance": layout.balance, "market": market,
                    "predicted_time_s": float(r["predicted_time_s"]), "time_low_s": float(r["time_low_s"]),
                    "time_high_s": float(r["time_high_s"]), "work": r.get("work"),
                    "time_basis": "the table's job" if request.work is None else "given work",
                    "model": r["model"], "basis": r.get("basis", "model"),
                    "held_out_error": r.get("held_out_error"), "speed_basis": r.get("speed_basis"), **shares,
                    **_cost_columns(cost)})
    return out


def _cost_columns(cost: dict[str, RunCost]) -> dict[str, Any]:
    """A candidate row's time and money columns from its costs at the prediction and at both ends of its band
    ("point", "low", "high"): named layouts and the worker grid price their rows the same way."""
    point = cost["point"]
    return {"hours": point.hours, "hours_low": cost["low"].hours, "hours_high": cost["high"].hours,
            "usd_per_hour": point.usd_per_hour, "dollars": point.dollars, "dollars_high": cost["high"].dollars,
            "expected_interruptions": point.expected_interruptions, "never_finishes": point.never_finishes}


# ---- 1. fit and predict -------------------------------------------------------------------------


def predict(request: PlanRequest, notes: list[str] | None = None,
            unfitted: list[str] | None = None) -> tuple[dict[str, FittedSeries], pd.DataFrame]:
    """(fit per series, predictions): every series fitted on its own rows and predicted at its
    measured and at the requested worker counts, with its band at `confidence`. A series that
    cannot be fitted (one worker count) is an error, or a note when `notes` is given (other
    series, or its steps to the threshold, can be predicted all the same); one whose fit the arithmetic
    cannot do (FitError: a number overflowed) is also added to `unfitted`, with what to check."""
    measured = request.measured
    if not len(measured):
        return {}, pd.DataFrame()
    if "label" not in measured.columns:
        measured = measured.assign(label="")
    link = request.measured_link()
    base = request.base_instance()
    wanted = {int(w) for w in request.predict_workers}
    fits: dict[str, FittedSeries] = {}
    rows: list[dict[str, Any]] = []
    for label, part in measured.groupby("label", sort=False):
        try:
            fit = FittedSeries.fit(str(label), part, link, base.gpus if base is not None else None)
        except FitError as exc:
            why = (f"{exc}; check its throughput and the link model (gradient {link.gradient_bytes / 1e6:g} MB, "
                   f"--gradient-mb; {link.intra_gbps:g} Gbit/s inside a node, --intra-gbps)")
            if notes is None:
                raise FitError(why) from None
            notes.append(f"{why}{NOT_PREDICTED}")
            if unfitted is not None:
                unfitted.append(why)
            continue
        except DataError as exc:
            if notes is None:
                raise
            notes.append(f"{exc}{NOT_PREDICTED}")
            continue
        fits[str(label)] = fit
        rows += _prediction_rows(fit, wanted, request.confidence, _batch_axis(part), link)
        if notes is not None:
            notes.extend(_two_count_note(fit, wanted) + fit.notes(request.confidence)
                         + _placement_note(fit, wanted, base is not None))
    return fits, pd.DataFrame(rows)


def _placement_note(fit: FittedSeries, wanted: set[int], typed: bool) -> list[str]:
    """Where predicted counts beyond the measured ones were placed, and how to place them otherwise."""
    beyond = sorted(w for w in wanted if w > max(fit.counts))
    if not beyond or typed:
        return []
    multi = int(fit.measured["nodes"].max()) > 1
    where = (f"on nodes of {fit.gpus_per_node} GPUs, as the measurements place them" if fit.gpus_per_node and multi
             else f"on nodes of {fit.gpus_per_node} GPUs, the most measured on one node (a full node)"
             if fit.gpus_per_node else
             "on one node: no measurement spans nodes and no instance type is named")
    return [f"series {fit.label or '(unlabelled)'}: {', '.join(map(str, beyond))} workers are placed {where}; give "
            "--measured-on TYPE or --predict NODESxGPUS to place them otherwise"]


def _two_count_note(fit: FittedSeries, wanted: set[int]) -> list[str]:
    """With two measured GPU counts: where the band comes from and which third count narrows it."""
    third = next_count(fit.measured, wanted)
    if third is None:
        return []
    return [f"series {fit.label or '(unlabelled)'}: measured at two GPU counts only, so its band comes from how "
            f"per-GPU efficiency decays across the published tables (scalelab/costs/calibration.py); measuring "
            f"{third} GPUs would narrow it"]


def _prediction_rows(fit: FittedSeries, wanted: set[int], confidence: float, axis: dict[str, Any],
                     link: LinkModel | None = None) -> list[dict[str, Any]]:
    """One row per measured layout (workers, nodes) and per wanted worker count of one series, with its
    interval: two layouts of one count (1x4 and 2x2) are two rows, each answered by its own measurement."""
    measured = {(int(w), int(n)) for w, n in zip(fit.measured["workers"], fit.measured["nodes"])}
    pairs = sorted(measured | {(w, fit.nodes_for(w)) for w in wanted if w not in {m for m, _ in measured}})
    grid, nodes = [w for w, _ in pairs], [n for _, n in pairs]
    band = fit.estimate(grid, nodes, confidence, link)
    gap = fit.disagreement(grid, nodes)
    rows = []
    for i, w in enumerate(grid):
        same = (fit.measured["workers"] == w) & (fit.measured["nodes"] == nodes[i])
        meas = fit.measured[same]["throughput"]
        b = band.iloc[i]
        rows.append({
            "label": fit.label, "workers": w, "nodes": nodes[i], "batch_scaling": axis["batch_scaling"],
            "global_batch": _global_batch(axis, w),
            "predicted_throughput": float(b["predicted"]), "interval_low": float(b["low"]),
            "interval_high": float(b["high"]), "model": b["model"], "basis": b["basis"],
            "held_out_error": float(b["held_out_error"]),
            "measured_throughput": float(meas.mean()) if len(meas) else None,
            "disagreement": float(gap[i]) if np.isfinite(gap[i]) else None,
            "predicted": w in wanted,
        })
    return rows


def _batch_axis(part: pd.DataFrame) -> dict[str, Any]:
    """How the global batch of a series changes with its workers: batch_scaling (fixed, growing
    or None when not known), the batch (fixed) or the batch per worker (growing), the convergence
    series it belongs to and its throughput units per sample."""
    def one(column: str) -> Any:
        vals = part[column].dropna() if column in part.columns else pd.Series(dtype=object)
        return vals.mode().iloc[0] if len(vals) else None
    scaling, batch = one("batch_scaling"), None
    if "global_batch" in part.columns and part["global_batch"].notna().any():
        per = (part["global_batch"] / part["workers"]) if scaling == "growing" else part["global_batch"]
        batch = float(pd.to_numeric(per, errors="coerce").median())
    return {"batch_scaling": scaling, "batch": batch, "convergence": one("convergence"),
            "words_per_sample": one("words_per_sample")}


def _global_batch(axis: dict[str, Any], workers: int) -> int | None:
    """The global batch of `workers` workers on the series' batch axis (None when not known)."""
    if axis["batch"] is None:
        return None
    return int(round(axis["batch"] * workers)) if axis["batch_scaling"] == "growing" else int(round(axis["batch"]))


def threshold_fix(source: str) -> str:
    """How to give the plan steps to a loss threshold, said for where its measurements came from: a user
    planning from a CSV has no runs to rerun with other flags."""
    if source == RUNS:
        return "run them with --val-every N --loss-threshold X until it is reached"
    return ("a scaling table has none; plan from a convergence table (columns global_batch, steps_to_threshold) "
            "or from runs that reached a --loss-threshold")


def predict_convergence(request: PlanRequest) -> tuple[dict[str, ConvergenceFit], pd.DataFrame, list[str]]:
    """(S(B) fit per convergence series, rows at the requested global batches, notes)."""
    fits: dict[str, ConvergenceFit] = {}
    notes: list[str] = []
    conv = request.convergence
    if conv is None or not len(conv):
        if request.predict_batch:
            notes.append(f"no steps to a loss threshold in {request.source}, so they cannot be predicted at a "
                         f"global batch: {threshold_fix(request.source)}")
        return fits, pd.DataFrame(), notes
    for label, part in conv.groupby("label", sort=False):
        fits[str(label)] = fit_convergence(part, request.confidence, str(label))
    rows = [fit.predict(list(request.predict_batch)) for fit in fits.values()] if request.predict_batch else []
    return fits, pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(), notes


# ---- 2. the next measurement --------------------------------------------------------------------


#: the least disagreement between the models worth a measurement: models within 1 % of each other
#: leave nothing for one to settle (it once said "the models disagree most there (0% apart)")
MIN_DISAGREEMENT = 0.01


def next_measurement(predictions: pd.DataFrame) -> dict[str, Any] | None:
    """The untried (series, workers) where the models disagree most, or None (query by committee:
    measuring it settles which model to trust; nothing to settle where they agree)."""
    untried = predictions[predictions["measured_throughput"].isna()] if len(predictions) else predictions
    if not len(untried) or not (untried["disagreement"] >= MIN_DISAGREEMENT).any():
        return None
    r = untried.loc[untried["disagreement"].idxmax()]
    return {"label": r["label"], "workers": int(r["workers"]), "disagreement": float(r["disagreement"]),
            "why": f"the models disagree most there ({r['disagreement']:.0%} apart); measuring it "
                   "tells which one to trust"}


def _two_count_next(fits: dict[str, FittedSeries], wanted: Sequence[int]) -> dict[str, Any] | None:
    """With a series measured at two GPU counts only, the third count its note names (the band comes from
    the corpus's efficiency decay, not from models that could disagree): one answer, said alike twice."""
    for label, fit in fits.items():
        third = next_count(fit.measured, wanted)
        if third is not None:
            return {"label": label, "workers": third, "disagreement": None,
                    "why": "the series is measured at two GPU counts only: a third shows whether per-GPU "
                           "efficiency keeps decaying, and narrows every band"}
    return None


def _mark_next(rows: pd.DataFrame, nxt: dict[str, Any] | None) -> None:
    """Add the column next_measurement: true on the rows of the suggested (series, workers)."""
    rows["next_measurement"] = False
    if nxt is not None:
        rows.loc[(rows["label"] == nxt["label"]) & (rows["workers"] == nxt["workers"]), "next_measurement"] = True


# ---- 3. price -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One instance type as a plan prices it, resolved from the catalog once (`resolve_candidate`):
    its shape (GPUs, GPU memory, network), its per-GPU speed relative to the measured type with
    what that rests on, the link its nodes exchange over, the price of one instance in each market
    that has one, and its spot interruption rate. Every candidate row of the type is made from this
    object; nothing after it reads the catalog."""

    instance: InstanceType
    speed: Speed
    link: LinkModel  # the measured link, between nodes over this type's network when the catalog states it
    usd_per_hour: dict[str, float]  # market -> price of one instance; a market without a price is absent
    interruptions_per_hour: float  # spot interruptions per hour of one instance
    region: str

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def gpus(self) -> int:
        return self.instance.gpus

    @property
    def gpu_mem_gib(self) -> float | None:
        return self.instance.gpu_mem_gib

    def instances_for(self, workers: int) -> int:
        """Instances that hold `workers` workers, one per GPU."""
        return math.ceil(workers / self.gpus)


def resolve_candidate(request: PlanRequest, name: str, notes: list[str],
                      unpriced: list[str] | None = None) -> Candidate | None:
    """`name` resolved once for pricing: shape, speed, link, prices, interruptions; None (with a note
    saying what to give) when its speed has no basis. A market without a price is left out of
    `usd_per_hour` with the catalog's note (how to get that price). Each reason for no price also goes
    to `unpriced` (`Plan.unpriced`)."""
    catalog = request.catalog
    inst = catalog.instance(name)
    speed = _speed_factor(request, inst)
    why = unpriced if unpriced is not None else []
    if isinstance(speed, str):
        _note_once(notes, speed)
        _note_once(why, speed)
        return None
    if speed.note and speed.note not in notes:
        notes.append(speed.note)
    prices = {}
    for market in request.markets:
        try:
            found = catalog.price(name, market, request.region)
        except CatalogError as exc:
            _note_once(notes, str(exc))
            _note_once(why, str(exc))
            continue
        prices[market] = found.usd_per_hour
        notes.append(_price_note(name, market, found))
    measured = request.measured_link()
    return Candidate(inst, speed, replace(measured, inter_gbps=inst.network_gbps or measured.inter_gbps), prices,
                     catalog.interruption_rate(name, request.interruptions_per_hour), request.region or catalog.region)


def price(request: PlanRequest, fits: dict[str, FittedSeries], predictions: pd.DataFrame,
          convergence: dict[str, ConvergenceFit] | None = None,
          unpriced: list[str] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """(candidates, notes): every predicted (series, workers) on every instance type x market, with
    hours and dollars to the threshold (or for `work`). A series with neither is not priced; a
    type whose per-GPU speed is unknown, or a market without a price, is left out with a note
    saying what to give (also added to `unpriced`)."""
    notes: list[str] = []
    unpriced = unpriced if unpriced is not None else []
    if request.instance_types and request.catalog is None:
        raise CatalogError("pricing candidates needs a price catalog")
    rows: list[dict[str, Any]] = []
    resolved: dict[str, Candidate | None] = {}  # each type resolved once, when first priced
    for label, fit in fits.items():
        steps = _steps_of(request, predictions[predictions["label"] == label], convergence or {}, notes, unpriced)
        if steps is None:
            continue
        for name in request.instance_types:
            if name not in resolved:
                resolved[name] = resolve_candidate(request, name, notes, unpriced)
            if resolved[name] is not None:
                rows += _price_type(request, resolved[name], fit, steps)
    return pd.DataFrame(rows), notes


def _steps_of(request: PlanRequest, predictions: pd.DataFrame, convergence: dict[str, ConvergenceFit],
              notes: list[str], unpriced: list[str]) -> pd.DataFrame | None:
    """Per predicted worker count of one series: the work to do (in throughput units) and its band,
    from `work` or from S(B) at the layout's global batch; None (with a note) when neither is known."""
    out = predictions[["label", "workers", "nodes", "global_batch", "measured_throughput"]].copy()
    if request.work is not None:
        return out.assign(work=request.work, work_low=request.work, work_high=request.work, steps_to_threshold=None,
                          steps_high=None, time_basis="given work")
    label = str(out["label"].iloc[0])
    measured = request.measured
    axis = _batch_axis(measured[measured["label"] == label] if "label" in measured.columns else measured)
    fit = convergence.get(str(axis["convergence"]))
    if fit is None or axis["words_per_sample"] is None or out["global_batch"].isna().any():
        if request.instance_types:
            why = (f"series {label or '(unlabelled)'}: no steps to a loss threshold measured for it; give "
                   "--work (its work in the throughput unit, e.g. words) to price it")
            notes.append(why)
            unpriced.append(why)
        return None
    fit = replace(fit, confidence=request.each_level)
    batch = out["global_batch"].to_numpy(dtype=float)
    point, low, high = fit.steps(batch)
    per_step = batch * float(axis["words_per_sample"])
    return out.assign(work=point * per_step, work_low=low * per_step, work_high=high * per_step,
                      steps_to_threshold=point, steps_high=high, time_basis=f"steps to threshold ({fit.basis})")


def _price_type(request: PlanRequest, cand: Candidate, fit: FittedSeries, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Candidate rows of one series on one instance type: the throughput predicted over its network, scaled
    by its GPU's speed, one row per layout the type can run (`_placements`): each worker count packed onto
    ceil(workers / GPUs) instances, and a measured layout of this very type as it was measured (2x2 on
    g3.16xlarge: two instances, half their GPUs idle), answered by its measurement."""
    level = request.confidence if request.work is not None else request.each_level
    rows: list[dict[str, Any]] = []
    for st, nodes, count, here in _placements(request, cand, fit, steps):
        w = int(st["workers"])
        speed = Speed(1.0, "measured", 1.0) if here else cand.speed  # measured on this type: no conversion
        band = fit.estimate([w], [nodes], level, cand.link).iloc[0]
        thr = float(band["predicted"]) * speed.factor
        lo = float(band["low"]) * speed.factor / speed.widening
        hi = float(band["high"]) * speed.factor * speed.widening
        layout = {"label": fit.label, "workers": w, "nodes": nodes, "instance_type": cand.name, "instances": count,
                  "idle_gpus": 0 if cand.instance.per_gpu else count * cand.gpus - w,
                  "global_batch": st["global_batch"]}
        estimate = {"predicted_throughput": thr, "interval_low": lo, "interval_high": hi,
                    "model": band["model"], "basis": band["basis"], "held_out_error": float(band["held_out_error"]),
                    "steps_to_threshold": st["steps_to_threshold"], "steps_high": st["steps_high"],
                    "work": float(st["work"]), "time_basis": st["time_basis"], "speed_basis": speed.basis,
                    "speed_factor": speed.factor, "speed_widening": speed.widening, "measured": here,
                    **_memory_fit(request, cand, fit.label, w, st["global_batch"])}
        seconds = {"point": st["work"] / thr, "low": st["work_low"] / max(hi, 1e-300),
                   "high": st["work_high"] / max(lo, 1e-300)}
        rows += _market_rows(request, cand, layout, estimate, seconds)
    return rows


def _placements(request: PlanRequest, cand: Candidate, fit: FittedSeries,
                steps: pd.DataFrame) -> list[tuple[pd.Series, int, int, bool]]:
    """(step row, nodes, instances, measured here) of every distinct layout of `cand` for the series' worker
    counts. A step row of a layout measured on this type that the type can hold as measured keeps its nodes;
    any other is packed (its row of the packed layout, where one exists, answers it). Before, every measured
    layout of a count was priced on every type: three rows "4 workers on 4*g3.4xlarge", one of them with the
    1x4 of a g3.16xlarge, recommended as measured."""
    on = _measured_types(request, fit)
    chosen: dict[tuple[int, int], tuple[pd.Series, int, int, bool]] = {}
    for _, st in steps.iterrows():
        w, n = int(st["workers"]), int(st["nodes"])
        measured = pd.notna(st["measured_throughput"]) and _measured_on(on, w, n, cand)
        if measured and cand.instance.holds(w, n):
            key = (w, n)
            count = cand.instances_for(w) if cand.instance.per_gpu else n
            chosen[key] = (st, n, count, True)
            continue
        count = cand.instances_for(w)
        nodes = fit.nodes_for(w) if cand.instance.per_gpu else count  # a GPU-hour rate has no nodes to fill
        key = (w, nodes)
        if key not in chosen:
            same = steps[(steps["workers"] == w) & (steps["nodes"] == nodes)]
            chosen[key] = (same.iloc[0] if len(same) else st, nodes, count, False)
    return [chosen[k] for k in sorted(chosen)]


def _measured_types(request: PlanRequest, fit: FittedSeries) -> dict[tuple[int, int], set[str]] | None:
    """(workers, nodes) -> the instance types the series measured it on, from the table's `instance_type`
    column; None when the table names none (every row is then on the measured type, `measured_on`)."""
    m = request.measured
    if "instance_type" not in m.columns:
        return None
    part = m[m["label"] == fit.label] if "label" in m.columns else m
    if part["instance_type"].isna().all():
        return None
    out: dict[tuple[int, int], set[str]] = {}
    nodes = part["nodes"] if "nodes" in part.columns else pd.Series(1, index=part.index)
    for w, n, t in zip(part["workers"], nodes, part["instance_type"]):
        if pd.notna(t):
            out.setdefault((int(w), int(n)), set()).add(str(t))
    return out


def _measured_on(on: dict[tuple[int, int], set[str]] | None, workers: int, nodes: int, cand: Candidate) -> bool:
    """Whether layout workers x nodes was measured on `cand`'s type: as the table's row says, or (a table that
    names no type) when `cand` is the measured type."""
    if on is None:
        return cand.speed.basis == "measured"
    return cand.name in on.get((workers, nodes), set())


def _memory_fit(request: PlanRequest, cand: Candidate, label: str, workers: int, global_batch: Any) -> dict[str, Any]:
    """The predicted peak memory of one rank of this layout and whether it fits the type's GPUs
    (scalelab/costs/memory.py); nothing when the series' model or the GPU's memory is unknown."""
    model = request.memory.get(label)
    if model is None or not cand.gpu_mem_gib or pd.isna(global_batch):
        return {}
    peak = model.peak(max(1, math.ceil(float(global_batch) / workers)))
    return {"peak_mem_gib": peak.peak_gib, "fits_memory": peak.fits(float(cand.gpu_mem_gib))}


def _market_rows(request: PlanRequest, cand: Candidate, layout: dict[str, Any], estimate: dict[str, Any],
                 train_s: dict[str, float]) -> list[dict[str, Any]]:
    """One candidate row per market with a price: hours and dollars of the wall time (training
    seconds plus the measured overheads, unless a fixed work was given), at the prediction and at
    both ends of its band (hours_low, hours_high, dollars_high)."""
    count = layout["instances"]
    over = request.overheads if request.work is None else Overheads()
    spot = {k: v for k, v in request.spot_terms().items() if k != "interruptions_per_hour"}
    instances, rows = str(Mix(((count, cand.name),))), []
    wall = {k: over.wall_s(v) if math.isfinite(v) else v for k, v in train_s.items()}  # the same in every market
    for market, usd in cand.usd_per_hour.items():
        cost = {k: cost_at_rate(v, instances, count * cand.gpus, count * usd, market, cand.region, layout["label"],
                                count * cand.interruptions_per_hour, **spot)
                for k, v in wall.items()}
        rows.append({**layout, "market": market, **estimate, **_cost_columns(cost)})
    return rows


def _speed_factor(request: PlanRequest, inst: InstanceType) -> Speed | str:
    """Per-GPU speed of `inst` relative to the measured type, with its basis (measured, probe,
    estimate, user), or the reason it has none (scalelab/costs/speed.py: never assumed equal silently)."""
    return resolve_speed(inst, request.base_instance(), request.catalog, request.speed or {},
                         request.probe_speed or {}, request.precision)


# ---- 4. recommend -------------------------------------------------------------------------------


def recommend(candidates: pd.DataFrame, deadline_h: float | None, budget_usd: float | None,
              confidence: float = DEFAULT_CONFIDENCE) -> tuple[dict[str, dict[str, Any] | None], list[str]]:
    """(recommendations, notes): the cheapest candidate with at least `confidence` chance of
    finishing within the deadline (the high end of its time band within it) and the fastest with
    that chance of staying within the budget (dollars_high), or without either the cheapest and
    the fastest overall, every one judged and ranked by its band's bad end (hours_high, dollars_high).
    Adds the columns pareto (on the frontier of those bad ends, among the layouts that fit their GPUs)
    and recommendation (why a row is recommended) to `candidates`."""
    recs: dict[str, dict[str, Any] | None] = {}
    notes: list[str] = []
    if not len(candidates):
        return recs, notes
    candidates["recommendation"] = None
    candidates["pareto"] = False
    sure = f"{confidence:.0%}"
    notes.extend(_memory_notes(candidates))
    everything, candidates = candidates, fitting_candidates(candidates)  # a layout that does not fit is never recommended
    if candidates.empty:
        notes.append("no layout fits its GPUs' memory: nothing to recommend; use a smaller batch per rank or GPUs "
                     "with more memory (`launch memory`)")
        return recs, notes
    notes.extend(_never_notes(candidates))
    candidates = finishing_candidates(candidates)  # one that never finishes (spot at its rate) is never recommended either
    if candidates.empty:  # each recommendation asked is None: the answer says why none finishes (costs/cli.py)
        for key, limit in (("cheapest_within_deadline", deadline_h), ("fastest_within_budget", budget_usd)):
            if limit is not None:
                recs[key] = None
        if deadline_h is None and budget_usd is None:
            recs["cheapest"] = recs["fastest"] = None
        return recs, notes
    # the frontier of what the recommendations judge: the bad ends of the bands, among the layouts that fit
    candidates["pareto"] = pareto_front(candidates["hours_high"], candidates["dollars_high"])
    everything.loc[candidates.index, "pareto"] = candidates["pareto"]
    limits = (  # (recommendation, column judged, its limit, best by, why there is none)
        ("cheapest_within_deadline", "hours_high", deadline_h, "dollars_high", lambda: f"no layout finishes within "
         f"{deadline_h:g} h with {sure} confidence; the surest takes up to {candidates['hours_high'].min():.2f} h"),
        ("fastest_within_budget", "dollars_high", budget_usd, "hours_high", lambda: f"no layout costs at most "
         f"${budget_usd:,.2f} with {sure} confidence; the surest costs up to "
         f"${dollars_text(candidates['dollars_high'].min())}"),
    )
    for key, column, limit, by, why_none in limits:
        if limit is not None:
            tag = f"{key.replace('_', ' ')} ({sure} sure)"
            recs[key] = _pick(candidates, candidates[candidates[column] <= limit], by, tag)
            if recs[key] is None:
                notes.append(why_none())
    if deadline_h is None and budget_usd is None:  # judged by the band's bad end, as under a limit
        recs["cheapest"] = _pick(candidates, candidates, "dollars_high", f"cheapest ({sure} sure)")
        recs["fastest"] = _pick(candidates, candidates, "hours_high", f"fastest ({sure} sure)")
    notes.extend(_unmeasured_notes(recs))
    everything.loc[candidates.index, "recommendation"] = candidates["recommendation"]
    return recs, notes


def finishing_candidates(candidates: pd.DataFrame) -> pd.DataFrame:
    """The rows with a finite time and price at their band's bad end. Why: on spot at 10 interruptions an hour
    every layout's time was infinite, and one was recommended as the cheapest (and crashed the answer's line)."""
    finite = np.isfinite(pd.to_numeric(candidates["hours_high"], errors="coerce").astype(float)) \
        & np.isfinite(pd.to_numeric(candidates["dollars_high"], errors="coerce").astype(float))
    return candidates[finite].copy()


def never_finishing(candidates: pd.DataFrame) -> pd.DataFrame:
    """The candidates that never finish on spot at their interruption rate (`billing.spot_stall`), fewest
    instances first: the first is the nearest to finishing, and its reason names the rate that would let it."""
    if "never_finishes" not in candidates.columns:
        return candidates.iloc[:0]
    stalled = candidates[candidates["never_finishes"].map(lambda v: isinstance(v, str) and bool(v))]
    return stalled.sort_values(["instances", "workers"], kind="stable")


def candidate_text(row: Any) -> str:
    """A candidate in words: its named layout, or its workers on their instances (the answer's wording)."""
    if isinstance(row.get("layout"), str) and row.get("layout"):
        return str(row["layout"])
    workers = int(row["workers"])
    return f"{workers} worker{'' if workers == 1 else 's'} on {row['instances']}*{row['instance_type']}"


def nearest_never_text(stalled: pd.DataFrame) -> str:
    """The first of `never_finishing`'s rows in words, with its reason and way out (the plan's note and the
    answer's line both say it)."""
    first = stalled.iloc[0]
    return f"the one with the fewest instances, {candidate_text(first)} {first['market']}, {first['never_finishes']}"


def _never_notes(candidates: pd.DataFrame) -> list[str]:
    """One note where layouts never finish on spot: how many, and the nearest one's reason and way out."""
    stalled = never_finishing(candidates)
    if not len(stalled):
        return []
    return [f"{len(stalled)} of {len(candidates)} priced layouts never finish and are never recommended; "
            f"{nearest_never_text(stalled)}"]


def fitting_candidates(candidates: pd.DataFrame) -> pd.DataFrame:
    """The rows whose ranks fit their GPUs' memory (or whose fit is unknown)."""
    if "fits_memory" not in candidates.columns:
        return candidates
    return candidates[~candidates["fits_memory"].map(overflows)].copy()


def _memory_notes(candidates: pd.DataFrame) -> list[str]:
    """One note per instance type whose GPUs some layouts would overflow."""
    if "fits_memory" not in candidates.columns:
        return []
    out = []
    short = candidates[candidates["fits_memory"].map(overflows)]
    for name, rows in short.groupby("instance_type", sort=True):
        worst = rows.sort_values("workers").iloc[0]
        out.append(f"{name}: {len(rows)} layout(s) do not fit its GPUs' memory and are never recommended (predicted "
                   f"peak {worst['peak_mem_gib']:.1f} GiB per rank at {int(worst['workers'])} worker(s), over "
                   f"{HEADROOM:.0%} of the GPU's; `launch memory` shows the fit per batch)")
    return out


def _unmeasured_notes(recs: dict[str, dict[str, Any] | None]) -> list[str]:
    """A note per recommendation that rests on a type whose speed was not measured."""
    out = []
    for key, rec in recs.items():
        if rec is not None and rec.get("speed_basis") not in (None, "measured", "probe"):
            out.append(f"{key.replace('_', ' ')}: {rec.get('instance_type') or rec.get('layout')}'s speed is not measured on this job "
                       f"({rec['speed_basis']}); probe it (launch probe) before relying on it")
    return out


def _pick(all_rows: pd.DataFrame, ok: pd.DataFrame, by: str, tag: str) -> dict[str, Any] | None:
    """The best row of `ok` by `by` (ties: the other measure), tagged in `all_rows`; None if none."""
    if ok.empty:
        return None
    other = "hours" if by.startswith("dollars") else "dollars"
    idx = ok.sort_values([by, other], kind="stable").index[0]
    prev = all_rows.at[idx, "recommendation"]
    all_rows.at[idx, "recommendation"] = tag if prev is None else f"{prev}; {tag}"

    return to_json_records(all_rows.loc[[idx]].drop(columns=["recommendation"]))[0]
