"""`SlurmBackend`: one Slurm job per run through submitit, one rank per GPU in each task of it.

Submission is submitit's: a `SlurmExecutor` whose parameters are the backend options
(scalelab/slurm/render.py) pickles the rank function (`slurm.rank.RankJob`) into RUN_DIR/slurm, writes its
sbatch script there and runs sbatch; the repeats of one layout go out as one job array
(`executor.batch()`). Before that, `sbatch --test-only` asks the controller whether the same script
could ever run (partition, GPUs per node, time format, account...), so a bad request fails with
Slurm's own words and nothing queued. Status comes from submitit's watcher: one sacct query for
every job this backend follows (a sweep's), at 2 s at first and backing off to `poll_s`; right
after a query that left jobs without a live state (accounting lags), one squeue for all of them
(`SlurmWatcher`). Cancel is submitit's (scancel), then a wait until Slurm has ended every process
of the job. The follow loop is scalelab/launcher/runner.py's: this backend
has no loop of its own, and declares `queues`: a sweep queues every layout at once.

The launcher never loads a pickle from a run directory (submitit's results included): what a run
did comes from its records, as on every backend.

Order inside the module (as in every backend): options, request, render (pure), schedule,
status/logs/cancel.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError, FailedSubmissionError, JobPaths
from submitit.slurm.slurm import SlurmInfoWatcher

from scalelab.core.errors import NotQueued, ScalelabError, SpecError, shell_word
from scalelab.core.rundir import (
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
from scalelab.core.spec import Spec, read_spec
from scalelab.core.waiting import wait_until
from scalelab.core.writes import open_inside
from scalelab.launcher.backend import Backend, RankOutput, Request, RunStatus, log_text, ranks_exits_detail
from scalelab.slurm.options import SlurmOptions, warning_too_late
from scalelab.slurm.rank import EXIT_FILE, INTERRUPTED, PLACEMENT_DIR, RankJob
from scalelab.slurm.render import (
    array_stem,
    executor_parameters,
    job_folder,
    make_executor,
    one_at_a_time,
    render_sbatch,
)

logging.getLogger("submitit").setLevel(logging.ERROR)  # the launcher says what Slurm says; the ranks' logs keep submitit's

# Slurm job states (sacct State / squeue %T) -> the backend-neutral states.
STATE_MAP = {
    **dict.fromkeys(["PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD",
                     "SPECIAL_EXIT", "SUSPENDED", "STOPPED", "RESIZING"], PENDING),
    **dict.fromkeys(["RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"], RUNNING),
    "COMPLETED": COMPLETED,
    "CANCELLED": CANCELLED,
    **dict.fromkeys(["FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
                     "REVOKED"], FAILED),
}

NODE_CONFIG_HINT = ("the cluster has no nodes with that many GPUs / CPUs / memory: check --nodes, --gpus-per-node, "
                    "--cpus-per-task and --mem-gb against `sinfo -o '%P %D %c %m %G'`")
UNREACHABLE_HINT = "cannot reach the Slurm controller: is slurmctld up? (`sinfo`, `scontrol ping`)"
NO_ACCOUNTING_HINT = ("cannot reach Slurm's accounting or controller: are slurmdbd and slurmctld up? (`sacct`, "
                      "`scontrol ping`)")
# What to do about Slurm's most common refusals (matched in its message, which is always shown too).
HINTS = [
    ("unable to contact slurm controller", UNREACHABLE_HINT),
    ("invalid partition", "check --partition: `sinfo -s` lists the partitions"),
    ("node configuration is not available", NODE_CONFIG_HINT),
    ("invalid feature specification", "check --constraint: `sinfo -o '%N %f'` lists the nodes' features"),
    ("invalid --time", "--time takes MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"),
    ("time limit", "check --time against the partition's limit (`sinfo -o '%P %l'`)"),
    ("invalid account", "check --account (`sacctmgr show assoc user=$USER`)"),
    ("invalid qos", "check --qos (`sacctmgr show assoc user=$USER format=qos`)"),
    ("unrecognized option", "check the --sbatch-arg lines (`sbatch --help`)"),
    ("memory", "check --mem-gb against the nodes' memory (`sinfo -o '%P %m'`)"),
]


@dataclass
class SlurmRequest(Request):
    """One sbatch job - a job array for the repeats of one layout - exactly as submitit hands it to sbatch."""

    script: str = ""
    run_dirs: list[Path] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)  # submitit's, which rendered `script`
    python: str = ""

    def render(self) -> str:
        return self.script

    @property
    def folder(self) -> Path:
        return job_folder(self.run_dirs)


class SlurmBackend(Backend):
    queues = True  # a sweep queues every layout before following the first
    horovod_here = True  # the nodes run this Python from the shared filesystem
    # `--detach` submits and returns, as sbatch does: Slurm, not the launcher, supervises the job, and
    # `finish` only waits for it to leave the queue; `launch status` records how it ended
    detachable = True
    checkpoint_here = True  # RUN_DIR/checkpoint.pt is here: a resume can tell when there is none

    name = "slurm"
    Options = SlurmOptions  # the valid options, their defaults and checks (scalelab/slurm/options.py)

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        # One watcher for every job this backend follows: one sacct query for all, 2 s apart at first.
        self.watcher = SlurmWatcher(delay_s=max(2.0, float(self.options["poll_s"])))
        self._verified: set[str] = set()  # job ids found to be their run's (`_not_this_run`)
        self._tested: set[str] = set()  # sbatch scripts `preflight` found Slurm would take; shared by copies

    def sweep_note(self) -> str:
        if not one_at_a_time(self.sweep, self.options):
            return ""
        return ("the layouts are queued now and run one after another (sbatch --dependency=singleton), so that none "
                "is timed while another shares its node; --exclusive gives each whole nodes and lets them run at once")

    def check(self, spec: Spec) -> None:
        from scalelab.launcher.owncode import workdir

        workdir(spec)  # a --script run's first working directory, gone: refused here as on the local backend
        if self.options["gpu_type"] and not self.options["gres_gpus"]:
            raise ScalelabError(f"--gpu-type {self.options['gpu_type']} asks for typed GPUs, but gres_gpus is false "
                                "(no GPUs are requested); drop one of the two")

    # ---- request, render (pure) ------------------------------------------------------------------

    def submit_dryrun(self, spec: Spec, run_dir: Path) -> SlurmRequest:
        return self.submit_dryrun_batch(spec, [run_dir])[0]

    def submit_dryrun_batch(self, spec: Spec, run_dirs: list[Path]) -> list[Request]:
        """One job for one run; one job array for repeats in PARENT/NAME0, NAME1, ... (else one job each)."""
        late = warning_too_late(self.options)
        if late:
            raise SpecError(late)
        run_dirs = [Path(d).absolute() for d in run_dirs]  # the nodes see the same paths (shared filesystem)
        if len(run_dirs) > 1 and array_stem(run_dirs) is None:
            return [self.submit_dryrun(spec, d) for d in run_dirs]
        python = self.options["python"] or sys.executable
        parameters = executor_parameters(spec, run_dirs, self.options, python, sweep=self.sweep)
        script = render_sbatch(job_folder(run_dirs), parameters, python, len(run_dirs))
        return [SlurmRequest(run_dirs[0], script, run_dirs, parameters, python)]

    # ---- schedule --------------------------------------------------------------------------------

    def preflight(self, spec: Spec, run_dirs: list[Path]) -> None:
        """`sbatch --test-only` of the request(s) for `run_dirs`, sending nothing: a sweep asks it of every layout
        before it submits the first (`launcher.sweep.continue_sweep`). Why: a sweep whose second layout asked for
        more GPUs than a node has queued the first, cancelled it and recorded it FAILED with the second's error."""
        for request in self.submit_dryrun_batch(spec, run_dirs):
            request.folder.mkdir(parents=True, exist_ok=True)
            _test_only(request)
            self._tested.add(request.script)  # `schedule` sends it without asking again

    def schedule(self, request: SlurmRequest) -> str:
        """Ask Slurm whether the job could run (`sbatch --test-only`), then submit it through submitit.

        Returns the job id (an array's id for repeats); each run's launch.json gets its own (`ID_INDEX`).
        """
        for run_dir in request.run_dirs:
            self._refuse_while_queued(run_dir)
        request.folder.mkdir(parents=True, exist_ok=True)
        if request.script in self._tested:  # asked by `preflight` a moment ago: once is enough
            self._tested.discard(request.script)
        else:
            _test_only(request)
        jobs = self._send(request)
        for run_dir, job in zip(request.run_dirs, jobs):
            previous = jobs_of(run_dir) if RunPaths(run_dir).launch.exists() else []
            runs = [*previous, {"job_id": job.job_id, "folder": str(request.folder)}]
            start_state(run_dir, backend=self.name, job_id=job.job_id, runs=runs,
                        script=str(job.paths.submission_file), submitted=time.time(),
                        **job_owner(request.script, request.parameters["job_name"]))
            self.watcher.register_job(job.job_id)
        return jobs[0].job_id.split("_")[0]

    def _send(self, request: SlurmRequest) -> list[submitit.Job]:
        """submitit's submission: the pickled rank function(s), the script, sbatch."""
        need("sbatch")
        executor = make_executor(request.folder, request.parameters, request.python)
        requeues = self.options["max_requeues"] if self.options["requeue"] else 0
        ranks = [RankJob(run_dir, requeues, bool(self.options["requeue"])) for run_dir in request.run_dirs]
        try:
            if len(ranks) == 1:
                return [executor.submit(ranks[0])]
            with executor.batch():  # one job array
                jobs = [executor.submit(rank) for rank in ranks]
            return jobs
        except (FailedJobError, FailedSubmissionError, OSError) as exc:
            words = " ".join(str(exc).split())
            raise NotQueued(f"sbatch failed for {request.run_dir.name} (nothing was queued): {words}") from None

    def _refuse_while_queued(self, run_dir: Path) -> None:
        """A run has one job at a time: a resume while its job is still queued or running is refused.

        That happens after the launcher that followed the job was killed (SIGKILL, a lost login
        session): Slurm, not the launcher, supervises the job, so it goes on.
        """
        job_id = read_state(run_dir).get("job_id") if RunPaths(run_dir).launch.exists() else None
        state = self.job_state(job_id)[0] if job_id else ""
        if STATE_MAP.get(state) in ACTIVE:
            raise ScalelabError(f"run {run_dir} is still {state} as Slurm job {job_id} (Slurm keeps a job going "
                                f"when its launcher is gone): `launch status {shell_word(run_dir)}` and `launch logs {shell_word(run_dir)}` "
                                f"follow it; `launch cancel {shell_word(run_dir)}` stops it, then `launch resume {shell_word(run_dir)}` "
                                "continues it")

    # ---- status, logs, cancel ---------------------------------------------------------------------

    @property
    def poll_interval_s(self) -> float:
        return 1.0  # a poll is cheap: submitit's watcher decides when sacct is asked (`poll_s`)

    def poll(self, run_dir: Path) -> RunStatus:
        """The status; at once from sacct when rank 0 has finished (its result file, as submitit's `done`)."""
        job = jobs_of(run_dir)[-1]
        ended = JobPaths(job["folder"], job_id=job["job_id"], task_id=0).result_pickle.exists()
        status = self.status(run_dir, "force" if ended else "standard")
        note_queued(run_dir, status)
        return status

    def status(self, run_dir: Path, mode: str = "standard") -> RunStatus:
        """The job's state; while it waits in the queue, why (squeue's reason: "Slurm job 7 PENDING (BeginTime)")."""
        job_id = read_state(run_dir)["job_id"]
        wrong = self._not_this_run(run_dir, job_id)
        if wrong:
            return RunStatus(UNKNOWN, wrong)
        state, nodes = self.job_state(job_id, mode)
        where = f" on {nodes}" if nodes and nodes != "None assigned" else ""
        reason = self.watcher.reasons.get(job_id, "") if STATE_MAP.get(state) == PENDING else ""
        why = f" ({reason})" if reason else ""
        if STATE_MAP.get(state) is None and self.watcher.problem:  # sacct's error, one line, where nothing is known
            why = f": {self.watcher.problem}; {NO_ACCOUNTING_HINT}"
        status = RunStatus(STATE_MAP.get(state, UNKNOWN), f"Slurm job {job_id} {state}{why}{where}")
        return with_rank_exits(run_dir, job_id, status) if status.state == FAILED else status

    def job_state(self, job_id: str, mode: str = "standard") -> tuple[str, str]:
        """(Slurm state, node list) from the watcher: accounting's (sacct), or the controller's (squeue)
        while accounting says PENDING or knows nothing of the job (see `SlurmWatcher`)."""
        need("sacct")
        info = self.watcher.get_info(job_id, mode)
        state = sacct_state(info)
        if state and STATE_MAP.get(state) != PENDING:
            return state, info.get("NodeList", "")
        queued = self.watcher.queued.get(job_id, "")
        return (queued, "") if queued else (state or "UNKNOWN", info.get("NodeList", ""))

    def watch(self, run_dir: Path) -> None:
        """Add the run's job to the watcher's one sacct query, before any status is asked (`launch status
        SWEEP` asks for every layout's: one query for all)."""
        job_id = read_state(run_dir).get("job_id") if RunPaths(run_dir).launch.exists() else None
        if job_id:
            self.watcher.register_job(str(job_id))

    def finish(self, run_dir: Path, status: RunStatus) -> RunStatus:
        """The job ended: wait until Slurm has ended every process of it (it leaves the queue)."""
        wait_gone(read_state(run_dir)["job_id"], grace_s=120.0)
        return status

    def logs(self, run_dir: Path) -> str:
        """Every job's per-task logs (submitit's JOB_TASK_log.out and .err), rank by rank, summarised: submitit's
        own INFO lines left out (16 files of them came before any progress) and the files with nothing else
        named in one line; the files stay whole on disk, and `launch logs RUN --rank N` shows one rank's."""
        ranks, files = read_spec(Path(run_dir)).world, []
        for job in jobs_of(run_dir):
            for rank in range(ranks):
                paths = JobPaths(job["folder"], job_id=job["job_id"], task_id=rank)
                files += [p for p in (paths.stdout, paths.stderr) if p.exists() or rank == 0]
        return summarised_task_logs(files)

    def rank_logs(self, run_dir: Path, rank: int) -> str:
        """One rank's task files of every job (its task id is its rank), whole but for a cancel's srun lines."""
        return quiet_slurm_stop(log_text([p for job in jobs_of(run_dir) for p in (
            JobPaths(job["folder"], job_id=job["job_id"], task_id=rank).stdout,
            JobPaths(job["folder"], job_id=job["job_id"], task_id=rank).stderr) if p.exists()]))

    def rank_output_files(self, run_dir: Path) -> list[RankOutput]:
        """Each rank's task files (.out, .err) of every job on the shared filesystem, submitit's own lines left out."""
        ranks, out = read_spec(Path(run_dir)).world, []
        for job in jobs_of(run_dir):
            for rank in range(ranks):
                paths = JobPaths(job["folder"], job_id=job["job_id"], task_id=rank)
                out += [RankOutput(path, f"[rank{rank}]:", path == paths.stderr, _SUBMITIT_LINE.match)
                        for path in (paths.stdout, paths.stderr) if path.is_file()]
        return out

    def cancel(self, run_dir: Path, grace_s: float = 120.0) -> str | None:
        """submitit's cancel (scancel: the ranks get SIGTERM, checkpoint and exit), then wait until the
        job has left the queue: slurmd has then ended every process of it on every node (SIGKILL after
        `KillWait`), so nothing of the run is left. A job still there after `grace_s` is an error.

        Returns what it did and checked where it stopped a job ("stopped Slurm job 7 (scancel); it left the
        queue, none left"), as the local backend says its processes' count. Why: a run ended by its stall
        timeout said what was stopped on the local backend and nothing on Slurm."""
        job_id = read_state(run_dir).get("job_id")
        if not job_id:
            return None  # never queued
        wrong = self._not_this_run(run_dir, job_id)
        if wrong:
            raise ScalelabError(wrong)
        active = STATE_MAP.get(squeue_state(job_id)) in ACTIVE
        if active:
            submitit.SlurmJob(jobs_of(run_dir)[-1]["folder"], job_id).cancel(check=False)
        wait_gone(job_id, grace_s)
        return f"stopped Slurm job {job_id} (scancel); it left the queue, none left" if active else None


    def _not_this_run(self, run_dir: Path, job_id: str) -> str:
        """'' when Slurm's job `job_id` is the run's own (checked once per job), else why it is refused."""
        if job_id in self._verified:
            return ""
        wrong = job_mismatch(read_state(run_dir), job_fields(job_id))
        if wrong:
            return (f"Slurm job {job_id} named in {RunPaths(run_dir).launch} is not this run's job ({wrong}); nothing "
                    f"was sent to it. The file may have been edited, or Slurm reused the id: check `squeue -j {job_id}` "
                    f"and `sacct -j {job_id}`, and stop the run's own job with scancel")
        self._verified.add(job_id)
        return ""


