"""`launch --backend slurm` end to end on a real Slurm cluster: two nodes, 4 GPUs each (GRES), accounting.

The session fixture starts the cluster with scripts/slurm-cluster.sh (installing Slurm, munge, slurmdbd
and MariaDB from Debian's packages the first time) and stops it at the end, unless it was already up.
Where this machine cannot run Slurm (not root, no apt, no Linux) every test here is skipped with the
script's reason. Runs are tiny (nmt-tiny, one thread a rank, few steps): they prove placement, the
engines' rendezvous, signals and requeue, not speed.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, launch, needs_horovod, only_run_dir, read_jsonl

SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
TINY = ["--backend", "slurm", "--model", "nmt-tiny", "--threads", "1", "--warmup-steps", "1"]


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running two-node cluster for the whole session (started here, stopped here)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the test Slurm cluster needs Linux")
    was_up = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True).returncode == 0
    if not was_up:
        done = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)
            reason = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit code {done.returncode}"]
            pytest.skip(f"no Slurm cluster on this machine: {reason[0]}")
    yield
    if not was_up:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=300)


def slurm(*cmd: str) -> str:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=True).stdout


def rendezvous_servers() -> list[int]:
    """Horovod rendezvous servers still alive (each job's must end with it)."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if "slurm.rendezvous" in " ".join(p.info["cmdline"] or [])]


def job_of(run_dir: Path) -> str:
    return json.loads((run_dir / "launch.json").read_text())["job_id"]


def active_jobs() -> list[str]:
    return slurm("squeue", "-h", "-o", "%i %j %T").splitlines()


def records(run_dir: Path, kind: str) -> list[dict]:
    return [r for p in sorted((run_dir / "records").glob("rank-*.jsonl")) for r in read_jsonl(p) if r["kind"] == kind]


def placements(run_dir: Path) -> list[dict]:
    return [r for p in sorted((run_dir / "slurm").glob("placement-*.jsonl")) for r in read_jsonl(p)]


def start_run(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """`launch run` in the background; return it and its run directory once rank 0 has trained 3 steps."""
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", *TINY, *args, "--runs-dir", str(runs)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        rank0 = next(runs.glob("*/records/rank-0.jsonl"), None) if runs.exists() else None
        if rank0 is not None and sum(r["kind"] == "step" for r in read_jsonl(rank0)) >= 3:
            return proc, rank0.parent.parent
        if proc.poll() is not None:
            pytest.fail(f"the run ended before training 3 steps: {proc.communicate()}")
        time.sleep(0.3)
    proc.kill()
    pytest.fail("the run did not train 3 steps within 240 s")


def wait_for_state(job: str, states: tuple[str, ...], timeout: float = 120) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = slurm("squeue", "-h", "--states=all", "-j", job, "-o", "%T").strip()
        if state in states:
            return state
        time.sleep(0.3)
    pytest.fail(f"job {job} did not reach {states} in {timeout:.0f} s (last: {state})")


# ---- two nodes x 4 GPUs, both engines -----------------------------------------------------------


@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_two_nodes_four_gpus_each(slurm_cluster, tmp_path: Path, engine: str) -> None:
    done = launch(*TINY, "--engine", engine, "--nodes", "2", "--gpus-per-node", "4", "--steps", "4",
                  "--val-every", "2", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")

    starts = records(run_dir, "start")
    assert sorted(r["rank"] for r in starts) == list(range(8)), "8 distinct ranks"
    assert {r["world"] for r in starts} == {8} and {r["engine"] for r in starts} == {engine}
    assert collections.Counter(r["node_rank"] for r in starts) == {0: 4, 1: 4}

    where = placements(run_dir)
    assert collections.Counter(p["node"] for p in where) == {"node1": 4, "node2": 4}, "4 ranks on each Slurm node"
    by_rank = {p["rank"]: p for p in where}
    for r in starts:  # the engine's placement agrees with Slurm's
        assert r["node_rank"] == by_rank[r["rank"]]["node_id"] and r["local_rank"] == by_rank[r["rank"]]["local_rank"]
    for node in ("node1", "node2"):  # every rank of a node has a GPU of its own
        assert sorted(p["gpu"] for p in where if p["node"] == node) == ["0", "1", "2", "3"]

    steps = records(run_dir, "step")
    assert collections.Counter(s["step"] for s in steps) == {1: 8, 2: 8, 3: 8, 4: 8}
    curve = collections.defaultdict(set)  # one model: every rank sees the same averaged validation loss
    for v in records(run_dir, "val"):
        curve[v["step"]].add(round(v["val_loss"], 6))
    assert sorted(curve) == [2, 4] and all(len(losses) == 1 for losses in curve.values())

    status = launch("status", str(run_dir), cwd=tmp_path)
    assert status.returncode == 0 and "COMPLETED" in status.stdout
    assert slurm("sacct", "-n", "-X", "-P", "-j", job_of(run_dir), "-o", "State").split() == ["COMPLETED"]
    report = launch("report", str(run_dir), "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "slurm-" in launch("logs", str(run_dir), cwd=tmp_path).stdout
    assert not rendezvous_servers(), "the job left its Horovod rendezvous server running"


# ---- sweep: every layout queued at once --------------------------------------------------------


def test_sweep_submits_every_layout_then_collects(slurm_cluster, tmp_path: Path) -> None:
    done = launch("sweep", *TINY, "--engine", "ddp", "--layouts", "1x1,1x2", "--steps", "4",
                  "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = only_run_dir(tmp_path / "runs")
    infos = [json.loads((sweep / name / "launch.json").read_text()) for name in ("1x1", "1x2")]
    assert infos[1]["submitted"] < infos[0]["ended"], "the second layout was queued before the first was followed"
    for name, workers in (("1x1", 1), ("1x2", 2)):
        assert json.loads((sweep / name / "summary.json").read_text())
        assert {r["world"] for r in records(sweep / name, "start")} == {workers}
    assert (sweep / "report.md").exists()


# ---- cancel -------------------------------------------------------------------------------------


def test_cancel_stops_the_job_and_leaves_nothing_queued(slurm_cluster, tmp_path: Path) -> None:
    proc, run_dir = start_run(tmp_path, "--engine", "ddp", "--gpus-per-node", "2", "--steps", "100000")
    job = job_of(run_dir)
    cancelled = launch("cancel", str(run_dir), cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert not [line for line in active_jobs() if line.split()[0] == job], "the job is still in squeue"
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "cancelled" in err and "Traceback" not in err
    assert "CANCELLED" in launch("status", str(run_dir), cwd=tmp_path).stdout
    interrupted = [e for e in records(run_dir, "event") if e["event"] == "interrupted"]
    assert interrupted and (run_dir / "checkpoint.pt").exists(), "the ranks checkpointed on SIGTERM"


# ---- preemption and the time limit: checkpoint, requeue, resume ---------------------------------


def assert_resumed(run_dir: Path, steps: int, signal_number: int) -> None:
    events = [e for e in records(run_dir, "event") if e["rank"] == 0]
    interrupted = [e for e in events if e["event"] == "interrupted"]
    resumed = [e for e in events if e["event"] == "resume"]
    assert interrupted and interrupted[0]["signal"] == signal_number
    assert resumed and resumed[0]["step"] == interrupted[0]["step"], "resumed from the checkpoint taken at the signal"
    assert [e["step"] for e in events if e["event"] == "end"][-1] == steps
    rank0_steps = [r["step"] for r in records(run_dir, "step") if r["rank"] == 0]
    assert rank0_steps == list(range(1, steps + 1)), "every step exactly once across the requeue"
    assert {p["restart"] for p in placements(run_dir)} == {0, 1}


def release_requeued(job: str) -> None:
    """Slurm holds a requeued job back for about two minutes (its BeginTime); an admin can start it sooner.

    Not at once: slurmd refuses a credential issued in the same second as the old one was revoked
    ("Job credential revoked"), which is why Slurm waits; a few seconds are enough.
    """
    wait_for_state(job, ("PENDING",))
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+5"], check=True, capture_output=True)


@needs_horovod
def test_scontrol_requeue_checkpoints_and_resumes(slurm_cluster, tmp_path: Path) -> None:
    steps = 1500
    proc, run_dir = start_run(tmp_path, "--engine", "horovod", "--gpus-per-node", "2", "--steps", str(steps),
                              "--checkpoint-every", "500")
    job = job_of(run_dir)
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)  # as preemption does
    release_requeued(job)
    out, err = proc.communicate(timeout=540)
    assert proc.returncode == 0, err[-3000:]
    assert_resumed(run_dir, steps, signal_number=15)
    history = slurm("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State").split()
    assert history == ["REQUEUED", "COMPLETED"]
    assert not rendezvous_servers(), "the job left its Horovod rendezvous server running"


def test_time_limit_warning_checkpoints_and_requeues(slurm_cluster, tmp_path: Path) -> None:
    steps = 1500
    proc, run_dir = start_run(tmp_path, "--engine", "ddp", "--gpus-per-node", "2", "--steps", str(steps))
    job = job_of(run_dir)
    # What Slurm sends signal_s seconds before the time limit (--signal=B:USR1@N): the batch shell gets USR1.
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True, capture_output=True)
    release_requeued(job)
    out, err = proc.communicate(timeout=540)
    assert proc.returncode == 0, err[-3000:]
    assert_resumed(run_dir, steps, signal_number=10)
    assert "requeueing job" in (run_dir / "logs" / f"slurm-{job}.out").read_text()


# ---- errors: Slurm's own words, nothing queued ---------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--partition", "nosuchpartition"], "invalid partition specified: nosuchpartition"),
    (["--nodes", "2", "--gpus-per-node", "5", "--global-batch", "20"], "Requested node configuration is not available"),
    (["--time", "1h"], "Invalid --time specification"),
    (["--sbatch-arg=--no-such-sbatch-option"], "unrecognized option '--no-such-sbatch-option'"),
])
def test_refused_jobs_say_why_in_slurms_words_and_leave_nothing(slurm_cluster, tmp_path: Path, args, words) -> None:
    done = launch(*TINY, "--engine", "ddp", "--steps", "2", *args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: error:") and words in lines[0], done.stderr
    assert "nothing was queued" in lines[0]
    run_name = only_run_dir(tmp_path / "runs").name
    assert not [line for line in active_jobs() if run_name in line]
    never = slurm("sacct", "-n", "-X", "-P", "--starttime=now-1hour", f"--name=scalelab-{run_name}", "-o", "JobID")
    assert never.strip() == "", "a refused job must never have been submitted"
