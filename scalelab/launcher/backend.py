"""The backend interface: every backend does the same four things.

1. render a request from the spec as a pure function (`submit_dryrun`) - an object whose `render()`
   is exactly what will be sent (command lines + environment, an sbatch script, manifests, EC2
   requests), so `--dry-run` prints it and touches nothing;
2. send it (`schedule`); `submit()` is `schedule(submit_dryrun(...))` as in TorchX, so what was
   printed is what runs;
3. report `status` and `logs`;
4. `cancel`: stop the run and free everything it holds (the caller records it as CANCELLED).

The run's lifecycle is not the backend's: one follow loop (scalelab/launcher/runner.py) drives every backend
through two optional hooks, `poll` (one tick of the backend's own work while the run is live) and
`finish` (its work once the run has ended), records the run's state in launch.json, and owns the
one interruption path (Ctrl-C, SIGTERM, SIGHUP). A backend therefore has no loop of its own; it
declares what the loop and the sweep need to know: `poll_interval_s` and `queues`.
A listing (`launch status SWEEP`, `launch ls`) tells a backend every run it will ask about first
(`watch`), so a scheduler that answers for many jobs at once (Slurm's sacct) is asked once.

Backend options follow submitit and TorchX's runopts: each backend names its options type (`Options`,
a `core.options.BackendOptions` dataclass in a module with no heavy imports), whose fields are the
valid options with their defaults, help, flags and checks, and which states how the backend's nodes
are paid for and how long a run takes to start (`costs.fleet`: `fleet()`, `assumed_startup_s`, read
here by `fleet_of` and `assumed_startup_s`); `self.options` is an instance, so a bad
key or value fails at configuration time with the valid ones listed. Backends are looked up by name
and imported lazily so that, say, the local backend never imports boto3.
"""

from __future__ import annotations

import copy
import importlib
import re
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.core.launch import starter_of
from scalelab.core.errors import EngineError, ScalelabError, SpecError, shell_word
from scalelab.core.options import BackendOptions, Flag
from scalelab.core.records import error_messages, read_records, with_errors_aside
from scalelab.core.rundir import (
    ACTIVE,
    CANCELLED,
    COMPLETED,
    FAILED,
    TERMINAL,
    RunPaths,
    read_state,
)
from scalelab.core.spec import BACKEND_NAMES, Spec, read_spec
from scalelab.core.writes import full_note
from scalelab.costs.fleet import Fleet

# Set by a second stop signal while the launcher stops its runs (scalelab/launcher/runner.py): a
# backend that waits for a checkpoint before it stops (aws: the leader saving to S3) stops waiting
# and removes everything at once, so that the user never has to kill -9 the launcher (which would
# leave instances running until their heartbeat timeout).
STOP_NOW = threading.Event()


@dataclass(frozen=True)
class Registered:
    """Where a backend lives, as "module:Class" references imported only when needed."""

    backend: str  # the Backend subclass: imported only when the backend is used
    options: str  # its options type: a module with no heavy imports, read by the CLI at start


# The one registry: each backend's implementation and its options (flags, `--backend-opt` keys, checks).
BACKENDS: dict[str, Registered] = {
    "local": Registered("scalelab.launcher.local:LocalBackend", "scalelab.launcher.options:LocalOptions"),
    "slurm": Registered("scalelab.slurm.backend:SlurmBackend", "scalelab.slurm.options:SlurmOptions"),
    "k8s": Registered("scalelab.k8s.backend:KubernetesBackend", "scalelab.k8s.options:KubernetesOptions"),
    "aws": Registered("scalelab.aws.backend:AwsBackend", "scalelab.aws.options:AwsOptions"),
}
assert tuple(BACKENDS) == BACKEND_NAMES


