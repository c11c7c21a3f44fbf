"""`launch run|sweep --backend slurm` flags: (flag, option key, click kwargs); no heavy imports here.

Each flag sets `spec.backend_options[key]`; the option names and defaults are `SlurmBackend.OPTIONS`
(slurm/backend.py), where every option is also explained.
"""

FLAGS = [
    ("--partition", "partition", dict(type=str, help="Partition (sbatch --partition) [default: the cluster's default].")),
    ("--account", "account", dict(type=str, help="Account to charge (sbatch --account).")),
    ("--qos", "qos", dict(type=str, help="Quality of service (sbatch --qos).")),
    ("--constraint", "constraint", dict(type=str, help="Node features required (sbatch --constraint), e.g. v100.")),
    ("--exclusive/--no-exclusive", "exclusive", dict(default=None, help="Whole nodes for the job (sbatch --exclusive).")),
    ("--cpus-per-task", "cpus_per_task", dict(type=int, help="CPUs per rank (sbatch --cpus-per-task) [default: 1].")),
    ("--mem-gb", "mem_gb", dict(type=float, help="Memory per node in GB (sbatch --mem); 0 = the partition's default.")),
    ("--time", "time", dict(type=str, help="Time limit in Slurm's format: MM, HH:MM:SS, D-HH:MM [default: 1:00:00].")),
    ("--requeue/--no-requeue", "requeue", dict(default=None, help="Checkpoint and requeue before the time limit or on preemption [default: on].")),
    ("--job-name", "job_name", dict(type=str, help="Slurm job name [default: scalelab-RUN].")),
    ("--sbatch-arg", "extra_sbatch", dict(multiple=True, metavar="ARG", help="Extra #SBATCH line, e.g. --sbatch-arg=--mail-type=END (repeatable).")),
]
