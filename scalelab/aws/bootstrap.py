"""What runs on each instance: `python -m scalelab.aws.bootstrap` (started by the user-data script).

1. Who am I: the instance id from the instance metadata service (IMDSv2).
2. Peers: the run's instances of this generation, found by their tags (DescribeInstances), in node
   order (launch group, then launch index). Node 0 is the leader; rank 0 lives there.
3. The run directory: spec.json and, when resuming, checkpoint.pt from S3.
4. The trainer, as the engine's launch plan says (scalelab/core/launch.py, from the run's spec.json):
   `python -m scalelab.train RUN_DIR` (single), one torchrun per node (ddp, ps), or horovodrun on the
   leader reaching the other nodes over ssh (horovod; the leader's public key goes through S3), with
   Horovod's fusion settings in its environment.
5. Every few seconds: upload records (records/gen-G/rank-R.jsonl, and error-rank-R.jsonl where a rank's error
   record had to go beside its own file: scalelab/core/records.py `errors_aside`), logs, the leader's checkpoint
   and a heartbeat; poll the spot interruption notice (`spot/instance-action`, 404 until AWS
   schedules an interruption two minutes ahead), a stop request from the launcher (`control/stop`)
   and the launcher's own heartbeat (`control/launcher.json`, rewritten on each of its polls).
   A notice, a stop request, or a launcher heartbeat unchanged for SCALELAB_HEARTBEAT_TIMEOUT_S
   (the launcher was killed, the laptop closed: nobody would ever terminate this instance) sends
   SIGTERM to the local ranks: they agree, rank 0 checkpoints, they exit 143, and the checkpoint
   is uploaded before the instance goes.
6. The final state (completed / interrupted / cancelled / failed, and why it was interrupted) in
   status/gen-G/INSTANCE.json. The user data then powers the instance off, which terminates it.

Configuration comes from the environment the user data sets (SCALELAB_*; no credentials: boto3
finds the instance profile's). SCALELAB_METADATA_URL, SCALELAB_WORK, SCALELAB_POLL_S and
SCALELAB_MASTER_PORT exist so the bootstrap can run in a test against moto and a stand-in metadata server
(several played instances on one machine, whose torchruns must not all listen on 29500).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from scalelab.core.launch import NodeLaunch, Site, launch_plan, starter_of
from scalelab.core.net import is_loopback
from scalelab.core.records import errors_aside
from scalelab.core.rundir import CHECKPOINT_FILE, LOGS_DIR, RECORDS_DIR, SPEC_FILE, RunPaths
from scalelab.core.spec import Spec, read_spec
from scalelab.core.writes import extract_inside, open_inside

METADATA_URL = "http://169.254.169.254"
SCRIPT_CHECKPOINTS = "checkpoint"  # RUN_DIR/checkpoint/: a --script's own files (scalelab/train/track.py)
LAUNCHER_HEARTBEAT = "control/launcher.json"  # the launcher rewrites it on every poll (scalelab/aws/backend.py)
GC_RECORD = "control/gc.json"  # written by `launch aws gc` when it removes the run (scalelab/aws/cli.py)
STOP_REQUEST = "control/stop"  # written by `launch cancel` and by a launcher stopped by a signal
# Why a node stopped its ranks early (`reason` in its status): the launcher reads LAUNCHER_LOST.
SPOT_NOTICE, STOP_REQUESTED, LAUNCHER_LOST = "spot_notice", "stop_requested", "launcher_lost"


class Config:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.run_id = env["SCALELAB_RUN_ID"]
        self.bucket = env["SCALELAB_BUCKET"]
        self.prefix = env["SCALELAB_PREFIX"]
        self.generation = int(env.get("SCALELAB_GENERATION", "0"))
        self.nodes = int(env.get("SCALELAB_NODES", "1"))
        self.gpus_per_node = int(env.get("SCALELAB_GPUS_PER_NODE", "1"))
        # ranks this node starts: the GPUs' workers, plus the parameter-server ranks of ps separate placement
        self.ranks_per_node = int(env.get("SCALELAB_RANKS_PER_NODE", self.gpus_per_node))
        self.engine = env.get("SCALELAB_ENGINE", "single")
        self.metadata_url = env.get("SCALELAB_METADATA_URL", METADATA_URL).rstrip("/")
        self.work = Path(env.get("SCALELAB_WORK", "/opt/scalelab"))
        self.poll_s = float(env.get("SCALELAB_POLL_S", "5"))
        self.peer_timeout_s = float(env.get("SCALELAB_PEER_TIMEOUT_S", "600"))
        self.master_port = int(env.get("SCALELAB_MASTER_PORT", "29500"))  # torchrun's; tests run instances side by side
        self.heartbeat_timeout_s = float(env.get("SCALELAB_HEARTBEAT_TIMEOUT_S", "600"))
        self.python = env.get("SCALELAB_PYTHON") or sys.executable

    def key(self, *parts: str) -> str:
        return "/".join([self.prefix, *parts])

    @property
    def run_dir(self) -> Path:
        return self.work / self.run_id


# ---- instance metadata (IMDSv2) ---------------------------------------------------------------


def _token(cfg: Config) -> str | None:
    req = urllib.request.Request(cfg.metadata_url + "/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def metadata(cfg: Config, item: str) -> str | None:
    """An instance metadata item, or None when it does not exist (HTTP 404)."""
    headers = {}
    token = _token(cfg)
    if token:
        headers["X-aws-ec2-metadata-token"] = token
    req = urllib.request.Request(f"{cfg.metadata_url}/latest/meta-data/{item}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def interruption_notice(cfg: Config) -> dict | None:
    """The spot interruption notice ({"action": "terminate", "time": ...}) or None."""
    try:
        text = metadata(cfg, "spot/instance-action")
    except (urllib.error.URLError, OSError):
        return None
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"action": text}


# ---- peers --------------------------------------------------------------------------------------


def find_peers(ec2, cfg: Config) -> list[dict]:
    """This generation's instances in node order, waiting until all `nodes` are there."""
    deadline = time.time() + cfg.peer_timeout_s
    while True:
        found = []
        pages = ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": "tag:scalelab:run-id", "Values": [cfg.run_id]},
            {"Name": "tag:scalelab:generation", "Values": [str(cfg.generation)]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ])
        for page in pages:
            for res in page["Reservations"]:
                found += res["Instances"]
        if len(found) >= cfg.nodes and all(i.get("PrivateIpAddress") for i in found):
            return sorted(found, key=node_order)[: cfg.nodes]
        if time.time() > deadline:
            raise RuntimeError(f"found {len(found)} of {cfg.nodes} instances of run {cfg.run_id} "
                               f"generation {cfg.generation} after {cfg.peer_timeout_s:.0f}s")
        time.sleep(min(cfg.poll_s, 5))


