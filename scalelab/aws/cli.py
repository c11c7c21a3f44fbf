"""`launch aws ...`: housekeeping for the aws backend.

`launch aws gc` lists every resource tagged by a scalelab run (instances not yet terminated,
detached volumes, security groups, placement groups) and removes them, so that whatever an earlier
crash left does not keep costing money. `--dry-run` only lists. A run that a launcher still follows
(its heartbeat in S3 is fresh, scalelab/aws/liveness.py) is skipped and said so: removing it would
break that launcher (InvalidGroup.NotFound) and lose its run; `--run-id RUN --force` removes it anyway.
"""

from __future__ import annotations

import click

from scalelab.aws.options import REGION_HINT, default_region
from scalelab.core.checks import aws_region_problem
from scalelab.core.errors import ScalelabError, SpecError


def _clients(region: str | None):
    """(ec2, s3) clients of one session: gc reads the runs' launcher heartbeats in S3."""
    try:
        import boto3
    except ImportError:
        raise ScalelabError("the aws backend needs boto3: pip install boto3") from None
    session = boto3.Session(region_name=region or default_region() or None)
    if not session.region_name:
        raise ScalelabError(f"no AWS region: give {REGION_HINT}")
    unknown = aws_region_problem(session.region_name)  # as `launch run --region`: before any request
    if unknown:
        raise SpecError(unknown if region else unknown.replace(
            "--region", "the default region (AWS_REGION, AWS_DEFAULT_REGION or ~/.aws/config)", 1) + "; give --region")
    if session.get_credentials() is None:
        raise ScalelabError("no AWS credentials found: run `aws configure`, or set AWS_PROFILE or "
                            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
    return session.client("ec2"), session.client("s3")


@click.group("aws")
def aws_group() -> None:
    """Housekeeping for runs on AWS (--backend aws)."""


@aws_group.command("gc")
@click.option("--region", type=str, help="Region to clean [default: $AWS_REGION, else $AWS_DEFAULT_REGION, else "
              "the profile's region in ~/.aws/config].")
@click.option("--run-id", type=str, help="Only this run's resources [default: every scalelab run's].")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--force", is_flag=True, help="With --run-id: remove the run even if its launcher's heartbeat is fresh.")
def gc_cmd(region: str | None, run_id: str | None, dry_run: bool, force: bool) -> None:
    """Terminate instances and delete groups that runs left behind (found by their scalelab:run-id tag).

    A run whose launcher heartbeat is fresh is skipped (a launcher elsewhere still follows it); see
    scalelab/aws/liveness.py.
    """
    if run_id is not None and (not run_id.strip() or any(c.isspace() for c in run_id)):
        raise ScalelabError(f"--run-id {run_id!r}: give a run id (the scalelab:run-id tag, no spaces), "
                            "or leave --run-id out for every scalelab run's resources")
    if force and run_id is None:
        raise ScalelabError("--force: name the one run to remove whatever its launcher does, with --run-id RUN "
                            "(gc never forces every run at once)")
    ec2, s3 = _clients(region)
    try:
        found = _found(ec2, run_id)
        if not found:
            click.echo("nothing left by scalelab runs")
            return
        runs = _not_followed(ec2, s3, found, force)
        for rid in runs:  # listed once it is known to go: a skipped run's resources stay, so they are not listed
            _list(found[rid], "would remove" if dry_run else "removing")
        if dry_run:
            click.echo("(dry run: nothing removed)")
            return
        for rid, heartbeat in runs.items():
            _remove(ec2, s3, rid, found[rid], heartbeat)
    except Exception as exc:
        error = _aws_error(exc)
        if error is None:
            raise
        raise error from None


def _aws_error(exc: BaseException) -> ScalelabError | None:
    """botocore's error of the clean-up as one line, naming what went wrong: AWS's refusal, an endpoint out of
    reach, an answer that could not be read (ResponseParserError: not AWS, or a region it does not serve); None
    for any other error. Why: a parser error was a 60-line traceback, and a connection failure said "refused"."""
    from botocore.exceptions import BotoCoreError, ClientError

    from scalelab.aws.backend import UNREACHABLE, _refusal

    again = "`launch aws gc` again removes what is left"
    if isinstance(exc, ClientError):
        return ScalelabError(f"AWS refused {exc.operation_name} during the clean-up: {_refusal(exc)}; {again} "
                             "once that is fixed")
    if type(exc).__name__ in UNREACHABLE:
        return ScalelabError(f"cannot reach AWS during the clean-up: {exc}; check the network, --region and "
                             f"AWS_ENDPOINT_URL if set; {again} once AWS can be reached")
    if isinstance(exc, BotoCoreError) or type(exc).__module__.startswith("botocore"):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ScalelabError(f"AWS's answer during the clean-up could not be read ({type(exc).__name__}: {first[:200]}); "
                             f"check --region and AWS_ENDPOINT_URL if set; {again} once that is fixed")
    return None


def _found(ec2, run_id: str | None) -> dict[str, list[dict]]:
    """Every resource tagged by a scalelab run (or by `run_id`), listed, by run id."""
    from scalelab.aws import teardown as td

    live = td.instances(ec2, run_id, td.LIVE_STATES)
    problems: list[str] = []
    sgs, pgs = td.groups(ec2, run_id, problems)
    vols = td.volumes(ec2, run_id, ["available"])
    for p in problems:
        click.echo(f"warning: {p}", err=True)
    by_run: dict[str, list[dict]] = {}
    for r in [*live, *sgs, *pgs, *vols]:
        rid = td._tagged(r, run_id)
        if rid is not None:
            by_run.setdefault(rid, []).append(r)
    return by_run


def _not_followed(ec2, s3, found: dict[str, list[dict]], force: bool) -> dict[str, str | None]:
    """The runs gc may remove: those no launcher follows (its heartbeat stale, ended or absent), each with the
    s3:// address of its heartbeat (`heartbeat_url`: found once, from tags or user data, and `_record_gc`
    writes beside it); each run skipped is said, with why and how to remove it anyway."""
    from scalelab.aws.liveness import heartbeat_url, launcher_of

    runs: dict[str, str | None] = {}
    for rid in sorted(found):
        url = heartbeat_url(ec2, found[rid])
        launcher = launcher_of(s3, url)
        if launcher.live and not force:
            click.echo(f"run {rid}: skipped, a launcher still follows it: {launcher.why}; stop it there (Ctrl-C, "
                       f"or `launch cancel RUN_DIR`), wait until its heartbeat is stale, or remove it anyway with "
                       f"`launch aws gc --run-id {rid} --force`", err=True)
            continue
        if launcher.live:
            click.echo(f"run {rid}: removing it although {launcher.why} (--force)", err=True)
        runs[rid] = url
    return runs


def _list(resources: list[dict], doing: str) -> None:
    """The resources of one run gc removes, a line each (stdout). Why only those: gc listed every resource found,
    a skipped run's too, so its output read as if the instances of a run a launcher follows had been removed."""
    from scalelab.aws import teardown as td

    for r in resources:
        if "InstanceId" in r:
            what = f"instance {r['InstanceId']} {r['InstanceType']} {r['State']['Name']} run {td._tagged(r, None)}"
        elif "GroupId" in r:
            what = f"security-group {r['GroupId']} {r['GroupName']}"
        elif "VolumeId" in r:
            what = f"volume {r['VolumeId']} {r['Size']} GB"
        else:
            what = f"placement-group {r['GroupName']}"
        click.echo(f"{doing}: {what}")


def _remove(ec2, s3, rid: str, resources: list[dict], heartbeat: str | None) -> None:
    from scalelab.aws import teardown as td

    _record_gc(s3, heartbeat, resources)  # first: a run gc is ending says so, whatever the teardown meets
    removed = td.teardown(ec2, rid)
    click.echo(f"run {rid}: terminated {len(removed['instances'])} instance(s), deleted "
               f"{len(removed['volumes'])} volume(s), {len(removed['security_groups'])} security group(s) "
               f"and {len(removed['placement_groups'])} placement group(s)"
               + (f"; kept {', '.join(removed['kept'])}" if removed["kept"] else ""))


def _record_gc(s3, url: str | None, resources: list[dict]) -> None:
    """Put control/gc.json beside the run's launcher heartbeat at `url` (its prefix in S3): `launch status` of the
    run then records it CANCELLED by gc, with when and from where (AwsBackend.status). Why: after `gc --run-id R
    --force` the run stayed UNKNOWN ("the launcher did not record how the run ended") for ever. Nothing names the
    prefix (no heartbeat tag, no user data): nothing is put; a put S3 refuses does not stop the clean-up."""
    import json
    import socket
    import time

    from scalelab.aws.bootstrap import GC_RECORD, LAUNCHER_HEARTBEAT

    if not url or not url.endswith("/" + LAUNCHER_HEARTBEAT):
        return
    bucket, _, key = url.removeprefix("s3://").partition("/")
    body = {"time": time.time(), "host": socket.gethostname(), "instances": sum("InstanceId" in r for r in resources)}
    try:
        s3.put_object(Bucket=bucket, Key=key.removesuffix(LAUNCHER_HEARTBEAT) + GC_RECORD,
                      Body=json.dumps(body).encode())
    except Exception as exc:  # noqa: BLE001 - the clean-up matters more than its record
        click.echo(f"warning: could not record the clean-up in s3://{bucket}/{key.rsplit('/', 1)[0]}/ ({exc})", err=True)
