"""Sweeps: one spec over several layouts, strong or weak, then one report.

Every layout's spec is built and validated before the first run starts, so a sweep never dies at
layout 3 of 4 because of a batch that does not split.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

from launcher.errors import SpecError
from launcher.runstore import new_run_dir, write_json
from launcher.spec import Spec

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
    from train.models import PRESETS

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


def run_sweep(backend, specs: list[Spec], runs_root: Path, name: str, execute: Callable) -> Path:
    """Run the layouts into one sweep directory; return it.

    One after another (local), or - for a backend with a queue (`SUBMIT_ALL_AT_ONCE`, e.g. Slurm) -
    every layout queued first, then each followed and summarised in turn by `execute`.
    """
    sweep_dir = new_run_dir(runs_root, name)
    if getattr(backend, "SUBMIT_ALL_AT_ONCE", False):
        return _submit_all_then_follow(backend, specs, sweep_dir, execute)
    runs: list[str] = []
    for spec in specs:
        run_dir = sweep_dir / f"{spec.nodes}x{spec.gpus_per_node}"
        run_dir.mkdir()
        runs.append(run_dir.name)
        write_json(sweep_dir / "sweep.json", {"runs": runs, "layouts": [[s.nodes, s.gpus_per_node] for s in specs]})
        execute(backend, spec, run_dir, label=f"{spec.nodes}x{spec.gpus_per_node}")
    return sweep_dir


class _AlreadyScheduled:
    """The backend, for `execute`, of a run already submitted: schedule returns its handle, sends nothing."""

    def __init__(self, backend, request, handle: str) -> None:
        self._backend, self._request, self._handle = backend, request, handle

    def submit_dryrun(self, spec: Spec, run_dir: Path):
        return self._request

    def schedule(self, request) -> str:
        return self._handle

    def __getattr__(self, name: str):
        return getattr(self._backend, name)


def _submit_all_then_follow(backend, specs: list[Spec], sweep_dir: Path, execute: Callable) -> Path:
    """Queue every layout (one job each), then follow them; on any error or Ctrl-C cancel what is still queued."""
    from launcher.spec import save_spec

    write_json(sweep_dir / "sweep.json", {"runs": [f"{s.nodes}x{s.gpus_per_node}" for s in specs],
                                          "layouts": [[s.nodes, s.gpus_per_node] for s in specs]})
    submitted = []
    try:
        for spec in specs:
            run_dir = sweep_dir / f"{spec.nodes}x{spec.gpus_per_node}"
            run_dir.mkdir()
            save_spec(spec, run_dir)
            request = backend.submit_dryrun(spec, run_dir)
            submitted.append((spec, run_dir, _AlreadyScheduled(backend, request, backend.schedule(request))))
        for spec, run_dir, scheduled in submitted:
            execute(scheduled, spec, run_dir, label=f"{spec.nodes}x{spec.gpus_per_node}")
    except BaseException:
        for _, run_dir, _ in submitted:
            try:
                if backend.status(run_dir).state in ("PENDING", "RUNNING"):
                    backend.cancel(run_dir)
            except Exception:  # noqa: BLE001 - cancel the others whatever this one says
                pass
        raise
    return sweep_dir