def node_order(instance: dict) -> tuple:
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    return int(tags.get("scalelab:group", 0)), int(instance.get("AmiLaunchIndex", 0)), instance["InstanceId"]


# ---- the trainer command (pure) -----------------------------------------------------------------


def trainer_command(spec: Spec, python: str, run_dir: Path, hosts: list[str], index: int, port: int = 29500,
                    ssh_key: str | None = None) -> NodeLaunch | None:
    """What node `index` runs (the engine's launch plan on these hosts, node 0 the master), or None when
    another node starts this node's ranks (horovodrun on the leader, over ssh)."""
    site = Site(python=python, master_addr=hosts[0], master_port=port, hosts=tuple(hosts), horovodrun=None,
                ssh_identity=ssh_key)
    return next((launch for launch in launch_plan(spec, run_dir, site) if launch.node == index), None)


# ---- S3 sync ------------------------------------------------------------------------------------


def record_files(records: Path) -> list[Path]:
    """The ranks' records files in `records` to upload: rank-R.jsonl, and error-rank-R.jsonl, where a rank's `error`
    record goes when its own file cannot grow (a quota; scalelab/core/records.py `errors_aside`). Why the second: the
    launcher reads it beside the rank's file (`with_errors_aside`), but only rank-R.jsonl was uploaded, so an AWS run
    failed with "rank 0 after step 3 stopped with no error and no end record" instead of the rank's error."""
    return sorted([*records.glob("rank-*.jsonl"), *records.glob("error-rank-*.jsonl")])


