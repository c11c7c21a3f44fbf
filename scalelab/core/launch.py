"""How a run's ranks start, decided once for every backend: `launch_plan(spec, run_dir, site)`.

TorchX's idea (an AppDef says what to run; a scheduler only places it): the plan is a list of
`NodeLaunch` - which node, the command line, the engine's environment - and a backend places those
launches (processes here, pods, instances, a job's tasks) and decides nothing about the engine. What
decides is the engine's starter (scalelab/core/engines.py):

- plain: `python -m scalelab.train RUN_DIR` on node 0;
- torchrun: one torchrun agent per node (`python -m scalelab.core.torchrun`: PyTorch's own
  `torch.distributed.run`, leaving without the interpreter's teardown), static rendezvous on node 0
  (`--master-addr`/`--master-port`), `--nproc-per-node` = `Spec.ranks_per_node`, its ranks' output kept in
  RUN_DIR/logs/torchrun and printed tagged with the global rank;
- horovodrun: one `horovodrun --gloo` on node 0 that starts every rank (over ssh on other hosts), or,
  where the site starts Horovod's ranks through MPI (the Kubeflow MPI Operator), one `mpirun`;
  Horovod's fusion settings go into the environment (`engine_env`).

A scheduler that starts every rank itself (Slurm's srun) takes `rank_env`: the variables torchrun or
horovodrun would have given that rank. What the backend knows and the plan does not - node 0's
address, a free port, which Python, values only the node knows when it starts (`NodeVar`, such as
Kubernetes' `$JOB_COMPLETION_INDEX`) - comes in as a `Site`.

This is the one module that writes the torchrun, horovodrun and mpirun command lines and Horovod's
environment (the link benchmark, scalelab/launcher/bench.py, uses the same builders). No PyTorch:
`--dry-run` of a cluster backend imports this and must stay light; it runs on AWS instances too
(scalelab/aws/bootstrap.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from scalelab.core.engines import HOROVODRUN, PLAIN, TORCHRUN, starter
from scalelab.core.errors import SpecError
from scalelab.core.procs import SCRIPT_RUNNER, TRAINER
from scalelab.core.rundir import LOGS_DIR
from scalelab.core.spec import Spec

DEFAULT_MASTER_PORT = 29500  # torchrun's own default


class NodeVar(str):
    """A value the node's shell fills in when it starts (`$JOB_COMPLETION_INDEX`, `$MASTER_ADDR`), known
    to no one when the plan is made: a command line that holds one is written unquoted there."""


@dataclass(frozen=True)
class Site:
    """What the backend knows of where the ranks start, as `launch_plan` needs it.

    `node_rank`: None makes one launch per node, numbered; a `NodeVar` makes one launch that every
    node runs, its number filled in there (an indexed Kubernetes Job). `hosts`: horovodrun's hosts, the
    ranks spread evenly over them (the local backend emulates every node on `localhost`).
    `horovodrun`: the horovodrun script, None for `python -m scalelab.core.horovodrun` (Horovod's runner
    without its start-up check that imports PyTorch: what the local and AWS backends run). `mpirun_args`: Horovod's ranks are started by mpirun with these
    options (the MPI Operator gives the hosts), and `exports` are the variables it passes on.
    """

    python: str = "python"
    master_addr: str = "127.0.0.1"
    master_port: int | str = DEFAULT_MASTER_PORT
    node_rank: NodeVar | None = None
    hosts: tuple[str, ...] = ("localhost",)
    horovodrun: str | None = "horovodrun"
    ssh_identity: str | None = None
    mpirun_args: tuple[str, ...] | None = None
    exports: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeLaunch:
    """One process a backend starts: on which node (a number, or a `NodeVar` when every node runs it),
    its command line and the engine's environment (added to what the backend sets itself)."""

    node: int | NodeVar
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def launch_plan(spec: Spec, run_dir: str | PurePath, site: Site = Site()) -> list[NodeLaunch]:
    """The processes that start `spec`'s ranks, in node order; an unknown engine or starter raises SpecError here.

    A node with no launch in the plan runs nothing of its own: its ranks are started from node 0
    (horovodrun over ssh, mpirun). Pure: the same arguments give the same plan.
    """
    how = starter_of(spec.engine.name)
    return how.launches(spec, payload(spec, run_dir), site, how.engine_env(spec), run_dir)


def payload(spec: Spec, run_dir: str | PurePath) -> list[str]:
    """What every rank runs, after `python`: the built-in trainer, or the runner of the user's --script /
    --module (scalelab/train/script.py), which reads what to run from the run's spec.json."""
    return [*(SCRIPT_RUNNER if spec.own_code else TRAINER), str(run_dir)]


