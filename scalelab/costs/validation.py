"""Judge the steps-to-threshold predictions on runs kept out of their fit (scripts/validate-planner.sh),
and the step-time model on seed 004's money table (`steptime_bench`).

    python -m scalelab.costs.validation RUNS_DIR [--confidence 0.9] [--csv FILE]
    python -m scalelab.costs.validation --steptime [--confidence 0.9]
    python -m scalelab.costs.validation --probe PROBE_DIR [--format markdown]   (scalelab/costs/probe_validation.py)

RUNS_DIR holds `batch/MODEL/wW/bB-sS/` (one run each: batch sweeps at one and two workers) and
`weak/MODEL/sS/` (weak-scaling sweeps). Three tasks, each prediction compared with every run of
the predicted batch (one per seed):

- **batch-fit**: fit S(B) on the runs at the two smallest batches of a sweep, predict the others;
- **noise-scale**: from the runs at the smallest batch and their measured noise scale alone;
- **weak sweep**: the steps of a weak-scaling sweep (global batch 16·N on N workers) from the
  single-worker batch sweep (both bases).

Prints the rows and a summary (mean absolute error, coverage, median half-width) as JSON: `summary`
over the independent held-out predictions only (`independent`: the two-worker runs and the weak
sweeps repeat the one-worker runs' steps), `summary_all_rows` over every row as before; and
`--csv` writes the convergence table of every run (the format `launch plan --from-csv` reads).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import pandas as pd

from scalelab.analysis.report import _jsonable
from scalelab.analysis.results import summarize_loaded
from scalelab.core.errors import DataError, RecordError
from scalelab.core.records import load_run
from scalelab.costs.calibration import (band_spread, calibrate, conformal_quantile, coverage, coverage_summary,
                                        interior_coverage)
from scalelab.costs.catalog import Catalog, builtin_catalog
from scalelab.costs.convergence import fit_convergence
from scalelab.costs.steptime import choose, corpus_band, fit_layout_model, prepare
from scalelab.costs.tables import read_scaling_csv

__all__ = ["collect", "evaluate", "independent", "summary", "planner_bench", "BENCH_LEVELS", "steptime_split",
           "steptime_loo", "steptime_bench"]

_COLUMNS = ["label", "model", "workers", "global_batch", "seed", "steps_to_threshold", "noise_scale", "lr",
            "lr_warmup_steps"]


def collect(runs_dir: Path) -> pd.DataFrame:
    """One row per finished run under RUNS_DIR that reached its threshold (module doc: the layout)."""
    rows = []
    for spec in sorted(Path(runs_dir).glob("*/*/**/summary.json")):  # finished runs only
        run = load_run(spec.parent)
        s = summarize_loaded(run)
        if not s.steps_to_threshold:
            continue
        kind = spec.relative_to(runs_dir).parts[0]
        sweep = f"{kind} {s.model} w{s.workers}" if kind == "batch" else f"weak {s.model}"
        rows.append({"label": sweep, "model": s.model, "workers": s.workers, "global_batch": s.global_batch,
                     "seed": run.spec.seed, "steps_to_threshold": s.steps_to_threshold, "noise_scale": s.noise_scale,
                     "lr": s.lr, "lr_warmup_steps": s.lr_warmup_steps})
    return pd.DataFrame(rows, columns=_COLUMNS)


def _judge(task: str, fit_rows: pd.DataFrame, truth: pd.DataFrame, basis: str, confidence: float) -> list[dict]:
    """Predict every batch of `truth` from `fit_rows` and compare with each of its runs."""
    try:
        fit = fit_convergence(fit_rows, confidence, task)
    except DataError as exc:  # e.g. no noise scale measured: say so in the output
        return [{"task": task, "basis": basis, "skipped": str(exc)}]
    if fit.basis != basis:
        return []
    pred = fit.predict(sorted(truth["global_batch"].unique())).set_index("global_batch")
    out = []
    for _, r in truth.iterrows():
        p = pred.loc[r["global_batch"]]
        est, lo, hi = p["predicted_steps_to_threshold"], p["steps_low"], p["steps_high"]
        out.append({"task": task, "basis": basis, "model": r["model"], "workers": int(r["workers"]),
                    "held_out": int(r["global_batch"]) not in fit.batches,
                    "global_batch": int(r["global_batch"]), "seed": int(r["seed"]),
                    "measured": int(r["steps_to_threshold"]), "predicted": float(est), "low": float(lo),
                    "high": float(hi), "error": float(est / r["steps_to_threshold"] - 1),
                    "covered": bool(lo <= r["steps_to_threshold"] <= hi),
                    "half_width": float((hi - lo) / 2 / est), "b_noise": fit.b_noise, "noise_scale": fit.noise_scale})
    return out


def evaluate(runs: pd.DataFrame, confidence: float = 0.9) -> pd.DataFrame:
    """Every prediction of the three tasks (module doc) with its error and whether its band held."""
    rows: list[dict] = []
    for sweep, part in runs[runs["label"].str.startswith("batch")].groupby("label"):
        batches = sorted(part["global_batch"].unique())
        small, rest = part[part["global_batch"].isin(batches[:2])], part[part["global_batch"].isin(batches[2:])]
        rows += _judge(f"{sweep}: batch {batches[0]}, {batches[1]} -> larger", small, rest, "batch-fit", confidence)
        first = part[part["global_batch"] == batches[0]]
        rest = part[part["global_batch"] != batches[0]]
        rows += _judge(f"{sweep}: batch {batches[0]} + noise -> larger", first, rest, "noise-scale", confidence)
    for model, weak in runs[runs["label"].str.startswith("weak")].groupby("model"):
        single = runs[(runs["label"] == f"batch {model} w1")]
        if single.empty:
            continue
        batches = sorted(single["global_batch"].unique())
        rows += _judge(f"weak {model} from 1 worker, batch {batches[0]}, {batches[1]}",
                       single[single["global_batch"].isin(batches[:2])], weak, "batch-fit", confidence)
        rows += _judge(f"weak {model} from 1 worker, batch {batches[0]} + noise",
                       single[single["global_batch"] == batches[0]], weak, "noise-scale", confidence)
    return pd.DataFrame(rows)


def independent(rows: pd.DataFrame) -> pd.DataFrame:
    """The predictions that judge something new: the measured batch kept out of the fit, and each
    (basis, model, batch, seed, prediction) once. The two-worker runs reached the threshold in the
    same steps as the one-worker runs (the arithmetic is the same), and so did the weak sweeps at
    the same global batch: a batch-fit of either repeats the one-worker prediction of the same
    measurement, and a weak sweep's first points are the runs the fit was made on."""
    done = rows[rows["skipped"].isna()] if "skipped" in rows.columns else rows
    done = done[done["held_out"].astype(bool)]
    key = done.assign(_p=done["predicted"].round(6))
    return done[~key.duplicated(["basis", "model", "global_batch", "seed", "measured", "_p"])]


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per basis: predictions, mean absolute error, coverage and median relative half-width."""
    def one(part: pd.DataFrame) -> pd.Series:
        return pd.Series({"predictions": len(part), "mean_abs_error": float(part["error"].abs().mean()),
                          "coverage": float(part["covered"].mean()),
                          "median_half_width": float(part["half_width"].median())})
    done = rows[rows["skipped"].isna()] if "skipped" in rows.columns else rows
    return done.groupby("basis").apply(one, include_groups=False).reset_index()


SHIPPED_CONVERGENCE = "convergence_tiny_presets.csv"  # scripts/validate-planner.sh's runs, in scalelab/costs/data


BENCH_LEVELS = (0.8, 0.9)


def planner_bench(levels: tuple[float, ...] = BENCH_LEVELS) -> dict[str, Any]:
    """`launch bench --only planner`, at each level: coverage and median half-width of the
    throughput bands on every shipped scaling table (the seeds' and the published corpus), overall,
    per table, per class of fits (2 or 3+ counts) and per k (costs.calibration.coverage: first k
    counts fitted, the rest predicted, every table with the model and band chosen without it), the
    naive last-efficiency rule's error beside the chosen model's, and of the steps bands on the shipped convergence table over
    its independent held-out predictions (`independent`)."""
    runs = pd.read_csv(files("scalelab.costs.data") / SHIPPED_CONVERGENCE)
    out: dict[str, Any] = {"levels": []}
    for level in levels:
        preds = coverage(level)
        steps = independent(evaluate(runs, level))
        out["levels"].append({
            "confidence": level, "throughput": coverage_summary(preds).to_dict(orient="records")[0],
            "throughput_by_series": coverage_summary(preds, ["table"]).to_dict(orient="records"),
            "throughput_by_origin": coverage_summary(preds, ["origin", "k_class"]).to_dict(orient="records"),
            "throughput_by_k_class": coverage_summary(preds, ["k_class"]).to_dict(orient="records"),
            "throughput_by_fit_counts": coverage_summary(preds, ["fit_counts"]).to_dict(orient="records"),
            "throughput_models": {k: {"model": c.model, "held_out_error": c.errors, "margin": c.margin,
                                      "level": c.level}
                                  for k, c in calibrate(level).items()},
            "interior": _interior_summary(level),
            "steps": summary(steps).to_dict(orient="records")})
    out["steptime"] = steptime_bench(max(levels))
    return out


def _interior_summary(level: float) -> dict[str, Any]:
    """Counts between measured ones (`calibration.interior_coverage`: each left out of its series and
    predicted from the rest, every source's band learnt without it): predictions, coverage, median
    half-width, mean absolute error."""
    c = interior_coverage(level)
    return {"predictions": len(c), "origins": int(c["origin"].nunique()), "coverage": float(c["covered"].mean()),
            "median_half_width": float(c["half_width"].median()), "mape": float(c["error"].abs().mean())}


# ---- the step-time model on seed 004 ----------------------------------------------------------------

SEED_004_TABLE = "seed004_money_speed.csv"
#: the brief's split: every single-instance row and one multi-node row are fitted, the rest predicted
SEED_004_FIT = ("Single g3.4xlarge", "Single p2.xlarge", "Single g3.16xlarge", "Two g3.4xlarge")


def _seed004_rows(cat: Catalog | None = None) -> pd.DataFrame:
    measured = read_scaling_csv(files("scalelab.costs.data") / SEED_004_TABLE)
    return prepare(measured.assign(throughput=1.0 / measured["time_s"]), cat or builtin_catalog(), SEED_004_TABLE)


def _time_s(model, row: pd.Series) -> float:
    """A row's predicted time (its work over the predicted throughput)."""
    return row["per"] * model.step_s(row["layout"], row["b"]) / row["global_batch"]


def steptime_split(rows: pd.DataFrame, fit_labels: Sequence[str], cat: Catalog | None = None) -> pd.DataFrame:
    """Fit on the rows labelled `fit_labels`, predict the others: label, layout, balance, measured_s,
    predicted_s, error (predicted / measured − 1)."""
    cat = cat or builtin_catalog()
    train = rows[rows["label"].isin(fit_labels)]
    name, _ = choose(train, cat)
    model = fit_layout_model(train, cat, name)
    out = []
    for _, r in rows[~rows["label"].isin(fit_labels)].iterrows():
        pred, measured = _time_s(model, r), r["per"] / r["throughput"]
        out.append({"label": r["label"], "layout": r["layout"].text, "balance": r["layout"].balance, "model": name,
                    "measured_s": measured, "predicted_s": pred, "error": pred / measured - 1})
    return pd.DataFrame(out)


def steptime_loo(rows: pd.DataFrame, confidence: float, cat: Catalog | None = None) -> pd.DataFrame:
    """Every row the others can predict, predicted from them with the model they choose and its
    band from their own held-out errors (nested leave-one-out, as `launch plan --predict` does)."""
    cat = cat or builtin_catalog()
    out = []
    for i in range(len(rows)):
        train, r = rows.drop(index=rows.index[i]), rows.iloc[i]
        name, errors = choose(train, cat)
        model = fit_layout_model(train, cat, name)
        if model.why_not(r["layout"]) is not None:
            continue
        q = conformal_quantile(errors[name], confidence) if errors[name] else math.inf
        pred, measured = _time_s(model, r), r["per"] / r["throughput"]
        if q < 1:
            low, high = pred / (1 + q), pred / (1 - q)
        else:  # as `launch plan --predict` does: the corpus band, widened to the model's worst miss here
            fitted, lo, hi, worst = corpus_band(train, confidence, errors[name])
            spread = float(band_spread(fitted, [r["workers"]])[0])
            low, high = pred * math.exp(-max(hi * spread, worst)), pred * math.exp(-min(lo * spread, -worst))
        out.append({"label": r["label"], "model": name, "measured_s": measured, "predicted_s": pred,
                    "error": pred / measured - 1, "half_width": (high - low) / 2 / pred,
                    "covered": bool(low <= measured <= high)})
    return pd.DataFrame(out)


def _finite(x: float) -> float | None:
    """None for an unbounded band (JSON null; rendered as a dash)."""
    return float(x) if math.isfinite(x) else None


def steptime_bench(confidence: float = 0.9) -> dict[str, Any]:
    """Seed 004: the fixed split (errors), nested leave-one-out at `confidence` and at 80 %
    (errors, coverage, median half-width), and the held-out error of every model on the table's
    rows of one GPU type (where the existing models can compete)."""
    cat = builtin_catalog()  # read once for every step below
    rows = _seed004_rows(cat)
    split = steptime_split(rows, SEED_004_FIT, cat)
    loo = {f"{c:.0%}": steptime_loo(rows, c, cat) for c in sorted({0.8, confidence})}
    one_type = rows[rows["layout"].map(lambda lay: set(lay.node_types) <= {"g3.4xlarge", "g3.16xlarge"})]
    _, errors = choose(one_type.reset_index(drop=True), cat)
    issue = issue33_split(confidence, cat)
    return {"table": SEED_004_TABLE, "fit": list(SEED_004_FIT), "split": split.to_dict(orient="records"),
            "split_mape": float(split["error"].abs().mean()),
            "issue33_fit": list(ISSUE_33_FIT), "issue33_split": issue.to_dict(orient="records"),
            "issue33_mape": float(issue["error"].abs().mean()), "issue33_coverage": float(issue["covered"].mean()),
            "loo": {k: {"predictions": len(v), "mape": float(v["error"].abs().mean()),
                        "coverage": float(v["covered"].mean()), "median_half_width": _finite(v["half_width"].median()),
                        "rows": v.to_dict(orient="records")} for k, v in loo.items()},
            "one_gpu_type_held_out_error": {k: float(np.mean(v)) for k, v in errors.items() if v}}


#: issue 33's split: seed 004's 1x1 and 2x1 g3.4xlarge, 1x4 g3.16xlarge and 1x1 p2.xlarge fitted, and
#: its four held-out layouts predicted and priced through the one planner (`plan` with layouts)
ISSUE_33_FIT = ("Single g3.4xlarge", "Two g3.4xlarge", "Single g3.16xlarge", "Single p2.xlarge")
ISSUE_33_HELD_OUT = {"4x1@4*g3.4xlarge": "Four g3.4xlarge", "2x4@2*g3.16xlarge": "Two g3.16xlarge",
                     "2x2@2*g3.16xlarge": "Two g3.16xlarge with 2 GPU only",
                     "4x1@1*p2.xlarge+3*g3.4xlarge": "Three g3.4xlarge + one p2.xlarge"}


def issue33_split(confidence: float = 0.9, cat: Catalog | None = None) -> pd.DataFrame:
    """Issue 33's layout question through `plan`: layout, measured_s, predicted_s, low_s, high_s, error,
    covered, dollars."""
    from scalelab.costs.planner import PlanRequest, plan
    from scalelab.costs.steptime import parse_fleet_layouts

    cat = cat or builtin_catalog()
    measured = read_scaling_csv(files("scalelab.costs.data") / SEED_004_TABLE)
    measured = measured.assign(throughput=1.0 / measured["time_s"])
    truth = measured.set_index("label")["time_s"]
    p = plan(PlanRequest(measured[measured["label"].isin(ISSUE_33_FIT)], [], cat, confidence=confidence,
                         layouts=parse_fleet_layouts(",".join(ISSUE_33_HELD_OUT), cat), source=SEED_004_TABLE))
    c = p.candidates
    t = c["layout"].map(lambda lay: float(truth[ISSUE_33_HELD_OUT[lay]]))
    return pd.DataFrame({"layout": c["layout"], "measured_s": t, "predicted_s": c["predicted_time_s"],
                         "low_s": c["time_low_s"], "high_s": c["time_high_s"], "error": c["predicted_time_s"] / t - 1,
                         "covered": (c["time_low_s"] <= t) & (t <= c["time_high_s"]), "dollars": c["dollars"]})


def _probe_main(probe_dir: Path, confidence: float, fmt: str) -> int:
    """`--probe`: every prediction and the summary per task, as JSON or markdown tables."""
    from scalelab.analysis.report import markdown_table
    from scalelab.costs.probe_validation import evaluate_probe, probe_runs, probe_summary

    try:
        runs = probe_runs(probe_dir)
        rows = evaluate_probe(runs, confidence)
    except (DataError, RecordError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if fmt == "markdown":
        show = rows.drop(columns=["fit"]).assign(covered=rows["covered"].map({True: "yes", False: "no"}))
        nfmt = {"measured": ",.0f", "predicted": ",.0f", "low": ",.0f", "high": ",.0f", "error": "+.0%"}
        print(markdown_table(runs[["instance_type", "layout", "workers", "nodes", "throughput", "step_s_median",
                                   "step_p90_over_p10"]], {"workers": ".0f", "nodes": ".0f", "throughput": ",.0f",
                                                           "step_s_median": ".4f", "step_p90_over_p10": ".2f"}))
        print()
        print(markdown_table(show, nfmt))
        print()
        print(markdown_table(pd.DataFrame(probe_summary(rows)),
                             {"predictions": ".0f", "mean_abs_error": ".0%", "coverage": ".0%", "median_half_width": ".0%"}))
        return 0
    out = {"probe": str(probe_dir), "confidence": confidence, "summary": probe_summary(rows),
           "runs": runs.drop(columns=["run_dir"]).to_dict(orient="records"), "predictions": rows.to_dict(orient="records")}
    print(json.dumps(_jsonable(out), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.costs.validation", description=__doc__.split("\n")[0])
    parser.add_argument("runs_dir", type=Path, nargs="?")
    parser.add_argument("--confidence", type=float, default=0.9)
    parser.add_argument("--csv", type=Path, help="Write the convergence table of every run here.")
    parser.add_argument("--steptime", action="store_true", help="Judge the step-time model on seed 004 instead.")
    parser.add_argument("--probe", type=Path, metavar="PROBE_DIR",
                        help="Judge the planner on a `launch probe` directory instead (scalelab/costs/probe_validation.py).")
    parser.add_argument("--format", choices=["json", "markdown"], default="json", help="With --probe: the output.")
    args = parser.parse_args(argv)
    if args.probe is not None:
        return _probe_main(args.probe, args.confidence, args.format)
    if args.steptime:
        print(json.dumps(_jsonable(steptime_bench(args.confidence)), indent=2, allow_nan=False))
        return 0
    if args.runs_dir is None:
        parser.error("give RUNS_DIR, or --steptime")
    runs = collect(args.runs_dir)
    if args.csv:
        runs.to_csv(args.csv, index=False)
    rows = evaluate(runs, args.confidence)
    held = independent(rows) if len(rows) else rows
    out = {"confidence": args.confidence, "runs": len(runs),
           "summary": summary(held).to_dict(orient="records") if len(held) else [],
           "summary_all_rows": summary(rows).to_dict(orient="records") if len(rows) else [],
           "predictions": rows.to_dict(orient="records")}
    print(json.dumps(_jsonable(out), indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
