"""The aws backend against moto's server on loopback, through the real boto3 clients.

What runs here for real: every EC2/S3 request of a launch (package and spec upload, security group,
placement group, spot market options, tags), the polling of S3 and EC2, spot replacement with a
fallback type, teardown on every way out, and `launch aws gc`. What cannot: instances in moto run
nothing, so their side (the bootstrap: heartbeats, records, statuses in S3) is played by a small
fake driven from each tick of the launcher's follow loop (`launcher.runner.wait`, `on_tick`); the real bootstrap is tested on its own in
tests/test_aws_bootstrap.py. After each scenario we describe the run's instances by tag and require
that none is left running.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from conftest import launch, wheel_build_lock

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")
pytest.importorskip("moto.server", reason='moto server is not installed: pip install "moto[server]"')

from scalelab.aws import teardown as td  # noqa: E402
from scalelab.aws.render import cloud_run_id  # noqa: E402
from scalelab.aws.backend import AwsBackend  # noqa: E402
from scalelab.core.errors import ScalelabError  # noqa: E402
from scalelab.core.spec import Spec  # noqa: E402
from scalelab.launcher.runner import Interrupted, cancel, execute, failure, submit, wait  # noqa: E402

REGION = "us-east-1"
CREDS = {"aws_access_key_id": "AKIATESTMOTOKEYID", "aws_secret_access_key": "moto/test/SECRET/value"}


@pytest.fixture
def cloud(moto_url, tmp_path):
    session = boto3.Session(region_name=REGION, **CREDS)
    ec2 = session.client("ec2", endpoint_url=moto_url)
    s3 = session.client("s3", endpoint_url=moto_url)
    iam = session.client("iam", endpoint_url=moto_url)
    try:
        iam.create_instance_profile(InstanceProfileName="scalelab-instance")
    except iam.exceptions.EntityAlreadyExistsException:
        pass
    bucket = f"scalelab-test-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    wheel = tmp_path / "scalelab-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel: moto instances install nothing")
    return {"ec2": ec2, "s3": s3, "bucket": bucket, "wheel": wheel, "url": moto_url}


def backend(cloud, **opts) -> AwsBackend:
    options = {"bucket": cloud["bucket"], "region": REGION, "wheel": str(cloud["wheel"]), "poll_s": 0.01,
               "placement_group": "none",
               "report_timeout_min": 5.0, "interruption_grace_s": 0.0, **opts}
    return AwsBackend(options, clients={"ec2": cloud["ec2"], "s3": cloud["s3"]})


def make_spec(nodes: int = 2, **kw) -> Spec:
    return Spec.from_dict({"backend": "aws", "nodes": nodes, "engine": {"name": "ddp"}, "steps": 6, **kw})


def live(cloud, run_id: str) -> list[dict]:
    return td.instances(cloud["ec2"], run_id, td.LIVE_STATES)


def left(cloud, run_id: str, placement_groups: PlacementGroups | None = None) -> dict[str, int]:
    """What of the run still exists or costs, counted through boto3: instances not terminated, its
    volumes, its security groups and (where they are kept, see PlacementGroups) its placement groups."""
    pgs = list(placement_groups.groups.values()) if placement_groups else []
    return {"instances": len(live(cloud, run_id)), "volumes": len(td.volumes(cloud["ec2"], run_id)),
            "security_groups": len(td.groups_sg_only(cloud["ec2"], run_id)), "placement_groups": len(pgs)}


NOTHING = {"instances": 0, "volumes": 0, "security_groups": 0, "placement_groups": 0}


def run_dir_for(tmp_path: Path) -> Path:
    d = tmp_path / f"run-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    return d


class FakeNodes:
    """Plays the instances' side in S3 (what scalelab/aws/bootstrap.py writes), one step of the story per poll."""

    def __init__(self, cloud, run_dir: Path, prefix: str = "scalelab") -> None:
        self.cloud, self.run_id = cloud, cloud_run_id(run_dir)
        self.prefix = f"{prefix}/{self.run_id}"
        self.polls: dict[int, int] = {}
        self.t0 = 1_700_000_000.0

    def nodes(self, generation: int) -> list[dict]:
        from scalelab.aws.bootstrap import node_order

        return sorted(td.instances(self.cloud["ec2"], self.run_id, ["running", "pending"], generation), key=node_order)

    def put(self, key: str, body) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.cloud["s3"].put_object(Bucket=self.cloud["bucket"], Key=f"{self.prefix}/{key}", Body=data)

    def records(self, generation: int, rank: int, steps: range, world: int, resumed: int | None = None,
                checkpoint: int | None = None) -> None:
        lines = [{"kind": "start", "rank": rank, "world": world, "time": self.t0 + 100 * generation,
                  "resumed_from_step": resumed}]
        for s in steps:
            lines.append({"kind": "step", "rank": rank, "world": world, "step": s, "warmup": False,
                          "time": self.t0 + 100 * generation + s, "step_s": 1.0, "samples": 8, "words": 80, "loss": 1.0})
        if checkpoint:
            lines.append({"kind": "event", "event": "checkpoint", "rank": rank, "world": world, "step": checkpoint,
                          "time": self.t0 + 100 * generation + checkpoint})
        self.put(f"records/gen-{generation}/rank-{rank}.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())

    def heartbeat(self, generation: int) -> list[dict]:
        nodes = self.nodes(generation)
        for i, n in enumerate(nodes):
            self.put(f"status/gen-{generation}/{n['InstanceId']}.heartbeat.json", {"time": 0, "index": i})
        return nodes

    def status(self, generation: int, nodes: list[dict], state: str) -> None:
        for i, n in enumerate(nodes):
            self.put(f"status/gen-{generation}/{n['InstanceId']}.json", {"state": state, "index": i, "exit_code": 0})

    def tick(self, generation: int) -> int:
        self.polls[generation] = self.polls.get(generation, 0) + 1
        return self.polls[generation]


# ---- launch, tags, groups, spot options, upload, polling, teardown ---------------------------------


class PlacementGroups:
    """moto 5.2 does not serve placement groups (CreatePlacementGroup: 'not implemented'): these three
    calls are kept in memory, with AWS's request and response shapes; everything else is moto."""

    def __init__(self, real) -> None:
        self.real, self.groups, self.launched = real, {}, []

    def run_instances(self, **kw):  # moto accepts Placement but does not echo it: keep the request
        self.launched.append(kw)
        return self.real.run_instances(**kw)

    def create_placement_group(self, GroupName, Strategy, TagSpecifications=()):
        tags = [t for s in TagSpecifications for t in s["Tags"]]
        self.groups[GroupName] = {"GroupName": GroupName, "Strategy": Strategy, "State": "available", "Tags": tags}
        return {"PlacementGroup": self.groups[GroupName]}

    def describe_placement_groups(self, **kw):
        return {"PlacementGroups": list(self.groups.values())}

    def delete_placement_group(self, GroupName):
        del self.groups[GroupName]
        return {}

    def __getattr__(self, name):
        return getattr(self.real, name)



def test_spot_run_completes_and_leaves_nothing(cloud, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDS["aws_secret_access_key"])
    be = backend(cloud, instance_type="g3.4xlarge", spot=True, spot_max_price=0.6, placement_group="auto")
    pgs = be._clients["ec2"] = PlacementGroups(cloud["ec2"])
    run_dir = run_dir_for(tmp_path)
    request = be.submit_dryrun(make_spec(), run_dir)
    assert be.schedule(request) == run_dir.name
    ec2, s3 = cloud["ec2"], cloud["s3"]

    nodes = live(cloud, run_dir.name)
    assert len(nodes) == 2 and {n["InstanceType"] for n in nodes} == {"g3.4xlarge"}
    assert all(n.get("InstanceLifecycle") == "spot" for n in nodes)
    tags = {t["Key"]: t["Value"] for t in nodes[0]["Tags"]}
    assert tags["scalelab:run-id"] == run_dir.name and tags["scalelab:generation"] == "0"
    (sg,) = [g for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupName"] == f"scalelab-{run_dir.name}"]
    perms = sg["IpPermissions"]
    assert [p["UserIdGroupPairs"][0]["GroupId"] for p in perms] == [sg["GroupId"]]
    assert not any(p.get("IpRanges") for p in perms)  # traffic only inside the group
    assert {g["GroupId"] for n in nodes for g in n["SecurityGroups"]} == {sg["GroupId"]}
    assert pgs.groups[f"scalelab-{run_dir.name}"]["Strategy"] == "cluster"
    assert {"Key": "scalelab:run-id", "Value": run_dir.name} in pgs.groups[f"scalelab-{run_dir.name}"]["Tags"]
    assert [kw["Placement"] for kw in pgs.launched] == [{"GroupName": f"scalelab-{run_dir.name}"}]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=cloud["bucket"])["Contents"]}
    assert f"scalelab/{run_dir.name}/package/scalelab-0.1.0-py3-none-any.whl" in keys
    assert f"scalelab/{run_dir.name}/spec.json" in keys
    ud = ec2.describe_instance_attribute(InstanceId=nodes[0]["InstanceId"], Attribute="userData")
    script = base64.b64decode(ud["UserData"]["Value"]).decode()
    assert run_dir.name in script and "shutdown -h +120" in script and "SCALELAB_HEARTBEAT_TIMEOUT_S=600" in script
    assert CREDS["aws_access_key_id"] not in script and CREDS["aws_secret_access_key"] not in script
    for n in nodes:  # powering off (the time limit, the end, a lost launcher) terminates: nothing is left stopped
        behaviour = ec2.describe_instance_attribute(InstanceId=n["InstanceId"], Attribute="instanceInitiatedShutdownBehavior")
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"

    fake = FakeNodes(cloud, run_dir)
    beats = []

    def instance_side() -> None:
        beat = s3.get_object(Bucket=cloud["bucket"], Key=f"scalelab/{run_dir.name}/control/launcher.json")
        beats.append(json.loads(beat["Body"].read())["time"])
        if fake.tick(0) == 2:
            ns = fake.heartbeat(0)
            for rank in range(2):
                fake.records(0, rank, range(1, 7), world=2)
            fake.status(0, ns, "completed")

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "COMPLETED", status.detail
    assert len(beats) >= 2 and len(set(beats)) == len(beats), "the launcher rewrites its heartbeat on every poll"
    assert left(cloud, run_dir.name, pgs) == NOTHING
    steps = [json.loads(x) for x in (run_dir / "records" / "rank-1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1, 2, 3, 4, 5, 6]
    events = [json.loads(x) for x in (run_dir / "records" / "aws-events.jsonl").read_text().splitlines()]
    end = events[-1]
    assert end["event"] == "aws_end" and end["state"] == "COMPLETED"
    assert set(end["instance_seconds"]) == {"g3.4xlarge/spot"} and end["interruptions"] == 0
    assert be.status(run_dir).state == "COMPLETED"


def test_a_completed_run_waits_for_the_followers_last_records(cloud, tmp_path):
    """The leader says completed first; the second instance (a Horovod follower, whose rank 1 records only
    there) uploads its rank's last records with its final status a few polls later. The launcher must end
    the run only then: ending at the leader's word pulled rank 1's start record alone and tore its instance
    down (CI, 2026-12-04). So too for a leader that says cancelled (a rank got a stop signal). A follower
    that never says anything ends the run after `end_grace_s`, said; one that is gone is not waited for."""
    for end, follower_says in (("completed", True), ("cancelled", True), ("completed", False), ("completed", "gone")):
        be = backend(cloud, end_grace_s=0.0 if follower_says is False else 60.0)
        run_dir = run_dir_for(tmp_path)
        be.schedule(be.submit_dryrun(make_spec(), run_dir))
        fake, polls_after_leader = FakeNodes(cloud, run_dir), []

        def instance_side() -> None:
            n = fake.tick(0)
            ns = fake.nodes(0)
            if n == 1:
                fake.heartbeat(0)
                for rank in range(2):
                    fake.records(0, rank, range(0), world=2)  # the start records, uploaded early
            elif n == 2:
                fake.records(0, 0, range(1, 7), world=2)
                fake.status(0, ns[:1], end)
                if follower_says == "gone":  # terminated without a word: nothing more can come from it
                    cloud["ec2"].terminate_instances(InstanceIds=[ns[1]["InstanceId"]])
            elif n > 2:
                polls_after_leader.append(n)
                if follower_says is True and n == 5:  # three polls after the leader
                    fake.records(0, 1, range(1, 7), world=2)
                    fake.put(f"status/gen-0/{ns[1]['InstanceId']}.json", {"state": end, "index": 1})

        status = wait(be, run_dir, on_tick=instance_side)
        assert status.state == end.upper(), status.detail
        assert left(cloud, run_dir.name) == NOTHING
        steps = [json.loads(x) for x in (run_dir / "records" / "rank-1.jsonl").read_text().splitlines()]
        if follower_says == "gone":
            assert len(polls_after_leader) <= 1 and "no final status" not in status.detail, (polls_after_leader, status)
        elif follower_says:
            assert [r["step"] for r in steps if r["kind"] == "step"] == [1, 2, 3, 4, 5, 6]
            assert len(polls_after_leader) >= 3 and "no final status" not in status.detail
        else:
            assert [r["step"] for r in steps if r["kind"] == "step"] == []
            assert "sent no final status within 0 s (end_grace_s)" in status.detail, status.detail


# ---- failure injection: nothing is left running ----------------------------------------------------


class FailingEc2:
    """The real moto client, except that the Nth RunInstances raises after the earlier ones started."""

    def __init__(self, real, fail_at: int) -> None:
        self.real, self.fail_at, self.calls = real, fail_at, 0

    def run_instances(self, **kw):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected failure after instances started")
        return self.real.run_instances(**kw)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_exception_after_some_instances_started(cloud, tmp_path):
    be = backend(cloud, instance_type="2*g3.4xlarge+1*p3.2xlarge")
    be._clients["ec2"] = FailingEc2(cloud["ec2"], fail_at=2)
    run_dir = run_dir_for(tmp_path)
    with pytest.raises(RuntimeError, match="injected"):
        submit(be, make_spec(nodes=3), run_dir)
    info = json.loads((run_dir / "launch.json").read_text())
    assert len(info["instances"]) == 2  # the first group had started
    assert live(cloud, run_dir.name) == [] and info["state"] == "FAILED"


def test_refused_request_is_one_clear_error(cloud, tmp_path):
    be = backend(cloud, subnet_id="subnet-doesnotexist")
    run_dir = run_dir_for(tmp_path)
    with pytest.raises(ScalelabError, match="AWS refused .*subnet"):
        be.schedule(be.submit_dryrun(make_spec(), run_dir))
    assert live(cloud, run_dir.name) == []


def test_bootstrap_that_never_reports(cloud, tmp_path):
    be = backend(cloud, report_timeout_min=0.0001)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(), run_dir))
    status = wait(be, run_dir)
    assert status.state == "FAILED" and "never reported" in status.detail
    assert live(cloud, run_dir.name) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_in_the_middle_tears_everything_down(cloud, tmp_path, sig):
    """Ctrl-C, SIGTERM or SIGHUP to the launcher while it follows: the nodes are asked to checkpoint,
    every instance, volume and group of the run goes, the run is recorded CANCELLED."""
    be = backend(cloud, placement_group="auto")
    pgs = be._clients["ec2"] = PlacementGroups(cloud["ec2"])
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(), run_dir))
    assert left(cloud, run_dir.name, pgs) == {"instances": 2, "volumes": 2, "security_groups": 1, "placement_groups": 1}
    polls = []

    def stop_signal() -> None:
        polls.append(1)
        if len(polls) == 3:
            os.kill(os.getpid(), sig)

    with pytest.raises(Interrupted) as stopped:
        wait(be, run_dir, on_tick=stop_signal)
    assert stopped.value.exit_code == 128 + sig
    assert left(cloud, run_dir.name, pgs) == NOTHING
    keys = {o["Key"] for o in cloud["s3"].list_objects_v2(Bucket=cloud["bucket"])["Contents"]}
    assert f"scalelab/{run_dir.name}/control/stop" in keys  # the nodes were asked to checkpoint first
    info = json.loads((run_dir / "launch.json").read_text())
    assert info["state"] == "CANCELLED" and signal.Signals(sig).name in info["detail"]
    events = [json.loads(x) for x in (run_dir / "records" / "aws-events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "aws_end" and events[-1]["state"] == "CANCELLED"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_launch_command_leaves_nothing(cloud, tmp_path, sig):
    """The same through the real `launch` command in its own process: the signal comes from outside
    (`kill`, `timeout`, a closed terminal), the command exits 128 + the signal, nothing of the run is left."""
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": cloud["url"], "AWS_DEFAULT_REGION": REGION,
           "AWS_ACCESS_KEY_ID": CREDS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": CREDS["aws_secret_access_key"],
           "PYTHONFAULTHANDLER": "1"}  # a launcher that does not stop is aborted below: its stack says where it waited
    opts = [f"--backend-opt={kv}" for kv in (f"wheel={cloud['wheel']}", "poll_s=0.2", "interruption_grace_s=0")]
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", "--backend", "aws", "--bucket", cloud["bucket"],
                             "--region", REGION, "--nodes", "2", "--engine", "ddp", "--steps", "6",
                             "--placement-group", "none", *opts, "--runs-dir", "runs"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not _following(tmp_path / "runs"):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        run_dir = next((tmp_path / "runs").iterdir())
        assert left(cloud, run_dir.name) == {"instances": 2, "volumes": 2, "security_groups": 1, "placement_groups": 0}
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # once on CI (2026-12-02); 4 s here, where 150 repeats under load never hung
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"the launcher did not stop within 120 s of {signal.Signals(sig).name}; its stack:\n{err[-6000:]}")
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and "every process of the run was stopped" in err
    assert left(cloud, run_dir.name) == NOTHING
    assert json.loads((run_dir / "launch.json").read_text())["state"] == "CANCELLED"


