"""Faults of a two-instance run, on instances played in namespaces of their own (tests/ec2_sandbox.py),
against moto's server: the built-in trainer with DDP (torchrun on each instance) and Horovod (horovodrun on
the leader, the second instance's rank started over ssh): `launch cancel` from another process, a spot
interruption of one instance, a SIGTERM to the second instance's rank alone, and a SIGKILLed launcher.

EC2 warns one instance, not the run. Here only the *second* instance's metadata announces the interruption
once its rank holds at step 6: that instance's bootstrap stops its own ranks, the ranks agree on the step,
rank 0 (on the leader, which had no notice) checkpoints, and every rank exits. The launcher must read that
as an interruption (not as the run completing, nor as a cancel), start two fresh instances, and they must
resume from the checkpoint to the end with the same per-step losses, learning rates, weights and Adam
state as an uninterrupted run. Nothing is left running and every instance is terminated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import ec2_sandbox
from conftest import ROOT, needs_horovod, read_jsonl

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")
pytest.importorskip("moto.server", reason='moto server is not installed: pip install "moto[server]"')

from scalelab.aws import teardown as td  # noqa: E402
from scalelab.aws.backend import AwsBackend  # noqa: E402
from scalelab.core.rundir import new_run_dir  # noqa: E402
from scalelab.core.spec import Spec, save_spec  # noqa: E402
from scalelab.launcher.runner import wait  # noqa: E402
from scalelab.train.checkpoint import CHECKPOINT_NAME  # noqa: E402
from tests.test_aws_bootstrap import (  # noqa: E402,F401 - the fixtures and stand-ins of the instance side
    KEYS,
    POLL_S,
    REGION,
    RUN,
    STOP_AT,
    Metadata,
    cloud,
    finished,
    s3_json,
    scratch_venv,
    start_user_data,
    until,
    wheel,
    _following,
)
from tests.test_rank_signals import rank_process, wait_for  # noqa: E402
from tests.test_resume import SPEC, _assert_resumed_exactly, resume_reference  # noqa: E402

pytestmark = pytest.mark.slow


@dataclass
class Generation:
    """What playing a generation's two instances left: their outputs, the instances (their folders), the
    common SCALELAB_WORK path and the second instance's sshd log."""

    said: list[str]
    instances: list
    work: Path
    sshd_log: str


def play_generation(cloud, tmp_path, run_dir, generation: int, notice_on_second: bool = False,
                    at_the_hold=None, hold_at: str = f"{STOP_AT}:1") -> Generation:
    """Run the user data of this generation's two instances in played instances, to their end. The second
    instance's rank holds at STOP_AT until it gets a stop (`hold_at`: SCALELAB_HOLD_AT_STEP; "" for a run that
    is meant to complete); `at_the_hold()` is called (in a thread) once it holds there. Whatever happens,
    nothing of the instances is left running."""
    from moto.server import ThreadedMotoServer

    from scalelab.core.net import free_port

    nodes = sorted(td.instances(cloud["ec2"], run_dir.name, ["running"], generation),
                   key=lambda i: i["AmiLaunchIndex"])
    assert len(nodes) == 2, nodes
    ips = tuple(node["PrivateIpAddress"] for node in nodes)
    work = tmp_path / f"work-gen{generation}"  # SCALELAB_WORK, the same path on both instances
    where = tmp_path / f"gen{generation}"
    where.mkdir()
    with ec2_sandbox.two_instances(where, ips) as net:
        played = net.instances  # moto for them at this machine's address on their link (the same state)
        port = free_port(net.gateway)
        moto_there = ThreadedMotoServer(ip_address=net.gateway, port=port, verbose=False)
        moto_there.start()
        metas = [Metadata(host=net.gateway), Metadata(host=net.gateway)]
        if notice_on_second:  # once the second instance's rank has written STOP_AT steps
            metas[1].records = played[1].folder / run_dir.name / "records" / "rank-1.jsonl"
        procs: list = []
        try:
            for node, meta, instance in zip(nodes, metas, played):  # both boot at once, each its own Python
                meta.instance_id = node["InstanceId"]
                before = ec2_sandbox.sshd_start(instance) if instance.index else ""
                procs.append(start_user_data(
                    cloud, node["InstanceId"], work, scratch_venv(where / f"python-{instance.index}"), meta,
                    inside=lambda text, instance=instance, before=before: instance.wrap(work, text, before),
                    endpoint=f"http://{net.gateway}:{port}",
                    hold_at=hold_at))  # the second instance's rank waits there for its stop; rank 0 agrees
            if at_the_hold:
                threading.Thread(target=lambda: wait_for_step(played[1].folder / run_dir.name, 1) and at_the_hold(),
                                 daemon=True).start()
            said = [finished(proc, instance.folder) for proc, instance in zip(procs, played)]
            assert all(proc.returncode == 0 for proc in procs), said
        finally:
            for proc in procs:  # unshare --kill-child: the instance's processes go with it
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for meta in metas:
                meta.server.shutdown()
            moto_there.stop()
    sshd_log = where / "sshd-1" / "sshd.log"
    return Generation(said, played, work, sshd_log.read_text() if sshd_log.exists() else "")