def is_missing(exc: Exception) -> bool:
    """Whether a botocore ClientError says the object is not there (S3 answers 404 three ways)."""
    return getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


class Sync:
    """Uploads what changed: records of this generation, this node's log, the leader's checkpoint."""

    def __init__(self, s3, cfg: Config, instance_id: str, index: int) -> None:
        self.s3, self.cfg, self.instance_id, self.index = s3, cfg, instance_id, index
        self.sent: dict[Path, tuple[float, int]] = {}

    def _put(self, path: Path, key: str) -> None:
        st = path.stat()
        if self.sent.get(path) == (st.st_mtime, st.st_size):
            return
        self.s3.upload_file(str(path), self.cfg.bucket, self.cfg.key(key))
        self.sent[path] = (st.st_mtime, st.st_size)

    def mark_present(self, path: Path) -> None:
        """A file downloaded from S3 is not new work: do not upload it back."""
        st = path.stat()
        self.sent[path] = (st.st_mtime, st.st_size)

    def push(self) -> None:
        g = f"gen-{self.cfg.generation}"
        paths = RunPaths(self.cfg.run_dir)  # S3 keys mirror the run directory's layout (scalelab/aws/mirror.py reads them)
        for rec in record_files(paths.records):
            self._put(rec, f"{RECORDS_DIR}/{g}/{rec.name}")
        for log in sorted(paths.logs.glob("*.log")):
            self._put(log, f"{LOGS_DIR}/{g}/node-{self.index}-{log.name}")
        boot = self.cfg.work / "bootstrap.log"
        if boot.exists():
            self._put(boot, f"{LOGS_DIR}/{g}/node-{self.index}-bootstrap.log")
        if self.index == 0 and paths.checkpoint.exists():
            self._put(paths.checkpoint, CHECKPOINT_FILE)
        own = Path(self.cfg.run_dir) / SCRIPT_CHECKPOINTS  # a --script's checkpoint files (track.checkpoint_dir)
        for path in sorted(own.rglob("*")) if self.index == 0 and own.is_dir() else []:
            if path.is_file() and not path.is_symlink():
                self._put(path, f"{SCRIPT_CHECKPOINTS}/{path.relative_to(own)}")

    def _peers(self, folder: str) -> list[str]:
        """The other instances of this generation with an entry in FOLDER/gen-G/ (their ids, sorted)."""
        prefix = self.cfg.key(f"{folder}/gen-{self.cfg.generation}/")
        listing = self.s3.list_objects_v2(Bucket=self.cfg.bucket, Prefix=prefix)
        ids = (o["Key"][len(prefix):].removesuffix(".json") for o in listing.get("Contents", []))
        return sorted(i for i in ids if i != self.instance_id)

    def peer_notice(self) -> str | None:
        """The id of another instance of this generation that got a spot notice (its event, written before
        it stopped its ranks), or None."""
        return next(iter(self._peers("events")), None)

    def peer_stop_reason(self) -> str | None:
        """Why another instance of this generation stopped its ranks (its `stops/` entry, written before it
        signalled them: the ranks agree on a step, so its stop ended ours too), or None."""
        try:
            peers = self._peers("stops")
        except Exception:  # noqa: BLE001 - S3 unreachable at the end: no answer, not a failed node
            return None
        reasons = ((self.get_json(f"stops/gen-{self.cfg.generation}/{i}.json") or {}).get("reason") for i in peers)
        return next((r for r in reasons if r), None)

    def put_json(self, key: str, doc: dict) -> None:
        self.s3.put_object(Bucket=self.cfg.bucket, Key=self.cfg.key(key), Body=json.dumps(doc).encode())

    def get_json(self, key: str) -> dict | None:
        """The object's JSON, None when it is missing or not a JSON object."""
        try:
            doc = json.loads(self.s3.get_object(Bucket=self.cfg.bucket, Key=self.cfg.key(key))["Body"].read())
        except Exception:  # noqa: BLE001 - botocore NoSuchKey, a cut upload: no answer
            return None
        return doc if isinstance(doc, dict) else None

    def exists(self, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.cfg.bucket, Key=self.cfg.key(key))
            return True
        except Exception:  # botocore ClientError 404
            return False

    def etag(self, key: str) -> str | None:
        """The object's ETag, None when it does not exist; other errors (S3 unreachable) propagate."""
        from botocore.exceptions import ClientError

        try:
            return self.s3.head_object(Bucket=self.cfg.bucket, Key=self.cfg.key(key))["ETag"]
        except ClientError as exc:
            if is_missing(exc):
                return None
            raise


