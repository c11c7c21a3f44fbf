"""The instance side for real, on this machine: the user-data script of a launched run, against moto.

The launcher schedules a one-node spot run into moto's server (so the instance, its tags and its user
data exist there), then this test plays the instance: it runs the very user-data script moto holds
with bash, with `shutdown` replaced by a recorder on PATH, a scratch virtualenv
(--system-site-packages: torch is already here; PIP_NO_INDEX proves nothing is downloaded) as the
instance's Python, the moto endpoint in AWS_ENDPOINT_URL with dummy keys standing in for the
instance profile, and a small HTTP server standing in for the instance metadata service. The
script downloads the wheel of this checkout from S3, installs it, finds its peers by tag, trains,
and writes records, logs and the checkpoint to S3. The metadata stand-in announces a spot
interruption after a few steps: the node checkpoints and stops; the launcher (running the real
follow loop, `launcher.runner.wait`, in a thread) records the interruption and starts a replacement, whose user data runs on a
fresh scratch directory and resumes from the checkpoint to the end. Then `launch report` reads the
downloaded run directory unchanged, and no instance is left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from base64 import b64decode
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import ROOT, launch

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")
pytest.importorskip("moto.server", reason='moto server is not installed: pip install "moto[server]"')

from aws import teardown as td  # noqa: E402
from aws.backend import AwsBackend  # noqa: E402
from aws.render import PACKAGE_NAME  # noqa: E402
from core.rundir import new_run_dir  # noqa: E402
from core.spec import Spec, save_spec  # noqa: E402
from launcher.runner import wait  # noqa: E402

REGION = "us-east-1"
KEYS = {"AWS_ACCESS_KEY_ID": "AKIABOOTSTRAPTEST", "AWS_SECRET_ACCESS_KEY": "bootstrap/test/secret"}
STEPS, NOTICE_AT = 150, 5


class Metadata:
    """Stands in for 169.254.169.254: IMDSv2 token, instance-id, and the spot notice once the
    node's trainer has written NOTICE_AT steps (404 before, as on EC2)."""

    def __init__(self) -> None:
        self.instance_id = ""
        self.records: Path | None = None  # notice once this file has NOTICE_AT steps; None: never
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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notice_due(self) -> bool:
        if self.records is None or not self.records.exists():
            return False
        return sum('"kind": "step"' in line for line in self.records.read_text().splitlines()) >= NOTICE_AT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out / PACKAGE_NAME


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("venv") / "env"
    # --without-pip: the venv's own old setuptools would hide this machine's (torch pins setuptools>=77);
    # pip itself comes from the system site-packages and installs into the venv.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def clean_env() -> dict[str, str]:
    """This machine's environment without anything that would point Python at this checkout or at AWS."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON", "VIRTUAL_ENV"))}


def run_user_data(script: str, work: Path, python: Path, meta: Metadata, moto_url: str, fake_bin: Path) -> subprocess.CompletedProcess:
    env = clean_env()
    env.update(KEYS, AWS_ENDPOINT_URL=moto_url, SCALELAB_WORK=str(work), SCALELAB_PYTHON=str(python),
               SCALELAB_METADATA_URL=meta.url, SCALELAB_POLL_S="0.3", SCALELAB_PEER_TIMEOUT_S="60",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1",
               PATH=f"{fake_bin}:{env['PATH']}")
    return subprocess.run(["bash", "-c", script], env=env, cwd=work.parent, capture_output=True, text=True, timeout=400)


def user_data_of(ec2, instance_id: str) -> str:
    attr = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return b64decode(attr["UserData"]["Value"]).decode()


def test_bootstrap_trains_checkpoints_on_notice_and_resumes(moto_url, wheel, venv, tmp_path):
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
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    shutdowns = tmp_path / "shutdowns.txt"
    (fake_bin / "shutdown").write_text(f"#!/bin/sh\necho \"$@\" >> {shutdowns}\n")
    (fake_bin / "shutdown").chmod(0o755)

    spec = Spec.from_dict({"backend": "aws", "model": "nmt-tiny", "engine": {"name": "single"}, "steps": STEPS,
                           "threads": 1, "warmup_steps": 1, "seed": 7})
    be = AwsBackend({"bucket": bucket, "region": REGION, "spot": True, "wheel": str(wheel), "poll_s": 0.3,
                     "interruption_grace_s": 120.0, "report_timeout_min": 6.0, "timeout_min": 15.0},
                    clients={"ec2": ec2, "s3": s3})
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
        proc = run_user_data(user_data_of(ec2, first["InstanceId"]), work0, venv, meta, moto_url, fake_bin)
        boot_log = (work0 / "bootstrap.log").read_text() if (work0 / "bootstrap.log").exists() else ""
        assert proc.returncode == 0, proc.stderr + boot_log
        installed = subprocess.run([str(venv), "-c", "import aws; print(aws.__file__)"], cwd=work0,
                                   capture_output=True, text=True, env=clean_env()).stdout
        assert str(venv.parent.parent) in installed  # the package came from the wheel, not this checkout
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
        assert f"{prefix}/checkpoint.pt" in keys and f"{prefix}/records/gen-0/rank-0.jsonl" in keys
        status0 = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/status/gen-0/{first['InstanceId']}.json")["Body"].read())
        assert status0["state"] == "interrupted" and status0["exit_code"] == 143, boot_log
        recs0 = [json.loads(x) for x in s3.get_object(Bucket=bucket, Key=f"{prefix}/records/gen-0/rank-0.jsonl")["Body"].read().decode().splitlines()]
        stopped = [r for r in recs0 if r.get("event") == "interrupted"]
        ckpt_step = max(r["step"] for r in recs0 if r.get("event") == "checkpoint")
        assert stopped and NOTICE_AT <= ckpt_step < STEPS
        assert shutdowns.read_text().splitlines()[0].startswith("-h +15")  # the time limit is armed first
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
        proc = run_user_data(user_data_of(ec2, second["InstanceId"]), work1, venv, meta, moto_url, fake_bin)
        assert proc.returncode == 0, proc.stderr + (work1 / "bootstrap.log").read_text()
        launcher.join(timeout=120)
    finally:
        meta.server.shutdown()
        if launcher.is_alive():
            be.cancel(run_dir, grace_s=0)
    assert "error" not in outcome, outcome
    assert outcome["status"].state == "COMPLETED", outcome["status"].detail

    # ---- the launcher's copy: merged records, the interruption, report unchanged, nothing running ---
    recs = [json.loads(x) for x in (run_dir / "records" / "rank-0.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in recs if r["kind"] == "step"]
    resumed = [r for r in recs if r["kind"] == "start"][-1]["resumed_from_step"]
    assert resumed == ckpt_step
    assert steps == list(range(1, ckpt_step + 1)) + list(range(ckpt_step + 1, STEPS + 1))
    events = [json.loads(x) for x in (run_dir / "records" / "aws-events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] in ("spot_interruption", "capacity_replaced")] == \
        ["spot_interruption", "capacity_replaced"]
    assert events[-1]["interruptions"] == 1 and events[-1]["lost_s"] > 0
    assert (run_dir / "checkpoint.pt").exists()
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []
    report = launch("report", str(run_dir), "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
