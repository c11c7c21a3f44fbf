"""The `local` backend: ranks as processes on this machine, through horovodrun (Gloo) or torchrun.

The embedded default: it needs nothing but this machine. Without GPUs each "GPU" of the layout is a
worker process; with GPUs each rank gets its own device (local rank). A layout of several nodes is
emulated on one host: torchrun starts one agent per node (static rendezvous on 127.0.0.1), horovodrun
starts nodes x GPUs ranks on localhost.

Order inside the module (the same in every backend): options, request, render (pure), schedule,
poll/status/logs/cancel. The follow loop is launcher/runner.py's; `poll` reaps the processes.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from core.errors import EngineError
from core.net import free_port
from core.rundir import (
    CANCELLED,
    COMPLETED,
    FAILED,
    RUNNING,
    TERMINAL,
    UNKNOWN,
    RunPaths,
    read_state,
    start_state,
)
from core.spec import Spec
from launcher.backend import Backend, Request, RunStatus, log_text
from launcher.options import LocalOptions


@dataclass
class LocalRequest(Request):
    """The processes to start: one command per emulated node (one in all for single and horovod)."""

    commands: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_files: list[str] = field(default_factory=list)

    def render(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        lines = [f"# run directory: {self.run_dir}"]
        for cmd, log in zip(self.commands, self.log_files):
            lines.append(f"{env} {shlex.join(cmd)} > {shlex.quote(log)} 2>&1 &")
        lines.append("wait")
        return "\n".join(lines)


class LocalBackend(Backend):
    default_poll_s = 0.5
    horovod_here = True  # horovodrun and the ranks run on this machine's Python

    name = "local"
    Options = LocalOptions

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self._procs: dict[int, subprocess.Popen] = {}

    # ---- render (pure) ---------------------------------------------------------------------------

    def check(self, spec: Spec) -> None:
        if spec.engine.name == "horovod" and shutil.which("horovodrun") is None:
            raise EngineError("horovodrun is not on PATH; install Horovod with scripts/build-horovod.sh")

    def submit_dryrun(self, spec: Spec, run_dir: Path) -> LocalRequest:
        run_dir = Path(run_dir).absolute()  # the ranks, the logs and launch.json all name the same directory
        python = self.options["python"] or sys.executable
        port = int(self.options["master_port"]) or free_port()  # probed now, so the printed request is what runs
        workers, per_node = spec.workers, spec.gpus_per_node
        threads = spec.threads or max(1, (os.cpu_count() or 1) // per_node)
        env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        trainer = ["-m", "train", str(run_dir)]
        if spec.engine.name == "single":
            commands = [[python, *trainer]]
        elif spec.engine.name == "ddp":
            commands = [
                [python, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}", f"--node-rank={node}",
                 f"--nproc-per-node={per_node}", "--master-addr=127.0.0.1", f"--master-port={port}", *trainer]
                for node in range(spec.nodes)
            ]
        else:  # horovod: Gloo controller and operations, no MPI, no ssh on one host
            env["HOROVOD_FUSION_THRESHOLD"] = str(int(spec.engine.fusion_threshold_mb * 1024 * 1024))
            env["HOROVOD_CYCLE_TIME"] = str(spec.engine.cycle_time_ms)
            commands = [[shutil.which("horovodrun") or "horovodrun", "--gloo", "-np", str(workers),
                         "-H", f"localhost:{workers}", python, *trainer]]
        logs = RunPaths(run_dir).logs
        log_files = [str(logs / (f"node-{i}.log" if len(commands) > 1 else "launcher.log")) for i in range(len(commands))]
        return LocalRequest(run_dir, commands, env, log_files)

    # ---- schedule --------------------------------------------------------------------------------

    def schedule(self, request: LocalRequest) -> str:
        run_dir = request.run_dir
        RunPaths(run_dir).logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **request.env}
        pids: list[int] = []
        try:
            for cmd, log in zip(request.commands, request.log_files):
                with open(log, "ab") as out:
                    # A new session per command: cancel and Ctrl-C reach every process it started.
                    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                pids.append(proc.pid)
                self._procs[proc.pid] = proc
        except BaseException:
            self._stop(pids, grace_s=0)  # no node of a half-started run stays behind
            raise
        start_state(run_dir, backend=self.name, pids=pids, commands=request.commands, env=request.env,
                    log_files=request.log_files, started=time.time(), host=socket.gethostname())
        return ",".join(map(str, pids))

    # ---- poll, status, logs, cancel --------------------------------------------------------------

    def poll(self, run_dir: Path) -> RunStatus:
        """Reap the run's processes; when one node failed, stop the others (they cannot finish alone)."""
        pids = read_state(run_dir)["pids"]
        codes = [self._returncode(pid) for pid in pids]
        if None in codes and any(c not in (None, 0) for c in codes):
            self._stop(pids)
            codes = [self._returncode(pid) for pid in pids]
        if None in codes:
            return RunStatus(RUNNING, f"pids {pids}")
        if all(c == 0 for c in codes):
            return RunStatus(COMPLETED, f"exit codes {codes}")
        # only SIGTERM from outside the launcher (and the nodes stopped after it): cancelled, not failed
        stopped = all(c in (0, 143, -signal.SIGTERM) for c in codes)
        return RunStatus(CANCELLED if stopped else FAILED, f"exit codes {codes}")

    def _returncode(self, pid: int) -> int | None:
        proc = self._procs.get(pid)
        if proc is not None:
            return proc.poll()
        return None if _alive(pid) else -1  # started by another launcher process: only liveness is known

    def status(self, run_dir: Path) -> RunStatus:
        info = read_state(run_dir)
        if info.get("state") in TERMINAL:
            return RunStatus(info["state"], info.get("detail", ""))
        if any(_alive(pid) for pid in info["pids"]):
            return RunStatus(RUNNING, f"pids {info['pids']}")
        return RunStatus(UNKNOWN, "the launcher stopped before recording how the run ended")

    def logs(self, run_dir: Path) -> str:
        return log_text([Path(log) for log in read_state(run_dir)["log_files"]])

    def cancel(self, run_dir: Path, grace_s: float = 30.0) -> None:
        """SIGTERM every process group of the run (ranks checkpoint and stop), SIGKILL after `grace_s`."""
        self._stop(read_state(run_dir)["pids"], grace_s)

    def _stop(self, pids: list[int], grace_s: float = 30.0) -> None:
        """SIGTERM the run's process groups; after `grace_s`, SIGKILL them and every process they started.

        The descendants are listed first: torchrun starts each rank in a session of its own, which a
        signal to torchrun's group does not reach (torchrun passes SIGTERM on, but may die first).
        """
        family = _descendants(pids)
        for pid in pids:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (any(self._returncode(p) is None for p in pids)
                                               or any(_running(p) for p in family)):
            time.sleep(0.2)
        for pid in pids:
            _signal_group(pid, signal.SIGKILL)
            proc = self._procs.get(pid)
            if proc is not None:
                proc.wait()
        for proc in family:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _descendants(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out += psutil.Process(pid).children(recursive=True)
    return out


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
