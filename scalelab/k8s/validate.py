"""Validate rendered manifests against the real published schemas, as an API server would.

- Core objects (ConfigMap, Service, Job, Pod) against the Kubernetes OpenAPI schemas shipped by the
  `kubernetes-validate` package, in strict mode (an unknown field is an error, as with
  `kubectl apply --validate=strict`), for the oldest and newest Kubernetes versions we support.
- The MPIJob against the `openAPIV3Schema` of the MPI Operator's CRD, shipped in
  `scalelab/k8s/schemas/kubeflow.org_mpijobs.yaml` (copied from kubeflow/mpi-operator, commit caa3c47,
  Apache-2.0). A structural schema lets an API server *prune* unknown fields silently; we treat them
  as errors instead, since a pruned field is a setting that never took effect. Its pod templates are
  also checked against the core PodTemplateSpec schema, which is stricter than the CRD's copy.

- Every pod (a Pod, a Job's or an MPIJob role's template) against what docs/k8s.md promises of each of its
  containers, init containers included, which no schema checks: Pod Security "restricted" (no privilege
  escalation, not privileged, all capabilities dropped, non-root, a RuntimeDefault seccomp profile) and
  Guaranteed QoS (CPU and memory requests equal to limits). Why: an init container added without them made
  the pods Burstable, and a namespace enforcing "restricted" or a quota requiring limits refused them.

`python -m scalelab.k8s.validate FILE.yaml...` validates files (e.g. the output of `launch --dry-run`).
"""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path
from typing import Any

import yaml

SCHEMA_DIR = Path(__file__).parent / "schemas"
MPIJOB_CRD = SCHEMA_DIR / "kubeflow.org_mpijobs.yaml"
KUBERNETES_VERSIONS = ("1.29", "latest")  # oldest we support (indexed Jobs, podFailurePolicy GA-ish) and newest shipped


class ManifestInvalid(Exception):
    """A manifest does not validate: the message names the object, the field path and the problem."""


def validate_all(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        validate_doc(doc)


def validate_doc(doc: dict[str, Any]) -> None:
    if doc.get("kind") == "MPIJob":
        _validate_mpijob(doc)
        for role, replica in doc["spec"]["mpiReplicaSpecs"].items():
            template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": f"{doc['metadata']['name']}-{role.lower()}"}, "template": replica["template"]}
            what = f"MPIJob {doc['metadata']['name']} {role} pod template"
            _validate_core(template, what)
            check_locked_down(replica["template"]["spec"], what)
    else:
        what = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        _validate_core(doc, what)
        pod = {"Pod": lambda d: d["spec"], "Job": lambda d: d["spec"]["template"]["spec"]}.get(doc.get("kind"))
        if pod:
            check_locked_down(pod(doc), what)


#: What each container's securityContext must hold (Pod Security "restricted", plus not privileged).
LOCKED_DOWN = {"allowPrivilegeEscalation": False, "privileged": False}


def check_locked_down(pod: dict[str, Any], what: str) -> None:
    """ManifestInvalid naming the first container (init containers too) that Pod Security "restricted" would
    refuse or that would make the pod other than Guaranteed QoS (CPU and memory requests equal to limits)."""
    pod_sc = pod.get("securityContext") or {}
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod.get(kind) or []:
            name = f"{what}: {'init container' if kind == 'initContainers' else 'container'} {c.get('name')}"
            sc = c.get("securityContext") or {}
            for key, value in LOCKED_DOWN.items():
                if sc.get(key) is not value:
                    raise ManifestInvalid(f"{name} needs securityContext.{key}: {str(value).lower()}")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                raise ManifestInvalid(f"{name} needs securityContext.capabilities.drop: [ALL]")
            if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
                raise ManifestInvalid(f"{name} needs runAsNonRoot: true (its own securityContext or the pod's)")
            seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                raise ManifestInvalid(f"{name} needs seccompProfile type RuntimeDefault (its own or the pod's)")
            resources = c.get("resources") or {}
            requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
            for key in ("cpu", "memory"):
                if key not in limits or requests.get(key, limits[key]) != limits[key]:
                    raise ManifestInvalid(f"{name} needs a {key} limit, and a request equal to it (Guaranteed QoS; "
                                          "a quota requiring limits refuses a container without)")


def _validate_core(doc: dict[str, Any], what: str) -> None:
    import kubernetes_validate

    for version in KUBERNETES_VERSIONS:
        v = kubernetes_validate.latest_version() if version == "latest" else version
        try:
            kubernetes_validate.validate(doc, v, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise ManifestInvalid(f"{what} is invalid for Kubernetes {v} at {path or '(root)'}: {exc.message}") from None


@functools.lru_cache(maxsize=1)
def mpijob_schema() -> dict[str, Any]:
    """The CRD's v2beta1 openAPIV3Schema, made strict: objects with `properties` reject unknown fields."""
    crd = yaml.safe_load(MPIJOB_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v2beta1"]
    return _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        for value in node.values():
            _strict(value)
        if (node.get("type") == "object" and "properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


def _validate_mpijob(doc: dict[str, Any]) -> None:
    import jsonschema

    validator = jsonschema.Draft7Validator(mpijob_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.path)
        raise ManifestInvalid(f"MPIJob {doc.get('metadata', {}).get('name')} does not match the CRD at "
                              f"{path or '(root)'}: {e.message} ({len(errors)} error(s))")
    if doc.get("apiVersion") != "kubeflow.org/v2beta1":
        raise ManifestInvalid(f"MPIJob apiVersion must be kubeflow.org/v2beta1, got {doc.get('apiVersion')!r}")


def main(argv: list[str]) -> int:
    bad = 0
    for name in argv:
        for doc in yaml.safe_load_all(Path(name).read_text()):
            if not doc:
                continue
            try:
                validate_doc(doc)
                print(f"ok    {name}: {doc['kind']} {doc['metadata']['name']}")
            except ManifestInvalid as exc:
                bad += 1
                print(f"error {name}: {exc}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