def code_command(spec: Spec, folder: str | None = None) -> str:
    """What every rank of a --script / --module run runs of the user's code, as a shell would take it (`two words`
    stays one argument); `folder`: where its folder is on the nodes, when not where it is here. Only shown (the
    dry runs, `payload_comment`): the ranks take the arguments from spec.json as a list (train/script.py)."""
    import shlex

    if spec.script:
        what = ["python", str(PurePath(folder) / PurePath(spec.script).name) if folder else spec.script]
    else:
        what = ["python", "-m", str(spec.module)]
    return shlex.join([*what, *spec.script_args])


def payload_comment(spec: Spec, folder: str | None = None) -> str | None:
    """One comment line for a dry run: what every rank runs of the user's code (`code_command`); None for the
    built-in trainer."""
    if not spec.own_code:
        return None
    place = f" (from {folder or spec.script_dir})" if spec.module else ""
    return (f"# every rank runs your code: {code_command(spec, folder)}{place}, inside "
            f"`python -m scalelab.train.script RUN_DIR`, which records its scalelab.track calls")


def engine_env(spec: Spec) -> dict[str, str]:
    """The environment the engine's ranks need besides their placement (Horovod's fusion buffer and cycle)."""
    return starter_of(spec.engine.name).engine_env(spec)


# How long a Horovod rank waits for its peers in Gloo's rendezvous (and a Gloo operation) before it aborts.
# Horovod's default, 30 s, is shorter than the start-up skew of ranks that import PyTorch from a cold
# shared filesystem or on a loaded node: one that reaches hvd.init 30 s after another makes both abort
# with SIGABRT ("Wait timeout after 30 seconds for key(s)"), a run failed before its first step.
GLOO_TIMEOUT_S = 180


