"""The `slurm` backend: one sbatch job per run, one rank per GPU started by `srun`.

- `options`: the backend's options with their flags (`--partition`, `--time`, ...), read by the CLI at start;
- `render`: the sbatch script, a pure function of the spec and the options (golden-file tested);
- `backend`: `SlurmBackend` - options, request, schedule (`sbatch`), wait/status/logs/cancel
  (`squeue`, `sacct`, `scancel`);
- `rank`: what `srun` starts on every task: maps SLURM_* to the engines' variables, then becomes
  the trainer (`python -m train RUN_DIR`);
- `rendezvous`: Horovod's Gloo rendezvous server, started by the batch script on the first node.

scripts/slurm-cluster.sh starts a real two-node cluster on this machine to try it (and for the tests).
"""
