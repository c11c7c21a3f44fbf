"""`SlurmBackend`: one sbatch job per run on a real Slurm cluster, one rank per GPU started by srun.

Submission goes through `sbatch` itself (no submitit: the job is a shell script that starts the ranks
with srun, so a pickled Python function would add nothing but a dependency). Before a job is queued,
`sbatch --test-only` asks the controller whether it could ever run (partition, GPUs per node, time
format, account...), so a bad request fails with Slurm's own words and nothing queued. Status comes
from `squeue` while Slurm remembers the job and from `sacct` (accounting) afterwards; cancel is
`scancel`, and it waits until the job has left the queue. The follow loop is launcher/runner.py's;
this backend needs no `poll` of its own (its status is the poll) and declares `queues`: a sweep
queues every layout at once.

Order inside the module (as in every backend): options, request, render (pure), schedule,
status/logs/cancel.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from core.errors import ScalelabError
from core.rundir import (
    ACTIVE,
    CANCELLED,
    COMPLETED,
    FAILED,
    PENDING,
    RUNNING,
    UNKNOWN,
    RunPaths,
    read_state,
    start_state,
)
from core.spec import Spec
from launcher.backend import Backend, Request, RunStatus, log_text
from slurm.options import SlurmOptions
from slurm.render import job_name, render_sbatch

SCRIPT_NAME = "slurm/job.sbatch"

# Slurm job states (squeue %T / sacct State) -> the backend-neutral states.
STATE_MAP = {
    **dict.fromkeys(["PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD",
                     "SPECIAL_EXIT", "SUSPENDED", "STOPPED", "RESIZING"], PENDING),
    **dict.fromkeys(["RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"], RUNNING),
    "COMPLETED": COMPLETED,
    "CANCELLED": CANCELLED,
    **dict.fromkeys(["FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
                     "REVOKED"], FAILED),
}

# What to do about Slurm's most common refusals (matched in its message, which is always shown too).
HINTS = [
    ("invalid partition", "check --partition: `sinfo -s` lists the partitions"),
    ("node configuration is not available", "the cluster has no nodes with that many GPUs / CPUs / memory: "
     "check --nodes, --gpus-per-node, --cpus-per-task and --mem-gb against `sinfo -o '%P %D %c %m %G'`"),
    ("invalid --time", "--time takes MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"),
    ("time limit", "check --time against the partition's limit (`sinfo -o '%P %l'`)"),
    ("invalid account", "check --account (`sacctmgr show assoc user=$USER`)"),
    ("invalid qos", "check --qos (`sacctmgr show assoc user=$USER format=qos`)"),
    ("unrecognized option", "check the --sbatch-arg lines (`sbatch --help`)"),
    ("memory", "check --mem-gb against the nodes' memory (`sinfo -o '%P %m'`)"),
]


@dataclass
class SlurmRequest(Request):
    """The batch script, exactly as sbatch will get it."""

    script: str = ""
    job_name: str = ""

    def render(self) -> str:
        return self.script

    @property
    def script_path(self) -> Path:
        return self.run_dir / SCRIPT_NAME


class SlurmBackend(Backend):
    queues = True  # a sweep queues every layout before following the first
    horovod_here = True  # the nodes run this Python from the shared filesystem

    name = "slurm"
    Options = SlurmOptions  # the valid options, their defaults and checks (slurm/options.py)

    # ---- request, render (pure) ------------------------------------------------------------------

    def submit_dryrun(self, spec: Spec, run_dir: Path) -> SlurmRequest:
        run_dir = Path(run_dir).absolute()  # the nodes see the same path (shared filesystem)
        python = self.options["python"] or sys.executable
        return SlurmRequest(run_dir, render_sbatch(spec, run_dir, self.options, python), job_name(run_dir, self.options))

    # ---- schedule --------------------------------------------------------------------------------

    def schedule(self, request: SlurmRequest) -> str:
        """Ask Slurm whether the job could run (`sbatch --test-only`), then queue it; return the job id."""
        run_dir = request.run_dir
        _refuse_while_queued(run_dir)
        RunPaths(run_dir).logs.mkdir(parents=True, exist_ok=True)
        request.script_path.parent.mkdir(parents=True, exist_ok=True)
        request.script_path.write_text(request.script)
        check = _slurm(["sbatch", "--test-only", str(request.script_path)])
        if check.returncode != 0:
            raise ScalelabError(_refusal("Slurm refused the job", check, run_dir))
        sent = _slurm(["sbatch", "--parsable", str(request.script_path)])
        job_id = sent.stdout.strip().split(";")[0]
        if sent.returncode != 0 or not job_id.isdigit():
            raise ScalelabError(_refusal("sbatch failed", sent, run_dir))
        previous = read_state(run_dir) if RunPaths(run_dir).launch.exists() else {}
        start_state(run_dir, backend=self.name, job_id=job_id, jobs=[*previous.get("jobs", []), job_id],
                    job_name=request.job_name, script=str(request.script_path), submitted=time.time())
        return job_id

    # ---- status, logs, cancel ---------------------------------------------------------------------

    def status(self, run_dir: Path) -> RunStatus:
        job_id = read_state(run_dir)["job_id"]
        slurm_state, detail = job_state(job_id)
        return RunStatus(STATE_MAP.get(slurm_state, UNKNOWN), f"Slurm job {job_id} {slurm_state}{detail}")

    def logs(self, run_dir: Path) -> str:
        info, logs = read_state(run_dir), RunPaths(Path(run_dir)).logs
        files = [logs / f"slurm-{job}.out" for job in info.get("jobs", [info["job_id"]])]
        files += sorted(logs.glob("rank-*.log"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
        return log_text(files)

    def cancel(self, run_dir: Path, grace_s: float = 120.0) -> None:
        """`scancel` (the ranks get SIGTERM, checkpoint and exit), then wait until the job left the queue.

        The job has left when Slurm no longer shows it RUNNING or COMPLETING: slurmd has then ended
        every process of it on every node (after `KillWait` seconds with SIGKILL), so nothing of the
        run is left. A job still there after `grace_s` is an error that says so.
        """
        job_id = read_state(run_dir)["job_id"]
        done = _slurm(["scancel", job_id])
        if done.returncode != 0 and STATE_MAP.get(job_state(job_id)[0]) in ACTIVE:
            raise ScalelabError(_refusal(f"scancel {job_id} failed", done, Path(run_dir)))
        deadline = time.time() + grace_s
        while (state := job_state(job_id)[0]) and STATE_MAP.get(state) in ACTIVE:
            if time.time() > deadline:
                raise ScalelabError(f"Slurm job {job_id} is still {state} {grace_s:.0f} s after scancel; "
                                    f"`squeue -j {job_id}` shows it, `scancel --signal=KILL {job_id}` ends it")
            time.sleep(0.5)


def _refuse_while_queued(run_dir: Path) -> None:
    """A run has one job at a time: a resume while its job is still queued or running is refused.

    That happens after the launcher that followed the job was killed (SIGKILL, a lost login
    session): Slurm, not the launcher, supervises the job, so it goes on.
    """
    if not RunPaths(run_dir).launch.exists():
        return
    job_id = read_state(run_dir).get("job_id")
    state = job_state(job_id)[0] if job_id else ""
    if STATE_MAP.get(state) in ACTIVE:
        raise ScalelabError(f"run {run_dir} is still {state} as Slurm job {job_id} (Slurm keeps a job going "
                            f"when its launcher is gone): `launch status {run_dir}` and `launch logs {run_dir}` "
                            f"follow it; `launch cancel {run_dir}` stops it, then `launch resume {run_dir}` continues it")


# ---- Slurm's commands ----------------------------------------------------------------------------


def job_state(job_id: str) -> tuple[str, str]:
    """(Slurm state, detail): squeue while the controller remembers the job, else sacct (accounting)."""
    q = _slurm(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T|%r"])
    a = None
    if q.returncode == 0 and q.stdout.strip():
        state, _, reason = q.stdout.strip().splitlines()[0].partition("|")
        if STATE_MAP.get(state) in ACTIVE:
            return state, f" ({reason})" if reason not in ("", "None") else ""
        a = _sacct(job_id)  # ended: accounting has the exit code (when it has caught up)
        return state, f" (exit code {a[1]})" if a and a[0] == state else ""
    a = _sacct(job_id)
    if a:
        return a[0], f" (exit code {a[1]})"
    return "UNKNOWN", f": neither squeue nor sacct knows it ({_words(q)})"


def _sacct(job_id: str) -> tuple[str, str] | None:
    """(state, exit code) of the job's latest run from accounting, or None without accounting."""
    a = _slurm(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"])
    rows = [line.split("|") for line in a.stdout.strip().splitlines() if line.count("|") == 1]
    if a.returncode != 0 or not rows:
        return None
    return rows[-1][0].split()[0], rows[-1][1]  # "CANCELLED by 0" -> CANCELLED


def _slurm(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    if shutil.which(cmd[0]) is None:
        raise ScalelabError(
            f"{cmd[0]} is not on PATH: the slurm backend runs on a Slurm login node "
            "(to try it on this machine: scripts/slurm-cluster.sh start)"
        )
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ScalelabError(f"`{' '.join(cmd)}` did not answer in {timeout:.0f} s: is slurmctld up? (`sinfo`)") from None


def _words(proc: subprocess.CompletedProcess) -> str:
    """Slurm's own message, on one line."""
    return "; ".join(line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip())


def _refusal(what: str, proc: subprocess.CompletedProcess, run_dir: Path) -> str:
    words = _words(proc) or f"exit code {proc.returncode}"
    hints = [hint for key, hint in HINTS if key in words.lower()][:1]
    return f"{what} for {run_dir.name} (nothing was queued): {words}" + (f"; {hints[0]}" if hints else "")