class LauncherWatch:
    """Is a launcher still following this run? Its heartbeat object must keep changing.

    The age is measured on this instance's clock, from the moment this node last saw the object
    change (or from its own start), never by comparing timestamps written on the launcher's machine:
    a laptop's clock may be off by minutes. An S3 error counts as "no news", so a node that cannot
    reach S3 still stops in time.
    """

    def __init__(self, sync: Sync, timeout_s: float) -> None:
        self.sync, self.timeout_s = sync, timeout_s
        self.seen: str | None = None
        self.since = time.monotonic()

    def gone(self) -> bool:
        try:
            tag = self.sync.etag(LAUNCHER_HEARTBEAT)
        except Exception:  # noqa: BLE001 - no answer is not a heartbeat
            tag = self.seen
        if tag is not None and tag != self.seen:
            self.seen, self.since = tag, time.monotonic()
        return time.monotonic() - self.since > self.timeout_s


def prepare_run_dir(s3, cfg: Config) -> bool:
    """spec.json and, if one exists, the checkpoint; returns whether this is a resume."""
    from botocore.exceptions import ClientError

    paths = RunPaths(cfg.run_dir)
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.records.mkdir(parents=True, exist_ok=True)
    s3.download_file(cfg.bucket, cfg.key(SPEC_FILE), str(paths.spec))
    try:
        s3.download_file(cfg.bucket, cfg.key(CHECKPOINT_FILE), str(paths.checkpoint))
        return True
    except ClientError as exc:
        if is_missing(exc):
            return False
        raise


CODE_DIR = "code"  # a --script run's folder, unpacked under SCALELAB_WORK
CODE_KEY = "code/code.tar.gz"  # scalelab/aws/render.py's CODE_ARCHIVE in the run's prefix


def fetch_code(s3, cfg: Config) -> Path | None:
    """A --script run: its code folder from the bucket, unpacked into WORK/code, and this node's spec.json
    pointed at it (the script runner reads it there); None for the built-in trainer."""
    import tarfile

    spec = read_spec(cfg.run_dir)
    if not spec.own_code:
        return None
    folder = Path(cfg.work) / CODE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    archive = Path(cfg.work) / "code.tar.gz"
    s3.download_file(cfg.bucket, cfg.key(CODE_KEY), str(archive))
    with tarfile.open(archive) as tar:
        extract_inside(tar, folder)  # no absolute paths, no links out of the folder
    if spec.script and spec.script_dir:
        spec.script = str(folder / Path(spec.script).relative_to(spec.script_dir))
    spec.script_dir = str(folder)
    RunPaths(cfg.run_dir).spec.write_text(spec.to_json() + "\n")
    return folder