def with_rank_exits(run_dir: Path, job_id: str, status: RunStatus) -> RunStatus:
    """`status` of a FAILED job with its ranks' exit statuses first, in the local backend's words and order
    (`ranks_exits_detail`: "rank 1 exited with status 3; rank 0 exited with status 143 (Slurm job 7 FAILED on node1)"),
    read from what the ranks recorded (`task_exits`) and kept as launch.json's `rank_exits`, which the
    failure's line reads too (`backend.silent_ranks`: "rank 1 was killed by SIGKILL"); `status` as it is where no
    rank recorded a failing exit (every one 0 or 143, the stop's). Why: `launch status` of a Slurm run whose rank 1
    exited 3 said only "Slurm job 7 FAILED on node1", where the local backend names the rank and its status."""
    from scalelab.core.rundir import update_state

    exits = {str(rank): code for rank, code in sorted(task_exits(run_dir, job_id).items())}
    try:
        if exits and read_state(run_dir).get("rank_exits") != exits:
            update_state(run_dir, rank_exits=exits)
    except ScalelabError:  # a full disk, an unreadable launch.json: Slurm's word alone
        return status
    if all(code in (0, INTERRUPTED) for code in exits.values()):  # none failed on its own (a time limit's stop):
        return status  # as the local backend, which names statuses only then; Slurm's word says why
    return RunStatus(status.state, f"{ranks_exits_detail(run_dir, [])} ({status.detail})")


