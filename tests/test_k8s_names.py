"""The names of a Kubernetes run's objects and of its directory on the runs volume (RUN_DIR there).

A sweep's layout directories are named by their layout alone (`1x1`, `1x2`); named from that alone, the layouts of
every sweep in a namespace shared their objects' names and one directory on the volume: a second sweep's create was
refused while the first's objects lived (their TTL is a day), and later its ranks found the earlier sweep's
checkpoint and records there and resumed from them. The names carry the sweep's (timestamped) name, as AWS's run
ids do, and stay the same for a run directory, so `launch resume` finds its own objects and checkpoint again.

No API server can run here: the names are read from the rendered manifests, and the creates go through the real
`kubernetes` client to the stand-in of tests/k8s_stub.py, which refuses a name already taken (409) as one would.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import launch

from scalelab.core.rundir import SWEEP_FILE, write_json
from scalelab.core.spec import EngineSpec, Spec, save_spec
from scalelab.k8s.backend import KubernetesBackend
from scalelab.k8s.manifests import k8s_name

DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def make_sweep(runs: Path, name: str, layouts=("1x1", "1x2")) -> list[Path]:
    """A sweep directory as `run_sweep` leaves it before its first layout runs: sweep.json and each layout's spec."""
    sweep = runs / name
    out = []
    for layout in layouts:
        nodes, gpus = map(int, layout.split("x"))
        spec = Spec(backend="k8s", engine=EngineSpec(name="ddp"), nodes=nodes, gpus_per_node=gpus, steps=4,
                    warmup_steps=1).validate()
        (sweep / layout).mkdir(parents=True)
        save_spec(spec, sweep / layout)
        out.append(sweep / layout)
    write_json(sweep / SWEEP_FILE, {"runs": list(layouts), "layouts": [list(map(int, x.split("x"))) for x in layouts]})
    return out


def spec_of(run_dir: Path) -> Spec:
    return Spec.from_dict(json.loads((run_dir / "spec.json").read_text())).validate(stored=True)


def pod_run_dirs(request) -> set[str]:
    """Every RUN_DIR the request's pods use on the volume (the trainer's argument, the fetch pod's `cd`)."""
    return set(re.findall(r"/scalelab/runs/[^/\s'\"]+", yaml.safe_dump([*request.objects, request.fetch])))


def test_layouts_of_two_sweeps_have_their_own_names_and_volume_directories(tmp_path: Path) -> None:
    backend = KubernetesBackend({"image": "r/i:1"})
    first = make_sweep(tmp_path, "mysweep-20260101-120000")
    second = make_sweep(tmp_path, "mysweep-20260101-130000")
    names = {}
    for run_dir in [*first, *second]:
        request = backend.submit_dryrun(spec_of(run_dir), run_dir)
        assert DNS_LABEL.fullmatch(request.name) and len(request.name) <= 40
        assert pod_run_dirs(request) == {f"/scalelab/runs/{request.name}"}
        names[run_dir] = request.name
    assert names[first[0]] == "mysweep-20260101-120000-1x1" and names[second[0]] == "mysweep-20260101-130000-1x1"
    assert len(set(names.values())) == 4, names
    # `continue_sweep` and the sweep's dry run name the sweep (`for_sweep`); the same names either way
    assert backend.for_sweep(first[1].parent.name).submit_dryrun(spec_of(first[1]), first[1]).name == names[first[1]]


def test_a_long_sweep_name_is_cut_to_a_dns_label_that_keeps_its_layout(tmp_path: Path) -> None:
    backend = KubernetesBackend({"image": "r/i:1"})
    sweep = "sweep-rnnlm-small-horovod-strong-scaling-20260101-120000"
    a, b = make_sweep(tmp_path, sweep, ("1x1", "1x2"))
    (c,) = make_sweep(tmp_path, sweep.replace("120000", "120001"), ("1x1",))
    names = [backend.submit_dryrun(spec_of(d), d).name for d in (a, b, c)]
    for name in names:
        assert DNS_LABEL.fullmatch(name) and len(name) <= 40, name
    assert names[0].endswith("-1x1") and names[1].endswith("-1x2") and names[2].endswith("-1x1")
    assert len(set(names)) == 3, names  # the hash tells two sweeps a second apart from each other
    assert k8s_name("sweep-x-1x2", keep="1x2") == "sweep-x-1x2", "a short name is not cut"


