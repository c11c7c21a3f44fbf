"""The Kubernetes backend's client side: create, follow status, read logs, delete, records back, errors.

No real Kubernetes API server can run on these machines (no container runtime, no kind/k3s/minikube,
no network beyond package registries), so these tests drive the real `kubernetes` Python client
against a small HTTP stand-in on 127.0.0.1 (tests/k8s_stub.py) that answers the few API paths the
backend uses with the real JSON shapes, reached through a kubeconfig each test writes. What the
stand-in cannot show -- the API server's admission and defaulting, the MPI Operator's reconciling,
scheduling, image pulls, real GPUs -- is covered by validating every manifest against the published
schemas (test_k8s_manifests.py) and is listed as untested in docs/k8s.md.

One test runs a whole DDP run through `launch` end to end: the stand-in's "kubelet" executes the very
commands the indexed Job's pods carry (torchrun, 2 nodes x 1 rank on this CPU), then `launch report`
reads the records that came back through the fetch pod's log.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import launch, only_run_dir, read_jsonl

from scalelab.core.errors import ScalelabError
from scalelab.core.net import free_port
from scalelab.core.spec import EngineSpec, Spec, save_spec
from scalelab.launcher.runner import Interrupted, cancel, wait

pytest.importorskip("kubernetes", reason="the `kubernetes` client is not installed (pip install kubernetes)")

from k8s_stub import LocalKubelet, StubCluster  # noqa: E402

from scalelab.k8s.backend import KubernetesBackend  # noqa: E402

RUN = "run-20260101-000000"


@pytest.fixture
def cluster():
    with StubCluster(namespaces=("default", "ml")) as c:
        yield c


def make(tmp_path: Path, cluster: StubCluster, engine: str = "ddp", nodes: int = 2, gpus: int = 1, **options):
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    backend = KubernetesBackend({"image": "registry.example.com/scalelab:1", "kubeconfig": str(kubeconfig),
                                 "poll_s": 0.05, **options})
    spec = Spec(backend="k8s", engine=EngineSpec(name=engine), nodes=nodes, gpus_per_node=gpus, steps=4, warmup_steps=1).validate()
    run_dir = tmp_path / RUN
    run_dir.mkdir()
    save_spec(spec, run_dir)
    return backend, spec, run_dir


def records_tar(files: dict[str, str]) -> str:
    """What the fetch pod prints: base64 of a gzip'd tar of records/."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"records/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def simulated_mpi_operator(records: dict[str, str], outcome: str = "Succeeded"):
    """on_create: an MPIJob gets a launcher and workers that log and finish; the fetch pod prints `records`."""

    def on_create(cluster: StubCluster, plural: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        if plural == "mpijobs":
            for role, replica in obj["spec"]["mpiReplicaSpecs"].items():
                for i in range(replica["replicas"]):
                    pod = f"{name}-{role.lower()}" + (f"-{i}" if role == "Worker" else "-abcde")
                    labels = replica["template"]["metadata"]["labels"]
                    cluster.add_pod(pod, labels, outcome, log=f"{role} {i} says hello\n", owner=obj)
            obj["status"] = {"conditions": [{"type": "Created", "status": "True"},
                                            {"type": outcome, "status": "True", "reason": f"MPIJob{outcome}",
                                             "message": "launcher exited" if outcome == "Failed" else ""}]}
        elif plural == "pods" and name.endswith("-fetch"):
            obj["status"] = {"phase": "Succeeded"}
            cluster.logs[name] = records_tar(records) + "\n"

    return on_create


# ---- the happy paths ---------------------------------------------------------------------------------


def test_horovod_mpijob_create_follow_logs_and_records_back(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster, engine="horovod", nodes=2, gpus=4)
    records = {"rank-0.jsonl": '{"kind": "step", "step": 1}\n', "rank-7.jsonl": '{"kind": "step", "step": 1}\n'}
    cluster.on_create = simulated_mpi_operator(records)
    backend.schedule(backend.submit_dryrun(spec, run_dir))
    assert cluster.names("configmaps") == [f"{RUN}-spec"] and cluster.names("mpijobs") == [RUN]
    # the ConfigMap belongs to the MPIJob: deleting the MPIJob (or its TTL) removes it
    owner = cluster.get("configmaps", f"{RUN}-spec")["metadata"]["ownerReferences"][0]
    assert owner["uid"] == cluster.get("mpijobs", RUN)["metadata"]["uid"] and owner["kind"] == "MPIJob"
    status = wait(backend, run_dir)
    assert status.state == "COMPLETED"
    for name, text in records.items():
        assert (run_dir / "records" / name).read_text() == text
    assert "Launcher 0 says hello" in (run_dir / "logs" / f"{RUN}-launcher-abcde.log").read_text()
    assert cluster.names("pods").count(f"{RUN}-fetch") == 0, "the fetch pod must be deleted"
    assert cluster.names("mpijobs") == cluster.names("configmaps") == [], "finish deletes the run's objects"
    info = json.loads((run_dir / "launch.json").read_text())
    assert info["state"] == "COMPLETED" and info["workload"] == ["MPIJob", RUN]
    assert backend.status(run_dir).state == "COMPLETED"
    logs = backend.logs(run_dir)
    assert "Worker 1 says hello" in logs and "Launcher 0 says hello" in logs


def test_failed_mpijob_reports_failed_with_the_operator_reason(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster, engine="horovod")
    cluster.on_create = simulated_mpi_operator({"rank-0.jsonl": ""}, outcome="Failed")
    backend.schedule(backend.submit_dryrun(spec, run_dir))
    status = wait(backend, run_dir)
    assert status.state == "FAILED" and "MPIJobFailed" in status.detail
    assert cluster.names("mpijobs") == []


def test_status_shows_pod_phases_while_running(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster)
    backend.schedule(backend.submit_dryrun(spec, run_dir))
    job = cluster.get("jobs", RUN)
    labels = job["spec"]["template"]["metadata"]["labels"]
    cluster.add_pod(f"{RUN}-0-aaaaa", labels, "Running", log="node 0 training\n")
    cluster.add_pod(f"{RUN}-1-bbbbb", labels, "Pending")
    job["status"] = {"active": 2}
    status = backend.status(run_dir)
    assert status.state == "RUNNING"
    assert f"{RUN}-0-aaaaa Running" in status.detail and f"{RUN}-1-bbbbb Pending" in status.detail
    assert "node 0 training" in backend.logs(run_dir)
    job["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too slow"}]}
    assert backend.status(run_dir).state == "FAILED" and "DeadlineExceeded" in backend.status(run_dir).detail