def horovod_env(fusion_threshold_mb: float, cycle_time_ms: float) -> dict[str, str]:
    """HOROVOD_FUSION_THRESHOLD (bytes; 0: no fusion) and HOROVOD_CYCLE_TIME (ms), as Horovod reads them,
    and HOROVOD_GLOO_TIMEOUT_SECONDS (GLOO_TIMEOUT_S)."""
    return {"HOROVOD_FUSION_THRESHOLD": str(int(fusion_threshold_mb * 1024 * 1024)),
            "HOROVOD_CYCLE_TIME": str(cycle_time_ms), "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S)}


def _arg(flag: str, value: object) -> str:
    """`--flag=value`, still a NodeVar when the value is one (the node's shell expands it)."""
    return NodeVar(f"{flag}={value}") if isinstance(value, NodeVar) else f"{flag}={value}"


# torchrun's prefix of each line of a rank's output (`--tee=3` tags them; this template makes the tag the
# *global* rank, `[rank1]:`, where torchrun's own default, `[default1]:`, is the local rank, the same on every
# node). torchrun reads it from its environment only (torch 2.13 has no flag for it), so it goes with torchrun's
# command line: the env of the `NodeLaunch` that `TorchrunStarter.launches` returns, not `engine_env` (Slurm's
# srun starts the ranks without torchrun and exported it for nothing).
# Why: untagged, a DDP rank's output (a script's traceback) was in no rank's `launch logs RUN --rank N`.
TORCHRUN_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
TORCHRUN_PREFIX = "[rank${rank}]:"
# Where torchrun's agent keeps its ranks' stdout.log/stderr.log (`--tee` writes them, then prints them tagged) and
# their error.json: RUN_DIR/logs/torchrun. Why: without `--log-dir` it makes a new /tmp/torchelastic_* on every
# launch, every node, that nothing deletes; in the run directory they go with the run.
TORCHRUN_LOG_DIR = "torchrun"


def torchrun_log_dir(run_dir: str | PurePath) -> str:
    """RUN_DIR/logs/torchrun: torchrun's `--log-dir` for a run's ranks."""
    return str(PurePath(run_dir) / LOGS_DIR / TORCHRUN_LOG_DIR)


def torchrun_argv(python: str, nodes: int, ranks_per_node: int, node_rank: int | str, master_addr: str,
                  master_port: int | str, program: Sequence[str], log_dir: str | None = None) -> list[str]:
    """One node's torchrun agent: `ranks_per_node` ranks of `python PROGRAM`, static rendezvous on node 0. With
    `log_dir`, the agent keeps its ranks' output there (`--log-dir`) and prints each line of their stdout and
    stderr tagged with the rank (`--tee=3`; the tag: TORCHRUN_PREFIX, in the launch's env); without, neither
    (`--tee` without `--log-dir` writes the ranks' output to a new /tmp/torchelastic_* that nothing deletes)."""
    logs = [f"--log-dir={log_dir}", "--tee=3"] if log_dir is not None else []
    return [python, "-m", "scalelab.core.torchrun", f"--nnodes={nodes}", f"--nproc-per-node={ranks_per_node}",
            _arg("--node-rank", node_rank), _arg("--master-addr", master_addr), f"--master-port={master_port}",
            *logs, *program]


def horovodrun_argv(horovodrun: str | None, python: str, world: int, hosts: Sequence[str], program: Sequence[str],
                    ssh_identity: str | None = None) -> list[str]:
    """horovodrun with Gloo (no MPI): `world` ranks of `python PROGRAM`, spread evenly over `hosts`.
    `horovodrun` None: Horovod's runner through scalelab.core.horovodrun (the same program, without the
    start-up check that imports PyTorch: 4.5 s of every Horovod launch)."""
    launcher = [horovodrun] if horovodrun else [python, "-m", "scalelab.core.horovodrun"]
    slots = world // len(hosts)
    cmd = [*launcher, "--gloo", "-np", str(world), "-H", ",".join(f"{h}:{slots}" for h in hosts)]
    if ssh_identity:
        cmd += ["--ssh-identity-file", ssh_identity]
    return [*cmd, python, *program]


def mpirun_argv(world: int, options: Sequence[str], exports: Sequence[str], python: str,
                program: Sequence[str]) -> list[str]:
    """mpirun starting `world` ranks of `python PROGRAM`, passing on `exports` (Horovod reads MPI's ranks)."""
    cmd = ["mpirun", "-np", str(world), *options]
    for name in exports:
        cmd += ["-x", name]
    return [*cmd, python, *program]


@dataclass(frozen=True)
class Slot:
    """Where one rank sits, for a scheduler that starts every rank itself (Slurm's srun)."""

    rank: int
    world: int
    local: int
    local_world: int
    node: int
    nodes: int
    hostname: str


def rank_env(engine: str, slot: Slot, addr: str, port: str) -> dict[str, str]:
    """The variables the engine's starter would have given this rank (`addr`:`port`: the rendezvous on
    node 0, torchrun's store or Horovod's Gloo server); none for a plain one."""
    return starter_of(engine).rank_env(slot, addr, port)


# ---- the starters: how a payload's ranks start ---------------------------------------------------------------


class Starter:
    """How ranks start, for every backend: the launches of a payload (the built-in trainer or the user's
    script: `payload`), the engine's environment, each rank's variables where a scheduler starts every rank
    itself (srun), what a Slurm batch script runs before srun (the rendezvous) and after, which Kubernetes
    workload runs it (`k8s_workload`: a name in scalelab/k8s/manifests.py's WORKLOADS) and whether the nodes
    need Horovod. A new way to start ranks is a subclass here, registered in STARTERS (`register`)."""

    name: str = ""
    needs_horovod: bool = False
    k8s_workload: str = ""

    def launches(self, spec: Spec, program: list[str], site: Site, env: dict[str, str],
                 run_dir: str | PurePath) -> list[NodeLaunch]:
        """The processes that start `program` (which names `run_dir`, the run directory as the nodes see it:
        where a launcher may keep its own files) with the engine's `env`."""
        raise NotImplementedError

    def engine_env(self, spec: Spec) -> dict[str, str]:
        return {}

    def rank_env(self, slot: Slot, addr: str, port: str) -> dict[str, str]:
        return {}

    def slurm_setup(self, spec: Spec, python: str) -> list[str]:
        """Lines of the batch script before srun; they end with SCALELAB_RDZV_PORT set (0: no rendezvous)."""
        return ["SCALELAB_RDZV_PORT=0"]

    def slurm_teardown(self) -> list[str]:
        """Lines of the batch script after srun (whose status is the job's)."""
        return []


class PlainStarter(Starter):
    """One process, `python PAYLOAD` on node 0: no rendezvous."""

    name, k8s_workload = PLAIN, "indexed-job"

    def launches(self, spec: Spec, program: list[str], site: Site, env: dict[str, str],
                 run_dir: str | PurePath) -> list[NodeLaunch]:
        return [NodeLaunch(0, [site.python, *program], env)]


class TorchrunStarter(Starter):
    """One torchrun agent per node, static rendezvous on node 0 (`--nproc-per-node` = `Spec.ranks_per_node`)."""

    name, k8s_workload = TORCHRUN, "indexed-job"

    def launches(self, spec: Spec, program: list[str], site: Site, env: dict[str, str],
                 run_dir: str | PurePath) -> list[NodeLaunch]:
        nodes = [site.node_rank] if site.node_rank is not None else range(spec.nodes)
        agent_env = {**env, TORCHRUN_PREFIX_ENV: TORCHRUN_PREFIX}  # the agent tags its ranks' lines: global rank
        return [NodeLaunch(node, torchrun_argv(site.python, spec.nodes, spec.ranks_per_node, node, site.master_addr,
                                               site.master_port, program, torchrun_log_dir(run_dir)), agent_env)
                for node in nodes]

    def rank_env(self, slot: Slot, addr: str, port: str) -> dict[str, str]:
        return dict(RANK=str(slot.rank), WORLD_SIZE=str(slot.world), LOCAL_RANK=str(slot.local),
                    LOCAL_WORLD_SIZE=str(slot.local_world), GROUP_RANK=str(slot.node), NODE_RANK=str(slot.node),
                    MASTER_ADDR=addr, MASTER_PORT=port)

    def slurm_setup(self, spec: Spec, python: str) -> list[str]:
        import shlex

        return [f"SCALELAB_RDZV_PORT=$({shlex.quote(python)} -m scalelab.slurm.rank --free-port)"]


class HorovodrunStarter(Starter):
    """One horovodrun (Gloo) on node 0 reaching every rank, or mpirun where the site starts Horovod through MPI
    (the MPI Operator); Horovod's fusion settings in the environment."""

    name, needs_horovod, k8s_workload = HOROVODRUN, True, "mpijob"

    def launches(self, spec: Spec, program: list[str], site: Site, env: dict[str, str],
                 run_dir: str | PurePath) -> list[NodeLaunch]:
        if site.mpirun_args is not None:
            return [NodeLaunch(0, mpirun_argv(spec.world, site.mpirun_args, site.exports, site.python, program), env)]
        return [NodeLaunch(0, horovodrun_argv(site.horovodrun, site.python, spec.world, site.hosts, program,
                                              site.ssh_identity), env)]

    def engine_env(self, spec: Spec) -> dict[str, str]:
        return horovod_env(spec.engine.fusion_threshold_mb, spec.engine.cycle_time_ms)

    def rank_env(self, slot: Slot, addr: str, port: str) -> dict[str, str]:
        return dict(HOROVOD_RANK=str(slot.rank), HOROVOD_SIZE=str(slot.world), HOROVOD_LOCAL_RANK=str(slot.local),
                    HOROVOD_LOCAL_SIZE=str(slot.local_world), HOROVOD_CROSS_RANK=str(slot.node),
                    HOROVOD_CROSS_SIZE=str(slot.nodes), HOROVOD_HOSTNAME=slot.hostname,
                    HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo",
                    HOROVOD_GLOO_RENDEZVOUS_ADDR=addr, HOROVOD_GLOO_RENDEZVOUS_PORT=port)

    def slurm_setup(self, spec: Spec, python: str) -> list[str]:
        import shlex

        return ["# Horovod's Gloo rendezvous server (what horovodrun starts): prints its port, serves until killed.",
                f"coproc RDZV {{ exec {shlex.quote(python)} -m scalelab.slurm.rendezvous --tasks-per-node "
                f"{spec.gpus_per_node}; }}",
                'read -r SCALELAB_RDZV_PORT <&"${RDZV[0]}" '
                '|| { echo "scalelab: error: the Horovod rendezvous server did not start" >&2; exit 1; }',
                'RDZV_SERVER=$RDZV_PID; disown "$RDZV_SERVER"']

    def slurm_teardown(self) -> list[str]:
        return ["RC=$?  # srun's status is the job's", 'kill -9 "$RDZV_SERVER" 2>/dev/null', 'exit "$RC"']


#: The starters by name: what an engine's `starter` (scalelab/core/engines.py) names.
STARTERS: dict[str, Starter] = {}


def register(how: Starter) -> Starter:
    """Add a starter (a subclass of `Starter` with its own name); every backend then starts engines that name it."""
    if not how.name or not isinstance(how, Starter):
        raise TypeError(f"a starter needs a name and to be a Starter, got {how!r}")
    STARTERS[how.name] = how
    return how


for _how in (PlainStarter(), TorchrunStarter(), HorovodrunStarter()):
    register(_how)


def starter_of(engine: str) -> Starter:
    """The starter of `engine`: an unknown engine, or an engine naming no registered starter, fails here, loudly,
    rather than falling into some other starter's launcher, an empty environment or another workload."""
    name = starter(engine)
    try:
        return STARTERS[name]
    except KeyError:
        raise SpecError(f"engine {engine!r} is started by {name!r}, which is no starter of scalelab/core/launch.py "
                        f"(starters: {', '.join(STARTERS)})") from None