def fetch_script_checkpoint(s3, cfg: Config) -> bool:
    """A --script run's own checkpoint files (RUN_DIR/checkpoint/*) from the bucket; whether there were any."""
    listed = s3.list_objects_v2(Bucket=cfg.bucket, Prefix=cfg.key(SCRIPT_CHECKPOINTS) + "/").get("Contents", [])
    for obj in listed:
        rel = obj["Key"][len(cfg.key(SCRIPT_CHECKPOINTS)) + 1:]
        dest = Path(cfg.run_dir) / SCRIPT_CHECKPOINTS / rel
        if rel and ".." not in Path(rel).parts:
            dest.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(cfg.bucket, obj["Key"], str(dest))
    return bool(listed)


def script_resume(s3, cfg: Config) -> str | None:
    """`STEP:SECONDS` for a --script run's ranks on a replacement generation (scalelab/train/script.py reads it
    from SCALELAB_TRACK_RESUME): where rank 0 of the generations before stopped, and its training time."""
    last, elapsed = 0, 0.0
    for gen in range(cfg.generation):
        try:
            body = s3.get_object(Bucket=cfg.bucket, Key=cfg.key(RECORDS_DIR, f"gen-{gen}", "rank-0.jsonl"))["Body"].read()
        except Exception:  # noqa: BLE001 - a generation that wrote nothing
            continue
        for line in body.decode(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by the stop
            if rec.get("kind") == "step":
                last = max(last, int(rec["step"]))
            elif rec.get("event") == "end" and isinstance(rec.get("elapsed_s"), (int, float)):
                elapsed = float(rec["elapsed_s"])
    return f"{last}:{elapsed}" if last else None


def signal_local_ranks(run_dir: Path, sig: int = signal.SIGTERM, exclude: int | None = None) -> int:
    """SIGTERM every process of this host training `run_dir` (horovod starts them over ssh)."""
    import psutil

    from scalelab.core.procs import names_run

    hit = 0
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info.get("cmdline") or []
        if p.pid != os.getpid() and p.pid != exclude and names_run(cmd, run_dir):
            try:
                p.send_signal(sig)
                hit += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    return hit


# ---- horovod over ssh: the leader's key through S3 ---------------------------------------------


def hostname_problem(private_ip: str) -> str | None:
    """Why Horovod's ranks on this instance could not be reached from the others, or None.

    Horovod 0.28's Gloo builds its process sets' connections on the address this instance's hostname
    resolves to, whatever HOROVOD_GLOO_IFACE says (gloo_context.cc, InitializeForProcessSet). On EC2 the
    VPC's DNS gives the private address; an AMI whose /etc/hosts maps the hostname to 127.0.x.x makes
    every rank abort in hvd.init with "connect [127.0.0.1]: Connection refused", after the instances
    were paid for. Said here, before any rank starts, with the fix."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError as exc:
        return (f"this instance's hostname {name!r} does not resolve ({exc}); Horovod's Gloo needs it to name "
                f"the private address {private_ip}: add '{private_ip} {name}' to /etc/hosts in the AMI or user data")
    if is_loopback(address):
        return (f"this instance's hostname {name!r} resolves to {address}, a loopback address: Horovod's Gloo would "
                f"listen there and the other instances' ranks could not connect (every rank aborts in hvd.init). "
                f"Use an AMI whose hostname resolves through the VPC's DNS, or map it to the private address "
                f"{private_ip} in /etc/hosts (cloud-init's manage_etc_hosts)")
    return None



def ssh_setup(sync: Sync, cfg: Config, index: int, peers: list[dict]) -> str | None:
    """Leader: make a key, publish it, wait for every node to trust it. Others: trust it, say so."""
    g = f"cluster/gen-{cfg.generation}"
    ssh = Path.home() / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    if index == 0:
        key = ssh / "scalelab"
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        sync.s3.put_object(Bucket=cfg.bucket, Key=cfg.key(g, "leader.pub"), Body=key.with_suffix(".pub").read_bytes())
        deadline = time.time() + cfg.peer_timeout_s
        others = [p["InstanceId"] for p in peers[1:]]
        while not all(sync.exists(f"{g}/ready/{i}") for i in others):
            if time.time() > deadline:
                raise RuntimeError("not every node trusted the leader's ssh key in time")
            time.sleep(1)
        return str(key)
    deadline = time.time() + cfg.peer_timeout_s
    while not sync.exists(f"{g}/leader.pub"):
        if time.time() > deadline:
            raise RuntimeError("the leader never published its ssh key")
        time.sleep(1)
    pub = sync.s3.get_object(Bucket=cfg.bucket, Key=cfg.key(g, "leader.pub"))["Body"].read().decode()
    with open(ssh / "authorized_keys", "a") as f:
        f.write(pub.strip() + "\n")
    sync.put_json(f"{g}/ready/{peers[index]['InstanceId']}", {"time": time.time()})
    return None


# ---- the node agent ------------------------------------------------------------------------------


def run(cfg: Config, s3=None, ec2=None) -> int:
    import boto3

    s3 = s3 or boto3.client("s3")
    ec2 = ec2 or boto3.client("ec2")
    instance_id = os.environ.get("SCALELAB_INSTANCE_ID") or metadata(cfg, "instance-id")
    peers = find_peers(ec2, cfg)
    ids = [p["InstanceId"] for p in peers]
    if instance_id not in ids:
        raise RuntimeError(f"instance {instance_id} is not among the run's instances {ids}")
    index = ids.index(instance_id)
    hosts = [p["PrivateIpAddress"] for p in peers]
    sync = Sync(s3, cfg, instance_id, index)
    g = f"gen-{cfg.generation}"
    status_key = f"status/{g}/{instance_id}.json"

    resumed = prepare_run_dir(s3, cfg)
    if resumed:
        sync.mark_present(RunPaths(cfg.run_dir).checkpoint)
    code = fetch_code(s3, cfg)  # a --script run: its folder, unpacked here; the ranks start in it
    extra: dict[str, str] = {}
    if code is not None:
        resumed = fetch_script_checkpoint(s3, cfg) or resumed
        if (before := script_resume(s3, cfg)) is not None:
            extra["SCALELAB_TRACK_RESUME"] = before  # the step count and training time go on
    spec = read_spec(cfg.run_dir)
    across = starter_of(spec.engine.name).needs_horovod and cfg.nodes > 1
    if across and (problem := hostname_problem(hosts[index])):
        raise RuntimeError(problem)
    ssh_key = ssh_setup(sync, cfg, index, peers) if across else None
    launch = trainer_command(spec, cfg.python, cfg.run_dir, hosts, index, port=cfg.master_port, ssh_key=ssh_key)
    log_path = RunPaths(cfg.run_dir).logs / "trainer.log"
    log = os.fdopen(open_inside(cfg.run_dir, log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), "ab")  # no link
    proc = (subprocess.Popen(launch.argv, stdout=log, stderr=subprocess.STDOUT, cwd=code or cfg.work,
                             env={**os.environ, "PYTHONUNBUFFERED": "1", **launch.env, **extra}) if launch else None)
    notice, peer, reason, watch = None, None, None, LauncherWatch(sync, cfg.heartbeat_timeout_s)
    sync.put_json(f"status/{g}/{instance_id}.heartbeat.json",
                  {"time": time.time(), "index": index, "resumed": resumed, "host": hosts[index]})
    while True:
        time.sleep(cfg.poll_s)
        ended = proc.poll() is not None if proc else sync.exists(f"status/{g}/{ids[0]}.json")
        if not ended and reason is None:
            notice = notice or interruption_notice(cfg)
            # EC2 warns one instance, not the run: the warned one's event stops every instance's ranks, so a
            # --script that only asks track.should_stop() (no agreement of its own) stops on every rank
            peer = None if notice or cfg.nodes == 1 else sync.peer_notice()
            reason = stop_reason(sync, notice, watch, peer)
            if reason:
                stop_ranks(sync, cfg, proc, reason, notice, instance_id, index)
        sync.push()
        sync.put_json(f"status/{g}/{instance_id}.heartbeat.json",
                      {"time": time.time(), "index": index, "resumed": resumed, "host": hosts[index]})
        if ended:
            break
    code = proc.returncode if proc else 0
    log.close()
    sync.push()
    if reason is None and cfg.nodes > 1 and (peer := sync.peer_notice()):
        reason = SPOT_NOTICE  # the warned instance's ranks stopped ours (they agree on a step) before we saw it
    stopped, signalled = ranks_stopped_early(cfg.run_dir), ranks_stopped_on_a_signal(cfg.run_dir)
    reason = reason or late_stop_reason(sync, cfg, proc, ids[0], early=stopped or signalled)
    if peer:
        print(f"scalelab: the ranks stopped because instance {peer} got a spot notice", file=sys.stderr, flush=True)
    leader_state = leader_status(sync, cfg, ids[0]).get("state") if proc is None else None
    state = final_state(proc, code, reason, stopped, signalled, leader_state)
    if peer and state != "interrupted" and spec.script:
        state = "interrupted"  # a script's ranks that returned on their peers' stop look like its end: resume it
    sync.put_json(status_key, {"state": state, "reason": reason if state == "interrupted" else None, "exit_code": code,
                               "index": index, "time": time.time(), "notice": notice, "resumed": resumed,
                               "notice_on": peer or (instance_id if notice else None)})
    return 0 if state != "failed" else 1


def stop_reason(sync: Sync, notice: dict | None, watch: LauncherWatch, peer: str | None = None) -> str | None:
    """Why this node's ranks must stop now, or None: a spot notice (this instance's, or `peer`'s: another
    instance of the run), a stop request, the launcher gone."""
    if notice or peer:
        return SPOT_NOTICE
    if sync.exists(STOP_REQUEST):
        return STOP_REQUESTED
    return LAUNCHER_LOST if watch.gone() else None


def late_stop_reason(sync: Sync, cfg: Config, proc: subprocess.Popen | None, leader_id: str,
                     early: bool = True) -> str | None:
    """Why this node's ranks stopped when they ended before this node's own poll saw why: the ranks agree on
    a stop step, so the node that saw a `launch cancel` or the launcher gone first stops every node's ranks.
    A Horovod node without ranks of its own says what the leader's final status says; any other says a stop
    request if there is one (final_state still calls a run whose ranks had finished 'completed'), else, where
    its ranks stopped `early` (not a crash, not the end), the reason another node stopped its ranks for.
    Without it, a node whose ranks stopped on another node's stop took their clean stop for a signal to a
    rank, and said the run was cancelled."""
    if proc is None:
        return leader_status(sync, cfg, leader_id).get("reason")
    if sync.exists(STOP_REQUEST):
        return STOP_REQUESTED
    return sync.peer_stop_reason() if cfg.nodes > 1 and early else None


def leader_status(sync: Sync, cfg: Config, leader_id: str) -> dict:
    """The leader's final status in this generation; {} before it is there, or torn."""
    status = sync.get_json(f"status/gen-{cfg.generation}/{leader_id}.json")
    return status if isinstance(status, dict) else {}


