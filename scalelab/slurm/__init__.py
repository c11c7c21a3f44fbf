"""The `slurm` backend, through submitit: one Slurm job per run (a job array for repeats), one rank per GPU.

- `options`: the backend's options with their flags (`--partition`, `--time`, ...), read by the CLI at start;
- `render`: the options as submitit `SlurmExecutor` parameters, and the sbatch script submitit renders for
  them (golden-file tested; `--dry-run` prints it);
- `backend`: `SlurmBackend` - request, schedule (`sbatch --test-only`, then submitit's submission),
  status (submitit's sacct watcher), logs (submitit's per-task files), cancel;
- `rank`: `RankJob`, the Checkpointable function submitit runs in every task: JobEnvironment -> the
  engines' variables, the trainer as its child, requeue after the time-limit warning;
- `rendezvous`: Horovod's Gloo rendezvous server, started by the batch script on the first node.

scripts/slurm-cluster.sh starts a real two-node cluster on this machine to try it (and for the tests).
"""
