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

from scalelab.core.errors import SpecError
from scalelab.core.options import MAX_LIMIT_MINUTES, BackendOptions, at_least, each, one_line, one_word, option
from scalelab.costs.fleet import OnPremiseFleet


def _minutes_as_text(value: Any) -> Any:
    """`time: 30` in YAML is 30 minutes, as Slurm reads `--time=30`."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


# Slurm's time formats (sbatch --time): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit.
# `--time abc` was accepted and reached sbatch (issue #37); a real run's `sbatch --test-only` said it late.
_SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE|unlimited|infinite")


def _job_name(value: str) -> str | None:
    """Letters, digits, '.', '_' and '-': the name is written into `#SBATCH --job-name=` unquoted and shown by squeue.
    Why: `--job-name "my job"` was turned into `my-job` without a word, and squeue then showed a name nobody gave."""
    bad = sorted(set(re.sub(r"[A-Za-z0-9._-]", "", value)))
    if not bad:
        return None
    shown = ", ".join("a space" if c == " " else repr(c) for c in bad)
    return (f"may hold only letters, digits, '.', '_' and '-', not {shown}: e.g. "
            f"{re.sub(r'[^A-Za-z0-9._-]+', '-', value).strip('-') or 'my-job'}")


def _slurm_time(value: str) -> str | None:
    """A time in Slurm's format of at most a year. Why the cap: `--time 99999999` (190 years) and `--time 9999-00`
    were taken; Slurm leaves a job whose limit is past its partition's MaxTime PENDING, possibly forever (`man
    sbatch`), and a limit is what stops a run that hangs: past a year it is a typo (AWS's --time-limit-min has
    the same cap). The partition's own limit is the cluster's to say (`sbatch --test-only`)."""
    if value == "":
        return None
    if not _SLURM_TIME.fullmatch(value):
        return ("must be a time in Slurm's format: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 90, 1:30:00, "
                "2-00)")
    minutes = slurm_minutes(value)
    if minutes is not None and minutes > MAX_LIMIT_MINUTES:
        return (f"must be at most a year, 365-00:00:00 ({MAX_LIMIT_MINUTES:,} minutes), not {_minutes_text(minutes)}: "
                "give the time the run may need, or '' for the partition's limit")
    return None


def slurm_minutes(value: str) -> float | None:
    """The minutes of a time in Slurm's format (`90`, `30:30`, `1:30:00`, `2-12`, `2-12:30:15`), seconds rounded up
    to a minute as Slurm does; None for no limit (UNLIMITED, INFINITE, or 0). A number too long to be a time is
    infinite minutes (int() refuses more than 4,300 digits)."""
    if value.lower() in ("unlimited", "infinite"):
        return None
    days, _, clock = value.rpartition("-")
    parts = clock.split(":")
    if any(len(p) > 15 for p in (days, *parts)):
        return float("inf")
    numbers = [int(p) for p in parts]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, secs = (numbers + [0, 0])[:3]
        hours += int(days) * 24
    elif len(numbers) == 3:  # HH:MM:SS
        hours, minutes, secs = numbers
    else:  # MM, MM:SS
        hours, minutes, secs = 0, numbers[0], (numbers + [0])[1]
    return -(-((hours * 60 + minutes) * 60 + secs) // 60) or None  # 0: no limit (`man sbatch`)


def _minutes_text(minutes: float) -> str:
    return "more minutes than can be counted" if minutes == float("inf") else f"{minutes:,.0f} minutes"


def _sbatch_option(arg: str) -> str | None:
    return None if arg.startswith("-") else "takes sbatch options such as --mail-type=END"


# sbatch's one-letter options by their long names (`man sbatch`): a --sbatch-arg line is written in the long form.
SBATCH_SHORT = {"A": "account", "a": "array", "B": "extra-node-info", "b": "begin", "C": "constraint",
                "c": "cpus-per-task", "D": "chdir", "d": "dependency", "e": "error", "F": "nodefile", "G": "gpus",
                "H": "hold", "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses", "M": "clusters",
                "m": "distribution", "N": "nodes", "n": "ntasks", "O": "overcommit", "o": "output", "p": "partition",
                "Q": "quiet", "q": "qos", "S": "core-spec", "s": "oversubscribe", "t": "time", "W": "wait",
                "w": "nodelist", "x": "exclude"}
_LAYOUT = "the layout (one task per GPU)"
_LOGS = "the batch step's log, which `launch logs` reads", "leave it to scalelab (RUN_DIR/slurm/)"
# The sbatch options scalelab (or submitit for it) sets: long name -> (what an --sbatch-arg would replace, what
# to give instead; {v} is the value given). An --sbatch-arg line comes last in the script and would win.
SBATCH_MANAGED: dict[str, tuple[str, str]] = {
    "nodes": ("the layout", "use --nodes {v}"), "ntasks": (_LAYOUT, "use --nodes and --gpus-per-node"),
    "ntasks-per-node": (_LAYOUT, "use --gpus-per-node"), "gpus-per-node": ("the layout", "use --gpus-per-node {v}"),
    "gpus": ("the layout", "use --nodes and --gpus-per-node"), "gpus-per-task": (_LAYOUT, "use --gpus-per-node"),
    "ntasks-per-gpu": (_LAYOUT, "use --gpus-per-node"),
    "gres=gpu": ("the GPUs scalelab asks for", "use --gpus-per-node N and --gpu-type TYPE"),
    "cpus-per-task": ("a scalelab option", "use --cpus-per-task {v}"),
    "cpus-per-gpu": ("a scalelab option", "use --cpus-per-task (CPUs per rank: one rank per GPU)"),
    "mem": ("a scalelab option", "use --mem-gb (GB per node)"),
    **{key: ("a scalelab option", f"use --{key} {{v}}")
       for key in ("time", "partition", "account", "qos", "constraint", "job-name")},
    "exclusive": ("a scalelab option", "use --exclusive"),
    "requeue": ("a scalelab option", "use --requeue"), "no-requeue": ("a scalelab option", "use --no-requeue"),
    "signal": ("the time-limit warning scalelab sends (USR1: every rank checkpoints on it)",
               "use --backend-opt signal_s=SECONDS"),
    "output": _LOGS, "error": _LOGS, "open-mode": _LOGS,
    "array": ("the job array scalelab makes of a layout's repeats", "use launch sweep --repeats N"),
}


def sbatch_option(arg: str) -> tuple[str, str | None]:
    """(long name, value or None) of one sbatch option as written: `--nodes=5`, `--nodes 5`, `-N5`, `-N 5`.
    Why: `-N5` was written `#SBATCH --N5`, and a layout given again in --sbatch-arg was not seen."""
    text = arg.strip()
    if text.startswith("--"):
        name, sep, value = text[2:].partition("=")
        if not sep and len(name.split(None, 1)) == 2:
            name, value = name.split(None, 1)
            sep = " "
        return name.strip(), value.strip() if sep else None
    letter, value = text[1:2], text[2:].strip().removeprefix("=").strip()
    if letter not in SBATCH_SHORT:
        raise ValueError(f"--sbatch-arg {arg}: scalelab knows no sbatch option -{letter}; give it in its long "
                         "form, e.g. --sbatch-arg=--mail-type=END")
    return SBATCH_SHORT[letter], value or None


