"""Issue 37 on the remote backends: a signal to one rank on Slurm and on an AWS node; `--allow-changed` on
Kubernetes and AWS.

- Slurm (the real test cluster; single on 1 rank, DDP, Horovod and the parameter server on 2): SIGTERM to one
  rank's trainer process alone (rank 1; the single engine's rank 0). The ranks stop at the step they agree on,
  rank 0 checkpoints, srun sees exit 143 and the job ends FAILED in Slurm's
  accounting; the launcher reads the ranks' records and records CANCELLED, with one line. No job and no
  process of the run is left, and `launch resume` (a new job) records exactly the losses of an
  uninterrupted run on the cluster.
- AWS (moto; the instance played on this machine by running the user data moto holds, as
  tests/test_aws_bootstrap.py does; single, and DDP, Horovod and the parameter server on one node of 2 ranks):
  SIGTERM to one rank on the node
  (rank 1 of two: rank 0 waits in the stop agreement). The node reports
  `cancelled` (not `interrupted`, which the launcher answers with replacement capacity), the launcher ends
  the run CANCELLED and terminates the instance, no replacement starts; the resume (a new generation)
  continues from the checkpoint to the uninterrupted run's losses.
- `launch resume --allow-changed global_batch`: the ranks of a Kubernetes pod or an AWS instance have their
  own RUN_DIR, without the launcher's events file that tells local and Slurm ranks which checkpoint identity
  changes were accepted. The launcher now puts them in SCALELAB_ACCEPTED_CHANGES: in every container's
  environment and mpirun's exports (Kubernetes: rendered and validated against the published schemas, not
  run on a cluster) and in the instance's user data (AWS: scheduled into moto, read back from it). Then the
  trainer runs as such a rank does, on a directory holding only spec.json and checkpoint.pt, with the
  environment found there: it resumes with the new batch; without it, it refuses the checkpoint.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, launch, needs_horovod, only_run_dir, read_jsonl
from tests.test_slurm_cluster import processes_of
from tests.test_rank_signals import (
    ENGINES,
    SPEC,
    STOP,
    assert_resumes_exactly,
    launch_lines,
    left,
    rank_process,
    records,
    reference,  # noqa: F401  (a fixture: the uninterrupted local run of each engine, made once)
    state,
    wait_for,
)
from scalelab.core.spec import Spec, read_spec
from scalelab.core.trajectory import ACCEPTED_ENV, check_resume, record_changes
from scalelab.train.checkpoint import CHECKPOINT_NAME
from scalelab.train.loop import HOLD_AT_STEP_ENV

pytestmark = pytest.mark.slow  # real ranks, a real cluster, moto

PYTHON_ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


# ---- Slurm -----------------------------------------------------------------------------------------

SLURM = [*SPEC, "--backend", "slurm"]


@pytest.mark.parametrize("engine", ["single", "ddp", pytest.param("horovod", marks=needs_horovod), "ps"])
def test_slurm_a_signal_to_one_rank_cancels_the_run_and_it_resumes_exactly(slurm_cluster, tmp_path, reference, engine):
    """The resumed Slurm run must record exactly what the same spec's uninterrupted *local* run records (made
    once in the pytest run for tests/test_rank_signals.py): the cluster's nodes start the same ranks on this
    machine, one thread each, so the backends give the same floats."""
    rank = 0 if engine == "single" else 1  # the one signalled; it holds at STOP until then, the others agree
    whole = reference(engine)

    where = tmp_path / "signalled"
    where.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", *SLURM, *ENGINES[engine], "--runs-dir", "runs"],
                            cwd=where,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", HOLD_AT_STEP_ENV: f"{STOP}:{rank}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        runs = where / "runs"
        run = wait_for("the run directory", lambda: next((p for p in runs.glob("*") if p.is_dir()), None), proc)
        wait_for(f"rank {rank} at step {STOP}", lambda: any(r["kind"] == "step" and r["step"] == STOP
                                                             for r in records(run, rank)), proc, patience_s=400)
        wait_for(f"rank {rank}'s trainer", lambda: rank_process(run, rank), proc).send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = launch_lines(err)
    assert proc.returncode == 1 and len(said) == 1 and "Traceback" not in err, err[-3000:]
    assert "was cancelled" in said[0] and f"rank {rank} got SIGTERM, and every rank stopped at step {STOP}" in said[0], said
    assert state(run)["state"] == "CANCELLED"
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["step"] == STOP
    job = state(run)["job_id"]
    assert wait_for("the job's end", lambda: job not in subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True,
                                                                       text=True).stdout.split() or None, patience_s=60)
    assert wait_for("no process of the job", lambda: not processes_of(run, job) or None, patience_s=60)
    assert_resumes_exactly(run, whole, engine, from_step=STOP)


# ---- AWS: a signal to the rank on a node -------------------------------------------------------------

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")
from tests.test_aws_bootstrap import (  # noqa: E402  (the instance played here: its fixtures and stand-ins)
    ENGINE_RUNS,
    POLL_S,
    REGION,
    RUN,
    STOP_AT,
    Metadata,
    cloud,  # noqa: F401  (a fixture)
    finished,
    reachable,
    uninterrupted,
    s3_json,
    start_user_data,
    user_data_of,
    venv,  # noqa: F401  (a fixture)
    wheel,  # noqa: F401  (a fixture)
)
from tests.test_resume import _assert_resumed_exactly  # noqa: E402
from scalelab.aws import teardown as td  # noqa: E402
from scalelab.aws.backend import AwsBackend  # noqa: E402
from scalelab.core.rundir import new_run_dir  # noqa: E402
from scalelab.launcher.runner import submit, wait  # noqa: E402


def _aws(cloud, wheel_path: Path, instance_type: str = "g3.4xlarge") -> AwsBackend:
    return AwsBackend({"bucket": cloud["bucket"], "region": REGION, "spot": True, "wheel": str(wheel_path),
                       "poll_s": POLL_S, "interruption_grace_s": 120.0, "report_timeout_min": 6.0, "timeout_min": 15.0,
                       "instance_type": instance_type}, clients={"ec2": cloud["ec2"], "s3": cloud["s3"]})


def _start_node(cloud, instance_id: str, work: Path, python: Path, meta: Metadata, hold: str) -> subprocess.Popen:
    """The instance's user data from moto, run as the instance would at boot (tests/test_aws_bootstrap.py's
    `start_user_data`), its ranks holding as `hold` says (SCALELAB_HOLD_AT_STEP)."""
    return start_user_data(cloud, instance_id, work, python, meta, hold_at=hold)


def _following(be: AwsBackend, run_dir: Path) -> tuple[threading.Thread, dict]:
    """The real follow loop (`runner.wait`) in a thread, as tests/test_aws_bootstrap.py runs it."""
    outcome: dict = {}

    def follow() -> None:
        try:
            outcome["status"] = wait(be, run_dir)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome["error"] = exc

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("engine", ["single", "ddp", pytest.param("horovod", marks=needs_horovod), "ps"])
def test_aws_a_signal_to_one_rank_on_a_node_cancels_the_run_without_replacement(cloud, wheel, venv, tmp_path, tmp_path_factory, engine):
    ec2 = cloud["ec2"]
    engine_spec, extra, instance_type = ENGINE_RUNS[engine]
    spec = Spec.from_dict({**RUN, "engine": engine_spec, **extra})  # 10 steps, a checkpoint every 4
    rank = 0 if engine == "single" else 1  # the one signalled; it holds at STOP_AT until then, the others agree
    run_dir = new_run_dir(tmp_path / "runs", "signal")
    be = _aws(cloud, wheel, instance_type)
    submit(be, spec, run_dir)
    launcher, outcome = _following(be, run_dir)
    meta = Metadata()  # never a spot notice: meta.records stays None
    try:
        (first,) = td.instances(ec2, run_dir.name, ["running"], 0)
        meta.instance_id = first["InstanceId"]
        work0 = tmp_path / "node-gen0"
        node_run = work0 / run_dir.name
        with reachable(first, engine):
            proc = _start_node(cloud, first["InstanceId"], work0, venv, meta, f"{STOP_AT}:{rank}")
            wait_for(f"the node's rank {rank} at step {STOP_AT}", lambda: any(
                r["kind"] == "step" and r["step"] == STOP_AT for r in records(node_run, rank)), patience_s=400)
            wait_for("the node's rank", lambda: rank_process(node_run, rank)).send_signal(signal.SIGTERM)
            said = finished(proc, work0)
        assert proc.returncode == 0, said
        launcher.join(timeout=120)
        assert not launcher.is_alive(), f"the launcher's follow loop still runs 120 s after the instance's end: {outcome}"
    finally:
        if launcher.is_alive():
            be.cancel(run_dir, grace_s=0)
    assert "error" not in outcome, outcome
    assert outcome["status"].state == "CANCELLED", outcome["status"].detail
    status = s3_json(cloud, f"scalelab/{run_dir.name}/status/gen-0/{first['InstanceId']}.json")
    assert status["state"] == "cancelled" and status["reason"] is None, said
    assert td.instances(ec2, run_dir.name, ["pending", "running"], 1) == [], "capacity was replaced"
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []
    stops = [r for r in read_jsonl(run_dir / "records" / f"rank-{rank}.jsonl") if r.get("event") == "interrupted"]
    assert [(s["step"], s["signal"]) for s in stops] == [(STOP_AT, signal.SIGTERM)]
    assert not left(node_run), "a process of the node's run is left"

    # the resume: a new generation continues from the checkpoint to the end
    be = _aws(cloud, wheel, instance_type)
    submit(be, read_spec(run_dir), run_dir)
    launcher, outcome = _following(be, run_dir)
    try:
        (second,) = wait_for("the resumed generation's instance", lambda: td.instances(ec2, run_dir.name, ["running"], 1))
        meta.instance_id = second["InstanceId"]
        work1 = tmp_path / "node-gen1"
        with reachable(second, engine):
            proc = _start_node(cloud, second["InstanceId"], work1, venv, meta, "")
            said = finished(proc, work1)
        assert proc.returncode == 0, said
        launcher.join(timeout=120)
        assert not launcher.is_alive(), f"the launcher's follow loop still runs 120 s after the instance's end: {outcome}"
    finally:
        meta.server.shutdown()
        if launcher.is_alive():
            be.cancel(run_dir, grace_s=0)
    assert "error" not in outcome, outcome
    assert outcome["status"].state == "COMPLETED", outcome["status"].detail
    reference = uninterrupted(spec, engine, tmp_path_factory)
    _assert_resumed_exactly(run_dir, reference, engine, from_step=STOP_AT)
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []


# ---- --allow-changed on Kubernetes and AWS -----------------------------------------------------------

CHANGED = ["--model", "nmt-tiny", "--data", "task", "--warmup-steps", "1", "--prefetch", "1", "--global-batch", "16",
           "--steps", "4", "--checkpoint-every", "2", "--engine", "single", "--threads", "1"]


@pytest.fixture(scope="module")
def allowed_run(tmp_path_factory) -> Path:
    """A 4-step run (checkpoint at step 4) whose spec.json then asks for 6 steps with global batch 8, the
    change accepted as `launch resume --allow-changed global_batch` accepts it (the check, the event)."""
    where = tmp_path_factory.mktemp("allowed")
    done = launch(*CHANGED, "--runs-dir", "runs", cwd=where)
    assert done.returncode == 0, done.stderr[-3000:]
    run = only_run_dir(where / "runs")
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "global_batch": 8, "steps": 6}))
    changed = check_resume(run, read_spec(run).validate(), ("global_batch",))
    assert changed == {"global_batch": [16, 8]}
    record_changes(run, changed)
    return run


def _as_a_remote_rank(run: Path, where: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The trainer as a pod's or an instance's rank runs it: its own RUN_DIR holding spec.json and the
    checkpoint (no launcher events), with `env`."""
    scratch = where / run.name
    scratch.mkdir(parents=True)
    shutil.copy(run / "spec.json", scratch / "spec.json")
    shutil.copy(run / CHECKPOINT_NAME, scratch / CHECKPOINT_NAME)
    clean = {k: v for k, v in PYTHON_ENV.items() if k != ACCEPTED_ENV}
    return subprocess.run([sys.executable, "-m", "scalelab.train", str(scratch)], cwd=where, capture_output=True,
                          text=True, env={**clean, **env}, timeout=300)