def test_a_pull_runs_in_the_launchers_thread_and_leaves_whole_files(cloud, tmp_path, monkeypatch):
    """The follow loop pulls S3 on every poll, and that is where a stop signal raises `Interrupted`: a pull
    starts no thread (no transfer manager's pool for the cancel, or the interpreter's exit, to wait for),
    skips the launcher's own control/ files (its heartbeat changes on every poll), and a download cut
    short keeps the copy it had, with no partial file beside it."""
    import threading

    from scalelab.aws import mirror

    s3, bucket, prefix = cloud["s3"], cloud["bucket"], "scalelab/pull-test"
    status = f"{prefix}/status/gen-0/i-1.json"
    s3.put_object(Bucket=bucket, Key=status, Body=b'{"state": "RUNNING"}')
    s3.put_object(Bucket=bucket, Key=f"{prefix}/control/launcher.json", Body=b'{"time": 1}')
    run = tmp_path / "run"
    run.mkdir()
    info = {"bucket": bucket, "prefix": prefix, "etags": {}}
    started, start = [], threading.Thread.start  # moto's server starts its own threads, from its own thread

    def counted(thread):
        if threading.current_thread() is threading.main_thread():
            started.append(thread.name)
        start(thread)
    monkeypatch.setattr(threading.Thread, "start", counted)
    etags = mirror.pull(s3, run, info)
    copy = run / mirror.MIRROR_DIR
    assert set(etags) == {"status/gen-0/i-1.json"} and not (copy / "control").exists()
    assert json.loads((copy / "status/gen-0/i-1.json").read_text()) == {"state": "RUNNING"}
    assert started == []

    class CutShort:  # the stop signal arrives after the first chunk of the next download
        def __getattr__(self, name):
            return getattr(s3, name)

        def get_object(self, **kw):
            body = s3.get_object(**kw)["Body"]

            def chunks(size):
                yield body.read(4)
                raise Interrupted(signal.SIGTERM)
            return {"Body": type("Body", (), {"iter_chunks": staticmethod(chunks)})()}

    s3.put_object(Bucket=bucket, Key=status, Body=b'{"state": "COMPLETED"}')
    with pytest.raises(Interrupted):
        mirror.pull(CutShort(), run, {**info, "etags": etags})
    assert json.loads((copy / "status/gen-0/i-1.json").read_text()) == {"state": "RUNNING"}
    assert [p.name for p in copy.rglob("*") if p.is_file()] == ["i-1.json"]
    assert started == []


