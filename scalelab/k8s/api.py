"""The few Kubernetes API calls the backend makes, through the official client, with errors as messages.

The `kubernetes` package is imported here only, and only when a call is made: `--dry-run`, the golden
tests and every other backend never load it. Objects go in and come out as plain dicts
(`_preload_content=False`), so the rest of the backend reads the same JSON a `kubectl get -o json`
shows and does not depend on the client's generated model classes, which change between releases.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from scalelab.core.errors import ScalelabError
from scalelab.k8s.manifests import LABEL_RUN, MPI_GROUP, MPI_PLURAL, MPI_VERSION

MPI_OPERATOR_INSTALL = ("kubectl apply --server-side -f "
                        "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.6.0/deploy/v2beta1/mpi-operator.yaml")
TIMEOUT = (10, 60)  # connect, read seconds for every call


class KubernetesError(ScalelabError):
    """A cluster-side problem the user can fix (no kubeconfig, unreachable server, missing namespace...)."""

class NotFound(KubernetesError):
    pass


class KubeApi:
    """Thin wrapper: one method per API call used; ApiException / connection errors -> KubernetesError."""

    def __init__(self, kubeconfig: str = "", context: str = "", namespace: str = "default") -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise KubernetesError("the Kubernetes backend needs the `kubernetes` package: pip install kubernetes") from None
        path = os.path.expanduser(kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or "~/.kube/config")
        self.namespace = namespace
        if not Path(path).is_file():
            raise KubernetesError(f"no kubeconfig at {path}: point --kubeconfig (or $KUBECONFIG) at your cluster's "
                                  "kubeconfig, e.g. the file `kind get kubeconfig` or your cloud CLI writes")
        try:
            self.client = config.new_client_from_config(config_file=path, context=context or None, persist_config=False)
        except config.ConfigException as exc:
            where = f"context {context!r} in {path}" if context else path
            raise KubernetesError(f"cannot use kubeconfig {where}: {exc}; check --kubeconfig and --kube-context") from None
        self.client.configuration.retries = 1  # an unreachable server fails in seconds, not minutes
        self.server = self.client.configuration.host
        self.context = context
        self.core = client.CoreV1Api(self.client)
        self.batch = client.BatchV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)

    # ---- error translation ---------------------------------------------------------------------

    def _call(self, what: str, fn, *args: Any, raw: bool = False, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)
        except ApiException as exc:
            message = _status_message(exc)
            if exc.status == 404:
                raise NotFound(f"{what}: not found ({message})") from None
            if exc.status in (401, 403):
                raise KubernetesError(f"{what}: the API server refused it ({exc.status} {exc.reason}: {message}); "
                                      "check your credentials and RBAC permissions in namespace "
                                      f"{self.namespace!r}") from None
            if exc.status == 409:
                raise KubernetesError(f"{what}: already exists ({message}); an earlier launch of this run? "
                                      "`launch cancel RUN_DIR` deletes its objects") from None
            raise KubernetesError(f"{what}: the API server answered {exc.status} {exc.reason}: {message}") from None
        except HTTPError as exc:
            raise KubernetesError(f"cannot reach the Kubernetes API server at {self.server} ({type(exc).__name__}: "
                                  f"{_reason(exc)}); is the cluster up and does `kubectl cluster-info` work?") from None
        data = resp.data.decode("utf-8", errors="replace")
        return data if raw else (json.loads(data) if data.strip() else {})

    # ---- preflight -------------------------------------------------------------------------------

    def check_namespace(self) -> None:
        """The namespace exists (skipped when RBAC forbids reading namespaces: create will tell)."""
        try:
            self._call(f"namespace {self.namespace}", self.core.read_namespace, self.namespace)
        except NotFound:
            raise KubernetesError(f"namespace {self.namespace!r} does not exist on {self.server}: create it with "
                                  f"`kubectl create namespace {self.namespace}` or pass --namespace") from None
        except KubernetesError as exc:
            if "refused it (403" not in str(exc):
                raise

    def check_mpi_operator(self) -> None:
        """The MPIJob CRD is served: listing mpijobs answers 404 when the MPI Operator is not installed."""
        try:
            self._call("list MPIJobs", self.custom.list_namespaced_custom_object, MPI_GROUP, MPI_VERSION,
                       self.namespace, MPI_PLURAL, limit=1)
        except NotFound:
            raise KubernetesError(
                f"the Kubeflow MPI Operator is not installed on {self.server} (no {MPI_PLURAL}.{MPI_GROUP}/{MPI_VERSION} "
                f"resource), and --engine horovod needs it: install it with `{MPI_OPERATOR_INSTALL}`, "
                "or use --engine ddp (a plain indexed Job)") from None

    def check_claim(self, claim: str) -> None:
        try:
            self._call(f"PersistentVolumeClaim {claim}", self.core.read_namespaced_persistent_volume_claim, claim, self.namespace)
        except NotFound:
            raise KubernetesError(
                f"PersistentVolumeClaim {claim!r} does not exist in namespace {self.namespace!r}: create a ReadWriteMany "
                "claim for run records and checkpoints (docs/k8s.md) or pass --volume-claim") from None

    # ---- objects -----------------------------------------------------------------------------------

    def create(self, doc: dict[str, Any]) -> dict[str, Any]:
        kind, ns = doc["kind"], self.namespace
        what = f"create {kind} {doc['metadata']['name']} in namespace {ns}"
        if kind == "MPIJob":
            return self._call(what, self.custom.create_namespaced_custom_object, MPI_GROUP, MPI_VERSION, ns, MPI_PLURAL, doc)
        fn = {"ConfigMap": self.core.create_namespaced_config_map, "Service": self.core.create_namespaced_service,
              "Pod": self.core.create_namespaced_pod, "Job": self.batch.create_namespaced_job}[kind]
        try:
            return self._call(what, fn, ns, doc)
        except NotFound as exc:
            raise KubernetesError(f"{what}: namespace {ns!r} not found; create it or pass --namespace ({exc})") from None

    def get(self, kind: str, name: str) -> dict[str, Any]:
        what, ns = f"{kind} {name}", self.namespace
        if kind == "MPIJob":
            return self._call(what, self.custom.get_namespaced_custom_object, MPI_GROUP, MPI_VERSION, ns, MPI_PLURAL, name)
        fn = {"Job": self.batch.read_namespaced_job, "Pod": self.core.read_namespaced_pod}[kind]
        return self._call(what, fn, name, ns)

    def delete(self, kind: str, name: str) -> bool:
        """Delete with foreground propagation (pods go first); False when it was already gone."""
        what, ns = f"delete {kind} {name}", self.namespace
        try:
            if kind == "MPIJob":
                self._call(what, self.custom.delete_namespaced_custom_object, MPI_GROUP, MPI_VERSION, ns, MPI_PLURAL, name,
                           propagation_policy="Foreground")
            else:
                fn = {"ConfigMap": self.core.delete_namespaced_config_map, "Service": self.core.delete_namespaced_service,
                      "Pod": self.core.delete_namespaced_pod, "Job": self.batch.delete_namespaced_job}[kind]
                self._call(what, fn, name, ns, propagation_policy="Foreground")
        except NotFound:
            return False
        return True

    def set_owner(self, kind: str, name: str, owner: dict[str, Any]) -> None:
        """Make `owner` (the workload) own a ConfigMap/Service, so deleting or TTL-collecting it removes them."""
        ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
               "uid": owner["metadata"]["uid"]}
        fn = {"ConfigMap": self.core.patch_namespaced_config_map, "Service": self.core.patch_namespaced_service}[kind]
        self._call(f"patch {kind} {name}", fn, name, self.namespace, {"metadata": {"ownerReferences": [ref]}})

    def pods(self, run_name: str) -> list[dict[str, Any]]:

        out = self._call(f"list pods of {run_name}", self.core.list_namespaced_pod, self.namespace,
                         label_selector=f"{LABEL_RUN}={run_name}")
        return sorted(out.get("items", []), key=lambda p: p["metadata"]["name"])

    def log(self, pod: str) -> str:
        return self._call(f"logs of pod {pod}", self.core.read_namespaced_pod_log, pod, self.namespace, raw=True)


def _status_message(exc: Any) -> str:
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.body or exc.reason)


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc)