def test_the_sweep_dry_run_names_its_layouts_after_the_sweep(tmp_path: Path) -> None:
    out = launch("sweep", "--backend", "k8s", "--image", "r/i:1", "--workers", "1,2", "--global-batch", "16",
                 "--name", "mysweep", "--runs-dir", str(tmp_path / "runs"), "--dry-run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Job"}
    assert names == {"mysweep-dryrun-1x1", "mysweep-dryrun-1x2"}, names  # the sweep's --name, DRYRUN for its time
    assert "/scalelab/runs/run-1x" not in out.stdout


pytest.importorskip("kubernetes", reason="the `kubernetes` client is not installed (pip install kubernetes)")
from k8s_stub import StubCluster  # noqa: E402


@pytest.fixture
def cluster():
    with StubCluster() as c:
        yield c


def test_a_second_sweep_in_the_namespace_is_created_beside_the_first(tmp_path: Path, cluster: StubCluster) -> None:
    """The first sweep's objects still exist (within their TTL): the second's creates are not refused as taken."""
    backend = KubernetesBackend({"image": "r/i:1", "kubeconfig": str(cluster.write_kubeconfig(tmp_path / "kc"))})
    (first,) = make_sweep(tmp_path / "runs", "mysweep-20260101-120000", ("1x1",))
    (second,) = make_sweep(tmp_path / "runs", "mysweep-20260101-130000", ("1x1",))
    for run_dir in (first, second):
        backend.for_sweep(run_dir.parent.name).schedule(backend.submit_dryrun(spec_of(run_dir), run_dir))
    assert sorted(cluster.names("jobs")) == ["mysweep-20260101-120000-1x1", "mysweep-20260101-130000-1x1"]


def test_a_resumed_layout_keeps_its_names(tmp_path: Path, cluster: StubCluster) -> None:
    """`launch resume` of the sweep (`for_sweep`) or of the layout alone: the names its launch recorded, so the
    ranks find its checkpoint in the same directory on the volume; a layout launched by the version that named it
    `run-1x1` keeps that name (its checkpoint is there)."""
    backend = KubernetesBackend({"image": "r/i:1", "kubeconfig": str(cluster.write_kubeconfig(tmp_path / "kc"))})
    layout, old = make_sweep(tmp_path / "runs", "mysweep-20260101-120000", ("1x1", "1x2"))
    request = backend.for_sweep(layout.parent.name).submit_dryrun(spec_of(layout), layout)
    backend.schedule(request)
    recorded = json.loads((layout / "launch.json").read_text())["name"]
    assert recorded == request.name == "mysweep-20260101-120000-1x1"
    cluster.get("jobs", recorded)["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    for again in (backend, backend.for_sweep(layout.parent.name)):
        resumed = again.submit_dryrun(spec_of(layout), layout)
        assert resumed.name == recorded and pod_run_dirs(resumed) == {f"/scalelab/runs/{recorded}"}
    backend.schedule(backend.submit_dryrun(spec_of(layout), layout))
    assert cluster.names("jobs") == [recorded]
    # launched before the names carried the sweep's: launch.json says run-1x2, and so the volume directory is that
    write_json(old / "launch.json", {"backend": "k8s", "name": "run-1x2", "namespace": "default",
                                     "objects": [["Job", "run-1x2"]], "workload": ["Job", "run-1x2"],
                                     "fetch": {"metadata": {"name": "run-1x2-fetch"}}, "state": "FAILED",
                                     "run_dir": str(old.absolute())})
    assert pod_run_dirs(backend.submit_dryrun(spec_of(old), old)) == {"/scalelab/runs/run-1x2"}