def task_exits(run_dir: Path, job_id: str) -> dict[int, int]:
    """{rank: exit status} of job `job_id`'s latest (re)start, as its ranks recorded them in RUN_DIR/slurm/exit-R.jsonl
    (`rank.record_exit`); a rank that recorded none (killed with its task) is absent. Lines that are not such a
    record, and a planted link, are passed over."""
    lines = []
    for path in sorted((Path(run_dir) / PLACEMENT_DIR).glob(EXIT_FILE.format(rank="*"))):
        try:
            with os.fdopen(open_inside(run_dir, path, os.O_RDONLY), "rb") as f:
                raw = f.read().decode(errors="replace").splitlines()
        except (OSError, ScalelabError):
            continue
        for text in raw:
            with contextlib.suppress(ValueError):
                lines.append(json.loads(text))
    mine = [line for line in lines if isinstance(line, dict) and line.get("job_id") == job_id
            and type(line.get("rank")) is int and type(line.get("exit_code")) is int]
    latest = max((line.get("restart") or 0 for line in mine), default=0)
    return {line["rank"]: line["exit_code"] for line in mine if (line.get("restart") or 0) == latest}


def note_queued(run_dir: Path, status: RunStatus) -> None:
    """Keep launch.json's `queued` (what the launcher's progress bar shows: `launcher.progress`) as the job's
    place in the queue while it waits, and drop it once it runs; written only when it changes. Why: a job held
    by --begin, or queued again by a requeue, showed "starting ranks: 0 of 1 up" and an ETA. A launch.json that
    cannot be written leaves the bar as it was: following the run matters more."""
    from scalelab.core.rundir import update_state

    queued = status.detail if status.state == PENDING else None
    try:
        if read_state(run_dir).get("queued") != queued:
            update_state(run_dir, queued=queued)
    except ScalelabError:  # a WriteError (full disk) or an unreadable launch.json
        pass


