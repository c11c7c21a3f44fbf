"""The `k8s` backend: the trainer on a Kubernetes cluster, followed to the end with the official client.

Horovod runs as a Kubeflow MPI Operator MPIJob, DDP as an indexed batch/v1 Job plus a headless Service
(scalelab/k8s/manifests.py renders them; docs/k8s.md says why). The run directory stays local: launch.json
names the cluster objects; when the run ends its records are copied back from the runs volume (a
short-lived pod prints them as base64 on its log) and the pod logs are saved under RUN_DIR/logs, so
`launch report` reads a Kubernetes run like any other.

The follow loop is scalelab/launcher/runner.py's: `poll` adds failing fast on an image that cannot be pulled,
`finish` saves the pod logs, copies the records back and deletes the run's objects.

Order inside the module (the same in every backend): options, request, render (pure), schedule,
poll/finish/status/logs/cancel.
"""

from __future__ import annotations

import base64
import io
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from scalelab.core.errors import ScalelabError, shell_word
from scalelab.core.rundir import (
    ACTIVE,
    COMPLETED,
    FAILED,
    PENDING,
    RUNNING,
    TERMINAL,
    UNKNOWN,
    RunPaths,
    is_sweep,
    read_state,
    start_state,
    update_state,
)
from scalelab.core.spec import Spec
from scalelab.core.trajectory import accepted_env
from scalelab.core.waiting import wait_until
from scalelab.core.writes import extract_inside, write_inside
from scalelab.k8s import manifests
from scalelab.k8s.api import KubeApi, KubernetesError, NotFound
from scalelab.k8s.manifests import LABEL_ROLE, to_yaml
from scalelab.k8s.options import KubernetesOptions
from scalelab.launcher.backend import Backend, Request, RunStatus, log_text, quiet_stop_tracebacks

IMAGE_ERRORS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}


@dataclass
class KubernetesRequest(Request):
    """The objects to create, in order, and the fetch pod created once the run has ended."""

    name: str = ""
    namespace: str = "default"
    objects: list[dict[str, Any]] = field(default_factory=list)
    fetch: dict[str, Any] = field(default_factory=dict)

    def render(self) -> str:
        return (f"# run directory: {self.run_dir}\n# namespace {self.namespace}: created in this order\n"
                + to_yaml(self.objects)
                + "# when the run has ended: copies RUN_DIR/records back to the local run directory\n"
                + to_yaml([self.fetch]))


