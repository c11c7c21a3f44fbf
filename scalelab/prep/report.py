"""Scaling of prep itself, from prep records: `launch report PREP_DIR...` (runs or sweeps).

A small adapter over `analysis.scaling.scaling_table`: each prep run becomes one row whose
throughput is training-corpus lines per second over the prep's wall time (cluster start-up
excluded, reported apart), so speedup and efficiency follow the trainer's definitions in both
modes: strong (the same corpus on more workers) and weak (`--lines-per-worker`: the corpus grows
with the workers). Memory per worker is the peak resident size of its process over the run, and
its growth: how far that peak rose above the peak the worker had reached before its first task
(start-up and imports), i.e. what the prep itself needed.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from scalelab.analysis.report import _min_width, fitting, markdown_table
from scalelab.analysis.scaling import scaling_table
from scalelab.core.errors import RecordError
from scalelab.core.rundir import write_json
from scalelab.core.terminal import make_console
from scalelab.core.writes import refuse_links
from scalelab.prep.records import load_records, logs_hint
from scalelab.prep.request import read_request

COLUMNS = [  # (header, key, format)
    ("label", "label", "{}"), ("mode", "mode", "{}"), ("workers", "workers", "{}"),
    ("lines", "lines", "{:,}"), ("MB", "mb", "{:,.1f}"), ("wall s", "wall_s", "{:.2f}"),
    ("lines/s", "lines_per_s", "{:,.0f}"), ("lines/s/worker", "lines_per_s_per_worker", "{:,.0f}"),
    ("speedup", "speedup", "{:.2f}"), ("efficiency", "efficiency", "{:.0%}"),
    ("peak MB/worker", "peak_rss_mb", "{:,.0f}"), ("growth MB", "growth_mb", "{:,.0f}"),
    ("start-up s", "startup_s", "{:.1f}"),
]


def summarize(run_dir: Path) -> dict[str, Any]:
    """One prep run as a row: what it read, how long it took, per-phase seconds, memory."""
    request = read_request(run_dir)
    records = load_records(run_dir)
    tasks = [r for r in records if r["kind"] == "task"]
    phases = [r for r in records if r["kind"] == "phase"]
    scans = [t for t in tasks if t["phase"] == "scan"]
    if not scans or not any(p["phase"] == "manifest" for p in phases):
        errors = [r for r in records if r["kind"] == "failure"]
        why = (f"it stopped: {errors[-1]['message']}" if errors[-1]["error"] == "interrupted"
               else f"it failed: {errors[-1]['message']}") if errors else "no manifest phase in its records"
        raise RecordError(f"{run_dir}: the prep did not finish ({why})" + logs_hint(run_dir))
    wall = max(p["end"] for p in phases) - min(p["start"] for p in phases)
    lines = sum(t["lines"] for t in scans)
    peaks: dict[str, float] = {}
    for t in tasks:
        peaks[t["worker"]] = max(peaks.get(t["worker"], 0.0), t["peak_rss_mb"])
    before = {r["worker"]: r["peak_rss_mb"] for r in records if r["kind"] == "worker"}
    cluster = next((r for r in records if r["kind"] == "cluster"), {})
    workers = int(request["workers"])
    return {
        "label": request.get("name") or f"prep {request['model']} {request['backend']}",
        "run": str(run_dir), "model": request["model"], "backend": request["backend"], "mode": request["mode"],
        "workers": workers, "workers_seen": len(peaks), "lines": lines, "mb": sum(t["bytes"] for t in scans) / 2**20,
        "samples": sum(t["samples"] for t in scans), "tasks": len(tasks), "wall_s": wall,
        "lines_per_s": lines / wall, "lines_per_s_per_worker": lines / wall / workers,
        "phase_s": {p["phase"]: p["seconds"] for p in phases},
        "peak_rss_mb": max(peaks.values()), "peak_rss_mb_by_worker": peaks,
        "growth_mb": max(peaks[w] - before[w] for w in peaks if w in before) if set(before) & set(peaks) else None,
        "startup_s": cluster.get("startup_s"),
    }


def expand(paths: list[Path]) -> list[Path]:
    """Prep run directories, sweeps replaced by their runs."""
    out = []
    for p in paths:
        request = read_request(p)
        if "sweep" in request:
            out.extend(p / name for name in request["sweep"])
        else:
            out.append(p)
    return out


def scaling(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows with speedup and efficiency per label (relative to each label's fewest workers)."""
    df = pd.DataFrame(rows).sort_values(["label", "workers"], kind="stable").reset_index(drop=True)
    modes = set(df["mode"])
    return scaling_table(df.assign(throughput=df["lines_per_s"]), mode=modes.pop() if len(modes) == 1 else "strong")