# submitit's logger writes "submitit INFO (2026-11-27 05:00:00,123) - Starting with JobEnvironment(...)" in every
# task's files (and, on a cancel, "submitit WARNING (...) - Bypassing signal SIGCONT" in each): a person
# following the run wants the ranks' own lines
_SUBMITIT_LINE = re.compile(r"^submitit (?:(?:INFO|DEBUG) \(\d{4}-\d\d-\d\d [\d:,]+\) - |"
                            r"WARNING \(\d{4}-\d\d-\d\d [\d:,]+\) - Bypassing signal SIG\w+$)")

# What srun and slurmstepd print when the job is cancelled (scancel, `launch cancel`, the time limit): 5-8
# lines in task 0's file that read as errors ("error: *** JOB 270 ON node1 CANCELLED AT ... ***")
_SLURM_STOP = re.compile(
    r"^(?:srun: (?:Job step aborted.*|got SIG\w+|forcing job termination|launch/slurm: _step_signal: .*|"
    r"Job step \S+ aborted.*|error: \S+: tasks? [\d,-]+: (?:Exited with exit code (\d+)|Terminated|Killed))|"
    r"slurmstepd(?:-\S+)?: error: \*\*\* (?:STEP|JOB) (\S+) ON \S+ CANCELLED AT (\S+)(.*?) \*\*\*)$")


