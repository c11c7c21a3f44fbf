"""Tests of analysis.report: terminal table, Markdown report, PNG plots, JSON with null for NaN."""

from __future__ import annotations

import io
import json
import math
import re

import pandas as pd
import pytest
from rich.console import Console

from scalelab.analysis.report import (
    markdown_table,
    plot_speedup,
    plot_throughput,
    print_scaling,
    render_table,
    table_rows,
    to_json_records,
    write_json,
    write_markdown,
)
from scalelab.analysis.scaling import LayoutSummary, scale_layouts, scaling_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _summary(nodes: int, gpn: int, wps: float, step_s: float, reached: bool | None, t_thr: float | None,
             exchange: float | None = 0.12) -> LayoutSummary:
    return LayoutSummary(
        label="lstm-sweep", workers=nodes * gpn, nodes=nodes, gpus_per_node=gpn, engine="horovod",
        rnn="lstm", model="lm", mode="strong", global_batch=512, steps_measured=200, steps_warmup=10,
        steps_incomplete=0, words_per_s=wps, samples_per_s=wps / 20, step_s_mean=step_s,
        step_s_median=step_s, step_s_p90=step_s * 1.1, step_s_std=step_s / 10, share_data=0.02,
        share_forward=0.3, share_backward=0.6, share_exchange=exchange, share_optimizer=0.08,
        final_loss=3.1, final_val_loss=3.3, loss_threshold=3.5, reached_threshold=reached,
        time_to_threshold_s=t_thr, steps_to_threshold=150 if reached else None,
    )


@pytest.fixture()
def sweep() -> pd.DataFrame:
    return scale_layouts([
        _summary(1, 1, 50000.0, 0.250, True, 300.0),
        _summary(1, 2, 92000.0, 0.270, True, 170.0),
        _summary(1, 4, 156000.0, 0.320, False, None, exchange=None),
        _summary(2, 4, 274000.0, 0.365, None, None),
    ])


def test_render_table_values(sweep):
    table = render_table(sweep, "Sweep")
    console = Console(file=io.StringIO(), width=250, color_system=None)
    console.print(table)
    text = console.file.getvalue()
    for needle in ("Sweep", "lstm-sweep", "2x4", "274,000", "1.84", "92.0 %", "250.0 ± 25.0",
                   "300 s (150 steps)", "not reached", "2 % / 12 %", "2 % / —"):
        assert needle in text, needle
    # the layout column's header in one line: "nodes x GPUs" took three above cells 3 wide ("1x2")
    assert "┃ layout" in text and "┃ nodes" not in text, text[:2000]
    buf = io.StringIO()
    print_scaling(sweep, Console(file=buf, width=250, color_system=None))
    assert "5.48" in buf.getvalue()  # 274000 / 50000


def test_table_rows_on_bare_scaling_table():
    df = scaling_table([{"label": "a", "workers": 1, "throughput": 10.0},
                        {"label": "a", "workers": 2, "throughput": 18.0}])
    headers, rows = table_rows(df)
    assert headers[:3] == ["label", "workers", "throughput"]
    assert "layout (nodes x GPUs)" not in headers
    assert rows[1][headers.index("speedup")] == "1.80"
    assert rows[1][headers.index("efficiency")] == "90.0 %"
    assert rows[0][headers.index("serial fraction")] == "—"