def stop_ranks(sync: Sync, cfg: Config, proc: subprocess.Popen | None, reason: str, notice: dict | None,
               instance_id: str, index: int) -> None:
    """SIGTERM to this node's ranks: they agree on a step, rank 0 checkpoints, they exit 143."""
    print(f"scalelab: stopping the ranks ({reason})", file=sys.stderr, flush=True)
    if reason == LAUNCHER_LOST:
        print(f"scalelab: the launcher's heartbeat has not changed for {cfg.heartbeat_timeout_s:.0f} s: checkpointing "
              "and shutting down, so that nothing runs without a launcher", file=sys.stderr, flush=True)
    try:  # before the signal: the other nodes' ranks stop with ours (peer_notice, late_stop_reason read them)
        if notice:
            sync.put_json(f"events/gen-{cfg.generation}/{instance_id}.json", {"event": "spot_interruption",
                                                                           "notice": notice, "time": time.time(),
                                                                           "index": index})
        if cfg.nodes > 1:
            sync.put_json(f"stops/gen-{cfg.generation}/{instance_id}.json", {"reason": reason, "time": time.time()})
    except Exception as exc:  # noqa: BLE001 - S3 failing is no reason to leave the ranks running unsaved
        print(f"scalelab: could not record the stop in S3 ({exc!r}); stopping the ranks anyway", file=sys.stderr,
              flush=True)
    if proc:
        proc.send_signal(signal.SIGTERM)  # horovodrun / torchrun pass it on to their ranks
    signal_local_ranks(cfg.run_dir, exclude=proc.pid if proc else None)


