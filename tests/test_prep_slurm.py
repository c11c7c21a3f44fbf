"""`launch prep --backend slurm` on the project's real two-node Slurm cluster (dask-jobqueue).

Uses the session fixture of tests/test_slurm_cluster.py (scripts/slurm-cluster.sh: nodes `node1`
and `node2` with 4 CPUs each). Every worker asks for 4 CPUs, so the two workers' jobs land on the
two nodes; the shards must be byte for byte those of a local prep.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("dask_jobqueue", reason='launch prep --backend slurm needs dask-jobqueue: pip install "scalelab[prep]"')

from scalelab.prep.bench import generate  # noqa: E402
from tests.conftest import launch, only_run_dir, read_jsonl  # noqa: E402

pytestmark = pytest.mark.slow  # every test here takes over 5 s on 2 cores (the fast subset: -m 'not slow')

SLURM = ["--backend", "slurm", "--backend-opt", "partition=debug", "--backend-opt", "cpus_per_worker=4",
         "--backend-opt", "mem_gb_per_worker=2", "--backend-opt", "walltime=00:10:00"]


def test_prep_on_two_slurm_nodes_gives_the_local_shards(slurm_cluster, tmp_path: Path) -> None:
    inputs = generate(tmp_path / "corpus", "nmt", 6000, words=1500, seed=7)
    flags = ["--model", "nmt-tiny", "--train-src", inputs["train_src"][0], "--train-tgt", inputs["train_tgt"][0],
             "--shard-size", "500", "--block-mb", "0.05"]
    done = launch("prep", *flags, *SLURM, "--workers", "2", "--out", str(tmp_path / "slurm"),
                  "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(only_run_dir(tmp_path / "runs") / "records" / "prep.jsonl")
    scans = [r for r in records if r["kind"] == "task" and r["phase"] == "scan"]
    assert {r["node"] for r in scans} == {"node1", "node2"}, "one worker on each Slurm node"
    assert sum(r["lines"] for r in scans) == 6000

    local = launch("prep", *flags, "--workers", "1", "--out", str(tmp_path / "local"),
                   "--runs-dir", str(tmp_path / "runs-local"), cwd=tmp_path, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]
    files = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "slurm").iterdir())
    for name in files:
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "slurm" / name).read_bytes(), name

    queue = subprocess.run(["squeue", "-h", "-n", "scalelab-prep"], capture_output=True, text=True).stdout
    assert not queue.strip(), f"the prep's worker jobs outlived it:\n{queue}"
