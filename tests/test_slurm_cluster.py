"""`launch --backend slurm` end to end on a real Slurm cluster: two nodes, 4 GPUs each (GRES), accounting.

The session fixture starts the cluster with scripts/slurm-cluster.sh (installing Slurm, munge, slurmdbd
and MariaDB from Debian's packages the first time) and stops it at the end, unless it was already up.
Where this machine cannot run Slurm (not root, no apt, no Linux) every test here is skipped with the
script's reason. Runs are tiny (nmt-tiny, one thread a rank, few steps): they prove placement, the
engines' rendezvous, signals and requeue, not speed.

Faults injected (issue #12): SIGINT, SIGTERM and SIGHUP to `launch` (no job left in squeue, no
process of the run left: counted by command line and by SLURM_JOB_ID in each process's environment);
SIGKILL to `launch` (the job goes on under Slurm; `launch status` and `launch cancel` from a new
launcher still work on it; a resume beside it is refused); one rank SIGKILLed (the job fails, `launch
resume` continues from the last periodic checkpoint) and `scontrol requeue` (the ranks checkpoint,
the job starts again and resumes), both with DDP and Horovod, compared with an uninterrupted run of
the same spec on the cluster: per-step losses, learning rates, final weights and Adam's state equal,
as tests/test_resume.py compares them on the local backend.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from submitit.core.utils import DelayedSubmission

from tests.conftest import ROOT, launch, needs_horovod, only_run_dir, read_jsonl
from tests.test_resume import (
    ENGINE_PARAMS,
    ENGINES,
    SPEC,
    _all_ranks_at,
    _assert_resumed_exactly,
    _world,
    resume_reference,
)
from scalelab.train.checkpoint import CHECKPOINT_NAME
from scalelab.train.loop import HOLD_AT_STEP_ENV, KILL_AT_STEP_ENV

pytestmark = pytest.mark.slow  # every test here takes over 5 s on 2 cores (the fast subset: -m 'not slow')

TINY = ["--backend", "slurm", "--model", "nmt-tiny", "--threads", "1", "--warmup-steps", "1"]
EXACT = [*SPEC, "--backend", "slurm"]  # tests/test_resume.py's runs, on the cluster


def slurm(*cmd: str) -> str:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=True).stdout


def rendezvous_servers(job: str, patience_s: float = 20.0) -> list[int]:
    """The Horovod rendezvous servers of Slurm job `job` still alive (each job's must end with it) after up
    to `patience_s`: on a loaded machine the last one may take a few seconds to exit after Slurm has ended
    the job; one still there after that was left running. Only this job's (SLURM_JOB_ID in the server's
    environment, from the batch script): the other xdist worker's Slurm tests run their own meanwhile."""
    import psutil

    deadline = time.time() + patience_s
    while True:
        alive = [p.pid for p in psutil.process_iter(["cmdline", "status"])
                 if "slurm.rendezvous" in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
                 and _job_id_of(p) == job]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.5)


def job_of(run_dir: Path) -> str:
    return json.loads((run_dir / "launch.json").read_text())["job_id"]


def active_jobs() -> list[str]:
    return slurm("squeue", "-h", "-o", "%i %j %T").splitlines()


def jobs_launched_from(where: Path) -> list[str]:
    """The active jobs whose working directory is `where` (each test launches from its own tmp_path), as
    "id name state": a job's name alone is not the test's, since run names are stamped to the second and
    the other xdist worker may start the same preset and layout in that second (CI on 852d506 did)."""
    rows = [line.split("|") for line in slurm("squeue", "-h", "-o", "%i|%j|%T|%Z").splitlines()]
    return [" ".join(row[:3]) for row in rows if len(row) == 4 and same_dir(row[3], where)]


