"""The seeds' tables and figures, computed from a study's runs.

Pure: summaries and per-step tables in, DataFrames, Markdown and figures out. `launch study`
(scalelab/launcher/study.py) runs the sweeps, reads the records and writes the files; the money table's
dollars come from scalelab/costs/studies.py, which passes the catalog's billing in as `price`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import pandas as pd

from scalelab.analysis.report import markdown_table
from scalelab.analysis.scaling import LayoutSummary, scale_layouts

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TABLES",
    "StudyRuns",
    "study_runs",
    "study_speedups",
    "seed_table",
    "throughput_table",
    "epochs_table",
    "convergence_table",
    "arrangement_table",
    "money_table",
    "steps_per_epoch",
    "study_markdown",
    "gemm_markdown",
    "plot_gemm",
]

#: The seed-shaped tables a study file may ask for (`tables:`).
TABLES = ("throughput", "epochs", "convergence", "arrangement", "money")


@dataclass
class StudyRuns:
    """A study's runs, ready for the seed tables.

    `rows` is the scaling table of the runs (`scale_layouts`) with three more columns: run (its
    key in the dicts below), train_s (seconds of all its steps) and speedup (`study_speedups`).
    `epoch_times` holds the seconds of each epoch's steps per run (a partial last epoch: its
    steps so far), `epochs_to` the fractional epochs until the loss threshold (steps to it over
    steps per epoch), None when it was not reached, and `epochs_run` the fractional epochs of all
    the run's steps; both None when the steps per epoch are not known (`steps_per_epoch`).
    """

    rows: pd.DataFrame
    epoch_times: dict[str, list[float]]
    epochs_to: dict[str, float | None]
    epochs_run: dict[str, float | None] = field(default_factory=dict)


def steps_per_epoch(summary: LayoutSummary, steps: pd.DataFrame) -> int | None:
    """Steps of one epoch: as the run recorded it (its start record), else counted in the first epoch
    of its per-step table when a later one began (so the first is complete); else None."""
    if summary.steps_per_epoch:
        return summary.steps_per_epoch
    epochs = steps["epoch"]
    if not len(steps) or epochs.max() == epochs.min():
        return None
    return int((epochs == epochs.min()).sum())


def study_runs(runs: Sequence[tuple[str, LayoutSummary, pd.DataFrame]]) -> StudyRuns:
    """`StudyRuns` of (run key, summary, per-step table from `analysis.scaling.step_table`) per run."""
    epoch_times, epochs_to, epochs_run, train_s = {}, {}, {}, {}
    for key, summary, steps in runs:
        epoch_times[key] = steps.groupby("epoch")["t_step"].sum().tolist()
        train_s[key] = float(steps["t_step"].sum())
        per = steps_per_epoch(summary, steps)
        reached = summary.steps_to_threshold
        epochs_to[key] = round(reached / per, 2) if reached and per else None
        epochs_run[key] = len(steps) / per if per else None
    rows = scale_layouts([summary for _, summary, _ in runs])
    key_of = {(s.label, s.nodes, s.gpus_per_node): key for key, s, _ in runs}
    rows["run"] = [key_of[(lab, n, g)] for lab, n, g in zip(rows["label"], rows["nodes"], rows["gpus_per_node"])]
    rows["train_s"] = [train_s[r] for r in rows["run"]]
    rows["speedup"] = study_speedups(rows)
    return StudyRuns(rows, epoch_times, epochs_to, epochs_run)


def study_speedups(rows: pd.DataFrame) -> list[float]:
    """Speedup of every run against its variant's smallest layout, or - for a variant with no run at
    the study's smallest worker count (the same 4 GPUs arranged, a mixed pair) - against the first
    variant's smallest layout, as seed 004 compares everything with one g3.4xlarge."""
    fewest = rows["workers"].min()
    first = rows.iloc[0]
    base = {}
    for label, grp in rows.groupby("label", sort=False):
        small = grp.loc[grp["workers"].idxmin()]
        base[label] = small["words_per_s"] if small["workers"] == fewest else first["words_per_s"]
    return [r["words_per_s"] / base[r["label"]] for _, r in rows.iterrows()]


def seed_table(name: str, data: StudyRuns, epochs_shown: int = 3) -> pd.DataFrame:
    """The table `name` of TABLES, except money, which needs prices (costs.studies.price_money_table)."""
    if name == "throughput":
        return throughput_table(data.rows)
    if name == "epochs":
        return epochs_table(data.rows, data.epoch_times, epochs_shown)
    if name == "convergence":
        return convergence_table(data.rows, data.epochs_to)
    if name == "arrangement":
        return arrangement_table(data.rows, data.epochs_run)
    raise ValueError(f"seed_table makes {', '.join(t for t in TABLES if t != 'money')}, not {name!r}")


