"""Is a launcher still following a run? What `launch aws gc` asks before it removes anything.

gc used to remove every tagged resource, also those of a run that a launcher elsewhere was still
following (that launcher then failed with InvalidGroup.NotFound). Every launcher rewrites its
heartbeat, s3://BUCKET/PREFIX/RUN/control/launcher.json, on each poll (scalelab/aws/backend.py),
and each resource of a run names that object in its `scalelab:heartbeat` tag (runs launched before
the tag: the instances' user data names the bucket and prefix). A run is live while its heartbeat
is younger than the timeout written in it (`heartbeat_timeout_min`): past it, the run's nodes stop
themselves, so no launcher follows it any more. A heartbeat marked `ended` (the launcher tore the
run down) is not live whatever its age.

The age is measured on S3's clock alone (its Date header minus the object's LastModified), so a
skewed clock on the machine that runs gc changes nothing. When the heartbeat cannot be read for
another reason than its absence (AccessDenied, a network error), the run counts as live: gc must
never guess that a run is dead.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from scalelab.aws.render import TAG_HEARTBEAT

DEFAULT_TIMEOUT_S = 600.0  # heartbeats written before they carried their timeout: the option's default
GONE = {"NoSuchKey", "404", "NoSuchBucket", "NotFound"}


@dataclass(frozen=True)
class Launcher:
    """What gc knows of a run's launcher: is it live, and why it says so (one phrase for the user)."""

    live: bool
    why: str


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", []) or []}


def heartbeat_url(ec2, resources: list[dict[str, Any]]) -> str | None:
    """The s3:// address of the run's launcher heartbeat, from its resources' tags, else from the
    user data of one of its instances (runs launched before the tag); None when nothing names it."""
    for r in resources:
        url = _tags(r).get(TAG_HEARTBEAT)
        if url:
            return url
    for r in resources:
        if "InstanceId" not in r:
            continue
        try:
            raw = ec2.describe_instance_attribute(InstanceId=r["InstanceId"], Attribute="userData")
            script = base64.b64decode(raw["UserData"]["Value"]).decode(errors="replace")
        except Exception:  # noqa: BLE001 - no user data readable: nothing names the heartbeat
            continue
        bucket = re.search(r"^export SCALELAB_BUCKET='?([^'\n]+)'?$", script, re.M)
        prefix = re.search(r"^export SCALELAB_PREFIX='?([^'\n]+)'?$", script, re.M)
        if bucket and prefix:
            return f"s3://{bucket.group(1)}/{prefix.group(1)}/control/launcher.json"
    return None


def launcher_of(s3, url: str | None) -> Launcher:
    """Whether a launcher still follows the run whose heartbeat is at `url` (`heartbeat_url` of its resources;
    see the module's note)."""
    if url is None:
        return Launcher(False, "no launcher heartbeat is named by its resources")
    bucket, _, key = url.removeprefix("s3://").partition("/")
    try:
        obj = s3.get_object(Bucket=bucket, Key=key)
        body = _json(obj["Body"].read())
    except Exception as exc:  # noqa: BLE001 - ClientError, or no answer at all
        code = (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")
        if code in GONE:
            return Launcher(False, f"no launcher heartbeat at {url}")
        return Launcher(True, f"its launcher heartbeat {url} could not be read ({code or exc}), so it may be live")
    if body.get("ended"):
        return Launcher(False, "its launcher ended it")
    timeout = _number(body.get("timeout_s")) or DEFAULT_TIMEOUT_S
    age = _server_now(obj) - obj["LastModified"].timestamp()
    who = f"pid {body['pid']} on {body['host']}" if body.get("pid") and body.get("host") else "unknown"
    if age < timeout and _dead_here(body):
        return Launcher(False, f"its launcher ({who}) is gone: no such process on this host, though it wrote its "
                               f"heartbeat {max(age, 0):.0f} s ago")
    if age < timeout:
        return Launcher(True, f"its launcher ({who}) wrote its heartbeat {max(age, 0):.0f} s ago "
                              f"(stale after {timeout / 60:g} min, its --heartbeat-timeout-min)")
    return Launcher(False, f"its launcher heartbeat is {age / 60:.1f} min old (stale after {timeout / 60:g} min)")


def _dead_here(body: dict[str, Any]) -> bool:
    """Whether the heartbeat's launcher ran on this host and its process is gone. Why: gc of a run whose launcher
    had been SIGKILLed seconds before, on the same machine, skipped it as followed ("wrote its heartbeat 6 s ago")
    while `launch status` said no launcher follows it. Another host's pid cannot be asked: its heartbeat's age
    decides, as before."""
    import os
    import socket

    pid = body.get("pid")
    if body.get("host") != socket.gethostname() or isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, another user's
        return False
    return False


def _json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _number(value: Any) -> float | None:
    """A positive, finite timeout, else None (a hand-edited or foreign heartbeat)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _server_now(response: dict[str, Any]) -> float:
    """S3's clock at the answer (its Date header); this machine's clock when the header is missing."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date).timestamp() if date else time.time()
    except (TypeError, ValueError):
        return time.time()
