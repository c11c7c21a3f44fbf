"""The Slurm backend without a cluster: sbatch rendering (golden files), options, the per-rank mapping.

Golden files live in tests/golden/slurm/; after an intended change of the script, regenerate them with
`SCALELAB_UPDATE_GOLDEN=1 python -m pytest tests/test_slurm_render.py` and review the diff.
The end-to-end behaviour on a real Slurm cluster is in tests/test_slurm_cluster.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import SpecError
from core.spec import Spec
from slurm.backend import SlurmBackend
from slurm.rank import own_gpu, rank_env, tasks_on_node
from slurm.render import render_sbatch
from tests.conftest import assert_golden, launch

GOLDEN = Path(__file__).parent / "golden" / "slurm"
RUN_DIR = Path("/shared/runs/nmt-2x4-20250101-000000")
PYTHON = "/opt/venv/bin/python"

CASES = {
    "ddp-2x4-every-option": (
        dict(engine={"name": "ddp"}, nodes=2, gpus_per_node=4, threads=2),
        dict(partition="gpu", account="proj42", qos="high", constraint="v100", exclusive=True, cpus_per_task=2,
             mem_gb=64, time="2-00:00:00", job_name="nmt scaling", extra_sbatch=["--mail-type=END"],
             setup=["module load cuda/12.1"], gloo_iface="ib0", signal_s=300),
    ),
    "horovod-2x4-defaults": (dict(engine={"name": "horovod"}, nodes=2, gpus_per_node=4), {}),
    "single-1x1-cpu-cluster": (
        dict(engine={"name": "single"}, nodes=1, gpus_per_node=1),
        dict(gres_gpus=False, requeue=False, mem_gb=1.5, time=""),
    ),
}


def render_case(name: str) -> str:
    spec_fields, options = CASES[name]
    spec = Spec.from_dict(spec_fields).validate()
    backend = SlurmBackend({**options, "python": PYTHON})
    return render_sbatch(spec, RUN_DIR, backend.options, PYTHON)


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_matches_golden_file(name: str) -> None:
    assert_golden(GOLDEN / f"{name}.sbatch", render_case(name))


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_is_valid_bash(name: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render_case(name))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_rendering_is_pure_and_follows_the_layout() -> None:
    spec = Spec.from_dict(dict(engine={"name": "ddp"}, nodes=3, gpus_per_node=2, global_batch=12)).validate()
    options = SlurmBackend({"python": PYTHON}).options
    first = render_sbatch(spec, RUN_DIR, options, PYTHON)
    assert first == render_sbatch(spec, RUN_DIR, options, PYTHON)
    lines = [line for line in first.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --ntasks-per-node=2" in lines
    assert "#SBATCH --gpus-per-node=2" in lines
    assert f"#SBATCH --output={RUN_DIR}/logs/slurm-%j.out" in lines


def test_unknown_option_fails_listing_the_valid_ones() -> None:
    with pytest.raises(SpecError) as err:
        SlurmBackend({"partiton": "gpu"})
    message = str(err.value)
    assert "partiton" in message
    for valid in SlurmBackend.Options():
        assert valid in message


@pytest.mark.parametrize("options, words", [
    ({"partition": "gpu big"}, "partition"),
    ({"cpus_per_task": 0}, "cpus_per_task"),
    ({"exclusive": "yes"}, "exclusive"),
    ({"mem_gb": -1}, "mem_gb"),
    ({"extra_sbatch": ["mail-type=END"]}, "--sbatch-arg"),
    ({"extra_sbatch": ["--comment=a\n#SBATCH --x"]}, "extra_sbatch"),
])
def test_invalid_option_values_fail_at_configuration(options: dict, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        SlurmBackend(options)


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path: Path) -> None:
    env = {"PATH": os.path.dirname(sys.executable)}  # no sbatch, squeue or scancel on PATH: nothing can be sent
    done = launch("--backend", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--engine", "horovod",
                  "--partition", "debug", "--time", "10", "--runs-dir", str(tmp_path / "runs"), "--dry-run",
                  cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/bash")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --partition=debug", "#SBATCH --time=10"):
        assert line in done.stdout
    assert "slurm.rendezvous" in done.stdout
    assert not (tmp_path / "runs").exists(), "a dry run must not create a run directory"


def test_slurm_flags_are_rejected_with_another_backend(tmp_path: Path) -> None:
    done = launch("--backend", "local", "--partition", "gpu", "--dry-run", cwd=tmp_path)
    assert done.returncode == 2
    assert "--partition is an option of --backend slurm" in done.stderr
    assert "Traceback" not in done.stderr


# ---- slurm/rank.py: SLURM_* -> the engines' variables ---------------------------------------------

def slurm_env(procid: int, nodes: int = 2, per_node: int = 4, **extra: str) -> dict[str, str]:
    return {
        "SLURM_PROCID": str(procid), "SLURM_NTASKS": str(nodes * per_node), "SLURM_LOCALID": str(procid % per_node),
        "SLURM_NODEID": str(procid // per_node), "SLURM_NNODES": str(nodes), "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURMD_NODENAME": f"node{procid // per_node + 1}", "SCALELAB_RDZV_ADDR": "node1", "SCALELAB_RDZV_PORT": "29400",
        **extra,
    }


def test_ddp_variables() -> None:
    env = rank_env(slurm_env(6), "ddp")
    assert env["RANK"] == "6" and env["WORLD_SIZE"] == "8"
    assert env["LOCAL_RANK"] == "2" and env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "1"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node1", "29400")
    assert not any(k.startswith("HOROVOD_") for k in env)


def test_horovod_variables() -> None:
    env = rank_env(slurm_env(5), "horovod")
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"]) == ("5", "8")
    assert (env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"]) == ("1", "4")
    assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == ("1", "2")
    assert env["HOROVOD_HOSTNAME"] == "node2"
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("node1", "29400")


def test_each_rank_sees_its_own_gpu() -> None:
    assert own_gpu({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 2) == "6"
    assert own_gpu({"SLURM_GPUS_ON_NODE": "4"}, 3) == "3"  # GPUs allocated, no device list
    assert own_gpu({}, 1) is None
    assert rank_env(slurm_env(7, CUDA_VISIBLE_DEVICES="0,1,2,3"), "ddp")["CUDA_VISIBLE_DEVICES"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in rank_env(slurm_env(7), "ddp")


def test_tasks_per_node_forms() -> None:
    assert tasks_on_node({"SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1"}) == 4
    assert tasks_on_node({"SLURM_TASKS_PER_NODE": "2,3", "SLURM_NODEID": "1"}) == 3
    assert tasks_on_node({"SLURM_NTASKS_PER_NODE": "8"}) == 8


def test_a_non_block_distribution_is_refused() -> None:
    env = slurm_env(1)
    env["SLURM_NODEID"] = "1"  # cyclic: rank 1 on the second node
    with pytest.raises(ValueError, match="block"):
        rank_env(env, "horovod")
