"""Runs and tables turned into what the planner plans from (`Measurements`): throughput per layout,
the runs that reached a loss threshold, their overheads, the measured type and the probes' speeds.

It lives in the planner's package, not in its command (`costs.cli`): `launch plan`, `launch cost`'s
--from-csv report and the planner's judges (`costs.probe_validation`) all read runs through this one
module, so a prediction judged on a probe is made from exactly what `launch plan` would read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from scalelab.analysis.results import expand_run_dirs, label_series, summarize_loaded
from scalelab.analysis.scaling import scale_layouts, step_table
from scalelab.core.errors import DataError, SpecError
from scalelab.core.presets import PRESETS, config_with_overrides
from scalelab.core.spec import Spec
from scalelab.core.records import load_run
from scalelab.costs.billing import Mix
from scalelab.costs.convergence import convergence_rows
from scalelab.costs.memory import MemoryModel
from scalelab.costs.planner import Overheads
from scalelab.costs.tables import csv_kind, read_convergence_csv, read_scaling_csv, with_throughput

__all__ = ["Measurements", "measured_from_runs", "measured_from_csv"]


@dataclass
class Measurements:
    """What `launch plan` plans from: throughput per layout (`measured`), the runs that reached a
    threshold (`convergence`), their overheads, the instance type they ran on, and for runs the
    scaling table and loss curves of the HTML report."""

    measured: pd.DataFrame
    convergence: pd.DataFrame | None = None
    overheads: Overheads = field(default_factory=Overheads)
    measured_on: str | None = None
    table: pd.DataFrame | None = None
    curves: dict[str, pd.DataFrame] = field(default_factory=dict)
    probe_speed: dict[str, float] = field(default_factory=dict)
    precision: str = "fp32"
    memory: dict[str, MemoryModel] = field(default_factory=dict)  # label -> what its runs train (GPU fit)


def memory_model(spec: Spec) -> MemoryModel:
    """The memory-relevant part of a run's spec (scalelab/costs/memory.py)."""
    cfg = config_with_overrides(PRESETS[spec.model], spec.model_args)
    return MemoryModel(cfg, spec.precision, spec.engine.name, spec.output_loss, spec.optimizer)


def measured_from_runs(paths: list[Path], measured_on: str | None = None, every_type: bool = False) -> Measurements:
    """The measurements of run and sweep directories (their records, through analysis.scaling).
    Runs on several instance types, each on one type: the fit is made on `measured_on` (default:
    the type with the most runs) and the others are probes (their per-GPU speed, scalelab/costs/speed.py).
    `every_type`: every run is measured, each row with the instance type (or mix) it ran on, in an
    `instance_type` column (what the step-time model of `plan --predict` reads per row)."""
    by_type: dict[str | None, list] = {}
    run_types: dict[int, str | None] = {}  # id(summary) -> its run's instance_type option
    curves, memory = {}, {}
    specs, summaries, loss_curves = [], [], []  # the runs' parts kept, not their records: a sweep's can be millions
    for run_dir in expand_run_dirs(paths):
        run = load_run(run_dir)
        st = None if run.steps.empty else step_table(run.steps)  # once: the summary and the loss curve read it
        specs.append(run.spec)
        summaries.append(summarize_loaded(run, st))
        loss_curves.append(_loss_curve(st))
    # runs that differ in a setting but the layout (--prefetch 0 beside 2) are series apart, as in reports; not
    # in the backend: where runs ran is their instance type's to say here (the measured type and the probes)
    for spec, s, curve in zip(specs, label_series(summaries, specs, frozenset({"backend"})), loss_curves):
        if not spec.own_code:  # a --script's model is unknown to the memory model: its plans are not checked
            memory[s.label] = memory_model(spec)
        itype = (spec.backend_options or {}).get("instance_type")
        run_types[id(s)] = itype
        types = {t for _, t in Mix.parse(itype).items} if itype else set()  # a mix: measured on several
        by_type.setdefault(types.pop() if len(types) == 1 else ("mix" if types else None), []).append(s)
        if curve is not None:
            curves[f"{s.label} {s.nodes}x{s.gpus_per_node}"] = curve
    precisions = [s.precision or "fp32" for group in by_type.values() for s in group]
    base, probes = _base_and_probes(by_type, measured_on)
    summaries = by_type[base] if probes and not every_type else [s for group in by_type.values() for s in group]
    types = [{"instance_type": run_types[id(s)]} for s in summaries] if every_type else None
    table = scale_layouts(summaries, extra=types)
    threshold = table["loss_threshold"].map(lambda x: None if pd.isna(x) else f"{float(x):g}")
    measured = pd.DataFrame({
        "label": table["label"], "workers": table["workers"], "nodes": table["nodes"],
        "throughput": table["words_per_s"], "global_batch": table["global_batch"],
        "batch_scaling": table["batch_scaling"], "words_per_sample": table["words_per_s"] / table["samples_per_s"],
        "convergence": [None if t is None else f"{m} to loss {t}" for m, t in zip(table["model"], threshold)],
        # how much its steps spread: the band of a measured layout (scalelab/costs/model.py)
        "throughput_spread": _spread(table)})
    if every_type:
        measured["instance_type"] = table["instance_type"]
    measured = measured[measured["throughput"].notna()]  # a run at its threshold in warm-up: steps, no speed
    return Measurements(measured, convergence_rows(table), _overheads(table), base, table, curves, probes,
                        max(set(precisions), key=precisions.count) if precisions else "fp32", memory)


