"""The sbatch script of a run, rendered by submitit itself: what `--dry-run` prints is what sbatch gets.

`executor_parameters` maps the spec and the backend options to the parameters of submitit's
`SlurmExecutor` (a pure function); `render_sbatch` asks submitit for the script it writes for them
(`SlurmExecutor._make_submission_file_text`, the text `executor.submit` hands to sbatch). The script,
in submitit's layout:

1. `#SBATCH` lines (submitit sorts them): nodes, one task per GPU, GPUs per node (GRES; `--gres=gpu:TYPE:N`
   with a GPU type), CPUs per
   task, memory, time limit, partition/account/QoS/constraint/exclusive, the batch step's log,
   `--requeue` and `--signal=USR1@N` (a warning N seconds before the time limit, to every rank),
   the `--sbatch-arg` lines; `--array` for the repeats of one layout;
2. `# setup`: threads and engine variables, the user's `setup` lines, then the rendezvous on the
   first node (the script runs there): DDP gets MASTER_ADDR/PORT, Horovod its Gloo rendezvous
   server (what `horovodrun` would start; no MPI, no ssh);
3. `# command`: srun starts `python -m submitit.core._submit FOLDER` on every task, which loads the
   pickled rank function (`slurm.rank.RankJob`) and calls it; each task logs to
   FOLDER/JOB_TASK_log.out and .err (FOLDER = RUN_DIR/slurm; for an array, one beside its runs);
4. `# teardown` (Horovod): the rendezvous server is stopped; the script exits with srun's status.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import submitit

from scalelab.core.launch import engine_env, payload_comment, starter_of
from scalelab.core.spec import Spec
from scalelab.slurm.options import sbatch_option

SUBMITIT_DIR = "slurm"  # submitit's folder in the run directory: script, pickles, per-task logs, placements
WARNING_SIGNAL = "USR1"  # sent N s before the time limit; the ranks checkpoint on it (scalelab/train/loop.py)
SRUN_ARGS = ["--kill-on-bad-exit=1", "--distribution=block"]  # one rank dies: the job ends; rank = node*n+local


class Executor(submitit.SlurmExecutor):
    """submitit's Slurm executor, also where Slurm is not (a dry run on a laptop): whether sbatch is
    here is asked when a job is sent (scalelab/slurm/backend.py), not when a script is rendered."""

    @classmethod
    def affinity(cls) -> int:
        return 2


def make_executor(folder: Path, parameters: Mapping[str, Any], python: str) -> Executor:
    """The executor for a run (or the repeats of one, as a job array), its parameters checked by submitit."""
    executor = Executor(folder, python=shlex.quote(python))
    executor.update_parameters(**parameters)
    return executor


def render_sbatch(folder: Path, parameters: Mapping[str, Any], python: str, count: int = 1) -> str:
    """The batch script submitit writes for these parameters; `count` > 1: the job array of that many runs.

    Pure: the same arguments always give the same text.
    """
    executor = make_executor(folder, parameters, python)
    if count > 1:
        executor.parameters["map_count"] = count  # what submitit's own array submission sets
    return executor._make_submission_file_text(executor._submitit_command_str, "")


# ---- which folder, which name --------------------------------------------------------------------


def array_stem(run_dirs: Sequence[Path]) -> str | None:
    """NAME when the run directories are PARENT/NAME0, PARENT/NAME1, ... (one job array serves them)."""
    first = Path(run_dirs[0])
    stem = first.name[:-1]
    if len(run_dirs) < 2 or not first.name.endswith("0"):
        return None
    return stem if [Path(d) for d in run_dirs] == [first.parent / f"{stem}{i}" for i in range(len(run_dirs))] else None


def job_folder(run_dirs: Sequence[Path]) -> Path:
    """submitit's folder: RUN_DIR/slurm; for a job array, one beside the runs, PARENT/NAMEN-slurm, which
    its tasks share (submitit has no folder per array task: a `%a` in it fails at submission)."""
    if len(run_dirs) == 1:
        return Path(run_dirs[0]) / SUBMITIT_DIR
    return Path(run_dirs[0]).parent / f"{array_stem(run_dirs)}N-{SUBMITIT_DIR}"


def job_name(run_dirs: Sequence[Path], options: Mapping[str, Any]) -> str:
    """The Slurm job name: the option, or `scalelab-<run directory name>` (`scalelab-NAME` for an array)."""
    name = options.get("job_name") or f"scalelab-{array_stem(run_dirs) or Path(run_dirs[0]).name}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


# ---- the parameters ------------------------------------------------------------------------------


def executor_parameters(spec: Spec, run_dirs: Sequence[Path], options: Mapping[str, Any],
                        python: str, sweep: str = "") -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for the run(s): sbatch's own settings where there is one; `sweep`: the
    sweep the run is a layout of (`one_at_a_time`). Pure."""
    o = options
    forced: dict[str, Any] = {"requeue": True} if o["requeue"] else {"no-requeue": True}
    forced["signal"] = f"{WARNING_SIGNAL}@{o['signal_s']}"  # every rank: no B:, the batch shell forwards nothing
    forced.update(_sbatch_pairs(o["extra_sbatch"]))
    if spec.own_code and spec.workdir and "chdir" not in forced:  # a resume from elsewhere runs where the first
        forced["chdir"] = spec.workdir  # launch did: the script's relative paths resolve there (launcher.owncode)
    name, alone = job_name(run_dirs, o), one_at_a_time(sweep, o)
    if alone:  # every layout of the sweep under one name, one job of that name at a time
        name = job_name([Path(sweep)], o)
        forced["dependency"] = "singleton"
    params: dict[str, Any] = dict(
        job_name=name, nodes=spec.nodes, ntasks_per_node=spec.ranks_per_node,  # one rank per GPU (+ ps server ranks)
        cpus_per_task=o["cpus_per_task"], time=o["time"] or None,  # None: no --time, the partition's limit
        setup=setup_lines(spec, o, python), srun_args=SRUN_ARGS, additional_parameters=forced,
    )
    if teardown := starter_of(spec.engine.name).slurm_teardown():  # e.g. Horovod's rendezvous server stopped
        params["teardown"] = teardown
    if o["gres_gpus"] and o["gpu_type"]:  # a typed GRES: only nodes with GPUs of that type
        params["gres"] = f"gpu:{o['gpu_type']}:{spec.gpus_per_node}"
    elif o["gres_gpus"]:
        params["gpus_per_node"] = spec.gpus_per_node
    if o["mem_gb"]:
        params["mem"] = _mem(o["mem_gb"])
    for key in ("partition", "account", "qos", "constraint"):
        if o[key]:
            params[key] = o[key]
    if o["exclusive"]:
        params["exclusive"] = True
    if alone:
        params["array_parallelism"] = 1  # the repeats too: `--array=0-N%1`
    return params


