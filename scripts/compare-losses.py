"""Issue 36, ask 3 ("true bf16: loss within 1% of fp32 after 200 steps on task data"): compare two runs'
losses from their records: the last validation loss and the mean training loss of the last 20 steps.

    python3 scripts/compare-losses.py REFERENCE_RUN_DIR OTHER_RUN_DIR [--out FILE.json]
A runs-dir holding one run is accepted for either (its newest run directory is used).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def run_dir(path: Path) -> Path:
    if (path / "records").is_dir():
        return path
    runs = sorted((p for p in path.iterdir() if (p / "records").is_dir()), key=lambda p: p.stat().st_mtime)
    if not runs:
        sys.exit(f"compare-losses: {path} holds no run (no records/ folder)")
    return runs[-1]


def losses(path: Path) -> dict:
    lines = (run_dir(path) / "records" / "rank-0.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines if line.strip()]
    steps = [r for r in recs if r.get("kind") == "step" and r.get("loss") is not None]
    vals = [r for r in recs if r.get("kind") == "val"]
    tail = steps[-20:]
    return {"run": run_dir(path).name, "steps": len(steps), "train_loss_last20": sum(r["loss"] for r in tail) / max(1, len(tail)),
            "val": [(r["step"], r["val_loss"]) for r in vals]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", type=Path)
    ap.add_argument("other", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    ref, other = losses(args.reference), losses(args.other)
    out = {"reference": ref, "other": other,
           "train_rel_diff": other["train_loss_last20"] / ref["train_loss_last20"] - 1}
    if ref["val"] and other["val"]:
        out["val_rel_diff"] = other["val"][-1][1] / ref["val"][-1][1] - 1
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
