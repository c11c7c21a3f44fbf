"""Generated corpora, and prep's lines per second against a single-process baseline.

    python -m scalelab.prep.bench --family nmt --lines 400000 --workers 1,2 --repeats 3     (docs/benchmarks.md)

The baseline is plain Python in one process doing the same work per line with the same rules
(`prep.families.Rules`): read, tokenise, count, build the vocabulary, encode, write the ids.
Each repeat runs the baseline and every worker count back to back, so on a shared machine the
ratios compare like with like; the table gives medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalelab.analysis.report import markdown_table
from scalelab.core.presets import PRESETS

LABELS = ("neg", "neutral", "pos")


def generate(directory: Path, family: str, lines: int, words: int = 5000, seed: int = 0) -> dict[str, list[str]]:
    """A corpus of `lines` lines for `family` (Zipf-distributed words, 1-30 a line, some blank
    lines, CRLF line ends and pairs with an empty side); returns the prep inputs naming its files."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(words)])
    directory.mkdir(parents=True, exist_ok=True)

    def text(n: int) -> list[str]:
        lengths = rng.integers(1, 31, size=n)
        ids = (rng.zipf(1.3, size=int(lengths.sum())) - 1) % words
        cuts = np.cumsum(lengths)[:-1]
        return [" ".join(part) for part in np.split(vocab[ids], cuts)]

    def write(name: str, rows: list[str]) -> str:
        ends = ["\r\n" if i % 17 == 3 else "\n" for i in range(len(rows))]
        path = directory / name
        path.write_text("".join(r + e for r, e in zip(rows, ends)), encoding="utf-8")
        return str(path)

    blank = rng.random(lines) < 0.02
    if family == "nmt":
        src = ["" if b else t for b, t in zip(blank, text(lines))]
        return {"train_src": [write("train.src", src)], "train_tgt": [write("train.tgt", text(lines))]}
    rows = text(lines)
    if family == "sentiment":
        rows = [f"{LABELS[k]}\t{t}" for k, t in zip(rng.integers(0, len(LABELS), size=lines), rows)]
    return {"train": [write("train.txt", ["" if b else r for b, r in zip(blank, rows)])]}


def baseline(inputs: dict[str, list[str]], model: str, out: Path) -> dict[str, Any]:
    """The same work as prep, in one process, no Dask: lines/s over the training files."""
    from scalelab.prep.corpus import ROLES
    from scalelab.prep.families import Payload, Rules, Tally
    from scalelab.prep.shardio import Columns, encode_ipc
    from scalelab.train.text import Vocab  # loaded (with PyTorch) before the clock starts

    cfg = PRESETS[model]
    keys = ROLES[cfg.family][0]
    rules = Rules.for_config(cfg, keys)
    start = time.perf_counter()
    handles = [open(inputs[k][0], encoding="utf-8", newline="\n") for k in keys]
    samples, tally, lines = [], Tally(rules), 0
    for texts in zip(*handles):
        lines += 1
        sample = rules.sample([t.rstrip("\r\n") for t in texts], inputs[keys[0]][0], lines - 1)
        if sample is not None:
            tally.add(sample)
            samples.append(sample)
    for h in handles:
        h.close()
    stoi = {name: Vocab.build([c], cfg.vocab_size).stoi for name, c in tally.counts().items()}
    payload = Payload(stoi, {label: i for i, label in enumerate(LABELS)})
    columns = Columns(cfg.family)
    for sample in samples:
        columns.add(rules.encode(sample, payload))
    (out / "baseline.arrow").write_bytes(encode_ipc(cfg.family, columns.arrays()))
    seconds = time.perf_counter() - start
    return {"what": "baseline", "workers": 1, "lines": lines, "seconds": seconds, "lines_per_s": lines / seconds}


def prep_run(inputs: dict[str, list[str]], model: str, workers: int, work: Path, block_mb: float,
             extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """`launch prep` (and `extra` flags) in a fresh process; its summary (wall time excludes the
    cluster's start-up), its run directory and its shards directory."""
    flags = [arg for key, paths in inputs.items() for p in paths for arg in ("--" + key.replace("_", "-"), p)]
    out, runs = work / f"shards-{workers}-{time.time_ns()}", work / "runs"
    cmd = [sys.executable, "-m", "scalelab.launcher.cli", "prep", "--model", model, *flags, "--out", str(out),
           "--workers", str(workers), "--block-mb", str(block_mb), "--runs-dir", str(runs), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    summary = json.loads(max(runs.glob("*/summary.json"), key=lambda p: p.stat().st_mtime).read_text())
    return {"what": "prep", "workers": workers, "lines": summary["lines"], "seconds": summary["wall_s"],
            "lines_per_s": summary["lines_per_s"], "startup_s": summary["startup_s"],
            "peak_rss_mb": summary["peak_rss_mb"], "growth_mb": summary["growth_mb"],
            "run": summary["run"], "out": str(out)}


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: median lines/s (and per worker) per configuration, and the median over repeats of
    its ratio to the baseline measured in the same repeat (side by side, so machine load cancels)."""
    base = {r["repeat"]: r["lines_per_s"] for r in results if r["what"] == "baseline"}
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in results:
        groups.setdefault((r["what"], r["workers"]), []).append(r)
    rows = []
    for (what, workers), rs in groups.items():
        med = statistics.median(r["lines_per_s"] for r in rs)
        ratio = statistics.median(r["lines_per_s"] / base[r["repeat"]] for r in rs)
        rows.append([what, workers, med, med / workers, f"{ratio:.2f}x", ", ".join(f"{r['lines_per_s']:,.0f}" for r in rs)])
    columns = ["run", "workers", "lines/s (median)", "lines/s per worker", "vs baseline (median ratio)", "each repeat (lines/s)"]
    return markdown_table(pd.DataFrame(rows, columns=columns), formats={"lines/s (median)": ",.0f", "lines/s per worker": ",.0f"},
                          align_right=["workers", "vs baseline (median ratio)"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.prep.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("nmt", "rnnlm", "sentiment"), default="nmt")
    parser.add_argument("--lines", type=int, default=400_000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--block-mb", type=float, default=4.0)
    parser.add_argument("--out", type=Path, help="Write the results as JSON here.")
    args = parser.parse_args(argv)
    model = {"nmt": "nmt-small", "rnnlm": "rnnlm-small", "sentiment": "sentiment-small"}[args.family]
    with tempfile.TemporaryDirectory(prefix="prep-bench-") as tmp:
        work = Path(tmp)
        inputs = generate(work / "corpus", args.family, args.lines)
        results = []
        for repeat in range(args.repeats):
            results.append({**baseline(inputs, model, work), "repeat": repeat, "load": os.getloadavg()[0]})
            for n in (int(w) for w in args.workers.split(",")):
                results.append({**prep_run(inputs, model, n, work, args.block_mb), "repeat": repeat,
                                "load": os.getloadavg()[0]})  # other work on the machine (1-minute load)
            print(json.dumps(results[-1]), file=sys.stderr)
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