def _assert_resumes_with_the_change(done: subprocess.CompletedProcess, where: Path, name: str) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    recs = read_jsonl(where / name / "records" / "rank-0.jsonl")
    assert [r["resumed_from_step"] for r in recs if r["kind"] == "start"] == [4]
    assert [(r["step"], r["samples"]) for r in recs if r["kind"] == "step"] == [(5, 8), (6, 8)]


def _assert_refused_without(run: Path, where: Path) -> None:
    """The same rank without the variable: the checkpoint is another batch's, refused (as before the fix)."""
    done = _as_a_remote_rank(run, where, {})
    assert done.returncode == 2 and "belongs to a different run" in done.stderr, done.stderr[-2000:]


def test_kubernetes_passes_the_accepted_changes_to_every_rank(allowed_run, tmp_path):
    """Rendered, validated against the published schemas (not run on a cluster): the variable is in every
    container's environment, and mpirun passes it on to the Horovod ranks; the trainer run with the trainer
    container's environment resumes with the new batch."""
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    from scalelab.k8s.backend import KubernetesBackend
    from scalelab.k8s.validate import validate_all

    base = json.loads((allowed_run / "spec.json").read_text())
    found: dict[str, str] = {}
    for engine, gpus in (("single", 1), ("ddp", 2), ("horovod", 2)):
        spec = Spec.from_dict({**base, "backend": "k8s", "engine": {"name": engine}, "gpus_per_node": gpus}).validate()
        request = KubernetesBackend({"image": "registry.example.com/scalelab:0.1.0"}).submit_dryrun(spec, allowed_run)
        validate_all([*request.objects, request.fetch])
        workload = request.objects[-1]
        pods = ([r["template"]["spec"] for r in workload["spec"]["mpiReplicaSpecs"].values()]
                if workload["kind"] == "MPIJob" else [workload["spec"]["template"]["spec"]])
        for container in [c for pod in pods for c in pod["containers"]]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env.get(ACCEPTED_ENV) == "global_batch", (engine, container["name"])
            if engine == "horovod" and container["name"] == "launcher":
                assert f"-x {ACCEPTED_ENV}" in " ".join(container["command"])  # mpirun passes it to the ranks
            if engine == "single":
                found = {k: v for k, v in env.items() if k == ACCEPTED_ENV}
    _assert_resumes_with_the_change(_as_a_remote_rank(allowed_run, tmp_path / "pod", found), tmp_path / "pod",
                                    allowed_run.name)
    _assert_refused_without(allowed_run, tmp_path / "before")


