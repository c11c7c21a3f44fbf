"""The `local` backend: ranks as processes on this machine, started as the engine's launch plan says.

The embedded default: it needs nothing but this machine. Without GPUs each "GPU" of the layout is a
worker process; with GPUs each rank gets its own device (local rank). A layout of several nodes is
emulated on one host: the plan (scalelab/core/launch.py) gets 127.0.0.1 as node 0 and `localhost` as
the only host, so torchrun starts one agent per node and horovodrun nodes x GPUs ranks here.

Order inside the module (the same in every backend): options, request, render (pure), schedule,
poll/status/logs/cancel. The follow loop is scalelab/launcher/runner.py's; `poll` reaps the processes.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from scalelab.core.devices import check_gpus
from scalelab.core.errors import EngineError, ScalelabError, SpecError
from scalelab.core.engines import PLAIN, TORCHRUN
from scalelab.core.launch import TORCHRUN_LOG_DIR, Site, launch_plan, payload_comment, starter_of
from scalelab.core.net import free_port
from scalelab.core.procs import (
    LAUNCHER_ENV,
    ProcessRef,
    family,
    names_run,
    rank_processes,
    stop_processes,
    tool_path,
    watch_value,
)
from scalelab.core.records import RecordTail
from scalelab.core.rundir import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LOGS_DIR,
    RUNNING,
    TERMINAL,
    UNKNOWN,
    RunPaths,
    read_state,
    start_state,
    update_state,
)
from scalelab.core.spec import Spec, read_spec
from scalelab.core.writes import LinkError, check_inside, open_inside
from scalelab.launcher.backend import (
    Backend,
    RankOutput,
    Request,
    RunStatus,
    ended_by_records,
    log_lines,
    log_text,
    rank_tag,
    ranks_exits_detail,
    read_log,
    reported_exits,
)
from scalelab.launcher.options import LocalOptions
from scalelab.launcher.owncode import workdir


@dataclass
class LocalRequest(Request):
    """The processes to start: one command per emulated node (one in all for single and horovod)."""

    commands: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_files: list[str] = field(default_factory=list)
    comment: str | None = None  # what the ranks run of the user's --script (core.launch.payload_comment)
    cwd: str | None = None  # where a --script's ranks start (owncode.workdir); None: the launcher's own directory

    def render(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        lines = [f"# run directory: {self.run_dir}"]
        if str(self.run_dir).endswith("-DRYRUN"):  # say so: the folder it names is never made
            lines[0] += " (a placeholder: --dry-run creates nothing; a real run gets NAME-DATE-TIME)"
        if self.comment:
            lines.append(self.comment)
        if self.cwd:
            lines.append(f"cd {shlex.quote(self.cwd)}")
        for cmd, log in zip(self.commands, self.log_files):
            lines.append(f"{env} {shlex.join(cmd)} > {shlex.quote(log)} 2>&1 &")
        lines.append("wait")
        return "\n".join(lines)


def own_logs(run_dir: Path, recorded: list[Any]) -> list[Path]:
    """The run's own log files that launch.json names: `logs/launcher.log` or `logs/node-N.log` of this run
    directory, never a link. Why not the recorded paths as they are: launch.json can be edited or planted,
    and `launch logs` printed whatever file it named (/etc/hostname)."""
    logs, out = RunPaths(Path(run_dir)).logs, []
    for log in recorded:
        name = Path(str(log)).name
        if not re.fullmatch(r"launcher\.log|node-\d+\.log", name) or Path(str(log)).parent.name != LOGS_DIR:
            raise LinkError(f"{RunPaths(Path(run_dir)).launch} names {str(log)!r} as a log file, which is not one of "
                            f"the run's own logs ({LOGS_DIR}/launcher.log, {LOGS_DIR}/node-N.log); restore launch.json "
                            "or read the file yourself")
        out.append(check_inside(logs, logs / name))
    return out


# torchrun's tag on the lines it copies from its ranks' files into its own output (`--tee`): `[rankR]:` with the
# global rank (TORCHRUN_PREFIX), `[defaultL]:` with a local one (torchrun's own default)
TORCHRUN_TEE = re.compile(r"\[(?:rank|default)\d+\]:")


def rank_outputs(run_dir: Path) -> list[tuple[str, Path]]:
    """(tag, file) of each stdout.log and stderr.log that torchrun's agents kept of their ranks under
    RUN/logs/torchrun/ID/attempt_N/LOCAL_RANK/, the launches in the order their agents made their folders, then
    by attempt, local rank, stdout before stderr. The tag is `[rankR]:` with the global rank whose `start` record
    names the file (`stdout`/`stderr`), else, in a run of one node, the local rank (the same), else torchrun's
    own `[defaultL]:` (a local rank). A link anywhere below logs/torchrun is passed over, never followed."""
    logs = RunPaths(Path(run_dir)).logs
    root = logs / TORCHRUN_LOG_DIR
    if not root.is_dir() or root.is_symlink() or logs.is_symlink():
        return []
    owners, one_node = _output_owners(run_dir)
    out = []
    for launch in sorted(_folders(root), key=lambda d: d.stat().st_mtime):
        for attempt in sorted(_folders(launch), key=lambda d: _number(d.name.rpartition("_")[2])):
            for local in sorted((d for d in _folders(attempt) if d.name.isdigit()), key=lambda d: int(d.name)):
                for name in ("stdout.log", "stderr.log"):
                    path = local / name
                    if path.is_file() and not path.is_symlink() and path.stat().st_size:  # an empty one: no header
                        rank = owners.get(os.path.realpath(path), int(local.name) if one_node else None)
                        out.append((f"[rank{rank}]:" if rank is not None else f"[default{local.name}]:", path))
    return out


def _folders(parent: Path) -> list[Path]:
    """The real folders in `parent` (no link)."""
    return [d for d in parent.iterdir() if d.is_dir() and not d.is_symlink()]


def _number(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _output_owners(run_dir: Path) -> tuple[dict[str, int], bool]:
    """({real path of an output file: the global rank whose start record names it}, whether the run has one node).
    A run of one node reads no records: its local ranks are its global ones (`launch logs -f` asks every second)."""
    try:
        nodes = read_spec(Path(run_dir)).nodes
    except (ScalelabError, OSError, ValueError):
        nodes = 0  # unknown: a file no start record names keeps torchrun's local tag
    if nodes == 1:
        return {}, True
    owners: dict[str, int] = {}
    for path in sorted(RunPaths(Path(run_dir)).records.glob("rank-*.jsonl")):
        owners.update(_owners_in(path))
    return owners, False


# Per records file: its reader (where it stopped) and the owners its start records named so far. The echo and
# `launch logs -f` ask every second, and a run's records grow with every step: read whole each time, following
# a long multi-node run cost O(steps) a second. A file rewritten shorter is read again from its start.
_OWNERS: dict[str, tuple[RecordTail, dict[str, int]]] = {}


def _owners_in(path: Path) -> dict[str, int]:
    """{real path of an output file: the rank} from the start records of one rank's records file."""
    tail, owners = _OWNERS.setdefault(os.path.realpath(path), (RecordTail(path), {}))
    for rec in tail.read():
        if rec.get("kind") == "start" and isinstance(rec.get("rank"), int):
            owners.update({os.path.realpath(str(rec[name])): rec["rank"] for name in ("stdout", "stderr")
                           if isinstance(rec.get(name), str)})
    return owners


