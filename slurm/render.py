"""The sbatch script for a run: a pure function of the spec, the run directory and the options.

What the script does, in order (each step is a comment in the script itself, so `--dry-run` explains it):

1. `#SBATCH` lines: nodes, one task per GPU, GPUs per node (GRES), CPUs per task, memory, time limit,
   partition/account/QoS/constraint/exclusive, the log in RUN_DIR/logs (appended across requeues),
   `--requeue` and `--signal=B:USR1@N` (a warning N seconds before the time limit), extra lines;
2. the rendezvous on the first node (the batch script runs there): DDP gets MASTER_ADDR/PORT,
   Horovod gets its Gloo rendezvous server (what `horovodrun` would start; no MPI, no ssh);
3. `srun` starts one `python -m slurm.rank` per task, which maps SLURM_* to the engine's variables
   and becomes the trainer; each rank logs to RUN_DIR/logs/rank-R.log;
4. signals: USR1 (time limit near) and TERM (scancel, `scontrol requeue`, preemption) go on to the
   ranks through srun; they checkpoint and exit 143. After a USR1 the script requeues the job, and
   the ranks resume from RUN_DIR/checkpoint.pt when it starts again.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.spec import TORCHRUN_ENGINES, Spec

LOG_NAME = "slurm-%j.out"  # the batch script's own output, per job id, in RUN_DIR/logs


def job_name(run_dir: Path, options: Mapping[str, Any]) -> str:
    """The Slurm job name: the option, or `scalelab-<run directory name>`."""
    name = options.get("job_name") or f"scalelab-{Path(run_dir).name}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def sbatch_lines(spec: Spec, run_dir: Path, options: Mapping[str, Any]) -> list[str]:
    """The `#SBATCH` arguments, in the order a Slurm user reads them."""
    o = options
    lines = [
        f"--job-name={job_name(run_dir, o)}",
        f"--nodes={spec.nodes}",
        f"--ntasks-per-node={spec.gpus_per_node}",  # one rank per GPU
    ]
    if o["gres_gpus"]:
        lines.append(f"--gpus-per-node={spec.gpus_per_node}")
    lines.append(f"--cpus-per-task={o['cpus_per_task']}")
    if o["mem_gb"]:
        lines.append(f"--mem={_mem(o['mem_gb'])}")
    if o["time"]:
        lines.append(f"--time={o['time']}")
    for key in ("partition", "account", "qos", "constraint"):
        if o[key]:
            lines.append(f"--{key}={o[key]}")
    if o["exclusive"]:
        lines.append("--exclusive")
    lines += [f"--output={Path(run_dir) / 'logs' / LOG_NAME}", "--open-mode=append"]
    if o["requeue"]:
        lines += ["--requeue", f"--signal=B:USR1@{o['signal_s']}"]
    else:
        lines.append("--no-requeue")
    lines += list(o["extra_sbatch"])
    return lines


def render_sbatch(spec: Spec, run_dir: Path, options: Mapping[str, Any], python: str) -> str:
    """The whole batch script. Pure: the same arguments always give the same text."""
    run_dir = Path(run_dir)
    engine = spec.engine.name
    threads = spec.threads or options["cpus_per_task"]
    q = shlex.quote
    out = ["#!/bin/bash",
           f"# scalelab: {spec.model} {engine} on {spec.nodes} node(s) x {spec.gpus_per_node} GPU(s), one rank per GPU",
           *(f"#SBATCH {line}" for line in sbatch_lines(spec, run_dir, options)),
           "",
           "set -uo pipefail",
           f"RUN_DIR={q(str(run_dir))}",
           f"PYTHON={q(python)}",
           f"export OMP_NUM_THREADS={threads} PYTHONUNBUFFERED=1"]
    if engine == "horovod":
        out.append(f"export HOROVOD_FUSION_THRESHOLD={int(spec.engine.fusion_threshold_mb * 1024 * 1024)} "
                   f"HOROVOD_CYCLE_TIME={spec.engine.cycle_time_ms}")
    if options["gloo_iface"]:
        out.append(f"export HOROVOD_GLOO_IFACE={q(options['gloo_iface'])} GLOO_SOCKET_IFNAME={q(options['gloo_iface'])}")
    out += ['echo "scalelab: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST, '
            'batch script on $(hostname)"',
            'mkdir -p "$RUN_DIR/logs" "$RUN_DIR/slurm"']
    out += list(options["setup"])
    out += ["", "# Rendezvous on the first node of the allocation: this script runs there, so does rank 0.",
            "export SCALELAB_RDZV_ADDR=$(hostname)"]
    if engine == "horovod":
        out += ["# Horovod's Gloo rendezvous server (what horovodrun starts): prints its port, serves until killed.",
                f'coproc RDZV {{ exec "$PYTHON" -m slurm.rendezvous --tasks-per-node {spec.gpus_per_node}; }}',
                'read -r SCALELAB_RDZV_PORT <&"${RDZV[0]}" '
                '|| { echo "scalelab: error: the Horovod rendezvous server did not start" >&2; exit 1; }',
                'RDZV_SERVER=$RDZV_PID; disown "$RDZV_SERVER"']
    elif engine in TORCHRUN_ENGINES:
        out.append('SCALELAB_RDZV_PORT=$("$PYTHON" -m slurm.rank --free-port)')
    else:
        out.append("SCALELAB_RDZV_PORT=0")
    out += ["export SCALELAB_RDZV_PORT",
            "",
            "# One rank per task; USR1 (time limit near) and TERM (cancel, requeue) go on to them through srun.",
            "REQUEUE=0",
            'trap \'REQUEUE=1; kill -USR1 "${SRUN:-}" 2>/dev/null\' USR1',
            'trap \'kill -TERM "${SRUN:-}" 2>/dev/null\' TERM',
            'srun --kill-on-bad-exit=1 --distribution=block --open-mode=append \\',
            '     --output="$RUN_DIR/logs/rank-%t.log" "$PYTHON" -m slurm.rank "$RUN_DIR" &',
            "SRUN=$!",
            'wait "$SRUN"; RC=$?',
            'while [ "$RC" -gt 128 ] && kill -0 "$SRUN" 2>/dev/null; do wait "$SRUN"; RC=$?; done  # woken by a trap',
            ]
    if engine == "horovod":
        out.append('kill -9 "$RDZV_SERVER" 2>/dev/null')
    out += ['echo "scalelab: ranks exited with $RC"',
            'if [ "$REQUEUE" = 1 ]; then',
            '  echo "scalelab: time limit near: the ranks checkpointed; requeueing job $SLURM_JOB_ID"',
            '  scontrol requeue "$SLURM_JOB_ID"',
            "fi",
            'exit "$RC"',
            ""]
    return "\n".join(out)


def _mem(gb: float) -> str:
    """sbatch --mem: whole gigabytes as `16G`, otherwise megabytes."""
    return f"{int(gb)}G" if float(gb).is_integer() else f"{int(round(gb * 1024))}M"