def _following(runs: Path) -> bool:
    """A launcher's follow loop has seen its run RUNNING (its instances exist)."""
    states = [json.loads(p.read_text()).get("state") for p in runs.glob("*/launch.json")] if runs.exists() else []
    return states == ["RUNNING"]


def test_resume_beside_running_instances_is_refused(cloud, tmp_path):
    """The launcher was SIGKILLed: its instances go on until its heartbeat is old. A `launch resume`
    then must neither start a second generation beside them nor stop them; it says what to do."""
    run_dir = run_dir_for(tmp_path)
    submit(backend(cloud), make_spec(), run_dir)
    first = {n["InstanceId"] for n in live(cloud, run_dir.name)}
    with pytest.raises(ScalelabError, match=r"still running \(2 instance\(s\) up.*launch cancel"):
        execute(backend(cloud), make_spec(), run_dir)  # what `launch resume` does
    assert {n["InstanceId"] for n in live(cloud, run_dir.name)} == first
    cancel(backend(cloud), run_dir)
    assert left(cloud, run_dir.name) == NOTHING


def test_nodes_that_lost_their_launcher_end_the_run(cloud, tmp_path):
    """A launcher that was suspended longer than heartbeat_timeout_min finds that its nodes stopped
    themselves (with a checkpoint): the run ends FAILED with the way on, not with a replacement."""
    be = backend(cloud, instance_type="g3.4xlarge", spot=True)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=1, engine={"name": "single"}), run_dir))
    fake = FakeNodes(cloud, run_dir)

    def instance_side() -> None:
        (node,) = fake.heartbeat(0)
        fake.put(f"status/gen-0/{node['InstanceId']}.json", {"state": "interrupted", "reason": "launcher_lost",
                                                             "exit_code": 143})

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "FAILED" and "no heartbeat from the launcher for 10 min" in status.detail
    assert f"launch resume {run_dir}" in status.detail
    assert td.instances(cloud["ec2"], run_dir.name, None, 1) == []  # no replacement generation
    assert left(cloud, run_dir.name) == NOTHING


def test_failed_trainer_fails_the_run(cloud, tmp_path):
    be = backend(cloud, instance_type="g3.4xlarge")
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=1, engine={"name": "single"}), run_dir))
    fake = FakeNodes(cloud, run_dir)

    def instance_side() -> None:
        ns = fake.heartbeat(0)
        fake.put("logs/gen-0/node-0-trainer.log", b"training...\n")  # the rank's words are in its records only
        error = {"kind": "error", "rank": 0, "world": 1, "time": time.time(),
                 "message": "training diverged at step 3 (loss nan); lower --lr"}
        fake.put("records/gen-0/rank-0.jsonl", (json.dumps(error) + "\n").encode())
        fake.put(f"status/gen-0/{ns[0]['InstanceId']}.json", {"state": "failed", "exit_code": 2})

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "FAILED" and "exit code 2" in status.detail
    assert "training diverged" not in be.logs(run_dir)
    message = str(failure(be, run_dir, status))  # the launcher's one line, from the mirrored error record
    assert message.startswith("training diverged at step 3 (loss nan); lower --lr") and run_dir.name in message
    assert live(cloud, run_dir.name) == []


def test_cancel_from_another_process(cloud, tmp_path):
    be = backend(cloud)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(), run_dir))
    other = backend(cloud)  # `launch cancel RUN_DIR` builds its own backend
    cancel(other, run_dir)
    keys = {o["Key"] for o in cloud["s3"].list_objects_v2(Bucket=cloud["bucket"])["Contents"]}
    assert f"scalelab/{run_dir.name}/control/stop" in keys  # the nodes were asked to checkpoint
    assert live(cloud, run_dir.name) == []
    assert wait(be, run_dir).state == "CANCELLED"


def test_a_cancel_from_elsewhere_ends_the_followed_run_once_the_leader_saved_and_replaces_nothing(cloud, tmp_path):
    """`launch cancel` in another terminal while this launcher follows: the instances stop on the stop request.
    The second instance says so first; the follower must neither replace anything (it read `interrupted` as
    a spot interruption and started a new generation, found on two played instances) nor end the run before
    the leader has said it saved its checkpoint (the teardown would cut that upload)."""
    be = backend(cloud, instance_type="g3.4xlarge", spot=True)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=2), run_dir))
    fake = FakeNodes(cloud, run_dir)
    ticks = {"n": 0, "leader_said_at": None}

    def instance_side() -> None:
        ticks["n"] += 1
        first, second = fake.heartbeat(0)
        fake.put(f"status/gen-0/{second['InstanceId']}.json", {"state": "interrupted", "reason": "stop_requested",
                                                               "exit_code": 143, "index": 1})
        if ticks["n"] == 20:  # the leader, still uploading its checkpoint until now
            fake.put(f"status/gen-0/{first['InstanceId']}.json", {"state": "interrupted", "reason": "stop_requested",
                                                                  "exit_code": 143, "index": 0})
            ticks["leader_said_at"] = ticks["n"]

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "CANCELLED" and "launch cancel" in status.detail, status.detail
    assert ticks["leader_said_at"] == 20 and ticks["n"] >= 20  # it waited for the leader
    assert td.instances(cloud["ec2"], run_dir.name, None, 1) == []  # no replacement generation
    assert left(cloud, run_dir.name) == NOTHING


