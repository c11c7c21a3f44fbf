"""Measurements made elsewhere: published scaling tables and old cost logs, read from CSV.

Every problem is reported as one line naming the file, the line and the column
(`results.csv:4: column 'workers': expected a positive whole number, got 'two'`), because these
files are typed by hand. Formats (header row required, extra columns kept, order free):

- scaling: `label` (optional series name), `workers`, `nodes` (optional), and `throughput` (work
  per second) or `time_s` (seconds of the run); the two axes of how the job changes with the
  workers, each `fixed` or `growing`: `batch_scaling` (the global batch: split, or every worker
  keeps its batch) and `work_scaling` (the total work: the same job, or the same work per worker,
  which is what `time_s` is read by); `global_batch` (optional: of the row, for predicting steps to
  a threshold); `instance_type` (optional, the instances measured on, one per node: a bare type
  on every node or a mix in the grammar of costs.billing.Mix, `1*p2.xlarge+3*g3.4xlarge`; the
  older name `instance` is read as the same column); `balance` (optional, static or dynamic: how
  a mixed fleet split the batch, scalelab/costs/steptime.py). The older `mode` column is still read as
  both axes at once (strong = fixed, fixed; weak = growing, growing) where the axes are not given.
  A row with more nodes than workers, or whose throughput (given, or read from `time_s`) lies outside
  `MIN_THROUGHPUT`..`MAX_THROUGHPUT`, is refused naming its line.
- convergence: `label` (optional), `global_batch`, `steps_to_threshold` (of one run that reached
  the threshold), and optionally `noise_scale` (its measured B_simple), `lr` (its learning rate
  after warm-up), `lr_warmup_steps`, `seed`; repeats (several seeds at one batch) are welcome.
- cost: `label`, `seconds`, `instances` (`3*g3.4xlarge+1*p2.xlarge`; a bare type means one),
  `market` = on-demand|spot (optional, default on-demand).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from scalelab.analysis.scaling import scaling_table
from scalelab.core.errors import DataError
from scalelab.core.writes import check_input_file
from scalelab.core.spec import BALANCE_MODES, BATCH_MODES, BATCH_SCALING, MAX_GPUS, SCALING_AXES, batch_mode_of

__all__ = ["CsvError", "AXES", "MAX_THROUGHPUT", "MIN_THROUGHPUT", "read_scaling_csv", "with_throughput",
           "read_convergence_csv", "csv_kind", "read_cost_csv", "scaling_from_table"]


class CsvError(DataError):
    """A CSV file that cannot be read as the documented table."""


def _positive_int(x: str) -> int:
    v = float(x)
    if not math.isfinite(v) or v != int(v) or v < 1:  # 1e400 reads as infinity, which int() cannot take
        raise ValueError
    return int(v)


#: a table's arithmetic (its `precision` column), what converting its speed to other GPUs goes by (costs.speed):
#: fp16, bf16 and mixed are mixed precision on tensor cores; tf32 is fp32's class, as in the published ratios
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "mixed")


def _gpu_count(x: str) -> int:
    """A count of workers or nodes: a positive whole number up to MAX_GPUS (1e20 was planned, 1e23 shown as
    99999999999999991611392 workers)."""
    v = _positive_int(x)
    if v > MAX_GPUS:
        raise ValueError
    return v


def _positive_float(x: str) -> float:
    v = float(x.replace(",", "").replace("_", ""))
    if not (v > 0 and math.isfinite(v)):
        raise ValueError
    return v


def _non_negative_float(x: str) -> float:
    v = float(x.replace(",", "").replace("_", ""))
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError
    return v


#: Work per second above which a scaling table's throughput is a typo or the wrong unit: 1e15 items a second
#: is a hundred million times the largest training runs' rate (about 1e7 tokens/s), and finishes the largest
#: --work the planner takes (`costs.cli.MAX_WORK`, 1e15) in one second. `1e308` reached the fit, overflowed to
#: infinity and ended in numpy's LinAlgError.
MAX_THROUGHPUT = 1e15
#: ... and below which it is: one item in 30 years (a time_s of 1e9 s). `1e-300` priced a 1e315-second job:
#: infinite hours, and a traceback where the recommendation printed them.
MIN_THROUGHPUT = 1e-9


# A cost log's run length: 0 s is no run (billed the 60 s minimum without a word) and 1e30 s priced a
# 30-digit bill; no run is billed for longer than a year
MAX_RUN_SECONDS = 365 * 24 * 3600.0


def _run_seconds(x: str) -> float:
    v = _positive_float(x)
    if v > MAX_RUN_SECONDS:
        raise ValueError
    return v


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(x: str) -> str:
        x = x.strip().lower()
        if x not in allowed:
            raise ValueError
        return x
    parse.__doc__ = " or ".join(allowed)
    return parse


_EXPECT = {
    _positive_int: "a positive whole number",
    _gpu_count: f"a positive whole number up to {MAX_GPUS:,}",
    _positive_float: "a positive number",
    _non_negative_float: "a number >= 0",
    _run_seconds: f"a run's length in seconds, > 0 and at most a year ({MAX_RUN_SECONDS:,.0f})",
}


def _read(path: str | Path, required: list[list[str]], parsers: dict[str, Callable[[str], Any]],
          what: str, unique: bool = True) -> pd.DataFrame:
    """Rows of `path` with `parsers` applied; `required` lists alternatives (any one of each group)."""
    path = Path(path)
    try:
        check_input_file(path, "CSV file")  # a FIFO is refused before a read that would never return
    except DataError as exc:
        raise CsvError(str(exc)) from None
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise CsvError(f"{path}: cannot read it as UTF-8 text ({exc})") from None
    reader = csv.reader(text.splitlines())
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise CsvError(f"{path}: empty file; expected a header row with {what}") from None
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:
        raise CsvError(f"{path}: column {', '.join(repr(h) for h in repeated)} appears more than once in the header; "
                       "keep one of each")
    for group in required:
        if not any(c in header for c in group):
            raise CsvError(f"{path}: missing column {' or '.join(repr(c) for c in group)}; "
                           f"the header has {', '.join(repr(h) for h in header) or 'nothing'}; expected {what}")
    rows = []
    for line_no, cells in enumerate(reader, start=2):
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise CsvError(f"{path}:{line_no}: {len(cells)} cells for {len(header)} columns ({', '.join(header)})")
        row: dict[str, Any] = {}
        for col, cell in zip(header, cells):
            cell = cell.strip()
            parse = parsers.get(col)
            if parse is None or cell == "":
                row[col] = cell if cell != "" else None
                continue
            try:
                row[col] = parse(cell)
            except (ValueError, TypeError):
                expected = _EXPECT.get(parse) or parse.__doc__ or "a valid value"
                raise CsvError(f"{path}:{line_no}: column {col!r}: expected {expected}, got {cell!r}") from None
        for group in required:
            if all(row.get(c) is None for c in group if c in header):
                raise CsvError(f"{path}:{line_no}: column {' or '.join(repr(c) for c in group if c in header)} is empty")
        row["_line"] = line_no
        rows.append(row)
    if not rows:
        raise CsvError(f"{path}: no data rows under the header")
    if unique:
        _refuse_repeats(path, rows, [h for h in header if h in parsers or h == "label"])
    return pd.DataFrame(rows)


def _refuse_repeats(path: Path, rows: list[dict[str, Any]], key: list[str]) -> None:
    """Two rows that say the same thing (a row pasted twice) are an error naming both lines."""
    seen: dict[tuple, int] = {}
    for row in rows:
        k = tuple(row.get(c) for c in key)
        if k in seen:
            raise CsvError(f"{path}:{row['_line']}: repeats line {seen[k]} "
                           f"({', '.join(f'{c}={row.get(c)}' for c in key)}); delete one of them")
        seen[k] = row["_line"]


AXES = ("batch_scaling", "work_scaling")


def read_scaling_csv(path: str | Path) -> pd.DataFrame:
    """A published scaling table: one row per measurement (see the module doc for the columns)."""
    axis = _choice(*SCALING_AXES)
    df = _read(path, [["workers"], ["throughput", "time_s"]],
               {"workers": _gpu_count, "nodes": _gpu_count, "throughput": _positive_float,
                "time_s": _positive_float, "mode": _choice(*BATCH_MODES), "batch_scaling": axis,
                "work_scaling": axis, "global_batch": _positive_int, "balance": _choice(*BALANCE_MODES),
                "precision": _choice(*PRECISIONS)},
               "label (optional), workers, nodes (optional), instance_type (optional), throughput or time_s, "
               "batch_scaling and work_scaling (optional: fixed or growing), precision (optional: "
               f"{', '.join(PRECISIONS)})")
    _default(df, "label", "")
    if "instance" in df.columns and "instance_type" not in df.columns:  # the older name of the column
        df["instance_type"] = df["instance"]
    for column in AXES:
        legacy = df["mode"].map(BATCH_SCALING) if "mode" in df.columns else None
        df[column] = (df[column] if column in df.columns else pd.Series(None, index=df.index, dtype=object))
        df[column] = df[column].fillna(legacy if legacy is not None else "fixed").fillna("fixed").astype(str)
    if "throughput" in df.columns and "time_s" in df.columns:  # one of them was used, silently
        raise CsvError(f"{path}: has both 'throughput' and 'time_s' columns; keep the one the table measured "
                       "(throughput: work per second; time_s: seconds of the whole job) and drop the other")
    metric = "throughput" if "throughput" in df.columns else "time_s"
    missing = df[df[metric].isna()]
    if len(missing):
        raise CsvError(f"{path}:{int(missing['_line'].iloc[0])}: column {metric!r} is empty")
    _refuse_two_values_for_one_layout(path, df)
    _refuse_more_nodes_than_workers(path, df)
    _refuse_absurd_throughput(path, df)
    return df


def _refuse_more_nodes_than_workers(path: str | Path, df: pd.DataFrame) -> None:
    """Every node runs at least one worker: `2 workers, 4 nodes` was planned and printed as it stood."""
    if "nodes" not in df.columns:
        return
    over = df[df["nodes"].notna() & (df["nodes"] > df["workers"])]
    if len(over):
        r = over.iloc[0]
        raise CsvError(f"{path}:{int(r['_line'])}: {int(r['workers'])} workers on {int(r['nodes'])} nodes; every node "
                       "runs at least one worker: give the machines the workers ran on (nodes <= workers), or "
                       "swap the two columns if they were typed the other way round")


def _refuse_absurd_throughput(path: str | Path, df: pd.DataFrame) -> None:
    """A throughput (given, or workers or one job over `time_s`) outside MIN_THROUGHPUT..MAX_THROUGHPUT is
    refused naming its line: past the bounds the plan's arithmetic overflows (LinAlgError, infinite hours)."""
    speed = with_throughput(df)["throughput"]
    out = df[~((speed >= MIN_THROUGHPUT) & (speed <= MAX_THROUGHPUT))]
    if len(out):
        r = out.iloc[0]
        v = float(speed[out.index[0]])
        what = "throughput" if "throughput" in df.columns else f"time_s {r['time_s']:g} gives a throughput of"
        why = ("above 1e+15, more than any training job does (the largest about 1e7 tokens/s)" if v > MAX_THROUGHPUT
               else "below 1e-09, one item in 30 years")
        raise CsvError(f"{path}:{int(r['_line'])}: {what} {v:.3g} per second, {why}; check the value and its unit")