def ranks_stopped_early(run_dir: Path) -> bool:
    """Whether a rank of this node recorded an `interrupted` event (it stopped before the last step)."""
    for path in (Path(run_dir) / "records").glob("rank-*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                if json.loads(line).get("event") == "interrupted":
                    return True
            except (ValueError, AttributeError):
                continue  # a line cut by the stop
    return False


def ranks_stopped_on_a_signal(run_dir: Path) -> bool:
    """Whether every rank of this node recorded that it stopped cleanly on a stop signal (its last `end`
    says interrupted, no `error`, nor one set aside in error-rank-R.jsonl): a signal to one rank (a node agent,
    the OOM killer, a hook), which every rank answered with a checkpoint and a stop (issue #37)."""
    files = list((Path(run_dir) / "records").glob("rank-*.jsonl"))
    if not files:
        return False
    for path in files:
        end, error = None, errors_aside(path).is_file()  # only a rank's `error` records go there
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by the stop
            if isinstance(rec, dict):
                error = error or rec.get("kind") == "error"
                end = rec if rec.get("event") == "end" else end
        if error or end is None or end.get("reason") != "interrupted":
            return False
    return True


def final_state(proc: subprocess.Popen | None, code: int, reason: str | None, stopped: bool = False,
                signalled: bool = False, leader_state: str | None = None) -> str:
    """completed, interrupted (stopped on purpose by this node, with a checkpoint: the launcher replaces
    the capacity), cancelled (a rank was sent a stop signal and every rank stopped with a checkpoint: the
    run ends CANCELLED, whatever exit code torchrun or horovodrun gave) or failed. `stopped`: the ranks'
    records say they stopped early (horovodrun exits 0 when its ranks stopped on its SIGTERM);
    `signalled`: every rank's records say it stopped on a signal. `leader_state`: the leader's final state,
    for a Horovod node without ranks of its own (they belonged to the leader's horovodrun): cancelled as they
    were by a signal to one of them (which this node, having no records, cannot see); an interruption it
    reports only with a reason (late_stop_reason: the leader's), so that no replacement is booked as a notice."""
    if proc is None:
        if reason:
            return "interrupted"
        return "cancelled" if leader_state == "cancelled" else "completed"
    if reason is None and signalled:
        return "cancelled"
    if code == 0:
        return "interrupted" if reason and stopped else "completed"  # a stop too late to matter: completed
    if reason or code in (143, -signal.SIGTERM):
        return "interrupted"
    return "failed"


def main() -> int:
    cfg = Config()
    try:
        return run(cfg)
    except Exception as exc:  # report it: the launcher must not wait for a node that is gone
        said = (str(exc) or repr(exc)) if type(exc) is RuntimeError else repr(exc)  # ours say what to do
        print(f"scalelab bootstrap failed: {said}", file=sys.stderr)
        try:
            import boto3

            boto3.client("s3").put_object(
                Bucket=cfg.bucket, Key=cfg.key(f"status/gen-{cfg.generation}/{os.environ.get('SCALELAB_INSTANCE_ID') or metadata(cfg, 'instance-id')}.json"),
                Body=json.dumps({"state": "failed", "error": said, "time": time.time()}).encode())
        except Exception as exc2:  # noqa: BLE001 - nothing more can be done from here
            print(f"scalelab bootstrap could not report: {exc2!r}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
