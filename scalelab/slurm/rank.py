"""The rank function: what submitit runs in every task of the job (`RankJob`, pickled at submission).

srun starts `python -m submitit.core._submit FOLDER` once per task; submitit loads the pickled
`RankJob` and calls it. It reads where this task sits from submitit's `JobEnvironment`, maps that to
the variables the engines read, records the placement, and runs the trainer (`python -m scalelab.train
RUN_DIR`) as its child, passing the stop signals on:

    global_rank -> RANK / HOROVOD_RANK             num_tasks -> WORLD_SIZE / HOROVOD_SIZE
    local_rank  -> LOCAL_RANK / HOROVOD_LOCAL_RANK  num_tasks / num_nodes -> LOCAL_WORLD_SIZE / ..._LOCAL_SIZE
    node        -> GROUP_RANK / HOROVOD_CROSS_RANK  num_nodes -> HOROVOD_CROSS_SIZE
    hostnames[node] -> HOROVOD_HOSTNAME (the name in the rendezvous plan, scalelab/slurm/rendezvous.py)

The trainer is a child, not this process, so that it keeps its own exit (`os._exit` after Gloo's
threads, scalelab/train/__main__.py) and submitit's process stays free of torch.

GPUs: the node's GPUs are the ones Slurm gave it (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS/SLURM_JOB_GPUS,
or their count when the node lists none); every rank checks there is one per rank, and its own GPU is
the one at position local_rank. What a rank is shown depends on what it runs (`rank_env`):

- the built-in trainer sees only its own GPU (CUDA_VISIBLE_DEVICES=that one, SCALELAB_GPU_PINNED=1), as
  cuda:0: `Engine.device` (scalelab/train/engines.py) reads the pin and uses cuda:0. Its unpinned path
  (`set_device(LOCAL_RANK)`) would work as well; the pin is kept because it is what the trainer's runs
  have always had (and placement-R.jsonl's "gpu" is the one GPU the rank used);
- a user's --script/--module sees what torchrun or horovodrun would give it on the local, k8s and AWS
  backends: all the node's GPUs visible, and LOCAL_RANK / HOROVOD_LOCAL_RANK indexing them. A script
  written for torchrun does `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))` or
  `DDP(model, device_ids=[local_rank])`; with only its own GPU visible, every rank but local rank 0
  would fail with "invalid device ordinal".

Signals: TERM (scancel, `scontrol requeue`, preemption) and USR1 (`--signal=USR1@N`, the time limit
near) reach the trainer, which checkpoints at a step every rank agrees on and exits 143. After a USR1,
rank 0 requeues the job as submitit does for a `Checkpointable`: `checkpoint()` gives the function to
run again, submitit saves it as the job's submission, `scontrol requeue`; the ranks resume from
RUN_DIR/checkpoint.pt when the job starts again. Unlike submitit's own handler, this happens after
the ranks have checkpointed, not inside the signal handler, since the trainer needs the time.

Where each rank ran (Slurm node, node id, local rank, GPU, job id, restart count) is appended to
RUN_DIR/slurm/placement-R.jsonl, one line per (re)start; the training records stay as they are. How its
trainer ended (its exit status, 128 + N for signal N) is appended to RUN_DIR/slurm/exit-R.jsonl with the same
job id and restart count: the backend's `launch status` of a failed job names each rank's exit status from it,
as the local backend does from what torchrun or horovodrun report (`rank_exits`); Slurm itself keeps one exit
code per step, not per task.

`python -m scalelab.slurm.rank --free-port` prints a free TCP port (the DDP rendezvous port, on the first node).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any, NoReturn

import submitit
from submitit.core.utils import temporary_save_path
from submitit.helpers import Checkpointable, DelayedSubmission

from scalelab.core.devices import GPU_PINNED_ENV, gpu_shortage
from scalelab.core.errors import ScalelabError, SpecError, shell_word
from scalelab.core.launch import Slot, starter_of
from scalelab.core.launch import rank_env as engine_rank_env
from scalelab.core.net import free_port, gloo_hostname_problem, resolve
from scalelab.core.procs import SCRIPT_RUNNER, TRAINER
from scalelab.core.rundir import RunPaths
from scalelab.core.writes import write_inside

INTERRUPTED = 143  # the trainer's exit after checkpointing on a stop signal (scalelab/train/loop.py)
PLACEMENT_DIR = "slurm"
EXIT_FILE = "exit-{rank}.jsonl"  # in PLACEMENT_DIR: one line per (re)start of the rank, its trainer's exit status


@dataclass(frozen=True)
class Task:
    """Where one task of the job sits, as submitit's JobEnvironment tells it."""

    rank: int
    world: int
    local: int
    node: int
    nodes: int
    hostnames: tuple[str, ...]
    job_id: str

    @classmethod
    def of(cls, job: submitit.JobEnvironment) -> Task:
        return cls(job.global_rank, job.num_tasks, job.local_rank, job.node, job.num_nodes, tuple(job.hostnames),
                   job.job_id)

    @property
    def local_world(self) -> int:
        return self.world // self.nodes  # every node runs --ntasks-per-node tasks

    @property
    def hostname(self) -> str:
        return self.hostnames[self.node] if self.node < len(self.hostnames) else socket.gethostname()