def wait_for_step(run: Path, rank: int, step: int = STOP_AT, patience_s: float = 300) -> bool:
    """Until `rank`'s records (in this instance's folder) hold `step`."""
    deadline = time.monotonic() + patience_s
    path = run / "records" / f"rank-{rank}.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and f'"step": {step},' in path.read_text():
            return True
        time.sleep(0.2)
    return False


def follow(be, run_dir: Path) -> tuple[threading.Thread, dict]:
    """The launcher's follow loop (`launcher.runner.wait`) in a thread; its outcome."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["status"] = wait(be, run_dir)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def launch_two(cloud, wheel, tmp_path, engine: str, name: str, **options):
    """A two-instance run of the built-in trainer (RUN on 2 nodes of 1 rank) scheduled into moto, and the
    launcher following it: the backend, the run directory, the follow thread and its outcome."""
    spec = Spec.from_dict({**RUN, "engine": {"name": engine}, "nodes": 2, "gpus_per_node": 1})
    be = AwsBackend({"bucket": cloud["bucket"], "region": REGION, "wheel": str(wheel), "poll_s": POLL_S,
                     "interruption_grace_s": 120.0, "report_timeout_min": 6.0, "timeout_min": 15.0,
                     "instance_type": "g3.4xlarge", "placement_group": "none", **options},
                    clients={"ec2": cloud["ec2"], "s3": cloud["s3"]})
    run_dir = new_run_dir(tmp_path / "runs", name)
    save_spec(spec, run_dir)
    be.schedule(be.submit_dryrun(spec, run_dir))
    return (be, run_dir, *follow(be, run_dir))


def final_statuses(cloud, run_dir: Path, generation: int) -> list[dict]:
    """The instances' final status files of a generation in S3 (not their heartbeats), the leader's first."""
    prefix = f"scalelab/{run_dir.name}/status/gen-{generation}/"
    listing = cloud["s3"].list_objects_v2(Bucket=cloud["bucket"], Prefix=prefix)
    statuses = [s3_json(cloud, o["Key"]) for o in listing["Contents"] if not o["Key"].endswith(".heartbeat.json")]
    return sorted(statuses, key=lambda status: status.get("index", 0))


def played_to_the_end(cloud, tmp_path, be, run_dir: Path, launcher: threading.Thread, at_the_hold) -> list[str]:
    """Generation 0 played to its end (`at_the_hold` once the second rank holds at STOP_AT), then the
    launcher's follow thread joined; a launcher still following is cancelled at once. The instances' output."""
    try:
        said = play_generation(cloud, tmp_path, run_dir, 0, at_the_hold=at_the_hold).said
        launcher.join(timeout=120)
        assert not launcher.is_alive(), ("the launcher's follow loop still runs 120 s after the instances' end", said)
    finally:
        if launcher.is_alive():
            be.cancel(run_dir, grace_s=0)
    return said


def assert_nothing_left_under(tmp_path: Path) -> None:
    """No process whose command line names the test's folder (the instances' agents, ranks, sshd) runs."""
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert left == [], subprocess.run(["ps", "-o", "pid,args", "-p", ",".join(left)], capture_output=True,
                                      text=True).stdout


# Horovod only: its second rank is the one no agent of its own instance started (horovodrun over ssh). DDP's
# cancel on an instance (torchrun's SIGTERM) is tests/test_rank_signals_remote.py's and test_aws_moto.py's.
@pytest.mark.parametrize("engine", [pytest.param("horovod", marks=needs_horovod)])
def test_a_cancel_stops_both_instances_ranks_at_one_step_with_a_checkpoint(cloud, wheel, tmp_path, engine):
    """`launch cancel` (the backend's cancel: the stop request, the wait for the leader's checkpoint, the
    teardown) while the second instance's rank holds at step 6: each instance stops its own ranks (Horovod's
    second rank was started over ssh by the leader's horovodrun: the second instance's bootstrap finds it in
    its own processes), they agree on step 6, rank 0 checkpoints it and the checkpoint reaches the launcher;
    the run is CANCELLED, nothing is replaced, both instances are terminated and nothing is left running."""
    if why := ec2_sandbox.unavailable():
        pytest.skip(why)
    ec2, s3 = cloud["ec2"], cloud["s3"]
    be, run_dir, launcher, outcome = launch_two(cloud, wheel, tmp_path, engine, "cancel")
    cancelled: dict = {}
    returned = threading.Event()

    def cancel() -> None:
        try:
            AwsBackend({"poll_s": POLL_S}, clients={"ec2": ec2, "s3": s3}).cancel(run_dir)  # as `launch cancel` does
            cancelled["done"] = True
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            cancelled["error"] = exc
        finally:
            returned.set()

    said = played_to_the_end(cloud, tmp_path, be, run_dir, launcher, at_the_hold=cancel)
    # The instances end once the leader has put its final status; the cancel (in its own thread) sees that a
    # poll later, then pulls and tears down: the launcher's follow loop may end first (a CI run read
    # `cancelled` while the cancel was still pulling). The cancel returns within its graces, or it hung.
    assert returned.wait(timeout=240), "the cancel did not return within interruption_grace_s + end_grace_s"
    assert cancelled == {"done": True}, cancelled
    assert "error" not in outcome and "status" in outcome, outcome  # the launcher ended
    assert outcome["status"].state == "CANCELLED", (outcome["status"].detail, said)
    for rank in (0, 1):
        stops = [r for r in read_jsonl(run_dir / "records" / f"rank-{rank}.jsonl") if r.get("event") == "interrupted"]
        assert [s["step"] for s in stops] == [STOP_AT], (rank, said)
    assert torch.load(run_dir / CHECKPOINT_NAME, weights_only=True)["step"] == STOP_AT
    statuses = final_statuses(cloud, run_dir, 0)
    assert [s["reason"] for s in statuses] == ["stop_requested", "stop_requested"], statuses  # each node says why
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []
    assert td.instances(ec2, run_dir.name, None, 1) == [], "capacity was replaced"
    assert_nothing_left_under(tmp_path)


@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_a_spot_notice_to_one_instance_replaces_both_and_the_run_resumes_exactly(cloud, wheel, tmp_path, tmp_path_factory,
                                                                                 engine):
    if why := ec2_sandbox.unavailable():
        pytest.skip(why)
    ec2 = cloud["ec2"]
    be, run_dir, launcher, outcome = launch_two(cloud, wheel, tmp_path, engine, "two", spot=True)
    try:
        said0 = play_generation(cloud, tmp_path, run_dir, 0, notice_on_second=True).said
        statuses = {s["index"]: s for s in final_statuses(cloud, run_dir, 0)}
        assert [statuses[i]["state"] for i in (0, 1)] == ["interrupted", "interrupted"], (statuses, said0)
        second = sorted(td.instances(ec2, run_dir.name, None, 0), key=lambda i: i["AmiLaunchIndex"])[1]["InstanceId"]
        assert [statuses[i]["notice_on"] for i in (0, 1)] == [second, second]  # the leader names whose notice
        deadline = time.time() + 120
        while len(td.instances(ec2, run_dir.name, ["running"], 1)) < 2:
            assert time.time() < deadline and launcher.is_alive(), (f"no replacement was started: {outcome}", said0)
            time.sleep(0.3)
        said1 = play_generation(cloud, tmp_path, run_dir, 1).said
        launcher.join(timeout=120)
        assert not launcher.is_alive(), (f"the launcher's follow loop still runs 120 s after the instances' end: {outcome}",
                                         said1)
    finally:
        if launcher.is_alive():
            be.cancel(run_dir, grace_s=0)
    assert "error" not in outcome and "status" in outcome, outcome  # the launcher ended
    assert outcome["status"].state == "COMPLETED", (outcome["status"].detail, said1)
    # The uninterrupted run: tests/test_resume.py's local run of the same spec on one node of two ranks (made
    # once in the pytest run): two instances of one rank each give the same floats.
    reference = resume_reference(tmp_path_factory, engine)
    _assert_resumed_exactly(run_dir, reference, engine, from_step=STOP_AT)
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []
    events = [json.loads(x) for x in (run_dir / "records" / "aws-events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("instance_id")) for e in events if e["event"] in ("spot_interruption",
                                                                              "capacity_replaced")] == \
        [("spot_interruption", second), ("capacity_replaced", None)]


@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_a_signal_to_the_second_instances_rank_cancels_the_run_without_replacement(cloud, wheel, tmp_path, engine):
    """SIGTERM to the second instance's rank alone (a node agent, the OOM killer, a hook: not a spot notice,
    not a cancel) while it holds at step 6. DDP's rank there is its own torchrun's; Horovod's was started over
    ssh by the leader's horovodrun. The ranks agree on step 6, rank 0 (on the leader, which got no signal)
    checkpoints, every rank exits; the launcher ends the run CANCELLED (as for one instance:
    tests/test_rank_signals_remote.py), starts no replacement, terminates both instances, nothing is left."""
    if why := ec2_sandbox.unavailable():
        pytest.skip(why)
    ec2 = cloud["ec2"]
    be, run_dir, launcher, outcome = launch_two(cloud, wheel, tmp_path, engine, "signal")
    signalled: dict = {}
    returned = threading.Event()

    def signal_the_rank() -> None:
        try:  # the second instance's folder is its SCALELAB_WORK: its rank's command line names that path
            rank = wait_for("the second instance's rank", lambda: rank_process(tmp_path / "work-gen0" / run_dir.name, 1))
            rank.send_signal(signal.SIGTERM)
            signalled["pid"] = rank.pid
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            signalled["error"] = exc
        finally:
            returned.set()

    said = played_to_the_end(cloud, tmp_path, be, run_dir, launcher, at_the_hold=signal_the_rank)
    # The generation ends only after the signal, but the thread records the pid after sending it: wait for
    # it to return, as the cancel test above waits for its cancel, rather than read `signalled` while it runs.
    assert returned.wait(timeout=60), ("the thread that signals the rank did not return", said)
    assert "pid" in signalled, signalled
    assert "error" not in outcome and "status" in outcome, outcome  # the launcher ended
    assert outcome["status"].state == "CANCELLED", (outcome["status"].detail, said)
    stops = {rank: [r for r in read_jsonl(run_dir / "records" / f"rank-{rank}.jsonl") if r.get("event") == "interrupted"]
             for rank in (0, 1)}
    assert [s["step"] for s in stops[0] + stops[1]] == [STOP_AT, STOP_AT], (stops, said)
    assert stops[1][0]["signal"] == signal.SIGTERM
    statuses = final_statuses(cloud, run_dir, 0)
    assert [(st["state"], st["reason"]) for st in statuses] == [("cancelled", None)] * 2, statuses  # each node says it
    assert torch.load(run_dir / CHECKPOINT_NAME, weights_only=True)["step"] == STOP_AT
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []
    assert td.instances(ec2, run_dir.name, None, 1) == [], "capacity was replaced"
    assert_nothing_left_under(tmp_path)


@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_a_killed_launcher_stops_both_instances_with_a_checkpoint(cloud, wheel, tmp_path, engine):
    """SIGKILL of the launcher (`launch` on the user's laptop) while the second instance's rank holds at step 6:
    nothing runs in it to terminate the instances. Each node sees the launcher's heartbeat stop changing (15 s
    here), stops its ranks, they agree on step 6, rank 0 checkpoints and the checkpoint reaches the bucket;
    both instances power off (which terminates them) and nothing is left running; `launch aws gc` removes
    what only a launcher would have removed (tests/test_aws_bootstrap.py: the same on one instance)."""
    if why := ec2_sandbox.unavailable():
        pytest.skip(why)
    ec2, s3, bucket = cloud["ec2"], cloud["s3"], cloud["bucket"]
    env = {**os.environ, **KEYS, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": cloud["url"], "AWS_DEFAULT_REGION": REGION}
    log = (tmp_path / "launcher.err").open("w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "scalelab.launcher.cli", *SPEC, "--engine", engine, "--nodes", "2", "--gpus-per-node",
         "1", "--backend", "aws", "--bucket", bucket, "--region", REGION, "--heartbeat-timeout-min", "0.25",
         f"--backend-opt=wheel={wheel}", f"--backend-opt=poll_s={POLL_S}", "--backend-opt=placement_group=none",
         "--backend-opt=instance_type=g3.4xlarge", "--runs-dir", "runs"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        run_dir = until(lambda: next(iter(_following(tmp_path / "runs")), None), launcher, "the launcher to follow its run")
        said = play_generation(cloud, tmp_path, run_dir, 0, at_the_hold=launcher.kill).said  # SIGKILL: no clean-up
    finally:
        launcher.kill()
        launcher.wait(timeout=60)
        log.close()
    statuses = final_statuses(cloud, run_dir, 0)
    assert [(st["state"], st["reason"]) for st in statuses] == [("interrupted", "launcher_lost")] * 2, (statuses, said)
    checkpoint = tmp_path / "checkpoint.pt"
    s3.download_file(bucket, f"scalelab/{run_dir.name}/checkpoint.pt", str(checkpoint))
    assert torch.load(checkpoint, weights_only=True)["step"] == STOP_AT  # stopped with a checkpoint, uploaded
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == [], "an instance did not terminate itself"
    assert td.instances(ec2, run_dir.name, None, 1) == [], "capacity was replaced"
    assert_nothing_left_under(tmp_path)
    gc = subprocess.run([sys.executable, "-m", "scalelab.launcher.cli", "aws", "gc", "--run-id", run_dir.name],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert td.groups_sg_only(ec2, run_dir.name) == []