def _loss_curve(st: pd.DataFrame | None) -> pd.DataFrame | None:
    """A run's loss against seconds for the HTML report, at most ~2000 points (a million step records)."""
    if st is None or not len(st) or not st["time"].notna().any():
        return None
    every = max(1, len(st) // 2000)
    return pd.DataFrame({"seconds": st["time"] - st["time"].min(), "loss": st["loss"]}).iloc[::every]


def _spread(table: pd.DataFrame) -> pd.Series:
    """Relative spread (std / mean) of each layout's step times, where the table has them."""
    if not {"step_s_mean", "step_s_std"} <= set(table.columns):
        return pd.Series(np.nan, index=table.index)
    mean, std = (pd.to_numeric(table[c], errors="coerce") for c in ("step_s_mean", "step_s_std"))
    return (std / mean).where(mean > 0)


def _base_and_probes(by_type: dict[str | None, list], measured_on: str | None) -> tuple[str | None, dict[str, float]]:
    """(the measured type, per-GPU words/s of every type) of runs grouped by instance type: one
    type alone is the measured one; several single types (no mixes, no untyped runs) are the
    measured type (`measured_on`, else the one with the most runs) and probes, each at the fewest
    workers all types share (else its own fewest)."""
    singles = [t for t in by_type if t not in (None, "mix")]
    if len(by_type) != len(singles) or not singles:
        return measured_on, {}
    if len(singles) == 1:
        return singles[0], {}
    if measured_on is not None and measured_on not in by_type:
        raise SpecError(f"--measured-on {measured_on}: the runs were made on {', '.join(sorted(singles))}; "
                        "name the one to fit (the others are probes of their speed)")
    base = measured_on or max(singles, key=lambda t: len(by_type[t]))
    common = set.intersection(*({s.workers for s in by_type[t]} for t in singles))
    probes = {}
    for t in singles:
        w = min(common) if common else min(s.workers for s in by_type[t])
        speeds = [s.words_per_s / s.workers for s in by_type[t] if s.workers == w and s.words_per_s is not None]
        if speeds:
            probes[t] = float(np.median(speeds))
    return base, probes


def _overheads(table: pd.DataFrame) -> Overheads:
    """Median start-up of the runs, and the median share of their wall time to the threshold spent
    outside training steps (validation, checkpoints, probes), relative to the training time."""
    startup = pd.to_numeric(table["startup_s"], errors="coerce").dropna()
    wall, train = (pd.to_numeric(table[c], errors="coerce") for c in ("wall_to_threshold_s", "time_to_threshold_s"))
    startup_each = pd.to_numeric(table["startup_s"], errors="coerce").fillna(0.0)
    share = ((wall - startup_each - train) / train).dropna()
    return Overheads(float(startup.median()) if len(startup) else 0.0,
                     max(float(share.median()), 0.0) if len(share) else 0.0)


def measured_from_csv(path: str, measured_on: str | None) -> Measurements:
    """A published scaling table, or a table of steps to a threshold (by its columns)."""
    if csv_kind(path) == "convergence":
        return Measurements(pd.DataFrame(), read_convergence_csv(path), measured_on=measured_on)
    measured = with_throughput(read_scaling_csv(path))
    if measured_on is None and "instance_type" in measured.columns:  # `instance` is read as this column too
        vals = {str(v) for v in measured["instance_type"].dropna()}
        measured_on = vals.pop() if len(vals) == 1 and not any(c in next(iter(vals)) for c in "*+") else None
    return Measurements(measured, measured_on=measured_on, precision=table_precision(measured, path))


def table_precision(measured: pd.DataFrame, path: str) -> str:
    """The arithmetic of a table's runs, from its `precision` column (fp32 without one: what every published
    GPU ratio of that class converts by): a mixed-precision table converted to another GPU with the fp32 ratio
    was off by 2x (A100 -> V100: 0.26x where mixed precision measures 0.54x). One per table: the conversion
    is the plan's, not a series'."""
    if "precision" not in measured.columns or measured["precision"].isna().all():
        return "fp32"
    kinds = {"fp16" if p == "mixed" else "fp32" if p == "tf32" else str(p) for p in measured["precision"].dropna()}
    if len(kinds) > 1:
        raise DataError(f"{path}: its 'precision' column names {', '.join(sorted(kinds))}; a plan converts speeds "
                        "between GPUs at one precision: split the table into one file per precision")
    return kinds.pop()
