"""Records that contradict their spec, or themselves, named by the report (issue #37).

Why: a report over records whose world size or steps contradict the spec, with a step recorded twice
in one launch, or beside a corrupt summary.json printed its numbers with only a timing-spread warning:
the extra rank's samples were summed into the throughput, the duplicate averaged away. Each
contradiction is now a warning naming the rank, the step and the file; the numbers are still computed
(from the records, the latest attempt of a step winning, as always), so that the reader can judge them.
A step re-done after a resume is no contradiction: each launch starts with a `start` record, and a
step may appear once per launch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.core.rundir import RunPaths

SHOWN = 3  # contradictions of one kind named in full; the rest counted


def contradictions(run: Any) -> list[str]:
    """Warnings for `run` (a `core.records.RunRecords`): ranks, world sizes, steps and the summary."""
    out = _ranks(run) + _steps(run)
    summary = RunPaths(run.run_dir).summary
    if summary.is_file():
        try:
            ok = isinstance(json.loads(summary.read_text()), dict)
        except (ValueError, UnicodeDecodeError, RecursionError):
            ok = False
        if not ok:
            out.append(f"{summary} is corrupt (not a JSON object); the report is computed from the records and "
                       "does not use it")
    return out


def _where(run: Any, rank: int) -> str:
    return str(RunPaths(Path(run.run_dir)).rank_records(rank))


def _ranks(run: Any) -> list[str]:
    world, steps, out = run.spec.world, run.steps, []
    if steps.empty or "rank" not in steps:
        return out
    ranks = sorted({int(r) for r in steps["rank"].dropna()})
    beyond = [r for r in ranks if r >= world]
    if beyond:
        out.append(f"{run.run_dir}: step records of rank {', '.join(map(str, beyond[:SHOWN]))} ({_where(run, beyond[0])}) "
                   f"but its spec has {world} rank{'s' if world > 1 else ''} (0 to {world - 1}): records of another "
                   "layout? their samples are counted in the throughput")
    missing = [r for r in range(world) if r not in ranks]
    if missing and len(missing) < world:
        out.append(f"{run.run_dir}: rank {', '.join(map(str, missing[:SHOWN]))} of {world} recorded no step; the "
                   "report's throughput and slowest rank leave it out")
    if "world" in steps:
        wrong = steps[steps["world"].notna() & (steps["world"] != world)]
        if len(wrong):
            first = wrong.iloc[0]
            out.append(f"{run.run_dir}: rank {int(first['rank'])} recorded world size {int(first['world'])} at step "
                       f"{int(first['step'])} ({_where(run, int(first['rank']))}), its spec {world}"
                       + (f"; {len(wrong) - 1} more such records" if len(wrong) > 1 else ""))
    return out


def _steps(run: Any) -> list[str]:
    spec, steps, out = run.spec, run.steps, []
    if steps.empty or "step" not in steps:
        return out
    if spec.steps is not None and spec.epochs is None:
        over = steps[steps["step"] > spec.steps]
        if len(over):
            first = over.iloc[0]
            out.append(f"{run.run_dir}: rank {int(first['rank'])} recorded step {int(first['step'])} "
                       f"({_where(run, int(first['rank']))}), beyond the {spec.steps} steps of its spec")
    twice = _twice_in_one_launch(run)
    if twice:
        rank, step = twice[0]
        out.append(f"{run.run_dir}: rank {rank} recorded step {step} twice in one launch ({_where(run, rank)})"
                   + (f", and {len(twice) - 1} more such steps" if len(twice) > 1 else "")
                   + "; the report keeps the later record of each")
    return out


def _twice_in_one_launch(run: Any) -> list[tuple[int, int]]:
    """(rank, step) recorded more than once between two `start` records of that rank."""
    steps, starts = run.steps, run.start
    if "time" not in steps or "rank" not in steps:
        return []
    found = []
    for rank, rows in steps.groupby("rank", sort=True):
        begun = np.sort(starts.loc[starts["rank"] == rank, "time"].to_numpy(dtype=float)) \
            if len(starts) and {"rank", "time"} <= set(starts.columns) else np.array([])
        launch = np.searchsorted(begun, rows["time"].to_numpy(dtype=float), side="right")
        keyed = rows.assign(_launch=launch)
        dup = keyed[keyed.duplicated(["_launch", "step"], keep="first")]
        found += [(int(rank), int(s)) for s in dup["step"]]
    return found
