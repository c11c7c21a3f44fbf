"""Issue 34 on AWS, against moto's server: a --script run's folder goes through the run's bucket
(size-checked, .gitignore respected), and the instances' side for real (tests/test_aws_bootstrap.py's
stand-ins: the user data run with bash, a scratch virtualenv, a metadata server): the DDP and the Horovod
examples on two instances played in namespaces of their own (tests/ec2_sandbox.py: its own address, sshd,
hostname, folders and processes each), each unpacking the script and running its rank (Horovod's started by
the leader's horovodrun over ssh), the run completing with every rank's records and every instance
terminated; and a spot interruption that the script answers through track.should_stop, then resumes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

import ec2_sandbox
from conftest import ROOT, needs_horovod

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")
pytest.importorskip("moto.server", reason='moto server is not installed: pip install "moto[server]"')

from scalelab.aws import teardown as td  # noqa: E402
from scalelab.aws.backend import AwsBackend  # noqa: E402
from scalelab.core.errors import SpecError  # noqa: E402
from scalelab.core.rundir import new_run_dir  # noqa: E402
from scalelab.core.spec import Spec, save_spec  # noqa: E402
from scalelab.launcher.echo import RankEcho  # noqa: E402
from tests.test_aws_bootstrap import (  # noqa: E402,F401 - the fixtures and stand-ins of the instance side
    POLL_S,
    REGION,
    Metadata,
    cloud,
    finished,
    start_user_data,
    venv,
    wheel,
)
from tests.test_aws_two_instances import follow, play_generation  # noqa: E402

EXAMPLES = ROOT / "examples" / "own-script"


def script_spec(**extra) -> Spec:
    return Spec.from_dict({"backend": "aws", "engine": {"name": "ddp"}, "nodes": 2, "gpus_per_node": 1, "threads": 1,
                           "model": "train_ddp.py", "steps": None, "script": str(EXAMPLES / "train_ddp.py"),
                           "script_dir": str(EXAMPLES), "script_args": ["--steps", "12", "--val-every", "100"],
                           **extra}).validate()


def test_the_dry_run_lists_the_code_it_ships_and_refuses_a_folder_over_the_limit(tmp_path, monkeypatch) -> None:
    be = AwsBackend({"bucket": "bkt-test", "region": REGION})
    doc = json.loads(be.submit_dryrun(script_spec(), tmp_path / "run").render())
    (code,) = [c for c in doc["requests"] if c["params"].get("Key", "").endswith("code/code.tar.gz")]
    assert {"train_ddp.py", "train_horovod.py", "README.md"} == set(code["files"]) and code["bytes"] > 0
    assert doc["your_code"]["runs"] == "python code/train_ddp.py --steps 12 --val-every 100"
    # a folder of its own, with data the .gitignore leaves out and a file over the limit
    folder = tmp_path / "proj"
    (folder / "data").mkdir(parents=True)
    (folder / "train.py").write_text("print(1)\n")
    (folder / "data" / "big.bin").write_bytes(b"x" * 4096)
    (folder / ".gitignore").write_text("data/\n")
    spec = script_spec(script=str(folder / "train.py"), script_dir=str(folder), model="train.py")
    doc = json.loads(be.submit_dryrun(spec, tmp_path / "run").render())
    (code,) = [c for c in doc["requests"] if c["params"].get("Key", "").endswith("code/code.tar.gz")]
    assert code["files"] == [".gitignore", "train.py"]
    (folder / ".gitignore").unlink()
    monkeypatch.setattr("scalelab.launcher.owncode.MAX_CODE_BYTES", 1024)
    with pytest.raises(SpecError, match=r"more than the 1.0 KiB limit \(biggest: data/big.bin \(4.0 KiB\)"):
        be.submit_dryrun(spec, tmp_path / "run")


def test_the_dry_run_quotes_the_scripts_arguments_as_the_instances_pass_them(tmp_path) -> None:
    """The dry run shows the command as a shell takes it (`two words` one argument); what runs is that: the
    arguments travel in spec.json as a list, and the instance's rank command (no shell) carries none of them."""
    import shlex

    from scalelab.aws.bootstrap import trainer_command

    args = ["--lr", "0.1", "two words", "it's"]
    spec = script_spec(script_args=args)
    doc = json.loads(AwsBackend({"bucket": "bkt-test", "region": REGION}).submit_dryrun(spec, tmp_path / "run").render())
    assert doc["your_code"]["runs"] == "python code/train_ddp.py --lr 0.1 'two words' 'it'\"'\"'s'"
    assert shlex.split(doc["your_code"]["runs"])[2:] == args
    (put,) = [c for c in doc["requests"] if c["params"].get("Key", "").endswith("/spec.json")]
    assert json.loads(put["params"]["Body"])["script_args"] == args
    launch = trainer_command(spec, "python", tmp_path / "run", ["10.0.0.1", "10.0.0.2"], 0)
    assert launch is not None and not set(args) & set(launch.argv), launch.argv


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_script_on_two_instances_ships_starts_and_terminates(cloud, wheel, tmp_path, engine) -> None:
    """Two instances played in namespaces of their own (tests/ec2_sandbox.py): DDP runs torchrun on each,
    meeting at the leader's address over the link; Horovod runs horovodrun on the leader only, which starts
    the second instance's rank over ssh with the key the leader published through the bucket (the second
    instance's sshd logs the login). Each instance unpacks the script, its rank writes its records in that
    instance's own folder, the run completes, both instances terminate and nothing is left running."""
    if why := ec2_sandbox.unavailable():
        pytest.skip(why)
    ec2, s3, bucket = cloud["ec2"], cloud["s3"], cloud["bucket"]
    script = EXAMPLES / f"train_{engine}.py"
    spec = script_spec(nodes=2, gpus_per_node=1, engine={"name": engine}, script=str(script), model=script.name,
                       script_args=["--steps", "12", "--val-every", "6"])  # rank 0 prints at steps 6 and 12
    be = AwsBackend({"bucket": bucket, "region": REGION, "wheel": str(wheel), "poll_s": POLL_S, "report_timeout_min": 6.0,
                     "timeout_min": 15.0, "instance_type": "g3.4xlarge", "placement_group": "none"},
                    clients={"ec2": ec2, "s3": s3})
    run_dir = new_run_dir(tmp_path / "runs", "script")
    save_spec(spec, run_dir)
    be.schedule(be.submit_dryrun(spec, run_dir))
    launcher, outcome = follow(be, run_dir)
    try:
        gen = play_generation(cloud, tmp_path, run_dir, 0, hold_at="")  # no stop comes: no hold (track.step has it)
        launcher.join(timeout=120)
        assert not launcher.is_alive(), f"the launcher's follow loop still runs 120 s after the instances' end: {outcome}"
    finally:
        if launcher.is_alive():
            be.cancel(run_dir, grace_s=0)
    said, played, work, sshd_log = gen.said, gen.instances, gen.work, gen.sshd_log
    assert "error" not in outcome and "status" in outcome, outcome  # the launcher ended
    assert outcome["status"].state == "COMPLETED", (outcome["status"].detail, said)
    # horovodrun logged in to the second instance with the leader's key; torchrun needs no ssh
    assert ("Accepted publickey for root" in sshd_log) == (engine == "horovod"), sshd_log
    for rank, instance in enumerate(played):  # each instance unpacked the script and ran its rank of it
        assert (instance.folder / "code" / script.name).is_file()
        mine = instance.folder / run_dir.name / "records"
        assert (mine / f"rank-{rank}.jsonl").is_file() and not (mine / f"rank-{1 - rank}.jsonl").exists()
        recs = [json.loads(x) for x in (run_dir / "records" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert recs[0]["kind"] == "start" and recs[0]["world"] == 2 and recs[0]["engine"] == engine
        assert recs[0]["script"] == str(work / "code" / script.name)
        assert [r["step"] for r in recs if r["kind"] == "step"] == list(range(1, 13))
    # what `launch` shows as it follows (launcher/echo.py): the ranks' lines of the nodes' mirrored logs, retagged
    said: list[str] = []
    RankEcho(be, run_dir, {0, 1}, {}, lambda text, err: said.append(text)).close()
    shown = "".join(said).splitlines()
    assert [line.split(" validation")[0] for line in shown if "validation loss" in line] == [
        "[rank0]:step 6", "[rank0]:step 12"], shown
    assert all(line.startswith(("[rank0]:", "[rank1]:")) for line in shown), shown
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert left == [], subprocess.run(["ps", "-o", "pid,args", "-p", ",".join(left)], capture_output=True,
                                      text=True).stdout
    report = subprocess.run([__import__("sys").executable, "-m", "scalelab.launcher.cli", "report", str(run_dir),
                             "--format", "json"], cwd=tmp_path, capture_output=True, text=True,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)[0]["workers"] == 2


@pytest.mark.slow
def test_the_price_preview_of_a_script_run(tmp_path: Path) -> None:
    """Before anything is sent: dollars for the --steps the script runs, or why they are not known."""
    from conftest import launch

    base = ["--backend", "aws", "--bucket", "bkt-test", "--region", REGION, "--script", str(EXAMPLES / "train_ddp.py"),
            "--engine", "ddp", "--nodes", "2", "--dry-run"]
    priced = launch(*base, "--steps", "500", "--", "--steps", "500", cwd=tmp_path)
    assert priced.returncode == 0, priced.stderr
    assert "2*g4dn.xlarge" in priced.stderr and "for 500 steps" in priced.stderr  # the default type
    assert "expected cost of the launch: $" in priced.stderr
    unknown = launch(*base, "--max-usd", "1", "--", "--steps", "500", cwd=tmp_path)
    assert unknown.returncode == 0 and "a --script decides its own steps: give --steps N" in unknown.stderr
    assert "--epochs" not in unknown.stderr  # not given, and refused for a script: not the reason either


SLOW_STEPS = """import json, time
from scalelab import track

saved = track.checkpoint_dir / "state.json" if track.checkpoint_dir else None
first = json.loads(saved.read_text())["step"] if saved and saved.exists() else 0
print("resumed", track.resumed, "from", first, flush=True)
for step in range(first, 40):
    time.sleep(0.1)
    track.step(items=4, loss=1.0 / (step + 1))
    if track.should_stop():  # the spot notice: save and leave
        saved.write_text(json.dumps({"step": step + 1}))
        break
"""


@pytest.mark.slow
def test_a_spot_interruption_of_a_script_is_replaced_and_the_script_resumes(cloud, wheel, venv, tmp_path) -> None:
    """The notice reaches the script's should_stop, it saves into track.checkpoint_dir (synced through the
    bucket), the launcher starts a replacement whose script finds the save and goes on: steps 1..40 once."""
    ec2, s3, bucket = cloud["ec2"], cloud["s3"], cloud["bucket"]
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "slow.py").write_text(SLOW_STEPS)
    spec = script_spec(nodes=1, gpus_per_node=1, engine={"name": "single"}, script=str(folder / "slow.py"),
                       script_dir=str(folder), model="slow.py", script_args=[])
    be = AwsBackend({"bucket": bucket, "region": REGION, "spot": True, "wheel": str(wheel), "poll_s": POLL_S,
                     "interruption_grace_s": 120.0, "report_timeout_min": 6.0, "timeout_min": 15.0,
                     "instance_type": "g3.4xlarge"}, clients={"ec2": ec2, "s3": s3})
    run_dir = new_run_dir(tmp_path / "runs", "spot")
    save_spec(spec, run_dir)
    be.schedule(be.submit_dryrun(spec, run_dir))
    launcher, outcome = follow(be, run_dir)
    meta = Metadata()
    try:
        (first,) = td.instances(ec2, run_dir.name, ["running"], 0)
        meta.instance_id, work0 = first["InstanceId"], tmp_path / "node-gen0"
        meta.records = work0 / run_dir.name / "records" / "rank-0.jsonl"  # the notice once 6 steps are written
        said0 = finished(start_user_data(cloud, first["InstanceId"], work0, venv, meta), work0)
        deadline = time.time() + 120
        while not td.instances(ec2, run_dir.name, ["running"], 1):
            assert time.time() < deadline and launcher.is_alive(), (f"no replacement was started: {outcome}", said0)
            time.sleep(0.3)
        (second,) = td.instances(ec2, run_dir.name, ["running"], 1)
        meta.instance_id, meta.records, work1 = second["InstanceId"], None, tmp_path / "node-gen1"
        said1 = finished(start_user_data(cloud, second["InstanceId"], work1, venv, meta), work1)
        launcher.join(timeout=120)
        assert not launcher.is_alive(), (f"the launcher's follow loop still runs 120 s after the instance's end: {outcome}",
                                         said1)
    finally:
        meta.server.shutdown()
        if launcher.is_alive():
            be.cancel(run_dir, grace_s=0)
    assert "error" not in outcome, outcome
    assert outcome["status"].state == "COMPLETED", (outcome["status"].detail, said0, said1)
    recs = [json.loads(x) for x in (run_dir / "records" / "rank-0.jsonl").read_text().splitlines()]
    (stop,) = [r for r in recs if r.get("event") == "interrupted"]
    assert stop["step"] == 6  # track.step held there (start_user_data's SCALELAB_HOLD_AT_STEP) until the notice
    assert [r["step"] for r in recs if r["kind"] == "step"] == list(range(1, 41))  # once each, the count going on
    assert [r["resumed_from_step"] for r in recs if r["kind"] == "start"] == [None, stop["step"]]
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert "resumed False from 0" in logs and f"resumed True from {stop['step']}" in logs
    assert td.instances(ec2, run_dir.name, td.LIVE_STATES) == []