def test_instances_ended_by_a_cancel_before_their_statuses_arrived_are_not_replaced(cloud, tmp_path):
    """`launch cancel` elsewhere put its stop request and terminated the instances before either's final
    status reached S3 (the follower then read them as lost capacity and asked for a new generation: AWS
    refused it, the cancel had deleted the security group; a CI run of tests/test_aws_two_instances.py).
    A stop request in S3 means a cancel: CANCELLED, nothing replaced; without one the same sight is an
    interruption (the spot tests below)."""
    be = backend(cloud, instance_type="g3.4xlarge", spot=True)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=2), run_dir))
    fake = FakeNodes(cloud, run_dir)
    nodes = fake.heartbeat(0)
    fake.put("control/stop", b"cancel")
    cloud["ec2"].terminate_instances(InstanceIds=[n["InstanceId"] for n in nodes])
    status = wait(be, run_dir)
    assert status.state == "CANCELLED" and "launch cancel" in status.detail, status.detail
    assert td.instances(cloud["ec2"], run_dir.name, None, 1) == []  # no replacement generation
    assert left(cloud, run_dir.name) == NOTHING


def test_a_cancel_after_the_nodes_started_their_ranks_waits_for_the_checkpoint_before_any_record(cloud, tmp_path,
                                                                                                  capsys):
    """The nodes' heartbeats are in S3 (their agents started the ranks) but no record yet (records reach S3 a
    poll or more later): `launch cancel` must still wait for the leader's checkpoint. It took "no records" for
    "nothing to save" and terminated the instances at once, cutting the checkpoint of ranks already at step 6
    (a CI run of tests/test_aws_two_instances.py). With neither, it stops at once (the test below the SIGINT)."""
    be = backend(cloud, instance_type="g3.4xlarge")
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=2), run_dir))
    fake = FakeNodes(cloud, run_dir)
    first, second = fake.heartbeat(0)
    polls = {"n": 0}

    class LeaderSavesLater:
        """moto's S3, where the leader's final status appears at the cancel's third look for it, and the
        second instance's (written after its last records) at the fifth."""

        def list_objects_v2(self, **kw):
            if kw["Prefix"].endswith("status/gen-0/"):
                polls["n"] += 1
                for look, node in ((3, first), (5, second)):
                    if polls["n"] == look:
                        fake.put(f"status/gen-0/{node['InstanceId']}.json", {"state": "interrupted",
                                                                             "reason": "stop_requested"})
            return cloud["s3"].list_objects_v2(**kw)

        def __getattr__(self, name):
            return getattr(cloud["s3"], name)

    other = AwsBackend({**backend(cloud).options, "poll_s": 0.2, "interruption_grace_s": 60.0},
                       clients={"ec2": cloud["ec2"], "s3": LeaderSavesLater()})
    cancel(other, run_dir)
    said = capsys.readouterr().err
    assert "asked the ranks of its 2 started instance(s) to checkpoint" in said and "no rank has started" not in said, said
    assert polls["n"] >= 5, "it did not wait for the leader's status, then the other instance's"
    assert left(cloud, run_dir.name) == NOTHING


def test_a_failure_beside_a_stop_request_is_said_as_the_failure(cloud, tmp_path):
    """One instance failed (its error said), the other stopped on a stop request: the run FAILED with the
    error, not CANCELLED with "every rank stopped with a checkpoint"."""
    be = backend(cloud, instance_type="g3.4xlarge")
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=2), run_dir))
    fake = FakeNodes(cloud, run_dir)

    def instance_side() -> None:
        first, second = fake.heartbeat(0)
        fake.put(f"status/gen-0/{first['InstanceId']}.json", {"state": "failed", "error": "checkpoint write failed"})
        fake.put(f"status/gen-0/{second['InstanceId']}.json", {"state": "interrupted", "reason": "stop_requested"})

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "FAILED" and "checkpoint write failed" in status.detail, status.detail
    assert left(cloud, run_dir.name) == NOTHING


# ---- spot interruption: checkpoint, replace (fallback type), resume, record the lost time -----------


