"""Judge the steps-to-threshold predictions on runs kept out of their fit (scripts/validate-planner.sh).

    python -m costs.validation RUNS_DIR [--confidence 0.9] [--csv FILE]

RUNS_DIR holds `batch/MODEL/wW/bB-sS/` (one run each: batch sweeps at one and two workers) and
`weak/MODEL/sS/` (weak-scaling sweeps). Three tasks, each prediction compared with every run of
the predicted batch (one per seed):

- **batch-fit**: fit S(B) on the runs at the two smallest batches of a sweep, predict the others;
- **noise-scale**: from the runs at the smallest batch and their measured noise scale alone;
- **weak sweep**: the steps of a weak-scaling sweep (global batch 16·N on N workers) from the
  single-worker batch sweep (both bases).

Prints the rows and a summary (mean absolute error, coverage, median half-width) as JSON, and
`--csv` writes the convergence table of every run (the format `launch plan --from-csv` reads).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.report import _jsonable
from analysis.results import summarize_loaded
from core.errors import DataError
from core.records import load_run
from costs.calibration import coverage, coverage_summary
from costs.convergence import fit_convergence

__all__ = ["collect", "evaluate", "summary", "planner_bench"]

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
        out.append({"task": task, "basis": basis, "global_batch": int(r["global_batch"]), "seed": int(r["seed"]),
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


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per basis: predictions, mean absolute error, coverage and median relative half-width."""
    def one(part: pd.DataFrame) -> pd.Series:
        return pd.Series({"predictions": len(part), "mean_abs_error": float(part["error"].abs().mean()),
                          "coverage": float(part["covered"].mean()),
                          "median_half_width": float(part["half_width"].median())})
    done = rows[rows["skipped"].isna()] if "skipped" in rows.columns else rows
    return done.groupby("basis").apply(one, include_groups=False).reset_index()


SHIPPED_CONVERGENCE = "convergence_tiny_presets.csv"  # scripts/validate-planner.sh's runs, in costs/data


def planner_bench(confidence: float = 0.9) -> dict[str, Any]:
    """`launch bench --only planner`: coverage and median half-width of the throughput bands on
    every shipped scaling table (costs.calibration.coverage: first k layouts fitted, the rest
    predicted, for every k) and of the steps bands on the shipped convergence table."""
    preds = coverage(confidence)
    steps = evaluate(pd.read_csv(files("costs.data") / SHIPPED_CONVERGENCE), confidence)
    return {"confidence": confidence,
            "throughput": coverage_summary(preds).to_dict(orient="records")[0],
            "throughput_by_series": coverage_summary(preds, ["series"]).to_dict(orient="records"),
            "throughput_by_fit_counts": coverage_summary(preds, ["fit_counts"]).to_dict(orient="records"),
            "steps": summary(steps).to_dict(orient="records")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m costs.validation", description=__doc__.split("\n")[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--confidence", type=float, default=0.9)
    parser.add_argument("--csv", type=Path, help="Write the convergence table of every run here.")
    args = parser.parse_args(argv)
    runs = collect(args.runs_dir)
    if args.csv:
        runs.to_csv(args.csv, index=False)
    rows = evaluate(runs, args.confidence)
    out = {"confidence": args.confidence, "runs": len(runs),
           "summary": summary(rows).to_dict(orient="records") if len(rows) else [],
           "predictions": rows.to_dict(orient="records")}
    print(json.dumps(_jsonable(out), indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