def _sbatch_args(value: Any) -> Any:
    """--sbatch-arg lines, refused where they would replace what scalelab sets (each names the flag to use
    instead) or repeat an option: a line after submitit's wins, so `--nodes=5` ran 5 nodes of a 1-node layout
    and `--output` moved the log `launch logs` reads, silently. Lines that are no option are left to the check."""
    seen: dict[str, str] = {}
    for arg in value if isinstance(value, (list, tuple)) else [value]:
        if not isinstance(arg, str) or not arg.strip().startswith("-"):
            continue
        name, given = sbatch_option(arg)
        key = "gres=gpu" if name == "gres" and "gpu" in (given or "") else name
        if key in SBATCH_MANAGED:
            what, use = SBATCH_MANAGED[key]
            raise ValueError(f"--sbatch-arg {arg} conflicts with {what}: {use.format(v=given or '').rstrip()}")
        if name in seen:
            raise ValueError(f"--sbatch-arg {arg} repeats --sbatch-arg {seen[name]}: give --{name} once "
                             "(sbatch keeps the last)")
        seen[name] = arg
    return value


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
    job_name: str = option("", "Slurm job name [default: scalelab-RUN].", _job_name, flag="--job-name")
    extra_sbatch: list[str] = option([], "Extra #SBATCH line, e.g. --sbatch-arg=--mail-type=END (repeatable).",
                                     each(one_line), each(_sbatch_option), flag="--sbatch-arg", metavar="ARG",
                                     parse=_sbatch_args)
    setup: list[str] = option([], "Shell lines run before srun, e.g. 'module load cuda'.", each(one_line))
    python: str = option("", "The interpreter on the nodes [default: this one: a shared filesystem].", one_word)
    gloo_iface: str = option("", "Network interface for Gloo [default: the address of the node's hostname].",
                             one_word)
    poll_s: float = option(10.0, "Longest wait between two sacct queries while following (submitit's watcher: one "
                           "query for every job of a sweep, 2 s at first, backing off to this).", at_least(0))

    def __post_init__(self) -> None:
        super().__post_init__()
        problem = _clash(self)
        if problem:
            raise SpecError(problem)