def test_aws_passes_the_accepted_changes_to_the_instances(allowed_run, cloud, tmp_path):
    """Scheduled into moto: the user data moto holds exports the variable (the bootstrap passes its
    environment on to the ranks); the trainer run with it resumes with the new batch."""
    wheel_file = tmp_path / "scalelab-0-py3-none-any.whl"
    wheel_file.write_bytes(b"not used: no instance boots in this test")
    run = tmp_path / "runs" / allowed_run.name
    shutil.copytree(allowed_run, run)
    spec = read_spec(run)
    be = _aws(cloud, wheel_file)
    be.schedule(be.submit_dryrun(spec, run))
    try:
        (instance,) = td.instances(cloud["ec2"], run.name, ["pending", "running"], 0)
        exported = [shlex.split(line)[1] for line in user_data_of(cloud["ec2"], instance["InstanceId"]).splitlines()
                    if line.startswith(f"export {ACCEPTED_ENV}=")]
    finally:
        be._teardown(run, "CANCELLED")
    assert exported == [f"{ACCEPTED_ENV}=global_batch"]
    name, value = exported[0].split("=", 1)
    _assert_resumes_with_the_change(_as_a_remote_rank(run, tmp_path / "node", {name: value}), tmp_path / "node", run.name)
    assert td.instances(cloud["ec2"], run.name, td.LIVE_STATES) == []