def whole_jobs(table: pd.DataFrame) -> bool:
    """Whether a table's throughput counts whole jobs: timed (`time_s`), the same job on every layout
    (`with_throughput`'s 1 / time_s), so one job is its work."""
    return "time_s" in table.columns and bool((table["work_scaling"] == "fixed").all())


def with_throughput(table: pd.DataFrame) -> pd.DataFrame:
    """A scaling table with a `throughput` column: as given, else from `time_s` read by the work
    axis (the same job: 1 / time_s jobs per second; the same work per worker: workers / time_s)."""
    if "throughput" in table.columns:
        return table
    per = table["workers"].where(table["work_scaling"] == "growing", 1)
    return table.assign(throughput=per / table["time_s"])


def read_convergence_csv(path: str | Path) -> pd.DataFrame:
    """Runs that reached a loss threshold: global batch, steps to the threshold (module doc)."""
    df = _read(path, [["global_batch"], ["steps_to_threshold"]],
               {"global_batch": _positive_int, "steps_to_threshold": _positive_int, "noise_scale": _positive_float,
                "lr": _positive_float, "lr_warmup_steps": _non_negative_float, "seed": _non_negative_float},
               "label (optional), global_batch, steps_to_threshold, noise_scale, lr, lr_warmup_steps, seed "
               "(the last four optional)", unique=False)
    _default(df, "label", "")
    return df