def cells(df: pd.DataFrame) -> list[list[str]]:
    out = []
    for _, row in df.iterrows():
        out.append(["-" if row.get(key) is None or pd.isna(row.get(key)) else fmt.format(row[key])
                    for _, key, fmt in COLUMNS])
    return out


def markdown(df: pd.DataFrame, runs: list[Path]) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    headers = [h for h, _, _ in COLUMNS]
    lines = ["# Prep scaling report", "", f"_Generated {stamp} by scalelab from the prep records._", "",
             f"- runs: {', '.join(str(r) for r in runs)}",
             "- throughput: training-corpus lines / wall time of the prep (cluster start-up excluded); speedup and "
             "efficiency relative to the fewest workers of each label (weak mode: the corpus grows with the workers)",
             "- peak MB/worker: largest resident size of a worker process; growth: how far it rose during the prep", "",
             markdown_table(pd.DataFrame(cells(df), columns=headers), align_right=headers[2:])]  # as print_table aligns
    return "\n".join(lines) + "\n"


#: Columns left out first when the table is wider than the terminal (least needed first); the
#: Markdown and JSON reports keep every column. The training report does the same (analysis.report).
DROPPABLE = ("growth MB", "start-up s", "MB", "lines/s/worker", "mode", "lines", "peak MB/worker", "efficiency")
MORE = "more columns in report.md and report.json"


def fitting_columns(rows: list[list[str]], width: int) -> list[int]:
    """Indices of COLUMNS to show: the droppable ones left out, least needed first, until `width` fits
    (the training report's rule, `analysis.report.fitting`)."""
    return fitting([h for h, _, _ in COLUMNS], [[r[i] for r in rows] for i in range(len(COLUMNS))],
                   [key == "label" for _, key, _ in COLUMNS], DROPPABLE, width)


def print_table(df: pd.DataFrame, console: Console) -> None:
    """The scaling table at most the terminal's width: numbers never cut, the label wrapping between
    words, columns that do not fit left to report.md and report.json (said under it)."""
    width = console.width
    rows = cells(df)
    keep = fitting_columns(rows, width)
    table = Table(title="Prep scaling", header_style="bold")
    for i in keep:
        header, key, _ = COLUMNS[i]
        column = [r[i] for r in rows]
        if key == "label":
            table.add_column(header, justify="left", overflow="fold", min_width=_min_width(header, column, True), ratio=1)
        else:
            table.add_column(header, justify="left" if key == "mode" else "right", overflow="fold",
                             width=_min_width(header, column))
    for row in rows:
        table.add_row(*[row[i] for i in keep])
    if len(keep) < len(COLUMNS):
        table.caption = MORE
    console.print(table, width=width)


def report_dirs(paths: list[Path], out: Path | None, fmt: str) -> None:
    """`launch report` for prep runs: print the table (or JSON / Markdown), write report.md + .json."""
    runs = expand(paths)
    rows = [summarize(run) for run in runs]
    df = scaling(rows)
    out = out or (paths[0] if len(paths) == 1 else Path.cwd() / ("prep-report-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")))
    out.mkdir(parents=True, exist_ok=True)
    refuse_links(out, ("report.md", "report.json"))  # a planted link's target is never overwritten
    (out / "report.md").write_text(markdown(df, runs))
    records = json.loads(df.to_json(orient="records"))
    write_json(out / "report.json", records)
    console = make_console()
    if fmt == "json":
        print(json.dumps(records, indent=2))
    elif fmt == "markdown":
        print(markdown(df, runs), end="")
    else:
        print_table(df, console)
        console.print(f"report: [bold]{out / 'report.md'}[/]")
