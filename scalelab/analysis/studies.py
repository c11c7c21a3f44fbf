"""The seeds' tables and figures, computed from a study's runs.

Pure: summaries and per-step tables in, DataFrames, Markdown and figures out. `launch study`
(scalelab/launcher/study.py) runs the sweeps, reads the records and writes the files; the money table's
dollars come from scalelab/costs/studies.py, which passes the catalog's billing in as `price`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import pandas as pd

from scalelab.analysis.report import markdown_table
from scalelab.analysis.scaling import LayoutSummary, rank_steps, scale_layouts

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TABLES",
    "StudyRuns",
    "study_runs",
    "study_baseline",
    "speedup_bases",
    "speedup_note",
    "seed_table",
    "throughput_table",
    "worker_batches",
    "host_threads",
    "RESOLVED_IN_START",
    "resolved_settings",
    "VariantRun",
    "same_settings_warnings",
    "epochs_table",
    "convergence_table",
    "arrangement_table",
    "measured_epoch_seconds",
    "money_table",
    "money_note",
    "steps_per_epoch",
    "study_markdown",
    "NOISY_SPREAD",
    "Knee",
    "batch_knees",
    "knee_advice",
    "GEMM_NAMING",
    "gemm_table",
    "gemm_markdown",
    "gemm_advice",
    "gemm_html",
    "plot_gemm",
]

#: The seed-shaped tables a study file may ask for (`tables:`).
TABLES = ("throughput", "epochs", "convergence", "arrangement", "money")


@dataclass
class StudyRuns:
    """A study's runs, ready for the seed tables.

    `rows` is the scaling table of the runs (`scale_layouts`) with more columns: run (its key in
    the dicts below), train_s (seconds of all its steps), wall_s (launch to its last record: what is
    billed; None when not given), the columns of `study_runs`'s `extra`, speedup and speedup_base
    (`speedup_bases`).
    `epoch_times` holds the seconds of each epoch's steps per run (a partial last epoch: its
    steps so far), `epochs_to` the fractional epochs until the loss threshold (steps to it over
    steps per epoch), None when it was not reached or the steps per epoch are not known (`steps_per_epoch`).
    `baseline` names the run every variant without a run of its own at the fewest workers is measured
    against ("strong scaling 1x1").
    `epoch_s` is the seconds of one epoch at the pace of the run's measured steps (`measured_epoch_seconds`),
    None when the steps per epoch are not known or no step was measured.
    """

    rows: pd.DataFrame
    epoch_times: dict[str, list[float]]
    epochs_to: dict[str, float | None]
    baseline: str = ""
    epoch_s: dict[str, float | None] = field(default_factory=dict)


def steps_per_epoch(summary: LayoutSummary, steps: pd.DataFrame) -> int | None:
    """Steps of one epoch: as the run recorded it (its start record), else counted in the first epoch
    of its per-step table when a later one began (so the first is complete); else None."""
    if summary.steps_per_epoch:
        return summary.steps_per_epoch
    epochs = steps["epoch"]
    if not len(steps) or epochs.max() == epochs.min():
        return None
    return int((epochs == epochs.min()).sum())


def measured_epoch_seconds(steps: pd.DataFrame, per_epoch: int | None) -> float | None:
    """Seconds of one epoch at the pace of the measured steps: their mean step time (warm-up and steps some rank
    did not finish left out, as the throughput's: `analysis.scaling`) times the steps of an epoch. Why: the
    arrangement table's minutes per epoch counted the warm-up steps while its speed-up was a words/s ratio over
    the measured ones, so at a few steps a row's speed-up contradicted its own times (0.29 beside 0.38)."""
    if not per_epoch or not len(steps):
        return None
    measured = steps[~steps["warmup"] & (steps["ranks"] == steps["ranks"].max())]
    return float(measured["t_step"].mean()) * per_epoch if len(measured) else None


def study_runs(runs: Sequence[tuple[str, LayoutSummary, pd.DataFrame]],
               extra: Mapping[str, Mapping[str, Any]] | None = None) -> StudyRuns:
    """`StudyRuns` of (run key, summary, per-step table from `analysis.scaling.step_table`) per run.
    `extra` maps a run key to more columns of its row, computed above this layer from its records:
    `wall_s` (costs.expected.run_seconds, the billed time), `backend` (where it ran), `worker_batch`
    (`worker_batches`, of a balanced run), `threads` and `interop_threads` (its start record's)."""
    epoch_times, epochs_to, train_s, epoch_s = {}, {}, {}, {}
    for key, summary, steps in runs:
        epoch_times[key] = steps.groupby("epoch")["t_step"].sum().tolist()
        train_s[key] = float(steps["t_step"].sum())
        per = steps_per_epoch(summary, steps)
        reached = summary.steps_to_threshold
        epochs_to[key] = round(reached / per, 2) if reached and per else None
        epoch_s[key] = measured_epoch_seconds(steps, per)
    rows = scale_layouts([summary for _, summary, _ in runs])
    key_of = {(s.label, s.nodes, s.gpus_per_node): key for key, s, _ in runs}
    rows["run"] = [key_of[(lab, n, g)] for lab, n, g in zip(rows["label"], rows["nodes"], rows["gpus_per_node"])]
    rows["train_s"] = [train_s[r] for r in rows["run"]]
    extra = extra or {}
    for col in dict.fromkeys(["wall_s", *(c for e in extra.values() for c in e)]):
        rows[col] = [extra.get(r, {}).get(col) for r in rows["run"]]
    bases = [rows.iloc[i] for i in speedup_bases(rows)]
    rows["speedup"] = [r / base["words_per_s"] for r, base in zip(rows["words_per_s"], bases)]
    rows["speedup_base"] = [_layout_name(base) for base in bases]
    return StudyRuns(rows, epoch_times, epochs_to, _layout_name(rows.iloc[study_baseline(rows)]), epoch_s)


def _layout_name(row: pd.Series) -> str:
    return f"{row['label']} {row['nodes']}x{row['gpus_per_node']}"


def study_baseline(rows: pd.DataFrame) -> int:
    """Position of the study's baseline: the first run (in study order) at the fewest workers, the
    seed's one-GPU run that every other configuration is compared with."""
    return int((rows["workers"] == rows["workers"].min()).to_numpy().argmax())


def speedup_bases(rows: pd.DataFrame) -> list[int]:
    """The position in `rows` of the run each row's speedup is measured against (named beside it in the tables,
    "Speed-up base"): its variant's smallest layout, or - for a variant with no run at the study's fewest
    workers (the same 4 GPUs arranged, a mixed pair) - the study's baseline (`study_baseline`), as seed 004
    compares everything with one g3.4xlarge: a variant of one layout measured against itself would read 1.00
    whatever it did. Positions, so that `study_runs` takes both the speedups and the bases' names from one pass."""
    fewest, baseline = rows["workers"].min(), study_baseline(rows)
    base = {}
    for label, grp in rows.groupby("label", sort=False):
        small = grp["workers"].idxmin()
        base[label] = rows.index.get_loc(small) if grp.loc[small, "workers"] == fewest else baseline
    return [base[label] for label in rows["label"]]


#: What each table's speed-up divides, in its note (`speedup_note`).
SPEEDUP_OF = {
    "throughput": "words/s over words/s",
    "arrangement": "the base's minutes per epoch over this row's, t1/tn as the seed defines it; minutes per epoch "
                   "are the mean time of the run's measured steps (warm-up left out, as words/s) times the steps "
                   "of an epoch",
    "convergence": "the base's time to the loss threshold over this row's, in training seconds with validation "
                   "left out, where both reached it; efficiency is that over workers / the base's workers",
}


def speedup_note(data: StudyRuns, table: str = "throughput") -> str:
    """What the study's speedups are measured against and computed from (`SPEEDUP_OF[table]`), said under its
    tables (and per row, "Speed-up base"): a variant with no run at the fewest workers is measured against the
    baseline, which the scaling report does not do."""
    rows = data.rows
    fewest = rows["workers"].min()
    groups = [(str(label), grp) for label, grp in rows.groupby("label", sort=False) if grp["workers"].min() != fewest]
    text = (f"Speed-up base: the run each speed-up ({SPEEDUP_OF[table]}) is measured against: the variant's own "
            f"run at {fewest} worker(s), else the study's baseline, {data.baseline}, as the seed compares every "
            "configuration with its one-GPU run.")
    single = [label for label, grp in groups if grp[["nodes", "gpus_per_node"]].drop_duplicates().shape[0] == 1]
    several = [label for label, _ in groups if label not in single]
    said = ([f"{', '.join(several)} read(s) 1.00 at its smallest layout there"] if several else []) + \
           ([f"{', '.join(single)}, of one layout, show(s) none there"] if single else [])
    if not said:
        return text
    return (text + " report.md's speedup column measures each variant against its own smallest layout instead, "
            f"so {'; '.join(said)}.")


def seed_table(name: str, data: StudyRuns, epochs_shown: int = 3) -> pd.DataFrame:
    """The table `name` of TABLES, except money, which needs prices (costs.studies.price_money_table)."""
    if name == "throughput":
        return throughput_table(data.rows)
    if name == "epochs":
        return epochs_table(data.rows, data.epoch_times, epochs_shown)
    if name == "convergence":
        return convergence_table(data.rows, data.epochs_to)
    if name == "arrangement":
        return arrangement_table(data.rows, data.epoch_s)
    raise ValueError(f"seed_table makes {', '.join(t for t in TABLES if t != 'money')}, not {name!r}")


def worker_batches(step_records: pd.DataFrame) -> str | None:
    """The batch each worker measured in a run whose shares of the global batch changed (`--balance dynamic`):
    the range of the samples a rank took in a measured step, and each rank's mean ("2–14 (rank means 4.9,
    11.1)"); None where every worker took the same (the global batch over the workers says it). Why: the
    throughput table showed the balancer's run at 8 a GPU (16 / 2) while its records held shares of 2 to 14.
    Read from the steps the throughput measures (`scaling.rank_steps`: no ps server ranks, the latest attempt
    of a re-done step; a step any rank marked warm-up or profiled left out, as `step_table` marks it)."""
    if not len(step_records) or "samples" not in step_records.columns:
        return None
    steps = rank_steps(step_records)
    steps = steps[~steps.groupby("step")["warmup"].transform("max").astype(bool)]
    samples = steps["samples"].dropna()
    if samples.nunique() < 2:
        return None
    means = samples.groupby(steps.loc[samples.index, "rank"]).mean()
    return f"{int(samples.min())}–{int(samples.max())} (rank means {', '.join(f'{m:.1f}' for m in means)})"


#: Settings whose spec value can leave the choice to the machine (None: PyTorch's default, or the cores over the
#: ranks) and which every start record states as the run got it (docs/records.md): a study compares variants by
#: these, not by what their files asked.
RESOLVED_IN_START = ("threads", "interop_threads")


def resolved_settings(given: Mapping[str, Any], start: Mapping[str, Any]) -> dict[str, Any]:
    """A run's settings (`analysis.results.run_settings` of its spec) with `RESOLVED_IN_START`'s as its start
    record (rank 0's) says it ran them."""
    out = dict(given)
    for key in RESOLVED_IN_START:
        value = start.get(key)
        if value is not None and not pd.isna(value):
            out[key] = int(value)
    return out


@dataclass
class VariantRun:
    """One run of a study for `same_settings_warnings`: its variant, layout ("1x2"), the settings its spec gives
    (`run_settings`) and those it ran with (`resolved_settings`)."""

    variant: str
    layout: str
    given: dict[str, Any]
    resolved: dict[str, Any]


def same_settings_warnings(runs: Sequence[VariantRun]) -> list[str]:
    """A variant whose runs ran with the same settings as an earlier variant's on every layout both ran, one
    sentence each, naming what its file set and what that resolved to.

    Why: seed 001's "cudnn_lstm 2 host threads" sets interop_threads 2, which is PyTorch's default on a 2-core
    machine, and the sweep gives every emulated GPU one intra-op thread: its start records read threads 1,
    interop_threads 2 like the baseline's, and the study reported it as a result of its own. The recipe is
    left as written (on a GPU machine's cores the default is larger and the variant differs; rewriting it per
    machine would measure something the file does not say); the study says when it measured nothing new."""
    by_variant: dict[str, dict[str, VariantRun]] = {}
    for run in runs:
        by_variant.setdefault(run.variant, {})[run.layout] = run
    labels, out = list(by_variant), []
    for i, label in enumerate(labels):
        mine = by_variant[label]
        for earlier in labels[:i]:
            theirs = by_variant[earlier]
            shared = [layout for layout in mine if layout in theirs]
            if not shared or any(mine[lay].resolved != theirs[lay].resolved for lay in shared):
                continue
            first = mine[shared[0]]
            asked = {k: v for k, v in first.given.items() if theirs[shared[0]].given.get(k) != v}
            said = ", ".join(f"{k} {_setting(v)}" for k, v in asked.items()) or "nothing different"
            ran = ", ".join(f"{k} {_setting(first.resolved.get(k))}" for k in RESOLVED_IN_START
                            if k in first.resolved) if set(asked) & set(RESOLVED_IN_START) else ""
            out.append(f"variant {label!r} ran with the same settings as {earlier!r} on {', '.join(shared)}: it sets "
                       f"{said}, which resolved to what {earlier!r} ran with on this machine"
                       + (f" (the start records of both read {ran})" if ran else "")
                       + "; its rows measure the same configuration again, not a difference between the two")
            break
    return out


def _setting(value: Any) -> str:
    return "default" if value is None else str(value)


def host_threads(rows: pd.DataFrame) -> list[str] | None:
    """Each row's "intra-op / inter-op" threads as its start records say it ran (the `threads` and
    `interop_threads` columns of `study_runs`'s extra), where the rows differ in them; else None (nothing to
    tell apart, and no column): seed 001 compares host threads, and its table showed none."""
    if not {"threads", "interop_threads"} <= set(rows.columns):
        return None
    cells = [f"{_setting(_whole(a))} / {_setting(_whole(b))}" for a, b in zip(rows["threads"], rows["interop_threads"])]
    return cells if len(set(cells)) > 1 else None


def _whole(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def throughput_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Seed 001's table: GPUs, batch per GPU, (host threads where the rows differ in them: `host_threads`), total
    time of the measured batches, words/s, speedup. The batch per GPU is the global batch over the workers, or
    what a balanced run's workers measured (`worker_batches`: the `worker_batch` column of `study_runs`'s extra)."""
    split = (rows["global_batch"] // rows["workers"]).tolist()
    measured = rows["worker_batch"].tolist() if "worker_batch" in rows.columns else [None] * len(rows)
    threads = host_threads(rows)
    return pd.DataFrame({
        "variant": rows["label"], "GPU number": rows["workers"],
        "Batch size (per GPU)": [m if isinstance(m, str) else b for m, b in zip(measured, split)],
        **({"Host threads (intra-op / inter-op)": threads} if threads else {}),
        "Measured batches": rows["steps_measured"],
        "Total time of measured batches (s)": (rows["step_s_mean"] * rows["steps_measured"]).round(3),
        "Processing speed (words/s)": rows["words_per_s"].round(1),
        "Speedup ratio": rows["speedup"].round(2), "Speedup base": rows["speedup_base"],
    })


def epochs_table(rows: pd.DataFrame, epoch_times: dict[str, list[float]], shown: int) -> pd.DataFrame:
    """Seed 002's table: time for each of the first epochs per layout, and the speedup of their sum."""
    out = pd.DataFrame({"variant": rows["label"], "workers": rows["workers"], "global batch": rows["global_batch"]})
    sums = []
    for i in range(shown):
        out[f"epoch {i + 1} (s)"] = [round(epoch_times[r][i], 3) if len(epoch_times[r]) > i else None for r in rows["run"]]
    for r in rows["run"]:
        sums.append(sum(epoch_times[r][:shown]) if len(epoch_times[r]) >= shown else None)
    out["total (s)"] = [round(s, 3) if s is not None else None for s in sums]
    base = {}
    speed = []
    for label, workers, s in zip(rows["label"], rows["workers"], sums):
        base.setdefault(label, (workers, s))
        speed.append(round(base[label][1] / s, 2) if s and base[label][1] else None)
    out["speedup"] = speed
    return out


def convergence_table(rows: pd.DataFrame, epochs_to: dict[str, float | None]) -> pd.DataFrame:
    """Seed 004's convergence: epochs and time to the loss threshold per layout, and the speedup and efficiency
    of that time (the seed computes both from the run time and from the time to its threshold, and finds the
    latter lower: more workers can need more samples to converge). Each is measured against the run of the
    "Speed-up base" column, as the other tables' speed-ups (`speedup_bases`): the base's time to the threshold
    over this run's, and that over workers / the base's workers; empty where either did not reach it. Times to
    3 significant digits: 0.06 s and 0.14 s both read 0.1 at one decimal."""
    time = pd.to_numeric(rows["time_to_threshold_s"], errors="coerce").where(rows["reached_threshold"].fillna(False)
                                                                              .astype(bool))
    bases = speedup_bases(rows)
    speedup = [time.iloc[b] / t if t > 0 and time.iloc[b] > 0 else None for b, t in zip(bases, time)]
    workers = rows["workers"].tolist()
    efficiency = [s * workers[b] / w if s is not None else None for s, b, w in zip(speedup, bases, workers)]
    return pd.DataFrame({
        "variant": rows["label"], "layout": rows["nodes"].astype(str) + "x" + rows["gpus_per_node"].astype(str),
        "workers": rows["workers"], "threshold": rows["loss_threshold"],
        "reached": rows["reached_threshold"], "steps to threshold": rows["steps_to_threshold"],
        "epochs to threshold": [epochs_to.get(r) for r in rows["run"]],
        "time to threshold (s)": [_significant(t) for t in time],
        "Speed-up to threshold": [_significant(x) for x in speedup],
        "Efficiency to threshold": [_significant(x) for x in efficiency],
        "Speed-up base": rows["speedup_base"],
    })


def _significant(x: float | None, digits: int = 3) -> float | None:
    """`x` to `digits` significant digits (None where missing): a table's figures from 0.06 s to 3,840 s."""
    return None if x is None or pd.isna(x) else float(f"{x:.{digits}g}")


def arrangement_table(rows: pd.DataFrame, epoch_s: dict[str, float | None]) -> pd.DataFrame:
    """Seed 004's arrangement table: nodes, GPUs per node, time per epoch, speedup, both from the measured
    steps. Minutes per epoch are an epoch at the pace of the run's measured steps (`measured_epoch_seconds`:
    warm-up left out, as the words/s of the other tables), and the speed-up is the seed's t1/tn of that column:
    the "Speed-up base" run's minutes per epoch over this row's, so the two columns never contradict each other.
    Where either time is not known (no steps per epoch recorded) the speed-up is the words/s ratio, marked
    "(words/s)" in "Speed-up from"."""
    minutes = [epoch_s[r] / 60 if epoch_s.get(r) else None for r in rows["run"]]
    words = pd.to_numeric(rows["speedup"], errors="coerce").tolist()
    speedup, source = [], []
    for row, base in enumerate(speedup_bases(rows)):
        if minutes[row] and minutes[base]:
            speedup.append(round(minutes[base] / minutes[row], 2))
            source.append("time per epoch")
        else:
            speedup.append(None if pd.isna(words[row]) else round(float(words[row]), 2))
            source.append("words/s")
    table = pd.DataFrame({
        "variant": rows["label"], "# of Node": rows["nodes"], "# of GPUs per Node": rows["gpus_per_node"],
        "Time (min/epoch)": [_significant(x) for x in minutes], "Speed-up": speedup,
        "Speed-up from": source, "Speed-up base": rows["speedup_base"],
    })
    return table if "words/s" in source else table.drop(columns="Speed-up from")


def money_table(rows: pd.DataFrame, instances: Mapping[tuple[str, str], str | None], market: str,
                price: Callable[[str, float, str], float]) -> pd.DataFrame:
    """Seed 004's money-speed table: the instance mix of each layout, and its wall time and dollars
    twice, as every dollar of the product is billed (docs/costs.md): from the launch to the run's last
    record (`wall_s`; start-up, validation and checkpoints are paid too), and from the launch to the
    threshold event (empty when it was not reached or the launch time is not known). Both are wall
    time, so the total is never less than the price to the threshold; a run whose wall time is not
    known has no total (its training seconds alone would under-bill it).

    `instances` maps (variant label, layout "NxG") to its instance mix; `price(mix, seconds,
    market)` gives the dollars (the catalog's billing: costs.studies). "Ran on" is the run's own
    backend: a local run is priced as if on the instances the study names.
    """
    out = []
    for _, r in rows.iterrows():
        layout = f"{r['nodes']}x{r['gpus_per_node']}"
        mix = instances.get((r["label"], layout))
        wall = _seconds(r.get("wall_s"))
        to_thr = _seconds(r.get("wall_to_threshold_s")) if r.get("reached_threshold") else None
        out.append({"Experiment": f"{r['label']} {layout}", "Ran on": r.get("backend") or "—",
                    "Instances": mix or "—", "Wall seconds": _rounded(wall, 1), "Wall hours": _hours(wall),
                    "Total Price ($)": price(mix, wall, market) if mix and wall is not None else None,
                    "Wall seconds to threshold": _rounded(to_thr, 1),
                    "Price to threshold ($)": price(mix, to_thr, market) if mix and to_thr is not None else None})
    return pd.DataFrame(out)


def _seconds(value: Any) -> float | None:
    """A number of seconds, None where it is missing (None, NaN)."""
    return None if value is None or pd.isna(value) else float(value)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _hours(seconds: float | None) -> float | None:
    """Hours to 3 significant digits: 7.7 s is 0.00214 h, not a 0.0 beside 7.7 seconds; 35,920 s is 9.98 h."""
    return None if seconds is None else float(f"{seconds / 3600:.3g}")


def money_note(market: str, backends: Sequence[str]) -> str:
    """What the money table's dollars are, under it: the study's named instances at the catalog price
    for each run's wall time, while the runs themselves ran where "Ran on" says (a local run has no price
    of its own, so the scaling report's cost section has no dollars for it)."""
    ran = ", ".join(sorted({str(b) for b in backends if b})) or "their own"
    return (f"Dollars: each run's wall time (launch to its last record, and launch to the threshold event) "
            f"billed per second, 60 s minimum per instance, at the catalog's {market} price of the instances the "
            f"study file names for its layout: what it would cost there. The runs ran on the {ran} backend; "
            "report.md prices runs at their own backend's price only, and has none for a backend without one.")


# ---- Markdown and figures ------------------------------------------------------------------------


def _header(title: str, seed_scale: str, here: str = "") -> list[str]:
    """The title, the seed's scale (the study file's words) and what ran here (made from what ran, so a
    `--scale test` study never reads as the seed's or the cpu scale's models)."""
    return [f"# {title}", "", f"Scale of the seed: {seed_scale.strip()}", "", *([here, ""] if here else [])]


def study_markdown(title: str, seed_scale: str, mode: str, variants: Sequence[str],
                   tables: Mapping[str, pd.DataFrame], report_name: str, here: str = "",
                   notes: Mapping[str, str] | None = None, warnings: Sequence[str] = ()) -> str:
    """study.md: the seed-shaped tables in order, each with its note (`notes`: table -> what its figures
    are measured against), then a link to the full scaling report and its plot. `warnings` (the study's own:
    `same_settings_warnings`) come before the tables, which they are about."""
    parts = [*_header(title, seed_scale, here), f"Scaling mode: {mode}; variants: {', '.join(variants)}.", ""]
    parts += [f"WARNING: {w}" for w in warnings] + ([""] if warnings else [])
    for name, df in tables.items():
        parts += [f"## {name.capitalize()}", "", markdown_table(df), ""]
        parts += [notes[name], ""] if notes and notes.get(name) else []
    parts += ["## Scaling", "", f"Full scaling report: [report.md]({report_name})", "", "![speedup](speedup.png)", ""]
    return "\n".join(parts)


#: A GEMM or step timing whose repeats spread more than this (interquartile range over median,
#: train.bench.timing_spread) is noise: flagged in the tables and left out of the batch advice.
NOISY_SPREAD = 0.2


@dataclass
class Knee:
    """Where one hidden size's throughput reaches `share` of its best, from its steady points only."""

    batch: int | None  # None: no steady point
    best: float | None  # the best steady figure, at best_batch
    best_batch: int | None
    noisy: list[tuple[int, float, float]]  # (batch, figure, spread) of the points left out

    def beaten(self) -> list[tuple[int, float, float]]:
        """The noisy points that measured more than the steady best: the knee may lie past the steady points."""
        return [n for n in self.noisy if self.best is not None and n[1] > self.best]


def batch_knees(rows: pd.DataFrame, value: str, share: float = 0.9, max_spread: float = NOISY_SPREAD) -> dict[int, Knee]:
    """Per hidden size, the smallest batch whose `value` reaches `share` of the best, both taken over the
    points whose timings spread no more than `max_spread`: a noisy point (a busy machine's dip or spike)
    neither sets the best nor is advised. Rows without a `spread` column (older CSVs) count as steady."""
    out = {}
    for hidden, grp in rows.sort_values("batch").groupby("hidden", sort=True):
        spread = grp["spread"] if "spread" in grp.columns else pd.Series(0.0, index=grp.index)
        steady = grp[spread <= max_spread]
        noisy = [(int(b), float(v), float(x)) for b, v, x in zip(grp["batch"], grp[value], spread) if x > max_spread]
        if steady.empty:
            out[int(hidden)] = Knee(None, None, None, noisy)
            continue
        top = steady.loc[steady[value].idxmax()]
        knee = steady[steady[value] >= share * top[value]]["batch"].iloc[0]
        out[int(hidden)] = Knee(int(knee), float(top[value]), int(top["batch"]), noisy)
    return out


def knee_advice(hidden: int, what: str, unit: str, k: Knee) -> str:
    """One line of advice: where `what` reaches 90% of its best, which batches were left out as noise, and
    no advice at all where the noise leaves none (no steady point, or a noisy one measured above the best)."""
    over = f"{NOISY_SPREAD:.0%}"
    if k.batch is None:
        return (f"- hidden {hidden}: {what}: no batch was measured steadily (every timing spread over {over}): "
                "no advice; measure again on a quieter machine")
    head = (f"- hidden {hidden}: {what} reaches 90% of its best {unit} at batch {k.batch} "
            f"(best {k.best:,.1f} at batch {k.best_batch})")
    if k.beaten():
        shown = ", ".join(f"{b} ({v:,.1f}, spread {x:.0%})" for b, v, x in k.beaten())
        return (f"{head} among its steady points only: batch {shown} measured more with timings spread over {over}, "
                "so this is no advice; measure again on a quieter machine")
    if k.noisy:
        shown = ", ".join(f"{b} ({x:.0%})" for b, _, x in k.noisy)
        head += f"; not counted, their timings spread over {over}: batch {shown}"
    return head


def _noisy_cells(df: pd.DataFrame, value: str, columns: list[str], digits: int) -> pd.DataFrame:
    """A wide table (a row per batch, a column per `columns` key) of `value`, a noisy cell marked."""
    spread = df["spread"] if "spread" in df.columns else pd.Series(0.0, index=df.index)
    text = [f"{v:,.{digits}f}" + (" (noisy)" if x > NOISY_SPREAD else "") for v, x in zip(df[value], spread)]
    return df.assign(cell=text).pivot(index="batch", columns=columns, values="cell")


#: How seed 003's ops are named, said under every table and plot of them (train.bench.GEMM_OPS).
GEMM_NAMING = ("GEMM ops are named as in the seed and cuBLAS (column-major): NN forward U·h, TN backward U^T·δ, "
               "NT update δ·h^T (PyTorch, row-major, computes them as h @ U, δ @ U.T and h.T @ δ).")


def gemm_table(gemm: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Seed 003's table: a row per batch, GEMM GFLOP/s per (hidden, op) and step words/s per hidden."""
    order = {op: i for i, op in enumerate(dict.fromkeys(gemm["op"]))}
    table = _noisy_cells(gemm, "gflops", ["hidden", "op"], 1)
    table = table[sorted(table.columns, key=lambda c: (c[0], order[c[1]]))]
    table.columns = [f"H={h} {op} (GFLOP/s)" for h, op in table.columns]
    wide = _noisy_cells(steps, "words_per_s", ["hidden"], 0)
    wide.columns = [f"step H={h} (words/s)" for h in wide.columns]
    return table.join(wide).reset_index().astype({"batch": int})


def gemm_markdown(title: str, seed_scale: str, here: str, gemm: pd.DataFrame, steps: pd.DataFrame,
                  preset: str) -> str:
    """Seed 003's study.md: GEMM GFLOP/s and training-step words/s against batch size in one table
    (a row per batch), each point's noise flagged, and where each hidden size reaches 90% of its best
    (`batch_knees`: from the steady points only)."""
    parts = [*_header(title, seed_scale, here),
             "## Recurrent multiply and training step throughput against batch size", "",
             markdown_table(gemm_table(gemm, steps)), "",
             f"{GEMM_NAMING} GEMM: the best of its repeats; step: the median of its steps. (noisy): the "
             f"repeats' spread (interquartile range over median, in gemm.csv and step.csv) is over "
             f"{NOISY_SPREAD:.0%}; such points are left out of the advice below.", "",
             "## Where to pick the batch", "", *gemm_advice(gemm, steps, preset),
             "", "![GEMM and step throughput against batch size](gemm.png)", ""]
    return "\n".join(parts)


def plot_gemm(gemm: pd.DataFrame, steps: pd.DataFrame) -> Figure:
    """Two panels: GEMM GFLOP/s per (hidden, op) and training-step words/s per hidden, against batch;
    a noisy point (`NOISY_SPREAD`) is ringed in red."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.6))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    for (h, op), g in gemm.groupby(["hidden", "op"], sort=False):
        ax1.plot(g["batch"], g["gflops"], marker="o", ms=3, label=f"H={h} {op}")
    ax1.set(xlabel="batch size", ylabel="GFLOP/s", title="Recurrent GEMM (ops as the seed names them)")
    for h, g in steps.groupby("hidden"):
        ax2.plot(g["batch"], g["words_per_s"], marker="o", ms=3, label=f"hidden {h}")
    ax2.set(xlabel="batch size", ylabel="words/s", title="One training step")
    for ax, df, value in ((ax1, gemm, "gflops"), (ax2, steps, "words_per_s")):
        noisy = df[df["spread"] > NOISY_SPREAD] if "spread" in df.columns else df.iloc[0:0]
        if len(noisy):
            ax.scatter(noisy["batch"], noisy[value], s=60, facecolors="none", edgecolors="red",
                       label=f"noisy (spread > {NOISY_SPREAD:.0%})")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.text(0.5, 0.01, "NN forward U·h, TN backward U^T·δ, NT update δ·h^T (cuBLAS, column-major)",
             ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def gemm_advice(gemm: pd.DataFrame, steps: pd.DataFrame, preset: str) -> list[str]:
    """The advice lines of seed 003's study.md (`knee_advice`), one per hidden size of the GEMM and the step."""
    return [*[knee_advice(h, "the forward recurrent GEMM (NN)", "rate", k)
              for h, k in batch_knees(gemm[gemm["op"] == "NN forward"], "gflops").items()],
            *[knee_advice(h, f"the {preset} training step", "words/s", k)
              for h, k in batch_knees(steps, "words_per_s").items()]]


def gemm_html(path: Path, title: str, here: str, gemm: pd.DataFrame, steps: pd.DataFrame, preset: str,
              plot: bytes) -> Path:
    """report.html of a GEMM study: what ran, the table, its caption, the advice and the plot (`plot`: gemm.png's
    bytes), one self-contained page like a scaling study's."""
    import html

    from scalelab.analysis.html import _img, _table, write_html

    table = gemm_table(gemm, steps)
    items = "".join(f"<li>{html.escape(line[2:])}</li>" for line in gemm_advice(gemm, steps, preset))
    sections = [("What ran", f"<p>{html.escape(here)}</p>"),
                ("Throughput against batch size", _table([str(c) for c in table.columns], table.values.tolist())
                 + f"<p class='note'>{html.escape(GEMM_NAMING)} (noisy): timings spread over {NOISY_SPREAD:.0%}.</p>"),
                ("Where to pick the batch", f"<ul>{items}</ul>"),
                ("Plot", _img(plot, "GEMM and step throughput against batch size"))]
    return write_html(path, f"Study: {title}", sections, intro="A GEMM study: single-process timings, no training runs.")