def node_gpus(env: dict[str, str], local_world: int = 1, node: int = 0) -> list[str]:
    """The GPUs Slurm gave this node (as CUDA_VISIBLE_DEVICES names them), [] when it has none allocated; a
    SpecError (the one message of scalelab/core/devices.py) when it has fewer GPUs than ranks: never two on one GPU."""
    visible = env.get("CUDA_VISIBLE_DEVICES") or env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    devices = [d.strip() for d in (visible or "").split(",") if d.strip()]
    if not devices and int(env.get("SLURM_GPUS_ON_NODE", "0") or 0) > 0:
        devices = [str(i) for i in range(int(env["SLURM_GPUS_ON_NODE"]))]
    problem = gpu_shortage(local_world, len(devices), f"node {node}")
    if problem:
        raise SpecError(problem)
    return devices


def own_gpu(env: dict[str, str], local_rank: int, local_world: int = 1, node: int = 0) -> str | None:
    """The one GPU of this rank (position local_rank among the node's GPUs, `node_gpus`), or None when the
    node has none allocated; a SpecError when the node has fewer GPUs than ranks."""
    devices = node_gpus(env, local_world, node)
    return devices[local_rank] if devices else None


def rank_env(task: Task, engine: str, env: dict[str, str], own_code: bool = False) -> dict[str, str]:
    """The variables to add for this task (pure: a function of the task, the engine, the environment and
    whether it runs the user's own code).

    GPUs (the module's docstring): the built-in trainer (`own_code` False) is pinned to its own GPU,
    CUDA_VISIBLE_DEVICES=<that GPU> and SCALELAB_GPU_PINNED=1, which `Engine.device` reads to use cuda:0.
    A --script/--module rank (`own_code` True) is not pinned: CUDA_VISIBLE_DEVICES lists all the node's
    GPUs, so LOCAL_RANK (HOROVOD_LOCAL_RANK) is its device index, as under torchrun or horovodrun.
    """
    rank, world, local, node, local_world = task.rank, task.world, task.local, task.node, task.local_world
    if rank != node * local_world + local:
        raise ValueError(f"rank {rank} is not node {node} x {local_world} + local {local}: "
                         "the job must use block distribution (srun --distribution=block)")
    out: dict[str, str] = {}
    gpus = node_gpus(env, local_world, node)
    if gpus and own_code:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)  # all of them: the script picks cuda:LOCAL_RANK
    elif gpus:
        out["CUDA_VISIBLE_DEVICES"] = gpus[local]
        out[GPU_PINNED_ENV] = "1"  # the trainer sees its one GPU as cuda:0 (Engine.device)
    addr, port = env.get("SCALELAB_RDZV_ADDR", "127.0.0.1"), env.get("SCALELAB_RDZV_PORT", "0")
    out.update(engine_rank_env(engine, Slot(rank, world, local, local_world, node, task.nodes, task.hostname), addr, port))
    return out


def horovod_hostname_problem(task: Task, engine: str, lookup: Callable[[str], str | None] = resolve,
                             hostname: str | None = None) -> str | None:
    """A multi-node Horovod run on hosts whose name maps to loopback fails in every rank's hvd.init (the
    Gloo bug of scalelab/core/net.py); said here, with the fix, before the trainer starts. Nodes whose
    names resolve to loopback or not at all (two slurmd on one machine, as in scripts/slurm-cluster.sh)
    are on this machine, or unknown: no problem is claimed."""
    if task.nodes < 2 or not starter_of(engine).needs_horovod:
        return None
    others = [h for i, h in enumerate(task.hostnames) if i != task.node]
    problem = gloo_hostname_problem(others, lookup, hostname)
    return f"node {task.hostname}: {problem}; or run this layout with --engine ddp" if problem else None


def record_placement(run_dir: Path, task: Task, env: dict[str, str], added: dict[str, str]) -> None:
    path = Path(run_dir) / PLACEMENT_DIR / f"placement-{task.rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {
        "rank": task.rank, "node": task.hostname, "node_id": task.node, "local_rank": task.local,
        "host": socket.gethostname(), "job_id": task.job_id, "restart": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "gpu": own_gpu(env, task.local, task.local_world, task.node) if added.get("CUDA_VISIBLE_DEVICES") else None,
        "time": time.time(),
    }
    write_inside(run_dir, path, json.dumps(line) + "\n", append=True)


def record_exit(run_dir: Path, task: Task, env: dict[str, str], code: int) -> None:
    """Append this rank's exit status to RUN_DIR/slurm/exit-R.jsonl (`EXIT_FILE`), for `launch status`. A file that
    cannot be written (a full disk, a planted link) is passed over: the rank's own exit status must still reach srun."""
    line = {"rank": task.rank, "job_id": task.job_id, "restart": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
            "exit_code": code, "time": time.time()}
    with contextlib.suppress(OSError, ScalelabError):
        write_inside(run_dir, Path(run_dir) / PLACEMENT_DIR / EXIT_FILE.format(rank=task.rank),
                     json.dumps(line) + "\n", append=True)