def csv_kind(path: str | Path) -> str:
    """"convergence" for a table of steps to a threshold, else "scaling" (read the header only)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            header = {h.strip() for h in next(csv.reader([f.readline()]), [])}
    except (OSError, UnicodeDecodeError):
        return "scaling"  # its reader names the problem
    return "convergence" if "steps_to_threshold" in header else "scaling"


def _refuse_two_values_for_one_layout(path: str | Path, df: pd.DataFrame) -> None:
    """Speedup is against one measurement per layout: two rows for one layout of one series are
    ambiguous (average them first, or give each repeat a label of its own)."""
    key = [c for c in ("label", *AXES, "workers", "nodes", "instance_type", "balance") if c in df.columns]
    dup = df[df.duplicated(key, keep=False)]
    if len(dup):
        lines = ", ".join(str(int(x)) for x in dup["_line"])
        first = dup.iloc[0]
        raise CsvError(f"{path}: lines {lines} all measure {first.get('label') or 'the same series'!s} at "
                       f"{int(first['workers'])} workers; keep one row per layout (average repeats) or label them apart")


def read_cost_csv(path: str | Path) -> pd.DataFrame:
    """A cost log: label, seconds, instances, market (optional)."""
    df = _read(path, [["seconds"], ["instances"]],
               {"seconds": _run_seconds, "market": _choice("on-demand", "spot")},
               "label, seconds, instances (e.g. 3*g3.4xlarge+1*p2.xlarge), market (optional)")
    _default(df, "label", "")
    _default(df, "market", "on-demand")
    return df


def _default(df: pd.DataFrame, column: str, value: str) -> None:
    """An optional column: absent or empty cells take `value`."""
    df[column] = (df[column] if column in df.columns else pd.Series(value, index=df.index)).fillna(value).astype(str)


def scaling_from_table(df: pd.DataFrame) -> pd.DataFrame:
    """Speedup, efficiency and Karp-Flatt per row, relative to the fewest workers of the same label
    (and axes). A `time_s` is read by the work axis: the same job (fixed: speedup t_base/t) or the
    same work per worker (growing: n·t_base/t). Input order is kept; `_line` and the older `mode`
    (replaced by the two axes) are dropped."""
    parts = []
    for (_, work), part in df.groupby(list(AXES), sort=False):
        parts.append(scaling_table(part, mode=batch_mode_of(work), series="label"))
    out = pd.concat(parts).sort_index() if parts else df
    return out.drop(columns=[c for c in ("_line", "mode") if c in out.columns])
