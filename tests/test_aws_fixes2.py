"""AWS backend fixes against moto's server on loopback: what the launcher says and records after AWS failed it
(an endpoint lost mid-run, a missing bucket), resume generations, instances ended outside scalelab, `launch aws gc`
of a region that does not exist, `launch cancel` of a run recorded ended."""

from __future__ import annotations

import json
import os

import pytest
from test_aws_moto import REGION, backend, cloud, live, make_spec, run_dir_for  # noqa: F401 - `cloud` is a fixture

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")

from scalelab.aws import teardown as td  # noqa: E402
from scalelab.core.errors import ScalelabError  # noqa: E402
from scalelab.core.rundir import read_state  # noqa: E402
from scalelab.launcher.runner import wait  # noqa: E402


def _unreachable_clients() -> dict:
    """EC2 and S3 clients of an endpoint nothing listens on (port 9 of loopback), one attempt each."""
    from botocore.config import Config

    session = boto3.Session(region_name=REGION, aws_access_key_id="x", aws_secret_access_key="y")
    config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2)
    return {s: session.client(s, endpoint_url="http://127.0.0.1:9", config=config) for s in ("ec2", "s3")}


@pytest.mark.slow
def test_losing_aws_mid_run_says_the_instances_may_still_run_not_that_they_were_terminated(cloud, tmp_path):
    """The endpoint lost while following the run: the error (and launch.json) said "every instance of the run was
    terminated" before any teardown, which then failed; the instance ran on. Now it says they may still run and
    what removes them."""
    be = backend(cloud)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=1), run_dir))
    be._clients = _unreachable_clients()
    try:
        with pytest.raises(ScalelabError) as err:
            wait(be, run_dir)
        said = str(err.value)
        assert "cannot reach AWS while following the run" in said, said
        assert "every instance of the run was terminated" not in said, said
        assert "may still be running" in said and f"launch aws gc --run-id {run_dir.name}" in said, said
        state = read_state(run_dir)
        assert state["state"] == "FAILED" and "every instance of the run was terminated" not in state["detail"], state
        assert "may still be running" in state["detail"], state
        assert len(live(cloud, run_dir.name)) == 1  # what the message says: it still runs
    finally:
        td.teardown(cloud["ec2"], run_dir.name, poll_s=0.01)


def test_a_missing_bucket_is_named_with_its_fix_and_claims_no_termination(cloud, tmp_path):
    """--bucket of a bucket that does not exist: "AWS refused ListObjectsV2 ...: NoSuchBucket ...; every instance of
    the run was terminated" though none had started. Now the bucket, `aws s3 mb`, and only what happened."""
    be = backend(cloud, bucket="scalelab-no-such-bucket-here")
    run_dir = run_dir_for(tmp_path)
    with pytest.raises(ScalelabError) as err:
        be.schedule(be.submit_dryrun(make_spec(nodes=1), run_dir))
    said = str(err.value)
    assert "scalelab-no-such-bucket-here" in said and "aws s3 mb s3://scalelab-no-such-bucket-here" in said, said
    assert "every instance of the run was terminated" not in said and "no instance had been started" in said, said
    assert live(cloud, run_dir.name) == []


def test_a_resume_after_instances_that_never_reported_starts_a_new_generation(cloud, tmp_path):
    """`launch resume` of a run whose nodes never wrote a status: the generation was counted from S3's gen-*
    statuses only, so the resume launched generation 0 again, took the earlier launch's terminated gen-0
    instance for its own lost one and replaced it at once. Now the resume runs generation 1, and a poll leaves it
    running."""
    from scalelab.launcher.runner import cancel

    first = backend(cloud)
    run_dir = run_dir_for(tmp_path)
    first.schedule(first.submit_dryrun(make_spec(nodes=1), run_dir))
    cancel(first, run_dir)
    assert live(cloud, run_dir.name) == []
    again = backend(cloud)
    again.schedule(again.submit_dryrun(make_spec(nodes=1), run_dir))
    state = read_state(run_dir)
    assert state["generation"] == 1 and [i["generation"] for i in state["instances"]] == [1], state
    assert again.poll(run_dir).state == "RUNNING"
    state = read_state(run_dir)
    assert state["generation"] == 1 and state["replacements"] == 0, state
    assert all(i.get("ended") is None for i in state["instances"]), state["instances"]
    again.cancel(run_dir)