def import_optional(module_name: str):
    """Import a module of an optional part (a backend, a command); None when that part is absent.

    Only the module itself being missing means "absent": a missing dependency *inside* it is a real
    error and propagates.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not exc.name or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise
        return None


def _load(ref: str) -> Any:
    """"module:attribute" when that module is part of this installation, else None."""
    module_name, attr = ref.split(":")
    module = import_optional(module_name)
    return getattr(module, attr) if module is not None else None


def options_type(name: str) -> type[BackendOptions] | None:
    """The options type of backend `name`; None for an unknown name or a backend not installed."""
    return _load(BACKENDS[name].options) if name in BACKENDS else None


def installed_options_type(name: str) -> type[BackendOptions]:
    """The options type of backend `name`; SpecError when it is unknown or not installed."""
    found = options_type(name)
    if found is None:
        raise SpecError(f"unknown backend {name!r} or not part of this installation; valid backends: {', '.join(BACKENDS)}")
    return found


def fleet_of(spec: Spec) -> Fleet:
    """How `spec`'s nodes are paid for, as its backend states it (its options type: `fleet()`); the cost
    model (costs/) takes this as data, since it may not import the backends."""
    return installed_options_type(spec.backend).parse(spec.backend_options, where="in backend_options").fleet()


def assumed_startup_s(backend: str) -> float:
    """Seconds from submission to the first step that `backend` states for an estimate made before any run."""
    return float(installed_options_type(backend).assumed_startup_s)


def backend_flags() -> dict[str, list[Flag]]:
    """{backend: its command-line flags} for every installed backend that has some."""
    types = {name: options_type(name) for name in BACKENDS}
    return {name: t.flags() for name, t in types.items() if t is not None and t.flags()}


@dataclass
class Request(ABC):
    """What a backend will send, printable before anything is sent."""

    run_dir: Path

    @abstractmethod
    def render(self) -> str:
        """Exactly what will be sent, as text (shell lines, a script, YAML or JSON)."""


@dataclass
class RunStatus:
    state: str  # one of core.rundir's states: PENDING | RUNNING | COMPLETED | FAILED | CANCELLED | UNKNOWN
    detail: str = ""


class Backend(ABC):
    """One place where runs go: render, schedule, status, logs, cancel (+ the poll and finish hooks)."""

    # The sweep submits every layout before following the first when the backend has a queue (Slurm):
    # the cluster then starts each layout as soon as it can, instead of one job at a time.
    queues: bool = False
    # Seconds between polls once the follow loop has backed off (it polls more often at first), unless
    # the backend has a `poll_s` option: a cluster's controller or a cloud API is asked less often.
    default_poll_s: float = 1.0
    # The ranks import Horovod from this machine's Python (local; Slurm through a shared filesystem),
    # so a Horovod run is checked here before anything starts; other backends bring their own image.
    horovod_here: bool = False
    # Whether a run may go on with no launcher following it (`--detach`): the backend's ranks then
    # run without watching the launcher, and `launch status` records how the run ended. A backend
    # whose `finish` must run (records copied back, resources freed) is not detachable.
    detachable: bool = False
    # Whether the built-in trainer's checkpoint is RUN_DIR/checkpoint.pt as this machine sees it (local;
    # Slurm's shared filesystem), so `launch resume` can tell a run that has none; Kubernetes keeps it on its
    # volume, AWS in S3.
    checkpoint_here: bool = False

    name: str = ""
    Options: type[BackendOptions] = BackendOptions  # each backend names its own (see BACKEND_OPTIONS)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = self.resolve_options(options)
        self.detached = False  # set for `--detach`: the request starts the ranks without a supervising launcher

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """The typed options: defaults for what is not given; SpecError for an unknown key or a bad value."""
        if isinstance(options, cls.Options):
            return options
        return cls.Options.parse(options or {}, where="in backend_options")

    def validate(self, spec: Spec) -> None:
        """Every check that needs no remote call, before a run directory exists (Horovod built, layout possible)."""
        if self.horovod_here and starter_of(spec.engine.name).needs_horovod:
            check_horovod()
        self.check(spec)

    def check(self, spec: Spec) -> None:
        """The backend's own checks for `validate`."""

    def check_dry_run(self, spec: Spec) -> None:
        """The checks `--dry-run` makes before it prints the request: the backend's own (`check`: no remote call),
        so that a dry run shows the refusals and notes the real launch would (the AWS note on a type the default
        AMI cannot use; a volume or wheel AWS would refuse). Why: the dry run returned before them and printed a
        plan the launch then refused. Not `validate`'s tools of this machine (Horovod built), which a request
        printed to be read need not have."""
        self.check(spec)

    def for_spec(self, spec: Spec) -> Backend:
        """This backend with `spec`'s own options: the runs of a probe differ in instance type or GPU
        type, and each must be sent with its own. The same object when they are this one's; else a
        copy sharing its clients and watchers (`_forget` drops what belonged to one request)."""
        options = self.resolve_options(spec.backend_options)
        if options == self.options:
            return self
        other = copy.copy(self)
        other.options = options
        other._forget()
        return other

    def _forget(self) -> None:
        """Drop per-request state a copy must not share (`for_spec`)."""

    sweep = ""  # the sweep whose layouts this backend submits (`for_sweep`); "" for a run of its own

    def for_sweep(self, name: str) -> Backend:
        """This backend for the layouts of sweep `name`: a copy with `sweep` set, sharing its clients and watchers.
        Slurm sends them one at a time without --exclusive, so that none is timed while another shares its node
        (`slurm.render.one_at_a_time`); Kubernetes names their objects after it; local and AWS do not read it."""
        other = copy.copy(self)
        other.sweep = name
        return other

    def sweep_note(self) -> str:
        """One line on how the sweep's layouts will share the machines (said before they start), or ''."""
        return ""

    @property
    def poll_interval_s(self) -> float:
        return float(self.options.get("poll_s", self.default_poll_s))

    @abstractmethod
    def submit_dryrun(self, spec: Spec, run_dir: Path) -> Request:
        """Pure: build the request for `spec` writing into `run_dir`; sends nothing."""

    def submit_dryrun_batch(self, spec: Spec, run_dirs: list[Path]) -> list[Request]:
        """Pure: the requests for repeated runs of one spec (`launch sweep --repeats N`), one per run; a
        backend that sends them as one (a Slurm job array) returns one request for them all."""
        return [self.submit_dryrun(spec, run_dir) for run_dir in run_dirs]

    @abstractmethod
    def schedule(self, request: Request) -> str:
        """Send the request; return a handle (job id, process group id) saved in launch.json.

        It starts launch.json afresh (`core.rundir.start_state`), and on failure removes whatever it
        had started before raising.
        """

    def submit(self, spec: Spec, run_dir: Path) -> str:
        return self.schedule(self.submit_dryrun(spec, run_dir))

    @abstractmethod
    def status(self, run_dir: Path) -> RunStatus:
        """The run's state as the backend sees it now (any process may ask, not only the one following)."""

    def poll(self, run_dir: Path) -> RunStatus:
        """One tick of the follow loop: the backend's own work while the run is live, then its status."""
        return self.status(run_dir)

    def watch(self, run_dir: Path) -> None:
        """The run's status will be asked soon, with other runs' (`launch status SWEEP`, `launch ls`): a
        backend that asks its scheduler about many runs in one query (Slurm's sacct) adds it to that query
        now, so that the first status asked fetches every run's. Nothing to do by default."""

    def finish(self, run_dir: Path, status: RunStatus) -> RunStatus:
        """Work once the run has ended by itself (records back, resources freed); the final status."""
        return status

    @abstractmethod
    def logs(self, run_dir: Path) -> str: ...

    def busy(self, run_dir: Path) -> str | None:
        """What of the run still runs, in words (None: nothing), asked before a resume starts new ranks.

        A run recorded as ended is taken at its word unless the backend can look (local processes).
        """
        if read_state(run_dir).get("state") in TERMINAL:
            return None
        status = self.status(run_dir)
        return status.detail or status.state if status.state in ACTIVE else None

    def rank_logs(self, run_dir: Path, rank: int) -> str:
        """The log lines of one rank: its own file where the backend writes one (Slurm: its task's), else the
        lines the launcher prefixed with the rank in the combined log."""
        return rank_log(run_dir, self.logs(run_dir), rank)

    def rank_output_files(self, run_dir: Path) -> list[RankOutput] | None:
        """The files on this machine that the run's ranks' output lands in as they write it, for the launcher
        to show while it follows the run (`launcher.echo`); files that do not exist yet are left out. None: the
        output is not on this machine while the run goes (Kubernetes: the pods' logs, read through the API)."""
        return None

    @abstractmethod
    def cancel(self, run_dir: Path) -> str | None:
        """Stop the run (its ranks checkpoint) and free everything it holds; nothing may be left running.

        Returns what it checked, in one line ("stopped 3 processes; none left"), where it can tell.
        """