def rank_output(path: Path, tag: str) -> str:
    """One rank's output file under a `==> PATH (rank R) <==` header, each line tagged as torchrun tags it (what
    `launch logs --rank R` and the failure's abort line look for); a last line still being written stays
    without its newline, as in the file (`launch logs -f` holds it back until it is whole)."""
    text = read_log(path)  # a progress bar's carriage returns kept in its line: `launch logs` shows its last state
    lines = log_lines(text)
    rank, local = rank_tag(tag, at_start=True)
    who = f"rank {rank}" if rank is not None else f"local rank {local}"
    return f"==> {path} ({who}) <==\n" + "".join(tag + line for line in lines)


def shell_status(code: int | None) -> int | None:
    """A child's exit as a shell reports it: Popen's -N (killed by signal N) becomes 128 + N. Why: the
    run's status said "exit codes [-15]" where every other place (the launcher's own exit, the ranks'
    os._exit(143)) says 143 for the same SIGTERM."""
    return 128 - code if code is not None and code < 0 else code


THREADS_PER_CORE = 4  # --threads above this many per core of this machine is refused (issue #37)


class LocalBackend(Backend):
    default_poll_s = 0.5
    horovod_here = True  # horovodrun and the ranks run on this machine's Python
    detachable = True  # the processes run on without the launcher; `launch status` finds them and their end
    checkpoint_here = True  # RUN_DIR/checkpoint.pt is here: a resume can tell when there is none

    name = "local"
    Options = LocalOptions

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self._procs: dict[int, subprocess.Popen] = {}

    # ---- render (pure) ---------------------------------------------------------------------------

    def check_dry_run(self, spec: Spec) -> None:
        """None: the local checks are of this machine's tools, GPUs and cores, which a dry run need not have."""

    def check(self, spec: Spec) -> None:
        if starter_of(spec.engine.name).needs_horovod and tool_path("horovodrun") is None:
            raise EngineError("horovodrun is not installed beside this Python nor on PATH; install Horovod with scripts/build-horovod.sh")
        where = "this machine" + (f" ({spec.nodes} emulated nodes x {spec.ranks_per_node})" if spec.nodes > 1 else "")
        check_gpus(spec.nodes * spec.ranks_per_node, spec.device, where)  # never two ranks on one GPU
        cores = os.cpu_count() or 1
        for flag, threads in (("--threads", spec.threads), ("--interop-threads", spec.interop_threads)):
            if threads is not None and threads > THREADS_PER_CORE * cores:  # the ranks run here: its cores decide
                raise SpecError(f"{flag} {threads} is more than this machine's {cores} cores x {THREADS_PER_CORE} "
                                f"({THREADS_PER_CORE * cores}); each rank would oversubscribe them: give at most "
                                f"{THREADS_PER_CORE * cores}, or leave it out (cores / ranks per node)")
        if spec.precision != "fp32":  # the ranks run on this machine: its CPU decides, before any starts
            from scalelab.train.precision import check_cpu_precision

            check_cpu_precision(spec.precision, spec.rnn, spec.device)
        workdir(spec)  # a --script run's recorded working directory is gone: refused before anything is written

    def submit_dryrun(self, spec: Spec, run_dir: Path) -> LocalRequest:
        run_dir = Path(run_dir).absolute()  # the ranks, the logs and launch.json all name the same directory
        python = self.options["python"] or sys.executable
        port = int(self.options["master_port"]) or free_port()  # probed now, so the printed request is what runs
        threads = spec.threads or max(1, (os.cpu_count() or 1) // spec.ranks_per_node)  # ps separate: + servers
        env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        if not self.detached:  # the ranks stop (with a checkpoint) when this launcher is gone, even by SIGKILL
            env[LAUNCHER_ENV] = launcher_watch()
        site = Site(python=python, master_addr="127.0.0.1", master_port=port, hosts=("localhost",),
                    horovodrun=None)  # every emulated node on this host; Horovod's runner without its torch import
        plan = launch_plan(spec, run_dir, site)
        env.update(plan[0].env)  # the engine's (Horovod's fusion settings): the same for every node
        commands = [launch.argv for launch in plan]
        logs = RunPaths(run_dir).logs
        log_files = [str(logs / (f"node-{i}.log" if len(commands) > 1 else "launcher.log")) for i in range(len(commands))]
        cwd = workdir(spec)  # a --script's ranks: where its run started, also on a resume from elsewhere
        return LocalRequest(run_dir, commands, env, log_files, payload_comment(spec), str(cwd) if cwd else None)

    # ---- schedule --------------------------------------------------------------------------------

    def schedule(self, request: LocalRequest) -> str:
        run_dir = request.run_dir
        for log in request.log_files:  # a linked (or dangling) logs/ or log file: refused before mkdir follows it
            check_inside(run_dir, log)
        RunPaths(run_dir).logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **request.env}
        if LAUNCHER_ENV not in request.env:
            env.pop(LAUNCHER_ENV, None)  # detached: not even a watch inherited from a launcher above this one
        started: list[subprocess.Popen] = []
        offsets: list[int] = []  # each log's size before this launch: what it writes comes after (launch_text)
        try:
            for cmd, log in zip(request.commands, request.log_files):
                # O_NOFOLLOW: a link planted since the check is refused too, its target never appended to
                with os.fdopen(open_inside(run_dir, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), "ab") as out:
                    offsets.append(os.fstat(out.fileno()).st_size)
                    # A new session per command: a Ctrl-C in the terminal reaches the launcher only, which
                    # then stops the run its own way (the ranks checkpoint).
                    started.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                    cwd=request.cwd, start_new_session=True))
                self._procs[started[-1].pid] = started[-1]
        except BaseException:
            stop_processes(family(_processes_of(started)), 0, self._reap)  # no node of a half-started run stays
            raise
        # pid + start time + command line: `status` and `cancel` signal only these very processes
        refs = [ref.to_dict() for p, cmd in zip(started, request.commands)
                if (ref := ProcessRef.of_child(p.pid, cmd)) is not None]
        start_state(run_dir, backend=self.name, pids=[p.pid for p in started], processes=refs,
                    commands=request.commands, env=request.env, log_files=request.log_files, log_offsets=offsets,
                    started=time.time(), host=socket.gethostname())
        return ",".join(str(p.pid) for p in started)

    # ---- poll, status, logs, cancel --------------------------------------------------------------

    def poll(self, run_dir: Path) -> RunStatus:
        """Reap the run's processes; when one node failed, stop the others (they cannot finish alone)."""
        pids = read_state(run_dir)["pids"]
        codes = [self._returncode(run_dir, pid) for pid in pids]
        if None in codes and any(c not in (None, 0) for c in codes):
            self._stop(run_dir, float(self.options["stop_grace_s"]))
            codes = [self._returncode(run_dir, pid) for pid in pids]
        if None in codes:
            return RunStatus(RUNNING, f"pids {pids}")
        self._record_exits(run_dir, codes)
        if all(c == 0 for c in codes):
            return RunStatus(COMPLETED, f"exit codes {codes}")
        # only SIGTERM from outside the launcher (and the nodes stopped after it): cancelled, not failed
        stopped = all(c in (0, 128 + signal.SIGTERM) for c in codes)
        return RunStatus(CANCELLED if stopped else FAILED, f"exit codes {codes}" if stopped else
                         ranks_exits_detail(run_dir, codes))

    def _record_exits(self, run_dir: Path, codes: list[int] | None = None) -> None:
        """Each rank's exit status into launch.json (`rank_exits`, read by `backend.silent_ranks`): the one
        process's own where it is the rank (`codes`: single), else what torchrun or horovodrun printed of each
        rank (in what this launch wrote: `launch_text`). Why: a rank that ends past the script's runner
        (`os._exit(5)`) writes no end record, and the agent's own status (torchrun's 1) is not the rank's."""
        try:
            plain = starter_of(read_spec(run_dir).engine.name).name == PLAIN
            exits = {0: codes[0]} if plain and codes else reported_exits(self.launch_text(run_dir))
            if exits:
                update_state(run_dir, rank_exits={str(rank): code for rank, code in sorted(exits.items())})
        except (ScalelabError, OSError, ValueError):  # unreadable spec, planted log, full disk: none recorded
            return

    def _returncode(self, run_dir: Path, pid: int) -> int | None:
        proc = self._procs.get(pid)
        if proc is not None:
            return shell_status(proc.poll())
        # started by another launcher process: only whether that very process still runs is known
        return None if any(p.pid == pid for p in self._leaders(run_dir)) else -1

    def _reap(self) -> None:
        for proc in self._procs.values():
            proc.poll()

    def status(self, run_dir: Path) -> RunStatus:
        """Recorded end, else the run's live processes (verified), else its end read from its records."""
        info = read_state(run_dir)
        if info.get("state") in TERMINAL:
            return RunStatus(info["state"], info.get("detail", ""))
        live = self._processes(run_dir)
        if live:
            return RunStatus(RUNNING, f"{len(live)} process{'es' if len(live) != 1 else ''}: pids {sorted(p.pid for p in live)}")
        self._record_exits(run_dir)  # no launcher reaped them (detached, or killed): what the agents printed
        return (ended_by_records(run_dir, info.get("launched"))
                or RunStatus(UNKNOWN, "no process of the run is left and its ranks recorded nothing"))

    def busy(self, run_dir: Path) -> str | None:
        """The run's processes still alive, whatever launch.json says (a cancel may still be stopping them)."""
        live = self._processes(run_dir)
        return f"{len(live)} of its processes still run: pids {sorted(p.pid for p in live)}" if live else None

    def logs(self, run_dir: Path) -> str:
        """The launcher's (or each node's) log, then, for torchrun's ranks, each rank's own stdout and stderr
        files (`rank_outputs`), every line tagged with its rank; the agent's copies of those lines are left out
        of its log. Why: torchrun's `--tee` copies a rank's file into the agent's output line by line as it
        reads it, so a line the rank wrote in two parts (print(..., end=""), then the rest) came out cut in two,
        the first part run into the next line of another file (`[rank1]:line 16340 xxx[rank1]:rank 1 stderr 0`,
        then a bare `[rank1]:`); the rank's own files hold every line whole."""
        logs = own_logs(run_dir, read_state(run_dir).get("log_files") or [])
        outputs = rank_outputs(run_dir)
        if not outputs:
            return log_text(logs)
        ranks = [rank_output(path, tag) for tag, path in outputs]
        return "\n".join([log_text(logs, drop=TORCHRUN_TEE.match), *ranks])

    def rank_logs(self, run_dir: Path, rank: int) -> str:
        """One rank's lines; of the `single` engine, whose one process is rank 0, its whole log (untagged). Why:
        `launch logs RUN --rank 0` of such a run showed none of its output, where a failed script's one-line
        error sends the reader for its full traceback."""
        if starter_of(read_spec(run_dir).engine.name).name == PLAIN:
            return self.logs(run_dir)
        return super().rank_logs(run_dir, rank)

    def rank_output_files(self, run_dir: Path) -> list[RankOutput]:
        """torchrun's ranks: each one's own stdout.log and stderr.log (`rank_outputs`: whole lines, where the
        agent's copies could be cut); horovodrun's: its log, whose rank lines carry their tags; the one process
        of `single`: its log, every line rank 0's."""
        how = starter_of(read_spec(run_dir).engine.name).name
        if how == TORCHRUN:
            return [RankOutput(path, tag, path.name == "stderr.log") for tag, path in rank_outputs(run_dir)]
        logs = own_logs(run_dir, read_state(run_dir).get("log_files") or [])
        return [RankOutput(log, "[rank0]:" if how == PLAIN else None) for log in logs if log.is_file()]

    def launch_text(self, run_dir: Path) -> str:
        """What the run's latest launch wrote to its logs: each from the size it had when that launch started
        (`log_offsets` in launch.json; a launch that recorded none: the whole log). Why: the logs are appended
        across resumes, and torchrun's failure summary of an earlier launch named, as this launch's, the exit
        of a rank that went silent in this one."""
        state = read_state(run_dir)
        offsets = state.get("log_offsets") or []
        parts = []
        for i, path in enumerate(own_logs(run_dir, state.get("log_files") or [])):
            start = offsets[i] if i < len(offsets) and isinstance(offsets[i], int) and offsets[i] > 0 else 0
            try:
                with open(path, "rb") as log:
                    if start > os.fstat(log.fileno()).st_size:  # shorter than when the launch started: rewritten
                        start = 0
                    log.seek(start)
                    parts.append(log.read().decode(errors="replace"))
            except FileNotFoundError:
                continue
        return "\n".join(parts)

    def cancel(self, run_dir: Path) -> str:
        """SIGTERM every process of the run (ranks checkpoint and stop), SIGKILL after the grace period,
        then look again; say what was stopped and that none is left, or raise naming what is."""
        stopped = self._stop(run_dir, float(self.options["stop_grace_s"]))
        tmp = RunPaths(run_dir).checkpoint.with_suffix(".tmp")
        if not stopped.left and tmp.exists():  # a write cut by SIGKILL; the previous checkpoint is whole
            tmp.unlink(missing_ok=True)
            stopped.notes.append(f"removed the half-written {tmp.name}")
        if stopped.left:
            raise ScalelabError(f"{run_dir}: {stopped}; stop them by hand (kill -9 {' '.join(map(str, stopped.left))})")
        return str(stopped)

    # ---- the run's processes ---------------------------------------------------------------------

    def _leaders(self, run_dir: Path) -> list[psutil.Process]:
        """The processes this backend started for the run, as launch.json records them, that are still
        those very processes (pid, start time, command line, host) and name this run directory."""
        out = []
        for raw in read_state(run_dir).get("processes", []):
            ref = ProcessRef.from_dict(raw)
            if ref is not None and names_run(ref.cmdline, run_dir) and (proc := ref.process()) is not None:
                out.append(proc)
        return out

    def _processes(self, run_dir: Path) -> list[psutil.Process]:
        """Every live process of the run: the verified ones it started, what they started, and any rank of
        it found by its command line (torchrun's workers outlive their agent under pid 1)."""
        return family([*self._leaders(run_dir), *rank_processes(run_dir)])

    def _stop(self, run_dir: Path, grace_s: float) -> "Stopped":
        """Stop every process of the run; a process that appeared meanwhile (an agent starting a worker)
        is found by a second look and stopped too."""
        targets = self._processes(run_dir)
        found = {p.pid for p in targets}
        killed, left = stop_processes(targets, grace_s, self._reap)
        again = [p for p in self._processes(run_dir) if p.pid not in found]
        if again:
            found |= {p.pid for p in again}
            more, left_again = stop_processes(again, min(grace_s, 5.0), self._reap)
            killed, left = killed + more, left + left_again
        self._reap()
        return Stopped(len(found), killed, sorted(set(left) | {p.pid for p in self._processes(run_dir)}))


@dataclass
class Stopped:
    """What a stop found and did, said in one line."""

    found: int
    killed: int  # of `found`, those that needed SIGKILL (hung, or slower than the grace period)
    left: list[int]
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.found:
            said = "no process of the run was running"
        else:
            said = f"stopped {self.found} process{'es' if self.found != 1 else ''}"
            said += f" ({self.killed} after SIGKILL)" if self.killed else ""
        said += f"; {len(self.left)} still running: pids {self.left}" if self.left else "; none left"
        return "; ".join([said, *self.notes])


def launcher_watch() -> str:
    """`PID:START` of this launcher, for the ranks to watch (scalelab/train/loop.py stops them when it is gone)."""
    return watch_value(os.getpid())


def _processes_of(started: list[subprocess.Popen]) -> list[psutil.Process]:
    out = []
    for popen in started:
        try:
            out.append(psutil.Process(popen.pid))
        except psutil.Error:
            continue
    return out