class KubernetesBackend(Backend):
    name = "k8s"
    Options = KubernetesOptions  # the valid options, their defaults and checks (scalelab/k8s/options.py)

    def __init__(self, options: dict[str, Any] | None = None, api_factory: Callable[..., Any] | None = None) -> None:
        super().__init__(options)
        self._api_factory = api_factory
        self._api = None

    def api(self):
        """The client wrapper, created (and the kubeconfig read) on first use."""
        if self._api is None:
            factory = self._api_factory or KubeApi
            self._api = factory(kubeconfig=self.options["kubeconfig"], context=self.options["context"],
                                namespace=self.options["namespace"])
        return self._api

    # ---- render (pure) ---------------------------------------------------------------------------

    def check(self, spec: Spec) -> None:
        manifests.render(spec, "check", self.options)  # raises SpecError (e.g. no --image) before anything runs

    def run_name(self, run_dir: Path) -> str:
        """The name of the run's objects and of its directory on the volume (RUN_DIR there), stable for a run
        directory: the name its earlier launch recorded in launch.json (`launch resume` finds its own objects and
        checkpoint again, whichever version named it), else its id made a DNS label (`manifests.k8s_name`).

        A sweep's layout directory is named by its layout alone (`1x2`); its id carries its sweep's timestamped name
        as well (`mysweep-20260101-120000-1x2`), as on AWS (`cloud_run_id`). Why: named `run-1x2`, the layouts of
        every sweep in a namespace shared objects and one directory on the volume, and a later sweep's ranks found
        an earlier sweep's checkpoint and records there and resumed from them (or were refused)."""
        run_dir = Path(run_dir)
        paths = RunPaths(run_dir)
        if paths.launch.exists():
            info = read_state(run_dir)
            name = info.get("name")
            if info.get("backend") == self.name and isinstance(name, str) and name and manifests.k8s_name(name) == name:
                return name
        sweep = run_dir.parent.name if run_dir.parent.name and is_sweep(run_dir.parent) else self.sweep
        if not sweep:
            return manifests.k8s_name(run_dir.name)
        return manifests.k8s_name(f"{sweep}-{run_dir.name}", keep=run_dir.name)

    def submit_dryrun(self, spec: Spec, run_dir: Path) -> KubernetesRequest:
        name = self.run_name(run_dir)
        accepted = accepted_env(Path(run_dir))  # `launch resume --allow-changed`: the pods cannot read the launcher's file
        return KubernetesRequest(Path(run_dir), name, self.options["namespace"],
                                 manifests.render(spec, name, self.options, accepted),
                                 manifests.fetch_pod(name, self.options))

    # ---- schedule --------------------------------------------------------------------------------

    def schedule(self, request: KubernetesRequest) -> str:
        """Check the cluster, create the objects in order; on any failure delete what was created."""
        api = self.api()
        api.check_namespace()
        if any(o["kind"] == "MPIJob" for o in request.objects):
            api.check_mpi_operator()
        api.check_claim(self.options["volume_claim"])
        self._clear_previous_launch(request.run_dir)
        created: list[tuple[str, str]] = []
        try:
            for doc in request.objects:
                result = api.create(doc)
                created.append((doc["kind"], doc["metadata"]["name"]))
            workload = result  # the last object: the Job or MPIJob
            for kind, name in created[:-1]:
                api.set_owner(kind, name, workload)
        except BaseException:
            for kind, name in reversed(created):
                try:
                    api.delete(kind, name)
                except ScalelabError:
                    pass
            raise
        start_state(request.run_dir, backend=self.name, name=request.name, namespace=request.namespace,
                    server=getattr(api, "server", ""), context=self.options["context"],
                    objects=[list(c) for c in created], workload=list(created[-1]), fetch=request.fetch,
                    image=self.options["image"], started=time.time())
        return request.name

    def _clear_previous_launch(self, run_dir: Path, timeout_s: float = 120.0) -> None:
        """`launch resume`: the objects of the run's earlier launch go first (same names); a live one is kept."""

        if not RunPaths(Path(run_dir)).launch.exists():
            return
        info = read_state(run_dir)
        if info.get("state") not in TERMINAL and self._live_status(run_dir)[0].state in ACTIVE:
            raise KubernetesError(f"{run_dir} is still running on the cluster ({info['workload'][0]} {info['name']}); "
                                  f"`launch cancel {shell_word(run_dir)}` first")
        self._delete_all(run_dir)
        kind, name = info["workload"]
        if not wait_until(lambda: self._gone(kind, name), timeout_s, interval_s=1.0):  # foreground deletion: pods gone
            raise KubernetesError(f"{kind} {name} from the earlier launch is still being deleted; try again in a minute")

    def _gone(self, kind: str, name: str) -> bool:
        try:
            self.api().get(kind, name)
        except NotFound:
            return True
        return False

    # ---- poll, finish, status, logs, cancel -------------------------------------------------------

    def poll(self, run_dir: Path) -> RunStatus:
        """The live status; an image the nodes cannot pull fails the run at once (pods would wait forever)."""
        status, pods = self._live_status(run_dir)
        self._fail_on_image_error(pods)
        return status

    def finish(self, run_dir: Path, status: RunStatus) -> RunStatus:
        """Save the pod logs, copy the records back, delete the run's objects (the records stay on the volume)."""

        self._save_logs(run_dir)
        try:
            fetched = self.fetch_records(run_dir)
        except KubernetesError as exc:
            if status.state == COMPLETED:
                raise
            fetched, status = False, RunStatus(status.state, f"{status.detail}; {exc}")  # a failed run may have none
        finally:
            self._delete_all(run_dir)
        update_state(run_dir, records=fetched)
        return status

    def status(self, run_dir: Path) -> RunStatus:
        info = read_state(run_dir)
        if info.get("state") in TERMINAL:
            return RunStatus(info["state"], info.get("detail", ""))
        return self._live_status(run_dir)[0]

    def _live_status(self, run_dir: Path) -> tuple[RunStatus, list[dict[str, Any]]]:

        info = read_state(run_dir)
        kind, name = info["workload"]
        api = self.api()
        try:
            obj = api.get(kind, name)
        except NotFound:
            return RunStatus(UNKNOWN, f"{kind} {name} no longer exists in namespace {info['namespace']} "
                                        "(deleted, or collected after its TTL)"), []
        pods = [p for p in api.pods(name) if p["metadata"].get("labels", {}).get(LABEL_ROLE) != "fetch"]
        state, why = (_mpijob_state if kind == "MPIJob" else _job_state)(obj.get("status") or {})
        if state == PENDING and any(p.get("status", {}).get("phase") == "Running" for p in pods):
            state = RUNNING
        detail = "; ".join(filter(None, [why, "pods: " + ", ".join(_pod_line(p) for p in pods) if pods else "no pods yet"]))
        return RunStatus(state, detail), pods

    def _fail_on_image_error(self, pods: list[dict[str, Any]]) -> None:
        """Raise (the runner then records FAILED and deletes the run's objects through `cancel`)."""
        for pod in pods:
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                waiting = (cs.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in IMAGE_ERRORS:
                    raise KubernetesError(
                        f"image {cs.get('image') or self.options['image']} cannot be pulled on the cluster "
                        f"({waiting['reason']}: {waiting.get('message', '')}); push it to a registry the nodes can reach "
                        "(scalelab/k8s/Dockerfile builds it) or give --image-pull-secret for a private registry; "
                        "the run's objects were deleted")

    def logs(self, run_dir: Path) -> str:
        """Live pod logs while the pods exist, else the copies saved in RUN_DIR/logs when the run ended."""

        info = read_state(run_dir)
        parts = []
        try:
            api = self.api()
            for pod in api.pods(info["name"]):
                pod_name = pod["metadata"]["name"]
                parts.append(f"==> pod {pod_name} ({pod.get('status', {}).get('phase', '?')}) <==\n"
                             + quiet_stop_tracebacks(api.log(pod_name)))  # a stop asked for: one line
        except KubernetesError as exc:
            parts.append(f"(live logs unavailable: {exc})")
        if not [p for p in parts if p.startswith("==>")]:
            saved = sorted(RunPaths(Path(run_dir)).logs.glob("*.log"))
            parts = [log_text(saved)] if saved else parts or ["(no logs)"]
        return "\n".join(parts)

    def cancel(self, run_dir: Path) -> None:
        """Delete the workload (foreground: its pods get SIGTERM, rank 0 checkpoints), then its Service/ConfigMap."""
        self._save_logs(run_dir)
        self._delete_all(run_dir)

    # ---- records and logs back to the run directory ------------------------------------------------

    def fetch_records(self, run_dir: Path, timeout_s: float = 600.0, poll_s: float = 2.0) -> bool:
        """Run the fetch pod, unpack its base64 tar of RUN_DIR/records locally, delete the pod."""

        info, api = read_state(run_dir), self.api()
        pod = info["fetch"]
        name = pod["metadata"]["name"]
        api.delete("Pod", name)  # a leftover from an earlier attempt
        api.create(pod)
        try:
            phase = wait_until(lambda: _ended_phase(api, name), timeout_s, interval_s=poll_s)
            text = api.log(name)
        finally:
            api.delete("Pod", name)
        if phase != "Succeeded":
            raise KubernetesError(f"could not copy the records back (fetch pod {name} {phase or 'timed out'}: "
                                  f"{text.strip()[-300:]}); they stay on volume {self.options['volume_claim']} "
                                  f"under {manifests.pod_run_dir(info['name'], self.options)}")
        try:
            blob = base64.b64decode("".join(text.split()), validate=True)
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
                extract_inside(tar, run_dir)
        except (ValueError, tarfile.TarError) as exc:
            raise KubernetesError(f"the records from fetch pod {name} are corrupt ({exc}); they stay on volume "
                                  f"{self.options['volume_claim']}") from None
        return True

    def _save_logs(self, run_dir: Path) -> None:

        info, api = read_state(run_dir), self.api()
        out = RunPaths(Path(run_dir)).logs
        try:
            for pod in api.pods(info["name"]):
                pod_name = pod["metadata"]["name"]
                if pod["metadata"].get("labels", {}).get(LABEL_ROLE) == "fetch":
                    continue
                out.mkdir(parents=True, exist_ok=True)
                write_inside(run_dir, out / f"{pod_name}.log", api.log(pod_name))
        except KubernetesError:
            pass  # logs are a convenience; the records are what matters

    def _delete_all(self, run_dir: Path) -> None:
        info, api = read_state(run_dir), self.api()
        for kind, name in reversed(info["objects"]):
            api.delete(kind, name)
        api.delete("Pod", info["fetch"]["metadata"]["name"])


# ---- status mapping ------------------------------------------------------------------------------


def _ended_phase(api: Any, pod: str) -> str | None:
    """The pod's phase once it has ended (Succeeded, Failed), else None."""
    phase = (api.get("Pod", pod).get("status") or {}).get("phase")
    return phase if phase in ("Succeeded", "Failed") else None


def _true_conditions(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in status.get("conditions") or [] if c.get("status") == "True"]


def _job_state(status: dict[str, Any]) -> tuple[str, str]:
    for c in _true_conditions(status):
        if c["type"] == "Complete":
            return COMPLETED, ""
        if c["type"] == "Failed":
            return FAILED, f"{c.get('reason', '')}: {c.get('message', '')}".strip(": ")
    if status.get("active"):
        return PENDING, f"{status.get('active')} active, {status.get('succeeded', 0)} succeeded, {status.get('failed', 0)} failed"
    return PENDING, ""


def _mpijob_state(status: dict[str, Any]) -> tuple[str, str]:
    conds = {c["type"]: c for c in _true_conditions(status)}
    for ctype, state in (("Succeeded", COMPLETED), ("Failed", FAILED), ("Running", RUNNING)):
        if ctype in conds:
            c = conds[ctype]
            return state, (f"{c.get('reason', '')}: {c.get('message', '')}".strip(": ") if state == FAILED else "")
    return PENDING, ""


def _pod_line(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    reasons = [((cs.get("state") or {}).get("waiting") or {}).get("reason") for cs in status.get("containerStatuses") or []]
    reasons = [r for r in reasons if r]
    return f"{pod['metadata']['name']} {status.get('phase', 'Unknown')}" + (f" ({', '.join(reasons)})" if reasons else "")
