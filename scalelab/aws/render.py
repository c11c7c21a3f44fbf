"""The EC2 and S3 requests of an aws run, and the user-data script, as pure functions.

`--dry-run` prints `AwsRequest.render()`: the exact API calls (service, operation, parameters) in
the order they are sent. Two values exist only once earlier calls have answered; they appear as
references and are filled in when sent: `$ref:security_group.GroupId` (the group created for the
run) and `$ref:vpc_of_subnet` (the VPC of `--subnet`). The package body is the wheel built from
this checkout when the run starts. Nothing here reads credentials: user data carries only the
bucket, prefix, region and layout; the instances get their permissions from the instance profile.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.aws.bootstrap import CODE_DIR, LAUNCHER_HEARTBEAT
from scalelab.aws.options import REGION_HINT
from scalelab.core.engines import engine
from scalelab.core.checks import aws_region_problem
from scalelab.core.errors import SpecError
from scalelab.core.launch import code_command, starter_of
from scalelab.core.rundir import is_sweep
from scalelab.core.spec import Spec
from scalelab.core.trajectory import accepted_env
from scalelab.costs.billing import Mix
from scalelab.costs.catalog import load_catalog
from scalelab.launcher.backend import Request

TAG_RUN = "scalelab:run-id"
TAG_GENERATION = "scalelab:generation"
TAG_GROUP = "scalelab:group"
TAG_HEARTBEAT = "scalelab:heartbeat"  # s3://BUCKET/KEY of the launcher's heartbeat: `launch aws gc` reads it
# The region's current AWS Deep Learning AMI (PyTorch, NVIDIA driver), resolved by EC2 itself from
# the public SSM parameter: one name, the right AMI in every region. p2 (K80) needs an older AMI.
DEFAULT_AMI = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id"
# The instance families that AMI supports, from its release notes (docs.aws.amazon.com/dlami, "Deep Learning OSS
# Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 24.04)", supported_ec2_instances): its PyTorch has no kernels for
# older GPUs (K80 of p2, M60 of g3, V100 of p3), so a run there fails at its first CUDA call after the boot
# was paid for.
DEFAULT_AMI_FAMILIES = ("g4dn", "g5", "g6", "gr6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200")


def default_ami_misses(types: list[str], ami: str) -> list[str]:
    """The instance types (in order, each once) the default AMI does not support, when no --ami is given."""
    if ami:
        return []
    return list(dict.fromkeys(t for t in types if t.split(".")[0].lower() not in DEFAULT_AMI_FAMILIES))
from scalelab.launcher import __version__

PACKAGE_NAME = f"scalelab-{__version__}-py3-none-any.whl"
# A --script run's code folder, packed when the run starts (scalelab/launcher/owncode.py: .gitignore respected, the
# size limit checked) and unpacked by every node's bootstrap (scalelab/aws/bootstrap.py, `fetch_code`).
CODE_ARCHIVE = "code.tar.gz"
CODE_BODY = "<tar.gz of your code's folder, packed when the run starts: the files listed under `files`>"
WHEEL_BODY = "<wheel of this checkout, built with `pip wheel --no-deps` when the run starts>"


@dataclass
class Plan:
    """Everything the requests are rendered from: the run, where it goes, and the instances."""

    run_id: str
    region: str
    bucket: str
    prefix: str  # S3 key prefix of this run: PREFIX/<run_id>
    node_types: list[str]  # one instance type per node, in node order
    gpus_per_node: int
    engine: str
    spec_json: str
    options: dict[str, Any]
    gpus_per_instance: dict[str, int] = field(default_factory=dict)  # of node_types, from the catalog
    ranks_per_node: int | None = None  # Spec.ranks_per_node where it is not gpus_per_node (ps separate)
    code_dir: str | None = None  # a --script run: the folder shipped, and its files (inside it) with their bytes
    code_files: list[str] = field(default_factory=list)
    code_bytes: int = 0
    code_runs: str | None = None  # what every rank runs of it, from the folder each node unpacks (the dry run says)
    accepted: dict[str, str] = field(default_factory=dict)  # `launch resume --allow-changed`: the ranks' ACCEPTED_ENV

    @property
    def nodes(self) -> int:
        return len(self.node_types)

    def key(self, *parts: str) -> str:
        return "/".join([self.prefix, *parts])


def cloud_run_id(run_dir: Path) -> str:
    """The id that tags a run's instances, volumes, groups and S3 prefix. A layout of a sweep or a
    probe is named by its layout alone (`1x1`, `g5.xlarge-1x1`), so two sweeps in one bucket would
    share tags and one's teardown would end the other's instances: a layout's id carries its sweep's
    (timestamped, unique) name as well. A sweep's --dry-run layout (RUNS/NAME-DRYRUN/1x1, a directory never made)
    is named as the real one would be, DRYRUN for the date and time: it printed `1x1`, a name no sweep sends."""
    run_dir = Path(run_dir)
    parent = run_dir.parent
    dry_sweep = parent.name.endswith("-DRYRUN") and not run_dir.name.endswith("-DRYRUN")
    return f"{parent.name}-{run_dir.name}" if parent.name and (dry_sweep or is_sweep(parent)) else run_dir.name


def prerequisites_missing(options: Mapping[str, Any], region: str) -> list[str]:
    """What a run on AWS needs before anything can be checked further, all of it at once (issue 35: one
    per attempt made users try three times)."""
    missing = []
    if not options.get("bucket"):
        missing.append("--bucket NAME: an S3 bucket in the run's region for its package, records, logs and "
                       "checkpoints")
    if not region:
        missing.append(f"a region: {REGION_HINT}")
    return missing


def make_plan(spec: Spec, run_dir: Path, options: Mapping[str, Any], region: str) -> Plan:
    """Check the layout against the instance types; raise SpecError on anything impossible.

    Shapes come from the one instance catalog (scalelab/costs/catalog.py: the built-in table, then the
    user's prices file), the same one `launch cost` prices runs with; `--instance-type` is read with
    `Mix.for_nodes` (a bare type is every node, a mix names one instance per node).
    """
    missing = prerequisites_missing(options, region)
    if missing:
        raise SpecError("the aws backend needs " + "; and ".join(missing) + " (the instances also need the IAM "
                        f"instance profile {options.get('instance_profile') or 'scalelab-instance'!r}, "
                        "--instance-profile NAME: docs/aws.md)")
    unknown = aws_region_problem(region)
    if unknown:
        raise SpecError(unknown)
    catalog = load_catalog()
    types = Mix.for_nodes(options["instance_type"], spec.nodes, catalog, provider="aws").node_types()
    gpus = {t: catalog.instance(t, "aws").gpus for t in [*types, *(options.get("fallback_instance_types") or [])]}
    for t, n in gpus.items():
        if n < spec.gpus_per_node:
            raise SpecError(f"{t} has {n} GPU(s) but --gpus-per-node is {spec.gpus_per_node}; "
                            f"use --gpus-per-node {n} or a larger instance type")
    if float(options["heartbeat_timeout_min"]) * 60 < 3 * float(options["poll_s"]):
        raise SpecError(f"heartbeat_timeout_min {options['heartbeat_timeout_min']:g} is shorter than three of the "
                        f"launcher's polls (poll_s {options['poll_s']:g}): the instances would stop themselves while "
                        "it still follows them; raise it or lower poll_s")
    if len(types) > 1 and engine(spec.engine.name).one_worker:
        raise SpecError("engine 'single' runs on one instance; use --engine horovod or ddp for several")
    run_id = cloud_run_id(Path(run_dir))
    prefix = "/".join(p for p in (str(options.get("prefix") or "").strip("/"), run_id) if p)
    plan = Plan(run_id, region, options["bucket"], prefix, types, spec.gpus_per_node, spec.engine.name,
                spec.to_json(), dict(options), {t: gpus[t] for t in types},
                spec.ranks_per_node if spec.ranks_per_node != spec.gpus_per_node else None)
    plan.accepted = accepted_env(Path(run_dir))  # the instances cannot read the launcher's events file
    if spec.own_code:  # the script's folder goes through the run's bucket: size-checked now, before anything is sent
        from scalelab.launcher.owncode import code_files

        files = code_files(spec)
        plan.code_dir, plan.code_files = spec.script_dir, [rel for _, rel in files]
        plan.code_bytes = sum(path.stat().st_size for path, _ in files)
        plan.code_runs = code_command(spec, CODE_DIR)
    return plan


def tags(plan: Plan, **extra: str) -> list[dict[str, str]]:
    """Every resource of the run carries its id, so `launch aws gc` can always find it, and where its
    launcher's heartbeat is, so that gc leaves alone a run a launcher still follows."""
    base = {TAG_RUN: plan.run_id, "Name": f"scalelab-{plan.run_id}",
            TAG_HEARTBEAT: f"s3://{plan.bucket}/{plan.key(LAUNCHER_HEARTBEAT)}", **extra}
    return [{"Key": k, "Value": str(v)} for k, v in base.items()]


def user_data(plan: Plan, generation: int) -> str:
    """The script each instance runs at boot (as root): time limit, install, bootstrap, power off.

    `shutdown -h +N` comes first: with InstanceInitiatedShutdownBehavior=terminate the instance
    terminates itself at the time limit whatever happens to the launcher; sooner, the bootstrap
    stops when the launcher's heartbeat is SCALELAB_HEARTBEAT_TIMEOUT_S old, and the script's last
    line powers the instance off. The SCALELAB_WORK,
    SCALELAB_PYTHON and SCALELAB_METADATA_URL defaults can be overridden from the environment
    (the bootstrap test runs this very script on a workstation).
    """
    minutes = max(1, int(-(-float(plan.options["timeout_min"]) // 1)))
    env = {
        "SCALELAB_RUN_ID": plan.run_id, "SCALELAB_BUCKET": plan.bucket, "SCALELAB_PREFIX": plan.prefix,
        "SCALELAB_GENERATION": str(generation), "SCALELAB_NODES": str(plan.nodes),
        "SCALELAB_GPUS_PER_NODE": str(plan.gpus_per_node), "SCALELAB_ENGINE": plan.engine,
        "SCALELAB_HOROVOD": "1" if starter_of(plan.engine).needs_horovod else "0",
        "SCALELAB_HEARTBEAT_TIMEOUT_S": f"{float(plan.options['heartbeat_timeout_min']) * 60:g}",
        "AWS_DEFAULT_REGION": plan.region,
        **({"SCALELAB_RANKS_PER_NODE": str(plan.ranks_per_node)} if plan.ranks_per_node else {}),
        **plan.accepted,  # the bootstrap passes its environment on to the ranks (and horovodrun to its own)
    }
    exports = "\n".join(f"export {k}={_sh(v)}" for k, v in env.items())
    wheel_key = plan.key("package", PACKAGE_NAME)
    return f"""#!/bin/bash
# scalelab bootstrap, run {plan.run_id}, generation {generation} (rendered by scalelab/aws/render.py; no credentials)
set -uo pipefail
shutdown -h +{minutes} "scalelab time limit" || true
{exports}
: "${{SCALELAB_WORK:=/opt/scalelab}}" "${{SCALELAB_PYTHON:=/opt/pytorch/bin/python}}"
[ -x "$SCALELAB_PYTHON" ] || SCALELAB_PYTHON=python3
export SCALELAB_WORK SCALELAB_PYTHON
mkdir -p "$SCALELAB_WORK" && cd "$SCALELAB_WORK" || exit 1
exec >>"$SCALELAB_WORK/bootstrap.log" 2>&1
"$SCALELAB_PYTHON" -c 'import boto3' 2>/dev/null || "$SCALELAB_PYTHON" -m pip install -q boto3
# Horovod 0.28.1 installed: the pip call below would do nothing, so it is not imported to decide (that imports
# PyTorch: 2 s of CPU); any other Horovod must import, or pip installs 0.28.1, as before
if [ "$SCALELAB_HOROVOD" = 1 ] && ! "$SCALELAB_PYTHON" -c \\
    'from importlib.metadata import version; version("horovod") == "0.28.1" or __import__("horovod.torch")' 2>/dev/null; then
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_GPU_OPERATIONS=NCCL \
    "$SCALELAB_PYTHON" -m pip install -q --no-cache-dir horovod==0.28.1
fi
"$SCALELAB_PYTHON" -c 'import sys, boto3; boto3.client("s3").download_file(*sys.argv[1:])' {_sh(plan.bucket)} {_sh(wheel_key)} {PACKAGE_NAME} \\
  && "$SCALELAB_PYTHON" -m pip install -q --force-reinstall --no-deps {PACKAGE_NAME} \\
  && {{ "$SCALELAB_PYTHON" -m scalelab.aws.deps || "$SCALELAB_PYTHON" -m pip install -q {PACKAGE_NAME}; }} \\
  && "$SCALELAB_PYTHON" -m scalelab.aws.bootstrap
echo "scalelab: bootstrap exited with $?"
shutdown -h now "scalelab run ended"
"""


def _sh(value: str) -> str:
    import shlex

    return shlex.quote(str(value))


def run_instances_calls(plan: Plan, generation: int, node_types: list[str] | None = None) -> list[dict[str, Any]]:
    """One RunInstances call per run of consecutive nodes of the same type (node order is rank order)."""
    node_types = node_types or plan.node_types
    o = plan.options
    groups: list[tuple[str, int]] = []
    for t in node_types:
        if groups and groups[-1][0] == t:
            groups[-1] = (t, groups[-1][1] + 1)
        else:
            groups.append((t, 1))
    calls = []
    for index, (itype, count) in enumerate(groups):
        params: dict[str, Any] = {
            "ImageId": o.get("ami") or DEFAULT_AMI,
            "InstanceType": itype,
            "MinCount": count,
            "MaxCount": count,
            "UserData": user_data(plan, generation),
            "InstanceInitiatedShutdownBehavior": "terminate",
            "SecurityGroupIds": [o.get("security_group_id") or "$ref:security_group.GroupId"],
            "IamInstanceProfile": {"Name": o["instance_profile"]},
            "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": int(o["volume_gb"]),
                                                                        "VolumeType": "gp3", "DeleteOnTermination": True}}],
            "TagSpecifications": [
                {"ResourceType": rt, "Tags": tags(plan, **{TAG_GENERATION: str(generation), TAG_GROUP: str(index)})}
                for rt in ("instance", "volume")
            ],
        }
        if o.get("subnet_id"):
            params["SubnetId"] = o["subnet_id"]
        if o.get("key_name"):
            params["KeyName"] = o["key_name"]
        pg = placement_group_name(plan)
        if pg:
            params["Placement"] = {"GroupName": pg}
        if o.get("spot"):
            spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if o.get("spot_max_price"):
                spot["MaxPrice"] = f"{float(o['spot_max_price']):.4f}"
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        calls.append({"service": "ec2", "operation": "RunInstances", "params": params})
    return calls


def placement_group_name(plan: Plan) -> str | None:
    """'auto' creates a cluster group per multi-node run; 'none' or '' uses none; else an existing name."""
    value = str(plan.options.get("placement_group") or "none")
    if value == "none":
        return None
    if value == "auto":
        return f"scalelab-{plan.run_id}" if plan.nodes > 1 else None
    return value


def all_calls(plan: Plan) -> list[dict[str, Any]]:
    """Every call of a launch, in order: package and spec to S3, network, placement, instances."""
    o = plan.options
    calls: list[dict[str, Any]] = [
        {"service": "s3", "operation": "PutObject",
         "params": {"Bucket": plan.bucket, "Key": plan.key("package", PACKAGE_NAME), "Body": WHEEL_BODY}},
        {"service": "s3", "operation": "PutObject",
         "params": {"Bucket": plan.bucket, "Key": plan.key("spec.json"), "Body": plan.spec_json}},
    ]
    if plan.code_dir:
        calls.append({"service": "s3", "operation": "PutObject",
                      "params": {"Bucket": plan.bucket, "Key": plan.key("code", CODE_ARCHIVE), "Body": CODE_BODY},
                      "folder": plan.code_dir, "files": plan.code_files, "bytes": plan.code_bytes})
    if not o.get("security_group_id"):
        create: dict[str, Any] = {
            "GroupName": f"scalelab-{plan.run_id}",
            "Description": f"scalelab run {plan.run_id}: traffic only between its instances",
            "TagSpecifications": [{"ResourceType": "security-group", "Tags": tags(plan)}],
        }
        if o.get("subnet_id"):
            create["VpcId"] = "$ref:vpc_of_subnet"
        calls += [
            {"service": "ec2", "operation": "CreateSecurityGroup", "params": create, "name": "security_group"},
            {"service": "ec2", "operation": "AuthorizeSecurityGroupIngress", "params": {
                "GroupId": "$ref:security_group.GroupId",
                "IpPermissions": [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "$ref:security_group.GroupId"}]}],
            }},
        ]
    if str(o.get("placement_group")) == "auto" and placement_group_name(plan):
        calls.append({"service": "ec2", "operation": "CreatePlacementGroup", "params": {
            "GroupName": placement_group_name(plan), "Strategy": "cluster",
            "TagSpecifications": [{"ResourceType": "placement-group", "Tags": tags(plan)}],
        }, "name": "placement_group"})
    return calls + run_instances_calls(plan, 0)


@dataclass
class AwsRequest(Request):
    plan: Plan | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def render(self) -> str:
        p = self.plan
        counts = Counter(p.node_types)
        doc = {
            "run_id": p.run_id, "region": p.region, "s3": f"s3://{p.bucket}/{p.prefix}/",
            "layout": {"instances": dict(counts), "gpus_per_node": p.gpus_per_node,
                       "gpus_per_instance": {t: p.gpus_per_instance[t] for t in counts},
                       "workers": p.nodes * p.gpus_per_node, "engine": p.engine,
                       "balance": json.loads(p.spec_json).get("balance", "static"),
                       "market": "spot" if p.options.get("spot") else "on-demand",
                       "time_limit_min": p.options["timeout_min"]},
            "requests": self.calls,
        }
        if p.code_dir:  # a --script run: what every rank runs, from the folder each node unpacks
            doc["your_code"] = {"runs": p.code_runs, "folder": p.code_dir,
                                "files": len(p.code_files), "bytes": p.code_bytes}
        return json.dumps(doc, indent=2)