class NoCapacity:
    """moto always has capacity; AWS often has none for a spot type. Refuse `instance_type` after the first generation."""

    def __init__(self, real, instance_type: str) -> None:
        self.real, self.instance_type = real, instance_type

    def run_instances(self, **kw):
        gen = [t["Value"] for s in kw["TagSpecifications"] for t in s["Tags"] if t["Key"] == "scalelab:generation"][0]
        if kw["InstanceType"] == self.instance_type and gen != "0":
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no capacity"}}, "RunInstances")
        return self.real.run_instances(**kw)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_spot_interruption_is_replaced_and_resumed(cloud, tmp_path):
    be = backend(cloud, instance_type="g3.4xlarge", spot=True, fallback_instance_types=["p3.2xlarge"])
    be._clients["ec2"] = NoCapacity(cloud["ec2"], "g3.4xlarge")
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(), run_dir))
    fake = FakeNodes(cloud, run_dir)
    first = [n["InstanceId"] for n in fake.nodes(0)]

    def instance_side() -> None:
        if 0 in fake.polls and fake.polls[0] >= 2 and fake.nodes(1):
            if fake.tick(1) == 1:
                ns = fake.heartbeat(1)
                for rank in range(2):
                    fake.records(1, rank, range(4, 7), world=2, resumed=3)
                fake.status(1, ns, "completed")
            return
        n = fake.tick(0)
        if n == 1:
            fake.heartbeat(0)
            for rank in range(2):
                fake.records(0, rank, range(1, 4), world=2, checkpoint=3)
        elif n == 2:  # AWS gives the two-minute notice to node 1 and then takes it back
            ns = fake.nodes(0)
            fake.put(f"events/gen-0/{ns[1]['InstanceId']}.json", {"event": "spot_interruption",
                                                                  "notice": {"action": "terminate"}})
            fake.status(0, ns, "interrupted")
            cloud["ec2"].terminate_instances(InstanceIds=[ns[1]["InstanceId"]])

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "COMPLETED", status.detail
    second = td.instances(cloud["ec2"], run_dir.name, None, 1)
    assert {n["InstanceType"] for n in second} == {"p3.2xlarge"} and not set(first) & {n["InstanceId"] for n in second}
    steps = [json.loads(x) for x in (run_dir / "records" / "rank-0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1, 2, 3, 4, 5, 6]
    events = [json.loads(x) for x in (run_dir / "records" / "aws-events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert "spot_interruption" in kinds and "capacity_replaced" in kinds
    hit = next(e for e in events if e["event"] == "spot_interruption")
    assert hit["instance_id"] == first[1] and hit["last_step"] == 3
    assert next(e for e in events if e["event"] == "capacity_replaced")["resume_from_step"] == 3
    end = events[-1]
    # gen 0's last step at t0+3, gen 1's first at t0+100+4: 101 s without training
    assert end["interruptions"] == 1 and end["lost_s"] == pytest.approx(101.0)
    assert {"g3.4xlarge/spot", "p3.2xlarge/spot"} == set(end["instance_seconds"])
    assert td.instances(cloud["ec2"], run_dir.name, td.LIVE_STATES) == []


def test_a_replacement_waits_for_the_other_instances_last_records(cloud, tmp_path):
    """A spot notice to the leader: it checkpoints at step 3 and says `interrupted`; the second instance
    uploads its rank's steps 1-3 with its own status three polls later. The generation is torn down and
    replaced only then, so rank 1's merged records hold every step (the replacement does 4-6)."""
    be = backend(cloud, spot=True)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(), run_dir))
    fake, replaced_at = FakeNodes(cloud, run_dir), []

    def instance_side() -> None:
        if fake.nodes(1):
            replaced_at.append(fake.polls[0])
            if fake.tick(1) == 1:
                ns = fake.heartbeat(1)
                for rank in range(2):
                    fake.records(1, rank, range(4, 7), world=2, resumed=3)
                fake.status(1, ns, "completed")
            return
        n, ns = fake.tick(0), fake.nodes(0)
        if n == 1:
            fake.heartbeat(0)
            for rank in range(2):
                fake.records(0, rank, range(0), world=2)  # the start records, uploaded early
        elif n == 2:
            fake.put(f"events/gen-0/{ns[0]['InstanceId']}.json", {"event": "spot_interruption",
                                                                  "notice": {"action": "terminate"}})
            fake.records(0, 0, range(1, 4), world=2, checkpoint=3)
            fake.put(f"status/gen-0/{ns[0]['InstanceId']}.json", {"state": "interrupted", "reason": "spot_notice",
                                                                  "index": 0, "notice_on": ns[0]["InstanceId"]})
        elif n == 5:
            fake.records(0, 1, range(1, 4), world=2, checkpoint=3)
            fake.put(f"status/gen-0/{ns[1]['InstanceId']}.json", {"state": "interrupted", "reason": "spot_notice",
                                                                  "index": 1, "notice_on": ns[0]["InstanceId"]})

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "COMPLETED", status.detail
    assert replaced_at and replaced_at[0] >= 5, replaced_at
    steps = [json.loads(x) for x in (run_dir / "records" / "rank-1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1, 2, 3, 4, 5, 6]
    assert left(cloud, run_dir.name) == NOTHING


def test_interruptions_beyond_the_limit_fail_cleanly(cloud, tmp_path):
    be = backend(cloud, spot=True, max_replacements=0)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(), run_dir))
    fake = FakeNodes(cloud, run_dir)

    def instance_side() -> None:
        ns = fake.heartbeat(0)
        if ns:
            cloud["ec2"].terminate_instances(InstanceIds=[ns[0]["InstanceId"]])  # reclaimed without a word

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "FAILED" and "launch resume" in status.detail
    assert live(cloud, run_dir.name) == []


# ---- launch aws gc and the credential message, through the real CLI --------------------------------


def test_gc_terminates_what_a_crash_left(cloud, tmp_path):
    ec2 = cloud["ec2"]
    run_id = f"crashed-{uuid.uuid4().hex[:6]}"
    tag = [{"Key": "scalelab:run-id", "Value": run_id}]
    ec2.run_instances(ImageId="ami-12345678", InstanceType="g3.4xlarge", MinCount=2, MaxCount=2,
                      TagSpecifications=[{"ResourceType": "instance", "Tags": tag}])
    ec2.create_security_group(GroupName=f"scalelab-{run_id}", Description="left over",
                              TagSpecifications=[{"ResourceType": "security-group", "Tags": tag}])
    ec2.create_volume(AvailabilityZone=f"{REGION}a", Size=100, TagSpecifications=[{"ResourceType": "volume", "Tags": tag}])
    env = {"AWS_ENDPOINT_URL": cloud["url"], "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "AWS_DEFAULT_REGION": REGION, "AWS_MAX_ATTEMPTS": "1"}
    out = launch("aws", "gc", "--run-id", run_id, "--dry-run", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("instance i-") == 2 and "security-group" in out.stdout and "volume vol-" in out.stdout
    assert left(cloud, run_id)["instances"] == 2
    out = launch("aws", "gc", "--run-id", run_id, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "terminated 2 instance(s), deleted 1 volume(s)" in out.stdout
    assert left(cloud, run_id) == NOTHING


@pytest.mark.slow
def test_no_credentials_is_one_clear_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true", AWS_ENDPOINT_URL="http://127.0.0.1:9")
    out = _launch_clean(tmp_path, env)
    assert out.returncode == 2, out.stderr
    assert "no AWS credentials" in out.stderr and "aws configure" in out.stderr and "Traceback" not in out.stderr
    out = _launch_clean(tmp_path, env, "aws", "gc")
    assert out.returncode == 2 and "no AWS region" in out.stderr
    out = _launch_clean(tmp_path, env, "aws", "gc", "--region", REGION)
    assert out.returncode == 2 and "no AWS credentials" in out.stderr


def test_an_endpoint_that_cannot_be_reached_is_one_line_and_leaves_no_run_directory(tmp_path):
    """AWS not reachable (here a closed port on loopback): the first request of the launch, the look for instances
    of the run, raised botocore's EndpointConnectionError as a 158-line traceback, exit 1, and left a run directory
    that `launch ls` showed NEW. Now one line naming the endpoint, exit 2, nothing left, as without credentials."""
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true"}
    out = _launch_clean(tmp_path, env, "--backend", "aws", "--bucket", "rev-bkt", "--region", REGION, "--yes",
                        "--runs-dir", "runs")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("launch: error:")]
    assert len(errors) == 1 and "cannot reach AWS" in errors[0] and "http://127.0.0.1:9" in errors[0], out.stderr
    assert "nothing was started" in errors[0]
    assert list((tmp_path / "runs").iterdir()) == [] if (tmp_path / "runs").exists() else True


def test_the_status_of_a_run_aws_cannot_be_reached_for_is_one_line(tmp_path):
    """`launch status` of an AWS run no launcher follows, AWS not reachable: the launch's first request says so in
    one line (above), but the status's look for the run's instances raised botocore's EndpointConnectionError as a
    149-line traceback, exit 1 (`launch ls` and a resume's check of the run failed the same way). Now the same one
    line, exit 2, from AwsBackend.status, which every one of them asks."""
    _unfollowed_run(tmp_path / "runs" / "r1")
    out = _launch_clean(tmp_path, UNREACHABLE_ENV, "status", "runs/r1")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("launch: error:")]
    assert len(errors) == 1 and "cannot reach AWS" in errors[0] and "http://127.0.0.1:9" in errors[0], out.stderr
    assert "nothing was changed" in errors[0], out.stderr


# AWS out of reach: nothing listens on port 9 of loopback; one attempt, no instance metadata to ask for keys
UNREACHABLE_ENV = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x",
                   "AWS_SECRET_ACCESS_KEY": "y", "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true"}


def _unfollowed_run(run_dir: Path) -> Path:
    """An AWS run directory as a launcher leaves it while the run goes on (state not ended), run id r1 in
    bucket rev-bkt, which no launcher follows."""
    from scalelab.core.rundir import start_state
    from scalelab.core.spec import save_spec

    run_dir.mkdir(parents=True)
    save_spec(Spec.from_dict({"model": "nmt-tiny", "backend": "aws",
                              "backend_options": {"bucket": "rev-bkt", "region": REGION}}), run_dir)
    start_state(run_dir, backend="aws", run_id="r1", region=REGION, bucket="rev-bkt", prefix="scalelab/r1",
                node_types=["g5.xlarge"], started=time.time(), generation=0, instances=[], refs={}, replacements=0,
                requests=[])
    return run_dir


def test_a_cancel_aws_cannot_be_reached_for_is_one_line_saying_the_instances_may_still_run(tmp_path):
    """`launch cancel` of an AWS run, AWS not reachable: the stop request, the last mirror and the teardown each
    raised botocore's EndpointConnectionError, a 292-line traceback, exit 1, after the runner had recorded the
    run CANCELLED. Now one line, exit 2: the run is recorded CANCELLED here, its instances may still run, and how
    to finish the job (the cancel again, which `_ended_already` passes to the backend, or `launch aws gc`)."""
    import json as json_

    _unfollowed_run(tmp_path / "runs" / "r1")
    for _ in range(2):  # the second: a run recorded CANCELLED already, whose instances the backend still stops
        out = _launch_clean(tmp_path, UNREACHABLE_ENV, "cancel", "runs/r1")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("launch: error: cannot reach AWS while terminating"), out.stderr
        assert "http://127.0.0.1:9" in lines[0], lines[0]
        assert "run runs/r1 is recorded CANCELLED here, but its instances may still be running" in lines[0], lines[0]
        assert "once AWS can be reached, `launch cancel runs/r1` again or `launch aws gc --run-id r1 --region " \
               f"{REGION}` terminates them" in lines[0], lines[0]
        state = json_.loads((tmp_path / "runs" / "r1" / "launch.json").read_text())
        assert state["state"] == "CANCELLED", state


def test_a_cancel_whose_stop_request_aws_refuses_still_terminates_and_says_so(cloud, tmp_path, capsys):
    """`launch cancel` where S3 refuses the stop request (a bucket policy): the teardown after it ran, the instances
    went, yet the cancel ended in botocore's ClientError traceback, the run's end unrecorded. Now a warning line
    naming the refusal and that the instances were terminated all the same, and the cancel ends normally."""
    from botocore.exceptions import ClientError

    be = backend(cloud)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(), run_dir))

    class Refusing:
        def __getattr__(self, name):
            return getattr(cloud["s3"], name)

        def put_object(self, **kw):
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "PutObject")

    other = AwsBackend(backend(cloud).options, clients={"ec2": cloud["ec2"], "s3": Refusing()})
    capsys.readouterr()
    status = cancel(other, run_dir)
    assert status.state == "CANCELLED", status
    assert live(cloud, run_dir.name) == []
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"launch: warning: AWS refused PutObject while asking its ranks to checkpoint: AccessDenied: Access "
                   f"Denied; its instances were terminated all the same; its last records and logs may be only in S3 "
                   f"(s3://{cloud['bucket']}/scalelab/{run_dir.name}/)"], err


