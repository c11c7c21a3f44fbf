"""Kubernetes manifests: golden files for both engines and several layouts, validated against the real
published schemas (the Kubernetes OpenAPI schemas shipped by `kubernetes-validate`, strict mode; the MPI
Operator's MPIJob CRD shipped in scalelab/k8s/schemas/), plus the properties the issue asks for.

Regenerate the golden files after an intended change with `SCALELAB_UPDATE_GOLDEN=1 pytest tests/test_k8s_manifests.py`
and review the diff.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import launch

from scalelab.core.errors import SpecError
from scalelab.core.spec import EngineSpec, Spec
from scalelab.k8s.backend import KubernetesBackend
from scalelab.k8s.manifests import k8s_name

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install kubernetes-validate): "
    "it ships the Kubernetes OpenAPI schemas the manifests are validated against")
from scalelab.k8s.validate import ManifestInvalid, validate_all, validate_doc  # noqa: E402
from tests.conftest import assert_golden

GOLDEN = Path(__file__).parent / "golden" / "k8s"
FULL_OPTIONS = {
    "namespace": "ml-team", "service_account": "trainer", "node_selector": ["nvidia.com/gpu.product=A100-SXM4-80GB"],
    "tolerations": ["nvidia.com/gpu:NoSchedule", "dedicated=ml:NoExecute"], "priority_class": "training-high",
    "image_pull_secrets": ["regcred"], "secret_env": ["WANDB_API_KEY=wandb:api-key"], "volume_claim": "ml-runs",
    "timeout_min": 120, "cpus_per_node": 32, "mem_gb_per_node": 240, "shm_gb": 16,
}
CASES = {
    # name: (engine, nodes, gpus per node, extra options)
    "ddp-1x1": ("ddp", 1, 1, {}),
    "ddp-2x4-full": ("ddp", 2, 4, FULL_OPTIONS),
    "horovod-1x8": ("horovod", 1, 8, {}),
    "horovod-4x4-full": ("horovod", 4, 4, FULL_OPTIONS),
    # 2 workers and a parameter-server rank per pod: --nproc-per-node=3, two GPUs
    "ps-separate-2x2": ({"name": "ps", "ps_placement": "separate"}, 2, 2, {}),
}


def request_for(case: str):
    engine, nodes, gpus, extra = CASES[case]
    engine = EngineSpec(**engine) if isinstance(engine, dict) else EngineSpec(name=engine)
    spec = Spec(backend="k8s", engine=engine, nodes=nodes, gpus_per_node=gpus,
                batch_per_worker=32, steps=100).validate()
    backend = KubernetesBackend({"image": "registry.example.com/scalelab:0.1.0", **extra})
    return spec, backend.submit_dryrun(spec, Path("runs") / f"{case}-20260101-000000")


def all_docs(request) -> list[dict]:
    return [*request.objects, request.fetch]


def containers(doc: dict) -> list[dict]:
    if doc["kind"] == "MPIJob":
        return [c for r in doc["spec"]["mpiReplicaSpecs"].values() for c in r["template"]["spec"]["containers"]]
    if doc["kind"] == "Job":
        return doc["spec"]["template"]["spec"]["containers"]
    if doc["kind"] == "Pod":
        return doc["spec"]["containers"]
    return []


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_manifest(case: str) -> None:
    request = request_for(case)[1]
    # spec.json follows every new Spec field; test_configmap_carries_the_exact_spec checks it instead
    request.objects[0]["data"]["spec.json"] = "(the resolved spec: RUN_DIR/spec.json)\n"
    assert_golden(GOLDEN / f"{case}.yaml", request.render())


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_manifest_validates_against_the_published_schemas(case: str) -> None:
    _, request = request_for(case)
    validate_all(all_docs(request))
    kinds = [d["kind"] for d in request.objects]
    assert kinds == (["ConfigMap", "MPIJob"] if case.startswith("horovod") else ["ConfigMap", "Service", "Job"])


def test_validation_rejects_what_an_api_server_would() -> None:
    _, hvd = request_for("horovod-4x4-full")
    mpijob = copy.deepcopy(hvd.objects[-1])
    mpijob["spec"]["slotsPerNode"] = 4  # a typo the API server would prune silently
    with pytest.raises(ManifestInvalid, match="slotsPerNode"):
        validate_doc(mpijob)
    mpijob = copy.deepcopy(hvd.objects[-1])
    mpijob["spec"]["mpiImplementation"] = "MVAPICH"
    with pytest.raises(ManifestInvalid, match="mpiImplementation"):
        validate_doc(mpijob)
    mpijob = copy.deepcopy(hvd.objects[-1])
    mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = False
    with pytest.raises(ManifestInvalid, match="privilegd"):
        validate_doc(mpijob)
    _, ddp = request_for("ddp-2x4-full")
    job = copy.deepcopy(ddp.objects[-1])
    job["spec"]["parallelism"] = "2"
    with pytest.raises(ManifestInvalid, match="parallelism"):
        validate_doc(job)
    service = copy.deepcopy(ddp.objects[1])
    service["spec"]["headless"] = True
    with pytest.raises(ManifestInvalid):
        validate_doc(service)


def test_validation_rejects_a_container_that_is_not_locked_down_or_guaranteed() -> None:
    """No schema asks for these, docs/k8s.md promises them of every container: `validate_doc` checks them, so a
    container added without them (the --script init container was) fails the tests that validate manifests."""
    _, hvd = request_for("horovod-1x8")
    _, ddp = request_for("ddp-1x1")
    worker = lambda d: d["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]  # noqa: E731
    job_container = lambda d: d["spec"]["template"]["spec"]["containers"][0]  # noqa: E731
    for doc, container, change, problem in [
        (hvd.objects[-1], worker, lambda c: c["securityContext"]["capabilities"].update(drop=[]), "capabilities.drop"),
        (hvd.objects[-1], worker, lambda c: c["securityContext"].update(allowPrivilegeEscalation=True), "Escalation"),
        (ddp.objects[-1], job_container, lambda c: c["resources"]["limits"].pop("cpu"), "needs a cpu limit"),
        (ddp.objects[-1], job_container, lambda c: c["resources"]["requests"].update(cpu="1"),
         "cpu limit, and a request"),
        (ddp.fetch, lambda d: d["spec"]["containers"][0], lambda c: c.pop("securityContext"), "container fetch needs"),
    ]:
        changed = copy.deepcopy(doc)
        change(container(changed))
        with pytest.raises(ManifestInvalid, match=problem):
            validate_doc(changed)
    pod = copy.deepcopy(ddp.fetch)
    pod["spec"]["securityContext"].pop("seccompProfile")
    with pytest.raises(ManifestInvalid, match="seccompProfile"):
        validate_doc(pod)


@pytest.mark.parametrize("case", ["horovod-1x8", "horovod-4x4-full"])
def test_mpijob_layout(case: str) -> None:
    spec, request = request_for(case)
    job = request.objects[-1]["spec"]
    assert job["slotsPerWorker"] == spec.gpus_per_node
    assert job["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert job["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1
    assert job["mpiReplicaSpecs"]["Worker"]["replicas"] == spec.nodes
    assert {"cleanPodPolicy", "ttlSecondsAfterFinished", "backoffLimit"} <= set(job["runPolicy"])
    worker = job["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == str(spec.gpus_per_node)
    launcher = job["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in launcher["resources"]["limits"]
    script = launcher["command"][-1]
    assert f"mpirun -np {spec.workers} " in script and script.endswith(f"python -m scalelab.train /scalelab/runs/{request.name}")
    assert f"cp /etc/scalelab/spec.json /scalelab/runs/{request.name}/" in script


@pytest.mark.parametrize("case", ["ddp-1x1", "ddp-2x4-full"])
def test_indexed_job_layout(case: str) -> None:
    spec, request = request_for(case)
    service, job = request.objects[1], request.objects[2]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    js = job["spec"]
    assert (js["completionMode"], js["completions"], js["parallelism"]) == ("Indexed", spec.nodes, spec.nodes)
    pod = js["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= js["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    script = container["command"][-1]
    for arg in (f"--nnodes={spec.nodes}", f"--nproc-per-node={spec.gpus_per_node}", "--node-rank=$JOB_COMPLETION_INDEX "):
        assert arg in script
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(spec.gpus_per_node)


@pytest.mark.parametrize("engine", ["ddp", "horovod"])
def test_device_cpu_asks_for_no_gpus(engine: str, tmp_path: Path) -> None:
    """`--device cpu`: no pod asks for `nvidia.com/gpu` (on a cluster without GPUs, kind included, such pods never
    schedule); `--gpus-per-node` still counts the ranks of each pod. The review's command, through `launch`."""
    out = launch("--backend", "k8s", "--image", "r/i:1", "--engine", engine, "--device", "cpu", "--nodes", "2",
                 "--gpus-per-node", "2", "--dry-run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    validate_all(docs)
    assert "nvidia.com/gpu" not in out.stdout
    workload = docs[-2]  # the fetch pod is last
    if engine == "horovod":
        launcher = workload["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        assert workload["spec"]["slotsPerWorker"] == 2 and "mpirun -np 4 " in launcher["command"][-1]
    else:
        assert "--nproc-per-node=2" in workload["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    gpu = launch("--backend", "k8s", "--image", "r/i:1", "--engine", engine, "--nodes", "2", "--gpus-per-node", "2",
                 "--dry-run", cwd=tmp_path)
    assert "nvidia.com/gpu: '2'" in gpu.stdout, "the GPUs are asked for on the default device (auto)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_pods_are_locked_down(case: str) -> None:
    _, request = request_for(case)
    for doc in all_docs(request):
        for c in containers(doc):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]
            assert c["resources"]["requests"] == c["resources"]["limits"]


def test_options_reach_every_pod() -> None:
    _, request = request_for("horovod-4x4-full")
    templates = [r["template"]["spec"] for r in request.objects[-1]["spec"]["mpiReplicaSpecs"].values()]
    for pod in templates:
        assert pod["serviceAccountName"] == "trainer" and pod["priorityClassName"] == "training-high"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "A100-SXM4-80GB"}
        assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"} in pod["tolerations"]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert {"name": "runs", "persistentVolumeClaim": {"claimName": "ml-runs"}} in pod["volumes"]
    assert all(d["metadata"]["namespace"] == "ml-team" for d in all_docs(request))


