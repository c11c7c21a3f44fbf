"""A --script sweep whose script keeps a per-rank batch: the report says its global batch grew with the workers.

scalelab does not choose a script's batch, so its series were labelled "strong" (a fixed global batch) whatever
the script did; a script giving every rank 16 items a step had its 2-worker throughput, the same steps on twice
the data, reported as a speedup of a fixed job. The label no longer claims a mode, and the report names the
batch the records show against the axis the series carries.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import launch, only_run_dir

PER_RANK = """import time

import torch.distributed as dist

from scalelab import track

dist.init_process_group("gloo")
for step in range(14):
    time.sleep(0.02)
    track.step(items=16, loss=1.0 / (step + 1))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_per_rank_batch_script_sweep_is_named_as_growing_its_batch(tmp_path: Path) -> None:
    script = tmp_path / "per_rank.py"
    script.write_text(PER_RANK)
    done = launch("sweep", "--script", str(script), "--engine", "ddp", "--workers", "1,2", "--warmup-steps", "2",
                  cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join((done.stdout + done.stderr).split())
    assert ("per_rank.py ddp: its global batch grew with the workers: each worker kept its batch (weak scaling in "
            "the batch), 16 at 1 worker(s) and 32 at 2") in said, said[-3000:]
    report = (only_run_dir(tmp_path / "runs") / "report.md").read_text()
    assert "per_rank.py ddp strong" not in report and "its global batch grew with the workers" in report
