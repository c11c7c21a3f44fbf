"""What a Slurm rank sees of the node's GPUs: the user's own --script/--module gets what torchrun or
horovodrun would give it (all the node's GPUs, LOCAL_RANK indexing them), the built-in trainer stays
pinned to its own GPU as cuda:0 (scalelab/slurm/rank.py, `rank_env`)."""

from __future__ import annotations

import json

import pytest

from scalelab.core.devices import GPU_PINNED_ENV
from scalelab.core.errors import SpecError
from scalelab.slurm.rank import PLACEMENT_DIR, Task, record_placement, rank_env

RDZV = {"SCALELAB_RDZV_ADDR": "node1", "SCALELAB_RDZV_PORT": "29400"}
NODE = {**RDZV, "CUDA_VISIBLE_DEVICES": "0,1"}  # one node, 2 GPUs, 2 tasks


def task(local: int, nodes: int = 1, per_node: int = 2, node: int = 0) -> Task:
    return Task(node * per_node + local, nodes * per_node, local, node, nodes,
                tuple(f"node{i + 1}" for i in range(nodes)), "77")


@pytest.mark.parametrize("engine, local_var", [("ddp", "LOCAL_RANK"), ("horovod", "HOROVOD_LOCAL_RANK")])
@pytest.mark.parametrize("local", [0, 1])
def test_a_script_rank_sees_all_the_nodes_gpus_and_its_local_rank_indexes_them(engine, local_var, local) -> None:
    env = rank_env(task(local), engine, NODE, own_code=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env[local_var] == str(local)
    assert int(env[local_var]) < len(env["CUDA_VISIBLE_DEVICES"].split(","))  # cuda:LOCAL_RANK exists
    assert GPU_PINNED_ENV not in env


@pytest.mark.parametrize("local", [0, 1])
def test_the_trainer_rank_stays_pinned_to_its_own_gpu(local) -> None:
    env = rank_env(task(local), "ddp", NODE)
    assert env["CUDA_VISIBLE_DEVICES"] == str(local)  # the one GPU, seen as cuda:0 (Engine.device)
    assert env[GPU_PINNED_ENV] == "1"
    assert env["LOCAL_RANK"] == str(local)


def test_a_script_rank_gets_the_nodes_gpus_from_slurms_other_variables() -> None:
    """A node that sets no CUDA_VISIBLE_DEVICES: the step's GPU list, else the count of GPUs on the node."""
    assert rank_env(task(1), "ddp", {**RDZV, "SLURM_STEP_GPUS": "2,3"}, own_code=True)["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert rank_env(task(1), "ddp", {**RDZV, "SLURM_GPUS_ON_NODE": "2"}, own_code=True)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert rank_env(task(1), "ddp", {**RDZV, "SLURM_STEP_GPUS": "2,3"})["CUDA_VISIBLE_DEVICES"] == "3"


def test_no_gpus_sets_nothing_and_too_few_gpus_is_refused_for_scripts_too() -> None:
    for own_code in (False, True):
        env = rank_env(task(1), "ddp", RDZV, own_code=own_code)
        assert "CUDA_VISIBLE_DEVICES" not in env and GPU_PINNED_ENV not in env
        with pytest.raises(SpecError, match=r"2 ranks would run on node 0, but only 1 GPUs? (is|are) visible"):
            rank_env(task(1), "ddp", {**RDZV, "CUDA_VISIBLE_DEVICES": "0"}, own_code=own_code)


def test_the_placement_records_the_ranks_own_gpu_for_scripts_as_for_the_trainer(tmp_path) -> None:
    for own_code, run in ((False, tmp_path / "trainer"), (True, tmp_path / "script")):
        run.mkdir()
        record_placement(run, task(1), NODE, rank_env(task(1), "ddp", NODE, own_code=own_code))
        line = json.loads((run / PLACEMENT_DIR / "placement-1.jsonl").read_text())
        assert line["gpu"] == "1"
