"""Horovod's Gloo rendezvous inside a Slurm allocation: what `horovodrun --gloo` does, without ssh.

`horovodrun` starts an HTTP key-value server (`RendezvousServer`), initialises it with the plan of
which rank sits on which host (`get_host_assignments`), and gives every rank the server's address and
its own HOROVOD_* variables (horovod/runner/gloo_run.py). Under Slurm the ranks are started by `srun`
instead, so the batch script runs this module on the first node:

    coproc RDZV { python -m scalelab.slurm.rendezvous --tasks-per-node 4; }   # prints the port, then serves

The plan uses the node names of the allocation as submitit's `JobEnvironment.hostnames` reads them
from SLURM_JOB_NODELIST: the same list every rank takes its HOROVOD_HOSTNAME from (scalelab/slurm/rank.py),
with block distribution: rank = node * tasks + local.
The server ignores SIGTERM/SIGUSR1 (the ranks may still talk to it while they checkpoint and shut
down); the batch script kills it when the ranks are done, and it leaves by itself if the batch
script is gone.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from submitit.slurm.slurm import SlurmJobEnvironment


def host_plan(hosts: list[str], tasks_per_node: int):
    """Horovod's SlotInfo list for `tasks_per_node` ranks on each host, block by block."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    return get_host_assignments([HostInfo(h, tasks_per_node) for h in hosts], len(hosts) * tasks_per_node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.slurm.rendezvous", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks-per-node", type=int, required=True)
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    from horovod.runner.http.http_server import RendezvousServer

    hosts = list(SlurmJobEnvironment().hostnames)  # `node[1-2]` -> node1, node2 (= SLURM_NODEID order)
    server = RendezvousServer()
    port = server.start()
    server.init(host_plan(hosts, args.tasks_per_node))
    print(port, flush=True)
    print(f"scalelab: Horovod rendezvous on port {port} for {len(hosts)} node(s) x {args.tasks_per_node} rank(s): "
          f"{','.join(hosts)}", file=sys.stderr, flush=True)
    parent = os.getppid()
    _die_with_parent()
    while os.getppid() == parent:  # serve until killed, or until the batch script is gone
        time.sleep(0.2)
    return 0


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this server the moment the batch script dies (scancel, the time limit), so that
    nothing of the job outlives it by even a poll: the launcher says "every process of the run was stopped"
    once the job has left the queue (CI saw this server still there then, 2026-11-27). The poll in main
    stays for systems without prctl."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
