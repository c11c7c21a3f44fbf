"""`launch aws ...`: housekeeping for the aws backend.

`launch aws gc` lists every resource tagged by a scalelab run (instances not yet terminated,
detached volumes, security groups, placement groups) and removes them, so that whatever an earlier
crash left does not keep costing money. `--dry-run` only lists.
"""

from __future__ import annotations

import click

from scalelab.core.errors import ScalelabError


def _ec2(region: str | None):
    try:
        import boto3
    except ImportError:
        raise ScalelabError("the aws backend needs boto3: pip install boto3") from None
    session = boto3.Session(region_name=region) if region else boto3.Session()
    if not session.region_name:
        raise ScalelabError("no AWS region: pass --region (e.g. us-east-1) or set AWS_REGION / `aws configure set region`")
    if session.get_credentials() is None:
        raise ScalelabError("no AWS credentials found: run `aws configure`, or set AWS_PROFILE or "
                            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
    return session.client("ec2")


@click.group("aws")
def aws_group() -> None:
    """Housekeeping for runs on AWS (--backend aws)."""


@aws_group.command("gc")
@click.option("--region", type=str, help="Region to clean [default: the boto3 chain].")
@click.option("--run-id", type=str, help="Only this run's resources [default: every scalelab run's].")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
def gc_cmd(region: str | None, run_id: str | None, dry_run: bool) -> None:
    """Terminate instances and delete groups that runs left behind (found by their scalelab:run-id tag)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from scalelab.aws import teardown as td

    if run_id is not None and (not run_id.strip() or any(c.isspace() for c in run_id)):
        raise ScalelabError(f"--run-id {run_id!r}: give a run id (the scalelab:run-id tag, no spaces), "
                            "or leave --run-id out for every scalelab run's resources")
    ec2 = _ec2(region)
    try:
        live = td.instances(ec2, run_id, td.LIVE_STATES)
        problems: list[str] = []
        sgs, pgs = td.groups(ec2, run_id, problems)
        vols = td.volumes(ec2, run_id, ["available"])
        for p in problems:
            click.echo(f"warning: {p}", err=True)
        for i in live:
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            click.echo(f"instance {i['InstanceId']} {i['InstanceType']} {i['State']['Name']} run {tags.get(td.TAG_RUN)}")
        for g in sgs:
            click.echo(f"security-group {g['GroupId']} {g['GroupName']}")
        for g in pgs:
            click.echo(f"placement-group {g['GroupName']}")
        for v in vols:
            click.echo(f"volume {v['VolumeId']} {v['Size']} GB")
        if not (live or sgs or pgs or vols):
            click.echo("nothing left by scalelab runs")
            return
        if dry_run:
            click.echo("(dry run: nothing removed)")
            return
        runs = sorted({td._tagged(r, run_id) for r in [*live, *sgs, *pgs, *vols]} - {None})
        for rid in runs:
            removed = td.teardown(ec2, rid)
            click.echo(f"run {rid}: terminated {len(removed['instances'])} instance(s), deleted "
                       f"{len(removed['volumes'])} volume(s), {len(removed['security_groups'])} security group(s) "
                       f"and {len(removed['placement_groups'])} placement group(s)"
                       + (f"; kept {', '.join(removed['kept'])}" if removed["kept"] else ""))
    except (ClientError, BotoCoreError) as exc:
        raise ScalelabError(f"AWS refused the clean-up: {exc}") from None