def test_an_on_demand_instance_terminated_by_hand_fails_the_run_and_is_not_a_spot_interruption(cloud, tmp_path):
    """An on-demand instance terminated outside scalelab was recorded a spot interruption and replaced, four
    times, then "capacity was interrupted 4 times ... continues from the last checkpoint" with no checkpoint, and
    aws_end said "generations": 0. Now the run fails at once saying what EC2 said, nothing is replaced, no
    checkpoint is promised, and aws_end counts the generation it ran."""
    be = backend(cloud)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=1), run_dir))
    ended = []

    def instance_side() -> None:
        up = td.instances(cloud["ec2"], run_dir.name, ["pending", "running"])
        if up and not ended:
            ended.append(up[0]["InstanceId"])
            cloud["ec2"].terminate_instances(InstanceIds=ended)

    status = wait(be, run_dir, on_tick=instance_side)
    assert status.state == "FAILED", status
    assert f"instance {ended[0]} was terminated outside scalelab" in status.detail, status.detail
    assert "User initiated shutdown" in status.detail, status.detail
    assert "continues from the last checkpoint" not in status.detail and "no checkpoint was saved" in status.detail
    events = [json.loads(x) for x in (run_dir / "records" / "aws-events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert "spot_interruption" not in kinds and "capacity_replaced" not in kinds, kinds
    assert events[-1]["event"] == "aws_end" and events[-1]["generations"] == 1, events[-1]
    assert td.instances(cloud["ec2"], run_dir.name, None, 1) == []
    assert live(cloud, run_dir.name) == []


def test_gc_of_a_region_that_does_not_exist_is_one_line_naming_it(cloud, tmp_path):
    """`launch aws gc --region mars-1` against an endpoint: botocore's ResponseParserError as a 60-line traceback.
    Now the check `launch run --region` makes, before any request: one line, exit 2."""
    from conftest import launch

    env = {**os.environ, "AWS_ENDPOINT_URL": cloud["url"], "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "AWS_DEFAULT_REGION": REGION, "AWS_MAX_ATTEMPTS": "1"}
    out = launch("aws", "gc", "--region", "mars-1", cwd=tmp_path, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--region 'mars-1' is not an AWS region" in lines[0], out.stderr


def test_gc_says_botocore_errors_in_one_line_and_a_connection_failure_is_no_refusal():
    """Every botocore error of the clean-up is one line: an answer that cannot be read (ResponseParserError, not a
    BotoCoreError) was a traceback, and an endpoint out of reach was "AWS refused the clean-up"."""
    from botocore.exceptions import EndpointConnectionError
    from botocore.parsers import ResponseParserError

    from scalelab.aws.cli import _aws_error

    parse = _aws_error(ResponseParserError("Unable to parse response (syntax error), invalid XML received.\nmore"))
    assert parse is not None and "could not be read" in str(parse) and "\n" not in str(parse), parse
    lost = _aws_error(EndpointConnectionError(endpoint_url="http://127.0.0.1:9/"))
    assert lost is not None and "cannot reach AWS" in str(lost) and "refused" not in str(lost), lost
    assert _aws_error(ValueError("a bug")) is None


def test_cancel_of_a_run_recorded_ended_says_what_it_terminated(cloud, tmp_path):
    """`launch cancel` of an AWS run recorded ended whose instance still ran: it terminated the instance and said
    "it had ended already; nothing to stop". Now it says what it terminated."""
    from scalelab.core.rundir import record_state
    from scalelab.launcher.runner import cancel

    be = backend(cloud)
    run_dir = run_dir_for(tmp_path)
    be.schedule(be.submit_dryrun(make_spec(nodes=1), run_dir))
    up = [i["InstanceId"] for i in live(cloud, run_dir.name)]
    record_state(run_dir, "FAILED", "the launcher stopped following it")
    status = cancel(backend(cloud), run_dir)
    assert status.state == "FAILED", status
    assert "nothing to stop" not in status.detail and f"terminated 1 instance(s): {up[0]}" in status.detail, status
    assert live(cloud, run_dir.name) == []
    again = cancel(backend(cloud), run_dir)  # nothing left now: that is said
    assert "nothing to stop" in again.detail, again