def quiet_slurm_stop(text: str) -> str:
    """`text` with srun's and slurmstepd's messages about a cancelled job made one line, where every task
    exited as a stop asks (143: SIGTERM, the ranks checkpointed); a task that failed keeps them all."""
    from scalelab.launcher.backend import _stop_signal

    lines = text.splitlines(keepends=True)
    matches = [_SLURM_STOP.match(line.rstrip("\n")) for line in lines]
    cancelled = [m for m in matches if m and m[2]]
    codes = [int(m[1]) for m in matches if m and m[1]]
    if not cancelled or any(_stop_signal(c) is None for c in codes):
        return text
    job, when, why = cancelled[-1][2].split(".")[0], cancelled[-1][3], cancelled[-1][4].strip().lower()
    said = (f"slurm: job {job} cancelled at {when}{' ' + why if why else ''}; tasks exited "
            f"{', '.join(sorted({str(c) for c in codes})) or 'on the stop signal'}, as asked; srun's messages left out\n")
    out, first = [], True
    for line, m in zip(lines, matches):
        if m is None:
            out.append(line)
        elif first:
            out.append(said)
            first = False
    return "".join(out)


def summarised_task_logs(paths: list[Path]) -> str:
    """submitit's task files as one text: each file with a line of its own (a rank's output, a warning, an
    error, a traceback) under its header, submitit's INFO lines left out and counted; the files that held
    nothing else named together in one line."""
    from scalelab.launcher.backend import quiet_stop_tracebacks

    shown, quiet, dropped = [], [], 0
    for path in paths:
        if not path.exists():
            quiet.append(path)
            continue
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        kept = [line for line in lines if not _SUBMITIT_LINE.match(line)]
        dropped += len(lines) - len(kept)
        if any(line.strip() for line in kept):
            shown.append(f"==> {path} <==\n" + quiet_slurm_stop(quiet_stop_tracebacks("".join(kept))))
        else:
            quiet.append(path)
    if quiet or dropped:  # first, and said the same way whatever the counts, so that `logs -f` says it once
        shown.insert(0, logs_note(sorted({str(p.parent) for p in paths})))
    return "\n".join(shown)