def test_cancel_deletes_everything_with_foreground_propagation(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster)
    backend.schedule(backend.submit_dryrun(spec, run_dir))
    job = cluster.get("jobs", RUN)
    cluster.add_pod(f"{RUN}-0-aaaaa", job["spec"]["template"]["metadata"]["labels"], "Running", log="step 3\n", owner=job)
    cancel(backend, run_dir)  # what `launch cancel` does
    deletes = [path for method, path in cluster.requests if method == "DELETE"]
    assert f"/apis/batch/v1/namespaces/default/jobs/{RUN}?propagationPolicy=Foreground" in deletes
    assert cluster.names("jobs") == cluster.names("services") == cluster.names("configmaps") == cluster.names("pods") == []
    assert backend.status(run_dir).state == "CANCELLED"
    assert "step 3" in (run_dir / "logs" / f"{RUN}-0-aaaaa.log").read_text(), "logs are kept before the pods go"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_follow_loop_deletes_everything(tmp_path: Path, cluster: StubCluster, sig) -> None:
    """SIGTERM or SIGHUP to the launcher while it follows: the run's objects go, its state is CANCELLED."""
    backend, spec, run_dir = make(tmp_path, cluster)
    backend.schedule(backend.submit_dryrun(spec, run_dir))
    job = cluster.get("jobs", RUN)
    cluster.add_pod(f"{RUN}-0-aaaaa", job["spec"]["template"]["metadata"]["labels"], "Running", log="step 7\n", owner=job)
    job["status"] = {"active": 1}
    ticks = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) == 3:
            os.kill(os.getpid(), sig)

    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as stopped:
        wait(backend, run_dir, on_tick=tick)
    assert signal.getsignal(sig) is before, "the launcher's own handlers are restored"
    assert stopped.value.signum == sig and stopped.value.exit_code == 128 + sig
    assert cluster.names("jobs") == cluster.names("services") == cluster.names("configmaps") == cluster.names("pods") == []
    info = json.loads((run_dir / "launch.json").read_text())
    assert info["state"] == "CANCELLED" and signal.Signals(sig).name in info["detail"] and info["ended"]
    assert "step 7" in (run_dir / "logs" / f"{RUN}-0-aaaaa.log").read_text(), "logs are kept before the pods go"


