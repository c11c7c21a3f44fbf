"""Kubernetes manifests for one run, rendered as a pure function of (spec, run directory, options).

What one run becomes (docs/k8s.md says why):

- a ConfigMap holding `spec.json`; every pod mounts it and copies it to RUN_DIR on the runs volume
  before the trainer starts (the trainer reads RUN_DIR/spec.json, as on every backend);
- Horovod: a Kubeflow MPI Operator `MPIJob` (kubeflow.org/v2beta1): one launcher running `mpirun`,
  `nodes` workers running sshd (non-root, port 2222), `slotsPerWorker` = GPUs per node;
- DDP, ps (any torchrun engine): a headless Service (stable DNS names for pod 0, the rendezvous master) and an indexed
  `batch/v1` Job of `nodes` pods, each running torchrun with `--node-rank=$JOB_COMPLETION_INDEX`;
- after the run, a short-lived "fetch" pod that prints RUN_DIR/records as a base64 tar on its log,
  which is how the records come back to the local run directory.

Nothing here imports the Kubernetes client: manifests are plain dicts, so `--dry-run`, the golden
tests and the schema validation need no cluster. Secrets are referenced (secretKeyRef), never copied.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import yaml

from scalelab.core.errors import SpecError
from scalelab.core.launch import NodeVar, Site, engine_env, launch_plan, starter_of
from scalelab.core.spec import Spec
from scalelab.k8s.options import secret_env_ref

MPI_GROUP, MPI_VERSION, MPI_PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
SPEC_MOUNT = "/etc/scalelab"  # where the ConfigMap with spec.json is mounted
SSH_PORT = 2222  # sshd of the MPI workers listens here as the non-root user (scalelab/k8s/Dockerfile)
MPI_HOME = "/home/mpiuser"  # the image's non-root user (uid 1000); the operator mounts its ssh keys here
LABEL_RUN = "scalelab.io/run"
LABEL_ROLE = "scalelab.io/role"


# ---- names -----------------------------------------------------------------------------------------

def k8s_name(run_name: str, max_len: int = 40, keep: str = "") -> str:
    """A DNS label for the run's objects, derived from the run's id (`KubernetesBackend.run_name`).

    40 characters at most: pod names add "-launcher", "-worker-N", "-N-xxxxx" or "-fetch" and must
    stay within 63. Long names are cut and keep a short hash so two runs never share a name; `keep`, a
    tail of `run_name` (a sweep's layout, `1x2`), stays readable after the hash when it is cut.
    """
    name = _dns_words(run_name)
    if not name or not name[0].isalpha():
        name = "run-" + name
    if len(name) > max_len:
        digest = hashlib.sha1(run_name.encode()).hexdigest()[:6]
        tail = _dns_words(keep)
        tail = tail if tail and len(tail) <= max_len // 2 else ""
        head = name[: max_len - len(digest) - 1 - (len(tail) + 1 if tail else 0)].rstrip("-")
        name = "-".join(filter(None, [head, digest, tail]))
    return name.strip("-")


def _dns_words(text: str) -> str:
    """`text` in lower-case letters, digits and single '-' (what a DNS label may hold), no '-' at either end."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower())).strip("-")


def pod_run_dir(name: str, options: Mapping[str, Any]) -> str:
    """RUN_DIR as the pods see it: on the runs volume."""
    return str(PurePosixPath(options["mount_path"]) / name)


# ---- render (pure) ---------------------------------------------------------------------------------


def render(spec: Spec, run_name: str, options: Mapping[str, Any], extra_env: Mapping[str, str] | None = None
           ) -> list[dict[str, Any]]:
    """The objects to create, in creation order (ConfigMap first, the workload last). `extra_env`: more
    variables for the ranks (a resume's accepted changes, `trajectory.accepted_env`)."""
    if not options["image"]:
        raise SpecError("--image is required with --backend k8s: the trainer image built from scalelab/k8s/Dockerfile")
    how = starter_of(spec.engine.name)
    if how.k8s_workload not in WORKLOADS:
        raise SpecError(f"starter {how.name!r} names Kubernetes workload {how.k8s_workload!r}, which "
                        f"scalelab/k8s/manifests.py does not render (workloads: {', '.join(WORKLOADS)})")
    docs = [config_map(spec, run_name, options), *WORKLOADS[how.k8s_workload](spec, run_name, options, dict(extra_env or {}))]
    if spec.own_code:  # a --script run: its folder as a ConfigMap, mounted read-only in every pod of the workload
        code, keys = code_config_map(spec, run_name, options)
        docs.insert(1, code)
        _mount_code(docs[-1], run_name, keys)
    return docs


# ---- a --script run's code (issue 34) -----------------------------------------------------------------

CODE_MOUNT = "/opt/scalelab/code"  # where the pods see the script's folder (SCALELAB_SCRIPT_DIR): a writable copy
CODE_SOURCE = "/opt/scalelab/code-src"  # the ConfigMap's files, read-only, copied to CODE_MOUNT before the rank starts
CODE_LIMIT = 900 * 1024  # a ConfigMap holds at most 1 MiB in all (etcd's limit), the rest of the object included
# The code ConfigMap's annotation listing the folder's files (paths inside it) as a JSON array: a file name may
# hold spaces, so a list joined by spaces would not come back as the same files.
CODE_FILES = "scalelab.io/files"
MAX_KEY = 253  # a ConfigMap key's length limit


def _code_key(rel: str) -> str:
    """A ConfigMap key for a file inside the folder (keys cannot hold `/`; the volume's items restore the path)."""
    return re.sub(r"[^-._a-zA-Z0-9]", "_", rel.replace("/", "__"))


def _code_keys(rels: list[str]) -> dict[str, str]:
    """{path inside the folder: its ConfigMap key}; two files whose keys would be the same (`a/b.py`, `a__b.py`),
    one of which would silently replace the other in every pod, are refused, as is a key too long for one."""
    keys: dict[str, str] = {}
    owner: dict[str, str] = {}  # key -> the path that has it
    for rel in sorted(rels):
        key = _code_key(rel)
        other = owner.setdefault(key, rel)
        if other != rel:
            raise SpecError(f"files {other!r} and {rel!r} of your code's folder would be the same ConfigMap key "
                            f"{key!r} (a key holds no '/', spaces or other signs, so they become '_'), and one "
                            "would replace the other in the pods; rename one of them")
        if len(key) > MAX_KEY:
            raise SpecError(f"the path {rel[:60]!r}... of your code's folder is longer than a ConfigMap key may be "
                            f"({MAX_KEY} characters); shorten it or list it in the folder's .gitignore")
        keys[rel] = key
    return keys


def code_config_map(spec: Spec, run_name: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The script's folder (its files as git would commit them, .gitignore respected) as a ConfigMap: text files
    under `data`, others base64 under `binaryData`; over CODE_LIMIT is refused before anything is sent; and
    {path inside the folder: its key} (`_code_keys`), for `_mount_code`: the CODE_FILES annotation lists the same
    paths for whoever reads the ConfigMap, not to be parsed back here."""
    import base64

    from scalelab.launcher.owncode import code_files

    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    files = code_files(spec, limit=CODE_LIMIT)
    keys = _code_keys([rel for _, rel in files])
    for path, rel in files:
        raw = path.read_bytes()
        try:
            data[keys[rel]] = raw.decode("utf-8")
        except UnicodeDecodeError:
            binary[keys[rel]] = base64.b64encode(raw).decode()
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": metadata(f"{run_name}-code", options, "code", run_name), "data": data}
    if binary:
        doc["binaryData"] = binary
    doc["metadata"]["annotations"] = {CODE_FILES: json.dumps(sorted(keys))}
    return doc, keys


def _mount_code(workload: dict[str, Any], run_name: str, keys: dict[str, str]) -> None:
    """Every pod template of the workload: the code volume (its files at their paths) copied by an init container
    into a writable emptyDir at CODE_MOUNT, and the containers started there (the script runner is told where by
    SCALELAB_SCRIPT_DIR, `_common_env`). Why a copy: a ConfigMap volume is read-only, and a script that writes
    beside itself, as it does under torchrun (`--out outputs/x`, TensorBoard's ./runs, lightning_logs/), failed
    with a read-only filesystem there. What it writes there ends with the pod: the run's volume keeps what lasts."""
    templates = ([r["template"] for r in workload["spec"]["mpiReplicaSpecs"].values()] if workload["kind"] == "MPIJob"
                 else [workload["spec"]["template"]])
    for template in templates:
        pod = template["spec"]
        pod["volumes"] += [{"name": "code", "configMap": {
            "name": f"{run_name}-code", "items": [{"key": key, "path": rel} for rel, key in keys.items()]}},
            {"name": "workdir", "emptyDir": {}}]
        first = pod["containers"][0]
        # the pod's CPU and memory (an init container runs before the others: the pod's request stays the same), no
        # GPU; requests = limits and locked down as every container, or the pod would be Burstable, and Pod Security
        # "restricted" or a quota requiring limits would refuse it
        amounts = {k: v for k, v in first["resources"]["limits"].items() if k in ("cpu", "memory")}
        pod.setdefault("initContainers", []).append({
            "name": "copy-code", "image": first["image"], "imagePullPolicy": first.get("imagePullPolicy", "IfNotPresent"),
            "command": ["sh", "-c", f"cp -RL {CODE_SOURCE}/. {CODE_MOUNT}/"],  # -L: the volume's files are links
            "resources": {"requests": dict(amounts), "limits": dict(amounts)}, "securityContext": _locked_down(),
            "volumeMounts": [{"name": "code", "mountPath": CODE_SOURCE, "readOnly": True},
                             {"name": "workdir", "mountPath": CODE_MOUNT}]})
        for container in pod["containers"]:
            container["volumeMounts"].append({"name": "workdir", "mountPath": CODE_MOUNT})
            container["workingDir"] = CODE_MOUNT


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (spec.json, shell scripts) as literal blocks: readable YAML and diffs."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Multi-document YAML in the order given, keys in the order written (readable diffs)."""
    return "".join("---\n" + yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120) for d in docs)


def metadata(name: str, options: Mapping[str, Any], role: str, run_name: str) -> dict[str, Any]:
    return {"name": name, "namespace": options["namespace"],
            "labels": {"app.kubernetes.io/name": "scalelab", LABEL_RUN: run_name, LABEL_ROLE: role}}


def config_map(spec: Spec, run_name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(f"{run_name}-spec", options, "spec", run_name),
            "data": {"spec.json": spec.to_json() + "\n"}}


def headless_service(run_name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Gives pod i of the indexed Job the DNS name `<run>-<i>.<run>`; ready or not (rendezvous comes first)."""
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": metadata(run_name, options, "rendezvous", run_name),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {LABEL_RUN: run_name, LABEL_ROLE: "worker"},
                 "ports": [{"name": "rendezvous", "port": options["master_port"], "targetPort": options["master_port"], "protocol": "TCP"}]},
    }


def indexed_job(spec: Spec, run_name: str, options: Mapping[str, Any], extra_env: Mapping[str, str] | None = None
                ) -> dict[str, Any]:
    """DDP, ps (and single): `nodes` pods running the plan's one launch (a torchrun agent with `ranks_per_node`
    ranks), each its own node rank, $JOB_COMPLETION_INDEX; pod 0 is the master."""
    run_dir = pod_run_dir(run_name, options)
    site = Site(python="python", master_addr=NodeVar("$MASTER_ADDR"), master_port=options["master_port"],
                node_rank=NodeVar("$JOB_COMPLETION_INDEX"))
    [launch] = launch_plan(spec, run_dir, site)
    # the launch's own variables (torchrun's tag on its ranks' lines), beside the engine's that _common_env adds
    own = {name: value for name, value in launch.env.items() if name not in engine_env(spec)}
    env = [{"name": "MASTER_ADDR", "value": f"{run_name}-0.{run_name}"},
           *_common_env(spec, options, {**(extra_env or {}), **own})]
    container = _container("trainer", options, _with_spec_copy(run_dir, launch.argv), env,
                           _node_resources(spec, options), gpus=_gpus(spec))
    pod = _pod_spec(run_name, options, [container], restart="Never")
    pod["subdomain"] = run_name  # with the headless Service: stable DNS names per index
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes,
        "backoffLimit": options["backoff_limit"], "ttlSecondsAfterFinished": options["ttl_after_finished_min"] * 60,
    }
    if options["timeout_min"]:
        job_spec["activeDeadlineSeconds"] = options["timeout_min"] * 60
    job_spec["template"] = {"metadata": {"labels": metadata("", options, "worker", run_name)["labels"]}, "spec": pod}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(run_name, options, "job", run_name), "spec": job_spec}


def mpijob(spec: Spec, run_name: str, options: Mapping[str, Any], extra_env: Mapping[str, str] | None = None
           ) -> dict[str, Any]:
    """Horovod: the operator writes the hostfile and ssh keys; the launcher runs mpirun over the workers
    (which passes every variable of `env` on to the ranks)."""
    run_dir = pod_run_dir(run_name, options)
    env = _common_env(spec, options, extra_env)
    site = Site(python="python", mpirun_args=("-bind-to", "none", "-map-by", "slot", "-mca", "plm_rsh_args", f"-p {SSH_PORT}"),
                exports=("PATH", "LD_LIBRARY_PATH", *(e["name"] for e in env)))
    [launch] = launch_plan(spec, run_dir, site)
    mpirun = launch.argv
    launcher = _container("launcher", options, _with_spec_copy(run_dir, mpirun), env,
                          _resources(options["launcher_cpus"], options["launcher_mem_gb"]), gpus=0)
    worker = _container("worker", options, ["/usr/sbin/sshd", "-De", "-f", f"{MPI_HOME}/.sshd_config"], env,
                        _node_resources(spec, options), gpus=_gpus(spec))
    labels = lambda role: {"metadata": {"labels": metadata("", options, role, run_name)["labels"]}}  # noqa: E731
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": options["clean_pod_policy"], "ttlSecondsAfterFinished": options["ttl_after_finished_min"] * 60,
        "backoffLimit": options["backoff_limit"],
    }
    if options["timeout_min"]:
        run_policy["activeDeadlineSeconds"] = options["timeout_min"] * 60
    return {
        "apiVersion": f"{MPI_GROUP}/{MPI_VERSION}", "kind": "MPIJob", "metadata": metadata(run_name, options, "job", run_name),
        "spec": {
            "slotsPerWorker": spec.gpus_per_node,
            "runLauncherAsWorker": False,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": f"{MPI_HOME}/.ssh",
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never",
                             "template": {**labels("launcher"), "spec": _pod_spec(run_name, options, [launcher], restart=None)}},
                "Worker": {"replicas": spec.nodes, "restartPolicy": "Never",
                           "template": {**labels("worker"), "spec": _pod_spec(run_name, options, [worker], restart=None)}},
            },
        },
    }


#: The workloads a starter can name (`Starter.k8s_workload`, scalelab/core/launch.py): the objects after the spec's
#: ConfigMap, in creation order.
WORKLOADS = {
    "indexed-job": lambda spec, run_name, options, env: [headless_service(run_name, options),
                                                         indexed_job(spec, run_name, options, env)],
    "mpijob": lambda spec, run_name, options, env: [mpijob(spec, run_name, options, env)],
}


def fetch_pod(run_name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A short-lived pod that prints RUN_DIR/records (plus spec.json) as one base64 line of gzip'd tar.

    Reading it back needs only the pod-log API (no exec, no port-forward, no bucket credentials).
    Checkpoints stay on the volume.
    """
    run_dir = pod_run_dir(run_name, options)
    script = f"cd {shlex.quote(run_dir)} && tar -czf - records | base64 -w0"
    container = _container("fetch", options, ["sh", "-c", script], [], _resources(0.25, 0.25), gpus=0)
    container["volumeMounts"] = [{"name": "runs", "mountPath": options["mount_path"], "readOnly": True}]
    pod = _pod_spec(run_name, options, [container], restart="Never")
    pod["volumes"] = [{"name": "runs", "persistentVolumeClaim": {"claimName": options["volume_claim"], "readOnly": True}}]
    pod.pop("priorityClassName", None)
    pod["activeDeadlineSeconds"] = 600
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(f"{run_name}-fetch", options, "fetch", run_name), "spec": pod}


# ---- pieces --------------------------------------------------------------------------------------


def _with_spec_copy(run_dir: str, command: list[str]) -> list[str]:
    """Copy spec.json from the ConfigMap to RUN_DIR (atomically: several pods may do it), then exec."""
    q = shlex.quote(run_dir)
    prep = f"mkdir -p {q}/records && cp {SPEC_MOUNT}/spec.json {q}/.spec.json.$HOSTNAME && mv {q}/.spec.json.$HOSTNAME {q}/spec.json"
    line = " ".join(a if isinstance(a, NodeVar) else shlex.quote(a) for a in command)  # $VARs the pod's shell expands
    return ["sh", "-c", f"{prep} && exec {line}"]


def _common_env(spec: Spec, options: Mapping[str, Any], extra_env: Mapping[str, str] | None = None
                ) -> list[dict[str, Any]]:
    threads = spec.threads or max(1, int(options["cpus_per_node"]) // spec.ranks_per_node)
    env = [{"name": "OMP_NUM_THREADS", "value": str(threads)}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": name, "value": value} for name, value in sorted((extra_env or {}).items())]
    env += [{"name": name, "value": value} for name, value in engine_env(spec).items()]  # Horovod's fusion settings
    if spec.own_code:  # where the script's folder is mounted (scalelab/train/script.py reads it; mpirun passes it on)
        env.append({"name": "SCALELAB_SCRIPT_DIR", "value": CODE_MOUNT})
    for name, secret, key in map(secret_env_ref, options["secret_env"]):
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env


def _resources(cpus: float, mem_gb: float, gpus: int = 0) -> dict[str, Any]:
    amounts = {"cpu": _quantity(cpus), "memory": f"{_quantity(mem_gb * 1024)}Mi"}
    limits = {**amounts, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"requests": dict(limits), "limits": limits}


def _node_resources(spec: Spec, options: Mapping[str, Any]) -> dict[str, Any]:
    return _resources(options["cpus_per_node"], options["mem_gb_per_node"])


def _gpus(spec: Spec) -> int:
    """The `nvidia.com/gpu` of each worker pod: none with --device cpu, whose ranks compute on CPUs (the GPUs per node
    then count the ranks of each pod); asked for, pods never scheduled on a cluster without GPUs (kind)."""
    return 0 if spec.device == "cpu" else spec.gpus_per_node


def _quantity(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{int(round(x * 1000))}m" if x < 1000 else str(int(round(x)))


def _container(name: str, options: Mapping[str, Any], command: list[str], env: list[dict[str, Any]],
               resources: dict[str, Any], gpus: int) -> dict[str, Any]:
    if gpus:
        resources = {k: {**v, "nvidia.com/gpu": str(gpus)} for k, v in resources.items()}
    return {
        "name": name, "image": options["image"], "imagePullPolicy": options["image_pull_policy"],
        "command": command, "env": env, "resources": resources,
        "securityContext": _locked_down(),
        "volumeMounts": [{"name": "runs", "mountPath": options["mount_path"]},
                         {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def _locked_down() -> dict[str, Any]:
    """Every container's securityContext (init containers too): what Pod Security "restricted" asks of it."""
    return {"allowPrivilegeEscalation": False, "privileged": False, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


def _pod_spec(run_name: str, options: Mapping[str, Any], containers: list[dict[str, Any]], restart: str | None) -> dict[str, Any]:
    uid = options["run_as_user"]
    pod: dict[str, Any] = {}
    if restart:
        pod["restartPolicy"] = restart
    if options["service_account"]:
        pod["serviceAccountName"] = options["service_account"]
    pod["automountServiceAccountToken"] = False  # the trainer never talks to the API server
    pod["securityContext"] = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
                              "seccompProfile": {"type": "RuntimeDefault"}}
    if options["node_selector"]:
        pod["nodeSelector"] = dict(options["node_selector"])
    if options["tolerations"]:
        pod["tolerations"] = [dict(t) for t in options["tolerations"]]
    if options["priority_class"]:
        pod["priorityClassName"] = options["priority_class"]
    if options["image_pull_secrets"]:
        pod["imagePullSecrets"] = [{"name": s} for s in options["image_pull_secrets"]]
    pod["terminationGracePeriodSeconds"] = 120  # SIGTERM -> ranks agree, rank 0 checkpoints, exit 143
    pod["containers"] = containers
    pod["volumes"] = [
        {"name": "runs", "persistentVolumeClaim": {"claimName": options["volume_claim"]}},
        {"name": "spec", "configMap": {"name": f"{run_name}-spec", "items": [{"key": "spec.json", "path": "spec.json"}]}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{_quantity(options['shm_gb'])}Gi"}},
    ]
    return pod