def logs_note(folders: list[str]) -> str:
    """The note above the summarised task logs, wrapped at the terminal's width (80 off one), a folder's path kept
    whole. Why: it was one line of 214 characters on an 80-column terminal."""
    from scalelab.core.terminal import prose_lines

    command = "launch logs RUN --rank N"
    text = (f"(submitit's own lines and the task files holding nothing else are left out; every file is whole in "
            f"{', '.join(folders)}: `{command}` shows one rank's)")
    return prose_lines("", text, shutil.get_terminal_size((80, 24)).columns, whole=(command,)) + "\n"


class SlurmWatcher(SlurmInfoWatcher):
    """submitit's watcher (one sacct query for every job registered, with its back-off: 2 s apart at first,
    then up to `delay_s`) that also asks the controller, in the same update, about the jobs accounting
    lags on: those sacct does not list yet, or lists as PENDING (slurmdbd records a start late on a
    loaded host, while the ranks already write steps). One squeue for all of them at once, only when
    there are such jobs, so squeue is asked at most as often as sacct and, once accounting has caught
    up, not at all. `queued` holds its answer (job id -> state) until the next update."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s=delay_s)  # type: ignore[arg-type]  # submitit's hint says int; seconds as float work
        self.jobs: set[str] = set()
        self.queued: dict[str, str] = {}
        self.reasons: dict[str, str] = {}  # job id -> why it waits in the queue (squeue's %r), same answer
        self.problem = ""  # sacct's last error, one line ('' when it answered): `SlurmBackend.job_state`

    def register_job(self, job_id: str) -> None:
        super().register_job(job_id)
        self.jobs.add(job_id)

    def update(self) -> None:
        if not self._sacct():  # sacct was not asked (no job left to follow): neither is squeue
            return
        lagging = sorted(j for j in self.jobs if STATE_MAP.get(sacct_state(self.get_info(j, "cache"))) in (None, PENDING))
        rows = squeue_rows(lagging) if lagging else {}
        self.queued = {job: state for job, (state, _) in rows.items()}
        self.reasons = {job: reason for job, (_, reason) in rows.items() if reason}

    def _sacct(self) -> bool:
        """submitit's `update` (one sacct for every job not finished), with sacct's stderr captured: kept as one
        line in `problem` ('' once sacct answers) instead of printed. Why: with Slurm unreachable `launch status`
        printed sacct's raw "slurm_persist_conn_open_without_init ... Connection refused" lines. False when there
        was no job to ask about."""
        command = self._make_command()
        if command is None:
            return False
        self._num_calls += 1
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.problem = f"`sacct` failed: {exc}"
        else:
            lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
            self.problem = "" if proc.returncode == 0 else f"sacct failed: {lines[-1] if lines else proc.returncode}"
            if proc.returncode == 0:
                self._info_dict.update(self.read_info(proc.stdout))
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)
        return True


def sacct_state(info: dict[str, str]) -> str:
    """The state word of a sacct row ("CANCELLED by 0" -> CANCELLED); "" when sacct has no row."""
    words = info.get("State", "").split()
    return words[0] if words else ""


# ---- is this job the run's? (a job id in launch.json is checked before anything acts on it) --------

JOB_FIELDS = ("name", "user", "workdir")


def job_owner(script: str = "", job_name: str = "") -> dict[str, Any]:
    """What Slurm will show for a job of this launcher with this sbatch script, recorded at submission
    for `job_mismatch`: its name and working directory (the script's last --job-name and --chdir, which
    `--sbatch-arg` may add; else `job_name` and this process's directory, where sbatch runs) and the user."""
    def last(flag: str) -> str | None:
        found = re.findall(rf"^#SBATCH\s+--{flag}[= ](\S+)", script, flags=re.M)
        return found[-1] if found else None

    where = [os.getcwd()] + ([os.environ["PWD"]] if os.environ.get("PWD") else [])  # sbatch's getcwd(); $PWD too
    owner = {"user": this_user(), "workdir": [os.path.normpath(os.path.join(w, last("chdir") or "")) for w in where]}
    name = last("job-name") or job_name
    return {**owner, "job_name": name} if name else owner


def this_user() -> str:
    """The user Slurm shows for this process's jobs: its uid's name (not $USER, which anyone can set)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def job_fields(job_id: str) -> dict[str, str]:
    """The job's name, user and working directory as the controller (squeue) or accounting (sacct) know
    them; {} when neither does any more."""
    for cmd in (["squeue", "-h", "--states=all", "-j", job_id, "-o", "%j|%u|%Z"],
                ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobName,User,WorkDir"]):
        proc = _slurm(cmd)
        lines = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
        parts = [p.strip() for p in lines[0].split("|")] if lines else []
        if len(parts) == len(JOB_FIELDS):
            return dict(zip(JOB_FIELDS, parts))
    return {}


def job_mismatch(state: dict[str, Any], fields: dict[str, str]) -> str:
    """What differs between the job Slurm shows (`fields`) and the run's launch.json (`state`): its name,
    its user (this user for a run recorded before users were) and its working directory (one of those
    recorded); '' if none."""
    expected = {"name": state.get("job_name"), "user": state.get("user") or this_user(),
                "workdir": state.get("workdir")}
    wrong = []
    for key, want in expected.items():
        allowed = [want] if isinstance(want, str) else list(want or [])
        if allowed and fields.get(key) and fields[key] not in allowed:
            wrong.append(f"its {key} is {fields[key]!r}, the run's {' or '.join(map(repr, allowed))}")
    return "; ".join(wrong)


def jobs_of(run_dir: Path) -> list[dict[str, str]]:
    """The run's jobs, oldest first: {job_id, folder (submitit's)}; a run launched before submitit had
    only job ids, and its files in RUN_DIR/slurm."""
    info = read_state(run_dir)
    if "runs" in info:
        return info["runs"]
    return [{"job_id": job, "folder": str(Path(run_dir) / "slurm")} for job in info.get("jobs", [info["job_id"]])]


# ---- Slurm's commands ----------------------------------------------------------------------------


def _test_only(request: SlurmRequest) -> None:
    """`sbatch --test-only` on the very script submitit will send: Slurm's refusal, nothing queued."""
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", dir=request.folder) as script:
        script.write(request.script)
        script.flush()
        check = _slurm(["sbatch", "--test-only", script.name])
    if check.returncode != 0:
        raise NotQueued(_refusal("Slurm refused the job", check, request))


