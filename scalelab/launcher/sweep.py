"""Sweeps: one spec over several layouts, along two axes, then one report.

The axes are named apart (issue 14): how the global batch changes with the workers
(`batch_scaling`: fixed = split over them, growing = every worker keeps its batch) and how the total
work does (`work_scaling`: fixed = the same job, growing = the same work per worker). `--mode strong`
is both fixed, `--mode weak` both growing.

Every layout's spec is built and validated before the first run starts, so a sweep never dies at
layout 3 of 4 because of a batch that does not split; and each is saved in its layout's directory
before the first run starts, so a sweep interrupted anywhere resumes (`launch resume SWEEP_DIR`)
and reports what finished (`launch report SWEEP_DIR`).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from scalelab.core.errors import NotQueued, ScalelabError, SpecError, shell_word
from scalelab.core.rundir import (
    CANCELLED,
    COMPLETED,
    SWEEP_FILE,
    TERMINAL,
    RunPaths,
    new_run_dir,
    run_state,
    sweep_runs,
    write_json,
)
from scalelab.core.spec import MODE_AXES, Spec, read_spec, save_spec
from scalelab.core.writes import refuse_run_dir_links
from scalelab.launcher.runner import cancel, follow, owning, refuse_if_live, refuse_model_change, refuse_restart, stopping_runs, submit

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
    twice = sorted({f"{n}x{g}" for n, g in out if out.count((n, g)) > 1})
    if twice:
        given = f"--workers {workers}" if workers else f"--layouts {layouts}"
        raise SpecError(f"the sweep lists layout{'s' if len(twice) > 1 else ''} {', '.join(twice)} twice ({given}); "
                        "give each layout once (--repeats N runs a layout several times)")
    return out


def refuse_layout_flags(nodes: int | None, gpus_per_node: int | None, workers: str | None, layouts: str | None) -> None:
    """A sweep's layouts come from --workers or --layouts alone: --nodes or --gpus-per-node beside them was
    dropped without a word (`sweep --workers 1,2 --nodes 2` ran on one node). Refused naming both flags
    and the --layouts that says what was probably meant."""
    given = "--workers " + workers if workers else "--layouts " + str(layouts)
    counts = [int(x) for x in str(workers).split(",") if x.strip().isdigit()] if workers else []
    if nodes is not None:
        meant = f"; for {nodes} nodes give --layouts {','.join(f'{nodes}x{c}' for c in counts)}" if counts else ""
        raise SpecError(f"--nodes {nodes} conflicts with {given}: a sweep's layouts come from --workers or "
                        f"--layouts alone{meant}")
    if gpus_per_node is not None:
        raise SpecError(f"--gpus-per-node {gpus_per_node} conflicts with {given}: a sweep's layouts come from "
                        "--workers (workers on one node) or --layouts NODESxGPUS alone; leave --gpus-per-node out")


def sweep_axes(mode: str | None, batch_scaling: str | None, work_scaling: str | None,
               base: Spec | None = None) -> tuple[str, str]:
    """(batch_scaling, work_scaling) from --mode and the two axis flags: the mode is a shorthand
    for both, and an axis flag that contradicts it is refused. Without a mode, the batch axis
    defaults to fixed and the work axis to what the length given does on every layout unchanged:
    the same epochs are the same work (fixed); the same steps follow the batch axis."""
    if mode is not None:
        implied = MODE_AXES[mode]
        for flag, given, want in (("--batch-scaling", batch_scaling, implied[0]),
                                  ("--work-scaling", work_scaling, implied[1])):
            if given is not None and given != want:
                raise SpecError(f"--mode {mode} means --batch-scaling {implied[0]} --work-scaling {implied[1]}, "
                                f"but {flag} {given} was given; give the two axes without --mode, or --mode alone")
        return implied
    batch = batch_scaling or "fixed"
    same_epochs = base is not None and base.epochs is not None and base.steps is None
    return batch, work_scaling or ("fixed" if same_epochs else batch)


def sweep_specs(base: Spec, layouts: list[tuple[int, int]], mode: str | None = None, *,
                batch_scaling: str | None = None, work_scaling: str | None = None) -> list[Spec]:
    """One validated spec per layout, on the two axes (`sweep_axes`), each recording its work axis.
    Batch fixed: the global batch is kept and split; growing: the per-worker batch is kept. The
    steps (or epochs) given are those of the fewest workers; `_length` sets each layout's."""
    from scalelab.core.presets import PRESETS

    batch_axis, work_axis = sweep_axes(mode, batch_scaling, work_scaling, base)
    if base.own_code:  # the script decides its batch and length: only the layout changes
        return _own_code_specs(base, layouts, work_axis)
    default_batch = PRESETS[base.model].default_batch
    if batch_axis == "fixed" and base.batch_per_worker is not None:
        raise SpecError("--batch-scaling fixed (--mode strong) keeps the global batch fixed; use --global-batch, "
                        "not --batch-per-worker")
    if batch_axis == "growing" and base.global_batch is not None:
        raise SpecError("--batch-scaling growing (--mode weak) keeps the per-worker batch fixed; use "
                        "--batch-per-worker, not --global-batch")
    specs = []
    # Every emulated "GPU" gets the same compute in every layout: on a host without GPUs a worker is a
    # process, and letting the 1-worker run use all cores would make it a bigger device than the others.
    threads = base.threads
    if threads is None and base.backend == "local":
        threads = max(1, (os.cpu_count() or 1) // max(n * g for n, g in layouts))
    fewest = min(n * g for n, g in layouts)
    for nodes, gpus in layouts:
        overrides = {"nodes": nodes, "gpus_per_node": gpus, "threads": threads, "work_scaling": work_axis,
                     **_length(base, nodes * gpus, fewest, batch_axis, work_axis)}
        if batch_axis == "fixed":
            overrides["global_batch"] = base.global_batch or default_batch
        else:
            overrides["batch_per_worker"] = base.batch_per_worker or default_batch
        spec = base.with_overrides(overrides).validate()
        spec.per_worker_batch(default_batch)  # raises if the global batch does not split
        specs.append(spec)
    return specs


def _own_code_specs(base: Spec, layouts: list[tuple[int, int]], work_axis: str) -> list[Spec]:
    """A --script sweep: the same spec on every layout (the script reads its world size and decides its
    batch), each emulated "GPU" with the same threads as in `sweep_specs`."""
    threads = base.threads
    if threads is None and base.backend == "local":
        threads = max(1, (os.cpu_count() or 1) // max(n * g for n, g in layouts))
    return [base.with_overrides({"nodes": n, "gpus_per_node": g, "threads": threads, "work_scaling": work_axis}).validate()
            for n, g in layouts]


def _length(base: Spec, workers: int, fewest: int, batch_axis: str, work_axis: str) -> dict[str, int]:
    """The steps and epochs of a layout of `workers` so that its total work follows the work axis
    (the base's are the fewest workers'). Epochs are samples: they grow with the work. Steps are
    samples over the global batch: they shrink when the batch grows and the work does not, and
    grow when the work grows and the batch does not. A length that does not divide is refused."""
    out = {}
    if base.epochs is not None and work_axis == "growing":
        out["epochs"] = _scaled(base.epochs, workers, fewest, "--epochs")
    if base.steps is not None and batch_axis != work_axis:
        up, down = (workers, fewest) if work_axis == "growing" else (fewest, workers)
        out["steps"] = _scaled(base.steps, up, down, "--steps")
    return out


def _scaled(value: int, up: int, down: int, flag: str) -> int:
    if value * up % down:
        raise SpecError(f"{flag} {value} times {up}/{down} is not a whole number, so the layouts cannot do the "
                        f"work the axes ask for; choose {flag} a multiple of {down // math.gcd(up, down)}")
    return value * up // down


def repeat_dirs(run_dir: Path, repeats: int) -> list[Path]:
    """The run directories of one layout: RUN_DIR itself, or RUN_DIR-r0 ... for repeated measurements."""
    return [run_dir] if repeats == 1 else [run_dir.with_name(f"{run_dir.name}-r{i}") for i in range(repeats)]


def run_sweep(backend, specs: list[Spec], runs_root: Path, name: str, repeats: int = 1) -> Path:
    """Run the layouts (each `repeats` times) into one new sweep directory; return it.

    Every layout's directory and spec are written before the first run starts, so an interrupted sweep
    can be reported (what finished) and resumed (`resume_sweep`) whatever point it reached.
    """
    sweep_dir = make_sweep(specs, runs_root, name, repeats)
    try:
        return continue_sweep(backend, sweep_dir)
    except ScalelabError:
        discard_unlaunched_sweep(sweep_dir)
        raise


def make_sweep(specs: list[Spec], runs_root: Path, name: str, repeats: int = 1) -> Path:
    """A new sweep directory holding every layout's directory and spec, and sweep.json; nothing launched. A study
    makes all its variants' sweeps so before its first run, so that it can be resumed whatever point it reached."""
    sweep_dir = new_run_dir(runs_root, name)
    with removed_on_failure(sweep_dir):
        names = []
        for spec in specs:
            for run_dir in repeat_dirs(sweep_dir / f"{spec.nodes}x{spec.gpus_per_node}", repeats):
                run_dir.mkdir()
                save_spec(spec, run_dir)
                names.append(run_dir.name)
        write_json(sweep_dir / SWEEP_FILE, {"runs": names, "layouts": [[s.nodes, s.gpus_per_node] for s in specs]})
    return sweep_dir


@contextmanager
def removed_on_failure(made: Path) -> Iterator[None]:
    """Around the writes that fill a directory this launcher just made, before anything in it is launched: where
    one fails (a full or read-only disk, Ctrl-C), the half-written directory goes, as a refused run's does (a sweep
    left `v0/1x1/spec.json` and an empty `1x2`, which `launch ls` listed and `launch resume` could not take)."""
    try:
        yield
    except BaseException:
        shutil.rmtree(made, ignore_errors=True)
        raise


def discard_unlaunched_sweep(sweep_dir: Path) -> bool:
    """Remove a sweep directory this launcher just made when none of its layouts was launched (a submission Slurm
    refused, a cloud or cluster that cannot be reached, before anything was started): as a refused run's, it holds
    nothing to resume or report. A probe's directory too (a sweep with probe.json). True when it is gone."""
    if not any(RunPaths(run_dir).launch.exists() for run_dir in sweep_runs(sweep_dir)):
        shutil.rmtree(sweep_dir, ignore_errors=True)
    return not sweep_dir.exists()


def resume_sweep(sweep_dir: Path, allow_changed: tuple[str, ...] = ()) -> Path:
    """`launch resume SWEEP_DIR`: the layouts that did not complete, continued or started; the sweep.
    A layout whose spec.json changes how it trains since it ran is refused unless allowed (issue #37)."""
    return continue_sweep(checked_resume(sweep_dir, allow_changed), sweep_dir)


def checked_resume(sweep_dir: Path, allow_changed: tuple[str, ...] = ()):
    """The sweep's backend, once every unfinished layout may be resumed (its spec unchanged or the change
    allowed, a checkpoint where steps were taken) and the allowed changes are recorded; a refusal changes
    nothing. Done for every sweep of a study before the first of them goes on."""
    from scalelab.core.trajectory import check_resume, record_changes

    unfinished = [(run_dir, spec) for spec, run_dir in unfinished_layouts(sweep_dir)]
    changes = [(run_dir, check_resume(run_dir, spec, allow_changed)) for run_dir, spec in unfinished]
    backend = sweep_backend(sweep_dir, validated=True)
    for (run_dir, spec), (_, changed) in zip(unfinished, changes):  # refused before any layout is changed
        refuse_restart(backend, run_dir, spec)  # steps but no checkpoint: it would train them again
        refuse_model_change(run_dir, spec, changed)  # a checkpoint that does not fit the allowed new model
    for run_dir, changed in changes:
        if changed:
            record_changes(run_dir, changed)
    return backend


def unfinished_layouts(sweep_dir: Path) -> list[tuple[Spec, Path]]:
    """(spec, directory) of each layout of the sweep that has not completed, in sweep order."""
    return [(read_spec(run_dir).validate(stored=True), run_dir) for run_dir in sweep_runs(sweep_dir)
            if run_state(run_dir) != COMPLETED]


def sweep_backend(sweep_dir: Path, validated: bool = False):
    """The backend of the sweep's first layout (every layout shares it); `validated`: checked against it too."""
    from scalelab.launcher.backend import get_backend

    first = read_spec(sweep_runs(sweep_dir)[0]).validate(stored=True)
    backend = get_backend(first.backend, first.backend_options)
    if validated:
        backend.validate(first)
    return backend


def continue_sweep(backend, sweep_dir: Path, within: Path | None = None) -> Path:
    """Run every layout of the sweep that has not completed; return the sweep directory.

    One after another, or - for a backend with a queue (`Backend.queues`, e.g. Slurm) - every layout
    submitted first, then each followed and summarised in turn. A layout that was cancelled or failed
    continues from its checkpoint (a run resumes from the checkpoint in its directory), one never
    started starts. The sweep owns its directory and each layout's while it runs it (`owning`), and
    holds every run it submitted (`stopping_runs`): a stop signal or an error cancels whatever has
    not ended, and names the sweep as what to resume (`within`: the study it is part of, then).
    """
    todo = unfinished_layouts(sweep_dir)
    for _, run_dir in todo:  # a planted link in any layout: refused before anything is written (issue #37)
        refuse_run_dir_links(run_dir)
    backend = backend.for_sweep(sweep_dir.name)
    note = backend.sweep_note() if todo else ""  # said once the first layout is queued: a refused one is one line
    with owning(sweep_dir), ExitStack() as locks, stopping_runs(backend, []) as held:
        if within is None:  # a study asked it of all its sweeps' layouts already (`preflight_sweep`)
            preflight(backend, todo)
        for spec, run_dirs in _batches(todo, backend.queues):
            for run_dir in run_dirs:
                locks.enter_context(owning(run_dir))
                refuse_if_live(backend, run_dir)
                held.append(run_dir)
            # the repeats of a layout together: one job array on Slurm; each spec with its own backend
            # options (a probe's candidates differ in instance type)
            own = backend.for_spec(spec)
            try:
                submit(own, spec, *run_dirs)
            except NotQueued as exc:
                _cancel_queued(backend, [d for d in held if d not in run_dirs], run_dirs[0].name, exc)
                raise
            if note:
                print(f"launch: {note}", file=sys.stderr, flush=True)
                note = ""
            if not backend.queues:  # one at a time: followed to its end before the next starts
                _follow_layout(own, spec, run_dirs[0], sweep_dir, within)
        if backend.queues:  # every layout is queued now; follow each in turn
            for spec, run_dir in todo:
                _follow_layout(backend.for_spec(spec), spec, run_dir, sweep_dir, within)
    return sweep_dir


def preflight(backend, todo: list[tuple[Spec, Path]]) -> None:
    """Ask the backend whether every layout's request could run (`preflight`: Slurm's `sbatch --test-only`) before
    the first is submitted; a backend without the hook has nothing to ask. Why: a sweep with one impossible layout
    queued the good ones and then cancelled them, though `sweep --help` promises every layout checked first."""
    check = getattr(type(backend), "preflight", None)
    if check is None:
        return
    for spec, run_dirs in _batches(todo, True):
        backend.for_spec(spec).preflight(spec, run_dirs)


def preflight_sweep(backend, sweep_dir: Path) -> None:
    """`preflight` of a sweep's unfinished layouts as `continue_sweep` asks it: a study asks it of every variant's
    sweep before the first layout of the first is submitted, as a sweep does of its layouts."""
    preflight(backend.for_sweep(sweep_dir.name), unfinished_layouts(sweep_dir))


def _cancel_queued(backend, queued: list[Path], refused: str, exc: NotQueued) -> None:
    """The layouts queued before layout `refused` was refused (one the preflight passed: the cluster changed in
    between), cancelled and recorded CANCELLED with the reason, not FAILED with another layout's error; the error
    says so, as "nothing was queued" is true of the refused layout alone."""
    cancelled = []
    for run_dir in queued:
        if RunPaths(run_dir).launch.exists() and run_state(run_dir) not in TERMINAL:
            cancel(backend, run_dir, f"cancelled by the launcher before it ran: layout {refused} of its sweep was "
                   "refused", CANCELLED)
            cancelled.append(run_dir.name)
    if cancelled:
        exc.args = (f"{exc}; the layout{'s' if len(cancelled) > 1 else ''} queued before it "
                    f"({', '.join(cancelled)}) {'were' if len(cancelled) > 1 else 'was'} cancelled",)


def _batches(todo: list[tuple[Spec, Path]], together: bool) -> list[tuple[Spec, list[Path]]]:
    """The runs to submit at once: consecutive runs of one spec (a layout's repeats) when the backend
    queues them, else one run at a time."""
    out: list[tuple[Spec, list[Path]]] = []
    for spec, run_dir in todo:
        if together and out and out[-1][0].to_dict() == spec.to_dict():
            out[-1][1].append(run_dir)
        else:
            out.append((spec, [run_dir]))
    return out


def _follow_layout(backend, spec: Spec, run_dir: Path, sweep_dir: Path, within: Path | None = None) -> None:
    """Follow one layout; a layout that did not complete stops the sweep (and the study `within`, if any), saying
    how to continue it. Its error goes on with those words added, so its type and exit status stay the layout's: 1
    for a layout that failed, as for a run (`RunFailed`), 2 for a wrong input."""
    try:
        follow(backend, spec, run_dir, label=run_dir.name)
    except ScalelabError as exc:
        what, layout = ("study", f"{sweep_dir.name}/{run_dir.name}") if within else ("sweep", run_dir.name)
        how = (f"the {what} was cancelled at layout {layout}, and its unfinished layouts with it"
               if _cancelled(run_dir) else f"the {what} stopped at layout {layout}")
        exc.args = (f"{exc}; {how}; `launch resume {shell_word(within or sweep_dir)}` continues its unfinished "
                    "layouts, `launch report` reports the finished ones",)
        raise


def _cancelled(run_dir: Path) -> bool:
    """Whether the layout was recorded CANCELLED (`launch cancel` of it or of the sweep), not failed."""
    try:
        return run_state(run_dir) == CANCELLED
    except ScalelabError:
        return False
