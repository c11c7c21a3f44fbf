"""A small stand-in for the Kubernetes API server, for driving the real `kubernetes` client in tests.

No real API server can run on these machines (no container runtime, no kind/k3s), so this answers
only the paths the backend uses, with the JSON shapes of the real API (objects, lists, `Status`
errors with reason and code): namespaces, configmaps, services, pods (+ log), PVCs, batch/v1 jobs and
kubeflow.org/v2beta1 mpijobs. It keeps objects in memory, records every request, and lets a test
decide what the "cluster" does when a workload or pod is created (`on_create`), e.g. start pods,
finish them, or fail to pull the image. Deleting an owner deletes what it owns (the garbage collector).

It listens on 127.0.0.1 in a thread; `write_kubeconfig` points the client at it.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

ROUTE = re.compile(
    r"^/(?:api/v1|apis/(?P<group>batch/v1|kubeflow\.org/v2beta1))/namespaces/(?P<ns>[^/]+)"
    r"(?:/(?P<plural>configmaps|services|pods|persistentvolumeclaims|jobs|mpijobs)(?:/(?P<name>[^/]+)(?P<log>/log)?)?)?$"
)
KINDS = {"configmaps": "ConfigMap", "services": "Service", "pods": "Pod", "persistentvolumeclaims": "PersistentVolumeClaim",
         "jobs": "Job", "mpijobs": "MPIJob"}


class StubCluster:
    def __init__(self, namespaces: tuple[str, ...] = ("default",), mpi_operator: bool = True,
                 claims: tuple[str, ...] = ("scalelab-runs",)) -> None:
        self.namespaces = set(namespaces)
        self.mpi_operator = mpi_operator
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name) -> object
        self.logs: dict[str, str] = {}  # pod name -> log text
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self.fail: dict[tuple[str, str], tuple[int, str]] = {}  # (method, plural) -> (code, reason)
        self.on_create: Callable[[StubCluster, str, dict[str, Any]], None] = lambda c, plural, obj: None
        self.lock = threading.RLock()
        for claim in claims:
            for ns in namespaces:
                self.put("persistentvolumeclaims", {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                                    "metadata": {"name": claim, "namespace": ns}})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # ---- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "StubCluster":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def write_kubeconfig(self, path: Path, context: str = "stub") -> Path:
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": context,
               "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
               "users": [{"name": "tester", "user": {"token": "test-token"}}],
               "contexts": [{"name": context, "context": {"cluster": "stub", "user": "tester"}}]}
        path.write_text(json.dumps(cfg))
        return path

    # ---- state helpers for tests -------------------------------------------------------------------

    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            self.objects[(plural, meta.get("namespace", "default"), meta["name"])] = obj
            return obj

    def get(self, plural: str, name: str, ns: str = "default") -> dict[str, Any] | None:
        return self.objects.get((plural, ns, name))

    def names(self, plural: str) -> list[str]:
        return sorted(name for (p, _, name) in self.objects if p == plural)

    def created(self) -> list[str]:
        return [path for method, path in self.requests if method == "POST"]

    def add_pod(self, name: str, labels: dict[str, str], phase: str, log: str = "", owner: dict | None = None,
                waiting: str | None = None, ns: str = "default") -> dict[str, Any]:
        status: dict[str, Any] = {"phase": phase}
        if waiting:
            status["containerStatuses"] = [{"name": "c", "image": "img", "ready": False,
                                            "state": {"waiting": {"reason": waiting, "message": f"{waiting} for img"}}}]
        meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
        self.logs[name] = log
        return self.put("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status})

    # ---- the API ---------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        with self.lock:
            if method == "GET" and path.startswith("/api/v1/namespaces/") and path.count("/") == 4:
                ns = path.rsplit("/", 1)[1]
                if ns not in self.namespaces:
                    return _status(404, "NotFound", f'namespaces "{ns}" not found')
                return 200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            m = ROUTE.match(path)
            if not m or not m["plural"]:
                return _status(404, "NotFound", "the server could not find the requested resource")
            plural, ns, name = m["plural"], m["ns"], m["name"]
            if plural == "mpijobs" and not self.mpi_operator:
                return _status(404, "NotFound", "the server could not find the requested resource")
            if (method, plural) in self.fail:
                code, reason = self.fail[(method, plural)]
                return _status(code, reason, f"injected failure: {method} {plural}")
            if ns not in self.namespaces:
                return _status(404, "NotFound", f'namespaces "{ns}" not found')
            kind = KINDS[plural]
            if method == "POST" and not name:
                obj = dict(body)
                obj.setdefault("metadata", {})["namespace"] = ns
                if (plural, ns, obj["metadata"]["name"]) in self.objects:
                    return _status(409, "AlreadyExists", f'{plural} "{obj["metadata"]["name"]}" already exists')
                obj.setdefault("status", {})
                self.put(plural, obj)
                self.on_create(self, plural, obj)
                return 201, obj
            if method == "GET" and not name:
                selector = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv)
                items = [o for (p, n, _), o in sorted(self.objects.items()) if p == plural and n == ns
                         and all(o["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]
                return 200, {"apiVersion": "v1", "kind": f"{kind}List", "metadata": {}, "items": items}
            obj = self.objects.get((plural, ns, name))
            if obj is None:
                return _status(404, "NotFound", f'{plural} "{name}" not found')
            if method == "GET" and m["log"]:
                return 200, self.logs.get(name, "")
            if method == "GET":
                return 200, obj
            if method == "PATCH":
                _merge(obj, body)
                return 200, obj
            if method == "DELETE":
                self._delete(plural, ns, name)
                return 200, {"apiVersion": "v1", "kind": "Status", "status": "Success", "details": {"name": name, "kind": plural}}
            return _status(405, "MethodNotAllowed", f"{method} not allowed")

    def _delete(self, plural: str, ns: str, name: str) -> None:
        obj = self.objects.pop((plural, ns, name), None)
        if obj is None:
            return
        uid = obj["metadata"]["uid"]
        for key, dep in list(self.objects.items()):  # the garbage collector: dependents go too
            if any(ref.get("uid") == uid for ref in dep["metadata"].get("ownerReferences", [])):
                self._delete(*key)


def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason, "code": code}


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = v


def _handler(cluster: StubCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            with cluster.lock:
                cluster.requests.append((self.command, self.path))
            code, out = cluster.handle(self.command, url.path, parse_qs(url.query), body)
            data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(out, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    return Handler


class LocalKubelet:
    """`on_create` that runs each pod's container command as a local process, as a node would.

    Emulates just enough of a node for an indexed Job and the fetch pod: one pod per completion index
    with JOB_COMPLETION_INDEX set, `$(VAR)` expanded from the container's env as Kubernetes does, the
    runs volume and the spec ConfigMap mounted at local directories (paths rewritten), and cluster DNS
    replaced by `dns` overrides of env values (pod 0's name -> 127.0.0.1). The Job turns Complete or
    Failed when its pods exit. What runs is exactly the command the manifest carries.
    """

    def __init__(self, volume: Path, mount_path: str, dns: dict[str, str], python: str) -> None:
        self.volume, self.mount_path, self.dns, self.python = Path(volume), mount_path, dns, python
        self.threads: list[threading.Thread] = []

    def __call__(self, cluster: StubCluster, plural: str, obj: dict[str, Any]) -> None:
        if plural == "jobs":
            spec = obj["spec"]
            pods = [self._pod(cluster, obj, spec["template"], f"{obj['metadata']['name']}-{i}-x{i}", {"JOB_COMPLETION_INDEX": str(i)})
                    for i in range(spec["completions"])]
            obj["status"] = {"active": len(pods)}
            t = threading.Thread(target=self._finish_job, args=(cluster, obj, pods), daemon=True)
        elif plural == "pods":
            t = threading.Thread(target=self._run, args=(cluster, obj, {}), daemon=True)
        else:
            return
        t.start()
        self.threads.append(t)

    def join(self, timeout: float = 120) -> None:
        for t in self.threads:
            t.join(timeout)

    def _pod(self, cluster: StubCluster, owner: dict, template: dict, name: str, extra: dict[str, str]) -> threading.Thread:
        pod = cluster.add_pod(name, dict(template["metadata"]["labels"]), "Running", owner=owner, ns=owner["metadata"]["namespace"])
        pod["spec"] = template["spec"]
        t = threading.Thread(target=self._run, args=(cluster, pod, extra), daemon=True)
        t.start()
        return t

    def _finish_job(self, cluster: StubCluster, job: dict, pods: list[threading.Thread]) -> None:
        for t in pods:
            t.join()
        with cluster.lock:
            phases = [p["status"]["phase"] for p in cluster.objects.values()
                      if p["kind"] == "Pod" and any(r["uid"] == job["metadata"]["uid"] for r in p["metadata"].get("ownerReferences", []))]
            ok = phases and all(ph == "Succeeded" for ph in phases)
            job["status"] = {"succeeded": phases.count("Succeeded"), "failed": phases.count("Failed"),
                             "conditions": [{"type": "Complete" if ok else "Failed", "status": "True",
                                             "reason": "" if ok else "BackoffLimitExceeded", "message": ""}]}

    def _run(self, cluster: StubCluster, pod: dict, extra: dict[str, str]) -> None:
        import os
        import subprocess
        import tempfile

        container = pod["spec"]["containers"][0]
        env = {e["name"]: self.dns.get(e.get("value", ""), e.get("value", "")) for e in container.get("env", []) if "value" in e}
        env.update(extra, HOSTNAME=pod["metadata"]["name"])
        scratch = self.volume.parent / "kubelet"  # beside the volume: the test's tmp_path cleans it up
        scratch.mkdir(parents=True, exist_ok=True)
        spec_dir = Path(tempfile.mkdtemp(prefix="configmap-", dir=scratch))
        for vol in pod["spec"].get("volumes", []):
            if "configMap" in vol:
                cm = cluster.get("configmaps", vol["configMap"]["name"], pod["metadata"]["namespace"]) or {"data": {}}
                for key, text in cm["data"].items():
                    (spec_dir / key).write_text(text)
        bindir = Path(tempfile.mkdtemp(prefix="bin-", dir=scratch))
        # A wrapper, not a symlink: a link to a virtualenv's python, found in another directory, starts the base
        # interpreter without the virtualenv's packages (Python looks for pyvenv.cfg beside the name it was run as).
        (bindir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(self.python)} "$@"\n')
        (bindir / "python").chmod(0o755)

        def local(arg: str) -> str:
            arg = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg)
            return arg.replace(self.mount_path, str(self.volume)).replace("/etc/scalelab", str(spec_dir))

        cmd = [local(a) for a in container["command"]]
        full_env = {**os.environ, **env, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=600)
        with cluster.lock:
            cluster.logs[pod["metadata"]["name"]] = proc.stdout + proc.stderr
            pod["status"] = {"phase": "Succeeded" if proc.returncode == 0 else "Failed"}
