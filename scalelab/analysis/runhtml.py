"""The HTML report of runs, sweeps and studies: one self-contained page a team can share.

Why a page of its own beside `analysis.html`: the planner's page starts from predictions, this one
from what was measured, and a reader years later must know where the numbers came from, so it opens
with the provenance (versions, commit, host, CPU, GPU, backend). Plots are embedded as data URIs.
Cost points are handed in by the caller (costs/ sits above analysis/ and owns the prices).
"""

from __future__ import annotations

import html
import os
import platform
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import quote

import numpy as np
import pandas as pd

from scalelab.analysis.html import PHASE_COLORS, _fig, _img, _table, figure_png, scaling_sections, write_html
from scalelab.core.records import RunRecords

__all__ = ["provenance", "plot_loss_curves", "plot_rank_timeline", "plot_cost_time", "cost_points", "write_run_html"]

_PHASES = ("data_s", "forward_s", "backward_s", "exchange_s", "optimizer_s")


# (label, start-record field) of the provenance table: what ran, read back from the ranks' records
_PROVENANCE = (("scalelab", "scalelab_version"), ("PyTorch", "torch_version"), ("Horovod", "horovod_version"),
               ("Python", "python_version"), ("git commit", "git_commit"), ("host", "host"),
               ("CPU model", "cpu_model"), ("GPU model", "gpu_model"), ("rank devices", "device"))


def _recorded(runs: Sequence[RunRecords], column: str) -> str:
    """The distinct values of a start-record field over the runs; "unknown" when no run recorded it
    (runs from before it was recorded), "none" when recorded as null (no GPU, Horovod not installed)."""
    frames = [r.start[column] for r in runs if column in r.start.columns]
    if not frames:
        return "unknown"
    values = sorted({str(v) for f in frames for v in f.dropna()})
    return ", ".join(values) or "none"


def provenance(runs: Sequence[RunRecords]) -> list[tuple[str, str]]:
    """(name, value) rows saying what made the numbers, as the ranks recorded it in their start records
    (scalelab/core/provenance.py): software, source commit, machines, backend; then where the report was made."""
    backends = sorted({str(r.spec.backend) for r in runs})
    rows = [(label, _recorded(runs, column)) for label, column in _PROVENANCE]
    return rows + [("backend", ", ".join(backends) or "unknown"),
                   ("report made on (host)", platform.node() or "unknown")]


def _name(run: RunRecords) -> str:
    """A run's legend label: its layout, and its directory when that says more (a sweep's layout
    directory is named after the layout: the legend read "1x1 1x1 train")."""
    layout = f"{run.spec.nodes}x{run.spec.gpus_per_node}"
    return layout if run.run_dir.name.startswith(layout) and len(run.run_dir.name) <= len(layout) + 3 \
        else f"{layout} {run.run_dir.name}"


def plot_loss_curves(runs: Sequence[RunRecords], threshold: float | None) -> Any:
    """Training (rank 0) and validation loss against steps and against seconds, with the threshold."""
    fig = _fig(2)
    by_step, by_time = fig.subplots(1, 2)
    for run in runs:
        steps = run.steps[run.steps["rank"] == 0] if len(run.steps) else run.steps
        if "loss" in steps and len(steps):
            # one clock for both curves: wall seconds since rank 0's first step began (the validation's
            # elapsed_s counts training seconds only, so a threshold at 2.9 s sat left of a curve ending at 4.3 s)
            t0 = float((pd.to_numeric(steps["time"]) - pd.to_numeric(steps["step_s"])).min())
            (line,) = by_step.plot(steps["step"], steps["loss"], lw=1, label=f"{_name(run)} train")
            by_time.plot(pd.to_numeric(steps["time"]) - t0, steps["loss"], lw=1, color=line.get_color())
            val = run.val[run.val["rank"] == 0] if len(run.val) else run.val
            if "val_loss" in val and len(val):
                by_step.plot(val["step"], val["val_loss"], "o--", ms=4, color=line.get_color(),
                             label=f"{_name(run)} validation")
                by_time.plot(pd.to_numeric(val["time"]) - t0, val["val_loss"], "o--", ms=4, color=line.get_color())
    for ax, xlabel in ((by_step, "step"), (by_time, "wall seconds since the first step")):
        if threshold is not None:
            ax.axhline(threshold, color="red", lw=1, ls=":", label="loss threshold" if ax is by_step else None)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss")
        ax.grid(True, alpha=0.3)
    by_step.set_title("Loss against steps (dashed: validation)")
    by_time.set_title("Loss against time")
    by_step.legend(fontsize=6)
    return fig