@dataclass(frozen=True)
class RankOutput:
    """A file holding ranks' output. `tag`: the rank every line is of, as `[rankR]:` (a torchrun rank's own
    file, a Slurm task's), or None where each line carries its rank's tag (RANK_TAG: horovodrun's
    `[R]<stdout>:`, a torchrun agent's `--tee` copies) and a line without one is the launcher's own. `err`: the
    rank's stderr. `skip`: lines written into the file that are not the rank's (submitit's INFO lines)."""

    path: Path
    tag: str | None = None
    err: bool = False
    skip: Callable[[str], object] | None = None


# How starters tag a rank's lines: horovodrun (Gloo) "[R]<stderr>:", mpirun's --tag-output "[JOB,R]<stdout>:",
# torchrun "[rankR]:", and "[defaultR]:" with a *local* rank (the same on every node).
RANK_TAG = re.compile(r"\[(?:\d+,(?P<job>\d+)\]|(?P<hvd>\d+)\](?=<std)|rank(?P<rank>\d+)\]|default(?P<local>\d+)\])")


def rank_tag(text: str, at_start: bool = False) -> tuple[int | None, int | None]:
    """(global rank, local rank) of the first rank tag in `text` (at its start only, with `at_start`);
    (None, None) when it has none."""
    m = RANK_TAG.match(text) if at_start else RANK_TAG.search(text)
    if m is None:
        return None, None
    rank = m["job"] or m["hvd"] or m["rank"]
    return (int(rank) if rank else None), (int(m["local"]) if m["local"] else None)


def rank_log(run_dir: Path, text: str, rank: int) -> str:
    """The lines of one rank: its own file when the backend writes one (logs/rank-R.log, Slurm), else
    the lines the launcher tagged with the rank in the combined log."""
    own = RunPaths(Path(run_dir)).logs / f"rank-{rank}.log"
    if own.exists():
        return read_log(own)
    from scalelab.core.terminal import untangled  # here: Rich, which the module imports, only where logs are shown

    return "".join(line for line in log_lines(untangled(text)) if rank in rank_tag(line, at_start=True))


