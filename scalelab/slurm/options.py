"""The slurm backend's options, declared once: defaults, help, flags and checks (no heavy imports).

The CLI reads this module at start to make the `[slurm]` flags; `SlurmBackend.options` is an
instance. Values are checked before anything is submitted; what only the cluster knows (does the
partition exist, is the time within its limit) is asked with `sbatch --test-only` (scalelab/slurm/backend.py).
scalelab/slurm/render.py maps them to the parameters of submitit's SlurmExecutor, which renders the script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from scalelab.core.options import BackendOptions, at_least, each, one_line, one_word, option
from scalelab.costs.fleet import OnPremiseFleet


def _minutes_as_text(value: Any) -> Any:
    """`time: 30` in YAML is 30 minutes, as Slurm reads `--time=30`."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


# Slurm's time formats (sbatch --time): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit.
# `--time abc` was accepted and reached sbatch (issue #37); a real run's `sbatch --test-only` said it late.
_SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE|unlimited|infinite")


def _slurm_time(value: str) -> str | None:
    if value == "" or _SLURM_TIME.fullmatch(value):
        return None
    return "must be a time in Slurm's format: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 90, 1:30:00, 2-00)"


def _sbatch_option(arg: str) -> str | None:
    return None if arg.startswith("-") else "takes sbatch options such as --mail-type=END"


@dataclass(frozen=True)
class SlurmOptions(BackendOptions, OnPremiseFleet):
    """One sbatch job per run; the fields are sbatch's own settings where there is one."""

    backend = "slurm"
    assumed_startup_s = 30.0  # queued on an idle partition, then the trainer starts

    partition: str = option("", "Partition (sbatch --partition) [default: the cluster's default].", one_word,
                            flag="--partition")
    account: str = option("", "Account to charge (sbatch --account).", one_word, flag="--account")
    qos: str = option("", "Quality of service (sbatch --qos).", one_word, flag="--qos")
    constraint: str = option("", "Node features required (sbatch --constraint), e.g. v100.", one_word,
                             flag="--constraint")
    gpu_type: str = option("", "GPU type the nodes must have, as the cluster's GRES names it (sbatch "
                           "--gres=gpu:TYPE:N), e.g. v100; '' = any GPU (--gpus-per-node=N).", one_word,
                           flag="--gpu-type")
    instance_type: str = option("", "What the planner and `launch cost` call these nodes: a --rate name of the "
                                "prices file (`launch probe` sets it to the probed partition or GPU type).", one_word)
    exclusive: bool = option(False, "Whole nodes for the job (sbatch --exclusive).", flag="--exclusive")
    cpus_per_task: int = option(1, "CPUs per rank (sbatch --cpus-per-task).", at_least(1), flag="--cpus-per-task")
    mem_gb: float = option(0.0, "Memory per node in GB (sbatch --mem); 0 = the partition's default.", at_least(0),
                           flag="--mem-gb")
    time: str = option("1:00:00", "Time limit in Slurm's format: MM, HH:MM:SS, D-HH:MM; '' = the partition's.",
                       one_word, _slurm_time, flag="--time", parse=_minutes_as_text)
    requeue: bool = option(True, "Checkpoint and requeue before the time limit or on preemption.", flag="--requeue")
    max_requeues: int = option(3, "Requeues after a time-limit warning; then the run stops with a checkpoint "
                               "(submitit's max_num_timeout).", at_least(0))
    signal_s: int = option(120, "The USR1 warning to every rank this many seconds before the time limit.", at_least(0))
    gres_gpus: bool = option(True, "Ask for --gpus-per-node (false on a cluster without GPU GRES).")
    job_name: str = option("", "Slurm job name [default: scalelab-RUN].", flag="--job-name")
    extra_sbatch: list[str] = option([], "Extra #SBATCH line, e.g. --sbatch-arg=--mail-type=END (repeatable).",
                                     each(one_line), each(_sbatch_option), flag="--sbatch-arg", metavar="ARG")
    setup: list[str] = option([], "Shell lines run before srun, e.g. 'module load cuda'.", each(one_line))
    python: str = option("", "The interpreter on the nodes [default: this one: a shared filesystem].", one_word)
    gloo_iface: str = option("", "Network interface for Gloo [default: the address of the node's hostname].",
                             one_word)
    poll_s: float = option(10.0, "Longest wait between two sacct queries while following (submitit's watcher: one "
                           "query for every job of a sweep, 2 s at first, backing off to this).", at_least(0))
