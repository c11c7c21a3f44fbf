"""The aws backend's options, declared once: defaults, help, flags and checks (no heavy imports).

The CLI reads this module at start to make the `[aws]` flags; `AwsBackend.options` is an instance.
What depends on the spec or the region (do the instance types have the GPUs the layout needs, is
there a bucket and a region) is checked when the requests are planned (scalelab/aws/render.py:make_plan).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scalelab.core.options import MAX_LIMIT_MINUTES, BackendOptions, above, at_least, at_most, option
from scalelab.costs.fleet import CloudFleet
from scalelab.core.spec import DEFAULT_AWS_INSTANCE_TYPE


# Where a region comes from when --region is not given, in the order AWS's own SDKs and CLI read them.
REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
REGION_HINT = ("--region (e.g. us-east-1), the AWS_REGION or AWS_DEFAULT_REGION environment variable, or "
               "`aws configure set region us-east-1`")


# `--time-limit-min 1e9` (1,900 years of instances) was accepted: a limit is what stops a run that hangs, so one past
# a year (Slurm's longest limits are days to weeks) is a typo, not a plan; Slurm's --time has the same cap
MAX_MINUTES = float(MAX_LIMIT_MINUTES)
MINUTES_LIMIT = (f"must be at most {MAX_MINUTES:,.0f} minutes (a year; the instances run, and are billed, until "
                 "then): give the minutes the run may need")


def default_region() -> str:
    """The region without --region: AWS_REGION, then AWS_DEFAULT_REGION, then the profile's `region` in
    ~/.aws/config ('' if none). Why not boto3's chain alone: botocore reads AWS_DEFAULT_REGION only, so
    `AWS_REGION=us-east-1 launch --backend aws ...` was refused by a message that asked for AWS_REGION."""
    for name in REGION_VARIABLES:
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    import boto3  # the callers have said how to install it

    return boto3.Session().region_name or ""  # environment and config files only: no call


def s3_bucket_name(name: str) -> str | None:
    """S3's rules for a general purpose bucket's name, checked where --bucket enters, before any API call
    ('' is left to make_plan, which asks for one). Why: `--bucket 'my bucket'` went through to boto3,
    whose ParamValidationError was a traceback."""
    if not name:
        return None
    rules = [
        (3 <= len(name) <= 63, f"is {len(name)} character{'s' if len(name) != 1 else ''} long; S3 bucket names have "
                               "3 to 63"),
        (re.fullmatch(r"[a-z0-9.-]+", name) is not None,
         "may hold only lowercase letters, digits, dots and hyphens (no spaces, capitals or underscores)"),
        (name[0].isalnum() and name[-1].isalnum(), "must begin and end with a letter or a digit"),
        (".." not in name, "must not hold two dots in a row"),
        (re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name) is None, "must not look like an IP address"),
        (not name.startswith(("xn--", "sthree-", "amzn-s3-demo-")), "must not begin with xn--, sthree- or amzn-s3-demo-"),
        (not name.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")),
         "must not end with -s3alias, --ol-s3, .mrap, --x-s3 or --table-s3"),
    ]
    broken = next((why for ok, why in rules if not ok), None)
    return f"{broken} (S3's naming rules), e.g. my-team-scalelab" if broken else None


MAX_GP3_GIB = 16384  # EC2 refuses a larger gp3 volume (the root volume's type, scalelab/aws/render.py)


def ami_id(value: str) -> str | None:
    """An image EC2 can start: `ami-` and 8 or 17 hex digits, or an SSM parameter (`resolve:ssm:/path`), as
    RunInstances' ImageId takes. Why here: `--ami foo` passed the dry run and failed only at RunInstances,
    after the security group and the upload."""
    if not value or re.fullmatch(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})", value) or re.fullmatch(r"resolve:ssm:\S+", value):
        return None
    return "must be an AMI id (ami- and 8 or 17 hex digits, e.g. ami-0abcdef1234567890) or resolve:ssm:/PARAMETER"


@dataclass(frozen=True)
class AwsOptions(BackendOptions, CloudFleet):
    """EC2 instances, S3 and the limits that keep a run from costing more than asked."""

    backend = "aws"
    provider = "aws"  # the catalog's EC2 prices: one instance per node
    assumed_startup_s = 300.0  # an instance boots and installs the package

    region: str = option("", "AWS region [default: $AWS_REGION, else $AWS_DEFAULT_REGION, else the profile's "
                         "region in ~/.aws/config].", flag="--region")
    instance_type: str = option(DEFAULT_AWS_INSTANCE_TYPE, "EC2 type for every node, or a mix such as 1*g4dn.xlarge+3*g5.xlarge.",
                                flag="--instance-type")
    fallback_instance_types: list[str] = option([], "Type used when the first has no (spot) capacity (repeatable).",
                                                flag="--fallback-instance-type")
    ami: str = option("", "AMI id [default: the region's AWS Deep Learning AMI with PyTorch, via SSM].", ami_id,
                      flag="--ami")
    subnet_id: str = option("", "Subnet to launch into [default: the default VPC's].", flag="--subnet")
    security_group_id: str = option("", "Existing security group [default: one per run, traffic only inside it].",
                                    flag="--security-group")
    placement_group: str = option("auto", "Cluster placement group name; 'auto' creates one per run (several "
                                  "nodes), 'none' uses none.", flag="--placement-group")
    key_name: str = option("", "EC2 key pair for ssh access (optional).", flag="--key-name")
    instance_profile: str = option("scalelab-instance", "IAM instance profile the instances use for S3/EC2.",
                                   flag="--instance-profile")
    bucket: str = option("", "S3 bucket for the package, records, logs and checkpoints (required).", s3_bucket_name,
                         flag="--bucket")
    prefix: str = option("scalelab", "S3 key prefix of the runs.")
    spot: bool = option(False, "Spot instances (interruptions are resumed from checkpoints) or on-demand.",
                        flag="--spot/--on-demand")
    spot_max_price: float | None = option(None, "Spot: highest USD per instance-hour [default: the on-demand price].",
                                          above(0, "must be > 0 USD per instance-hour (EC2 takes no bid of 0): "
                                                   "give the highest price to pay, or leave --max-price out for "
                                                   "the on-demand price"), flag="--max-price")
    timeout_min: float = option(120.0, "Everything is terminated after this many minutes.", above(0),
                                at_most(MAX_MINUTES, MINUTES_LIMIT), flag="--time-limit-min")
    heartbeat_timeout_min: float = option(10.0, "The instances checkpoint and terminate themselves when the "
                                          "launcher's heartbeat in S3 is this many minutes old (a killed "
                                          "launcher, a closed laptop).", above(0), at_most(MAX_MINUTES, MINUTES_LIMIT),
                                          flag="--heartbeat-timeout-min")
    volume_gb: int = option(100, "Root volume of each instance in GB.", at_least(1),
                            at_most(MAX_GP3_GIB, f"must be at most {MAX_GP3_GIB:,}, the largest gp3 volume EC2 "
                                                 "makes (16 TiB)"))
    max_replacements: int = option(3, "Spot capacity replaced at most this often.", at_least(0))
    report_timeout_min: float = option(20.0, "A node that never reports by then fails the run.", above(0))
    interruption_grace_s: float = option(150.0, "Wait this long for the checkpoint after a spot notice.", at_least(0))
    end_grace_s: float = option(60.0, "Once the leader has finished, wait this long for the other instances' last "
                                "records before ending the run.", at_least(0))
    poll_s: float = option(10.0, "Seconds between polls of S3 and EC2 while following a run.", above(0))
    wheel: str = option("", "A prebuilt wheel to ship [default: built from this checkout with pip wheel --no-deps].")

    @classmethod
    def unread(cls, values: Mapping[str, Any]) -> dict[str, tuple[str, str, str]]:
        """--max-price bids for spot capacity: with on-demand instances nothing read it (it was ignored)."""
        if values.get("spot_max_price") is not None and not values.get("spot", False):
            return {"spot_max_price": ("--spot", "the highest bid for spot instances", "--on-demand")}
        return {}