def log_lines(text: str) -> list[str]:
    """`text`'s lines, each with its newline (the last one without, where it has none): cut at a newline only.
    Why not splitlines(): it also cuts at a carriage return (a progress bar's, kept inside its line: `visible_text`)
    and at a form feed (\x0c), which left the rest of a dropped or tagged line on its own, untagged."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def read_log(path: Path) -> str:
    """A log file's text with its carriage returns as written (not read as line breaks, as `read_text` does), so
    that `launch logs` shows a rewritten line (a progress bar) once, in its last state (`visible_text`)."""
    with open(path, errors="replace", newline="") as log:
        return log.read()


def log_text(paths: list[Path], drop: Callable[[str], object] | None = None) -> str:
    """Log files as one text, each under a `==> PATH <==` header as `tail` prints several files; a
    torchrun agent's traceback for the stop signal it was sent is one line (`quiet_stop_tracebacks`). `drop`:
    the lines left out (an agent's copies of its ranks' lines, shown from the ranks' own files)."""
    def text(p: Path) -> str:
        body = read_log(p)
        if drop is not None:
            body = "".join(line for line in log_lines(body) if not drop(line))
        return quiet_stop_tracebacks(body)

    return "\n".join(f"==> {p} <==\n" + (text(p) if p.exists() else "(no output yet)\n") for p in paths)


# torchrun's agent answers SIGTERM/SIGINT by raising SignalException, which Python prints as a ~25-line
# traceback: after a clean `launch cancel` (ranks checkpointed, nothing left) it read as a crash.
_STOP_TRACEBACK = re.compile(
    # the agent's warnings as it passes the signal on ("Received 15 death signal", "Sending process N closing
    # signal SIGTERM"), then its traceback
    r"(?:^[WI]\d{4} [\d:.]+ +\d+ torch/distributed/elastic/\S+\] (?:Received \d+ death signal, shutting down "
    r"workers|Sending process \d+ closing signal SIG\w+)\n)*"
    r"^Traceback \(most recent call last\):\n(?:[ \t].*\n)*?"
    r"torch\.distributed\.elastic\.multiprocessing\.api\.SignalException: Process (\d+) got signal: (\d+)\n?",
    re.MULTILINE)


# horovodrun (Gloo) reports ranks ended by a signal as "Process R exit with status code -15." lines and a
# RuntimeError traceback (25 lines): after a clean `launch cancel` of a Horovod run it read as a crash too.
_HOROVOD_STOP = re.compile(
    r"((?:^Process \S+ exit with status code -?\d+\.\n)*)"
    r"^Traceback \(most recent call last\):\n(?:[ \t].*\n)*?"
    r"RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the "
    r"job to be terminated\. The first process to do so was:\n(?:\s*\n)?Process name: (\S+)\n(?:\s*\n)?"
    r"Exit code: (-?\d+)\n*",
    re.MULTILINE)

#: The signals a stop that was asked for sends: cancel and a scheduler's time limit (SIGTERM), Ctrl-C
#: (SIGINT), a closed terminal (SIGHUP), Slurm's warning before the limit (SIGUSR1).
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1}


def _stop_signal(code: int) -> str | None:
    """The name of the stop signal an exit code says the process ended by (-15 or 143: SIGTERM), else None."""
    number = _signal_number(code)
    return signal.Signals(number).name if number in {int(s) for s in _STOP_SIGNALS} else None


def _signal_number(code: int | None) -> int | None:
    """The signal an exit code says the process was killed by (Popen's -N, or a shell's 128 + N), else None."""
    return -code if code is not None and code < 0 else code - 128 if code is not None and code > 128 else None


def quiet_stop_tracebacks(text: str) -> str:
    """`text` with each torchrun SignalException traceback, and each horovodrun report of ranks ended by a stop
    signal, replaced by one line saying which signal stopped them: a stop that was asked for (cancel, Ctrl-C,
    a scheduler's time limit) is not a crash. A rank that failed (any other exit code) keeps its traceback."""
    def line(m: re.Match) -> str:
        try:
            name = signal.Signals(int(m[2])).name
        except ValueError:
            name = f"signal {m[2]}"
        return f"torchrun agent (pid {m[1]}) stopped by {name}, as asked; its traceback is left out\n"

    def horovod(m: re.Match) -> str:
        codes = [int(c) for c in re.findall(r"status code (-?\d+)", m[1])] + [int(m[3])]
        names = {_stop_signal(c) for c in codes}
        if None in names:  # some rank failed on its own: its report stays whole
            return m[0]
        ranks = len(codes) - 1 or 1
        return (f"horovodrun: {ranks} rank{'s' if ranks != 1 else ''} stopped by {', '.join(sorted(names))}, "
                f"as asked; its traceback is left out\n")

    return _HOROVOD_STOP.sub(horovod, _STOP_TRACEBACK.sub(line, text))


@dataclass
class RankEnd:
    """What one rank recorded in one launch: its last step, its end (None: it recorded none), its errors
    and its `interrupted` events."""

    rank: int
    world: int
    last_step: int | None
    end: dict[str, Any] | None
    errors: list[str]
    stops: list[dict[str, Any]]
    peer_lost: bool = False  # every error it recorded is a collective failing because a peer was gone


