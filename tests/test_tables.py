"""Every Markdown table comes from analysis.report.markdown_table: the prep report's and the prep bench's."""

from __future__ import annotations

import pandas as pd

from scalelab.prep.bench import table
from scalelab.prep.report import COLUMNS, markdown


def test_the_prep_report_table_has_every_column_and_a_dash_for_missing() -> None:
    row = {key: None for _, key, _ in COLUMNS}
    row.update(label="nmt|big", mode="strong", workers=2, lines=12345, mb=1.5, wall_s=2.0, lines_per_s=6172.5, efficiency=0.9)
    lines = markdown(pd.DataFrame([row]), []).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| label"))
    assert lines[header] == "| " + " | ".join(h for h, _, _ in COLUMNS) + " |"
    assert lines[header + 1] == "|:---|:---|" + "|".join("---:" for _ in COLUMNS[2:]) + "|"
    cells = lines[header + 2].split(" | ")
    assert cells[0] == r"| nmt\|big" and cells[3:7] == ["12,345", "1.5", "2.00", "6,172"], "a '|' in a label cannot break the table"
    assert "90%" in cells and cells[-1] == "- |"


def test_the_prep_bench_table_gives_medians_and_ratios_to_the_baseline() -> None:
    results = [{"what": "baseline", "workers": 1, "repeat": r, "lines_per_s": v} for r, v in enumerate((1000.0, 1100.0, 900.0))]
    results += [{"what": "prep", "workers": 2, "repeat": r, "lines_per_s": v} for r, v in enumerate((1800.0, 2420.0, 1800.0))]
    lines = table(results).splitlines()
    assert lines[0].startswith("| run | workers | lines/s (median) |") and len(lines) == 4
    assert lines[2] == "| baseline | 1 | 1,000 | 1,000 | 1.00x | 1,000, 1,100, 900 |"
    assert lines[3] == "| prep | 2 | 1,800 | 900 | 2.00x | 1,800, 2,420, 1,800 |"