def squeue_state(job_id: str) -> str:
    """The job's state while the controller lists it (PENDING, RUNNING, COMPLETING...), else ""."""
    return squeue_states([job_id]).get(job_id, "")


def squeue_states(job_ids: list[str]) -> dict[str, str]:
    """{job id: state} for the jobs the controller still lists, one squeue call for all (`-r`: an array's
    tasks one by one, as ID_INDEX); a job it no longer lists is absent."""
    return {job: state for job, (state, _) in squeue_rows(job_ids).items()}


def squeue_rows(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """{job id: (state, why it waits)} as `squeue_states`; the reason is squeue's %r (BeginTime, Priority,
    Resources...), '' for a job that does not wait ("None")."""
    q = _slurm(["squeue", "-h", "-r", "--states=all", "-j", ",".join(job_ids), "-o", "%i|%T|%r"])
    out = {}
    for line in q.stdout.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) in (2, 3) and parts[0] and parts[1]:
            reason = parts[2] if len(parts) == 3 and parts[2] != "None" else ""
            out[parts[0]] = (parts[1], reason)
    return out


def wait_gone(job_id: str, grace_s: float) -> None:
    """Until Slurm no longer lists the job as active, not even COMPLETING: no process of it is left."""
    if not wait_until(lambda: STATE_MAP.get(squeue_state(job_id)) not in ACTIVE, grace_s, interval_s=2.0):
        raise ScalelabError(f"Slurm job {job_id} is still {squeue_state(job_id) or 'listed'} {grace_s:.0f} s after it "
                            f"was stopped; `squeue -j {job_id}` shows it, `scancel --signal=KILL {job_id}` ends it")


