"""Memory stays bounded, shown directly: a corpus larger than a worker's memory limit goes through.

    python -m scalelab.prep.membench --corpus-mb 320 --memory-limit 250MB --workers 2      (docs/benchmarks.md)

Generates a labelled corpus (`prep.bench.generate`, in chunks: never held whole here) under a
scratch directory, runs `launch prep` on it with local Dask worker processes limited to
`--memory-limit` (Dask's nanny pauses a worker at 80% of its limit and restarts it at 95%), and
checks, from the prep's records and manifest only:

- the corpus is larger than a worker's limit;
- no worker passed its limit: each worker's peak resident size (its own, VmHWM) stays below it;
- no worker was restarted: every task ran in the process the worker had before its first task;
- the shards are complete: training + validation samples = the corpus's non-blank lines, and each
  shard file holds the rows its manifest entry says.

Prints the result as JSON (and writes it with `--out`), exit 1 when a check fails. The corpus and
the shards are deleted afterwards. Too slow for CI (minutes): a worker's imports alone take ~130 MB,
so a corpus above a limit it can live under is hundreds of MB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scalelab.prep.bench import generate, prep_run

CHUNK_LINES = 200_000


def big_corpus(directory: Path, megabytes: float) -> tuple[Path, dict[str, int]]:
    """A sentiment corpus of about `megabytes` MB, written chunk by chunk; its lines and blank lines."""
    directory.mkdir(parents=True, exist_ok=True)
    path, counts = directory / "train.txt", {"lines": 0, "blank": 0, "bytes": 0}
    with path.open("wb") as whole:
        seed = 0
        while counts["bytes"] < megabytes * 1e6:
            part = Path(generate(directory / "part", "sentiment", CHUNK_LINES, seed=seed)["train"][0])
            with part.open("rb") as f:
                for line in f:
                    counts["lines"] += 1
                    counts["blank"] += not line.strip()
            counts["bytes"] += part.stat().st_size
            with part.open("rb") as f:
                shutil.copyfileobj(f, whole)
            seed += 1
    shutil.rmtree(directory / "part")
    return path, counts


def shard_rows(out: Path, manifest: dict[str, Any]) -> list[str]:
    """Problems with the shard files: missing, or rows other than their manifest entry says."""
    import pyarrow as pa

    problems = []
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            path = out / shard["file"]
            if not path.is_file():
                problems.append(f"{shard['file']} missing")
                continue
            with pa.memory_map(str(path)) as source:
                rows = pa.ipc.open_file(source).read_all().num_rows
            if rows != shard["samples"]:
                problems.append(f"{shard['file']}: {rows} rows, manifest says {shard['samples']}")
    return problems


def check(result: dict[str, Any], records: list[dict[str, Any]], manifest: dict[str, Any], out: Path) -> list[str]:
    """What failed, from the records and the manifest (empty: the corpus went through, bounded)."""
    from dask.utils import parse_bytes

    limit_mb = parse_bytes(result["memory_limit"]) / 2**20
    problems = []
    if result["corpus_bytes"] <= parse_bytes(result["memory_limit"]):
        problems.append("the corpus is not larger than a worker's memory limit")
    pids = {r["worker"]: r["pid"] for r in records if r["kind"] == "worker"}
    tasks = [r for r in records if r["kind"] == "task"]
    restarted = sorted({t["worker"] for t in tasks if pids.get(t["worker"]) != t["pid"]})
    if restarted or len(pids) != result["workers"]:
        problems.append(f"workers restarted or missing: {restarted or sorted(pids)}")
    over = {w: p for w, p in result["peak_rss_mb_by_worker"].items() if p >= limit_mb}
    if over:
        problems.append(f"peak RSS at or above the limit ({limit_mb:.0f} MiB): {over}")
    samples = sum(s["samples"] for s in manifest["splits"].values())
    if samples != result["lines"] - result["blank_lines"]:
        problems.append(f"{samples} samples in the shards, {result['lines'] - result['blank_lines']} non-blank lines")
    return problems + shard_rows(out, manifest)


def measure(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from scalelab.prep.records import load_records

    t0 = time.perf_counter()
    path, counts = big_corpus(work / "corpus", args.corpus_mb)
    generated_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = prep_run({"train": [str(path)]}, "sentiment-small", args.workers, work, args.block_mb,
                   ("--backend-opt", f"memory_limit={args.memory_limit}"))
    records = load_records(Path(run["run"]))
    before = {r["worker"]: r["rss_mb"] for r in records if r["kind"] == "worker"}
    summary = json.loads((Path(run["run"]) / "summary.json").read_text())
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "load_1min": os.getloadavg()[0], "model": "sentiment-small", "workers": args.workers,
        "memory_limit": args.memory_limit, "block_mb": args.block_mb, "corpus_bytes": counts["bytes"],
        "lines": counts["lines"], "blank_lines": counts["blank"], "generate_s": generated_s,
        "command_s": time.perf_counter() - t0, "wall_s": run["seconds"], "startup_s": run["startup_s"],
        "lines_per_s": run["lines_per_s"], "rss_mb_before_tasks": before,
        "peak_rss_mb_by_worker": summary["peak_rss_mb_by_worker"], "growth_mb": summary["growth_mb"],
        "tasks": sum(r["kind"] == "task" for r in records),
    }
    manifest = json.loads((Path(run["out"]) / "manifest.json").read_text())
    result["samples"] = {s: d["samples"] for s, d in manifest["splits"].items()}
    result["problems"] = check(result, records, manifest, Path(run["out"]))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.prep.membench", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus-mb", type=float, default=320.0, help="Size of the generated corpus, in MB.")
    parser.add_argument("--memory-limit", default="250MB", help="Each worker's limit (Dask's syntax).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--block-mb", type=float, default=16.0, help="launch prep's --block-mb (its default).")
    parser.add_argument("--out", type=Path, help="Write the result as JSON here.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="prep-membench-") as tmp:
        result = measure(Path(tmp), args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
