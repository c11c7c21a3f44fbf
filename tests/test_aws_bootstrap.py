"""The instance side for real, on this machine: the user-data script of a launched run, against moto.

The launcher schedules a one-node spot run into moto's server (so the instance, its tags and its user
data exist there), then a test plays the instance: it runs the very user-data script moto holds with
bash, with `shutdown` replaced by what EC2 does (it records the call, and `shutdown -h now` terminates
the instance in moto when its InstanceInitiatedShutdownBehavior is `terminate`), a scratch virtualenv
(--system-site-packages: torch is already here; PIP_NO_INDEX proves nothing is downloaded) as the
instance's Python, the moto endpoint in AWS_ENDPOINT_URL with dummy keys standing in for the instance
profile, and a small HTTP server standing in for the instance metadata service. The script downloads
the wheel of this checkout from S3, installs it, finds its peers by tag, trains, and writes records,
logs and the checkpoint to S3.

- Spot replacement, single and ps (ps on one node of 2 ranks, with the node's moto-assigned private
  address added to this machine's `lo`, as torchrun is told to reach it; DDP and Horovod are replaced
  and resumed the same way on two instances, tests/test_aws_two_instances.py): the metadata stand-in announces an interruption once the trainer holds at step
  6 (a test aid, so the stop lands on a known step): the node checkpoints and stops; the launcher
  (the real follow loop, `launcher.runner.wait`, in a thread) records the interruption and starts a
  replacement, whose user data runs on a fresh scratch directory and resumes from the checkpoint to
  the end. The per-step losses, learning rates, final weights and Adam state equal those of an
  uninterrupted run of the same spec (compared as tests/test_resume.py does), `launch report` reads
  the downloaded run directory unchanged, and no instance is left running.
- A killed launcher: a real `launch --backend aws` process follows the run and is SIGKILLed while the
  node trains; with nobody left to terminate it, the node sees the launcher's heartbeat stop changing
  and, after `--heartbeat-timeout-min`, checkpoints, uploads and powers off (terminating itself);
  `launch aws gc` removes the security group that the dead launcher could not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from contextlib import contextmanager
from base64 import b64decode
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from conftest import ROOT, build_wheel, launch, made_once, only_run_dir

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")
pytest.importorskip("moto.server", reason='moto server is not installed: pip install "moto[server]"')

from scalelab.aws import teardown as td  # noqa: E402
from scalelab.aws.backend import AwsBackend  # noqa: E402
from scalelab.aws.render import PACKAGE_NAME  # noqa: E402
from scalelab.core.net import free_port  # noqa: E402
from scalelab.core.rundir import new_run_dir  # noqa: E402
from scalelab.core.spec import Spec, save_spec  # noqa: E402
from scalelab.launcher.runner import wait  # noqa: E402
from tests.test_resume import SPEC, _assert_resumed_exactly  # noqa: E402
from scalelab.train.loop import HOLD_AT_STEP_ENV  # noqa: E402

pytestmark = pytest.mark.slow  # every test here takes over 5 s on 2 cores (the fast subset: -m 'not slow')

REGION = "us-east-1"
KEYS = {"AWS_ACCESS_KEY_ID": "AKIABOOTSTRAPTEST", "AWS_SECRET_ACCESS_KEY": "bootstrap/test/secret"}
# tests/test_resume.py's runs (SPEC) on one instance: 10 steps, a checkpoint every 4, dropout on.
RUN = {"backend": "aws", "model": "nmt-tiny", "engine": {"name": "single"}, "steps": 10, "threads": 1,
       "warmup_steps": 1, "data": {"kind": "task", "prefetch": 1}, "global_batch": 16, "checkpoint_every": 4,
       "lr": 0.01, "model_args": {"dropout": 0.2}}
STOP_AT = 6  # the trainer holds there until a stop signal (HOLD_AT_STEP_ENV), so every stop lands on it
# How often the launcher and the played instances' bootstraps poll (`poll_s`, SCALELAB_POLL_S). Every poll is
# several requests to moto's server, which runs in the pytest process, and the suite keeps both cores busy:
# a two-instance spot test took 8% less CPU at 1 s than at 0.3 s (docs/benchmarks.md).
POLL_S = 1.0


class Metadata:
    """Stands in for 169.254.169.254: IMDSv2 token, instance-id, and the spot notice once the
    node's trainer has written STOP_AT steps (404 before, as on EC2)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.instance_id = ""
        self.records: Path | None = None  # notice once this file has STOP_AT steps; None: never
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, body: str = "") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self) -> None:
                self._send(200, "token") if self.path == "/latest/api/token" else self._send(404)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != "token":
                    return self._send(401)
                if self.path == "/latest/meta-data/instance-id":
                    return self._send(200, meta.instance_id)
                if self.path == "/latest/meta-data/spot/instance-action" and meta.notice_due():
                    return self._send(200, json.dumps({"action": "terminate", "time": "2026-01-01T00:02:00Z"}))
                return self._send(404)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notice_due(self) -> bool:
        return self.records is not None and steps_written(self.records) >= STOP_AT