def need(command: str) -> None:
    if shutil.which(command) is None:
        raise ScalelabError(f"{command} is not on PATH: the slurm backend runs on a Slurm login node "
                            "(to try it on this machine: scripts/slurm-cluster.sh start)")


def _slurm(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    need(cmd[0])
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ScalelabError(f"`{' '.join(cmd)}` did not answer in {timeout:.0f} s: is slurmctld up? (`sinfo`)") from None


def _refusal(what: str, proc: subprocess.CompletedProcess, request: SlurmRequest) -> str:
    words = "; ".join(line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip())
    words = words or f"exit code {proc.returncode}"
    hints = [hint for key, hint in HINTS if key in words.lower()][:1]
    if hints == [UNREACHABLE_HINT]:  # sbatch reached nobody: Slurm refused nothing
        what = "could not submit the job"
    if hints and hints[0] == NODE_CONFIG_HINT:
        hints = [_too_few_nodes(request) or _no_such_gpu_type(request) or hints[0]]
    return f"{what} for {request.run_dir.name} (nothing was queued): {words}" + (f"; {hints[0]}" if hints else "")


def _too_few_nodes(request: SlurmRequest) -> str:
    """The hint for a layout of more nodes than the partition has ('' when it has enough, or sinfo cannot say).
    Why: Slurm says "Requested node configuration is not available" for --nodes 3 on 2 nodes as for 5 GPUs a
    node, and the hint named GPUs, CPUs and memory only."""
    asked = int(request.parameters.get("nodes") or 1)
    partition = str(request.parameters.get("partition") or "")
    have = partition_nodes(partition)
    if have is None or asked <= have:
        return ""
    where = f"partition {partition}" if partition else "the default partition"
    return (f"--nodes {asked} asks for more nodes than {where} has ({have}): give --nodes {have} or fewer, or "
            "another --partition (`sinfo -s` lists the partitions and their nodes)")


def _no_such_gpu_type(request: SlurmRequest) -> str:
    """The hint for a typed GPU request (`--gpu-type`, gres gpu:TYPE:N) that no node has that many of, naming the
    cluster's GPU GRES as sinfo lists them ('' for an untyped request). Why: `--gpu-type c` got the hint naming
    --nodes, --gpus-per-node, --cpus-per-task and --mem-gb, and not --gpu-type."""
    gres = str(request.parameters.get("gres") or "")
    parts = gres.split(":")
    if len(parts) != 3 or parts[0] != "gpu":
        return ""
    types = cluster_gpu_types()
    if types and parts[1] not in types:
        return (f"the cluster has no GPUs of type {parts[1]!r} (--gpu-type {parts[1]}): its nodes' GPU types are "
                f"{', '.join(types)} (`sinfo -o '%N %G'`); give one of those, or leave --gpu-type out")
    return (f"no node has {parts[2]} GPU(s) of type {parts[1]} with the CPUs / memory asked: check --gpu-type, "
            f"--gpus-per-node, --nodes, --cpus-per-task and --mem-gb against `sinfo -o '%P %D %c %m %G'`")


def cluster_gpu_types() -> list[str]:
    """The GPU types of the nodes' GRES as sinfo lists them ("gpu:a:2,gpu:b:2" -> [a, b]); [] when sinfo cannot
    say. Said as words, not GRES strings: the launcher's console would read ":a:" as an emoji code."""
    try:
        proc = _slurm(["sinfo", "-h", "-o", "%G"], timeout=10)
    except ScalelabError:
        return []
    found = re.findall(r"(?:^|,)gpu:([^:,(\s]+):", proc.stdout, flags=re.M) if proc.returncode == 0 else []
    return sorted(set(found))


def partition_nodes(partition: str) -> int | None:
    """How many nodes `partition` (the default one for '') has, as sinfo lists them; None when sinfo cannot say."""
    try:
        proc = _slurm(["sinfo", "-h", "-N", "-o", "%N|%P"] + (["-p", partition] if partition else []))
    except ScalelabError:  # no sinfo here, or no answer: the general hint stands
        return None
    if proc.returncode != 0:
        return None
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.count("|") == 1]
    nodes = {node for node, part in rows if partition or part.endswith("*")}
    return len(nodes) or None
