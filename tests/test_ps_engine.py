"""The parameter-server engine's launch on every backend and its options.

The engine's training (same losses as DDP, exchange_s, exact resume) is tested by running it:
tests/test_local_runs.py and tests/test_resume.py. Here: `--engine ps` is started like DDP (torchrun,
env:// rendezvous) by Slurm, Kubernetes and AWS, and `--ps-shards` is checked up front.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aws.bootstrap import trainer_command
from core.errors import SpecError
from core.spec import EngineSpec, Spec
from slurm.backend import SlurmBackend
from slurm.rank import rank_env
from tests.test_slurm_render import PYTHON, RDZV, RUN_DIR, task


def _spec(**fields) -> Spec:
    return Spec(engine=EngineSpec(name="ps", **fields.pop("engine", {})), nodes=2, gpus_per_node=2,
                batch_per_worker=8, steps=10, **fields).validate()


def test_slurm_gives_ps_ranks_a_torchrun_rendezvous() -> None:
    script = SlurmBackend({"python": PYTHON}).submit_dryrun(_spec(), RUN_DIR).render()
    assert "SCALELAB_RDZV_PORT=$(" in script and "-m slurm.rank --free-port)" in script
    env = rank_env(task(3), "ps", RDZV)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "8", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node1", "29400")


def test_k8s_runs_ps_as_an_indexed_job_of_torchrun_pods() -> None:
    pytest.importorskip("kubernetes_validate")
    from k8s.backend import KubernetesBackend
    from k8s.validate import validate_all

    spec = Spec(backend="k8s", engine=EngineSpec(name="ps"), nodes=2, gpus_per_node=2, batch_per_worker=8,
                steps=10).validate()
    request = KubernetesBackend({"image": "registry.example.com/scalelab:0.1.0"}).submit_dryrun(spec, Path("runs/ps-x"))
    assert [d["kind"] for d in request.objects] == ["ConfigMap", "Service", "Job"]
    validate_all([*request.objects, request.fetch])
    script = request.objects[2]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "torch.distributed.run" in script and "--nnodes=2" in script


def test_aws_starts_one_torchrun_per_node_for_ps() -> None:
    cmd = trainer_command("ps", "py", Path("/w/r"), ["10.0.0.1", "10.0.0.2"], 1, 2)
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"] and "--node-rank=1" in cmd
    assert "--master-addr=10.0.0.1" in cmd and cmd[-3:] == ["-m", "train", "/w/r"]


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
