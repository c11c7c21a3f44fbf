"""`launch probe`: dry runs on every backend, a local probe end to end (and `launch plan` on it), a probe
against moto with the instances' side played (as tests/test_aws_moto.py does) and a fault in the middle,
bad input. The probe on the real Slurm cluster is in tests/test_slurm_cluster.py (its session fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import launch, only_run_dir

TINY = ["--model", "nmt-tiny", "--warmup-steps", "1", "--probe-steps", "2"]
AWS = ["--backend", "aws", "--bucket", "probe-bucket", "--region", "us-east-1"]


def _requests(out: str) -> list[str]:
    return [line.split("probe run ")[1].split(":")[0] for line in out.splitlines() if line.startswith("# ---- probe run")]


# ---- dry runs: every request and the expected cost, nothing started ----------------------------------


def test_local_dry_run_prints_every_run_and_the_expected_cost(tmp_path: Path) -> None:
    done = launch("probe", *TINY, "--instance-types", "local-1t,local-2t", "--dry-run", "--runs-dir", "runs",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _requests(done.stdout) == ["local-1t-1x1", "local-1t-1x2", "local-1t-2x2",
                                      "local-2t-1x1", "local-2t-1x2", "local-2t-2x2"]
    assert done.stdout.count("OMP_NUM_THREADS=2 ") == 4  # local-2t: 1x1, 1x2 and the 2x2's two node commands
    assert "--nnodes=2" in done.stdout and "probe: expected cost $" in done.stderr
    assert "set a 'local-2t' rate" in done.stderr
    assert not (tmp_path / "runs").exists(), "a dry run creates nothing"


def test_aws_dry_run_prints_every_request_and_touches_nothing(tmp_path: Path) -> None:
    env = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    done = launch("probe", *AWS, *TINY, "--instance-types", "g3.4xlarge,g3.16xlarge", "--dry-run",
                  "--runs-dir", "runs", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert _requests(done.stdout) == ["g3.4xlarge-1x1", "g3.4xlarge-2x1", "g3.16xlarge-1x1", "g3.16xlarge-1x4",
                                      "g3.16xlarge-2x4"]  # the catalog: 1 and 4 GPUs
    assert done.stdout.count('"operation": "RunInstances"') == 5
    assert '"InstanceType": "g3.16xlarge"' in done.stdout and '"MaxCount": 2' in done.stdout
    lines = [line for line in done.stderr.splitlines() if "g3.16xlarge-2x4:" in line]
    assert lines and "2*g3.16xlarge on-demand" in lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_slurm_dry_run_asks_for_typed_gpus_and_partitions(tmp_path: Path) -> None:
    done = launch("probe", "--backend", "slurm", *TINY, "--instance-types", "a,debug/b", "--gpus-per-node", "2",
                  "--dry-run", "--runs-dir", "runs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _requests(done.stdout) == ["a-1x1", "a-1x2", "a-2x2", "debug-b-1x1", "debug-b-1x2", "debug-b-2x2"]
    scripts = done.stdout.split("# ---- probe run ")[1:]
    assert "#SBATCH --gres=gpu:a:2" in scripts[2] and "#SBATCH --nodes=2" in scripts[2]
    assert "#SBATCH --partition=debug" in scripts[4] and "#SBATCH --gres=gpu:b:2" in scripts[4]
    assert all("--gpus-per-node" not in s for s in scripts)
    assert "probe: expected cost $" in done.stderr and not (tmp_path / "runs").exists()


# ---- bad input: one line, exit 2, nothing created ------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--instance-types", "local-1t", "--spot"], "--spot is an option of --backend aws"),
    (["--instance-types", "local-fast"], "unknown local variant 'local-fast'"),
    (["--instance-types", " , "], "--instance-types needs at least one candidate"),
    ([], "--instance-types needs at least one candidate"),
    (["--instance-types", "local-1t,local-1t"], "lists a candidate twice"),
    (["--instance-types", "local-1t", "--nodes", "2"], "drop --nodes"),
    (["--instance-types", "local-1t", "--steps", "100"], "drop --steps"),
    (["--instance-types", "local-1t", "--link-sizes-mb", "0,1"], "--link-sizes-mb takes sizes"),
    (["--instance-types", "local-1t", "--probe-steps", "0"], "--probe-steps"),
    ([*AWS, "--instance-types", "g9.huge"], "unknown instance type 'g9.huge'; known: "),
    ([*AWS, "--instance-types", "g3.4xlarge", "--gpus-per-node", "2"], "g3.4xlarge has 1 GPU(s)"),
    ([*AWS, "--instance-types", "g3.4xlarge", "--instance-type", "p2.xlarge"], "not --instance-type"),
    ([*AWS, "--instance-types", "g3.4xlarge"], "pass --yes"),
    ([*AWS, "--instance-types", "g3.4xlarge", "--yes", "--max-usd", "0.001"], "over --max-usd 0.001"),
    (["--backend", "slurm", "--gpus-per-node", "2", "--instance-types", "a/b/c"], "cannot read Slurm candidate"),
])
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], words: str) -> None:
    env = {"PATH": "/usr/bin:/bin"}  # no sinfo, no sbatch: nothing could be sent anyway
    done = launch("probe", *TINY, *args, "--runs-dir", "runs", cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and words in errors[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "runs").exists()


# ---- a local probe of two variants, end to end ----------------------------------------------------


@pytest.mark.slow
def test_local_probe_of_two_variants_end_to_end_and_plan_reads_it(tmp_path: Path) -> None:
    done = launch("probe", *TINY, "--instance-types", "local-1t,local-2t", "--gpus-per-node", "1",
                  "--rate", "local-2t=0.3/gpu-hour", "--runs-dir", "runs", cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = only_run_dir(tmp_path / "runs")
    manifest = json.loads((probe / "probe.json").read_text())
    assert [c["name"] for c in manifest["candidates"]] == ["local-1t", "local-2t"]
    assert json.loads((probe / "sweep.json").read_text())["runs"] == ["local-1t-1x1", "local-1t-2x1",
                                                                      "local-2t-1x1", "local-2t-2x1"]
    for cand, threads in zip(manifest["candidates"], (1, 2)):
        res = cand["results"]
        assert [r["layout"] for r in res["layouts"]] == ["1x1", "2x1"]
        assert all(r["words_per_s"] > 0 for r in res["layouts"]) and res["words_per_s_one_gpu"] > 0
        link = res["links"]["inter"]  # 2x1: the ring crosses the two "instances"
        assert link["run"] == f"{cand['name']}-2x1" and link["ranks"] == 2
        assert link["latency_s"] > 0 and link["busbw_bytes_per_s"] > 0 and len(link["sizes"]) == 3
        for name in cand["runs"]:
            spec = json.loads((probe / name / "spec.json").read_text())
            assert spec["threads"] == threads and spec["backend_options"]["instance_type"] == cand["name"]
            assert spec["name"].endswith(f" on {cand['name']}") and spec["steps"] == 3
    actual = {r["run"]: r for r in manifest["actual"]["runs"]}
    assert {r["state"] for r in actual.values()} == {"COMPLETED"}
    # local-2t at the --rate given: 0.3 $/GPU-hour, billed per second with a 60 s minimum, per GPU
    wall = actual["local-2t-2x1"]["wall_s"]
    assert actual["local-2t-2x1"]["dollars"] == pytest.approx(2 * 0.3 * max(60, int(wall) + 1) / 3600, rel=0.02)
    assert manifest["actual"]["dollars"] == pytest.approx(sum(r["dollars"] for r in actual.values()))
    assert manifest["expected"]["dollars"] > 0 and "probe: actual cost $" in done.stdout

    again = launch("resume", str(probe), cwd=tmp_path)  # every run completed: nothing runs, the same costs
    assert again.returncode == 0 and "probe: actual cost $" in again.stdout, again.stderr
    assert json.loads((probe / "probe.json").read_text())["actual"]["runs"] == manifest["actual"]["runs"]

    # The planner reads the probe: local-1t (most runs, listed first) is what was measured; without
    # rates nothing can be priced, and the note says how; with a rate for each, every row says where
    # its speed comes from: local-1t measured, local-2t at its own probed speed.
    plan = launch("plan", str(probe), "--format", "json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert {row["label"].rsplit(" on ", 1)[1] for row in json.loads(plan.stdout)} == {"local-1t"}
    assert "does not price" in plan.stderr and "--rate local-1t=" in plan.stderr
    priced = launch("plan", str(probe), "--rate", "local-1t=0.3/gpu-hour", "--rate", "local-2t=0.3/gpu-hour",
                    "--instance-types", "local-1t,local-2t", "--work", "100000", "--format", "json", cwd=tmp_path)
    assert priced.returncode == 0, priced.stderr
    rows = [r for r in json.loads(priced.stdout) if r.get("instance_type")]
    basis = {r["instance_type"]: r["speed_basis"] for r in rows}
    assert basis == {"local-1t": "measured", "local-2t": "probe"}, basis
    # without --instance-types: every probed candidate the prices know is planned (local-2t was left out)
    unnamed = launch("plan", str(probe), "--rate", "local-1t=0.3/gpu-hour", "--rate", "local-2t=0.3/gpu-hour",
                     "--work", "100000", "--format", "json", cwd=tmp_path)
    assert unnamed.returncode == 0, unnamed.stderr
    assert {r["instance_type"] for r in json.loads(unnamed.stdout) if r.get("instance_type")} == {"local-1t", "local-2t"}


# ---- AWS against moto: the instances' side played from each poll, as in tests/test_aws_moto.py -------

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")
from scalelab.aws import teardown as td  # noqa: E402
from scalelab.aws.backend import AwsBackend  # noqa: E402
from scalelab.core.spec import Spec, read_spec  # noqa: E402
from scalelab.costs.catalog import load_catalog  # noqa: E402
from scalelab.launcher.probe import expected_rows, parse_candidates, probe_specs, run_probe  # noqa: E402
from scalelab.aws.render import cloud_run_id  # noqa: E402
from tests.test_aws_moto import FailingEc2, FakeNodes, cloud, left  # noqa: E402, F401 - `cloud` is a fixture

MOTO_NOTHING = {"instances": 0, "volumes": 0, "security_groups": 0, "placement_groups": 0}


class PlayedAws(AwsBackend):
    """The aws backend against moto; on each poll the instances' side (what scalelab/aws/bootstrap.py writes to S3)
    is played: heartbeats, every rank's records (rank 0 with its `link` records), status completed."""

    def poll(self, run_dir: Path):
        fake = FakeNodes({"ec2": self._clients["ec2"], "s3": self._clients["s3"], "bucket": self.options["bucket"]},
                         Path(run_dir))
        nodes = fake.heartbeat(0)
        if nodes:
            spec = read_spec(run_dir)
            for rank in range(spec.workers):
                fake.records(0, rank, range(1, spec.steps + 1), world=spec.workers)
            links = [{"kind": "link", "rank": 0, "world": spec.workers, "time": fake.t0 + 99, "scope":
                      "intra" if spec.nodes == 1 else "inter", "nodes": spec.nodes, "mb": mb, "time_s": 0.001 * mb + 1e-4,
                      "algbw": 1e9, "busbw": 1e9 * (spec.workers - 1) / spec.workers} for mb in spec.link_probe_mb]
            body = self._clients["s3"].get_object(Bucket=self.options["bucket"],
                                                  Key=f"{fake.prefix}/records/gen-0/rank-0.jsonl")["Body"].read()
            fake.put("records/gen-0/rank-0.jsonl", body + "".join(json.dumps(x) + "\n" for x in links).encode())
            fake.status(0, nodes, "completed")
        return super().poll(run_dir)