def rank_ends(run_dir: Path, since: float | None) -> list[RankEnd]:
    """Each rank's records since `since` (the launch's start), read tolerantly; ranks that wrote none
    are absent (compare with `world`)."""
    out = []
    for path in sorted(RunPaths(Path(run_dir)).records.glob("rank-*.jsonl")):
        recs = [r for r in with_errors_aside(path) if since is None or float(r.get("time", 0)) >= since]
        if recs:
            steps = [r["step"] for r in recs if r["kind"] == "step"]
            errors = [r for r in recs if r["kind"] == "error"]
            out.append(RankEnd(int(recs[0].get("rank", 0)), int(recs[0].get("world", 1)), steps[-1] if steps else None,
                               next((r for r in reversed(recs) if r.get("event") == "end"), None),
                               [str(r.get("message", "")) for r in errors],
                               [r for r in recs if r.get("event") == "interrupted"],
                               bool(errors) and all(r.get("peer_lost") for r in errors)))
    return out


def ended_by_records(run_dir: Path, since: float | None) -> RunStatus | None:
    """How a run ended according to its ranks' records since `since` (its launch), once no process of it
    is left to ask: for a run that no launcher followed to its end (detached, or its launcher killed).

    None when the records say nothing (no rank started).
    """
    ranks = rank_ends(run_dir, since)
    if not ranks:
        return None
    # as the runner's `failure`: a rank's own error, then a rank that went silent or left early, then the
    # errors of ranks that lost that peer (which blamed Gloo's "Connection reset by peer", not the rank gone)
    own = [{"rank": r.rank, "world": r.world, "message": e} for r in ranks if not r.peer_lost for e in r.errors]
    if not own and any(s.get("gave_up") for r in ranks for s in r.stops):  # its launcher gone, a rank stuck: the
        return RunStatus(CANCELLED, gave_up_line(run_dir, ranks))  # cause, not the kills that followed
    silent = None if own else silent_ranks(run_dir, ranks)
    errors = own or [{"rank": r.rank, "world": r.world, "message": e} for r in ranks for e in r.errors]
    if silent or errors:
        return RunStatus(FAILED, silent or "; ".join(error_messages(errors)))
    step = ranks[0].end.get("step")
    if any(r.end.get("reason") == "interrupted" for r in ranks):
        return RunStatus(CANCELLED, stop_line(run_dir, ranks))
    return RunStatus(COMPLETED, f"every rank recorded its end at step {step}")


def stopped_on_a_signal(run_dir: Path, since: float | None) -> RunStatus | None:
    """CANCELLED when every rank of the launch since `since` recorded that it stopped cleanly on a stop
    signal (its `end` says interrupted, no `error`), whatever exit code its agent reported; else None.

    Why: a signal to one rank (a node agent, an OOM killer, a pre-emption hook) stops every rank at the
    step they agree on, with a checkpoint, exactly as a cancel does; but torchrun and horovodrun report
    their ranks' exit 143 as a crash. The records are what the ranks did; the exit code is the agent's
    reading of it (issue #37). A user's script agrees on its own (an all-reduce of `track.should_stop()`):
    its ranks that got no signal record the interruption too (scalelab/train/script.py), and where one could
    not see its peer's stop note it still ended cleanly at the step the signalled rank stopped at
    (`left_with_a_stopped_peer`), which is that same stop."""
    ranks = rank_ends(run_dir, since)
    world = max((r.world for r in ranks), default=0)
    if not ranks or len({r.rank for r in ranks}) < world or any(r.errors for r in ranks):
        return None
    if any(r.end is None for r in ranks):
        return None
    if any(r.end.get("reason") != "interrupted" for r in ranks) and not left_with_a_stopped_peer(ranks):
        return None
    return RunStatus(CANCELLED, stop_line(run_dir, ranks))


def left_with_a_stopped_peer(ranks: list[RankEnd]) -> bool:
    """Whether a rank stopped on a stop signal (or its launcher gone) and every other one ended cleanly (exit 0)
    at that very step: they left through the script's stop agreement, not at their own end."""

    def signalled(r: RankEnd) -> bool:
        return r.end.get("reason") == "interrupted" and any(s.get("signal") or s.get("cause") for s in r.stops)

    def clean(r: RankEnd) -> bool:
        return r.end.get("reason") in ("completed", "threshold") and r.end.get("exit_code", 0) == 0

    return (any(signalled(r) for r in ranks) and len({r.end.get("step") for r in ranks}) == 1
            and all(signalled(r) or clean(r) for r in ranks))


