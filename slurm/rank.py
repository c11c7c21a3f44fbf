"""What `srun` starts on every task: `python -m slurm.rank RUN_DIR`.

It maps Slurm's description of this task to the variables the engines read, records where the rank
landed, then *becomes* the trainer (`exec python -m train RUN_DIR`), so the signals Slurm sends
(TERM on cancel/requeue/preemption, USR1 before the time limit) reach the trainer itself.

    SLURM_PROCID  -> RANK / HOROVOD_RANK            SLURM_NTASKS -> WORLD_SIZE / HOROVOD_SIZE
    SLURM_LOCALID -> LOCAL_RANK / HOROVOD_LOCAL_RANK tasks on node -> LOCAL_WORLD_SIZE / HOROVOD_LOCAL_SIZE
    SLURM_NODEID  -> GROUP_RANK / HOROVOD_CROSS_RANK SLURM_NNODES -> HOROVOD_CROSS_SIZE
    SLURMD_NODENAME -> HOROVOD_HOSTNAME (the name in the rendezvous plan, slurm/rendezvous.py)

GPUs: each rank sees only its own GPU - the one at position SLURM_LOCALID in the GPUs Slurm gave the
node (CUDA_VISIBLE_DEVICES, or their count when the node sets none).

Where each rank ran (Slurm node name, node id, local id, GPU, job id, restart count) is appended to
RUN_DIR/slurm/placement-R.jsonl, one line per (re)start; the training records stay as they are.

`python -m slurm.rank --free-port` prints a free TCP port (the DDP rendezvous port, on the first node).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from pathlib import Path

from core.net import free_port
from core.rundir import RunPaths
from core.spec import TORCHRUN_ENGINES


def tasks_on_node(env: dict[str, str]) -> int:
    """Tasks on this node: SLURM_NTASKS_PER_NODE, else this node's entry of SLURM_TASKS_PER_NODE ("4(x2)")."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return int(env["SLURM_NTASKS_PER_NODE"])
    counts: list[int] = []
    for item in env.get("SLURM_TASKS_PER_NODE", "1").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if m:
            counts += [int(m[1])] * int(m[2] or 1)
    node = int(env.get("SLURM_NODEID", 0))
    return counts[node] if node < len(counts) else 1


def own_gpu(env: dict[str, str], local_rank: int) -> str | None:
    """The one GPU this rank should see, or None when the node has none allocated."""
    visible = env.get("CUDA_VISIBLE_DEVICES") or env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    devices = [d for d in (visible or "").split(",") if d.strip()]
    if not devices and int(env.get("SLURM_GPUS_ON_NODE", "0") or 0) > 0:
        devices = [str(i) for i in range(int(env["SLURM_GPUS_ON_NODE"]))]
    return devices[local_rank % len(devices)] if devices else None


def rank_env(env: dict[str, str], engine: str) -> dict[str, str]:
    """The variables to add for this task (pure: a function of Slurm's variables and the engine)."""
    rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    local, node, nodes = int(env["SLURM_LOCALID"]), int(env["SLURM_NODEID"]), int(env["SLURM_NNODES"])
    local_world = tasks_on_node(env)
    if rank != node * local_world + local:
        raise ValueError(f"rank {rank} is not node {node} x {local_world} + local {local}: "
                         "the job must use block distribution (srun --distribution=block)")
    out: dict[str, str] = {}
    gpu = own_gpu(env, local)
    if gpu is not None:
        out["CUDA_VISIBLE_DEVICES"] = gpu
    addr, port = env.get("SCALELAB_RDZV_ADDR", "127.0.0.1"), env.get("SCALELAB_RDZV_PORT", "0")
    if engine in TORCHRUN_ENGINES:
        out.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(local_world),
                   GROUP_RANK=str(node), NODE_RANK=str(node), MASTER_ADDR=addr, MASTER_PORT=port)
    elif engine == "horovod":
        out.update(HOROVOD_RANK=str(rank), HOROVOD_SIZE=str(world), HOROVOD_LOCAL_RANK=str(local),
                   HOROVOD_LOCAL_SIZE=str(local_world), HOROVOD_CROSS_RANK=str(node), HOROVOD_CROSS_SIZE=str(nodes),
                   HOROVOD_HOSTNAME=env.get("SLURMD_NODENAME", socket.gethostname()),
                   HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo",
                   HOROVOD_GLOO_RENDEZVOUS_ADDR=addr, HOROVOD_GLOO_RENDEZVOUS_PORT=port)
    return out


def record_placement(run_dir: Path, env: dict[str, str], added: dict[str, str]) -> None:
    path = Path(run_dir) / "slurm" / f"placement-{env['SLURM_PROCID']}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {
        "rank": int(env["SLURM_PROCID"]), "node": env.get("SLURMD_NODENAME"), "node_id": int(env["SLURM_NODEID"]),
        "local_rank": int(env["SLURM_LOCALID"]), "host": socket.gethostname(), "job_id": env.get("SLURM_JOB_ID"),
        "restart": int(env.get("SLURM_RESTART_COUNT", "0") or 0), "gpu": added.get("CUDA_VISIBLE_DEVICES"),
        "time": time.time(),
    }
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--free-port"]:
        print(free_port(""))
        return 0
    if len(argv) != 1 or "SLURM_PROCID" not in os.environ:
        print("usage: python -m slurm.rank RUN_DIR  (started by srun inside a scalelab Slurm job)", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    spec = json.loads(RunPaths(run_dir).spec.read_text())
    env = dict(os.environ)
    try:
        added = rank_env(env, spec["engine"]["name"])
    except ValueError as exc:
        from core.records import (
            record_error,  # pandas and the spec reader only on this path
        )

        record_error(run_dir, str(exc), env)
        return 2
    record_placement(run_dir, env, added)
    os.environ.update(added)
    os.execv(sys.executable, [sys.executable, "-m", "train", str(run_dir)])  # the trainer takes this process


if __name__ == "__main__":
    sys.exit(main())