def test_the_logs_of_a_run_aws_cannot_be_reached_for_are_the_local_copy_said_once(tmp_path, monkeypatch, capsys):
    """`launch logs` of a running AWS run, AWS not reachable: the mirror before the logs raised botocore's
    EndpointConnectionError, a 149-line traceback (only a ScalelabError fell back to the local copy). Now the
    logs mirrored last time, and one line on stderr saying so and why, once however often `-f` asks."""
    for key, value in UNREACHABLE_ENV.items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    run_dir = _unfollowed_run(tmp_path / "runs" / "r1")
    log = run_dir / "s3" / "logs" / "gen-0" / "node-0-trainer.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 3 of 6\n")
    be = AwsBackend({"bucket": "rev-bkt", "region": REGION}, endpoint_url="http://127.0.0.1:9")
    assert "step 3 of 6" in be.logs(run_dir) and "step 3 of 6" in be.logs(run_dir)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"launch: showing the local copy of the logs as of the last mirror "
                                               f"({run_dir / 's3'}): AWS could not be reached (Could not connect to "
                                               f"the endpoint URL: \"http://127.0.0.1:9/"), err


def test_launch_logs_of_a_run_aws_cannot_be_reached_for_prints_the_local_copy(tmp_path):
    """The command itself: the backend gave the local copy, but the progress line after it asked the run's state,
    whose one-line "cannot reach AWS" error ended the command with exit 2 and no logs. Now the logs, then a
    progress line saying the state is unknown and why, exit 0."""
    run_dir = _unfollowed_run(tmp_path / "runs" / "r1")
    (run_dir / "s3" / "logs" / "gen-0").mkdir(parents=True)
    (run_dir / "s3" / "logs" / "gen-0" / "node-0-trainer.log").write_text("step 3 of 6\n")
    out = _launch_clean(tmp_path, UNREACHABLE_ENV, "logs", "runs/r1")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "step 3 of 6" in out.stdout, out.stdout
    (progress,) = [line for line in out.stdout.splitlines() if line.startswith("[progress]")]
    assert "the run's state is unknown: cannot reach AWS" in progress, out.stdout


def test_the_logs_of_a_run_whose_listing_aws_refuses_are_the_local_copy(cloud, tmp_path, capsys):
    """The same where AWS answers but refuses the listing (here: the bucket is gone): the local copy, and AWS's
    refusal in a few words."""
    run_dir = _unfollowed_run(tmp_path / "runs" / "r1")  # bucket rev-bkt: none in moto
    (run_dir / "s3" / "logs" / "gen-0").mkdir(parents=True)
    (run_dir / "s3" / "logs" / "gen-0" / "node-0-trainer.log").write_text("step 3 of 6\n")
    assert "step 3 of 6" in backend(cloud).logs(run_dir)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("AWS refused ListObjectsV2 (NoSuchBucket: The specified bucket does "
                                             "not exist)"), err


def test_a_ranks_error_record_set_aside_reaches_the_launcher(cloud, tmp_path):
    """A rank whose records file cannot grow (a quota) writes its `error` record to records/error-rank-R.jsonl
    beside it (core.records `errors_aside`), which the launcher reads with the rank's file. On AWS neither the
    node's upload nor the launcher's mirror took that file, so the run's one line was not the rank's words. Now
    the mirror merges it into RUN_DIR/records/ (across generations, as rank-R.jsonl) and the failure says it."""
    be = backend(cloud, instance_type="g3.4xlarge")
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=1, engine={"name": "single"}), run_dir))
    fake = FakeNodes(cloud, run_dir)
    error = {"kind": "error", "rank": 0, "world": 1, "time": time.time(),
             "message": "cannot write records runs/x/records/rank-0.jsonl: File too large"}

    def instance_side() -> None:
        ns = fake.heartbeat(0)
        fake.records(0, 0, range(1, 4), world=1)  # then its file could take no more: no error, no end in it
        fake.put("records/gen-0/error-rank-0.jsonl", (json.dumps(error) + "\n").encode())
        fake.put(f"status/gen-0/{ns[0]['InstanceId']}.json", {"state": "failed", "exit_code": 2})

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "FAILED", status
    message = str(failure(be, run_dir, status))
    assert message.startswith("cannot write records runs/x/records/rank-0.jsonl: File too large"), message
    assert (run_dir / "records" / "error-rank-0.jsonl").is_file()
    assert live(cloud, run_dir.name) == []


def test_error_records_set_aside_are_merged_across_generations_in_order(cloud, tmp_path):
    """error-rank-R.jsonl of each generation (gen-G in S3) merged into RUN_DIR/records/error-rank-R.jsonl in
    generation order, as rank-R.jsonl is (gen-10 after gen-2: by number), where `read_errors` finds them."""
    from scalelab.aws import mirror
    from scalelab.core.records import read_errors

    s3, bucket, prefix = cloud["s3"], cloud["bucket"], "scalelab/aside-test"
    for gen in (10, 2):
        rec = {"kind": "start", "rank": 0, "world": 1, "time": 100.0 + gen, "resumed_from_step": None}
        s3.put_object(Bucket=bucket, Key=f"{prefix}/records/gen-{gen}/rank-0.jsonl", Body=(json.dumps(rec) + "\n").encode())
        err = {"kind": "error", "rank": 0, "world": 1, "time": 100.0 + gen, "message": f"generation {gen}'s error"}
        s3.put_object(Bucket=bucket, Key=f"{prefix}/records/gen-{gen}/error-rank-0.jsonl",
                      Body=(json.dumps(err) + "\n").encode())
    run = tmp_path / "run"
    run.mkdir()
    mirror.pull(s3, run, {"bucket": bucket, "prefix": prefix, "etags": {}})
    assert [r["message"] for r in read_errors(run)] == ["generation 2's error", "generation 10's error"]


