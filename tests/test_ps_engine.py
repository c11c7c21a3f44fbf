"""The parameter-server engine's launch on every backend and its options.

The engine's training (same losses as DDP, exchange_s, exact resume) is tested by running it:
tests/test_local_runs.py and tests/test_resume.py. Here: `--engine ps` is started like DDP (torchrun,
env:// rendezvous) by Slurm, Kubernetes and AWS, `--ps-placement separate` starts G + servers ranks
per node on every backend, and `--ps-shards` / `--ps-placement` are checked up front.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.aws.bootstrap import Config, trainer_command
from scalelab.core.errors import SpecError
from scalelab.core.spec import EngineSpec, Spec, rank_role, server_rank
from scalelab.slurm.backend import SlurmBackend
from scalelab.slurm.rank import rank_env
from tests.test_slurm_render import PYTHON, RDZV, RUN_DIR, task


def _spec(**fields) -> Spec:
    return Spec(engine=EngineSpec(name="ps", **fields.pop("engine", {})), nodes=2, gpus_per_node=2,
                batch_per_worker=8, steps=10, **fields).validate()


def test_slurm_gives_ps_ranks_a_torchrun_rendezvous() -> None:
    script = SlurmBackend({"python": PYTHON}).submit_dryrun(_spec(), RUN_DIR).render()
    assert "SCALELAB_RDZV_PORT=$(" in script and "-m scalelab.slurm.rank --free-port)" in script
    env = rank_env(task(3), "ps", RDZV)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "8", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node1", "29400")


def test_k8s_runs_ps_as_an_indexed_job_of_torchrun_pods() -> None:
    pytest.importorskip("kubernetes_validate")
    from scalelab.k8s.backend import KubernetesBackend
    from scalelab.k8s.validate import validate_all

    spec = Spec(backend="k8s", engine=EngineSpec(name="ps"), nodes=2, gpus_per_node=2, batch_per_worker=8,
                steps=10).validate()
    request = KubernetesBackend({"image": "registry.example.com/scalelab:0.1.0"}).submit_dryrun(spec, Path("runs/ps-x"))
    assert [d["kind"] for d in request.objects] == ["ConfigMap", "Service", "Job"]
    validate_all([*request.objects, request.fetch])
    script = request.objects[2]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "scalelab.core.torchrun" in script and "--nnodes=2" in script


def test_aws_starts_one_torchrun_per_node_for_ps() -> None:
    cmd = trainer_command(_spec(), "py", Path("/w/r"), ["10.0.0.1", "10.0.0.2"], 1).argv
    assert cmd[:3] == ["py", "-m", "scalelab.core.torchrun"] and "--node-rank=1" in cmd
    assert "--master-addr=10.0.0.1" in cmd and cmd[-3:] == ["-m", "scalelab.train", "/w/r"]


def test_more_shards_than_workers_is_refused() -> None:
    assert _spec(engine={"ps_shards": 4}).engine.ps_shards == 4
    assert (_spec().engine.ps_state, _spec(engine={"ps_state": "cpu"}).engine.ps_state) == ("device", "cpu")
    with pytest.raises(SpecError, match="--ps-shards 5 is more than the 4 workers"):
        _spec(engine={"ps_shards": 5})


@pytest.mark.parametrize("flags, pattern", [
    ({"precision": "fp16"}, "--engine ps does not train in --precision fp16: .* use --precision bf16 .* or --engine ddp"),
    ({"engine": {"compression": "fp16"}}, "--grad-compression fp16 is not implemented for --engine ps"),
    ({"engine": {"compression": "bf16"}}, "--grad-compression bf16 is not implemented for --engine ps"),
    ({"engine": {"fp16_allreduce": True}}, "--grad-compression fp16 is not implemented for --engine ps"),
    ({"engine": {"ps_state": "disk"}}, "engine.ps_state must be one of device, cpu, got 'disk'"),
])
def test_what_the_parameter_server_does_not_do_is_refused(flags, pattern) -> None:
    """fp16's scaler needs every rank to see every gradient (overflow agreed), and the push and pull are
    fp32: both refused at validation, not silently ignored or left to fail inside a rank."""
    with pytest.raises(SpecError, match=pattern):
        _spec(**flags)


def test_ps_refusals_come_from_the_cli_before_any_rank(tmp_path) -> None:
    from tests.conftest import launch

    proc = launch("--engine", "ps", "--gpus-per-node", "2", "--grad-compression", "fp16", "--runs-dir", "runs",
                  cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--grad-compression fp16 is not implemented for --engine ps" in proc.stderr
    assert not (tmp_path / "runs").exists()


# ---- --ps-placement separate ---------------------------------------------------------------------


def _separate(nodes: int = 2, gpus: int = 2, **engine) -> Spec:
    return Spec(engine=EngineSpec(name="ps", ps_placement="separate", **engine), nodes=nodes, gpus_per_node=gpus,
                batch_per_worker=8, steps=10).validate()


def test_separate_servers_add_ranks_per_node_and_come_last_on_every_node() -> None:
    spec = _separate(nodes=2, gpus=2)  # one server per node by default
    assert (spec.workers, spec.ranks_per_node, spec.world) == (4, 3, 6)
    assert spec.resolved_global_batch(1) == 32  # the batch is the workers': servers train on no data
    roles = [rank_role(r, spec.ranks_per_node, 1) for r in range(spec.world)]
    assert roles == [("worker", 0), ("worker", 1), ("server", 0), ("worker", 2), ("worker", 3), ("server", 1)]
    assert [server_rank(s, 3, 1) for s in range(2)] == [2, 5]
    four = _separate(nodes=2, gpus=1, ps_shards=4)  # two servers per node
    assert (four.ranks_per_node, four.world) == (3, 6)
    assert [server_rank(s, 3, 2) for s in range(4)] == [1, 2, 4, 5]
    assert [rank_role(r, 3, 2) for r in (1, 2, 4, 5)] == [("server", i) for i in range(4)]
    assert _spec().ranks_per_node == 2 and _spec(engine={"ps_shards": 4}).world == 4  # colocated: no extra ranks


@pytest.mark.parametrize("make, pattern", [
    (lambda: _separate(nodes=2, ps_shards=3), "3 shard server.* spread evenly over the 2 nodes.* multiple of 2"),
    (lambda: Spec(engine=EngineSpec(name="ps", ps_placement="separate"), gpus_per_node=2, global_batch=16, steps=10,
                  balance="dynamic").validate(), "--ps-placement separate does not mix with --balance dynamic"),
    (lambda: Spec(engine=EngineSpec(name="ddp", ps_placement="separate"), gpus_per_node=2, steps=10).validate(),
     "--ps-placement separate is for --engine ps .* not --engine ddp"),
    (lambda: Spec(engine=EngineSpec(name="ps", ps_placement="beside"), steps=10).validate(),
     "engine.ps_placement must be one of colocated, separate, got 'beside'"),
])
def test_what_separate_placement_cannot_do_is_refused(make, pattern) -> None:
    with pytest.raises(SpecError, match=pattern):
        make()


def test_separate_on_slurm_runs_a_server_task_per_node() -> None:
    script = SlurmBackend({"python": PYTHON}).submit_dryrun(_separate(), RUN_DIR).render()
    lines = script.splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=3" in lines
    env = rank_env(task(5, nodes=2, per_node=3), "ps", RDZV)  # the last task of node 2: its server
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("5", "6", "2", "3")


def test_separate_on_k8s_starts_g_plus_one_ranks_per_pod() -> None:
    pytest.importorskip("kubernetes_validate")
    from scalelab.k8s.backend import KubernetesBackend
    from scalelab.k8s.validate import validate_all

    spec = _separate().with_overrides({"backend": "k8s"})
    request = KubernetesBackend({"image": "registry.example.com/scalelab:0.1.0"}).submit_dryrun(spec, Path("runs/ps-s"))
    validate_all([*request.objects, request.fetch])
    script = request.objects[2]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "--nnodes=2" in script and "--nproc-per-node=3" in script


def test_separate_on_aws_starts_g_plus_one_ranks_per_instance(tmp_path, monkeypatch) -> None:
    from scalelab.aws.options import AwsOptions
    from scalelab.aws.render import make_plan, user_data

    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "prices.json"))
    spec = _separate().with_overrides({"backend": "aws"})
    plan = make_plan(spec, Path("runs/ps-s"), AwsOptions(bucket="bkt", region="us-east-1", instance_type="g3.16xlarge"),
                     "us-east-1")
    script = user_data(plan, 0)
    assert "export SCALELAB_GPUS_PER_NODE=2" in script and "export SCALELAB_RANKS_PER_NODE=3" in script
    env = {"SCALELAB_RUN_ID": "r", "SCALELAB_BUCKET": "b", "SCALELAB_PREFIX": "p", "SCALELAB_GPUS_PER_NODE": "2"}
    assert Config(env).ranks_per_node == 2  # colocated (and older user data): one rank per GPU
    assert Config({**env, "SCALELAB_RANKS_PER_NODE": "3"}).ranks_per_node == 3
    cmd = trainer_command(spec, "py", Path("/w/r"), ["10.0.0.1", "10.0.0.2"], 0).argv  # the ranks: from spec.json
    assert "--nproc-per-node=3" in cmd


def test_separate_on_the_local_backend_starts_g_plus_one_ranks(tmp_path) -> None:
    from scalelab.launcher.local import LocalBackend

    spec = _separate(nodes=1, gpus=2).with_overrides({"backend": "local"})
    request = LocalBackend({"master_port": 29999}).submit_dryrun(spec, tmp_path / "run")
    assert len(request.commands) == 1 and "--nproc-per-node=3" in request.commands[0]


def test_separate_placement_from_the_cli(tmp_path) -> None:
    """The flag reaches the spec: a dry run prints G+1 ranks per node; a misuse is one message, no rank."""
    from tests.conftest import launch

    proc = launch("--engine", "ps", "--ps-placement", "separate", "--gpus-per-node", "2", "--dry-run",
                  "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0 and "--nproc-per-node=3" in proc.stdout, proc.stderr
    proc = launch("--engine", "ddp", "--ps-placement", "separate", "--gpus-per-node", "2", "--runs-dir", "runs",
                  cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--ps-placement separate is for --engine ps" in proc.stderr and not (tmp_path / "runs").exists()
