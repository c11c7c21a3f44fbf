"""The aws backend's pure parts: the EC2/S3 requests, the user-data script, the layout checks.

No AWS is touched: rendering is a pure function of the spec, the run directory and the options.
Golden files (tests/golden/aws-*.{json,sh}) pin the requests; `SCALELAB_UPDATE_GOLDEN=1` rewrites
them after an intended change, and a mismatch shows a unified diff.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import launch

from scalelab.aws.backend import AwsBackend
from scalelab.aws.bootstrap import trainer_command
from scalelab.aws.options import AwsOptions
from scalelab.aws.render import DEFAULT_AMI, DEFAULT_AMI_FAMILIES, TAG_RUN, all_calls, make_plan, user_data
from scalelab.core.errors import SpecError
from scalelab.core.launch import TORCHRUN_PREFIX, TORCHRUN_PREFIX_ENV
from scalelab.core.spec import EngineSpec, Spec
from scalelab.costs.catalog import builtin_catalog
from tests.conftest import assert_golden

GOLDEN = Path(__file__).parent / "golden"
OPTIONS = AwsOptions(bucket="scalelab-test-bucket", region="us-east-1")


@pytest.fixture(autouse=True)
def _no_user_prices(tmp_path, monkeypatch):
    """Shapes come from the instance catalog, which reads the user's prices file: never the real one."""
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "prices.json"))


def spec(**kw) -> Spec:
    raw = {"backend": "aws", "nodes": 2, "engine": {"name": "horovod"}, "steps": 20, **kw}
    return Spec.from_dict(raw)


def check_golden(name: str, text: str) -> None:
    assert_golden(GOLDEN / name, text)


def calls_without_spec_body(plan) -> list[dict]:
    """The spec body changes whenever Spec gains a field; it is checked separately."""
    calls = json.loads(json.dumps(all_calls(plan)))
    for c in calls:
        if c["params"].get("Key", "").endswith("spec.json"):
            c["params"]["Body"] = "<spec.json>"
    return calls


def test_requests_match_golden_files():
    opts = {**OPTIONS, "spot": True, "spot_max_price": 0.5, "key_name": "mykey", "instance_type": "g3.4xlarge"}
    plan = make_plan(spec(), Path("runs/nmt-tiny-DRYRUN"), opts, "us-east-1")
    check_golden("aws-requests.json", json.dumps(calls_without_spec_body(plan), indent=2) + "\n")
    check_golden("aws-user-data.sh", user_data(plan, 0))


def test_ps_separate_user_data_matches_its_golden_file():
    """`--ps-placement separate`: the one line more is the ranks each instance starts (its GPU's worker and
    a parameter-server rank); the colocated user data above has none, so it is unchanged."""
    plan = make_plan(spec(engine={"name": "ps", "ps_placement": "separate"}), Path("runs/ps-DRYRUN"), OPTIONS,
                     "us-east-1")
    script = user_data(plan, 0)
    check_golden("aws-user-data-ps-separate.sh", script)
    assert "export SCALELAB_GPUS_PER_NODE=1\n" in script and "export SCALELAB_RANKS_PER_NODE=2\n" in script


def test_spot_tags_placement_and_security_group():
    opts = {**OPTIONS, "spot": True, "spot_max_price": 0.3, "instance_type": "1*p2.xlarge+3*g3.4xlarge"}
    plan = make_plan(spec(nodes=4), Path("runs/mix-1"), opts, "us-east-1")
    calls = all_calls(plan)
    ops = [c["operation"] for c in calls]
    assert ops == ["PutObject", "PutObject", "CreateSecurityGroup", "AuthorizeSecurityGroupIngress",
                   "CreatePlacementGroup", "RunInstances", "RunInstances"]
    runs = [c["params"] for c in calls if c["operation"] == "RunInstances"]
    assert [(r["InstanceType"], r["MinCount"], r["MaxCount"]) for r in runs] == [("p2.xlarge", 1, 1), ("g3.4xlarge", 3, 3)]
    for r in runs:
        assert r["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "0.3000"}}
        assert r["InstanceInitiatedShutdownBehavior"] == "terminate"
        assert r["Placement"] == {"GroupName": "scalelab-mix-1"}
        assert r["ImageId"] == DEFAULT_AMI
        for spec_ in r["TagSpecifications"]:
            assert {"Key": TAG_RUN, "Value": "mix-1"} in spec_["Tags"]
    ingress = calls[3]["params"]["IpPermissions"]
    assert ingress == [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "$ref:security_group.GroupId"}]}]
    assert "IpRanges" not in json.dumps(ingress)  # nothing from outside the group