def _aws_probe(cloud, tmp_path: Path, ec2=None) -> tuple[Path | None, list[str], Exception | None]:
    options = {"bucket": cloud["bucket"], "region": "us-east-1", "wheel": str(cloud["wheel"]), "poll_s": 0.01,
               "placement_group": "none", "report_timeout_min": 5.0, "interruption_grace_s": 0.0}
    base = Spec.from_dict({"backend": "aws", "engine": {"name": "ddp"}, "warmup_steps": 1, "backend_options": options})
    catalog = load_catalog()
    runs = probe_specs(base, parse_candidates("g3.4xlarge,g3.8xlarge", "aws", None, catalog), "weak", 2, [0.004, 1.0])
    names = [c.run_name(s.nodes, s.gpus_per_node) for c, s in runs]
    expected = expected_rows(list(zip(names, (s for _, s in runs))), catalog)
    backend = PlayedAws(options, clients={"ec2": ec2 or cloud["ec2"], "s3": cloud["s3"]})
    try:
        return run_probe(base, runs, expected, tmp_path / "runs", "probe-aws", "weak", 2, catalog, backend), names, None
    except Exception as exc:  # noqa: BLE001 - the fault test looks at it
        return None, names, exc


def test_aws_probe_against_moto_measures_each_type_and_leaves_nothing(cloud, tmp_path: Path) -> None:
    probe, names, error = _aws_probe(cloud, tmp_path)
    assert error is None, error
    assert names == ["g3.4xlarge-1x1", "g3.4xlarge-2x1", "g3.8xlarge-1x1", "g3.8xlarge-1x2", "g3.8xlarge-2x2"]
    for name in names:
        info = json.loads((probe / name / "launch.json").read_text())
        assert info["state"] == "COMPLETED" and {i["type"] for i in info["instances"]} == {name.rsplit("-", 1)[0]}
        assert info["run_id"] == cloud_run_id(probe / name) == f"{probe.name}-{name}"  # tagged apart from other probes
        assert left(cloud, info["run_id"]) == MOTO_NOTHING, name
    manifest = json.loads((probe / "probe.json").read_text())
    g38 = manifest["candidates"][1]
    assert g38["name"] == "g3.8xlarge" and g38["gpus"] == 2
    assert set(g38["results"]["links"]) == {"intra", "inter"}
    assert g38["results"]["links"]["intra"]["run"] == "g3.8xlarge-1x2"
    assert g38["results"]["links"]["inter"]["busbw_bytes_per_s"] == pytest.approx(1e9 * 3 / 4)
    assert all(row["words_per_s"] > 0 for c in manifest["candidates"] for row in c["results"]["layouts"])
    price = load_catalog().price("g3.8xlarge").usd_per_hour  # two instances, each billed at least 60 s
    cost = next(r for r in manifest["actual"]["runs"] if r["run"] == "g3.8xlarge-2x2")["dollars"]
    assert cost >= 2 * price * 60 / 3600 - 1e-9
    assert manifest["actual"]["dollars"] == pytest.approx(sum(r["dollars"] for r in manifest["actual"]["runs"]))


def test_aws_probe_fault_in_the_middle_tears_everything_down(cloud, tmp_path: Path) -> None:
    """RunInstances fails for the probe's second run: its security group goes, the first run's instances
    are gone, no later run starts, and probe.json still says what the runs cost."""
    probe, names, error = _aws_probe(cloud, tmp_path, FailingEc2(cloud["ec2"], fail_at=2))
    assert isinstance(error, RuntimeError) and "injected" in str(error)
    probe = only_run_dir(tmp_path / "runs")
    for name in names:
        assert left(cloud, cloud_run_id(probe / name)) == MOTO_NOTHING, name
        assert td.instances(cloud["ec2"], cloud_run_id(probe / name), td.LIVE_STATES) == []
    states = {n: json.loads((probe / n / "launch.json").read_text())["state"] for n in names
              if (probe / n / "launch.json").exists()}
    assert states == {"g3.4xlarge-1x1": "COMPLETED", "g3.4xlarge-2x1": "FAILED"}
    manifest = json.loads((probe / "probe.json").read_text())
    # what is paid: the instances that ran; the run whose instances never started cost nothing
    assert {r["run"] for r in manifest["actual"]["runs"] if r["dollars"] > 0} == {"g3.4xlarge-1x1"}
