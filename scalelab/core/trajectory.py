"""What a resume may not change silently: the spec fields that change a run's trajectory (issue #37).

Why: `launch resume` read spec.json as it found it, so an edited learning rate (or optimizer, batch,
precision, data) was taken without a word; the losses after the resume followed the new value while
the report showed one spec. The checkpoint's identity (`train/checkpoint.py`) caught some fields, inside
the ranks, and not the learning rate or its schedule.

Now every submit records the trajectory fields of the spec it sends as a launcher event (`trajectory`)
in RUN_DIR/records/launcher-events.jsonl, beside the ranks' files. `launch resume` compares the spec
with the last of them before anything starts: a difference is refused, naming each field, its value
then and now, unless `--allow-changed FIELD` names it; then a `spec_changed` event records from which
step what changed (the step after the last checkpoint), `launch report` says it, and the ranks accept
the checkpoint's identity differing in exactly those fields (`accepted_identity_changes`). A run
launched before this record existed is resumed unchecked, as before (its ranks still check the
checkpoint's identity).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from scalelab.core.errors import RecordError, SpecError
from scalelab.core.records import refuse_non_file
from scalelab.core.rundir import RunPaths
from scalelab.core.spec import Spec
from scalelab.core.writes import open_inside

EVENTS_FILE = "launcher-events.jsonl"  # in RUN_DIR/records/, beside (not among) the rank-R.jsonl files

# --allow-changed name -> the spec's value. Layout, engine and its exchange settings, threads, steps and
# checkpoints are not here: the same seed and global batch give the same losses on any of them.
FIELDS: dict[str, Callable[[Spec], Any]] = {
    "model": lambda s: s.model,
    "model_args": lambda s: dict(sorted(s.model_args.items())),
    "rnn": lambda s: s.rnn,
    "optimizer": lambda s: s.optimizer,
    "lr": lambda s: s.lr,
    "lr_warmup_steps": lambda s: s.lr_warmup_steps,
    "lr_ref_batch": lambda s: s.lr_ref_batch,
    "clip_grad_norm": lambda s: s.clip_grad_norm,
    "global_batch": lambda s: s.global_batch,
    "batch_per_worker": lambda s: s.batch_per_worker,
    "precision": lambda s: s.precision,
    "seed": lambda s: s.seed,
    **{f"data.{name}": (lambda s, n=name: getattr(s.data, n))
       for name in ("kind", "train_src", "train_tgt", "valid_src", "valid_tgt", "train_samples", "fixed_length",
                    "bucket", "shards")},
}
# A --script / --module run's trajectory is its code and the arguments it is given: the trainer's fields above
# are not read by it (TRAINER_ONLY), and `model` is only the preset it does not train.
CODE_FIELDS: dict[str, Callable[[Spec], Any]] = {
    "script": lambda s: s.script,
    "module": lambda s: s.module,
    "script_args": lambda s: list(s.script_args),
}
FIELDS.update(CODE_FIELDS)
GROUPS = {"data": [f for f in FIELDS if f.startswith("data.")], "batch": ["global_batch", "batch_per_worker"]}
# the checkpoint identity's keys (train/checkpoint.py `identity`) -> the fields that decide them
IDENTITY_FIELDS = {"model": ["model"], "rnn": ["rnn"], "model_args": ["model_args"], "optimizer": ["optimizer"],
                   "seed": ["seed"], "data": ["data.kind"], "global_batch": ["global_batch", "batch_per_worker"],
                   "precision": ["precision"]}


def trajectory(spec: Spec) -> dict[str, Any]:
    """The fields that decide the losses `spec` trains to: the built-in trainer's settings, or, for a
    --script / --module run, its code and arguments only (a trainer setting left in its spec.json, as runs
    from before the refusal have, is not read by the script: editing it changes nothing)."""
    fields = CODE_FIELDS if spec.own_code else FIELDS
    return {name: get(spec) for name, get in fields.items()}


def allowed_fields(names: tuple[str, ...] | list[str]) -> set[str]:
    """--allow-changed's names (a group such as `data` or `batch` stands for its fields), checked."""
    out: set[str] = set()
    for name in names:
        if name in GROUPS:
            out.update(GROUPS[name])
        elif name in FIELDS:
            out.add(name)
        else:
            raise SpecError(f"--allow-changed {name!r} is not a field that changes a run's trajectory; the fields: "
                            f"{', '.join([*FIELDS, *GROUPS])}")
    return out


def events_path(run_dir: Path) -> Path:
    return RunPaths(Path(run_dir)).records / EVENTS_FILE


