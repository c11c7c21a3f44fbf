"""Judge the planner on a probe directory (`launch probe`): fit on some of its runs, predict the
others, and say how far off each prediction was and whether its band held (issue 15's "probe two
types that differ and predict layouts of each").

    python -m scalelab.costs.validation --probe PROBE_DIR [--confidence 0.9] [--format json|markdown]
    scripts/validate-probe.sh                  (runs a local probe, then this)

A probe measures every candidate on 1x1, 1xG and 2xG (scalelab/launcher/probe.py). Three tasks, each
through the code `launch plan` runs (costs.measurements' reading of run directories, costs.planner,
costs.steptime), never a re-implementation of it:

- **own**: a type's own 1x1 and 1xG runs fitted (the planner's scaling models), its 2xG predicted;
- **cross**: one type's every run plus the other type's 1x1 run (a probe: `speed_basis` probe, its
  per-GPU speed over the fitted type's), the other type's 1xG and 2xG predicted;
- **steptime**: the same split with the step-time model (compute per type from its 1x1, exchange
  per link class from the fitted type's multi-GPU runs), as `launch plan --from-csv F --predict`.

Candidates outside the catalog (local variants, Slurm GPU types) get a node-hour rate of the
candidate's GPUs per instance, so an "instance" holds the probe's G workers; prices do not enter
any prediction. Each row: measured and predicted words/s, its band at `confidence`, the relative
error (predicted / measured − 1) and whether the measured value lies in the band.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from scalelab.analysis.results import summarize_loaded
from scalelab.analysis.scaling import step_table
from scalelab.core.errors import DataError, RecordError, shell_word
from scalelab.core.rundir import read_json
from scalelab.core.spec import BATCH_SCALING
from scalelab.core.records import load_run
from scalelab.costs.catalog import Catalog, builtin_catalog
from scalelab.costs.measurements import measured_from_runs
from scalelab.costs.planner import PlanRequest, plan
from scalelab.costs.steptime import parse_fleet_layouts, predict_layouts

__all__ = ["probe_runs", "probe_catalog", "evaluate_probe", "probe_summary"]

PROBE_FILE = "probe.json"  # launcher.probe.PROBE_FILE (launcher sits above costs)


def probe_runs(probe_dir: Path) -> pd.DataFrame:
    """One row per run of the probe with step records: type, gpus per instance, layout, run_dir,
    words/s, global batch, batch axis, median step time and its p90/p10 spread."""
    probe_dir = Path(probe_dir)
    if not (probe_dir / PROBE_FILE).exists():
        raise DataError(f"{probe_dir}: no {PROBE_FILE}; give a directory `launch probe` made")
    rows = []
    for cand in read_json(probe_dir / PROBE_FILE, "probe file")["candidates"]:
        for name in cand["runs"]:
            run_dir = probe_dir / name
            try:
                run = load_run(run_dir)
                s = summarize_loaded(run)
            except RecordError:  # never started, or no step yet: nothing to judge against
                continue
            rows.append({"instance_type": cand["name"], "gpus": int(cand["gpus"]), "layout": f"{s.nodes}x{s.gpus_per_node}",
                         "workers": s.workers, "nodes": s.nodes, "run_dir": run_dir, "throughput": s.words_per_s,
                         "global_batch": s.global_batch,
                         "batch_scaling": BATCH_SCALING[run.spec.batch_mode], **_spread(run)})
    if not rows:
        raise DataError(f"{probe_dir}: no probe run has step records; `launch resume {shell_word(probe_dir)}` runs them")
    return pd.DataFrame(rows)


def _spread(run) -> dict[str, float]:
    """The run's median measured step time and its p90/p10 ratio: how steady the machine was."""
    st = step_table(run.steps)
    t = st.loc[~st["warmup"].astype(bool), "t_step"].dropna()
    if not len(t):
        return {"step_s_median": math.nan, "step_p90_over_p10": math.nan}
    return {"step_s_median": float(t.median()), "step_p90_over_p10": float(t.quantile(0.9) / t.quantile(0.1))}


def probe_catalog(runs: pd.DataFrame) -> Catalog:
    """The built-in catalog plus a node-hour rate (of its GPUs per instance) for every candidate it lacks."""
    cat = builtin_catalog()
    for name, gpus in runs.groupby("instance_type")["gpus"].first().items():
        if name not in cat.instances:
            cat.add_rate(name, 1.0, "node-hour", int(gpus))
    return cat