def test_resubmitting_a_finished_run_replaces_its_objects(tmp_path: Path, cluster: StubCluster) -> None:
    """`launch resume RUN_DIR` on Kubernetes: same names, same volume directory (the checkpoint is there)."""
    backend, spec, run_dir = make(tmp_path, cluster)
    backend.schedule(backend.submit_dryrun(spec, run_dir))
    first_uid = cluster.get("jobs", RUN)["metadata"]["uid"]
    with pytest.raises(ScalelabError, match="still running on the cluster.*launch cancel"):
        cluster.get("jobs", RUN)["status"] = {"active": 1}
        cluster.add_pod(f"{RUN}-0-aaaaa", {"scalelab.io/run": RUN, "scalelab.io/role": "worker"}, "Running")
        backend.schedule(backend.submit_dryrun(spec, run_dir))
    cluster.get("jobs", RUN)["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    backend.schedule(backend.submit_dryrun(spec, run_dir))
    assert cluster.names("jobs") == [RUN] and cluster.get("jobs", RUN)["metadata"]["uid"] != first_uid
    assert cluster.names("configmaps") == [f"{RUN}-spec"] and cluster.names("services") == [RUN]


# ---- errors: one clear message each, nothing half-created -------------------------------------------


@pytest.mark.parametrize("failing", ["services", "jobs"])
def test_a_failed_create_deletes_what_was_created(tmp_path: Path, cluster: StubCluster, failing: str) -> None:
    backend, spec, run_dir = make(tmp_path, cluster)
    cluster.fail[("POST", failing)] = (500, "InternalError")
    with pytest.raises(ScalelabError, match=f"create {'Service' if failing == 'services' else 'Job'} .*500"):
        backend.schedule(backend.submit_dryrun(spec, run_dir))
    assert cluster.names("configmaps") == cluster.names("services") == cluster.names("jobs") == []
    assert any(m == "DELETE" and "/configmaps/" in p for m, p in cluster.requests)
    assert not (run_dir / "launch.json").exists()


def test_a_failed_mpijob_create_deletes_the_configmap(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster, engine="horovod")
    cluster.fail[("POST", "mpijobs")] = (403, "Forbidden")
    with pytest.raises(ScalelabError, match="refused it .403.*RBAC"):
        backend.schedule(backend.submit_dryrun(spec, run_dir))
    assert cluster.names("configmaps") == [] and cluster.names("mpijobs") == []


def test_mpi_operator_missing_is_detected_before_creating_anything(tmp_path: Path) -> None:
    with StubCluster(mpi_operator=False) as cluster:
        backend, spec, run_dir = make(tmp_path, cluster, engine="horovod")
        with pytest.raises(ScalelabError, match="MPI Operator is not installed.*kubectl apply --server-side -f .*mpi-operator"):
            backend.schedule(backend.submit_dryrun(spec, run_dir))
        assert cluster.created() == []


def test_missing_namespace(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster, namespace="nope")
    with pytest.raises(ScalelabError, match="namespace 'nope' does not exist.*kubectl create namespace nope"):
        backend.schedule(backend.submit_dryrun(spec, run_dir))
    assert cluster.created() == []


def test_missing_volume_claim(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster, volume_claim="other")
    with pytest.raises(ScalelabError, match="PersistentVolumeClaim 'other' does not exist"):
        backend.schedule(backend.submit_dryrun(spec, run_dir))
    assert cluster.created() == []


def test_image_that_cannot_be_pulled_fails_clearly_and_cleans_up(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster)

    def kubelet(c: StubCluster, plural: str, obj: dict) -> None:
        if plural == "jobs":
            c.add_pod(f"{RUN}-0-aaaaa", obj["spec"]["template"]["metadata"]["labels"], "Pending",
                      waiting="ImagePullBackOff", owner=obj)

    cluster.on_create = kubelet
    backend.schedule(backend.submit_dryrun(spec, run_dir))
    with pytest.raises(ScalelabError, match="cannot be pulled.*ImagePullBackOff.*--image-pull-secret"):
        wait(backend, run_dir)
    assert cluster.names("jobs") == cluster.names("services") == cluster.names("configmaps") == cluster.names("pods") == []
    assert backend.status(run_dir).state == "FAILED"


def test_no_kubeconfig(tmp_path: Path) -> None:
    backend = KubernetesBackend({"image": "x", "kubeconfig": str(tmp_path / "missing")})
    spec = Spec(backend="k8s").validate()
    with pytest.raises(ScalelabError, match="no kubeconfig at .*missing.*--kubeconfig"):
        backend.schedule(backend.submit_dryrun(spec, tmp_path / RUN))


def test_unknown_context(tmp_path: Path, cluster: StubCluster) -> None:
    backend, spec, run_dir = make(tmp_path, cluster, context="prod")
    with pytest.raises(ScalelabError, match="context 'prod'"):
        backend.schedule(backend.submit_dryrun(spec, run_dir))


def test_unreachable_api_server(tmp_path: Path) -> None:
    cluster = StubCluster()  # never started; its port is taken back below, so nothing listens there
    port = free_port()
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    kubeconfig.write_text(kubeconfig.read_text().replace(cluster.url, f"http://127.0.0.1:{port}"))
    cluster._server.server_close()
    backend = KubernetesBackend({"image": "x", "kubeconfig": str(kubeconfig)})
    with pytest.raises(ScalelabError, match=f"cannot reach the Kubernetes API server at http://127.0.0.1:{port}"):
        backend.schedule(backend.submit_dryrun(Spec(backend="k8s").validate(), tmp_path / RUN))


@pytest.mark.slow
def test_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    with StubCluster(mpi_operator=False) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        out = launch("--backend", "k8s", "--engine", "horovod", "--gpus-per-node", "2", "--image", "img:1",
                     "--kubeconfig", str(kubeconfig), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "MPI Operator is not installed" in out.stderr and "Traceback" not in out.stderr
    assert cluster.created() == []


# ---- end to end through `launch` ----------------------------------------------------------------------


@pytest.mark.slow
def test_ddp_run_end_to_end_through_the_cli(tmp_path: Path, cluster: StubCluster) -> None:
    """The indexed Job's own commands run (torchrun, 2 nodes), records come back, `launch report` reads them."""
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    runs = tmp_path / "runs"
    volume = tmp_path / "volume"
    # pod 0's DNS name (<job>-0.<service>) is resolved by the "cluster DNS" to this machine
    kubelet = LocalKubelet(volume, "/scalelab/runs", dns={}, python=sys.executable)
    cluster.on_create = lambda c, plural, obj: (
        kubelet.dns.update({e["value"]: "127.0.0.1" for e in obj["spec"]["template"]["spec"]["containers"][0]["env"]
                            if e["name"] == "MASTER_ADDR"}) if plural == "jobs" else None, kubelet(c, plural, obj))
    out = launch("--backend", "k8s", "--engine", "ddp", "--nodes", "2", "--gpus-per-node", "1", "--steps", "6",
                 "--warmup-steps", "1", "--image", "registry.example.com/scalelab:1", "--kubeconfig", str(kubeconfig),
                 "--backend-opt", "poll_s=0.5", "--backend-opt", "cpus_per_node=1",
                 "--backend-opt", f"master_port={free_port()}", "--runs-dir", str(runs), cwd=tmp_path)
    kubelet.join()
    assert out.returncode == 0, out.stderr + out.stdout
    run_dir = only_run_dir(runs)
    steps = [r for r in read_jsonl(run_dir / "records" / "rank-1.jsonl") if r["kind"] == "step"]
    assert len(steps) == 6
    assert (run_dir / "summary.json").exists()
    name = json.loads((run_dir / "launch.json").read_text())["name"]
    assert (volume / name / "spec.json").read_text() == (run_dir / "spec.json").read_text()
    report = launch("report", str(run_dir), "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    status = launch("status", str(run_dir), cwd=tmp_path)
    assert "COMPLETED" in status.stdout
    logs = launch("logs", str(run_dir), cwd=tmp_path)
    assert logs.returncode == 0 and f"{name}-0-x0" in logs.stdout
    assert cluster.names("pods").count(f"{name}-fetch") == 0