def same_dir(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def records(run_dir: Path, kind: str) -> list[dict]:
    return [r for p in sorted((run_dir / "records").glob("rank-*.jsonl")) for r in read_jsonl(p) if r["kind"] == kind]


def placements(run_dir: Path) -> list[dict]:
    return [r for p in sorted((run_dir / "slurm").glob("placement-*.jsonl")) for r in read_jsonl(p)]


def start_run(tmp_path: Path, *args: str, env: dict | None = None, ranks: int = 1,
              step: int = 3) -> tuple[subprocess.Popen, Path]:
    """`launch run` in the background; return it and its run directory once `ranks` ranks trained `step` steps."""
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *TINY, *args, "--runs-dir", str(runs)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        if _all_ranks_at(runs, ranks, step):
            return proc, only_run_dir(runs)
        if proc.poll() is not None:
            pytest.fail(f"the run ended before training {step} steps: {proc.communicate()}")
        time.sleep(0.3)
    proc.kill()
    pytest.fail(f"the run did not train {step} steps within 240 s")


def processes_of(run_dir: Path, job: str) -> list[str]:
    """Every live process of the run on this machine (both nodes are here): its command line names the
    run directory (srun, the ranks), or Slurm started it for the job (SLURM_JOB_ID in its environment:
    the batch script, the rendezvous server, the ranks)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["status"] != psutil.STATUS_ZOMBIE and (str(run_dir) in cmd or _job_id_of(p) == job):
            found.append(f"{p.pid} {cmd[:160]}")
    return found


def _job_id_of(p) -> str | None:
    """The Slurm job a process belongs to (SLURM_JOB_ID in its environment), None if none or gone."""
    import psutil

    try:
        return p.environ().get("SLURM_JOB_ID")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def in_queue(job: str) -> list[str]:
    return [line for line in active_jobs() if line.split()[0] == job]


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
    logs = launch("logs", str(run_dir), cwd=tmp_path).stdout  # submitit's per-task logs, summarised (issue 35)
    assert "submitit INFO (" not in logs and "submitit's own lines and the task files" in logs, logs
    last = launch("logs", str(run_dir), "--rank", "7", cwd=tmp_path).stdout  # one rank's task files, whole
    assert f"slurm/{job_of(run_dir)}_7_log.out" in last and "submitit INFO (" in last, last
    assert "[rank 7] step 4  loss" in last  # and its records
    assert not rendezvous_servers(job_of(run_dir)), "the job left its Horovod rendezvous server running"


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
    # queued at once, run one after another (no --exclusive): 1x2 started after 1x1's last record
    assert min(r["time"] for r in records(sweep / "1x2", "start")) > max(r["time"] for r in records(sweep / "1x1", "step")), \
        "the layouts overlapped: each was timed while the other shared its node"
    assert "run one after another" in done.stderr, done.stderr[-2000:]
    assert (sweep / "report.md").exists()


def test_repeats_of_a_layout_go_out_as_one_job_array(slurm_cluster, tmp_path: Path) -> None:
    done = launch("sweep", *TINY, "--engine", "ddp", "--layouts", "1x2", "--repeats", "2", "--steps", "4",
                  "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = only_run_dir(tmp_path / "runs")
    assert json.loads((sweep / "sweep.json").read_text())["runs"] == ["1x2-r0", "1x2-r1"]
    jobs = [job_of(sweep / name) for name in ("1x2-r0", "1x2-r1")]
    array = jobs[0].split("_")[0]
    assert jobs == [f"{array}_0", f"{array}_1"], "one sbatch: array tasks 0 and 1 of one job"
    for name, job in zip(("1x2-r0", "1x2-r1"), jobs):
        run_dir = sweep / name
        assert json.loads((run_dir / "summary.json").read_text())
        assert {r["world"] for r in records(run_dir, "start")} == {2}
        assert {p["job_id"] for p in placements(run_dir)} == {job}
        logs = launch("logs", str(run_dir), "--rank", "1", cwd=tmp_path).stdout  # the array's tasks share one folder
        assert f"1x2-rN-slurm/{job}_1_log.out" in logs and "Job completed successfully" in logs
    states = slurm("sacct", "-n", "-X", "-P", "-j", array, "-o", "JobID,State").split()
    assert sorted(states) == [f"{array}_0|COMPLETED", f"{array}_1|COMPLETED"]


# ---- cancel -------------------------------------------------------------------------------------


def test_cancel_stops_the_job_and_leaves_nothing_queued(slurm_cluster, tmp_path: Path) -> None:
    proc, run_dir = start_run(tmp_path, "--engine", "ddp", "--gpus-per-node", "2", "--steps", "100000")
    job = job_of(run_dir)
    cancelled = launch("cancel", str(run_dir), cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert not [line for line in active_jobs() if line.split()[0] == job], "the job is still in squeue"
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "cancelled" in err and "Traceback" not in err
    assert "CANCELLED" in launch("status", str(run_dir), cwd=tmp_path).stdout
    interrupted = [e for e in records(run_dir, "event") if e["event"] == "interrupted"]
    assert interrupted and (run_dir / "checkpoint.pt").exists(), "the ranks checkpointed on SIGTERM"


# ---- signals to the launcher ---------------------------------------------------------------------


@pytest.mark.parametrize("sig, engine", [(signal.SIGINT, "ddp"), (signal.SIGTERM, "ddp"),
                                         pytest.param(signal.SIGHUP, "horovod", marks=needs_horovod)])
def test_a_stop_signal_to_launch_leaves_no_job_and_no_process(slurm_cluster, tmp_path: Path, sig, engine) -> None:
    """SIGINT (Ctrl-C), SIGTERM (`kill`, `timeout`, CI) and SIGHUP (a closed terminal) take the same path:
    scancel (the ranks checkpoint), wait until Slurm has ended every process of the job, CANCELLED."""
    proc, run_dir = start_run(tmp_path, "--engine", engine, "--gpus-per-node", "2", "--steps", "100000", ranks=2)
    job = job_of(run_dir)
    assert len(processes_of(run_dir, job)) >= 3, "the count must see the run: batch script, srun, 2 ranks"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + sig and "every process of the run was stopped" in err, err[-3000:]
    assert "Traceback" not in err
    assert in_queue(job) == [] and processes_of(run_dir, job) == [] and not rendezvous_servers(job)
    info = json.loads((run_dir / "launch.json").read_text())
    assert info["state"] == "CANCELLED" and signal.Signals(sig).name in info["detail"]
    assert slurm("sacct", "-n", "-X", "-P", "-j", job, "-o", "State").split()[0] == "CANCELLED"
    assert [e for e in records(run_dir, "event") if e["event"] == "interrupted"], "the ranks checkpointed on SIGTERM"
    assert (run_dir / CHECKPOINT_NAME).exists()


def test_a_killed_launcher_leaves_the_job_to_slurm_and_a_new_launcher_still_commands_it(slurm_cluster,
                                                                                       tmp_path: Path) -> None:
    """SIGKILL of `launch` (nothing can run in it): the job goes on by design, since Slurm, not the
    launcher, supervises it. `launch status` and `launch cancel` from another launcher work on it, and
    `launch resume` refuses to queue a second job into the same run directory."""
    proc, run_dir = start_run(tmp_path, "--engine", "ddp", "--gpus-per-node", "2", "--steps", "100000", ranks=2)
    job = job_of(run_dir)
    proc.kill()
    proc.communicate(timeout=60)
    rank0 = run_dir / "records" / "rank-0.jsonl"
    trained = rank0.read_text().count('"kind": "step"')
    deadline = time.time() + 120
    while rank0.read_text().count('"kind": "step"') <= trained:  # still training without its launcher
        assert time.time() < deadline and in_queue(job), "the job stopped with its launcher"
        time.sleep(0.3)
    status = launch("status", str(run_dir), cwd=tmp_path)
    assert status.returncode == 0 and "RUNNING" in status.stdout and f"Slurm job {job}" in status.stdout, status

    try:
        refused = launch("resume", str(run_dir), cwd=tmp_path)
        assert refused.returncode == 2 and "is still running" in refused.stderr and job in refused.stderr, refused.stderr
        assert f"launch cancel {run_dir}" in refused.stderr and "Traceback" not in refused.stderr
        assert [line.split()[2] for line in in_queue(job)] == ["RUNNING"], "the refused resume must leave the job alone"
        assert len(jobs_launched_from(tmp_path)) == 1, f"no second job was queued: {jobs_launched_from(tmp_path)}"
    except AssertionError:
        subprocess.run(["scancel", job], capture_output=True)  # leave no job behind for the next tests
        raise

    cancelled = launch("cancel", str(run_dir), cwd=tmp_path)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled
    assert in_queue(job) == [] and processes_of(run_dir, job) == []
    assert [e for e in records(run_dir, "event") if e["event"] == "interrupted"] and (run_dir / CHECKPOINT_NAME).exists()


def test_detach_submits_and_returns_as_sbatch_does_and_status_records_the_end(slurm_cluster, tmp_path: Path) -> None:
    """`--detach` on Slurm: the job is queued and `launch` returns at once, naming it (it was refused: "runs
    of the slurm backend are followed to their end"); Slurm runs it with no launcher; `launch status`
    from a new launcher records its end and writes its summary; nothing is left queued or running."""
    runs = tmp_path / "runs"
    started = launch(*TINY, "--engine", "ddp", "--gpus-per-node", "2", "--steps", "8", "--detach",
                     "--runs-dir", str(runs), "-y", cwd=tmp_path)
    assert started.returncode == 0 and "Traceback" not in started.stderr, started.stderr
    run_dir = only_run_dir(runs)
    job = job_of(run_dir)
    assert f"Slurm job {job}" in started.stdout and "detached" in started.stdout
    assert not (run_dir / "summary.json").exists(), "launch returned before the job ended"
    deadline = time.time() + 240
    while "COMPLETED" not in (status := launch("status", str(run_dir), cwd=tmp_path)).stdout:
        assert status.returncode == 0 and "FAILED" not in status.stdout, status
        assert time.time() < deadline, f"job {job} did not complete: {status.stdout}"
        time.sleep(2)
    assert json.loads((run_dir / "launch.json").read_text())["state"] == "COMPLETED"
    assert (run_dir / "summary.json").exists() and len(records(run_dir, "step")) >= 2 * 7
    assert in_queue(job) == [] and processes_of(run_dir, job) == []


# ---- exact resume on the cluster: a killed rank, a requeue ----------------------------------------


@pytest.fixture(scope="session")
def cluster_reference(slurm_cluster, tmp_path_factory):
    """The uninterrupted run of each engine that the resumed cluster runs must match exactly: tests/test_resume.py's
    *local* run of the same spec, made once in the pytest run (conftest's made_once). The cluster's nodes start
    the same ranks on this machine, one thread each, so the backends give the same floats; a Slurm run of its
    own per engine cost 1-2 more ranks and a job each. It asks for the cluster: the tests that use it submit
    jobs, and without it they ran only where another test had started the cluster first. Session-scoped: the
    module's tests are spread among the others (conftest's pytest_collection_modifyitems)."""
    return lambda engine: resume_reference(tmp_path_factory, engine)


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_killed_rank_fails_the_job_and_resume_gives_the_same_losses(tmp_path: Path, engine, cluster_reference) -> None:
    """SIGKILL of the last rank after step 6: srun ends the job (FAILED); `launch resume` queues a new job that
    continues from the periodic checkpoint of step 4 and trains what an uninterrupted run trains."""
    killed = _world(engine) - 1  # the last rank: on 2 ranks, not the one that writes checkpoints
    done = launch(*EXACT, *ENGINES[engine], "--runs-dir", "runs", cwd=tmp_path,
                  env={KILL_AT_STEP_ENV: f"6:{killed}"}, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    job = job_of(run_dir)
    assert slurm("sacct", "-n", "-X", "-P", "-j", job, "-o", "State").split()[0] == "FAILED"
    assert in_queue(job) == [] and processes_of(run_dir, job) == [] and not rendezvous_servers(job)
    assert torch.load(run_dir / CHECKPOINT_NAME, weights_only=True)["step"] == 4

    resumed = launch("resume", str(run_dir), cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert job_of(run_dir) != job and processes_of(run_dir, job_of(run_dir)) == []
    _assert_resumed_exactly(run_dir, cluster_reference(engine), engine, from_step=4)


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


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_scontrol_requeue_checkpoints_and_resumes_to_the_same_losses(tmp_path: Path, engine, cluster_reference) -> None:
    """`scontrol requeue` (what preemption does) while the ranks hold after step 6 (a test aid, so the
    requeue lands on a known step): they checkpoint, the job starts again and resumes from step 6."""
    proc, run_dir = start_run(tmp_path, *SPEC, *ENGINES[engine], env={HOLD_AT_STEP_ENV: "6"},
                              ranks=_world(engine), step=6)
    job = job_of(run_dir)
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)  # as preemption does
    release_requeued(job)
    _, err = proc.communicate(timeout=540)
    assert proc.returncode == 0, err[-3000:]
    assert_resumed(run_dir, 10, signal_number=15)
    _assert_resumed_exactly(run_dir, cluster_reference(engine), engine, from_step=6)
    history = slurm("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State").split()
    assert history == ["REQUEUED", "COMPLETED"]
    assert processes_of(run_dir, job) == [] and not rendezvous_servers(job), "the job left a process running"


def test_time_limit_warning_checkpoints_and_requeues(slurm_cluster, tmp_path: Path) -> None:
    steps = 20  # the ranks hold after step 3 until the signal: it lands there however fast the steps are
    proc, run_dir = start_run(tmp_path, "--engine", "ddp", "--gpus-per-node", "2", "--steps", str(steps),
                              env={HOLD_AT_STEP_ENV: "3"})
    job = job_of(run_dir)
    # What Slurm sends signal_s seconds before the time limit (--signal=USR1@N): USR1 to every task.
    subprocess.run(["scancel", "--signal=USR1", job], check=True, capture_output=True)
    release_requeued(job)
    out, err = proc.communicate(timeout=540)
    assert proc.returncode == 0, err[-3000:]
    assert_resumed(run_dir, steps, signal_number=10)
    assert f"requeueing job {job}" in (run_dir / "slurm" / f"{job}_0_log.err").read_text(), "rank 0 requeued it"
    again = DelayedSubmission.load(run_dir / "slurm" / f"{job}_submitted.pkl").function  # Checkpointable.checkpoint()
    assert again.requeues_left == 2, "the job started again with the rank function of one requeue fewer"
    assert slurm("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State").split() == ["REQUEUED", "COMPLETED"]


# ---- errors: Slurm's own words, nothing queued ---------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--partition", "nosuchpartition"], "invalid partition specified: nosuchpartition"),
    (["--nodes", "2", "--gpus-per-node", "5", "--global-batch", "20"], "Requested node configuration is not available"),
    # (--time 1h is refused before sbatch now, in scalelab's words: tests/test_issue37_inputs.py)
    (["--sbatch-arg=--no-such-sbatch-option"], "unrecognized option '--no-such-sbatch-option'"),
    # Slurm says the same for too many nodes as for too many GPUs: the hint names the partition's node count
    (["--nodes", "3", "--global-batch", "15"], "more nodes than the default partition has (2): give --nodes 2"),
    (["--constraint", "foo"], "Invalid feature specification; check --constraint"),
    (["sweep", "--workers", "1,2", "--partition", "nosuchpartition"], "invalid partition specified: nosuchpartition"),
])
def test_refused_jobs_say_why_in_slurms_words_and_leave_nothing(slurm_cluster, tmp_path: Path, args, words) -> None:
    """Nothing queued, and no run (or sweep) directory left: `launch ls` listed each refused one as NEW for ever."""
    runs = tmp_path / "runs"
    command = args[:1] if args[:1] == ["sweep"] else []
    done = launch(*command, *TINY, "--engine", "ddp", "--steps", "2", *args[len(command):], "--runs-dir", str(runs),
                  cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: error:") and words in lines[0], done.stderr
    assert "nothing was queued" in lines[0]
    assert not runs.exists() or list(runs.iterdir()) == [], f"left behind: {list(runs.iterdir())}"
    assert not jobs_launched_from(tmp_path)
    named = slurm("sacct", "-n", "-X", "-P", "--starttime=now-1hour", "-o", "JobID,WorkDir")
    never = [row for row in named.splitlines() if same_dir(row.split("|")[-1], tmp_path)]
    assert never == [], "a refused job must never have been submitted"


# ---- launch probe: the cluster's two GPU types, each on one node and on two -------------------------


def test_probe_two_gpu_types_on_the_cluster(slurm_cluster, tmp_path: Path) -> None:
    """`launch probe --instance-types a,debug/b`: GPUs per node from sinfo (2 of each type), every run a
    typed GRES request (`--gres=gpu:TYPE:N`) that Slurm allocated as GPUs of that type (sacct's
    AllocTRES), links measured inside a node and across the two; nothing left queued; `launch plan`
    reads the probe."""
    gres = slurm("sinfo", "-h", "-N", "-o", "%G")
    if "gpu:a:" not in gres:
        pytest.skip(f"the running test cluster's GPUs are untyped ({gres.split()[0]}): it was started before "
                    "typed GRES; `scripts/slurm-cluster.sh stop` and start it again")
    done = launch("probe", *TINY, "--engine", "ddp", "--instance-types", "a,debug/b", "--probe-steps", "2",
                  "--link-sizes-mb", "0.004,1", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "probe: expected cost $" in done.stderr and "probe: actual cost $" in done.stdout
    probe = only_run_dir(tmp_path / "runs")
    manifest = json.loads((probe / "probe.json").read_text())
    assert [(c["name"], c["gpus"]) for c in manifest["candidates"]] == [("a", 2), ("debug/b", 2)]
    for cand in manifest["candidates"]:
        gpu_type = cand["name"].split("/")[-1]
        assert cand["runs"] == [f"{cand['name'].replace('/', '-')}-{x}" for x in ("1x1", "1x2", "2x2")]
        for name in cand["runs"]:
            run_dir = probe / name
            script = (run_dir / "slurm").glob("*_submission.sh")
            text = next(script).read_text()
            assert f"#SBATCH --gres=gpu:{gpu_type}:" in text and "--gpus-per-node" not in text
            state, tres = slurm("sacct", "-n", "-X", "-P", "-j", job_of(run_dir), "-o", "State,AllocTRES").strip().split("|")
            spec = json.loads((run_dir / "spec.json").read_text())
            assert state == "COMPLETED" and f"gres/gpu:{gpu_type}={spec['gpus_per_node'] * spec['nodes']}" in tres, tres
            assert f"gres/gpu:{'b' if gpu_type == 'a' else 'a'}=" not in tres, tres  # none of the other type
        assert {p["node"] for p in placements(probe / cand["runs"][2])} == {"node1", "node2"}
        links = cand["results"]["links"]
        assert links["intra"]["run"].endswith("-1x2") and links["inter"]["run"].endswith("-2x2")
        assert links["inter"]["ranks"] == 4 and links["intra"]["busbw_bytes_per_s"] > 0
    assert not [name for c in manifest["candidates"] for name in c["runs"] if in_queue(job_of(probe / name))]
    # The planner reads the probe: one GPU type is what was measured (each has as many runs; the first
    # listed), the other a probe of it; a cluster type without a rate is not priced, and the note says how.
    plan = launch("plan", str(probe), "--format", "json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert {row["label"].rsplit(" on ", 1)[1] for row in json.loads(plan.stdout)} in ({"a"}, {"debug/b"})
    assert "does not price" in plan.stderr and "--rate" in plan.stderr
