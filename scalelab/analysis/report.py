"""Rendering of scaling tables: terminal (rich), Markdown report, PNG plots, JSON.

Nothing is computed here beyond formatting: the numbers come from `analysis.scaling`
(`scale_layouts` / `scaling_table`). Every renderer accepts either a full sweep table (summary
columns + scaling columns) or a bare scaling table (label, workers, throughput, speedup, ...):
columns that are absent are simply left out, so the same code renders measured sweeps and
published reference numbers.

Plots use matplotlib's Agg canvas directly (no pyplot, no display, no global state), so they
work on headless cluster nodes and in parallel tests. matplotlib is imported by the plot functions
only: the tables (`markdown_table`, used by `launch cost` and `launch plan`) do not pay for it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from rich.console import Console
from rich.table import Table
from scalelab.core.engines import known_fact
from scalelab.core.errors import DataError
from scalelab.core.terminal import cell_pieces, dollars_text, fold_cell, number_text, unbreakable_width, usd_text
from scalelab.core.writes import refuse_links

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DEFINITIONS",
    "dollars_text",
    "table_rows",
    "render_table",
    "print_scaling",
    "write_markdown",
    "markdown_table",
    "plot_speedup",
    "plot_throughput",
    "to_json_records",
    "write_json",
]

#: One line each, shown under every Markdown report (and usable as a terminal caption).
DEFINITIONS: tuple[tuple[str, str], ...] = (
    ("Throughput", "words (or a --script run's items, in its own unit: images/s) per second = sum over "
                   "measured steps and ranks of words / sum over steps of t_step, where t_step = max over "
                   "ranks of step_s (the slowest rank sets the step time); samples/s likewise. Warm-up "
                   "steps are excluded."),
    ("Speedup", "throughput of a layout / throughput of the smallest layout of the same series "
                "(the same ratio as t_base/t for a fixed problem and n·t_base/t for fixed work "
                "per worker)."),
    ("Efficiency", "speedup / n, with n = workers / workers of the smallest layout; 100 % is "
                   "perfect linear scaling."),
    ("Karp-Flatt serial fraction", "e = (1/S − 1/n)/(1 − 1/n); a value that grows with n points "
                                   "at overhead growing with the worker count (communication)."),
    ("Phase shares", "time in data loading / gradient exchange on the slowest rank of each step, "
                     "as a fraction of the total step time."),
    ("Time to threshold", "training seconds (validation excluded) until the validation loss first "
                          "reached the loss threshold."),
    ("Speedup and efficiency to threshold", "time to threshold of the smallest layout of the same series / "
                                            "this layout's, and that over n: where both reached the threshold "
                                            "(more workers can need more samples to converge, so these can be "
                                            "lower than the throughput's)."),
    ("Dollars", "the run's wall time from its launch to its last record (dollars), or to the threshold event "
                "($ to threshold), billed per second with a 60 s minimum per instance at its fleet's price "
                "(costs.billing.run_cost, as `launch cost`); runs with no price show none."),
    ("Noise scale", "the gradient noise scale B_simple = tr(Σ)/|G|² in samples (McCandlish et al. 2018), "
                    "pooled over the ranks and the later half of the steps up to the threshold: below it, a "
                    "larger global batch saves steps almost in proportion."),
)

_DASH = "—"


# --------------------------------------------------------------------------------------------------
# cell formatting (shared by the terminal and the Markdown table, so they always agree)


def _missing(x: Any) -> bool:
    if x is None or x is pd.NA or x is pd.NaT:
        return True
    try:
        return bool(isinstance(x, float) and math.isnan(x)) or bool(
            isinstance(x, (np.floating,)) and np.isnan(x)
        )
    except TypeError:
        return False


def _num(x: Any, fmt: str) -> str:
    return _DASH if _missing(x) or math.isinf(float(x)) else format(float(x), fmt)


def _pct(x: Any, digits: int = 1) -> str:
    return _DASH if _missing(x) else f"{100.0 * float(x):.{digits}f} %"


def _throughput_col(df: pd.DataFrame) -> str | None:
    for c in ("words_per_s", "throughput"):
        if c in df.columns:
            return c
    return None


def row_units(df: pd.DataFrame) -> list[str]:
    """Each row's unit of throughput: a --script run's own (`unit`: images, tokens, samples), else words."""
    if "unit" not in df.columns:
        return ["words"] * len(df)
    return ["words" if _missing(u) else str(u) for u in df["unit"]]


def throughput_header(df: pd.DataFrame) -> str:
    """The throughput column's header: "words/s" for the built-in trainer, a --script run's own unit
    ("images/s": issue 34, the reports said words/s of a script's items), "items/s" where the rows count
    different things (each row's unit is then a column of its own), "throughput" for a published table."""
    if _throughput_col(df) != "words_per_s":
        return "throughput"
    units = set(row_units(df))
    return f"{units.pop()}/s" if len(units) == 1 else "items/s"


def _script_rows_only(df: pd.DataFrame) -> bool:
    """Every row is a --script run: its samples are its items, so samples/s says the throughput again."""
    return "unit" in df.columns and len(df) > 0 and bool(df["unit"].notna().all())


def _layout(r: pd.Series) -> str:
    """nodes x GPUs per node; for a published table (`--from-csv`), which gives nodes and workers, the GPUs per
    node are the workers over the nodes: its 1x4, 2x2 and 4x1 rows read as three rows of 4 workers, with nothing
    saying which arrangement each was. Workers that do not split evenly over the nodes are said as such."""
    nodes, gpus = r.get("nodes"), r.get("gpus_per_node")
    if _missing(nodes):
        return _DASH
    if _missing(gpus):
        workers = r.get("workers")
        if _missing(workers):
            return _DASH
        if int(workers) % int(nodes):
            return f"{int(workers)} on {int(nodes)} nodes"
        gpus = int(workers) // int(nodes)
    return f"{int(nodes)}x{int(gpus)}"


def _step_ms(r: pd.Series) -> str:
    mean = r.get("step_s_mean")
    if _missing(mean):
        return _DASH
    std = r.get("step_s_std")
    s = f"{1000 * float(mean):.1f}"
    return s + (f" ± {1000 * float(std):.1f}" if not _missing(std) else "")


def _shares(r: pd.Series) -> str:
    """Data / exchange share; DDP's exchange, overlapped with the backward and so not timed apart, reads
    "in backward" (a dash read as "no exchange")."""
    exchange = _pct(r.get("share_exchange"), 0)
    if _missing(r.get("share_exchange")) and known_fact(r.get("engine"), "exchange_in_backward") \
            and not _missing(r.get("workers")) and int(r["workers"]) > 1:
        exchange = "in backward"
    return f"{_pct(r.get('share_data'), 0)} / {exchange}"


def _threshold(r: pd.Series) -> str:
    """Time (and steps) to the threshold, the seconds to 3 significant digits: at 0.1 s, 0.06 s and 0.14 s
    both read "0.1 s"."""
    reached = r.get("reached_threshold")
    t = r.get("time_to_threshold_s")
    if _missing(reached):
        return _seconds(t)
    if not bool(reached):
        return "not reached"
    out = _seconds(t)
    steps = r.get("steps_to_threshold")
    return out + (f" ({int(steps)} steps)" if not _missing(steps) else "")


def _seconds(t: Any) -> str:
    return _DASH if _missing(t) else f"{number_text(float(t))} s"


def _columns(df: pd.DataFrame) -> list[tuple[str, Callable[[pd.Series], str], bool]]:
    """(header, formatter, right-aligned) for each column the frame can fill."""
    has = set(df.columns)
    thr = _throughput_col(df)
    cols: list[tuple[str, Callable[[pd.Series], str], bool]] = []
    if "label" in has:
        cols.append(("label", lambda r: _DASH if _missing(r.get("label")) else str(r["label"]), False))
    if _distinct(df, "precision"):  # summaries from before mixed precision have none to show
        cols.append(("precision", lambda r: _DASH if _missing(r.get("precision")) else str(r["precision"]), False))
    if {"nodes", "gpus_per_node"} <= has or ({"nodes", "workers"} <= has and df["nodes"].notna().any()):
        cols.append(("layout (nodes x GPUs)", _layout, False))
    if "workers" in has:
        cols.append(("workers", lambda r: _num(r.get("workers"), ".0f"), True))
    if thr is not None:
        header = throughput_header(df)
        cols.append((header, lambda r: _num(r.get(thr), ",.0f"), True))
        if header == "items/s":  # rows of several units: each says its own
            cols.append(("unit", lambda r: "words" if _missing(r.get("unit")) else str(r["unit"]), False))
    if "samples_per_s" in has and not _script_rows_only(df):
        cols.append(("samples/s", lambda r: _num(r.get("samples_per_s"), ",.1f"), True))
    if "time_s" in has:
        cols.append(("time (s)", lambda r: _num(r.get("time_s"), ".3f"), True))
    if "step_s_mean" in has:
        cols.append(("step (ms, mean ± std)", _step_ms, True))
    if "speedup" in has:
        cols.append(("speedup", lambda r: _num(r.get("speedup"), ".2f"), True))
    if "efficiency" in has:
        cols.append(("efficiency", lambda r: _pct(r.get("efficiency")), True))
    if "karp_flatt" in has:
        cols.append(("serial fraction", lambda r: _num(r.get("karp_flatt"), ".3f"), True))
    if {"share_data", "share_exchange"} & has:
        cols.append(("data / exchange share", _shares, True))
    if {"reached_threshold", "time_to_threshold_s"} & has:
        cols.append(("time to threshold", _threshold, True))
    if "speedup_to_threshold" in has and df["speedup_to_threshold"].notna().any():
        cols.append(("speedup to threshold", lambda r: _num(r.get("speedup_to_threshold"), ".2f"), True))
        cols.append(("efficiency to threshold", lambda r: _pct(r.get("efficiency_to_threshold")), True))
    if "noise_scale" in has:
        cols.append(("noise scale (samples)", lambda r: _num(r.get("noise_scale"), ",.0f"), True))
    if "peak_mem_bytes" in has and df["peak_mem_bytes"].notna().any():
        cols.append(("peak mem/rank", _memory, True))
    if "dollars" in has and df["dollars"].notna().any():  # priced runs (`launch report --rate`, a cloud's catalog)
        cols.append(("dollars", lambda r: _usd(r.get("dollars")), True))
    if "dollars_to_threshold" in has and df["dollars_to_threshold"].notna().any():
        cols.append(("$ to threshold", lambda r: _usd(r.get("dollars_to_threshold")), True))
    return cols


def _usd(x: Any) -> str:
    """Dollars as `launch cost` shows them (`core.terminal.usd_text`: cents, or four decimals below a dollar: a
    short run costs a fraction of a cent), with the sign."""
    if _missing(x) or math.isinf(float(x)):
        return _DASH
    return f"${usd_text(float(x))}"


def _memory(r: pd.Series) -> str:
    """Peak memory of the hungriest rank: GiB, marked 'RSS' for a CPU process's whole resident set."""
    peak = r.get("peak_mem_bytes")
    if _missing(peak):
        return _DASH
    gib = float(peak) / 1024**3
    text = f"{gib:.2f} GiB" if gib >= 1 else f"{gib * 1024:.0f} MiB"
    return text + (" RSS" if r.get("mem_kind") == "max_rss" else "")


def table_rows(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells of the scaling table, as shown in the terminal and Markdown."""
    cols = _columns(df)
    rows = [[fmt(r) for _, fmt, _ in cols] for _, r in df.iterrows()]
    return [h for h, _, _ in cols], rows


# --------------------------------------------------------------------------------------------------
# terminal


#: Terminal width the tables are made to fit; what does not fit is in report.json and report.md.
TABLE_WIDTH = 100
#: Columns left out first when the table would be wider than the terminal, least needed first.
_DROPPABLE = ("efficiency to threshold", "speedup to threshold", "noise scale (samples)", "samples/s", "time (s)", "data / exchange share", "serial fraction",
              "step (ms, mean ± std)", "peak mem/rank", "peak RSS/rank", "$ to threshold", "efficiency", "layout (nodes x GPUs)",
              "layout", "time to threshold", "precision")


def _min_width(header: str, cells: list[str], text: bool = False) -> int:
    """A column never narrower than its longest cell (numbers do not break) or its longest header word;
    a `text` column (a label) only than its longest word: it wraps between words, so the numbers' headers
    never have to split inside a word ("speedu/p", "threshol/d" at 100 columns)."""
    if text:
        return max(len(w) for w in [*header.split(), *(w for c in cells for w in c.split()), ""])
    return max([len(w) for w in header.split()] + [len(c) for c in cells])


def _terminal_columns(df: pd.DataFrame) -> list[tuple[str, Callable[[pd.Series], str], bool]]:
    """The columns a terminal shows: those with something to say (a column of dashes only, such as "time to
    threshold" of runs without a threshold, goes), peak memory as "peak RSS/rank" when every row is a CPU
    process's resident set (the cells then drop their " RSS", which kept the column 11 wide)."""
    cols = []
    keep = {"label", throughput_header(df)} if no_items(df) else {"label"}  # its dash: no items (render_table)
    for header, fmt, right in _columns(df):
        cells = [fmt(r) for _, r in df.iterrows()]
        if header not in keep and len(cells) and all(c == _DASH for c in cells):
            continue
        if header == "layout (nodes x GPUs)":  # its cells (1x2) say the rest: "nodes x GPUs" took 3 header lines
            header = "layout"
        if header == "peak mem/rank" and len(cells) and all(c.endswith(" RSS") for c in cells):
            header, fmt = "peak RSS/rank", (lambda r, _f=fmt: _f(r).removesuffix(" RSS"))
        cols.append((header, fmt, right))
    return cols


def terminal_frame(df: pd.DataFrame, title: str) -> tuple[pd.DataFrame, str]:
    """The table as a terminal shows it, without repeating itself: the words every row's label shares go
    into the title ("Scaling: nmt-tiny fused fp32 horovod strong"), each label cell keeps the words that
    tell its series apart (no label column for one series), and the precision column goes when each
    label or the title says its row's precision already (labels are "MODEL RNN PRECISION ENGINE MODE")."""
    if "label" not in df.columns or not len(df):
        return df, title
    if "workers" in df.columns and df.groupby("label", dropna=False)["workers"].nunique().max() <= 1:
        # one layout per series (a single run): its speedup 1.00 and efficiency 100 % compare nothing
        df = df.drop(columns=[c for c in ("speedup", "efficiency", "karp_flatt", "speedup_to_threshold",
                                          "efficiency_to_threshold") if c in df.columns])
    labels = ["" if _missing(v) else str(v) for v in df["label"]]
    split = [lab.split() for lab in labels]
    common = [w for w in split[0] if all(w in words for words in split[1:])]
    if not common:
        return df, title
    df = df.copy()
    df["label"] = [" ".join(w for w in words if w not in common) or _DASH for words in split]
    if "precision" in df.columns:
        said = all(_missing(p) or str(p) in words for p, words in zip(df["precision"], split))
        if said:
            df = df.drop(columns=["precision"])
    if all(cell == _DASH for cell in df["label"]):
        df = df.drop(columns=["label"])
    return df, f"{title}: {' '.join(common)}"


def fitting(headers: Sequence[str], cells: Sequence[Sequence[str]], text: Sequence[bool], droppable: Sequence[str],
            width: int) -> list[int]:
    """Indices of the columns (`headers`, each column's `cells`, whether it is `text` that wraps) a boxed table
    keeps to fit `width`: those named in `droppable` left out, least needed first, until it fits (the scaling
    report's and the prep report's rule)."""
    keep = list(range(len(headers)))

    def needed(cols: list[int]) -> int:
        return sum(_min_width(headers[i], list(cells[i]), text[i]) + 3 for i in cols) + 1

    for name in droppable:
        if needed(keep) <= width:
            break
        keep = [i for i in keep if headers[i] != name]
    return keep


def fitting_columns(df: pd.DataFrame, width: int = TABLE_WIDTH) -> list[tuple[str, Callable[[pd.Series], str], bool]]:
    """The table's columns, the droppable ones left out (least needed first) until it fits `width`; never the
    headline throughput (`throughput_header`), whatever its unit. Why: "samples/s" is droppable as the built-in
    models' second column, but it is a --script's headline (its items), and a script sweep's table lost its only
    throughput column at any width."""
    cols = _terminal_columns(df)
    cells = [[fmt(r) for _, r in df.iterrows()] for _, fmt, _ in cols]
    text = [not right and i == 0 for i, (_, _, right) in enumerate(cols)]
    headers = [h for h, _, _ in cols]
    headline = throughput_header(df)
    droppable = [name for name in _DROPPABLE if name != headline]
    keep = fitting(headers, cells, text, droppable, width)
    if text and text[0] and sum(_min_width(headers[i], cells[i], text[i]) + 3 for i in keep) + 1 > width:
        # a label's word wider than the room left (a long --name, a script's arguments): it folds between its
        # parts (`render_table`), so the columns are fitted to those
        cells[0] = [" ".join(cell_pieces(c, hyphens=True)) for c in cells[0]]
        keep = fitting(headers, cells, text, droppable, width)
    return [cols[i] for i in keep]


def render_table(df: pd.DataFrame, title: str = "Scaling", width: int | None = None) -> Table:
    """A rich Table of the scaling DataFrame (one row per layout), numbers right-aligned; given a
    `width`, one that fits it: headers wrap between words, numbers never break, columns that do not fit go."""
    table = Table(title=title, show_lines=False, header_style="bold")
    cols = fitting_columns(df, width) if width else _columns(df)
    rows = [[fmt(r) for _, fmt, _ in cols] for _, r in df.iterrows()]
    for i, (header, _, right) in enumerate(cols):
        cells = [row[i] for row in rows]
        if right or i or header != "label":  # numbers and short text: as wide as they need, never folded
            table.add_column(header, justify="right" if right else "left", overflow="fold",
                             width=_min_width(header, cells))
        else:  # the label: what is left, wrapping between words
            room = width - sum(_min_width(h, [row[j] for row in rows]) + 3 for j, (h, _, _) in enumerate(cols)
                               if j != i) - 4 if width else 0
            if room > 0 and _min_width(header, cells, True) > room:  # a word wider than that (`--name`, a
                for row in rows:  # script's argument): folded between its parts, not cut with the table's border
                    row[i] = fold_cell(row[i], max(room, unbreakable_width(row[i], hyphens=True)), hyphens=True)
                cells = [row[i] for row in rows]
            table.add_column(header, justify="left", overflow="fold", min_width=_min_width(header, cells, True),
                             ratio=1)
    for row in rows:
        table.add_row(*row)
    captions = ["no runs"] if not rows else []
    if no_items(df):  # the summary a `launch --script` run ends with says why its throughput is a dash
        from scalelab.analysis.scaling import NO_ITEMS

        captions.append(f"{_DASH}: the run's {NO_ITEMS}")
        table.caption_justify = "left"  # a sentence, read from its start
    if len(cols) < len(_terminal_columns(df) if width else _columns(df)):
        captions.append("more columns in report.md and report.json")
    table.caption = "; ".join(captions) or None
    return table


def no_items(df: pd.DataFrame) -> bool:
    """Whether a row measured steps that counted no items (a script's `track.step(items=0)`), so it has no
    throughput (`analysis.scaling._rates_and_step_times`)."""
    if _throughput_col(df) != "words_per_s" or "steps_measured" not in df.columns:
        return False
    measured = pd.to_numeric(df["steps_measured"], errors="coerce").fillna(0) > 0
    return bool((measured & pd.to_numeric(df["words_per_s"], errors="coerce").isna()).any())


def print_scaling(df: pd.DataFrame, console: Console | None = None, title: str = "Scaling") -> None:
    """Print the scaling table to `console` (a new stdout Console when None), at most TABLE_WIDTH wide."""
    console = console or Console()
    width = min(console.width, TABLE_WIDTH)
    df, title = terminal_frame(df, title)
    console.print(render_table(df, title, width), width=width)


# --------------------------------------------------------------------------------------------------
# Markdown


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, formats: Mapping[str, str | Callable[[Any], str]] | None = None,
                   missing: str = _DASH, align_right: Iterable[str] = ()) -> str:
    """`df` as a GitHub Markdown table: the column names as headers, one line per row.

    `formats` maps a column to a number format (e.g. ",.0f", ".1%") or to a function giving a cell's text
    (`launch cost` and `launch plan` format their durations and dollars so, as on the terminal); those columns
    and the ones in `align_right` are right-aligned, the others left. A missing value (None, NaN, NA) reads
    `missing`; any other cell is its str(), with '|' and line breaks escaped so that a label can
    never break the table. Cells are read column by column, so an int column prints 3, not 3.0,
    whatever the other columns hold. Every Markdown table of the project comes from here.
    """
    if not len(df.columns):
        return "_(no data)_"
    formats = dict(formats or {})
    right = set(formats) | set(align_right)
    headers = [str(c) for c in df.columns]
    columns = [[_md_cell(v, formats.get(h), missing) for v in df.iloc[:, i].tolist()] for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(_md_escape(h) for h in headers) + " |",
             "|" + "|".join("---:" if h in right else ":---" for h in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*columns)]
    return "\n".join(lines)


def _md_cell(value: Any, fmt: str | Callable[[Any], str] | None, missing: str) -> str:
    if _missing(value):
        return missing
    if callable(fmt):
        return _md_escape(fmt(value))
    return format(float(value), fmt) if fmt else _md_escape(str(value))


def _scaling_markdown(df: pd.DataFrame) -> str:
    """The scaling table as shown in the terminal (same headers and cells), in Markdown."""
    headers, rows = table_rows(df)
    right = [h for h, _, r in _columns(df) if r]
    return markdown_table(pd.DataFrame(rows, columns=headers), align_right=right)


def _distinct(df: pd.DataFrame, col: str) -> list[str]:
    if col not in df.columns:
        return []
    return [str(v) for v in dict.fromkeys(df[col].tolist()) if not _missing(v) and str(v) != ""]


def _what_was_run(df: pd.DataFrame) -> list[str]:
    """Bullet lines describing the sweep, from whatever descriptive columns exist."""
    out: list[str] = []
    for col, name in (("label", "Series"), ("model", "Model"), ("rnn", "RNN"), ("precision", "Precision"),
                      ("engine", "Engine")):
        vals = _distinct(df, col)
        if vals:
            out.append(f"{name}: {', '.join(vals)}")
    axes = {"batch_scaling": ("Global batch as workers are added", {
                "fixed": "fixed (split over the workers)",
                "growing": "growing (every worker keeps its batch)"}),
            "work_scaling": ("Total work as workers are added", {
                "fixed": "fixed (the same job)", "growing": "growing (the same work per worker)"})}
    for col, (name, expl) in axes.items():
        vals = _distinct(df, col)
        if vals:
            out.append(f"{name}: " + "; ".join(expl.get(v, v) for v in vals))
    gb = _distinct(df, "global_batch")
    if gb:
        out.append(f"Global batch: {', '.join(gb)}")
    if {"nodes", "gpus_per_node"} <= set(df.columns) and len(df):
        layouts = list(dict.fromkeys(_layout(r) for _, r in df.iterrows()))
        out.append(f"Layouts (nodes x GPUs per node): {', '.join(layouts)}")
    elif "workers" in df.columns:
        out.append("Workers: " + ", ".join(_distinct(df, "workers")))
    if "steps_measured" in df.columns and len(df):
        s = df["steps_measured"].dropna()
        if len(s):
            out.append(f"Measured steps per run (after warm-up): {int(s.min())}"
                       + (f"–{int(s.max())}" if s.max() != s.min() else ""))
    thr = _distinct(df, "loss_threshold")
    if thr:
        out.append(f"Validation-loss threshold: {', '.join(thr)}")
    return out


# Every file a report (re)writes in its directory: none may be a link (it would overwrite the target).
PLOT_FILES = ("speedup.png", "throughput.png")
#: beside the plots: a digest of the table they were drawn from, so a report of the same table links them
#: without drawing them again (matplotlib is most of a short report's time), and another table redraws them
PLOT_KEY = ".plots-of"
PLOT_VERSION = "2"  # part of the digest: a change to how plots are drawn draws kept ones again
REPORT_FILES = ("report.md", "report.json", "warnings.json", *PLOT_FILES, "report.html", PLOT_KEY)


def _plots_of(out_dir: Path) -> str:
    """The digest of the table the plots in `out_dir` were drawn from ('' when none is known)."""
    kept = out_dir / PLOT_KEY
    if kept.exists() and not kept.is_file():
        raise DataError(f"{kept} is not a file (scalelab keeps the digest of its plots' table there): "
                        f"remove it, or give --out another directory")
    try:
        return kept.read_text(errors="replace").strip() if kept.is_file() else ""
    except OSError:
        return ""  # unreadable: the plots are drawn again


def write_markdown(
    df: pd.DataFrame,
    out_dir: Path,
    title: str,
    notes: Sequence[str] = (),
    plots: bool = True,
) -> Path:
    """Write `out_dir/report.md` (and, with `plots`, speedup.png and throughput.png beside it; where
    they are already, drawn before, they are kept and linked if drawn from this very table, else drawn
    again: a sweep's directory keeps its plots, never stale ones).

    The report stands on its own for a reader who never ran the tool: what was run, the table,
    one-line definitions of every figure, and the plots as relative links (so the folder can be
    moved or attached as a whole). Returns the path of report.md.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    refuse_links(out_dir, REPORT_FILES)
    images: list[tuple[str, str]] = []
    plots = plots or any((out_dir / name).is_file() for name in PLOT_FILES)
    if plots and len(df) and "workers" in df.columns:
        wanted = {}
        if {"speedup", "efficiency"} <= set(df.columns):
            wanted["speedup.png"] = ("Speedup and efficiency vs workers", plot_speedup)
        if _throughput_col(df) is not None:
            wanted["throughput.png"] = ("Throughput vs workers", plot_throughput)
        key = hashlib.sha256((PLOT_VERSION + df.to_csv(index=False)).encode()).hexdigest()
        fresh = _plots_of(out_dir) == key and all((out_dir / name).is_file() for name in wanted)
        if not fresh:  # no digest while they are drawn: an interrupted redraw leaves none, never a wrong one
            (out_dir / PLOT_KEY).unlink(missing_ok=True)
        for name, (alt, draw) in wanted.items():
            images.append((alt, name if fresh else draw(df, out_dir / name).name))
        if not fresh:
            tmp = out_dir / f"{PLOT_KEY}.{os.getpid()}.tmp"
            tmp.write_text(key + "\n")
            os.replace(tmp, out_dir / PLOT_KEY)

    lines = [f"# {title}", ""]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines += [f"_Generated {stamp} by scalelab from the per-rank run records._", ""]
    lines += ["## What was run", ""]
    lines += [f"- {_md_escape(s)}" for s in _what_was_run(df)] or ["- (no descriptive columns)"]
    lines += [f"- {_md_escape(str(n))}" for n in notes]
    lines += ["", "## Results", "", _scaling_markdown(df), ""]
    lines += [f"{_DASH} = not available (not measured by this engine, no validation run, the base "
              "row of a series, or a run that reached its loss threshold inside its warm-up steps).", ""]
    lines += ["## Definitions", ""]
    lines += [f"- **{name}**: {text}" for name, text in DEFINITIONS]
    if images:
        lines += ["", "## Plots", ""]
        for alt, name in images:
            lines += [f"![{alt}]({name})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------
# plots


def _series(df: pd.DataFrame) -> Iterable[tuple[str | None, pd.DataFrame]]:
    """(label, rows sorted by workers) per series, in order of first appearance."""
    if "label" not in df.columns or df["label"].nunique(dropna=False) <= 1:
        lab = None if "label" not in df.columns or not len(df) else str(df["label"].iloc[0]) or None
        yield lab, df.sort_values("workers", kind="stable")
        return
    for lab in dict.fromkeys(df["label"].tolist()):
        yield str(lab), df[df["label"] == lab].sort_values("workers", kind="stable")


def _worker_axis(ax: Any, df: pd.DataFrame) -> None:
    from matplotlib.ticker import MaxNLocator

    workers = sorted({int(w) for w in df["workers"].dropna()})
    if 0 < len(workers) <= 16:
        ax.set_xticks(workers)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("workers (GPUs)")
    ax.grid(True, alpha=0.3)


def _annotate_layouts(ax: Any, points: pd.DataFrame) -> None:
    """Label the points with their layout where several layouts share a worker count (1x4 and 2x2)."""
    if not points["workers"].duplicated().any():
        return
    for _, r in points.iterrows():
        ax.annotate(_layout(r), (r["workers"], r["y"]), textcoords="offset points", xytext=(4, 4), fontsize=7)


def _new_figure(panels: int) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * panels, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _plot_series(ax: Any, part: pd.DataFrame, ys: pd.Series, label: str | None, color: str | None = None):
    """One series' line through one point per layout: the median of its runs where several ran it
    (separate runs or repeats: a line through every run zig-zags), each run then a faint dot beside it;
    layouts sharing a worker count (1x4, 2x2) stay apart. Returns the line (its colour ties the series'
    other lines to it) and the points (workers, layout, y)."""
    keys = [k for k in ("nodes", "gpus_per_node") if k in part.columns]
    runs = part[["workers", *keys]].copy()
    runs["y"] = pd.to_numeric(pd.Series(np.asarray(ys), index=part.index), errors="coerce")
    points = runs.groupby(["workers", *keys], sort=True, dropna=False)["y"].median().reset_index()
    repeated = len(points) < len(runs)
    (line,) = ax.plot(points["workers"], points["y"], marker="o", color=color,
                      label=f"{label} (median of runs)" if label and repeated else label)
    if repeated:
        ax.plot(runs["workers"], runs["y"], ls="none", marker=".", alpha=0.35, color=line.get_color())
    return line, points


def plot_speedup(df: pd.DataFrame, path: Path) -> Path:
    """PNG with speedup vs workers (per series, with the ideal line) and efficiency vs workers."""
    from matplotlib.ticker import PercentFormatter

    path = Path(path)
    fig = _new_figure(2)
    ax_s, ax_e = fig.subplots(1, 2)
    wmax = float(df["workers"].max()) if len(df) else 1.0
    # ideal speedup n = workers / base_workers: one line per distinct base (usually just one)
    bases = sorted({float(b) for b in df["base_workers"].dropna()}) if "base_workers" in df.columns else []
    bases = bases or [float(df["workers"].min()) if len(df) else 1.0]
    for i, b in enumerate(bases):
        ax_s.plot([b, wmax], [1.0, wmax / b], ls="--", color="grey", lw=1, label="ideal" if i == 0 else None)
    ax_e.axhline(1.0, ls="--", color="grey", lw=1, label="ideal")
    for lab, part in _series(df):
        line, points = _plot_series(ax_s, part, part["speedup"], lab)
        _plot_series(ax_e, part, part["efficiency"], lab, line.get_color())
        _annotate_layouts(ax_s, points)
    ax_s.set_ylabel("speedup (× smallest layout)")
    ax_s.set_title("Speedup")
    ax_e.set_ylabel("efficiency")
    ax_e.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    eff = pd.to_numeric(df["efficiency"], errors="coerce").dropna()
    ax_e.set_ylim(0, max(1.1, float(eff.max()) * 1.05) if len(eff) else 1.1)
    ax_e.set_title("Efficiency (speedup / n)")
    for ax in (ax_s, ax_e):
        _worker_axis(ax, df)
        ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=110)
    return path


def plot_throughput(df: pd.DataFrame, path: Path) -> Path:
    """PNG with total throughput vs workers (per series, with linear scaling from the smallest
    layout as the ideal) and throughput per worker (flat when scaling is perfect)."""
    path = Path(path)
    col = _throughput_col(df)
    if col is None:
        raise ValueError("plot_throughput needs a 'words_per_s' or 'throughput' column")
    unit = throughput_header(df)
    fig = _new_figure(2)
    ax_t, ax_w = fig.subplots(1, 2)
    for i, (lab, part) in enumerate(_series(df)):
        line, points = _plot_series(ax_t, part, part[col], lab)
        timed = part[pd.to_numeric(part[col], errors="coerce").notna()]  # a run stopped in warm-up has none
        if len(timed):
            base = timed.loc[timed["workers"].idxmin()]
            xs = np.array([timed["workers"].min(), part["workers"].max()], dtype=float)
            # one legend entry for all ideal lines: the colour already ties each to its series
            ax_t.plot(xs, base[col] * xs / float(base["workers"]), ls="--", lw=1, color=line.get_color(),
                      alpha=0.6, label="ideal (linear from smallest layout)" if i == 0 else None)
        _plot_series(ax_w, part, part[col] / part["workers"], lab, line.get_color())
        _annotate_layouts(ax_t, points)
    ax_t.set_ylabel(unit)
    ax_t.set_title("Throughput" if unit == "throughput" else f"Throughput ({unit})")
    ax_w.set_ylabel(f"{unit} per worker")
    ax_w.set_title("Throughput per worker")
    ax_w.set_ylim(bottom=0)
    ax_t.set_ylim(bottom=0)
    for ax in (ax_t, ax_w):
        _worker_axis(ax, df)
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=110)
    return path


# --------------------------------------------------------------------------------------------------
# JSON


def _jsonable(x: Any) -> Any:
    if _missing(x):
        return None
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (np.floating, float)):
        f = float(x)
        return None if not math.isfinite(f) else f
    if isinstance(x, (pd.Timestamp, datetime)):
        return x.isoformat()
    if isinstance(x, np.ndarray):
        return [_jsonable(v) for v in x.tolist()]
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return x


def to_json_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain dicts; NaN/inf/NA become None (JSON null), numpy scalars Python scalars."""
    return [{str(k): _jsonable(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def write_json(df: pd.DataFrame, path: Path) -> Path:
    """Write the rows as a JSON array (strict JSON: no NaN literals). Returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json_records(df), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path
