"""What changed between two reports, in percent, layout by layout (`launch report A B --compare`).

Why by workers: two reports of the same sweep before and after a change share layouts; a layout
only one of them has is listed with no change rather than dropped, so nothing vanishes silently.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.core.errors import RecordError
from scalelab.core.rundir import read_json

__all__ = ["COMPARED", "load_table", "compare_tables"]

#: The columns compared, as (column, what it is).
COMPARED: tuple[tuple[str, str], ...] = (("words_per_s", "throughput"), ("speedup", "speedup"),
                                         ("efficiency", "efficiency"), ("time_to_threshold_s", "time to threshold"))


def load_table(path: Path) -> pd.DataFrame:
    """The scaling table of a report directory (its report.json) or of report.json itself."""
    path = Path(path)
    file = path / "report.json" if path.is_dir() else path
    rows = read_json(file, "report", list)  # corrupt, missing or not a list of rows: one line naming it
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise RecordError(f"report {file} holds no rows of a scaling table (an empty or hand-edited file); "
                          "write it again with `launch report RUNS --out DIR`")
    return pd.DataFrame(rows)


def compare_tables(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """One row per workers count: each compared value in A, in B, and B's change from A in percent."""
    cols = ["workers", *[c for c, _ in COMPARED if c in a.columns or c in b.columns]]
    a, b = a.reindex(columns=cols), b.reindex(columns=cols)
    both = a.merge(b, on="workers", how="outer", suffixes=("_a", "_b")).sort_values("workers")
    for c in cols[1:]:
        x, y = pd.to_numeric(both[f"{c}_a"]), pd.to_numeric(both[f"{c}_b"])
        both[f"{c}_change_pct"] = 100.0 * (y - x) / x.where(x != 0)
    return both.reset_index(drop=True)
