"""The `local` backend: ranks as processes on this machine, through horovodrun (Gloo) or torchrun.

The embedded default: it needs nothing but this machine. Without GPUs each "GPU" of the layout is a
worker process; with GPUs each rank gets its own device (local rank). A layout of several nodes is
emulated on one host: torchrun starts one agent per node (static rendezvous on 127.0.0.1), horovodrun
starts nodes x GPUs ranks on localhost.

Order inside the module (the same in every backend): options, request, render (pure), schedule,
wait/status/logs/cancel.
"""

from __future__ import annotations

import json
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
from typing import Callable

from core.errors import EngineError, ScalelabError
from core.net import free_port
from core.rundir import write_json
from core.spec import Spec
from launcher.backend import Backend, Request, RunStatus
from launcher.options import LocalOptions

LAUNCH_FILE = "launch.json"


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
    name = "local"
    Options = LocalOptions

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self._procs: dict[int, subprocess.Popen] = {}

    # ---- render (pure) ---------------------------------------------------------------------------

    def validate(self, spec: Spec) -> None:
        if spec.engine.name == "horovod":
            from train.engines import horovod_status

            problem = horovod_status()
            if problem:
                raise EngineError(problem)
            if shutil.which("horovodrun") is None:
                raise EngineError("horovodrun is not on PATH; install Horovod with scripts/build-horovod.sh")

    def submit_dryrun(self, spec: Spec, run_dir: Path) -> LocalRequest:
        python = self.options["python"] or sys.executable
        port = int(self.options["master_port"]) or free_port()  # probed now, so the printed request is what runs
        workers, per_node = spec.workers, spec.gpus_per_node
        threads = spec.threads or max(1, (os.cpu_count() or 1) // per_node)
        env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        trainer = ["-m", "train", str(run_dir)]
        logs = Path(run_dir) / "logs"
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
        log_files = [str(logs / (f"node-{i}.log" if len(commands) > 1 else "launcher.log")) for i in range(len(commands))]
        return LocalRequest(Path(run_dir), commands, env, log_files)

    # ---- schedule --------------------------------------------------------------------------------

    def schedule(self, request: LocalRequest) -> str:
        run_dir = request.run_dir
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **request.env}
        pids = []
        for cmd, log in zip(request.commands, request.log_files):
            with open(log, "ab") as out:
                # A new session per command: cancel and Ctrl-C reach every process it started.
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            pids.append(proc.pid)
            self._procs[proc.pid] = proc
        write_json(run_dir / LAUNCH_FILE, {
            "backend": self.name, "pids": pids, "commands": request.commands, "env": request.env,
            "log_files": request.log_files, "started": time.time(), "host": socket.gethostname(),
        })
        return ",".join(map(str, pids))

    # ---- wait, status, logs, cancel --------------------------------------------------------------

    def wait(self, run_dir: Path, on_poll: Callable[[], None] | None = None, poll_s: float = 0.5) -> RunStatus:
        info = _launch_info(run_dir)
        try:
            while True:
                codes = [self._returncode(pid) for pid in info["pids"]]
                if on_poll:
                    on_poll()
                if any(c not in (None, 0) for c in codes):  # one node failed: the others cannot finish
                    self._stop(run_dir)
                    codes = [self._returncode(pid) for pid in info["pids"]]
                    break
                if all(c is not None for c in codes):
                    break
                time.sleep(poll_s)
        except KeyboardInterrupt:
            self.cancel(run_dir)
            _update(run_dir, state="CANCELLED", ended=time.time())
            raise
        if _launch_info(run_dir).get("state") == "CANCELLED":  # `launch cancel` marked it before signalling
            return RunStatus("CANCELLED", f"exit codes {codes}")
        state = "COMPLETED" if all(c == 0 for c in codes) else ("CANCELLED" if any(c == 143 for c in codes) else "FAILED")
        _update(run_dir, state=state, exit_codes=codes, ended=time.time())
        return RunStatus(state, f"exit codes {codes}")

    def _returncode(self, pid: int) -> int | None:
        proc = self._procs.get(pid)
        if proc is not None:
            return proc.poll()
        return None if _alive(pid) else -1  # started by another launcher process: only liveness is known

    def status(self, run_dir: Path) -> RunStatus:
        info = _launch_info(run_dir)
        if "state" in info:
            return RunStatus(info["state"], f"exit codes {info.get('exit_codes')}")
        if any(_alive(pid) for pid in info["pids"]):
            return RunStatus("RUNNING", f"pids {info['pids']}")
        return RunStatus("UNKNOWN", "the launcher stopped before recording how the run ended")

    def logs(self, run_dir: Path) -> str:
        info = _launch_info(run_dir)
        parts = []
        for log in info["log_files"]:
            p = Path(log)
            parts.append(f"==> {p} <==\n" + (p.read_text(errors="replace") if p.exists() else "(no output yet)\n"))
        return "\n".join(parts)

    def cancel(self, run_dir: Path, grace_s: float = 10.0) -> None:
        """Mark the run cancelled, then stop it (see `_stop`)."""
        if "state" not in _launch_info(run_dir):
            _update(run_dir, state="CANCELLED", ended=time.time())
        self._stop(run_dir, grace_s)

    def _stop(self, run_dir: Path, grace_s: float = 10.0) -> None:
        """SIGTERM every process group of the run (ranks checkpoint and stop), SIGKILL after `grace_s`."""
        info = _launch_info(run_dir)
        for pid in info["pids"]:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline and any(self._returncode(p) is None for p in info["pids"]):
            time.sleep(0.2)
        for pid in info["pids"]:
            _signal_group(pid, signal.SIGKILL)
            proc = self._procs.get(pid)
            if proc is not None:
                proc.wait()


def _launch_info(run_dir: Path) -> dict:
    path = Path(run_dir) / LAUNCH_FILE
    if not path.exists():
        raise ScalelabError(f"{run_dir} has no {LAUNCH_FILE}: it was never launched (or is not a run directory)")
    return json.loads(path.read_text())


def _update(run_dir: Path, **fields) -> None:
    info = _launch_info(run_dir)
    info.update(fields)
    write_json(Path(run_dir) / LAUNCH_FILE, info)


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
