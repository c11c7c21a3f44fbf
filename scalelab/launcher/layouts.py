"""A sweep's layout directory deleted by hand, made again from sweep.json and a sibling layout's spec.

Why: `launch report SWEEP` said "`launch resume SWEEP` continues it" of a sweep whose layout directory was
deleted, and the resume then failed ("SWEEP/1x2 is not a run directory: spec.json is missing"). Everything a
layout's spec holds is in its siblings' specs but its layout and its length: the layout is its name (and
sweep.json's "layouts"), its steps and epochs follow the sweep's two axes (`sweep._length`, recorded in every
spec as batch_per_worker or global_batch, and work_scaling). A rebuilt spec is trusted only when the same rule
rebuilds every sibling's spec exactly; otherwise (a spec edited by hand, a field resumed with --allow-changed)
the resume is refused, saying what differs and what to do.
"""

from __future__ import annotations

import re
from pathlib import Path

from scalelab.core.errors import RecordError, SpecError, shell_word
from scalelab.core.rundir import RunPaths, sweep_runs
from scalelab.core.spec import Spec, read_spec, save_spec

_NAME = re.compile(r"(\d+)x(\d+)(?:-r\d+)?")  # 1x2, or 1x2-r0 for a repeated layout (`sweep.repeat_dirs`)


def missing_layouts(sweep_dir: Path) -> list[Path]:
    """The sweep's layout directories that are gone (or left empty): no spec.json and nothing else in them."""
    return [p for p in sweep_runs(sweep_dir)
            if not RunPaths(p).spec.exists() and (not p.exists() or (p.is_dir() and not any(p.iterdir())))]


def layout_spec(source: Spec, nodes: int, gpus: int) -> Spec:
    """`source` (a sibling layout's spec) on `nodes` x `gpus`, its steps and epochs scaled as the sweep's
    axes scale them; SpecError where they do not scale to whole numbers."""
    from scalelab.launcher.sweep import _length

    overrides: dict = {"nodes": nodes, "gpus_per_node": gpus}
    if not source.own_code:  # a script decides its own length: only the layout changes
        batch_axis = "growing" if source.batch_per_worker is not None else "fixed"
        overrides.update(_length(source, nodes * gpus, source.workers, batch_axis, source.work_scaling or batch_axis))
    return source.with_overrides(overrides)


def restore_missing_layouts(sweep_dir: Path) -> list[str]:
    """Write a spec.json for each missing layout of the sweep (its directory made again); return their names.
    A RecordError, saying what to do, where no sibling's spec is left or the siblings cannot all be rebuilt
    from one of them by the sweep's rule."""
    sweep_dir = Path(sweep_dir)
    missing = missing_layouts(sweep_dir)
    if not missing:
        return []
    names = ", ".join(p.name for p in missing)
    again = "run the sweep again with `launch sweep`"
    odd = [p.name for p in missing if not _NAME.fullmatch(p.name)]
    if odd:
        raise RecordError(f"{sweep_dir}: layout director{'ies' if len(missing) > 1 else 'y'} {names} missing, and "
                          f"{odd[0]!r} is not a layout name (NODESxGPUS) to rebuild it from; restore it, or {again}")
    siblings = [(p, read_spec(p)) for p in sweep_runs(sweep_dir) if RunPaths(p).spec.exists()]
    if not siblings:
        raise RecordError(f"{sweep_dir}: every layout directory is missing ({names}), so no spec is left to "
                          f"rebuild them from; {again}")
    problem = ""
    for source_dir, source in siblings:
        try:
            rebuilt = {p: layout_spec(source, *map(int, _NAME.fullmatch(p.name).groups()))  # type: ignore[union-attr]
                       for p, _ in siblings}
        except SpecError as exc:
            problem = str(exc)
            continue
        differs = [(p, spec) for p, spec in siblings if rebuilt[p].to_dict() != spec.to_dict()]
        if differs:
            p, spec = differs[0]
            fields = [k for k, v in spec.to_dict().items() if rebuilt[p].to_dict().get(k) != v]
            problem = f"{p.name}'s spec differs from {source_dir.name}'s in {', '.join(fields)} beyond its layout"
            continue
        for p in missing:
            spec = layout_spec(source, *map(int, _NAME.fullmatch(p.name).groups())).validate(stored=True)  # type: ignore[union-attr]
            p.mkdir(exist_ok=True)
            save_spec(spec, p)
        return [p.name for p in missing]
    raise RecordError(f"{sweep_dir}: layout director{'ies' if len(missing) > 1 else 'y'} {names} missing, and "
                      f"cannot be rebuilt from the others ({problem}); restore {shell_word(missing[0])} from a "
                      f"backup, or {again}")