def stop_line(run_dir: Path, ranks: list[RankEnd]) -> str:
    """One line on a run whose ranks stopped on a signal: who got which signal (or why they stopped), the
    step they stopped at, and what continues it: a checkpoint only where one was saved (a script saves its
    own, or none)."""
    step = max((r.end or {}).get("step") or 0 for r in ranks)
    stops = [(r.rank, s) for r in ranks for s in r.stops]
    if any(s.get("gave_up") for _, s in stops):
        return gave_up_line(run_dir, ranks)
    cause = next((s["cause"] for _, s in stops if s.get("cause")), None)
    got: dict[str, list[int]] = {}
    for rank, s in stops:
        if s.get("signal"):
            got.setdefault(_signal_name(int(s["signal"])), []).append(rank)
    if cause:
        why = cause
    elif got:
        why = "; ".join((f"rank {ranks_[0]}" if len(ranks_) == 1 else
                         "every rank" if len(ranks_) == len(ranks) else f"ranks {', '.join(map(str, ranks_))}")
                        + f" got {name}" for name, ranks_ in got.items())
    else:
        why = "a stop signal"
    if has_checkpoint(run_dir):
        return (f"{why}, and every rank stopped at step {step} with a checkpoint; `launch resume {shell_word(run_dir)}` "
                "continues it from there")
    return f"{why}, and every rank stopped at step {step}; " + no_checkpoint_advice(run_dir)


def gave_up_line(run_dir: Path, ranks: list[RankEnd]) -> str:
    """One line on a run whose launcher went away while a rank could not stop (hung, or stuck in a collective with
    a hung peer): the cause the ranks recorded ("its launcher (pid N) is gone"), which ranks gave up after how
    long and at which step (`records.gave_up_records`), the ranks that then ended with no record (their agent
    killed them once a peer had exited; the exit status where known, a SIGTERM's said as its agent's stop:
    `_how_it_ended`), and that no new checkpoint was saved. Why: `launch status` said "rank 0 was killed by
    SIGTERM ... rank 1 was killed by SIGKILL ...: out of memory?" of such a run - nobody had sent SIGTERM (that
    was the exit status 143 read back) and nothing ran out of memory."""
    gave = [(r, s) for r in ranks for s in r.stops if s.get("gave_up")]
    cause = next((s["cause"] for _, s in gave if s.get("cause")), "its launcher is gone")
    said = [f"rank {r.rank} did not stop within {float(s.get('grace_s') or 0):.0f} s and exited after step "
            f"{s.get('step')}" for r, s in gave]
    exits = rank_exits(run_dir)
    for r in ranks:
        if r.end is None and not r.errors:
            how = _how_it_ended(exits.get(r.rank))
            said.append(f"rank {r.rank} ended with no record after step {r.last_step or 0}{how}")
    line = f"{cause}; {', '.join(said)}; no new checkpoint was saved"
    if has_checkpoint(run_dir):
        return line + f": `launch resume {shell_word(run_dir)}` continues it from its last checkpoint"
    return line + "; " + no_checkpoint_advice(run_dir)


def _how_it_ended(code: int | None) -> str:
    """What a rank's exit status says of a rank that ended with no record after a peer gave up (`gave_up_line`).
    A SIGTERM status there is its agent's report of its own stop (the rank's handler keeps a SIGTERM itself from
    killing it; horovodrun's executor reads 143, torchrun -15), which agents send to the ranks left once one has
    exited ("Terminating remaining workers"): said as that, not as "killed by SIGTERM", which read as a signal
    someone had sent and as the cause (horovodrun reports it of a stopped rank now and then)."""
    number = _signal_number(code)
    if number == signal.SIGTERM:
        return f" (exit status {code}: stopped by its agent, as agents stop the ranks left once one has exited)"
    if number is not None:
        return f" (killed by {_signal_name(number)})"
    return f" (exit status {code})" if code is not None else ""


def no_checkpoint_advice(run_dir: Path) -> str:
    """'no checkpoint was saved (...): ' and what starts the run again: a script's own `launch resume` (it keeps
    its own checkpoints, and its resume starts it over), a built-in trainer's new run of its spec (its resume
    refuses to train recorded steps a second time: `runner.refuse_restart`)."""
    script = _own_code(run_dir)
    said = f"no checkpoint was saved ({checkpoint_absent(run_dir, script)}): "
    if script is not False:  # a script's, or no readable spec: the resume decides
        return said + f"`launch resume {shell_word(run_dir)}` starts it again with nothing to continue from"
    return said + f"start it again as a new run of its spec: `launch run --spec {shell_word(RunPaths(Path(run_dir)).spec)}`"


def _own_code(run_dir: Path) -> bool | None:
    """Whether the run ran a --script / --module, by its spec; None when its spec cannot be read."""
    try:
        return read_spec(run_dir).own_code
    except (ScalelabError, OSError, ValueError):
        return None