def _clash(options: SlurmOptions) -> str | None:
    """An --sbatch-arg that clashes with another option's value (not with a fixed setting: `_sbatch_args`):
    a GRES of another kind would replace --gpu-type's --gres, --mem-per-cpu/-gpu cannot join --mem-gb's --mem."""
    for arg in options.extra_sbatch:
        name, given = sbatch_option(arg) if arg.strip().startswith("-") else ("", None)
        if name == "gres" and options.gpu_type and options.gres_gpus:
            return (f"--sbatch-arg {arg} would replace the --gres=gpu:{options.gpu_type}:N that --gpu-type "
                    f"{options.gpu_type} asks for: leave out --gpu-type (--gpus-per-node then asks for the GPUs, "
                    "--constraint can name their type) or this --sbatch-arg")
        if name in ("mem-per-cpu", "mem-per-gpu") and options.mem_gb:
            return (f"--sbatch-arg {arg} and --mem-gb {options.mem_gb:g} both set the memory (sbatch takes one of "
                    "--mem, --mem-per-cpu, --mem-per-gpu): give one of them")
    return None


def warning_too_late(options: SlurmOptions) -> str | None:
    """Why the time-limit warning (USR1 `signal_s` before `--time`) leaves the run no time to train, or None.
    Asked of a submission (`SlurmBackend.submit_dryrun_batch`), not of options read back: a run submitted before
    this check must still be listed, followed and cancelled.
    At most half the limit: the ranks then train at least as long as the warning gives them to checkpoint, and
    each requeue moves the run on. Why: with `--time 1` (or 2) and the default 120 s, Slurm sent USR1 as the job
    started, and the ranks checkpointed and requeued at once, 3 times, then FAILED, having trained nothing."""
    minutes = slurm_minutes(options.time) if options.time else None
    if minutes is None or minutes == float("inf") or options.signal_s * 2 <= minutes * 60:
        return None
    longest = int(minutes * 60) // 2
    return (f"--time {options.time} ({minutes * 60:.0f} s) is too short for the time-limit warning, sent signal_s="
            f"{options.signal_s} s before the limit: the ranks would checkpoint and requeue "
            f"{'as soon as they start' if options.signal_s >= minutes * 60 else 'before training much'}; give a "
            f"longer --time (at least {-(-options.signal_s * 2 // 60)} minutes) or an earlier warning, at most half "
            f"the limit: --backend-opt signal_s={longest}")
