"""Self-contained HTML report (one file, images embedded) and the plots only it needs.

Why one file: it is mailed, attached to tickets and opened years later; linked images get lost.
Plots use matplotlib's Agg canvas (no pyplot state), like scalelab/costs/report.py, whose speedup and
throughput plots are reused. Every section starts with a sentence saying what it shows, so a
reader who never ran the tool can follow it.
"""

from __future__ import annotations

import base64
import html
import io
import math
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from scalelab.analysis.report import (DEFINITIONS, plot_speedup, plot_throughput, table_rows,
                                      terminal_frame)
from scalelab.core.engines import known_fact
from scalelab.core.terminal import dollars_text, duration_text, number_text
from scalelab.core.writes import check_inside

__all__ = ["plot_cost_frontier", "plot_phases", "plot_loss", "plot_predictions", "figure_png",
           "png_file", "write_html", "scaling_sections", "plan_sections"]

_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0;font-size:90%}th,td{border:1px solid #ccc;padding:4px 8px}
.tw{max-width:100%;overflow-x:auto;margin:1em 0}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}th{background:#f3f3f3}img{max-width:100%}
.note{color:#555}.rec{background:#eef7ee;padding:.5em 1em;border-left:4px solid #4a4}
.warn{background:#fff6e0;padding:.5em 1em;border-left:4px solid #d90}"""


def _fig(panels: float = 1, height: float = 4.2) -> Figure:
    fig = Figure(figsize=(5.8 * panels, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def png_file(path: Path) -> bytes:
    return Path(path).read_bytes()


def plot_cost_frontier(candidates: pd.DataFrame) -> Figure:
    """Dollars against hours per candidate (colour = instance type), the Pareto frontier as a line."""
    from matplotlib.ticker import FuncFormatter

    fig = _fig(1.7, 4.6)
    ax = fig.subplots()
    scale = 60.0 if float(candidates["hours"].max()) < 1.5 else 1.0  # minutes for short jobs (ticks were 0.0054 h)
    for (itype, market), part in candidates.groupby(["instance_type", "market"], sort=False):
        ax.scatter(part["hours"] * scale, part["dollars"], label=f"{itype} ({market})", s=28,
                   marker="o" if market == "on-demand" else "^")
        for _, r in part.iterrows():
            ax.annotate(str(int(r["workers"])), (r["hours"] * scale, r["dollars"]), textcoords="offset points",
                        xytext=(3, 3), fontsize=7)
    front = candidates[candidates["pareto"]].sort_values("hours")
    ax.step(front["hours"] * scale, front["dollars"], where="post", color="black", lw=1.2, label="Pareto frontier")
    for _, r in candidates[candidates["recommendation"].notna()].iterrows():
        ax.scatter([r["hours"] * scale], [r["dollars"]], s=160, facecolors="none", edgecolors="green", lw=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.3g}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:,.3g}"))
    ax.set_xlabel("minutes (predicted)" if scale == 60.0 else "hours (predicted)")
    ax.set_ylabel("US dollars per run")
    ax.set_title("Cost against time (labels: workers; circled: recommended)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the points
    return fig


# One colour per step phase, in the phase breakdown and the per-rank timeline alike.
PHASE_COLORS = {"data": "#999999", "forward": "#4c72b0", "backward": "#dd8452", "exchange": "#c44e52",
                "optimizer": "#55a868"}


def exchange_overlapped(table: pd.DataFrame) -> bool:
    """Whether the exchange share is unknown because the engine overlaps it with the backward (DDP's
    all-reduce runs in hooks during the backward: no separate wait to time), not because it is 0."""
    if "share_exchange" not in table.columns:
        return False
    unknown = pd.to_numeric(table["share_exchange"], errors="coerce").isna()
    if "workers" in table.columns:
        unknown &= pd.to_numeric(table["workers"], errors="coerce") > 1  # one worker exchanges nothing
    if "engine" in table.columns:
        unknown &= table["engine"].map(lambda name: known_fact(name, "exchange_in_backward"))
    return bool(unknown.any())


def plot_phases(table: pd.DataFrame) -> Figure:
    """Stacked bars of the step-time shares (data, forward, backward, exchange, optimizer) per run; one run's
    as one bar across the page with each share written on it (a lone column read as a one-dot plot)."""
    if len(table) == 1:
        return _one_run_phases(table)
    fig = _fig(1.5)  # room for the legend beside the bars
    ax = fig.subplots()
    one_series = "label" not in table.columns or table["label"].nunique(dropna=False) <= 1  # then in the title
    names = [f"{'' if one_series else r.get('label', '')} {int(r['nodes'])}x{int(r['gpus_per_node'])}".strip()
             if {"nodes", "gpus_per_node"} <= set(table.columns) else str(i) for i, r in table.iterrows()]
    x = np.arange(len(table))
    bottom = np.zeros(len(table))
    for phase, v in phase_parts(table).items():
        label = "backward (incl. overlapped exchange)" if phase == "backward" and exchange_overlapped(table) else phase
        ax.bar(x, v, bottom=bottom, label=label, color=PHASE_COLORS[phase], width=0.6 if len(x) > 1 else 0.35)
        bottom += v
    ax.set_xticks(x, names, rotation=30 if len(x) > 1 else 0, ha="right" if len(x) > 1 else "center", fontsize=7)
    ax.set_ylabel("share of step time (slowest rank)")
    ax.set_ylim(0, max(1.0, float(bottom.max()) if len(bottom) else 1.0) * 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_title("Where the step time goes" + (f": {table['label'].iloc[0]}" if one_series and "label" in table.columns
                                                and len(table) else ""), fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # a --script run records no phases: no legend (matplotlib warned)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars
    return fig


def _one_run_phases(table: pd.DataFrame) -> Figure:
    fig = _fig(2, 1.9)
    ax = fig.subplots()
    left = 0.0
    overlapped = exchange_overlapped(table)
    for phase, v in phase_parts(table).items():
        share = float(v[0])
        label = "backward (incl. overlapped exchange)" if phase == "backward" and overlapped else phase
        ax.barh([0], [share], left=left, color=PHASE_COLORS[phase], label=label, height=0.6)
        if share >= 0.07:
            ax.text(left + share / 2, 0, f"{phase}\n{share:.0%}", ha="center", va="center", fontsize=8, color="white")
        left += share
    ax.set_xlim(0, max(1.0, left))
    ax.set_yticks([])
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("share of step time (slowest rank)")
    r = table.iloc[0]
    layout = f" {int(r['nodes'])}x{int(r['gpus_per_node'])}" if {"nodes", "gpus_per_node"} <= set(table.columns) else ""
    ax.set_title(f"Where the step time goes: {r.get('label', '') or ''}{layout}".rstrip(": "), fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # a --script run records no phases: no legend (matplotlib warned)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def phase_parts(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each phase's share of the step per row, adding up to the step: the records' `backward_s` includes the
    exchange wait (`exchange_s`, docs/records.md), so the backward drawn is the backward without it (the
    Horovod bar summed to 143 %: backward and exchange stacked both counted the wait)."""
    cols = [c for c in ("share_data", "share_forward", "share_backward", "share_exchange", "share_optimizer")
            if c in table.columns and pd.to_numeric(table[c], errors="coerce").notna().any()]  # DDP: no exchange
    parts = {c.removeprefix("share_"): pd.to_numeric(table[c], errors="coerce").fillna(0.0).to_numpy(dtype=float)
             for c in cols}
    if "backward" in parts and "exchange" in parts:
        parts["backward"] = np.clip(parts["backward"] - parts["exchange"], 0.0, None)
    return parts


def plot_loss(curves: dict[str, pd.DataFrame]) -> Figure:
    """Training loss against seconds since the run's first step, one line per layout."""
    fig = _fig(1)
    ax = fig.subplots()
    for name, df in curves.items():
        if len(df):
            ax.plot(df["seconds"], df["loss"], label=name, lw=1)
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("training loss")
    ax.set_title("Loss against time")
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend(fontsize=7)
    return fig


def plot_predictions(predictions: pd.DataFrame, unit: str = "words/s") -> Figure:
    """Measured throughput (dots) and the fitted model with its interval, per series, in `unit` (words/s for
    runs; a --from-csv table's own unit); the legend beside the plot."""
    fig = _fig(1.7)
    ax = fig.subplots()
    for label, part in predictions.groupby("label", sort=False):
        part = part.sort_values("workers")
        (line,) = ax.plot(part["workers"], part["predicted_throughput"], lw=1.2,
                          label=f"{label or 'series'}: {part['model'].iloc[0]} model")
        ax.fill_between(part["workers"], part["interval_low"], part["interval_high"], alpha=0.2,
                        color=line.get_color())
        m = part[part["measured_throughput"].notna()]
        ax.scatter(m["workers"], m["measured_throughput"], color=line.get_color(), zorder=3, s=20)
    ax.set_xlabel("workers (GPUs)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a worker count is whole (ticks read 1.5, 2.5)
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_title("Measured (dots) and predicted throughput with interval")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        s = html.escape(str(v))
        numeric = s.replace(",", "").replace(".", "").replace("%", "").replace("$", "").replace("-", "").strip().isdigit()
        if numeric:
            return f'<td class="n">{s}</td>'
        # a short figure with its unit (4.3 ± 2.1, 328 MiB RSS, 22 % / 0 %) on one line; text wraps between words
        short_figure = len(str(v)) <= 16 and any(ch.isdigit() for ch in str(v))
        return f"<td>{s.replace(' ', '&nbsp;') if short_figure else s}</td>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows)
    return f"<div class='tw'><table><tr>{head}</tr>{body}</table></div>"  # wider than the page: scrolls inside


def scaling_sections(table: pd.DataFrame, curves: dict[str, pd.DataFrame] | None = None) -> list[tuple[str, str]]:
    """Sections for a scaling table: table, speedup/efficiency, throughput, phases, loss."""
    secs = []
    shown, title = terminal_frame(table, "Series")  # the words all labels share said once, above the table
    headers, rows = table_rows(shown)
    series = f" {html.escape(title)}." if title != "Series" else ""
    secs.append(("Scaling", f"<p>One row per layout; speedup and efficiency are relative to the "
                 f"smallest layout of each series.{series}</p>" + _table(headers, rows)))
    if not scales(table):  # one layout per series: a speedup plot would be one dot at 1.0
        if len(table):
            secs.append(("Speedup and efficiency", "<p class='note'>Each series was measured on one layout only, so "
                         "there is no speedup or efficiency to show: they compare layouts (`launch sweep --workers "
                         "1,2,4` measures several). The table above has this run's throughput; its phases, loss and "
                         "per-rank timeline follow.</p>"))
    else:
        secs += _scaling_plots(table)
    if any(c in table.columns for c in ("share_data", "share_exchange")) and len(table):
        overlap = ("<p class='note'>Exchange: DDP all-reduces the gradients during the backward pass (it overlaps "
                   "the backward), so its time is inside <b>backward</b>, not 0%.</p>" if exchange_overlapped(table) else "")
        secs.append(("Phase breakdown", "<p>Share of each step spent loading data, computing and exchanging "
                     "gradients, on the slowest rank.</p>" + overlap + _img(figure_png(plot_phases(table)), "phases")))
    if curves:
        secs.append(("Loss against time", _img(figure_png(plot_loss(curves)), "loss")))
    defs = "".join(f"<li><b>{html.escape(n)}</b>: {html.escape(t)}</li>" for n, t in DEFINITIONS)
    secs.append(("Definitions", f"<ul>{defs}</ul>"))
    return secs


def _scaling_plots(table: pd.DataFrame) -> list[tuple[str, str]]:
    """Speedup and efficiency, throughput: for series measured at two worker counts or more."""
    secs = []
    with tempfile.TemporaryDirectory() as tmp:
        if {"speedup", "efficiency", "workers"} <= set(table.columns):
            png = png_file(plot_speedup(table, Path(tmp) / "s.png"))
            secs.append(("Speedup and efficiency", "<p>Dashed: ideal (linear) scaling.</p>" + _img(png, "speedup")))
        if any(c in table.columns for c in ("words_per_s", "throughput")):
            png = png_file(plot_throughput(table, Path(tmp) / "t.png"))
            secs.append(("Throughput", "<p>Total work per second, and per worker (flat = perfect scaling).</p>"
                         + _img(png, "throughput")))
    return secs


def scales(table: pd.DataFrame) -> bool:
    """Whether some series of the table was measured at two worker counts or more (what a speedup needs)."""
    if "workers" not in table.columns or not len(table):
        return False
    series = table.groupby("label")["workers"] if "label" in table.columns else [(None, table["workers"])]
    return any(pd.Series(w).nunique() > 1 for _, w in series)


def plan_sections(p: Any, unit: str = "words/s", unmet: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """Sections for a costs.planner.Plan: the recommendation first, then models, predictions, frontier;
    `unit`: what the throughput counts ("words/s", a --script run's "images/s", a table's own unit); `unmet`: the
    words for each asked limit no layout meets (recommendation -> the terminal's line). Why: the page showed the
    met recommendations only, so a --deadline-h nobody meets left it without an answer or a way out."""
    secs, unmet = [], unmet or {}
    recs = "".join(f"<li><b>{html.escape(k.replace('_', ' '))}</b>: "
                   f"{_recommendation(v) if v else html.escape(unmet[k].split(': ', 1)[-1])}</li>"
                   for k, v in p.recommendations.items() if v or k in unmet)
    if len(p.candidates) and recs:
        secs.append(("Recommendation", f"<ul class='rec'>{recs}</ul>"))
    secs += _models_section(p)
    secs += _layout_section(p)
    if len(p.predictions) and "interval_low" in p.predictions.columns:
        secs.append(("Predicted throughput", f"<p>Bands at {p.confidence:.0%}.</p>"
                     + _img(figure_png(plot_predictions(p.predictions, unit)), "predictions")))
    secs += _convergence_sections(p)
    if p.next_measurement:
        n = p.next_measurement
        secs.append(("Measure next", f"<p class='rec'>Measure <b>{n['workers']} worker{'s' if int(n['workers']) != 1 else ''}</b> "
                     f"({html.escape(str(n['label']) or 'series')}): {html.escape(n['why'])}.</p>"))
    if len(p.candidates):
        secs.append(("Cost against time", "<p>Each point is one layout on one instance type; the frontier "
                     "joins those that no other layout beats on both time and money.</p>"
                     + _img(figure_png(plot_cost_frontier(p.candidates)), "cost frontier")))
        secs.append(("Candidates", _candidates_table(p.candidates)))
    if p.notes:
        secs.append(("Notes", "<ul class='note'>" + "".join(f"<li>{html.escape(n)}</li>" for n in p.notes) + "</ul>"))
    return secs


def _models_section(p: Any) -> list[tuple[str, str]]:
    """The worker-count models of each series fitted; none for a plan of named layouts (`--predict`), which
    has no such fit: its table was printed empty."""
    if not p.fits:
        return []
    used = p.predictions.groupby("label")["model"].first().to_dict() if len(p.predictions) else {}
    model_rows = [[lab, used.get(lab, f.chosen), f"{len(f.measured)}",
                   *(("—" if f.held_out_error[m] is None else f"{f.held_out_error[m]:.1%}") for m in f.models)]
                  for lab, f in p.fits.items()]
    model_names = list(next(iter(p.fits.values())).models)
    return [("Scaling models", "<p>Each model was fitted to the measured layouts; the held-out error is the "
             "mean relative error predicting each measurement from the others. The model used is the one "
             "with the lowest held-out error on published scaling tables the plan never saw "
             "(docs/benchmarks.md).</p>"
             + _table(["series", "chosen", "measurements", *[f"{m} held-out error" for m in model_names]], model_rows))]


#: the layout table of a `--predict` plan, as plan.md has it (costs/cli.py's _LAYOUT_VIEW and _LAYOUT_THR_VIEW)
_LAYOUT_TIME = (("predicted_time_s", "time"), ("time_low_s", "low"), ("time_high_s", "high"))
_LAYOUT_RATE = (("predicted_throughput", "predicted /s"), ("throughput_low", "low /s"), ("throughput_high", "high /s"))


def _layout_section(p: Any) -> list[tuple[str, str]]:
    """Each named layout's predicted time (or throughput) with its band, its basis (measured or the step-time
    model) and its compute and exchange shares: what plan.md shows. Why: plan.html left this table out, so the
    page of a `--predict` plan showed no layout's prediction, only the candidates' dollars."""
    pred = p.predictions
    if not len(pred) or "layout" not in pred.columns:
        return []
    timed = "predicted_time_s" in pred.columns
    cells = _LAYOUT_TIME if timed else _LAYOUT_RATE
    show = duration_text if timed else number_text
    rows = [[r["layout"], r.get("model") or "", r.get("basis") or "",
             *(show(float(r[c])) if pd.notna(r.get(c)) else "—" for c, _ in cells),
             *(f"{float(r[c]):.0%}" if pd.notna(r.get(c)) else "—" for c in ("compute_share", "exchange_share"))]
            for _, r in pred.iterrows()]
    title = f"Predicted {'time' if timed else 'throughput per second'} of each layout"
    text = (f"<p>{p.confidence:.0%} band; basis: the layout's own measurement, or the step-time model; "
            "compute and exchange: their shares of its step.</p>")
    return [(title, text + _table(["layout", "model", "basis", *(h for _, h in cells), "compute", "exchange"], rows))]


def _candidates_table(candidates: pd.DataFrame) -> str:
    """Every priced layout, fastest first. Instances are written `COUNT*TYPE`, as the terminal, plan.md and
    plan.json write them (the page wrote `1× g5.xlarge`); the throughput column is left out when no row has
    one (a plan of layouts in seconds showed a column of "—")."""
    c = candidates.sort_values(["hours"])
    rate = "predicted_throughput" in c.columns and c["predicted_throughput"].notna().any()
    rows = [[r["label"], int(r["workers"]), r["layout"] if pd.notna(r.get("layout")) else
             f"{int(r['instances'])}*{r['instance_type']}", r["market"], r.get("speed_basis") or "",
             *([f"{r['predicted_throughput']:,.0f}" if pd.notna(r.get("predicted_throughput")) else "—"] if rate else []),
             *_time_and_dollars(r), "yes" if r["pareto"] else "", r["recommendation"] or ""] for _, r in c.iterrows()]
    return _table(["series", "workers", "instances", "market", "speed basis", *(["throughput /s"] if rate else []),
                   "time", "dollars", "frontier", "recommended"], rows)


def _time_and_dollars(r: Any) -> tuple[str, str]:
    """A candidate's time and dollars cells with their bad ends; "never" for a layout that never finishes (spot
    interruptions outpace its checkpoints: `never_finishes`). Why: those cells read "inf" on the page."""
    if isinstance(r.get("never_finishes"), str) and r.get("never_finishes") or not math.isfinite(float(r["hours"])):
        return "never", "never"
    hi_h = float(r["hours_high"])
    return (f"{duration_text(r['hours'] * 3600)} (up to {duration_text(hi_h * 3600) if math.isfinite(hi_h) else 'never'})",
            f"{dollars_text(float(r['dollars']))} (up to {dollars_text(float(r['dollars_high']))})")


def _recommendation(v: dict[str, Any]) -> str:
    """A recommendation as the terminal says it: its bounds, and a speed never measured on its type named."""
    speed = v.get("speed_basis")
    unmeasured = ("" if speed in (None, "measured", "probe") else
                  f"; <i>{html.escape(str(speed))} speed: never measured on {html.escape(v['instance_type'])}</i>")
    workers = int(v["workers"])
    where = (html.escape(str(v["layout"])) if v.get("layout") else
             f"{workers} worker{'s' if workers != 1 else ''} on {v['instances']}*{html.escape(v['instance_type'])}")
    return (f"{where} "
            f"({v['market']}): {duration_text(v['hours'] * 3600)} (up to {duration_text(v['hours_high'] * 3600)}), "
            f"${dollars_text(v['dollars'])} (up to ${dollars_text(v['dollars_high'])}){unmeasured}")


def _convergence_sections(p: Any) -> list[tuple[str, str]]:
    """The steps to the loss threshold: how each curve S(B) was known, and the batches asked for."""
    if not p.convergence:
        return []
    rows = [[label, f.basis, f"{f.runs} at {', '.join(map(str, f.batches))}", f"{f.s_min:,.0f}",
             "unbounded" if f.b_noise == float("inf") else f"{f.b_noise:,.0f}",
             "—" if f.noise_scale is None else f"{f.noise_scale:,.0f}", f.lr_rule] for label, f in p.convergence.items()]
    text = ("<p>S(B) = S_min (1 + B_noise / B) steps to the threshold at global batch B, fitted to runs at two or "
            "more batches (batch-fit) or from one batch and its measured noise scale (noise-scale). It holds for the "
            "learning-rate rule the runs used.</p>")
    body = text + _table(["series", "basis", "runs at batch", "S_min", "B_noise", "noise scale measured",
                          "learning-rate rule"], rows)
    if len(p.batch_predictions):
        b = p.batch_predictions
        body += _table(["series", "global batch", "steps", f"{p.confidence:.0%} band", "samples"], [
            [r["label"], int(r["global_batch"]), f"{r['predicted_steps_to_threshold']:,.0f}",
             f"{r['steps_low']:,.0f} – {r['steps_high']:,.0f}", f"{r['predicted_samples_to_threshold']:,.0f}"]
            for _, r in b.iterrows()])
    return [("Steps to the loss threshold", body)]


def write_html(path: Path, title: str, sections: Sequence[tuple[str, str]], intro: str = "") -> Path:
    """Write one self-contained HTML file with `sections` ((heading, html body) pairs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_inside(path.parent, path)  # a linked report.html is refused, its target not overwritten
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = "".join(f"<h2>{html.escape(h)}</h2>\n{b}\n" for h, b in sections)
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p class='note'>Generated {stamp} by scalelab. {html.escape(intro)}</p>\n{body}</body></html>\n",
        encoding="utf-8",
    )
    return path