def launcher_events(run_dir: Path) -> list[dict[str, Any]]:
    """The launcher's events of a run (none when it has no such file); a line that is not one is skipped
    (the file is the launcher's own, written whole; a link is refused by `open_inside`, not followed)."""
    path = events_path(run_dir)
    if not path.exists() and not path.is_symlink():
        return []
    refuse_non_file(path, "the launcher's events file", "`launch` as it starts and resumes the run")
    fd = open_inside(path.parent, path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        lines = f.read().split(b"\n")
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(rec, dict) and rec.get("kind") == "event":
            out.append(rec)
    return out


def _event(run_dir: Path, name: str, **fields: Any) -> None:
    from scalelab.core.records import append_record

    append_record(events_path(run_dir), {"kind": "event", "event": name, "time": time.time(), **fields},
                  absent=("rank", "world"))


def record_trajectory(spec: Spec, run_dir: Path) -> None:
    """Each submit: the trajectory fields of the spec sent (what the next resume is compared with)."""
    _event(run_dir, "trajectory", fields=trajectory(spec))


def _show(value: Any) -> str:
    return "(none)" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def checkpoint_step(run_dir: Path) -> int:
    """The step of the run's last checkpoint, from rank 0's `checkpoint` events (0: none)."""
    from scalelab.core.records import read_records

    path = RunPaths(Path(run_dir)).rank_records(0)
    if not path.is_file():
        return 0
    return max((int(r["step"]) for r in read_records(path, [], tolerant=True)
                if r.get("kind") == "event" and r.get("event") == "checkpoint" and isinstance(r.get("step"), int)),
               default=0)


def check_resume(run_dir: Path, spec: Spec, allow: tuple[str, ...] = ()) -> dict[str, list[Any]]:
    """Before `launch resume` starts anything: the trajectory fields `spec` changes against the spec the
    run last ran with ({} when none, or no record of it). A change not in `allow` is a SpecError naming
    every one; the allowed ones are returned, for `record_changes` once the resume goes ahead."""
    allowed = allowed_fields(allow)
    recorded = [e for e in launcher_events(run_dir) if e.get("event") == "trajectory" and isinstance(e.get("fields"), dict)]
    if not recorded:
        return {}
    before, now = recorded[-1]["fields"], trajectory(spec)
    changed = {k: [before[k], now[k]] for k in now if k in before and before[k] != now[k]}
    refused = [k for k in changed if k not in allowed]
    if refused:
        said = "; ".join(f"{k} {_show(changed[k][0])} -> {_show(changed[k][1])}" for k in refused)
        flags = " ".join(f"--allow-changed {k}" for k in refused)
        raise SpecError(f"{RunPaths(Path(run_dir)).spec} changes how {run_dir} trains since it last ran ({said}); "
                        f"the steps after the resume would follow another spec than those before. Restore the "
                        f"value{'s' if len(refused) > 1 else ''}, or resume with {flags} to go on with the change "
                        "(recorded in the run, and said by `launch report`)")
    return changed


def record_changes(run_dir: Path, changed: dict[str, list[Any]]) -> int:
    """The `spec_changed` event of allowed changes: from which step (after the last checkpoint) what changed."""
    step = checkpoint_step(run_dir) + 1
    _event(run_dir, "spec_changed", step=step, changes={k: {"was": a, "now": b} for k, (a, b) in changed.items()})
    return step


def spec_changes(run_dir: Path) -> list[str]:
    """Each recorded change as a sentence, for reports: 'from step 5: lr 0.001 -> 0.002 (...)'."""
    out = []
    events = launcher_events(run_dir)
    for i, e in enumerate(events):
        submitted = any(later.get("event") == "trajectory" for later in events[i + 1:])  # else that resume never ran
        if e.get("event") == "spec_changed" and isinstance(e.get("changes"), dict) and submitted:
            what = "; ".join(f"{k} {_show(v.get('was'))} -> {_show(v.get('now'))}" for k, v in e["changes"].items()
                             if isinstance(v, dict))
            out.append(f"{run_dir}: its spec was changed at a resume (launch resume --allow-changed): from step "
                       f"{e.get('step')}: {what}; the steps before ran with the earlier values")
    return out


#: The checkpoint identity keys a resume accepted changing, comma-separated, for ranks that cannot read the
#: launcher's events file (Kubernetes pods, AWS instances: their RUN_DIR is not the launcher's). Set by the
#: renderers from `accepted_env`; where it is set it is what the ranks go by.
ACCEPTED_ENV = "SCALELAB_ACCEPTED_CHANGES"


def accepted_env(run_dir: Path) -> dict[str, str]:
    """{ACCEPTED_ENV: "key,key"} for the ranks of a remote backend when a resume accepted identity changes
    (`launch resume --allow-changed`), else {}: what the Kubernetes and AWS renderers add to the ranks'
    environment, since the file the local and Slurm ranks read stays on the launcher's machine."""
    keys = sorted(accepted_identity_changes(run_dir, from_env=False))
    return {ACCEPTED_ENV: ",".join(keys)} if keys else {}


def accepted_identity_changes(run_dir: Path, from_env: bool = True) -> dict[str, bool]:
    """The checkpoint identity keys a resume accepted changing (the last `spec_changed` event's fields).
    Read by the ranks before they compare a checkpoint's identity with their spec: from ACCEPTED_ENV where
    the launcher set it (a remote backend), else from the run's launcher events."""
    if from_env and os.environ.get(ACCEPTED_ENV) is not None:
        return {key: True for key in os.environ[ACCEPTED_ENV].split(",") if key in IDENTITY_FIELDS}
    try:
        events = [e for e in launcher_events(run_dir) if e.get("event") == "spec_changed"]
    except RecordError:
        return {}
    if not events or not isinstance(events[-1].get("changes"), dict):
        return {}
    fields = set(events[-1]["changes"])
    return {key: True for key, names in IDENTITY_FIELDS.items() if fields & set(names)}
