"""How ranks start, decided once (scalelab/core/launch.py) and only placed by the backends.

The backends' renderings of these plans are pinned by their golden files (tests/test_slurm_render.py,
tests/test_k8s_manifests.py, tests/test_aws_render.py); here: the plan itself, that an unknown engine
fails in the one place, that every engine in the table has a class, and that no other module writes
a torchrun, horovodrun or mpirun command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scalelab.core import engines as engine_table
from scalelab.core.engines import ENGINES, HOROVODRUN, PLAIN, TORCHRUN, starter
from scalelab.core.errors import SpecError
from scalelab.core.launch import NodeVar, Site, Slot, engine_env, launch_plan, rank_env
from scalelab.core.spec import EngineSpec, Spec

ROOT = Path(__file__).resolve().parents[1]


def _spec(engine: str, nodes: int = 2, gpus: int = 2, **fields) -> Spec:
    return Spec(engine=EngineSpec(name=engine, **fields), nodes=nodes, gpus_per_node=gpus, batch_per_worker=8)


def test_torchrun_engines_get_one_agent_per_node_with_the_rendezvous_on_node_0() -> None:
    plan = launch_plan(_spec("ddp"), "/runs/r", Site(python="py", master_addr="10.0.0.1", master_port=29400))
    assert [launch.node for launch in plan] == [0, 1]
    assert plan[1].argv == ["py", "-m", "scalelab.core.torchrun", "--nnodes=2", "--nproc-per-node=2", "--node-rank=1",
                            "--master-addr=10.0.0.1", "--master-port=29400", "--log-dir=/runs/r/logs/torchrun",
                            "--tee=3", "-m", "scalelab.train", "/runs/r"]
    assert plan[0].env == {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}  # lines tagged by global rank
    # ...by torchrun, so the template goes with its command line, not into the engine's environment (what Slurm
    # exports where srun starts the ranks without torchrun)
    assert engine_env(_spec("ddp")) == {} and engine_env(_spec("ps")) == {}


def test_a_node_variable_makes_one_launch_every_node_runs_and_stays_a_variable() -> None:
    site = Site(master_addr=NodeVar("$MASTER_ADDR"), node_rank=NodeVar("$JOB_COMPLETION_INDEX"))
    [launch] = launch_plan(_spec("ps", ps_placement="separate"), "/r", site)
    assert "--nproc-per-node=3" in launch.argv  # two workers and the node's server rank
    assert launch.node == "$JOB_COMPLETION_INDEX"
    shell = [a for a in launch.argv if isinstance(a, NodeVar)]
    assert shell == ["--node-rank=$JOB_COMPLETION_INDEX", "--master-addr=$MASTER_ADDR"]


def test_horovod_starts_once_from_node_0_with_its_fusion_settings() -> None:
    spec = _spec("horovod", fusion_threshold_mb=0.5, cycle_time_ms=5.0)
    [launch] = launch_plan(spec, "/r", Site(python="py", hosts=("a", "b"), horovodrun=None, ssh_identity="/k"))
    assert launch.node == 0
    assert launch.argv == ["py", "-m", "scalelab.core.horovodrun", "--gloo", "-np", "4", "-H", "a:2,b:2",
                           "--ssh-identity-file", "/k", "py", "-m", "scalelab.train", "/r"]
    assert launch.env == {"HOROVOD_FUSION_THRESHOLD": str(512 * 1024), "HOROVOD_CYCLE_TIME": "5.0",
                          "HOROVOD_GLOO_TIMEOUT_SECONDS": "180"} == engine_env(spec)
    [mpi] = launch_plan(spec, "/r", Site(mpirun_args=("-bind-to", "none"), exports=("PATH",)))
    assert mpi.argv == ["mpirun", "-np", "4", "-bind-to", "none", "-x", "PATH", "python", "-m", "scalelab.train", "/r"]


def test_single_is_one_plain_process() -> None:
    [launch] = launch_plan(_spec("single", nodes=1, gpus=1), "/r", Site(python="py"))
    assert (launch.node, launch.argv, launch.env) == (0, ["py", "-m", "scalelab.train", "/r"], {})


def test_rank_variables_follow_the_starter() -> None:
    slot = Slot(rank=5, world=8, local=1, local_world=4, node=1, nodes=2, hostname="n1")
    torch_env = rank_env("ps", slot, "n0", "29400")
    assert (torch_env["RANK"], torch_env["LOCAL_RANK"], torch_env["MASTER_ADDR"]) == ("5", "1", "n0")
    hvd_env = rank_env("horovod", slot, "n0", "4000")
    assert (hvd_env["HOROVOD_RANK"], hvd_env["HOROVOD_CROSS_RANK"], hvd_env["HOROVOD_HOSTNAME"]) == ("5", "1", "n1")
    assert rank_env("single", slot, "n0", "0") == {}


def test_an_unknown_engine_fails_in_the_one_place() -> None:
    spec = _spec("ddp")
    spec.engine.name = "ddp3"  # past the spec's own check, as a hand-edited spec.json would be
    for call in (lambda: starter("ddp3"), lambda: launch_plan(spec, "/r"), lambda: engine_env(spec),
                 lambda: rank_env("ddp3", Slot(0, 1, 0, 1, 0, 1, "h"), "a", "1")):
        with pytest.raises(SpecError, match=f"unknown engine .ddp3.; valid engines: {', '.join(ENGINES)}"):
            call()


def test_a_new_engine_in_the_table_is_launched_like_its_starter(monkeypatch) -> None:
    """What adding a torchrun engine needs from the launchers: its line in the table, nothing else."""
    monkeypatch.setitem(engine_table.ENGINE_TABLE, "ddp2", engine_table.Engine("ddp2", TORCHRUN, "a copy of DDP"))
    spec = _spec("ddp")
    spec.engine.name = "ddp2"
    assert [launch.argv[2] for launch in launch_plan(spec, "/r")] == ["scalelab.core.torchrun"] * 2


def test_every_engine_has_a_class_and_a_starter() -> None:
    pytest.importorskip("torch")
    from scalelab.train.engines import ENGINE_CLASSES

    assert tuple(ENGINE_CLASSES) == ENGINES
    assert {starter(e) for e in ENGINES} == {PLAIN, TORCHRUN, HOROVODRUN}


def test_only_the_launch_module_writes_launcher_command_lines() -> None:
    """`grep` finds the torchrun/horovodrun/mpirun command lines and Horovod's variables built in one module."""
    words = {"scalelab.core.torchrun", "scalelab.core.horovodrun", "mpirun", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CROSS_RANK"}
    found = set()
    for path in (ROOT / "scalelab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words:
                found.add(str(path.relative_to(ROOT)))
            elif isinstance(node, ast.keyword) and node.arg in words:
                found.add(str(path.relative_to(ROOT)))
    assert found == {"scalelab/core/launch.py"}