def one_at_a_time(sweep: str, options: Mapping[str, Any]) -> bool:
    """Whether a sweep's layouts (and repeats) run one after another: yes unless they get whole nodes (--exclusive)
    or the user set their own --sbatch-arg=--dependency. Why: a layout timed while another shares its node measures
    the two together; a scaling sweep is only as good as its slowest-disturbed layout."""
    return bool(sweep) and not options["exclusive"] and "dependency" not in _sbatch_pairs(options["extra_sbatch"])


def setup_lines(spec: Spec, options: Mapping[str, Any], python: str) -> list[str]:
    """What the batch script runs before srun: the ranks' variables, the user's lines, the rendezvous
    the engine's starter needs (srun then starts every rank itself: scalelab/slurm/rank.py)."""
    q, how = shlex.quote, starter_of(spec.engine.name)
    out = [f"export OMP_NUM_THREADS={spec.threads or options['cpus_per_task']} PYTHONUNBUFFERED=1"]
    if env := engine_env(spec):
        out.append("export " + " ".join(f"{k}={q(v)}" for k, v in env.items()))
    if options["gloo_iface"]:
        iface = q(options["gloo_iface"])
        out.append(f"export HOROVOD_GLOO_IFACE={iface} GLOO_SOCKET_IFNAME={iface}")
    out += list(options["setup"])
    if comment := payload_comment(spec):  # a --script: what every rank runs (the shared filesystem's path)
        out.append(comment)
    out += ["# Rendezvous on the first node of the allocation: this script runs there, so does rank 0.",
            "export SCALELAB_RDZV_ADDR=$(hostname)"]
    out += how.slurm_setup(spec, python)  # the starter's rendezvous (Horovod's Gloo server, a free port, none)
    out.append("export SCALELAB_RDZV_PORT")
    return out


def _sbatch_pairs(args: Sequence[str]) -> dict[str, Any]:
    """`--mail-type=END` (or `--mail-type END`) -> {"mail-type": "END"}, `--exclusive` -> {"exclusive": True},
    `-d afterok:1` -> {"dependency": "afterok:1"}: submitit's form, which it writes `#SBATCH --KEY=VALUE` (a
    short option was written `--d afterok:1`, which sbatch refuses)."""
    out: dict[str, Any] = {}
    for arg in args:
        key, value = sbatch_option(arg)
        out[key] = True if value is None else value
    return out


def _mem(gb: float) -> str:
    """sbatch --mem: whole gigabytes as `16G`, otherwise megabytes."""
    return f"{int(gb)}G" if float(gb).is_integer() else f"{int(round(gb * 1024))}M"
