"""Issue 34 on the real two-node Slurm cluster (scripts/slurm-cluster.sh; skipped where it cannot run): the
examples' DDP and Horovod scripts as the ranks of a `--nodes 2` job, and a cancel that reaches the script's
`track.should_stop()` (scancel's SIGTERM, passed on by scalelab/slurm/rank.py) with its checkpoint saved."""

from __future__ import annotations

import json
import subprocess
import sys
import os
import time
from pathlib import Path

import pytest

from scalelab.train.track import HOLD_AT_STEP_ENV
from tests.conftest import ROOT, launch, needs_horovod, only_run_dir, read_jsonl

pytestmark = pytest.mark.slow  # a real cluster: each run takes 10-20 s

EXAMPLES = ROOT / "examples" / "own-script"
SCRIPTS = {"ddp": EXAMPLES / "train_ddp.py", "horovod": EXAMPLES / "train_horovod.py"}
ENGINES = ["ddp", pytest.param("horovod", marks=needs_horovod)]
SLURM = ["--backend", "slurm", "--nodes", "2", "--gpus-per-node", "1", "--threads", "1"]


def rank_records(run_dir: Path, rank: int) -> list[dict]:
    return read_jsonl(run_dir / "records" / f"rank-{rank}.jsonl")


@pytest.mark.parametrize("engine", ENGINES)
def test_script_runs_on_two_slurm_nodes(slurm_cluster, tmp_path: Path, engine: str) -> None:
    dry = launch(*SLURM, "--script", str(SCRIPTS[engine]), "--engine", engine, "--dry-run", "--", "--steps", "12",
                 cwd=tmp_path)
    assert dry.returncode == 0 and f"python {SCRIPTS[engine]} --steps 12" in dry.stdout, dry.stderr
    done = launch(*SLURM, "--script", str(SCRIPTS[engine]), "--engine", engine, "--",
                  "--steps", "12", "--val-every", "6", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # the ranks' lines as `launch` followed the job (launcher/echo.py): rank 0's task file, submitit's lines left out
    shown = [line.split(" validation")[0] for line in done.stdout.splitlines() if "validation loss" in line]
    assert shown == ["[rank0]:step 6", "[rank0]:step 12"], done.stdout
    assert "submitit INFO" not in done.stdout + done.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    nodes = {json.loads(line)["node"] for p in (run_dir / "slurm").glob("placement-*.jsonl")
             for line in p.read_text().splitlines()}
    assert nodes == {"node1", "node2"}
    for rank in (0, 1):
        recs = rank_records(run_dir, rank)
        assert recs[0]["kind"] == "start" and recs[0]["world"] == 2 and recs[0]["engine"] == engine
        assert [r["step"] for r in recs if r["kind"] == "step"] == list(range(1, 13))
    assert json.loads((run_dir / "summary.json").read_text())["words_per_s"] > 0


def test_cancel_of_a_slurm_script_run_reaches_should_stop(slurm_cluster, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *SLURM, "--script", str(SCRIPTS["ddp"]),
                             "--engine", "ddp", "--", "--steps", "200000", "--val-every", "1000000"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not train 10 steps"
            runs = list((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else []
            path = runs[0] / "records" / "rank-1.jsonl" if runs else None
            if path and path.exists() and path.read_text().count('"kind": "step"') >= 10:
                break
            time.sleep(0.5)
        run_dir = runs[0]
        cancel = launch("cancel", str(run_dir), cwd=tmp_path, timeout=240)
        assert cancel.returncode == 0, cancel.stderr
        proc.wait(timeout=120)
    finally:
        proc.kill()
    stopped = [r for rank in (0, 1) for r in rank_records(run_dir, rank) if r.get("event") == "interrupted"]
    # every rank interrupted; at least one by the cancel's SIGTERM itself: a rank whose script left through the
    # stop agreement before its own signal arrived records signal null (docs/records.md), rank 0 at times
    assert len(stopped) == 2 and 15 in {e["signal"] for e in stopped}, stopped
    assert (run_dir / "checkpoint" / "model.pt").is_file()
    job = json.loads((run_dir / "launch.json").read_text())["job_id"]
    assert not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()


def usr1_at_step_10(proc: subprocess.Popen, tmp_path: Path, ranks: tuple[int, ...]) -> tuple[Path, str, str]:
    """Once every rank in `ranks` recorded step 10 (where they hold), Slurm's warning (USR1) to every task of the
    followed launch `proc`'s job, its requeue let go at once; then wait for the launch to end. (run directory,
    job id, the launch's stderr)."""
    from tests.test_slurm_cluster import release_requeued

    try:
        deadline = time.monotonic() + 180
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not train 10 steps"
            runs = list((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else []
            paths = [runs[0] / "records" / f"rank-{r}.jsonl" for r in ranks] if runs else []
            if paths and all(p.exists() and '"step": 10' in p.read_text() for p in paths):
                break
            time.sleep(0.3)
        run_dir = runs[0]
        job = json.loads((run_dir / "launch.json").read_text())["job_id"]
        subprocess.run(["scancel", "--signal=USR1", job], check=True, capture_output=True)
        release_requeued(job)
        _, err = proc.communicate(timeout=400)
    finally:
        proc.kill()
    return run_dir, job, err


def test_a_preemption_warning_reaches_should_stop_and_the_requeued_job_resumes_the_script(slurm_cluster,
                                                                                         tmp_path: Path) -> None:
    """USR1 to every task (Slurm's warning before a time limit or a preemption): the script saves and stops
    (should_stop), rank 0 requeues the job, and the script starts again with track.resumed from its checkpoint."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), HOLD_AT_STEP_ENV: "10"}  # its 400 steps take ~2 s: hold at 10
    steps = 400
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *SLURM, "--script", str(SCRIPTS["ddp"]),
                             "--engine", "ddp", "--steps", str(steps), "--", "--steps", str(steps),
                             "--val-every", "1000000"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    run_dir, _, err = usr1_at_step_10(proc, tmp_path, ranks=(1,))
    assert proc.returncode == 0, err[-3000:]
    recs = rank_records(run_dir, 0)
    (stop,) = [r for r in recs if r.get("event") == "interrupted"]
    assert (stop["signal"], stop["step"]) == (10, 10)  # SIGUSR1, at the step the ranks held on
    (resume,) = [r for r in recs if r.get("event") == "resume"]
    assert resume["step"] == stop["step"]
    steps_done = [r["step"] for r in recs if r["kind"] == "step"]
    assert steps_done == list(range(1, steps + 1))  # the script went on from its checkpoint, to the end
    assert json.loads((run_dir / "launch.json").read_text())["state"] == "COMPLETED"


OWN_USR1 = """import os, signal, sys, time
from scalelab import track
warned = []
signal.signal(signal.SIGUSR1, lambda signum, frame: warned.append(signum))  # the script's own handler
saved = track.checkpoint_dir / f"step-{os.environ['RANK']}"
first = int(saved.read_text()) if saved.exists() else 0
for step in range(first + 1, int(sys.argv[1]) + 1):
    time.sleep(0.01)
    track.step(items=1, loss=1.0, step=step)
    if warned:
        saved.write_text(str(step))
        sys.exit(0)
"""


def test_a_preemption_warning_the_script_handles_itself_still_requeues_the_job(slurm_cluster, tmp_path: Path) -> None:
    """USR1 with the script's own handler (it saves and exits 0): the runner still records the stop (exit 143), so
    rank 0 requeues the job as for the built-in trainer; the job was COMPLETED at the warning's step."""
    (tmp_path / "own.py").write_text(OWN_USR1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), HOLD_AT_STEP_ENV: "10"}
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *SLURM, "--script", "own.py",
                             "--engine", "ddp", "--", "40"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    run_dir, job, err = usr1_at_step_10(proc, tmp_path, ranks=(0, 1))
    assert proc.returncode == 0, err[-3000:]
    for rank in (0, 1):
        recs = rank_records(run_dir, rank)
        (stop,) = [r for r in recs if r.get("event") == "interrupted"]
        assert (stop["signal"], stop["step"]) == (10, 10), stop
        assert [e["reason"] for e in recs if e.get("event") == "end"] == ["interrupted", "completed"]
        assert [r["step"] for r in recs if r["kind"] == "step"] == list(range(1, 41))
    assert json.loads((run_dir / "launch.json").read_text())["state"] == "COMPLETED"
    history = subprocess.run(["sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State"], capture_output=True,
                             text=True).stdout.split()
    assert history == ["REQUEUED", "COMPLETED"], history
