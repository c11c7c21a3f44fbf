"""Issue 34, part 3: engines and starters as objects. A starter (scalelab/core/launch.py) knows how its ranks
start on every backend; an engine (scalelab/core/engines.py) carries the facts other layers ask about it, so no
module compares an engine's name; an unknown starter fails loudly everywhere instead of falling into another's
launcher, an empty environment, "plain" on Slurm or an indexed Job. A new starter, added here as a fixture, is
one class (the one file it would touch, scalelab/core/launch.py) and every backend starts it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT
from scalelab.core import engines as engine_table
from scalelab.core import launch
from scalelab.core.errors import SpecError
from scalelab.core.launch import NodeLaunch, NodeVar, Site, Slot, Starter, launch_plan, rank_env
from scalelab.core.spec import EngineSpec, Spec


class EnvStarter(Starter):
    """A made-up way to start ranks: every node runs its ranks through `env RANK=...` one by one."""

    name, k8s_workload = "envrun", "indexed-job"

    def launches(self, spec, program, site, env, run_dir):
        nodes = [site.node_rank] if site.node_rank is not None else range(spec.nodes)
        var = lambda node: (NodeVar if isinstance(node, NodeVar) else str)(f"ENVRUN_NODE={node}")  # noqa: E731
        return [NodeLaunch(node, ["env", var(node), site.python, *program], env) for node in nodes]

    def engine_env(self, spec):
        return {"ENVRUN": "1"}

    def rank_env(self, slot, addr, port):
        return {"ENVRUN_RANK": str(slot.rank), "ENVRUN_AT": f"{addr}:{port}"}

    def slurm_setup(self, spec, python):
        return ["# envrun needs no rendezvous server", "SCALELAB_RDZV_PORT=4242"]


@pytest.fixture
def envrun(monkeypatch):
    """The new starter registered and an engine started by it (`ddp`'s class on the ranks)."""
    monkeypatch.setattr(launch, "STARTERS", dict(launch.STARTERS))
    launch.register(EnvStarter())
    monkeypatch.setitem(engine_table.ENGINE_TABLE, "ddp-env", engine_table.Engine("ddp-env", "envrun", "DDP via env"))
    monkeypatch.setattr(engine_table, "ENGINES", tuple(engine_table.ENGINE_TABLE))
    return Spec(engine=EngineSpec(name="ddp-env"), nodes=2, gpus_per_node=1, steps=10)


def test_a_new_starter_is_started_by_every_backend(envrun) -> None:
    spec = envrun
    plan = launch_plan(spec, "/runs/r", Site(python="py"))
    assert [p.argv[:3] for p in plan] == [["env", "ENVRUN_NODE=0", "py"], ["env", "ENVRUN_NODE=1", "py"]]
    assert plan[0].env == {"ENVRUN": "1"} and plan[0].argv[3:] == ["-m", "scalelab.train", "/runs/r"]
    assert rank_env("ddp-env", Slot(3, 4, 1, 2, 1, 2, "h"), "a", "9") == {"ENVRUN_RANK": "3", "ENVRUN_AT": "a:9"}
    from scalelab.slurm.options import SlurmOptions
    from scalelab.slurm.render import setup_lines

    lines = setup_lines(spec, SlurmOptions.parse({}), "py")
    assert "SCALELAB_RDZV_PORT=4242" in lines and not any("rendezvous --tasks-per-node" in x for x in lines)
    from scalelab.k8s.backend import KubernetesBackend

    request = KubernetesBackend({"image": "r/s:1"}).submit_dryrun(spec, Path("runs") / "x-1")
    assert [d["kind"] for d in request.objects] == ["ConfigMap", "Service", "Job"]
    command = " ".join(request.objects[-1]["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "env ENVRUN_NODE=$JOB_COMPLETION_INDEX" in command
    from scalelab.launcher.local import LocalBackend

    rendered = LocalBackend().submit_dryrun(spec, Path("/tmp/runs/x-DRYRUN")).render()
    assert "ENVRUN=1" in rendered and "ENVRUN_NODE=1" in rendered


def test_an_unknown_starter_fails_loudly_on_every_backend(monkeypatch) -> None:
    monkeypatch.setitem(engine_table.ENGINE_TABLE, "ddp-nope", engine_table.Engine("ddp-nope", "nope", "no starter"))
    spec = Spec(engine=EngineSpec(name="ddp-nope"), nodes=2, gpus_per_node=1, steps=10)
    said = "engine 'ddp-nope' is started by 'nope', which is no starter"
    from scalelab.k8s.backend import KubernetesBackend
    from scalelab.launcher.local import LocalBackend
    from scalelab.slurm.options import SlurmOptions
    from scalelab.slurm.render import setup_lines

    for call in (lambda: launch_plan(spec, "/r"), lambda: rank_env("ddp-nope", Slot(0, 1, 0, 1, 0, 1, "h"), "a", "1"),
                 lambda: setup_lines(spec, SlurmOptions.parse({}), "py"),
                 lambda: KubernetesBackend({"image": "r/s:1"}).submit_dryrun(spec, Path("runs") / "x-1"),
                 lambda: LocalBackend().submit_dryrun(spec, Path("/tmp/runs/x-DRYRUN"))):
        with pytest.raises(SpecError, match=said):
            call()


def test_a_starter_naming_no_kubernetes_workload_is_refused(envrun, monkeypatch) -> None:
    monkeypatch.setattr(EnvStarter, "k8s_workload", "daemonset")
    from scalelab.k8s.backend import KubernetesBackend

    with pytest.raises(SpecError, match="names Kubernetes workload 'daemonset', which scalelab/k8s/manifests.py does not"):
        KubernetesBackend({"image": "r/s:1"}).submit_dryrun(envrun, Path("runs") / "x-1")


def test_engines_carry_their_facts() -> None:
    e = engine_table.engine
    assert e("single").one_worker and not e("ddp").one_worker
    assert e("ddp").gradient_copy and e("ddp").exchange_in_backward and not e("horovod").exchange_in_backward
    assert e("horovod").compressions == ("fp16",) and e("ps").parameter_server
    assert launch.starter_of("horovod").needs_horovod and not launch.starter_of("ddp").needs_horovod
    assert {launch.starter_of(n).k8s_workload for n in engine_table.ENGINES} == {"indexed-job", "mpijob"}
    from scalelab.costs.memory import predict_peak
    from scalelab.core.presets import PRESETS

    ddp, single = (predict_peak(PRESETS["nmt-tiny"], 16, engine=n).peak_bytes for n in ("ddp", "single"))
    assert ddp > single  # the second gradient copy, asked of the engine, not of its name


# Where an engine's name may still be written: its own table, the trainer's classes and the benchmarks that
# name the engines they measure.
NAME_OWNERS = {"scalelab/core/engines.py", "scalelab/train/engines.py", "scalelab/train/bench.py",
               "scalelab/launcher/bench.py", "scalelab/launcher/gpucheck.py"}


def test_no_module_compares_an_engine_name() -> None:
    names = set(engine_table.ENGINES)
    found = []
    for path in (ROOT / "scalelab").rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        if rel in NAME_OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            consts = []
            if isinstance(node, ast.Compare):
                consts = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "startswith":
                consts = [a for a in node.args if isinstance(a, ast.Constant)]
            found += [f"{rel}:{node.lineno} {c.value!r}" for c in consts if c.value in names]
    assert not found, found
