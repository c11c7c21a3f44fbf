"""The launcher's copy of a run: S3 mirrored into RUN_DIR, records merged, events for the cost analysis.

The nodes write under s3://BUCKET/PREFIX/RUN_ID/ (scalelab/aws/bootstrap.py); the launcher mirrors that into
RUN_DIR/s3/ (by ETag: only what changed is downloaded), the checkpoint to RUN_DIR/checkpoint.pt,
and merges each rank's records across generations into RUN_DIR/records/rank-R.jsonl (generation
order; a replacement generation continues the step count from the checkpoint; its error records set aside,
error-rank-R.jsonl, likewise), so `launch report`
and the progress display read a run directory like any other. Launcher-side events (instances
started, interruptions, the end with instance-seconds and lost time) go to
RUN_DIR/records/aws-events.jsonl. Records are read with the one reader (`core.records`), tolerantly:
a line cut short by a copy in flight is skipped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from scalelab.core.records import append_record, read_records
from scalelab.core.rundir import CHECKPOINT_FILE, SPEC_FILE, RunPaths, write_chunks
from scalelab.core.writes import check_inside, write_inside

EVENTS_FILE = "aws-events.jsonl"  # in RUN_DIR/records/, beside (not among) the rank-R.jsonl files
MIRROR_DIR = "s3"  # RUN_DIR/s3/: the run's S3 prefix as the nodes wrote it
# Not mirrored: what the launcher itself uploaded (the package, its heartbeat and stop request under
# control/, rewritten on every poll) and the nodes' rendezvous files
NOT_MIRRORED = ("package/", "cluster/", "control/")


def pull(s3, run_dir: Path, info: dict[str, Any]) -> dict[str, str] | None:
    """Download what changed under the run's prefix and merge; return the new ETags, None if nothing changed."""
    mirror = Path(run_dir) / MIRROR_DIR
    etags = dict(info.get("etags", {}))
    changed = False
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=info["bucket"], Prefix=info["prefix"] + "/"):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(info["prefix"]) + 1:]
            if rel.startswith(NOT_MIRRORED) or rel == SPEC_FILE or etags.get(rel) == obj["ETag"]:
                continue
            dest = RunPaths(Path(run_dir)).checkpoint if rel == CHECKPOINT_FILE else mirror / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            check_inside(run_dir, dest)  # a planted link is refused, not followed
            _download(s3, info["bucket"], obj["Key"], dest)
            etags[rel] = obj["ETag"]
            changed = True
    if not changed:
        return None
    merge(Path(run_dir))
    return etags


def _download(s3, bucket: str, key: str, dest: Path) -> None:
    """One object into `dest`, in this thread, whole or not at all (`write_chunks`).

    Not `download_file`: its transfer manager runs thread pools, and the follow loop that pulls on every
    poll is where a stop signal raises `Interrupted`; a transfer cut there must end with the call, not in
    worker threads that the cancel, or the interpreter's exit, then waits for.
    """
    write_chunks(dest, s3.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(1 << 20))


def event(run_dir: Path, name: str, **fields: Any) -> None:
    """One launcher-side event record, checked against the `event` schema by the one writer; the
    launcher is no rank, so the record has no `rank` and `world` (docs/aws.md)."""
    record = {"kind": "event", "event": name, "time": time.time(), **fields}
    append_record(RunPaths(Path(run_dir)).records / EVENTS_FILE, record, absent=("rank", "world"))


def mirrored(run_dir: Path) -> RunPaths:
    """RUN_DIR/s3/, laid out as the nodes upload it: a run directory's records/ and logs/, one gen-G
    folder per generation (scalelab/aws/bootstrap.py `Sync`)."""
    return RunPaths(Path(run_dir) / MIRROR_DIR)


def generation_records(run_dir: Path, gen: int) -> Path:
    return mirrored(run_dir).records / f"gen-{gen}"


def cost_facts(run_dir: Path, info: dict[str, Any]) -> dict[str, Any]:
    """Instance-seconds per type and market, interruptions and the training time they cost. The generations are
    those this launch started instances for (launch.json), not the gen-* folders of records: generations whose
    nodes never wrote a record were not counted ("generations": 0 after four)."""
    seconds: dict[str, float] = {}
    for inst in info["instances"]:
        key = f"{inst['type']}/{inst['lifecycle']}"
        seconds[key] = seconds.get(key, 0.0) + max(0.0, (inst.get("ended") or time.time()) - inst["launched"])
    lost = 0.0
    records = mirrored(run_dir).records
    gens = sorted(int(p.name.split("-")[1]) for p in records.glob("gen-*")) if records.exists() else []
    for a, b in zip(gens, gens[1:]):
        t_end, t_start = _step_times(records / f"gen-{a}"), _step_times(records / f"gen-{b}")
        if t_end and t_start:
            lost += max(0.0, t_start[0] - t_end[-1])  # no training between the generations
    return {"instance_seconds": seconds, "interruptions": int(info.get("replacements", 0)),
            "lost_s": lost, "generations": len({i["generation"] for i in info["instances"]})}


def _rank0(gen_dir: Path, kind: str) -> list[dict]:
    """Rank 0's records of one kind in one generation."""
    path = gen_dir / "rank-0.jsonl"
    return [rec for rec in read_records(path, [], tolerant=True) if rec["kind"] == kind] if path.exists() else []


def _step_times(gen_dir: Path) -> list[float]:
    return [rec["time"] for rec in _rank0(gen_dir, "step")]


def last_step(gen_dir: Path) -> int | None:
    return max((rec["step"] for rec in _rank0(gen_dir, "step")), default=None)


def checkpoint_step(run_dir: Path) -> int | None:
    steps = [rec["step"] for gen_dir in sorted(mirrored(run_dir).records.glob("gen-*"))
             for rec in _rank0(gen_dir, "event") if rec.get("event") == "checkpoint"]
    return max(steps) if steps else None


def merge(run_dir: Path) -> None:
    """RUN_DIR/records/rank-R.jsonl = the generations' rank-R files in order, and error-rank-R.jsonl (a rank's
    `error` records set aside when its own file could not grow: core.records `errors_aside`) the same way, where
    the launcher reads them beside the rank's file; logs copied to RUN_DIR/logs. Why the second: only rank-R was
    merged, so the launcher said "stopped with no error and no end record" of an AWS rank that had said its error."""
    records, paths = mirrored(run_dir).records, RunPaths(run_dir)
    ranks: dict[str, list[Path]] = {}
    for gen_dir in sorted(records.glob("gen-*"), key=lambda p: int(p.name.split("-")[1])):
        for f in [*gen_dir.glob("rank-*.jsonl"), *gen_dir.glob("error-rank-*.jsonl")]:
            ranks.setdefault(f.name, []).append(f)
    paths.records.mkdir(exist_ok=True)
    for name, parts in ranks.items():
        text = "".join(p.read_text() if p.read_text().endswith("\n") or p is parts[-1] else p.read_text() + "\n" for p in parts)
        write_inside(run_dir, paths.records / name, text)
    logs = mirrored(run_dir).logs
    if logs.exists():
        for f in logs.rglob("*.log"):
            dest = paths.logs / f"{f.parent.name}-{f.name}"
            dest.parent.mkdir(exist_ok=True)
            write_inside(run_dir, dest, f.read_bytes())


def json_files(directory: Path, keep: Callable[[str], bool]) -> dict[str, dict]:
    out = {}
    if directory.exists():
        for f in directory.glob("*.json"):
            if keep(f.name):
                try:
                    out[f.name.split(".")[0]] = json.loads(f.read_text())
                except json.JSONDecodeError:
                    continue
    return out