def _launch_clean(cwd: Path, env: dict, *args: str):
    import subprocess
    import sys

    from conftest import ROOT

    args = args or ("--backend", "aws", "--bucket", "bkt", "--region", REGION, "--steps", "2", "--warmup-steps", "1")
    return subprocess.run([sys.executable, "-m", "scalelab.launcher.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT)}, timeout=120)


@pytest.mark.parametrize("flags, message", [(["--max-usd", "1"], "over --max-usd 1"),
                                            ([], "pass --yes to launch")])
def test_a_launch_over_its_price_limit_sends_nothing(cloud, tmp_path, flags, message):
    """`--max-usd` under the expected cost, or a cost over the confirmation threshold with no terminal
    and no --yes: the command refuses before any request; moto has no new instance, group or object."""
    env = {"AWS_ENDPOINT_URL": cloud["url"], "AWS_DEFAULT_REGION": REGION, "SCALELAB_PRICES": str(tmp_path / "none.json"),
           "AWS_ACCESS_KEY_ID": CREDS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": CREDS["aws_secret_access_key"]}
    before = (cloud["ec2"].describe_instances()["Reservations"], cloud["ec2"].describe_security_groups()["SecurityGroups"])
    out = launch("--backend", "aws", "--bucket", cloud["bucket"], "--region", REGION, "--nodes", "4",
                 "--engine", "ddp", "--steps", "400000", f"--backend-opt=wheel={cloud['wheel']}",
                 "--placement-group", "none", "--runs-dir", "runs", *flags, cwd=tmp_path, env=env)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    assert "expected cost of the launch: $" in out.stderr
    assert (cloud["ec2"].describe_instances()["Reservations"],
            cloud["ec2"].describe_security_groups()["SecurityGroups"]) == before
    assert cloud["s3"].list_objects_v2(Bucket=cloud["bucket"]).get("KeyCount", 0) == 0
    assert not (tmp_path / "runs").exists()


# ---- the wheel built for a launch (issue 27, item 10) ----------------------------------------------


@pytest.mark.slow
def test_a_launch_leaves_no_wheel_directory(cloud, tmp_path, monkeypatch):
    """Without --backend-opt wheel=, the launch builds the wheel of this checkout in a temporary
    directory; once uploaded it is removed (every launch used to leave a scalelab-wheel-* directory)."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches the directory: read TMPDIR again
    assert tempfile.gettempdir() == str(tmp) and list(tmp.glob("scalelab-wheel-*")) == []
    be = backend(cloud, wheel="")
    run_dir = run_dir_for(tmp_path)
    try:
        with wheel_build_lock():  # its `pip wheel` builds in the source tree, as build_wheel's does
            submit(be, make_spec(), run_dir)
        key = f"scalelab/{run_dir.name}/package/scalelab-0.1.0-py3-none-any.whl"
        body = cloud["s3"].get_object(Bucket=cloud["bucket"], Key=key)["Body"].read()
        assert body[:2] == b"PK" and len(body) > 10_000  # the real wheel (a zip file) went up
    finally:
        cancel(be, run_dir)
    assert list(tmp.glob("scalelab-wheel-*")) == []
    assert left(cloud, run_dir.name) == NOTHING


# ---- gc leaves alone a run a launcher follows (issue 27, item 2) ------------------------------------


def _gc_env(cloud) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": cloud["url"], "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
            "AWS_DEFAULT_REGION": REGION, "AWS_MAX_ATTEMPTS": "1"}


@pytest.mark.slow
def test_gc_skips_a_run_whose_launcher_is_live_and_cleans_a_stale_one(cloud, tmp_path):
    """Two runs: one a launcher follows (heartbeat just written, fresh for 10 min), one whose launcher
    was killed (heartbeat older than its own 1.2 s timeout). `launch aws gc` with no --run-id removes
    the stale run only, says which it skipped and why; the live launcher follows on unharmed."""
    followed, killed = backend(cloud), backend(cloud, heartbeat_timeout_min=0.02)
    live_dir, dead_dir = run_dir_for(tmp_path), run_dir_for(tmp_path)
    followed.schedule(followed.submit_dryrun(make_spec(), live_dir))
    killed.schedule(killed.submit_dryrun(make_spec(), dead_dir))
    time.sleep(2.5)  # the killed launcher's heartbeat goes stale; the followed one beats again:
    followed.poll(live_dir)
    out = launch("aws", "gc", cwd=tmp_path, env=_gc_env(cloud))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"run {live_dir.name}: skipped, a launcher still follows it" in out.stderr
    assert "wrote its heartbeat" in out.stderr and f"--run-id {live_dir.name} --force" in out.stderr
    assert f"run {dead_dir.name}: terminated 2 instance(s)" in out.stdout
    assert f"run {live_dir.name}: terminated" not in out.stdout
    assert left(cloud, dead_dir.name) == NOTHING
    assert left(cloud, live_dir.name) == {"instances": 2, "volumes": 2, "security_groups": 1, "placement_groups": 0}
    assert followed.poll(live_dir).state == "RUNNING"  # its group and instances are all there
    out = launch("aws", "gc", "--force", cwd=tmp_path, env=_gc_env(cloud))
    assert out.returncode == 2 and "--force: name the one run" in out.stderr and "Traceback" not in out.stderr
    assert left(cloud, live_dir.name)["instances"] == 2
    out = launch("aws", "gc", "--run-id", live_dir.name, "--force", cwd=tmp_path, env=_gc_env(cloud))
    assert out.returncode == 0 and "(--force)" in out.stderr, out.stderr
    assert left(cloud, live_dir.name) == NOTHING


def test_gc_cleans_what_an_ended_launcher_kept(cloud, tmp_path):
    """A launcher that tore its run down marks its heartbeat ended: gc need not wait for it to age."""
    be = backend(cloud)
    run_dir = run_dir_for(tmp_path)
    submit(be, make_spec(), run_dir)
    cancel(be, run_dir)
    beat = json.loads(cloud["s3"].get_object(Bucket=cloud["bucket"],
                                             Key=f"scalelab/{run_dir.name}/control/launcher.json")["Body"].read())
    assert beat["ended"] is True and beat["timeout_s"] == 600
    tag = [{"Key": "scalelab:run-id", "Value": run_dir.name},
           {"Key": "scalelab:heartbeat", "Value": f"s3://{cloud['bucket']}/scalelab/{run_dir.name}/control/launcher.json"}]
    cloud["ec2"].create_security_group(GroupName=f"kept-{run_dir.name}", Description="kept by a teardown",
                                       TagSpecifications=[{"ResourceType": "security-group", "Tags": tag}])
    out = launch("aws", "gc", "--run-id", run_dir.name, cwd=tmp_path, env=_gc_env(cloud))
    assert out.returncode == 0 and "skipped" not in out.stderr, out.stderr
    assert "1 security group(s)" in out.stdout and left(cloud, run_dir.name) == NOTHING


# ---- Ctrl-C: say what the stop waits for; no wait without ranks; a second Ctrl-C at once (issue 27, item 9)


def _start_following(cloud, tmp_path: Path):
    """The real `launch` command on moto with the default interruption_grace_s (150 s), until its follow
    loop runs; returns (process, run directory, stderr file). Its instances exist but run nothing."""
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": cloud["url"], "AWS_DEFAULT_REGION": REGION,
           "AWS_ACCESS_KEY_ID": CREDS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": CREDS["aws_secret_access_key"]}
    err = tmp_path / "stderr.txt"
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.launcher.cli", "--backend", "aws", "--bucket", cloud["bucket"],
                             "--region", REGION, "--nodes", "2", "--engine", "ddp", "--steps", "6",
                             "--placement-group", "none", f"--backend-opt=wheel={cloud['wheel']}",
                             "--backend-opt=poll_s=0.5", "--runs-dir", "runs"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err.open("w"), text=True)
    deadline = time.time() + 120
    while not _following(tmp_path / "runs"):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the launch did not start following: {err.read_text()}")
        time.sleep(0.2)
    return proc, next((tmp_path / "runs").iterdir()), err


def _exit_within(proc, seconds: float) -> float:
    t0 = time.monotonic()
    try:
        proc.wait(timeout=seconds)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: fail below, after killing it
        proc.kill()
        proc.wait()
        pytest.fail(f"the launcher did not exit within {seconds} s of the signal")
    return time.monotonic() - t0


def test_ctrl_c_before_any_rank_started_stops_at_once(cloud, tmp_path):
    """No rank has recorded anything, so no checkpoint is possible: the stop does not wait the 150 s
    interruption grace, says so, and every instance is terminated within 30 s."""
    proc, run_dir, err = _start_following(cloud, tmp_path)
    assert left(cloud, run_dir.name)["instances"] == 2
    proc.send_signal(signal.SIGINT)
    took = _exit_within(proc, 30)
    text = err.read_text()
    assert proc.returncode == 130 and took < 30, text
    assert "no rank has started yet" in text and "terminating its 2 instance(s) now" in text and "Traceback" not in text
    assert left(cloud, run_dir.name) == NOTHING
    assert json.loads((run_dir / "launch.json").read_text())["state"] == "CANCELLED"


def test_ctrl_c_twice_terminates_without_the_checkpoint(cloud, tmp_path):
    """A rank has records, so the first Ctrl-C waits for the leader's checkpoint (up to 150 s) and says
    so; the second ends the wait at once and still leaves nothing running."""
    proc, run_dir, err = _start_following(cloud, tmp_path)
    FakeNodes(cloud, run_dir).records(0, 0, range(1, 3), world=2)
    proc.send_signal(signal.SIGINT)
    deadline = time.time() + 30
    while "waiting up to 150 s" not in err.read_text():
        assert proc.poll() is None and time.time() < deadline, err.read_text()
        time.sleep(0.2)
    assert "asked its 1 rank(s) to checkpoint" in err.read_text() and "Ctrl-C again" in err.read_text()
    time.sleep(1)
    assert proc.poll() is None  # still waiting for the checkpoint
    proc.send_signal(signal.SIGINT)
    took = _exit_within(proc, 20)
    text = err.read_text()
    assert proc.returncode == 130 and took < 20 and "SIGINT again: not waiting for a checkpoint" in text, text
    assert "Traceback" not in text
    assert left(cloud, run_dir.name) == NOTHING


def test_gc_finds_the_heartbeat_of_a_run_launched_before_the_tag(cloud, tmp_path):
    """Instances launched before the scalelab:heartbeat tag: their user data names bucket and prefix,
    and a fresh heartbeat there keeps gc off them."""
    run_id = f"older-{uuid.uuid4().hex[:6]}"
    script = f"#!/bin/bash\nexport SCALELAB_BUCKET={cloud['bucket']}\nexport SCALELAB_PREFIX=scalelab/{run_id}\n"
    cloud["ec2"].run_instances(ImageId="ami-12345678", InstanceType="g3.4xlarge", MinCount=1, MaxCount=1, UserData=script,
                               TagSpecifications=[{"ResourceType": "instance",
                                                   "Tags": [{"Key": "scalelab:run-id", "Value": run_id}]}])
    cloud["s3"].put_object(Bucket=cloud["bucket"], Key=f"scalelab/{run_id}/control/launcher.json",
                           Body=json.dumps({"time": time.time(), "host": "laptop", "pid": 7}).encode())
    out = launch("aws", "gc", "--run-id", run_id, cwd=tmp_path, env=_gc_env(cloud))
    assert out.returncode == 0 and "pid 7 on laptop" in out.stderr and "stale after 10 min" in out.stderr, out.stderr
    assert left(cloud, run_id)["instances"] == 1
    out = launch("aws", "gc", "--run-id", run_id, "--force", cwd=tmp_path, env=_gc_env(cloud))
    assert out.returncode == 0 and left(cloud, run_id) == NOTHING, out.stderr


# ---- `launch cancel` in another terminal while a launcher follows the run (review, item 1) ------------


class SlowSavingNodes:
    """The instances' side in a thread: heartbeats and rank 0's steps until the stop request, then the leader
    saves its checkpoint `save_s` later (an upload that takes time), then both instances say they stopped."""

    def __init__(self, cloud, run_dir: Path, save_s: float) -> None:
        import threading

        self.fake, self.save_s, self.stop_seen = FakeNodes(cloud, run_dir), save_s, None
        self.fake.t0 = time.time()  # steps of now: the follower's stall check sees a live run
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._play, daemon=True)
        self.thread.start()

    def _stop_asked(self) -> bool:
        try:
            self.fake.cloud["s3"].head_object(Bucket=self.fake.cloud["bucket"], Key=f"{self.fake.prefix}/control/stop")
        except Exception:  # noqa: BLE001 - 404: not asked yet
            return False
        return True

    def _play(self) -> None:
        step = 0
        while not self.done.is_set():
            nodes = self.fake.heartbeat(0)
            if len(nodes) == 2:
                if self.stop_seen is None and self._stop_asked():
                    self.stop_seen = time.monotonic()
                step += self.stop_seen is None
                self.fake.records(0, 0, range(1, step + 1), world=2)
                if self.stop_seen is not None and time.monotonic() - self.stop_seen > self.save_s:
                    self.fake.put("checkpoint.pt", b"the leader's checkpoint")
                    for i, n in enumerate(nodes):
                        self.fake.put(f"status/gen-0/{n['InstanceId']}.json",
                                      {"state": "interrupted", "reason": "stop_requested", "exit_code": 143, "index": i})
                    return
            time.sleep(0.3)


@pytest.mark.slow
def test_a_cancel_from_another_terminal_lets_the_leader_save_then_tears_down_once(cloud, tmp_path):
    """`launch cancel RUN` while a launcher follows the run, its leader needing 5 s to save after the stop
    request. The follower ended the run the moment launch.json said CANCELLED (before the cancel had even put
    its stop request) and tore it down: no checkpoint reached the run directory, the cancel then waited its
    whole 150 s for a leader already gone, and aws-events.jsonl held two aws_end. Now: the checkpoint is saved
    and mirrored, the cancel ends in seconds, the follower says the run continues from its checkpoint, one
    aws_end, nothing left."""
    proc, run_dir, err = _start_following(cloud, tmp_path)
    nodes = SlowSavingNodes(cloud, run_dir, save_s=5.0)
    try:
        deadline = time.time() + 30
        while not (run_dir / "records" / "rank-0.jsonl").exists():  # the follower mirrors rank 0's steps
            assert time.time() < deadline and proc.poll() is None, err.read_text()
            time.sleep(0.2)
        t0 = time.monotonic()
        out = launch("cancel", str(run_dir), cwd=tmp_path, timeout=200,
                     env={"AWS_ENDPOINT_URL": cloud["url"], "AWS_DEFAULT_REGION": REGION,
                          "AWS_ACCESS_KEY_ID": CREDS["aws_access_key_id"],
                          "AWS_SECRET_ACCESS_KEY": CREDS["aws_secret_access_key"]})
        took = time.monotonic() - t0
        _exit_within(proc, 60)
    finally:
        nodes.done.set()
        if proc.poll() is None:
            proc.kill()
    text = err.read_text()
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert took < 60 and "no checkpoint reported within" not in out.stderr, (took, out.stderr)
    assert nodes.stop_seen is not None
    assert (run_dir / "checkpoint.pt").read_bytes() == b"the leader's checkpoint"
    rel = run_dir.relative_to(tmp_path)
    assert f"run {rel} was cancelled; `launch resume {rel}` continues it from its last checkpoint" in text, text
    ends = [json.loads(line) for line in (run_dir / "records" / "aws-events.jsonl").read_text().splitlines()
            if json.loads(line).get("event") == "aws_end"]
    assert len(ends) == 1 and ends[0]["state"] == "CANCELLED", ends
    assert json.loads((run_dir / "launch.json").read_text())["state"] == "CANCELLED"
    assert left(cloud, run_dir.name) == NOTHING


# ---- gc after a SIGKILLed launcher on this host (review, item 5) ------------------------------------------


def test_gc_removes_a_run_whose_launcher_died_on_this_host_lists_only_what_goes_and_status_records_it(cloud, tmp_path):
    """A launcher SIGKILLed seconds ago on this host left a fresh heartbeat: gc skipped its run ("a launcher still
    follows it ... 6 s ago") though `launch status` knew no launcher follows it; gc's stdout (--dry-run too) listed
    a skipped run's instances and group as if they went; and after gc the run's `launch status` was UNKNOWN for
    ever. Now: a dead pid on this host is no launcher, a skipped run's resources are not listed, and the run gc
    removed is recorded CANCELLED by gc."""
    import socket
    import subprocess
    import sys

    from scalelab.launcher.runner import settle

    killed, followed = run_dir_for(tmp_path), run_dir_for(tmp_path)
    for run_dir in (killed, followed):
        submit(backend(cloud), make_spec(), run_dir)  # heartbeats of this (live) process, on this host
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid: a launcher that is no more
    cloud["s3"].put_object(Bucket=cloud["bucket"], Key=f"scalelab/{killed.name}/control/launcher.json",
                           Body=json.dumps({"time": time.time(), "host": socket.gethostname(), "pid": gone.pid,
                                            "timeout_s": 600}).encode())
    ids = {d: [i["InstanceId"] for i in live(cloud, d.name)] for d in (killed, followed)}
    out = launch("aws", "gc", "--dry-run", cwd=tmp_path, env=_gc_env(cloud))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"run {followed.name}: skipped, a launcher still follows it" in out.stderr, out.stderr
    assert f"run {killed.name}: skipped" not in out.stderr, out.stderr
    assert all(f"would remove: instance {i}" in out.stdout for i in ids[killed]), out.stdout
    assert not any(i in out.stdout for i in ids[followed]) and f"scalelab-{followed.name}" not in out.stdout, out.stdout
    assert left(cloud, killed.name)["instances"] == 2  # a dry run
    out = launch("aws", "gc", cwd=tmp_path, env=_gc_env(cloud))
    assert out.returncode == 0 and f"run {killed.name}: terminated 2 instance(s)" in out.stdout, out.stdout + out.stderr
    assert left(cloud, killed.name) == NOTHING and left(cloud, followed.name)["instances"] == 2
    status = settle(backend(cloud), killed)
    assert status.state == "CANCELLED" and "removed by `launch aws gc`" in status.detail, status
    assert json.loads((killed / "launch.json").read_text())["state"] == "CANCELLED"
    assert settle(backend(cloud), followed).state == "RUNNING"
    cancel(backend(cloud), followed)
    assert left(cloud, followed.name) == NOTHING