def test_write_markdown_report(tmp_path, sweep):
    path = write_markdown(sweep, tmp_path / "out", "LSTM scaling", notes=["Cluster: 2 x p3.8xlarge"])
    assert path == tmp_path / "out" / "report.md"
    text = path.read_text()
    assert text.startswith("# LSTM scaling")
    for needle in ("## What was run", "Cluster: 2 x p3.8xlarge", "horovod", "1x1, 1x2, 1x4, 2x4",
                   "| 274,000 |", "| 1.84 |", "| 92.0 % |", "not reached", "## Definitions",
                   "**Speedup**", "**Efficiency**", "max over ranks of step_s"):
        assert needle in text, needle
    # the table is a Markdown table with one row per layout
    table_lines = [ln for ln in text.splitlines() if ln.startswith("| lstm-sweep")]
    assert len(table_lines) == 4
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links == ["speedup.png", "throughput.png"]
    for name in links:  # relative links that resolve next to the report
        data = (path.parent / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_markdown_table_formats_alignment_missing_and_escaping():
    df = pd.DataFrame({"label": ["a|b", "two\nlines"], "gpus": [1, 2], "share": [0.5, None],
                       "dollars": [1234.5, float("nan")], "ok": [True, False]})
    text = markdown_table(df, {"share": ".0%", "dollars": ",.2f"}, missing="n/a", align_right=["gpus"])
    assert text.splitlines() == [
        "| label | gpus | share | dollars | ok |",
        "|:---|---:|---:|---:|:---|",
        "| a\\|b | 1 | 50% | 1,234.50 | True |",  # ints stay ints beside floats; '|' cannot split a cell
        "| two lines | 2 | n/a | n/a | False |",
    ]
    assert markdown_table(df.iloc[:0]).splitlines()[1] == "|:---|:---|:---|:---|:---|"
    assert markdown_table(pd.DataFrame()) == "_(no data)_"
    assert "| — |" in markdown_table(pd.DataFrame({"x": [None]}))


def test_plots_are_valid_pngs(tmp_path, sweep):
    for fn, name in ((plot_speedup, "s.png"), (plot_throughput, "t.png")):
        out = fn(sweep, tmp_path / name)
        data = out.read_bytes()
        assert data[:8] == PNG_MAGIC
        assert len(data) > 10_000


def test_plot_speedup_several_series(tmp_path):
    df = scaling_table([{"label": lab, "workers": w, "throughput": t}
                        for lab, pts in {"ps": [(1, 50.0), (2, 92.0), (4, 156.0)],
                                         "nccl": [(1, 37.0), (2, 67.0), (4, 112.0)]}.items()
                        for w, t in pts])
    data = plot_speedup(df, tmp_path / "multi.png").read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_json_has_null_not_nan(tmp_path, sweep):
    recs = to_json_records(sweep)
    assert len(recs) == 4
    assert recs[0]["karp_flatt"] is None  # NaN for the base row
    assert recs[2]["share_exchange"] is None
    assert recs[3]["reached_threshold"] is None
    assert recs[1]["speedup"] == pytest.approx(1.84)
    assert isinstance(recs[0]["workers"], int)
    path = write_json(sweep, tmp_path / "scaling.json")
    text = path.read_text()
    assert "NaN" not in text and "null" in text
    loaded = json.loads(text)
    assert loaded == recs
    assert not any(isinstance(v, float) and math.isnan(v) for r in loaded for v in r.values())


def test_a_series_line_goes_through_each_layouts_median_and_keeps_layouts_of_one_worker_count_apart():
    """Separate runs of one layout: one point, their median, each run a faint dot (a line through every run
    zig-zagged); 1x4 and 2x2 (both 4 workers) stay two points, each labelled with its layout."""
    from matplotlib.figure import Figure

    from scalelab.analysis.report import _annotate_layouts, _plot_series

    part = pd.DataFrame({"workers": [1, 1, 1, 2, 2, 4, 4], "nodes": [1, 1, 1, 1, 1, 1, 2],
                         "gpus_per_node": [1, 1, 1, 2, 2, 4, 2], "y": [1.0, 0.1, 1.02, 0.8, 0.4, 3.0, 2.0]})
    ax = Figure().subplots()
    line, points = _plot_series(ax, part, part["y"], "bench")
    assert list(line.get_xdata()) == [1, 2, 4, 4]
    assert list(line.get_ydata()) == pytest.approx([1.0, 0.6, 3.0, 2.0])
    assert line.get_label() == "bench (median of runs)"
    dots = [x for x in ax.get_lines() if x is not line]
    assert len(dots) == 1 and len(dots[0].get_xdata()) == 7  # every run shown
    _annotate_layouts(ax, points)
    assert sorted(t.get_text() for t in ax.texts) == ["1x1", "1x2", "1x4", "2x2"]
    single = Figure().subplots()
    line, _ = _plot_series(single, part.iloc[[0, 3, 5]], part["y"].iloc[[0, 3, 5]], "one each")
    assert line.get_label() == "one each" and len(single.get_lines()) == 1  # nothing repeated: no dots
