"""Sweeps: one spec over several layouts, strong or weak, then one report.

Every layout's spec is built and validated before the first run starts, so a sweep never dies at
layout 3 of 4 because of a batch that does not split.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from core.errors import SpecError
from core.rundir import new_run_dir, write_json
from core.spec import Spec

_LAYOUT = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


def parse_layouts(workers: str | None, layouts: str | None) -> list[tuple[int, int]]:
    """`--workers 1,2` -> [(1,1),(1,2)]; `--layouts 1x1,2x2` -> [(1,1),(2,2)]."""
    if workers and layouts:
        raise SpecError("give --workers or --layouts, not both")
    out: list[tuple[int, int]] = []
    if workers:
        for item in workers.split(","):
            if not item.strip().isdigit() or int(item) < 1:
                raise SpecError(f"--workers takes positive whole numbers separated by commas, e.g. 1,2,4; got {workers!r}")
            out.append((1, int(item)))
    else:
        for item in (layouts or "").split(","):
            m = _LAYOUT.match(item)
            if not m or int(m[1]) < 1 or int(m[2]) < 1:
                raise SpecError(f"--layouts takes NODESxGPUS items separated by commas, e.g. 1x1,1x2,2x2; got {item!r}")
            out.append((int(m[1]), int(m[2])))
    if len(set(out)) != len(out):
        raise SpecError(f"the sweep lists a layout twice: {out}")
    return out


def sweep_specs(base: Spec, layouts: list[tuple[int, int]], mode: str) -> list[Spec]:
    """One validated spec per layout. Strong: global batch fixed; weak: per-worker batch fixed."""
    from core.presets import PRESETS

    default_batch = PRESETS[base.model].default_batch
    if mode == "strong" and base.batch_per_worker is not None:
        raise SpecError("--mode strong keeps the global batch fixed; use --global-batch, not --batch-per-worker")
    if mode == "weak" and base.global_batch is not None:
        raise SpecError("--mode weak keeps the per-worker batch fixed; use --batch-per-worker, not --global-batch")
    specs = []
    # Every emulated "GPU" gets the same compute in every layout: on a host without GPUs a worker is a
    # process, and letting the 1-worker run use all cores would make it a bigger device than the others.
    threads = base.threads
    if threads is None and base.backend == "local":
        threads = max(1, (os.cpu_count() or 1) // max(n * g for n, g in layouts))
    for nodes, gpus in layouts:
        overrides = {"nodes": nodes, "gpus_per_node": gpus, "threads": threads}
        if mode == "strong":
            overrides["global_batch"] = base.global_batch or default_batch
        else:
            overrides["batch_per_worker"] = base.batch_per_worker or default_batch
        spec = base.with_overrides(overrides).validate()
        spec.per_worker_batch(default_batch)  # raises if the global batch does not split
        specs.append(spec)
    return specs


def repeat_dirs(run_dir: Path, repeats: int) -> list[Path]:
    """The run directories of one layout: RUN_DIR itself, or RUN_DIR-r0 ... for repeated measurements."""
    return [run_dir] if repeats == 1 else [run_dir.with_name(f"{run_dir.name}-r{i}") for i in range(repeats)]


def run_sweep(backend, specs: list[Spec], runs_root: Path, name: str, repeats: int = 1) -> Path:
    """Run the layouts (each `repeats` times) into one sweep directory; return it.

    One after another, or - for a backend with a queue (`Backend.queues`, e.g. Slurm) - every
    layout submitted first (its repeats together: one job array), then each followed and summarised
    in turn. The sweep holds every run it submitted (`stopping_runs`): a stop signal or an error
    cancels whatever has not ended.
    """
    from launcher.runner import follow, stopping_runs, submit

    sweep_dir = new_run_dir(runs_root, name)
    runs = [(spec, repeat_dirs(sweep_dir / f"{spec.nodes}x{spec.gpus_per_node}", repeats)) for spec in specs]
    write_json(sweep_dir / "sweep.json", {"runs": [d.name for _, dirs in runs for d in dirs],
                                          "layouts": [[s.nodes, s.gpus_per_node] for s in specs]})
    with stopping_runs(backend, []) as held:
        for spec, run_dirs in runs:
            for run_dir in run_dirs:
                run_dir.mkdir()
                held.append(run_dir)
            if backend.queues:  # queued now (the repeats together), followed below
                submit(backend, spec, *run_dirs)
                continue
            for run_dir in run_dirs:  # one at a time, each followed to its end before the next starts
                submit(backend, spec, run_dir)
                follow(backend, spec, run_dir, label=run_dir.name)
        if backend.queues:  # every layout is queued now; follow each in turn
            for spec, run_dirs in runs:
                for run_dir in run_dirs:
                    follow(backend, spec, run_dir, label=run_dir.name)
    return sweep_dir
