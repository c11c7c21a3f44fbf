"""Find and remove everything a run created, by its tag: instances first, then volumes, placement and security groups.

Used on every exit path of a run (success, failure, Ctrl-C, exceptions) and by `launch aws gc` for
whatever an earlier crash left. Security and placement groups can only be deleted once their
instances are gone, so termination is waited for (bounded); a group that still cannot be deleted
is reported, never silently kept. Root volumes go with their instances (DeleteOnTermination); a
volume of the run left `available` (detached, or a request changed by hand) is deleted too, since
it costs money every month.
"""

from __future__ import annotations

from typing import Any, Callable

from scalelab.aws.render import TAG_GENERATION, TAG_RUN
from scalelab.core.waiting import wait_until

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


def _tagged(resource: dict[str, Any], run_id: str | None) -> str | None:
    tags = {t["Key"]: t["Value"] for t in resource.get("Tags", []) or []}
    value = tags.get(TAG_RUN)
    if value is None or (run_id is not None and value != run_id):
        return None
    return value


def instances(ec2, run_id: str | None = None, states: list[str] | None = None, generation: int | None = None) -> list[dict]:
    """The run's instances (every scalelab run's when `run_id` is None) in the given states."""
    filters = [{"Name": "tag:" + TAG_RUN, "Values": [run_id]} if run_id else {"Name": "tag-key", "Values": [TAG_RUN]}]
    if generation is not None:
        filters.append({"Name": "tag:" + TAG_GENERATION, "Values": [str(generation)]})
    if states:
        filters.append({"Name": "instance-state-name", "Values": states})
    out = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for res in page["Reservations"]:
            out += res["Instances"]
    return out


def volumes(ec2, run_id: str | None = None, states: list[str] | None = None) -> list[dict]:
    """The run's EBS volumes (every scalelab run's when `run_id` is None) in the given states."""
    filters = [{"Name": "tag:" + TAG_RUN, "Values": [run_id]} if run_id else {"Name": "tag-key", "Values": [TAG_RUN]}]
    if states:
        filters.append({"Name": "status", "Values": states})
    return [v for page in ec2.get_paginator("describe_volumes").paginate(Filters=filters) for v in page["Volumes"]]


def groups(ec2, run_id: str | None = None, problems: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    """(security groups, placement groups) tagged with the run id (any scalelab run when None).

    A region (or an emulator) that cannot list placement groups does not stop the clean-up: the
    failure is added to `problems` (placement groups cost nothing; instances do).
    """
    sgs = [g for g in ec2.describe_security_groups()["SecurityGroups"] if _tagged(g, run_id)]
    try:
        pgs = [g for g in ec2.describe_placement_groups().get("PlacementGroups", []) if _tagged(g, run_id)]
    except Exception as exc:  # noqa: BLE001 - ClientError, or an unparseable answer from an emulator
        pgs = []
        if problems is not None:
            problems.append(f"placement groups not listed ({exc})")
    return sgs, pgs


def groups_sg_only(ec2, run_id: str | None) -> list[dict]:
    return [g for g in ec2.describe_security_groups()["SecurityGroups"] if _tagged(g, run_id)]


def terminate(ec2, ids: list[str]) -> None:
    for i in range(0, len(ids), 500):
        ec2.terminate_instances(InstanceIds=ids[i:i + 500])


def teardown(ec2, run_id: str | None, wait_s: float = 600, poll_s: float = 5,
             placement_groups: list[str] | None = None,
             give_up: Callable[[], bool] | None = None) -> dict[str, list[str]]:
    """Terminate the run's instances, wait for them to go, delete its groups; return what was removed.

    `placement_groups`: the names the run created, when known (the launcher knows them); None
    finds them by tag (`launch aws gc`). `give_up()` true (a second Ctrl-C) ends the wait for the
    terminations: the instances are going already, and a group that cannot be deleted yet is
    reported as kept for `launch aws gc`.
    """
    live = [i["InstanceId"] for i in instances(ec2, run_id, LIVE_STATES)]
    if live:
        terminate(ec2, live)
    wait_until(lambda: (give_up is not None and give_up()) or not instances(ec2, run_id, LIVE_STATES), wait_s,
               interval_s=poll_s)
    removed: dict[str, list[str]] = {"instances": live, "volumes": [], "security_groups": [], "placement_groups": [],
                                     "kept": []}
    for vol in volumes(ec2, run_id, ["available"]):
        _delete(removed, "volumes", vol["VolumeId"], lambda: ec2.delete_volume(VolumeId=vol["VolumeId"]))
    if placement_groups is None:
        sgs, pgs = groups(ec2, run_id, removed["kept"])
    else:
        sgs, pgs = groups_sg_only(ec2, run_id), [{"GroupName": n} for n in placement_groups]
    for pg in pgs:
        _delete(removed, "placement_groups", pg["GroupName"], lambda: ec2.delete_placement_group(GroupName=pg["GroupName"]))
    for sg in sgs:
        _delete(removed, "security_groups", sg["GroupId"], lambda: ec2.delete_security_group(GroupId=sg["GroupId"]))
    return removed


GONE_CODES = (".NotFound", ".Unknown")  # InvalidGroup.NotFound, InvalidVolume.NotFound, InvalidPlacementGroup.Unknown


def _delete(removed: dict[str, list[str]], kind: str, name: str, call) -> None:
    from botocore.exceptions import ClientError

    try:
        call()
        removed[kind].append(name)
    except ClientError as exc:  # e.g. DependencyViolation while an instance is still shutting down
        if str(exc.response.get("Error", {}).get("Code", "")).endswith(GONE_CODES):
            return  # deleted meanwhile by another teardown of the run (a `launch cancel` beside its launcher)
        removed["kept"].append(f"{name} ({exc.response.get('Error', {}).get('Code')}; `launch aws gc` retries)")