def test_secrets_are_references_never_literals() -> None:
    _, request = request_for("ddp-2x4-full")
    for c in containers(request.objects[-1]):
        (wandb,) = [e for e in c["env"] if e["name"] == "WANDB_API_KEY"]
        assert wandb == {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
    with pytest.raises(SpecError, match="ENV_NAME=SECRET_NAME:KEY"):
        KubernetesBackend({"image": "x", "secret_env": ["WANDB_API_KEY=abc123"]})


def test_configmap_carries_the_exact_spec() -> None:
    spec, request = request_for("ddp-2x4-full")
    assert request.objects[0]["data"]["spec.json"] == spec.to_json() + "\n"
    assert Spec.from_dict(json.loads(request.objects[0]["data"]["spec.json"])) == spec


def test_names_are_dns_labels_and_distinct() -> None:
    a = k8s_name("rnnlm-small-horovod-16x8-20260101-000000-with-a-long-suffix_A")
    b = k8s_name("rnnlm-small-horovod-16x8-20260101-000000-with-a-long-suffix_B")
    assert a != b and len(a) <= 40 and len(b) <= 40
    assert all(ch.isalnum() and ch.islower() or ch.isdigit() or ch == "-" for ch in a)
    assert k8s_name("2x4.Run") == "run-2x4-run"


def test_bad_options_fail_at_configuration_time() -> None:
    with pytest.raises(SpecError, match="valid options: .*image"):
        KubernetesBackend({"imagee": "x"})
    with pytest.raises(SpecError, match="effect must be one of"):
        KubernetesBackend({"image": "x", "tolerations": ["gpu:Sometimes"]})
    with pytest.raises(SpecError, match="run_as_user must not be 0"):
        KubernetesBackend({"image": "x", "run_as_user": 0})
    with pytest.raises(SpecError, match="--image is required"):
        KubernetesBackend({}).validate(Spec(backend="k8s").validate())


@pytest.mark.parametrize("args, says", [
    (["--service-account", "Bad_SA"], r"service_account \(--service-account\) must be a DNS subdomain name"),
    (["--priority-class", "Bad_PC"], r"priority_class \(--priority-class\) must be a DNS subdomain name"),
    (["--image-pull-secret", "Reg_Cred"], r"image_pull_secrets \(--image-pull-secret\) must be a DNS subdomain name"),
    (["--backend-opt", "shm_gb=64"], "shm_gb 64 is not less than mem_gb_per_node 32: /dev/shm is memory-backed.*"
                                     "raise --backend-opt mem_gb_per_node above 64"),
])
def test_values_the_api_server_or_the_kubelet_would_refuse_are_one_line_before_anything(
        args: list[str], says: str, tmp_path: Path) -> None:
    """Names the API server refuses (a service account, PriorityClass or Secret is a DNS subdomain), as the
    namespace and claim already were; and a memory-backed /dev/shm as big as the pod's memory limit, which it counts
    against (the ranks would be killed for memory): one line, exit 2, nothing printed on stdout."""
    out = launch("--backend", "k8s", "--image", "r/i:1", *args, "--dry-run", cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and re.search(says, lines[0]), out.stderr
    assert "Traceback" not in out.stderr and not out.stdout.strip()


def test_valid_names_and_a_shm_within_the_memory_reach_the_pods(tmp_path: Path) -> None:
    out = launch("--backend", "k8s", "--image", "r/i:1", "--service-account", "trainer.ml-team", "--priority-class",
                 "training-high", "--backend-opt", "shm_gb=64", "--backend-opt", "mem_gb_per_node=96", "--dry-run",
                 cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    pod = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Job"][0]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer.ml-team" and pod["priorityClassName"] == "training-high"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]


def test_dry_run_prints_the_manifests_and_calls_nothing(tmp_path: Path) -> None:
    # a kubeconfig pointing at a closed port: any API call would fail loudly
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                                      "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:9"}}],
                                      "users": [{"name": "u", "user": {}}],
                                      "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    out = launch("--backend", "k8s", "--engine", "horovod", "--nodes", "2", "--gpus-per-node", "4", "--image", "img:1",
                 "--kubeconfig", str(kubeconfig), "--runs-dir", str(tmp_path / "runs"), "--dry-run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "MPIJob", "Pod"]
    validate_all(docs)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_k8s_flags_belong_to_the_k8s_backend(tmp_path: Path) -> None:
    out = launch("--backend", "local", "--image", "img:1", "--dry-run", cwd=tmp_path)
    assert out.returncode == 2 and "--image is an option of --backend k8s" in out.stderr


@pytest.mark.parametrize("item, part", [
    ("1WANDB=wandb:api-key", "ENV_NAME '1WANDB'"),
    ("WANDB KEY=wandb:api-key", "ENV_NAME 'WANDB KEY'"),
    ("WANDB_API_KEY=Wandb_Secret:api-key", "SECRET_NAME 'Wandb_Secret' must be a DNS subdomain"),
    ("WANDB_API_KEY=wandb:api/key", "KEY 'api/key'"),
])
def test_secret_env_parts_are_checked_as_the_api_server_would(item: str, part: str) -> None:
    """Each part of `--secret-env` is one line before anything is rendered, naming the part (the pods' env was
    otherwise refused by the API server with a 422 after the ConfigMap had been created)."""
    with pytest.raises(SpecError, match=re.escape(part)):
        KubernetesBackend({"image": "x", "secret_env": [item]})
    KubernetesBackend({"image": "x", "secret_env": ["wandb.api-key_2=wandb.team:api-key.v2"]})