def _row(task: str, fit: str, target: pd.Series, basis: str, model: str, pred: float, low: float, high: float) -> dict:
    measured = float(target["throughput"])
    return {"task": task, "fit": fit, "instance_type": target["instance_type"], "layout": target["layout"],
            "speed_basis": basis, "model": model, "measured": measured, "predicted": pred, "low": low, "high": high,
            "error": pred / measured - 1, "covered": bool(low <= measured <= high)}


def _planned(fit_runs: pd.DataFrame, base: str, targets: pd.DataFrame, cat: Catalog, confidence: float,
             task: str) -> list[dict]:
    """Predict `targets` (runs of one type) with `launch plan`'s own path: read the fit runs'
    directories, fit on `base`'s, price the targets' type at the probes' speed."""
    m = measured_from_runs(list(fit_runs["run_dir"]), base)
    itype = str(targets["instance_type"].iloc[0])
    result = plan(PlanRequest(m.measured, sorted(int(w) for w in targets["workers"]), cat, [itype], work=1.0,
                              measured_on=m.measured_on, confidence=confidence, probe_speed=m.probe_speed,
                              precision=m.precision))
    cands = result.candidates
    fit = ", ".join(f"{t} {lay}" for t, lay in zip(fit_runs["instance_type"], fit_runs["layout"]))
    out = []
    for _, t in targets.iterrows():
        c = cands[(cands["instance_type"] == itype) & (cands["workers"] == t["workers"])].iloc[0]
        out.append(_row(task, fit, t, c["speed_basis"], c["model"], float(c["predicted_throughput"]),
                        float(c["interval_low"]), float(c["interval_high"])))
    return out


def _steptime(fit_runs: pd.DataFrame, targets: pd.DataFrame, cat: Catalog, confidence: float) -> list[dict]:
    """Predict `targets` with the step-time model fitted on `fit_runs` (`launch plan --predict`);
    a layout it refuses (a link class the fit runs never crossed) is left out."""
    table = fit_runs[["instance_type", "workers", "nodes", "throughput", "global_batch", "batch_scaling"]]
    fit = ", ".join(f"{t} {lay}" for t, lay in zip(fit_runs["instance_type"], fit_runs["layout"]))
    out = []
    for _, t in targets.iterrows():
        try:
            rows, _ = predict_layouts(table.assign(label="probe"), parse_fleet_layouts(f"{t['layout']}@{t['instance_type']}", cat),
                                      cat, confidence, "probe", time_based=False)
        except DataError:
            continue
        r = rows.iloc[0]
        out.append(_row("steptime", fit, t, r["speed_basis"], r["model"], float(r["predicted_throughput"]),
                        float(r["throughput_low"]), float(r["throughput_high"])))
    return out


def evaluate_probe(runs: pd.DataFrame, confidence: float = 0.9) -> pd.DataFrame:
    """Every prediction of the three tasks (module doc), one row each."""
    cat = probe_catalog(runs)
    types = list(dict.fromkeys(runs["instance_type"]))
    out: list[dict] = []
    for t in types:
        own = runs[runs["instance_type"] == t].sort_values("workers")
        if own["workers"].nunique() >= 3:
            out += _planned(own.iloc[:-1], t, own.iloc[-1:], cat, confidence, "own")
    for a in types:
        for b in (x for x in types if x != a):
            theirs = runs[runs["instance_type"] == b].sort_values("workers")
            probe, targets = theirs.iloc[:1], theirs.iloc[1:]
            fit = pd.concat([runs[runs["instance_type"] == a], probe])
            if len(targets):
                out += _planned(fit, a, targets, cat, confidence, "cross")
                out += _steptime(fit, targets, cat, confidence)
    return pd.DataFrame(out)


def probe_summary(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Per task: predictions, mean absolute error, coverage, median relative half-width of the band
    (an unbounded band counts as covered and has an infinite half-width)."""
    out = []
    for task, part in rows.groupby("task", sort=False):
        half = ((part["high"] - part["low"]) / 2 / part["predicted"]).median()
        out.append({"task": task, "predictions": len(part), "mean_abs_error": float(part["error"].abs().mean()),
                    "coverage": float(part["covered"].mean()),
                    "median_half_width": float(half) if math.isfinite(half) else None})
    return out