def test_options_change_the_requests():
    opts = {**OPTIONS, "security_group_id": "sg-123", "placement_group": "none", "ami": "ami-42", "subnet_id": "subnet-7"}
    calls = all_calls(make_plan(spec(), Path("runs/r"), opts, "eu-west-1"))
    assert [c["operation"] for c in calls] == ["PutObject", "PutObject", "RunInstances"]
    params = calls[-1]["params"]
    assert params["SecurityGroupIds"] == ["sg-123"] and params["ImageId"] == "ami-42"
    assert params["SubnetId"] == "subnet-7" and "Placement" not in params and "InstanceMarketOptions" not in params
    one = all_calls(make_plan(spec(nodes=1, engine={"name": "single"}), Path("runs/r"), OPTIONS, "us-east-1"))
    assert "CreatePlacementGroup" not in [c["operation"] for c in one]  # one node: no cluster group


def test_user_data_holds_no_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLELEAKCHECK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret/LEAK/check/value")
    text = json.dumps(all_calls(make_plan(spec(), Path("runs/r"), OPTIONS, "us-east-1")))
    assert "AKIAEXAMPLELEAKCHECK" not in text and "secret/LEAK/check/value" not in text
    script = user_data(make_plan(spec(), Path("runs/r"), OPTIONS, "us-east-1"), 3)
    assert "SCALELAB_GENERATION=3" in script and "shutdown -h +120" in script


@pytest.mark.parametrize("text,nodes,want", [
    ("g3.4xlarge", 3, ["g3.4xlarge"] * 3),
    ("1*p2.xlarge+3*g3.4xlarge", 4, ["p2.xlarge"] + ["g3.4xlarge"] * 3),
    ("g3.16xlarge+p3.8xlarge", 2, ["g3.16xlarge", "p3.8xlarge"]),
])
def test_instance_mix(text, nodes, want):
    plan = make_plan(spec(nodes=nodes), Path("runs/r"), {**OPTIONS, "instance_type": text}, "us-east-1")
    assert plan.node_types == want


@pytest.mark.parametrize("text,nodes,msg", [
    ("g9.huge", 1, "unknown instance type 'g9.huge'; known: g3.16xlarge"),
    ("1*p2.xlarge+3*g3.4xlarge", 2, "has 4 instances but there are 2 nodes (--nodes); pass --nodes 4"),
    ("2x*g3.4xlarge", 2, "cannot read instances '2x*g3.4xlarge': term '2x*g3.4xlarge'"),
])
def test_bad_instance_types(text, nodes, msg):
    with pytest.raises(SpecError) as err:
        make_plan(spec(nodes=nodes), Path("runs/r"), {**OPTIONS, "instance_type": text}, "us-east-1")
    assert msg in str(err.value)


def test_every_catalog_type_launches_with_its_gpus():
    """The backend launches exactly the catalog's AWS types, with the catalog's GPU counts."""
    cat = builtin_catalog()
    for name, inst in cat.instances.items():
        opts = {**OPTIONS, "instance_type": name}
        plan = make_plan(spec(nodes=1, gpus_per_node=inst.gpus), Path("runs/r"), opts, "us-east-1")
        assert plan.gpus_per_instance == {name: inst.gpus} and cat.price(name).usd_per_hour > 0
        with pytest.raises(SpecError, match=f"{name} has {inst.gpus} GPU"):
            make_plan(spec(nodes=1, gpus_per_node=inst.gpus + 1), Path("runs/r"), opts, "us-east-1")