def plot_rank_timeline(run: RunRecords, last: int = 8) -> Any:
    """One row per rank, the phases of its last `last` steps laid out in time: a straggler's row is longer."""
    fig = _fig(2, 1.2 + 0.45 * max(run.ranks, 1))
    ax = fig.subplots()
    steps = run.steps[~run.steps["warmup"].astype(bool)] if "warmup" in run.steps else run.steps
    keep = sorted(steps["step"].unique())[-last:]
    steps = steps[steps["step"].isin(keep)]
    t0 = float((pd.to_numeric(steps["time"]) - pd.to_numeric(steps["step_s"])).min())
    colors = {phase: PHASE_COLORS[phase.removesuffix("_s")] for phase in _PHASES}  # as the phase breakdown
    def seconds(s: pd.Series, phase: str) -> float:
        value = s.get(phase)
        return 0.0 if value is None or pd.isna(value) else float(value)

    for _, s in steps.iterrows():
        left = float(s["time"]) - float(s["step_s"]) - t0
        for phase in _PHASES:
            width = seconds(s, phase)
            if phase == "backward_s":  # the records' backward includes the exchange wait drawn after it
                width = max(0.0, width - seconds(s, "exchange_s"))
            ax.barh(int(s["rank"]), width, left=left, color=colors[phase], edgecolor="none", height=0.6)
            left += width
    for phase, c in colors.items():
        ax.barh(0, 0, color=c, label=phase.removesuffix("_s"))
    ax.set_yticks(np.arange(run.ranks), [f"rank {r}" for r in range(run.ranks)])
    ax.set_xlabel("seconds")
    ax.set_title(f"Per-rank step phases, last {len(keep)} measured steps of {run.run_dir.name}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars
    return fig


def plot_cost_time(points: pd.DataFrame) -> Any:
    """Dollars against time per layout, with the frontier (none cheaper and faster). Axes in plain units
    (minutes or hours, dollars with a $): log axes gave ticks such as 1.25x10^-2 for a few cents; log
    only where the points span more than 30x."""
    from matplotlib.ticker import FuncFormatter

    fig = _fig(1.5, 4.6)
    ax = fig.subplots()
    minutes = float(points["hours"].max()) < 1.5
    x = points["hours"] * (60.0 if minutes else 1.0)
    ax.scatter(x, points["dollars"], s=28)
    for i, (xi, (_, r)) in enumerate(zip(x, points.iterrows())):  # alternate sides: neighbours do not overlap
        ax.annotate(str(r["layout"]), (xi, r["dollars"]), textcoords="offset points",
                    xytext=(4, 4) if i % 2 == 0 else (4, -11), fontsize=8)
    order = points.assign(x=x).sort_values("x")
    front = order[order["dollars"] <= order["dollars"].cummin()]
    ax.step(front["x"], front["dollars"], where="post", color="black", lw=1.2, label="frontier")
    for axis, values in ((ax.xaxis, x), (ax.yaxis, points["dollars"])):
        positive = values[values > 0]
        if len(positive) and float(positive.max()) > 30 * float(positive.min()):
            (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:,.3g}"))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.3g}"))
    ax.set_xlabel("minutes (billed)" if minutes else "hours (billed)")
    ax.set_ylabel("US dollars")
    ax.set_title("Cost against time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the points
    return fig


def cost_points(table: pd.DataFrame) -> pd.DataFrame | None:
    """Per priced run of a report's table: its layout, billed hours, dollars and price per hour, as the
    report priced it (its `dollars` column: costs.billing.run_cost, as `launch cost`); None when none is priced."""
    if "dollars" not in table.columns or not table["dollars"].notna().any():
        return None
    rows = table[table["dollars"].notna()]
    return pd.DataFrame({"layout": [f"{int(n)}x{int(g)}" for n, g in zip(rows["nodes"], rows["gpus_per_node"])],
                         "hours": pd.to_numeric(rows["billed_seconds"]) / 3600.0,
                         "dollars": pd.to_numeric(rows["dollars"]),
                         "usd_per_hour": pd.to_numeric(rows["usd_per_hour"])}).reset_index(drop=True)


def _cost_section(points: pd.DataFrame | None, basis: str) -> list[tuple[str, str]]:
    if points is None or not len(points):
        return [("Cost", f"<p>{html.escape(basis)}</p>")] if basis else []
    from scalelab.core.terminal import dollars_text, duration_text

    rows = [[r["layout"], duration_text(r["hours"] * 3600), dollars_text(r["dollars"]), f"{r['usd_per_hour']:,.2f}"]
            for _, r in points.iterrows()]
    table = _table(["layout", "billed time", "dollars", "$/hour"], rows)
    if len(points) < 2:  # one point is no trade-off to plot: the table says it
        return [("Cost", f"<p>{html.escape(basis)}</p>" + table)]
    return [("Cost against time", f"<p>{html.escape(basis)}</p>" + _img(figure_png(plot_cost_time(points)), "cost time")
             + table)]


def _href(path: Path, out: Path) -> str:
    """A link from the page in `out` to `path`: relative, so the page and its runs can move together."""
    try:
        return quote(Path(os.path.relpath(path.resolve(), Path(out).resolve())).as_posix())
    except ValueError:  # another drive (Windows): no relative path exists
        return path.resolve().as_uri()


def _profile_section(runs: Sequence[RunRecords], out: Path) -> list[tuple[str, str]]:
    """Links to the torch.profiler traces (Chrome trace format) recorded with --profile-steps."""
    items = [f"<li><a href='{html.escape(_href(p, out))}'>{html.escape(f'{run.run_dir.name}/{p.name}')}</a></li>"
             for run in runs for p in sorted((run.run_dir / "profile").glob("*.json"))]
    if not items:
        return []
    return [("Profiler traces", "<p>Open in chrome://tracing or https://ui.perfetto.dev.</p><ul>" + "".join(items) + "</ul>")]


def _study_table(df: pd.DataFrame) -> str:
    """One of a study's seed-shaped tables as it was written (its CSV), empty cells as a dash."""
    cells = df.astype(object).where(df.notna(), "—")
    return _table([str(c) for c in df.columns], cells.values.tolist())


def _warnings_section(warnings: Sequence[str]) -> list[tuple[str, str]]:
    """The results that cannot be trusted (analysis.scaling.trust_warnings and the report's own), first
    thing after the provenance: a reader must see them before the numbers they qualify."""
    if not warnings:
        return []
    items = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    return [("Warnings", f"<div class='warn'><p>{len(warnings)} result(s) below cannot be trusted as they "
                         f"stand:</p><ul>{items}</ul></div>")]


def write_run_html(out: Path, title: str, table: pd.DataFrame, runs: Sequence[RunRecords],
                   cost_points: pd.DataFrame | None = None, cost_basis: str = "",
                   warnings: Sequence[str] = (), tables: Sequence[tuple[str, pd.DataFrame]] = ()) -> Path:
    """Write report.html in `out`: provenance, warnings, scaling, `tables` (a study's), loss, timeline,
    cost, profiler links."""
    thresholds = {r.spec.loss_threshold for r in runs} - {None}
    threshold = min(thresholds) if thresholds else None
    secs = [("Provenance", "<p>What produced these numbers.</p>" + _table(["what", "value"], provenance(runs)))]
    secs += _warnings_section(warnings)
    secs += [s for s in scaling_sections(table) if s[0] != "Definitions"]
    secs += [(f"Study table: {name}", _study_table(df)) for name, df in tables]
    secs.append(("Training and validation loss", "<p>Rank 0's training loss per step and the validation "
                 "loss; the dotted red line is the loss threshold.</p>"
                 + _img(figure_png(plot_loss_curves(runs, threshold)), "loss curves")))
    widest = max(runs, key=lambda r: r.ranks)
    if len(widest.steps):
        secs.append(("Per-rank timeline", "<p>Each rank's steps of the largest layout in time; a rank whose "
                     "compute is longer makes the others wait in the exchange (a straggler).</p>"
                     + _img(figure_png(plot_rank_timeline(widest)), "rank timeline")))
    secs += _cost_section(cost_points, cost_basis)
    secs += _profile_section(runs, out)
    secs += [s for s in scaling_sections(table.iloc[0:0]) if s[0] == "Definitions"]
    return write_html(Path(out) / "report.html", title, secs, intro=f"{len(runs)} run(s).")