def steps_written(records: Path) -> int:
    return sum('"kind": "step"' in line for line in records.read_text().splitlines()) if records.exists() else 0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """This tree's wheel, built once in the pytest run (conftest's made_once) for every module that ships it."""
    def make(out: Path) -> Path:
        proc = build_wheel(out)
        assert proc.returncode == 0, proc.stderr
        return out / PACKAGE_NAME

    return made_once(tmp_path_factory, ["wheel", str(ROOT)], make)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    return scratch_venv(tmp_path_factory.mktemp("venv") / "env")


def scratch_venv(path: Path) -> Path:
    """An instance's Python: a virtualenv over this machine's packages, into which its user data installs
    the run's wheel (nothing is downloaded: PIP_NO_INDEX). Its python."""
    # --without-pip: the venv's own old setuptools would hide this machine's (torch pins setuptools>=77);
    # pip itself comes from the system site-packages and installs into the venv.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)], check=True)
    if sys.prefix != sys.base_prefix:
        # Run from a virtualenv, --system-site-packages reaches the base interpreter's packages, not this
        # environment's (torch, boto3): add this environment's site-packages after the new one's own.
        new_site = Path(subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
        ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (new_site / "_scalelab_test_outer_env.pth").write_text("".join(f"{d}\n" for d in ours))
    return path / "bin" / "python"


@pytest.fixture
def cloud(moto_url, tmp_path):
    session = boto3.Session(region_name=REGION, aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"])
    ec2, s3 = session.client("ec2", endpoint_url=moto_url), session.client("s3", endpoint_url=moto_url)
    iam = session.client("iam", endpoint_url=moto_url)
    try:  # moto keeps one state per process: another module may have made it
        iam.create_instance_profile(InstanceProfileName="scalelab-instance")
    except iam.exceptions.EntityAlreadyExistsException:
        pass
    bucket = f"scalelab-boot-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    return {"ec2": ec2, "s3": s3, "bucket": bucket, "url": moto_url, "shutdowns": tmp_path / "shutdowns.txt"}


def clean_env() -> dict[str, str]:
    """This machine's environment without anything that would point Python at this checkout or at AWS."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON", "VIRTUAL_ENV"))}


def node_bin(cloud, instance_id: str) -> Path:
    """A PATH entry whose `shutdown` does what EC2 does for this instance: `-h now` powers it off, and
    powering off terminates it when (and only when) it was started with shutdown behaviour terminate."""
    path = cloud["shutdowns"].parent / f"bin-{instance_id}"
    path.mkdir()
    power_off = ("import boto3, sys; ec2 = boto3.client('ec2'); i = sys.argv[1]; "
                 "b = ec2.describe_instance_attribute(InstanceId=i, Attribute='instanceInitiatedShutdownBehavior'); "
                 "act = b['InstanceInitiatedShutdownBehavior']['Value'] == 'terminate'; "
                 "(ec2.terminate_instances if act else ec2.stop_instances)(InstanceIds=[i])")
    (path / "shutdown").write_text(f'#!/bin/sh\necho "$@" >> {cloud["shutdowns"]}\n'
                                   f'[ "$2" = now ] && exec {sys.executable} -c "{power_off}" {instance_id}\nexit 0\n')
    (path / "shutdown").chmod(0o755)
    return path


def start_user_data(cloud, instance_id: str, work: Path, python: Path, meta: Metadata, inside=None,
                    endpoint: str | None = None, hold_at: str = str(STOP_AT)) -> subprocess.Popen:
    """Run the instance's user data from moto, as the instance would at boot: with bash here, or with the argv
    that `inside(script)` gives (a played instance's namespaces, tests/ec2_sandbox.py), AWS at `endpoint`."""
    env = clean_env()
    env.update(KEYS, AWS_ENDPOINT_URL=endpoint or cloud["url"], SCALELAB_WORK=str(work), SCALELAB_PYTHON=str(python),
               SCALELAB_METADATA_URL=meta.url, SCALELAB_POLL_S=str(POLL_S), SCALELAB_PEER_TIMEOUT_S="60",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1",
               # torchrun's port: this machine's, unless the instance has a network of its own (two xdist
               # workers' runs both listened on 29500 here: EADDRINUSE)
               SCALELAB_MASTER_PORT="29500" if inside else str(free_port()),
               PATH=f"{node_bin(cloud, instance_id)}:{env['PATH']}", **{HOLD_AT_STEP_ENV: hold_at})
    script = user_data_of(cloud["ec2"], instance_id)
    return subprocess.Popen(inside(script) if inside else ["bash", "-c", script], env=env, cwd=work.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen, work: Path) -> str:
    """Wait for a node's user data; its output and bootstrap log (for the failure message)."""
    out, err = proc.communicate(timeout=400)
    boot = work / "bootstrap.log"
    return out + err + (boot.read_text() if boot.exists() else "")


def user_data_of(ec2, instance_id: str) -> str:
    attr = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return b64decode(attr["UserData"]["Value"]).decode()


def s3_json(cloud, key: str):
    return json.loads(cloud["s3"].get_object(Bucket=cloud["bucket"], Key=key)["Body"].read())


# One node of each engine: 2 ranks (a 2-GPU type) for the distributed ones, as tests/test_resume.py runs them.
MULTI = {"gpus_per_node": 2, "threads": 1}
ENGINE_RUNS = {"single": ({"name": "single"}, {}, "g3.4xlarge"),
               "ddp": ({"name": "ddp"}, MULTI, "g3.8xlarge"),
               "ps": ({"name": "ps", "ps_shards": 2}, MULTI, "g3.8xlarge"),
               "horovod": ({"name": "horovod"}, MULTI, "g3.8xlarge")}


def uninterrupted(spec, engine: str, tmp_path_factory) -> Path:
    """The run of `spec` without any interruption, on this machine, to compare a resumed run with: the single
    engine's trainer run directly, the others as `reference_run` starts them. Made once in the pytest run
    (conftest's made_once): this file and tests/test_rank_signals_remote.py compare with the same runs."""
    def make(where: Path) -> Path:
        if engine != "single":
            return reference_run(spec, where / "uninterrupted")
        reference = where / "uninterrupted"
        reference.mkdir()
        save_spec(spec, reference)
        done = subprocess.run([sys.executable, "-m", "scalelab.train", str(reference)], cwd=where, capture_output=True,
                              text=True, env={**clean_env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        return reference

    return made_once(tmp_path_factory, ["aws-uninterrupted", engine, spec.to_json()], make)


@contextmanager
def reachable(instance: dict, engine: str):
    """The node's private address (moto's) made an address of this machine, as it is on the instance:
    torchrun's master address and horovodrun's host list name it. Skips where it cannot be added."""
    if engine == "single":  # one process: no address to reach
        yield
        return
    ip = instance["PrivateIpAddress"]
    # Under a label of its own ("lo:0a000105"), not as one more address of `lo`: horovodrun takes the *last*
    # IPv4 address of `lo` for its rendezvous server, so an unlabelled one made every Horovod run started on
    # this machine meanwhile (another xdist worker's) listen on an address that this test then deletes:
    # both its ranks aborted in Gloo's rendezvous (CI, 2026-11-27).
    label = "lo:" + "".join(f"{int(part):02x}" for part in ip.split("."))
    added = subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo", "label", label], capture_output=True,
                           text=True)
    if added.returncode != 0:
        pytest.skip(f"cannot give this machine the node's address {ip} ({added.stderr.strip()})")
    try:
        yield
    finally:
        subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], capture_output=True)


def reference_run(spec: Spec, where: Path) -> Path:
    """The uninterrupted run of `spec` on this machine (the local backend starts its ranks)."""
    where.mkdir()
    (where / "spec.json").write_text(spec.to_json())
    done = launch("--spec", str(where / "spec.json"), "--backend", "local", "--runs-dir", "runs", cwd=where,
                  timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return only_run_dir(where / "runs")


@pytest.mark.parametrize("engine", ["single", "ps"])  # ddp, horovod: on two instances, tests/test_aws_two_instances.py
def test_spot_replacement_resumes_to_the_same_losses(cloud, wheel, venv, tmp_path, tmp_path_factory, engine):
    ec2, s3, bucket = cloud["ec2"], cloud["s3"], cloud["bucket"]
    engine_spec, extra, instance_type = ENGINE_RUNS[engine]
    spec = Spec.from_dict({**RUN, "engine": engine_spec, **extra})
    be = AwsBackend({"bucket": bucket, "region": REGION, "spot": True, "wheel": str(wheel), "poll_s": POLL_S,
                     "interruption_grace_s": 120.0, "report_timeout_min": 6.0, "timeout_min": 15.0,
                     "instance_type": instance_type}, clients={"ec2": ec2, "s3": s3})
    run_dir = new_run_dir(tmp_path / "runs", "boot")
    save_spec(spec, run_dir)
    be.schedule(be.submit_dryrun(spec, run_dir))
    outcome: dict = {}

    def follow() -> None:
        try:
            outcome["status"] = wait(be, run_dir)  # off the main thread: no signal handlers, same loop
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            outcome["error"] = exc

    launcher = threading.Thread(target=follow, daemon=True)
    launcher.start()
    meta = Metadata()
    prefix = f"scalelab/{run_dir.name}"
    try:
        # ---- generation 0: train until the spot notice, checkpoint, stop --------------------------
        (first,) = td.instances(ec2, run_dir.name, ["running"], 0)
        meta.instance_id = first["InstanceId"]
        work0 = tmp_path / "node-gen0"
        meta.records = work0 / run_dir.name / "records" / "rank-0.jsonl"
        with reachable(first, engine):
            proc = start_user_data(cloud, first["InstanceId"], work0, venv, meta)
            said = finished(proc, work0)
        assert proc.returncode == 0, said
        installed = subprocess.run([str(venv), "-c", "import scalelab.aws; print(scalelab.aws.__file__)"], cwd=work0,
                                   capture_output=True, text=True, env=clean_env()).stdout
        assert str(venv.parent.parent) in installed  # the package came from the wheel, not this checkout
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
        assert f"{prefix}/checkpoint.pt" in keys and f"{prefix}/records/gen-0/rank-0.jsonl" in keys
        status0 = s3_json(cloud, f"{prefix}/status/gen-0/{first['InstanceId']}.json")
        assert status0["state"] == "interrupted", said
        if engine == "single":  # torchrun and horovodrun exit with their own code when stopped
            assert status0["exit_code"] == 143, said
        assert status0["reason"] == "spot_notice"
        recs0 = [json.loads(x) for x in s3.get_object(Bucket=bucket, Key=f"{prefix}/records/gen-0/rank-0.jsonl")["Body"].read().decode().splitlines()]
        assert [r["step"] for r in recs0 if r.get("event") == "interrupted"] == [STOP_AT]
        assert max(r["step"] for r in recs0 if r.get("event") == "checkpoint") == STOP_AT
        shutdowns = cloud["shutdowns"].read_text().splitlines()
        assert shutdowns[0].startswith("-h +15") and shutdowns[-1].startswith("-h now")  # limit armed first
        assert KEYS["AWS_SECRET_ACCESS_KEY"] not in user_data_of(ec2, first["InstanceId"])

        # ---- generation 1: the launcher replaced the capacity; a fresh node resumes ---------------
        deadline = time.time() + 120
        while not td.instances(ec2, run_dir.name, ["running"], 1):
            assert time.time() < deadline and launcher.is_alive(), f"no replacement was started: {outcome}"
            time.sleep(0.3)
        (second,) = td.instances(ec2, run_dir.name, ["running"], 1)
        assert second["InstanceLifecycle"] == "spot"
        meta.instance_id, meta.records = second["InstanceId"], None
        work1 = tmp_path / "node-gen1"
        with reachable(second, engine):
            proc = start_user_data(cloud, second["InstanceId"], work1, venv, meta)
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

    # ---- the launcher's copy: the same losses as without the interruption, report unchanged, nothing left
    reference = uninterrupted(spec, engine, tmp_path_factory)
    _assert_resumed_exactly(run_dir, reference, engine, from_step=STOP_AT)
    steps = [json.loads(x)["step"] for x in (run_dir / "records" / "rank-0.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "step"]
    assert steps == list(range(1, 11))
    events = [json.loads(x) for x in (run_dir / "records" / "aws-events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] in ("spot_interruption", "capacity_replaced")] == \
        ["spot_interruption", "capacity_replaced"]
    assert events[-1]["interruptions"] == 1 and events[-1]["lost_s"] > 0
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []
    report = launch("report", str(run_dir), "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr


def test_a_killed_launcher_leaves_nothing_running(cloud, wheel, venv, tmp_path):
    """SIGKILL of the launcher: nothing runs in it any more, so nothing of it can terminate the
    instances. The node notices that the heartbeat stopped changing, checkpoints, uploads and powers
    off, which terminates it; `launch aws gc` removes what only a launcher would have removed."""
    ec2, s3, bucket = cloud["ec2"], cloud["s3"], cloud["bucket"]
    env = {**os.environ, **KEYS, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": cloud["url"], "AWS_DEFAULT_REGION": REGION}
    log = (tmp_path / "launcher.err").open("w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "scalelab.launcher.cli", *SPEC, "--engine", "single", "--backend", "aws",
         "--bucket", bucket, "--region", REGION, "--spot", "--heartbeat-timeout-min", "0.25",
         f"--backend-opt=wheel={wheel}", f"--backend-opt=poll_s={POLL_S}", "--runs-dir", "runs"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log)
    meta = Metadata()
    try:
        run_dir = until(lambda: next(iter(_following(tmp_path / "runs")), None), launcher, "the launcher to follow its run")
        (node,) = td.instances(ec2, run_dir.name, ["running"], 0)
        meta.instance_id = node["InstanceId"]
        work = tmp_path / "node"
        proc = start_user_data(cloud, node["InstanceId"], work, venv, meta)
        records = work / run_dir.name / "records" / "rank-0.jsonl"
        until(lambda: steps_written(records) >= STOP_AT or proc.poll() is not None, launcher, "the node to train")
        launcher.kill()  # SIGKILL: no handler, no clean-up, no more heartbeats
        launcher.wait(timeout=60)
        said = finished(proc, work)
    finally:
        meta.server.shutdown()
        launcher.kill()
        log.close()
    assert proc.returncode == 0, said
    prefix = f"scalelab/{run_dir.name}"
    status = s3_json(cloud, f"{prefix}/status/gen-0/{node['InstanceId']}.json")
    assert status["state"] == "interrupted" and status["reason"] == "launcher_lost" and status["exit_code"] == 143, said
    assert "launcher's heartbeat has not changed for 15 s" in said
    checkpoint = tmp_path / "checkpoint.pt"
    s3.download_file(bucket, f"{prefix}/checkpoint.pt", str(checkpoint))
    assert torch.load(checkpoint, weights_only=True)["step"] == STOP_AT  # stopped with a checkpoint, uploaded
    assert cloud["shutdowns"].read_text().splitlines()[-1].startswith("-h now")
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == [], "the instance did not terminate itself"
    assert td.volumes(ec2, run_dir.name) == []
    assert len(td.groups_sg_only(ec2, run_dir.name)) == 1  # only a launcher deletes it: gc does
    gc = launch("aws", "gc", "--run-id", run_dir.name, cwd=tmp_path,
                env={**KEYS, "AWS_ENDPOINT_URL": cloud["url"], "AWS_DEFAULT_REGION": REGION})
    assert gc.returncode == 0, gc.stderr
    assert td.groups_sg_only(ec2, run_dir.name) == [] and td.instances(ec2, run_dir.name, td.LIVE_STATES) == []


def _following(runs: Path) -> list[Path]:
    """The run directory whose launcher has seen it RUNNING (its instance exists)."""
    found = [p.parent for p in runs.glob("*/launch.json")] if runs.exists() else []
    return [d for d in found if json.loads((d / "launch.json").read_text()).get("state") == "RUNNING"]


def until(condition, launcher: subprocess.Popen, what: str, timeout: float = 300):
    """Poll `condition` until it returns something true; fail if the launcher ends or time runs out first."""
    deadline = time.time() + timeout
    while not (found := condition()):
        assert launcher.poll() is None, f"the launcher ended (exit code {launcher.returncode}) before {what}"
        assert time.time() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)
    return found