def test_prices_file_instances_are_launchable_rates_are_not(tmp_path, monkeypatch):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"instances": [{"name": "g9.test", "gpus": 2, "gpu_model": "X1"}],
                                  "rates": [{"name": "slurm", "usd_per_gpu_hour": 0.45}]}))
    monkeypatch.setenv("SCALELAB_PRICES", str(prices))
    plan = make_plan(spec(gpus_per_node=2), Path("runs/r"), {**OPTIONS, "instance_type": "g9.test"}, "us-east-1")
    assert plan.node_types == ["g9.test", "g9.test"] and plan.gpus_per_instance == {"g9.test": 2}
    with pytest.raises(SpecError, match="unknown instance type 'slurm'"):
        make_plan(spec(), Path("runs/r"), {**OPTIONS, "instance_type": "slurm"}, "us-east-1")
    with pytest.raises(SpecError, match="unknown instance type 'slurm'"):
        make_plan(spec(), Path("runs/r"), {**OPTIONS, "fallback_instance_types": ["slurm"]}, "us-east-1")


def test_layout_must_fit_the_instance():
    with pytest.raises(SpecError, match="g4dn.xlarge has 1 GPU.*--gpus-per-node is 4"):  # the default type
        make_plan(spec(gpus_per_node=4), Path("runs/r"), OPTIONS, "us-east-1")
    with pytest.raises(SpecError, match="--bucket"):
        make_plan(spec(), Path("runs/r"), {**OPTIONS, "bucket": ""}, "us-east-1")
    with pytest.raises(SpecError, match="a region: --region"):
        make_plan(spec(), Path("runs/r"), OPTIONS, "")
    with pytest.raises(SpecError, match="--bucket NAME.*; and a region: --region.*instance profile 'scalelab-instance'"):
        make_plan(spec(), Path("runs/r"), {**OPTIONS, "bucket": ""}, "")  # every prerequisite at once (issue 35)
    plan = make_plan(spec(gpus_per_node=4), Path("runs/r"), {**OPTIONS, "instance_type": "g3.16xlarge"}, "us-east-1")
    assert json.loads(__import__("scalelab.aws.render").aws.render.AwsRequest(Path("r"), plan, []).render())["layout"]["workers"] == 8


def test_trainer_commands():
    """Each node's launch comes from the engine's plan: horovodrun on the leader only, Horovod's fusion
    settings in its environment; one torchrun per node with the first host as the master."""
    hosts = ["10.0.0.1", "10.0.0.2"]
    horovod = Spec(engine=EngineSpec(name="horovod", fusion_threshold_mb=32), nodes=2, gpus_per_node=4, batch_per_worker=8)
    hvd = trainer_command(horovod, "py", Path("/w/r"), hosts, 0, ssh_key="/k")
    assert hvd.argv[:3] == ["py", "-m", "scalelab.core.horovodrun"]
    assert hvd.argv[hvd.argv.index("-np") + 1] == "8" and hvd.argv[hvd.argv.index("-H") + 1] == "10.0.0.1:4,10.0.0.2:4"
    assert hvd.argv[hvd.argv.index("--ssh-identity-file") + 1] == "/k"
    assert hvd.env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert trainer_command(horovod, "py", Path("/w/r"), hosts, 1) is None  # the leader starts its ranks
    ddp = trainer_command(Spec(nodes=2, gpus_per_node=2, batch_per_worker=8), "py", Path("/w/r"), hosts, 1)
    assert "--node-rank=1" in ddp.argv and "--master-addr=10.0.0.1" in ddp.argv and "--nproc-per-node=2" in ddp.argv
    assert ddp.argv[-3:] == ["-m", "scalelab.train", "/w/r"] and ddp.env == {TORCHRUN_PREFIX_ENV: TORCHRUN_PREFIX}


def test_unknown_backend_option_lists_valid_ones():
    with pytest.raises(SpecError, match="valid options: region"):
        AwsBackend({"regoin": "us-east-1"})