def run_trainer(run_dir: Path, added: dict[str, str], own_code: bool = False) -> tuple[int, set[int]]:
    """`python -m scalelab.train RUN_DIR` (or, `own_code`, the runner of the user's --script:
    `python -m scalelab.train.script RUN_DIR`) with this rank's variables until it exits; TERM and USR1 are
    passed on. Returns its exit status (128 + N when signal N ended it) and the stop signals this task got.
    """
    got: set[int] = set()
    program = SCRIPT_RUNNER if own_code else TRAINER
    trainer = subprocess.Popen([sys.executable, *program, str(run_dir)], env={**os.environ, **added})

    def pass_on(signum: int, frame: object) -> None:
        got.add(signum)
        if trainer.returncode is None:  # Slurm signals every process of the step; this covers the rest
            with contextlib.suppress(ProcessLookupError):
                os.kill(trainer.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, pass_on)
    while (code := trainer.poll()) is None:  # Python runs the handler when this thread wakes, whoever got the signal
        time.sleep(0.2)
    return (code if code >= 0 else 128 - code), got


class RankJob(Checkpointable):
    """One rank of the run in RUN_DIR; `requeues_left`: requeues after a time-limit warning still allowed;
    `requeue`: False where `--no-requeue` was given (then none is allowed, and the stop says why)."""

    def __init__(self, run_dir: Path, requeues_left: int, requeue: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.requeues_left = requeues_left
        self.requeue_on = requeue

    def __call__(self) -> dict[str, Any]:
        job = submitit.JobEnvironment()
        task, env = Task.of(job), dict(os.environ)
        raw = json.loads(RunPaths(self.run_dir).spec.read_text())
        engine, own_code = raw["engine"]["name"], bool(raw.get("script") or raw.get("module"))
        try:
            added = rank_env(task, engine, env, own_code)
            if problem := horovod_hostname_problem(task, engine):
                raise SpecError(problem)
        except (ValueError, SpecError) as exc:  # not block-distributed; too few GPUs; Horovod's hostname
            self._fail(str(exc), 2)
        record_placement(self.run_dir, task, env, added)
        code, got = run_trainer(self.run_dir, added, own_code)
        record_exit(self.run_dir, task, env, code)
        if code == 0:
            return {"rank": task.rank, "exit_code": 0}
        if code == INTERRUPTED and got == {signal.SIGUSR1}:  # the time limit is near; not a cancel
            if self.requeues_left > 0:
                if task.rank == 0:
                    self.requeue(job)
                return {"rank": task.rank, "exit_code": code, "requeued": True}  # exit 0: srun keeps rank 0
            if task.rank == 0:
                self._fail(f"the time limit was near: every rank checkpointed and stopped, {self._why_not_requeued()}; "
                           f"`launch resume {shell_word(self.run_dir)}` continues it", code)
        sys.exit(code)  # SystemExit: submitit saves no result, as for its own preemption exit

    def _why_not_requeued(self) -> str:
        """Why the job was not requeued: `--no-requeue` given, or every requeue (max_requeues) spent. Why: with
        --no-requeue the stop said "no requeue is left (--requeue, max_requeues)", as if some had been tried.
        `requeue_on` read with a default: a job pickled before it existed requeues as it was sent."""
        if not getattr(self, "requeue_on", True):
            return ("and it was not requeued because --no-requeue was given (leave it out, or give --requeue, to "
                    "let Slurm requeue it from its checkpoint)")
        return ("and no requeue is left (each allowed one was spent: raise --backend-opt max_requeues=N for more, "
                "or give a longer --time)")

    def checkpoint(self) -> DelayedSubmission:
        """What runs when the requeued job starts again: this rank function with one requeue fewer. The
        training state is not in it: the ranks wrote RUN_DIR/checkpoint.pt before stopping."""
        return DelayedSubmission(RankJob(self.run_dir, self.requeues_left - 1, getattr(self, "requeue_on", True)))

    def requeue(self, job: submitit.JobEnvironment) -> None:
        """Rank 0, once every rank has checkpointed: submitit's requeue of a Checkpointable."""
        with temporary_save_path(job.paths.submitted_pickle) as tmp:
            self.checkpoint().dump(tmp)
        print(f"scalelab: the time limit is near and every rank checkpointed: requeueing job {job.job_id} "
              f"({self.requeues_left - 1} requeue(s) left after this one)", file=sys.stderr, flush=True)
        job._requeue(self.requeues_left - 1)  # scontrol requeue (Slurm then stops every task of the job)
        sys.exit(INTERRUPTED)

    def _fail(self, message: str, code: int) -> NoReturn:
        from scalelab.core.records import record_error  # the spec reader only on this path

        record_error(self.run_dir, message, dict(os.environ))
        sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--free-port"]:
        print("usage: python -m scalelab.slurm.rank --free-port  (the ranks themselves are started by submitit)", file=sys.stderr)
        return 2
    print(free_port(""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