def checkpoint_absent(run_dir: Path, script: bool | None = None) -> str:
    """Where the run's checkpoint would be, said as absent: a script's folder (`RUN/checkpoint/ is empty`), the
    built-in trainer's file (`no RUN/checkpoint.pt`). Which: `script` (the run's spec's word, read here when not
    given), else whether the folder every script run gets is there. Why: a trainer run was told its
    `checkpoint/` folder was empty; it has none."""
    paths = RunPaths(Path(run_dir))
    script = _own_code(run_dir) if script is None else script
    if script is None:
        script = paths.checkpoint_dir.is_dir()
    return f"{paths.checkpoint_dir}/ is empty" if script else f"no {paths.checkpoint}"


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run saved something to continue from: the trainer's checkpoint file, or a file in the
    folder a script saves its own to (`track.checkpoint_dir`, made empty for every script run). Why: a
    line that promised "continues it from there" over an empty folder sent users to a resume from nothing."""
    paths = RunPaths(Path(run_dir))
    folder = paths.checkpoint_dir
    return paths.checkpoint.is_file() or (folder.is_dir() and any(folder.iterdir()))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def silent_ranks(run_dir: Path, ranks: list[RankEnd]) -> str | None:
    """One line on the ranks that ended without an error or an end record (killed, exited past the script's
    runner, or gone before they started), or that left early while the others went on and then lost that
    peer; None when every rank recorded its end and none left early.

    The ranks their agent stopped (SIGTERM) come last, as in `ranks_exits_detail`: rank 1 killed by SIGKILL was said
    after rank 0, whom torchrun stopped with SIGTERM because of it.

    Why the early leaver counts as silent: a rank that returns (or `sys.exit(0)`s) at step 3 of 10 records
    a clean end, and the rank still in its next all_reduce records Gloo's "Connection reset by peer": that
    error is the echo, the rank that left is the cause."""
    world = max((r.world for r in ranks), default=0)
    started = {r.rank: r for r in ranks}
    exits = rank_exits(run_dir)
    stepped = any(r.last_step for r in ranks)
    quiet = [n for n in range(world) if n not in started or (started[n].end is None and not started[n].errors)]
    quiet.sort(key=lambda n: (exits.get(n) in (128 + signal.SIGTERM, -signal.SIGTERM), n))  # a stopped peer's last
    full = full_note(run_dir) if quiet else ""  # where its records go is full: why it wrote no end (nor error)
    said = [_silent(n, started.get(n), exits.get(n), stepped, full) for n in quiet]
    left = early_leavers(ranks, planned_steps(run_dir))
    if not said and not left:
        return None
    one = f" --rank {quiet[0]}" if len(quiet) == 1 and not left else ""  # its own lines, where it is the one
    where = f"; its log: `launch logs {shell_word(run_dir)}{one}`" + (
        f"; `launch resume {shell_word(run_dir)}` continues from the last checkpoint" if has_checkpoint(run_dir) else "")
    return "; ".join(part for part in (", ".join(said), left) if part) + where


def planned_steps(run_dir: Path) -> int | None:
    """The steps the run's spec asks for (a script's: the progress bar's total); None where its length is not
    a step count (--epochs decides whichever ends first) or its spec cannot be read."""
    try:
        spec = read_spec(run_dir)
    except (ScalelabError, OSError, ValueError):
        return None
    return spec.steps if spec.epochs is None else None


def _silent(rank: int, seen: RankEnd | None, code: int | None, stepped: bool = True, full: str = "") -> str:
    """How one rank that recorded no end ended, as far as its exit status tells: a signal only where the
    status says one (negative, or 128 + N; SIGKILL: out of memory?, as the kernel's OOM killer sends it), an exit
    status where one is known, else a guess said as one. Where no rank of the run recorded a step (`stepped`
    False: a script that records none) no step is named: "before its first step" said nothing of such a run.
    `full` (`writes.full_note` of the run directory): its filesystem is full, said instead of the guess (and
    after an exit status): a rank that cannot append to its records stops without an end or an error record,
    and `launch status` called that "killed by a signal, or out of memory?"."""
    at = f" after step {seen.last_step}" if seen is not None and seen.last_step else \
        " before its first step" if stepped else ""
    number = _signal_number(code)
    if number is not None:
        oom = ": out of memory?" if number == signal.SIGKILL else ""
        return (f"rank {rank} was killed by {_signal_name(number)} (signal {number}){at}, with no error and no end "
                f"record{oom}")
    if full:
        how = f" exited with status {code}{at} without an end record" if code is not None else \
            f"{at} stopped with no error and no end record"
        return f"rank {rank}{how}: {full}, where it writes them; free space there"
    if code is not None:
        return f"rank {rank} exited with status {code}{at} without an end record"
    return f"rank {rank}{at} stopped with no error and no end record (killed by a signal, or out of memory?)"


def early_leavers(ranks: list[RankEnd], planned: int | None = None) -> str:
    """'rank 1 left at step 3 with exit status 0 while the other ranks went on; rank 0 then lost its peer' for
    ranks that ended cleanly (an end record, no error) before their last step while others failed because a
    peer was gone; '' when none did. Before its last step: below the last step a rank that lost its peer
    reached, or below the run's `planned` steps. Why: a rank that finished its last step and ended normally
    was named as having left whenever a peer then failed (in a last collective of its own).

    Without `planned` (a script run without --steps) a rank that ended at the step its peer last recorded is
    still named: the peer failed inside its next step (`sys.exit(0)` at step 3 of 10: both recorded step 3), and
    nothing recorded tells that from a last step."""
    lost = [r.rank for r in ranks if r.peer_lost]
    reached = max((r.last_step or 0 for r in ranks if r.peer_lost), default=0)
    last = max(reached, planned) if planned else reached + 1  # a rank that ended below `last` left early
    left = [r for r in ranks if r.end is not None and not r.errors and r.end.get("reason") not in ("failed", "interrupted")
            and (r.end.get("step") or 0) < last] if lost else []
    if not left:
        return ""
    gone = ", ".join(f"rank {r.rank} left at step {r.end.get('step')} with exit status {r.end.get('exit_code', 0)}"
                     for r in left)
    who = f"rank {lost[0]} then lost its peer" if len(lost) == 1 else \
        f"ranks {', '.join(map(str, lost))} then lost their peer"
    return f"{gone} while the other ranks went on; {who}"


def rank_exits(run_dir: Path) -> dict[int, int]:
    """{rank: exit status} as the backend recorded them in launch.json (`rank_exits`, the local backend: its
    one process's status, or what torchrun or horovodrun reported of each rank); {} where none is known."""
    try:
        said = read_state(Path(run_dir)).get("rank_exits") or {}
    except ScalelabError:  # no launch.json (records alone, a test), or an unreadable one: none known
        return {}
    return {int(rank): int(code) for rank, code in said.items()
            if str(rank).isdigit() and isinstance(code, int) and not isinstance(code, bool)}


def ranks_exits_detail(run_dir: Path, codes: list[int]) -> str:
    """A failed run's detail (`launch status`): its ranks' exit statuses as recorded (`rank_exits`), the failing
    rank's first ("rank 1 exited with status 3; rank 0 exited with status 143"); the processes' own `codes` only
    where no rank's is known. Why: status said "exit codes [1]", torchrun's agents' status, of a run whose rank 1
    exited 3, which the launcher's own line said. A rank stopped by SIGTERM comes last whether its status reads
    143 (horovodrun, Slurm) or -15 (torchrun): a peer stopped because another failed is not the cause."""
    failed = {rank: code for rank, code in rank_exits(run_dir).items() if code != 0}
    if not failed:
        return f"exit codes {codes}"
    order = sorted(failed, key=lambda rank: (_signal_number(failed[rank]) == signal.SIGTERM, rank))  # stopped peers last
    return "; ".join(f"rank {rank} exited with status {failed[rank]}" for rank in order)


# What the agents report of ranks that failed: torchrun's ChildFailedError summary ("rank : 1 (local_rank:
# 1)" then "exitcode : 5 (pid: N)") and horovodrun's "Process 1 exit with status code 5." lines.
_TORCHRUN_EXIT = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: \d+\)\n\s*exitcode\s*: (-?\d+)", re.MULTILINE)
# Not only at a line's start: after a rank's last line without its newline, horovodrun writes its word on the same line.
_HOROVOD_EXIT = re.compile(r"Process (\d+) exit with status code (-?\d+)\.$", re.MULTILINE)


def reported_exits(text: str) -> dict[int, int]:
    """{global rank: exit status} of the ranks that torchrun's or horovodrun's output says failed; the
    agents' own exit status (torchrun's 1) says nothing of which rank exited how."""
    return {int(rank): int(code) for pattern in (_TORCHRUN_EXIT, _HOROVOD_EXIT) for rank, code in pattern.findall(text)}


def check_horovod() -> None:
    """Horovod with PyTorch and Gloo usable here, else one EngineError that says how to build it.

    Asked of Horovod's PyTorch extension itself (the library `import horovod.torch` loads, and its build
    flags), so the launcher does not import PyTorch and Horovod for it (2 s of every Horovod `launch`);
    each rank imports them anyway and reports the same message should that fail there
    (`scalelab.train.engines.import_horovod`).
    """
    problem = horovod_build_problem()
    if problem:
        raise EngineError(problem)


def horovod_build_problem() -> str | None:
    """Why Horovod cannot run PyTorch ranks here, or None: its PyTorch extension is found, loads (its
    symbols resolve against the PyTorch installed here) and was built with Gloo or MPI."""
    import ctypes

    from scalelab.core.horovodrun import extension_library

    how = "run scripts/build-horovod.sh (builds horovod 0.28.1 with PyTorch + Gloo), or use --engine ddp"
    library = extension_library()
    if library is None or not library.exists():
        why = "No module named 'horovod'" if library is None else f"no {library.name} in {library.parent}"
        return f"Horovod with PyTorch support is not installed ({why}); {how}"
    try:
        lib = ctypes.CDLL(str(library))
    except OSError as exc:
        return f"Horovod with PyTorch support is not installed ({exc}); {how}"
    if not lib.horovod_gloo_built() and not lib.horovod_mpi_built():
        return "Horovod was built without Gloo or MPI; rebuild it with scripts/build-horovod.sh"
    return None


def get_backend(name: str, options: dict[str, Any] | None = None) -> Backend:
    if name not in BACKENDS:
        raise SpecError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}")
    module_name, cls_name = BACKENDS[name].backend.split(":")
    module = import_optional(module_name)
    if module is None:
        raise SpecError(f"the {name} backend is not part of this installation; use --backend local")
    return getattr(module, cls_name)(options)
