"""Slurm fixes found by a tester on the two-node test cluster (nodes with 4 GPUs each, by GRES).

- A sweep with one impossible layout (1x5) queued 1x1, cancelled it, recorded it FAILED with 1x5's error and
  said "nothing was queued"; every layout is now asked of Slurm (`sbatch --test-only`) before the first is sent.
- A layout the launcher cancelled because a later one was refused is recorded CANCELLED, saying why.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import launch, run_entry

pytestmark = pytest.mark.slow  # on the cluster

SMALL = ["--backend", "slurm", "--model", "nmt-tiny", "--threads", "1", "--warmup-steps", "1",
         "--global-batch", "20", "--steps", "8"]


def _jobs_named(prefix: str, since: float) -> list[str]:
    """The job ids Slurm accounting lists under a name starting with `prefix`, submitted since `since`."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 60))
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-S", start, "-o", "JobID,JobName"],
                         capture_output=True, text=True).stdout
    return [line.split("|")[0] for line in out.splitlines() if line.split("|")[-1].startswith(prefix)]


def test_a_sweep_with_one_impossible_layout_queues_nothing(slurm_cluster, tmp_path: Path) -> None:
    """1x5 on nodes of 4 GPUs: refused naming 1x5 before 1x1 is sent; no job, no sweep directory left."""
    name, since = f"bad{uuid.uuid4().hex[:6]}", time.time()
    done = launch("sweep", *SMALL, "--layouts", "1x1,1x5", "--name", name, "-y", "--runs-dir", "runs", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "1x5" in done.stderr and "Traceback" not in done.stderr
    assert not any((tmp_path / "runs").glob(f"{name}*")), "the refused sweep's directory was left"
    assert _jobs_named(f"scalelab-{name}", since) == [], "a layout was queued before the refusal"


def test_layouts_queued_before_a_refused_one_are_recorded_cancelled(slurm_cluster, tmp_path: Path, monkeypatch,
                                                                    capsys) -> None:
    """A refusal the preflight could not foresee (here: no preflight) cancels 1x1, recorded CANCELLED with why."""
    from scalelab.slurm.backend import SlurmBackend

    monkeypatch.setattr(SlurmBackend, "preflight", lambda self, spec, run_dirs: None, raising=False)
    monkeypatch.chdir(tmp_path)
    name = f"late{uuid.uuid4().hex[:6]}"
    code, err, _ = run_entry(["sweep", *SMALL, "--layouts", "1x1,1x5", "--name", name, "-y", "--runs-dir", "runs"],
                             monkeypatch, capsys)
    assert code == 2, err
    (sweep,) = (tmp_path / "runs").glob(f"{name}*")
    state = json.loads((sweep / "1x1" / "launch.json").read_text())
    assert state["state"] == "CANCELLED", state
    assert "layout 1x5" in state["detail"] and "refused" in state["detail"], state["detail"]
    assert "(1x1) was cancelled" in err, err