def test_cli_dry_run_prints_requests_and_calls_nothing(tmp_path):
    # An endpoint nobody listens on: any call would fail, so a clean exit proves nothing was sent.
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    out = launch("--backend", "aws", "--instance-type", "g3.4xlarge", "--nodes", "4", "--engine", "horovod",
                 "--spot", "--bucket", "bkt", "--region", "eu-west-1", "--dry-run", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["region"] == "eu-west-1" and doc["layout"]["instances"] == {"g3.4xlarge": 4}
    assert doc["requests"][-1]["params"]["MinCount"] == 4
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cli_errors_are_one_line(tmp_path):
    env = {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
           "AWS_DEFAULT_REGION": "", "AWS_REGION": ""}
    out = launch("--backend", "aws", "--bucket", "bkt", "--dry-run", cwd=tmp_path, env=env)
    assert out.returncode == 2 and "a region: --region" in out.stderr and "Traceback" not in out.stderr
    out = launch("--backend", "aws", "--bucket", "bkt", "--region", "us-east-1", "--instance-type", "g3.4xlarge",
                 "--gpus-per-node", "2", "--dry-run", cwd=tmp_path, env=env)
    assert out.returncode == 2 and "--gpus-per-node is 2" in out.stderr
    out = launch("--bucket", "bkt", "--dry-run", cwd=tmp_path)
    assert out.returncode == 2 and "--backend aws" in out.stderr


def test_the_launchers_events_are_checked_records(tmp_path: Path) -> None:
    """aws-events.jsonl is written by the one record writer: the `event` schema, without rank (the launcher)."""
    from scalelab.aws import mirror

    mirror.event(tmp_path, "aws_end", state="COMPLETED", lost_s=1.5, instance_seconds={"g3.4xlarge/spot": 60.0})
    (line,) = (tmp_path / "records" / mirror.EVENTS_FILE).read_text().splitlines()
    record = json.loads(line)
    assert (record["kind"], record["event"], record["state"], record["lost_s"]) == ("event", "aws_end", "COMPLETED", 1.5)
    assert "rank" not in record and isinstance(record["time"], float)
    with pytest.raises(ValueError, match="'event' must be a string"):
        mirror.event(tmp_path, 7)
    with pytest.raises(ValueError, match="out of range|not JSON compliant"):
        mirror.event(tmp_path, "aws_end", lost_s=float("nan"))
    assert len((tmp_path / "records" / mirror.EVENTS_FILE).read_text().splitlines()) == 1, "a refused record is not written"


def test_layouts_of_two_sweeps_are_tagged_apart(tmp_path):
    """A sweep's layout directories are named by the layout alone (`1x1`): two sweeps in one bucket
    must still tag, group and prefix their instances apart, or one's teardown ends the other's."""
    plans = []
    for sweep in ("sweep-a-20261125-010101", "sweep-b-20261125-020202"):
        (tmp_path / sweep / "1x1").mkdir(parents=True)
        (tmp_path / sweep / "sweep.json").write_text(json.dumps({"runs": ["1x1"]}))
        plans.append(make_plan(spec(), tmp_path / sweep / "1x1", OPTIONS, "us-east-1"))
    assert [p.run_id for p in plans] == ["sweep-a-20261125-010101-1x1", "sweep-b-20261125-020202-1x1"]
    tags = [{t["Value"] for c in all_calls(p) if c["operation"] == "RunInstances"
             for s in c["params"]["TagSpecifications"] for t in s["Tags"] if t["Key"] == TAG_RUN} for p in plans]
    assert tags[0] == {plans[0].run_id} and tags[1] == {plans[1].run_id}
    assert plans[0].prefix != plans[1].prefix
    single = make_plan(spec(), tmp_path / "nmt-tiny-single-1x1-20261125-030303", OPTIONS, "us-east-1")
    assert single.run_id == "nmt-tiny-single-1x1-20261125-030303"  # a lone run keeps its directory's name


def test_a_type_the_default_ami_does_not_support_is_noted_once_with_the_fix(capsys):
    """The default AMI (AWS Deep Learning AMI OSS Nvidia Driver PyTorch 2.9) supports G4dn, G5, G6, Gr6, G6e, P4,
    P4de, P5, P5e, P5en and P6-B200 (its release notes): its PyTorch has no kernels for g3's M60 or p2's K80, so
    such a run failed at its first CUDA call after the boot was paid for, and g3.4xlarge was the default. The
    default is now g4dn.xlarge, and another type without --ami gets one note naming the supported ones."""
    from scalelab.aws import backend as aws_backend
    from scalelab.aws.backend import AwsBackend
    from scalelab.core.spec import DEFAULT_AWS_INSTANCE_TYPE

    assert DEFAULT_AWS_INSTANCE_TYPE.split(".")[0] in DEFAULT_AMI_FAMILIES
    aws_backend._NOTED.clear()
    AwsBackend({**OPTIONS, "instance_type": "g3.4xlarge"}).check(spec())
    AwsBackend({**OPTIONS, "instance_type": "g3.4xlarge"}).check(spec())  # a sweep's next layout: no second note
    said = capsys.readouterr().err
    assert said.count("note: g3.4xlarge: not among the types the default AMI supports") == 1, said
    assert "--ami" in said and "g4dn" in said
    AwsBackend({**OPTIONS, "instance_type": "p2.xlarge", "ami": "ami-0123456789abcdef0"}).check(spec())
    AwsBackend({**OPTIONS, "instance_type": "g5.xlarge"}).check(spec())
    assert capsys.readouterr().err == ""  # an image of the user's own, or a supported type: nothing to say


def test_a_dry_run_makes_the_backends_checks_and_says_its_notes(tmp_path):
    """`--dry-run` returned before the backend's checks: a p2.xlarge without --ami had no note that the default
    AMI cannot use its GPU (docs/aws.md promises it), and values AWS refuses (a 100,000 GiB gp3 volume, an AMI
    that is no AMI id, a wheel that does not exist) printed a plan. Now the same note and one-line refusals,
    exit 2, still with no call (the endpoint listens nowhere)."""
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    base = ("--backend", "aws", "--bucket", "bkt-rev", "--region", "us-east-1", "--dry-run")
    out = launch(*base, "--instance-type", "p2.xlarge", cwd=tmp_path, env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["layout"]["instances"] == {"p2.xlarge": 1}, out.stderr
    assert "note: p2.xlarge: not among the types the default AMI supports" in out.stderr, out.stderr
    for flags, says in [(("--backend-opt", "volume_gb=100000"), "volume_gb must be at most 16,384, the largest gp3 volume"),
                        (("--ami", "foo"), "must be an AMI id"),
                        (("--backend-opt", f"wheel={tmp_path / 'none.whl'}"), f"wheel={tmp_path / 'none.whl'}: no such file")]:
        out = launch(*base, *flags, cwd=tmp_path, env=env)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, (flags, out.stderr)
        assert out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, (flags, out.stderr)
    out = launch(*base, "--ami", "ami-0123456789abcdef0", "--backend-opt", "volume_gb=16384", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr  # the largest gp3 volume, an image id of AWS's form
    assert not (tmp_path / "runs").exists()


def test_the_time_limit_warning_says_durations_that_can_be_compared(tmp_path):
    """A 20 s run under --time-limit-min 0.2 was warned "the expected 0 min is longer than --time-limit-min 0.2"."""
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    out = launch("--backend", "aws", "--bucket", "bkt-rev", "--region", "us-east-1", "--time-limit-min", "0.2",
                 "--dry-run", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "the expected 20 s is longer than --time-limit-min 0.2 (12 s)" in out.stderr, out.stderr


def test_a_sweeps_dry_run_shows_the_names_the_sweep_sends(tmp_path):
    """The AWS sweep dry run printed run id `1x1` (its S3 prefix and security group too), while the real sweep
    tags `sweep-nmt-tiny-strong-<date-time>-1x1`, and --name was ignored: the names are now the real ones, DRYRUN
    in place of the date and time, as `launch run --dry-run` says them."""
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    base = ("sweep", "--backend", "aws", "--bucket", "bkt-rev", "--region", "us-east-1", "--layouts", "1x1,2x1",
            "--global-batch", "16", "--dry-run")
    out = launch(*base, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    docs = [json.loads("{" + part) for part in out.stdout.strip().lstrip("{").split("\n{")]
    assert [d["run_id"] for d in docs] == ["sweep-nmt-tiny-strong-DRYRUN-1x1", "sweep-nmt-tiny-strong-DRYRUN-2x1"]
    assert docs[0]["s3"] == "s3://bkt-rev/scalelab/sweep-nmt-tiny-strong-DRYRUN-1x1/"
    groups = [c["params"]["GroupName"] for c in docs[1]["requests"] if c["operation"] == "CreateSecurityGroup"]
    assert groups == ["scalelab-sweep-nmt-tiny-strong-DRYRUN-2x1"]
    out = launch(*base, "--name", "mysw", cwd=tmp_path, env=env)
    assert out.returncode == 0 and '"run_id": "mysw-DRYRUN-1x1"' in out.stdout, out.stderr
    assert not (tmp_path / "runs").exists()