def throughput_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Seed 001's table: GPUs, batch per GPU, total time of the measured batches, words/s, speedup."""
    return pd.DataFrame({
        "variant": rows["label"], "GPU number": rows["workers"],
        "Batch size (per GPU)": rows["global_batch"] // rows["workers"],
        "Measured batches": rows["steps_measured"],
        "Total time of measured batches (s)": (rows["step_s_mean"] * rows["steps_measured"]).round(3),
        "Processing speed (words/s)": rows["words_per_s"].round(1),
        "Speedup ratio": rows["speedup"].round(2),
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
    """Seed 004's convergence: epochs and time to the loss threshold per layout."""
    return pd.DataFrame({
        "variant": rows["label"], "layout": rows["nodes"].astype(str) + "x" + rows["gpus_per_node"].astype(str),
        "workers": rows["workers"], "threshold": rows["loss_threshold"],
        "reached": rows["reached_threshold"], "steps to threshold": rows["steps_to_threshold"],
        "epochs to threshold": [epochs_to.get(r) for r in rows["run"]],
        "time to threshold (s)": pd.to_numeric(rows["time_to_threshold_s"], errors="coerce").round(2),
    })


def arrangement_table(rows: pd.DataFrame, epochs_run: dict[str, float | None]) -> pd.DataFrame:
    """Seed 004's arrangement table: nodes, GPUs per node, time per epoch, speedup. Minutes per
    epoch are the training time over the fractional epochs run: a partial last epoch counts as
    the part it is, not as a whole one."""
    per_epoch = [train_s / epochs_run[r] / 60 if epochs_run.get(r) else None
                 for r, train_s in zip(rows["run"], rows["train_s"])]
    return pd.DataFrame({
        "variant": rows["label"], "# of Node": rows["nodes"], "# of GPUs per Node": rows["gpus_per_node"],
        "Time (min/epoch)": [round(x, 4) if x else None for x in per_epoch], "Speed-up": pd.to_numeric(rows["speedup"], errors="coerce").round(2),
    })


def money_table(rows: pd.DataFrame, instances: Mapping[tuple[str, str], str | None], market: str,
                price: Callable[[str, float, str], float]) -> pd.DataFrame:
    """Seed 004's money-speed table: the instance mix of each layout, and its seconds, hours and
    dollars twice, each column with one meaning: the training time of all the run's steps, and
    the wall time from the launch to the threshold event (start-up, validation and checkpoints
    are paid too; empty when the threshold was not reached or the launch time is not known).

    `instances` maps (variant label, layout "NxG") to its instance mix; `price(mix, seconds,
    market)` gives the dollars (the catalog's billing: costs.studies).
    """
    out = []
    for _, r in rows.iterrows():
        layout = f"{r['nodes']}x{r['gpus_per_node']}"
        mix = instances.get((r["label"], layout))
        to_thr = r.get("wall_to_threshold_s") if r.get("reached_threshold") else None
        to_thr = None if to_thr is None or pd.isna(to_thr) else float(to_thr)
        out.append({"Experiment": f"{r['label']} {layout}", "Instances": mix or "—",
                    "Seconds (all steps)": round(r["train_s"], 1), "Hours (all steps)": round(r["train_s"] / 3600, 4),
                    "Total Price ($)": price(mix, r["train_s"], market) if mix else None,
                    "Wall seconds to threshold": None if to_thr is None else round(to_thr, 1),
                    "Price to threshold ($)": price(mix, to_thr, market) if mix and to_thr is not None else None})
    return pd.DataFrame(out)


# ---- Markdown and figures ------------------------------------------------------------------------


def _header(title: str, seed_scale: str) -> list[str]:
    return [f"# {title}", "", f"Scale of the seed: {seed_scale.strip()}", ""]


def study_markdown(title: str, seed_scale: str, mode: str, variants: Sequence[str],
                   tables: Mapping[str, pd.DataFrame], report_name: str) -> str:
    """study.md: the seed-shaped tables in order, then a link to the full scaling report and its plot."""
    parts = [*_header(title, seed_scale), f"Scaling mode: {mode}; variants: {', '.join(variants)}.", ""]
    for name, df in tables.items():
        parts += [f"## {name.capitalize()}", "", markdown_table(df), ""]
    parts += ["## Scaling", "", f"Full scaling report: [report.md]({report_name})", "", "![speedup](speedup.png)", ""]
    return "\n".join(parts)


def gemm_markdown(title: str, seed_scale: str, gemm: pd.DataFrame, steps: pd.DataFrame,
                  knees: Mapping[int, int], step_knees: Mapping[int, int], preset: str) -> str:
    """Seed 003's study.md: GEMM GFLOP/s and training-step words/s against batch size in one table
    (a row per batch), and where each hidden size reaches 90% of its best (`knees`, `step_knees`:
    hidden size -> batch, from train.bench.knee)."""
    table = gemm.pivot_table(index="batch", columns=["hidden", "op"], values="gflops").round(1)
    table.columns = [f"H={h} {op} (GFLOP/s)" for h, op in table.columns]
    wide = steps.pivot_table(index="batch", columns="hidden", values="words_per_s").round(0)
    wide.columns = [f"step H={h} (words/s)" for h in wide.columns]
    parts = [*_header(title, seed_scale),
             "## Recurrent multiply and training step throughput against batch size", "",
             markdown_table(table.join(wide).reset_index().astype({"batch": int})), "",
             "## Where to pick the batch", "",
             *[f"- hidden {h}: the forward recurrent GEMM reaches 90% of its best rate at batch {b}" for h, b in knees.items()],
             *[f"- hidden {h}: the {preset} training step reaches 90% of its best words/s at batch {b}"
               for h, b in step_knees.items()], "", "![GEMM and step throughput against batch size](gemm.png)", ""]
    return "\n".join(parts)


def plot_gemm(gemm: pd.DataFrame, steps: pd.DataFrame) -> Figure:
    """Two panels: GEMM GFLOP/s per (hidden, op) and training-step words/s per hidden, against batch."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    for (h, op), g in gemm.groupby(["hidden", "op"]):
        ax1.plot(g["batch"], g["gflops"], marker="o", ms=3, label=f"H={h} {op}")
    ax1.set(xlabel="batch size", ylabel="GFLOP/s", title="Recurrent GEMM (h @ U and its gradients)")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    for h, g in steps.groupby("hidden"):
        ax2.plot(g["batch"], g["words_per_s"], marker="o", ms=3, label=f"hidden {h}")
    ax2.set(xlabel="batch size", ylabel="words/s", title="One training step")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    return fig
