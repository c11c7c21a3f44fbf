"""Dask clusters for `launch prep`, one kind per backend, each rendered before it is started.

- local: a `distributed.LocalCluster` of worker processes, one thread each.
- slurm: dask-jobqueue's `SLURMCluster`, one sbatch job per worker (`--dry-run` prints the job
  script; only the scheduler's address, known once it listens, differs from what is sent).
- k8s: a dask-kubernetes `DaskCluster` resource, created through the Dask operator by
  `KubeCluster(custom_cluster_spec=...)`; `--dry-run` prints it. Workers see files on a
  ReadWriteMany volume (as the k8s backend's runs do) or in S3.
- aws: worker processes here (or the running cluster given by `--scheduler`, e.g. on EC2) that
  read inputs from and write shards to S3; `endpoint_url` points them at any S3-compatible store.

`--scheduler ADDRESS` uses a Dask cluster that is already running, on any backend.
Options per kind are `OPTIONS` (defaults); unknown ones are refused with the valid ones listed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from core.errors import SpecError
from prep.corpus import is_remote
from prep.request import PrepRequest

OPTIONS: dict[str, dict[str, Any]] = {
    "local": {"memory_limit": "auto", "wait_s": 120},
    "slurm": {"partition": "", "account": "", "cpus_per_worker": 1, "mem_gb_per_worker": 4, "walltime": "01:00:00",
              "interface": "", "sbatch": [], "wait_s": 600},
    "k8s": {"image": "", "namespace": "default", "volume_claim": "scalelab-runs", "mount_path": "/scalelab/runs",
            "cpus_per_worker": 1, "mem_gb_per_worker": 4, "service_account": "", "wait_s": 900},
    "aws": {"region_name": "", "endpoint_url": "", "memory_limit": "auto", "wait_s": 120},
}
SCHEDULER_PLACEHOLDER = "tcp://SCHEDULER:8786"  # in a rendered Slurm job script: the address once it listens


def resolve_options(request: PrepRequest) -> dict[str, Any]:
    """The backend's options with defaults filled in; SpecError on unknown or missing ones."""
    valid = OPTIONS[request.backend]
    unknown = sorted(set(request.backend_options) - set(valid))
    if unknown:
        listed = ", ".join(f"{k} (default {v!r})" for k, v in valid.items())
        raise SpecError(f"unknown {request.backend} prep option(s): {', '.join(unknown)}; valid options: {listed}")
    opts = {**valid, **request.backend_options}
    if request.backend == "k8s" and not request.scheduler:
        if not opts["image"]:
            raise SpecError("--backend k8s needs --backend-opt image=IMAGE (built from k8s/Dockerfile with scalelab[prep])")
        outside = [p for p in _paths(request) if not is_remote(p) and not p.startswith(opts["mount_path"].rstrip("/") + "/")]
        if outside:
            raise SpecError(f"on --backend k8s the workers see only the volume at {opts['mount_path']} and remote URLs: "
                            f"{outside[0]} is neither (use a path under {opts['mount_path']} or s3://)")
    return opts


def _paths(request: PrepRequest) -> list[str]:
    return [request.out] + [p for patterns in request.inputs.values() for p in patterns or []]


def render(request: PrepRequest, run_dir: Path) -> str:
    """Exactly what starting the cluster sends: a job script, a DaskCluster manifest or the local
    cluster's settings (JSON)."""
    opts = resolve_options(request)
    if request.scheduler:
        return json.dumps({"scheduler": request.scheduler, "out": request.out}, indent=2)
    if request.backend == "slurm":
        return _job_script(request, opts, run_dir)
    if request.backend == "k8s":
        import yaml

        return yaml.safe_dump(daskcluster(request, opts, run_dir.name), sort_keys=False)
    return json.dumps({"cluster": "distributed.LocalCluster", **local_kwargs(request, opts),
                       "storage": request.storage.options, "out": request.out}, indent=2, default=str)


def _job_script(request: PrepRequest, opts: dict[str, Any], run_dir: Path) -> str:
    """The sbatch script of one worker. dask-jobqueue creates the log directory as it renders, so it
    renders into a scratch directory here and the text names the run's own: a dry run writes nothing."""
    from dask_jobqueue.slurm import SLURMJob

    kwargs = slurm_kwargs(request, opts, run_dir)
    with tempfile.TemporaryDirectory(prefix="prep-dryrun-") as scratch:
        real, kwargs["log_directory"] = kwargs["log_directory"], scratch
        script = SLURMJob(scheduler=SCHEDULER_PLACEHOLDER, name="scalelab-prep", **kwargs).job_script()
    return script.replace(scratch, real)


def local_kwargs(request: PrepRequest, opts: dict[str, Any]) -> dict[str, Any]:
    return {"n_workers": request.workers, "threads_per_worker": 1, "processes": True,
            "memory_limit": opts["memory_limit"], "dashboard_address": ":0"}


def slurm_kwargs(request: PrepRequest, opts: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """SLURMCluster settings: one single-process worker per job, `cpus_per_worker` cores each."""
    prologue = [f"export PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []
    kwargs: dict[str, Any] = {
        "cores": opts["cpus_per_worker"], "processes": 1, "memory": f"{opts['mem_gb_per_worker']}GB",
        "walltime": opts["walltime"], "job_name": "scalelab-prep", "python": sys.executable,
        "log_directory": str(Path(run_dir).resolve() / "logs"), "job_script_prologue": prologue,
        "job_extra_directives": list(opts["sbatch"]),
    }
    if opts["partition"]:
        kwargs["queue"] = opts["partition"]
    if opts["account"]:
        kwargs["account"] = opts["account"]
    return kwargs


def daskcluster(request: PrepRequest, opts: dict[str, Any], name: str) -> dict[str, Any]:
    """The DaskCluster resource (kubernetes.dask.org/v1): the scheduler, `workers` worker pods with
    the runs volume mounted, resources as asked."""
    from dask_kubernetes.operator import make_cluster_spec

    cpu, mem = str(opts["cpus_per_worker"]), f"{opts['mem_gb_per_worker']}Gi"
    cluster = "prep-" + re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].rstrip("-")
    spec = make_cluster_spec(name=cluster, image=opts["image"], n_workers=request.workers,
                             resources={"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}},
                             env={"PYTHONUNBUFFERED": "1"})
    spec["metadata"].update(namespace=opts["namespace"], labels={"scalelab.io/run": cluster, "scalelab.io/role": "prep"})
    worker = spec["spec"]["worker"]["spec"]
    worker["containers"][0]["args"] += ["--nthreads", "1"]
    if opts["volume_claim"]:
        worker["volumes"] = [{"name": "runs", "persistentVolumeClaim": {"claimName": opts["volume_claim"]}}]
        worker["containers"][0]["volumeMounts"] = [{"name": "runs", "mountPath": opts["mount_path"]}]
    if opts["service_account"]:
        for pod in (worker, spec["spec"]["scheduler"]["spec"]):
            pod["serviceAccountName"] = opts["service_account"]
    return spec


@contextmanager
def connect(request: PrepRequest, run_dir: Path) -> Iterator[Any]:
    """A `distributed.Client` on the request's cluster, started here and closed on every path."""
    try:
        from distributed import Client
    except ImportError:
        raise SpecError('launch prep needs Dask: pip install "scalelab[prep]"') from None
    opts = resolve_options(request)
    if request.scheduler:
        with Client(request.scheduler) as client:
            yield client
        return
    with _cluster(request, opts, run_dir) as cluster, Client(cluster) as client:
        if request.backend in ("slurm", "k8s"):
            cluster.scale(request.workers)
        client.wait_for_workers(request.workers, timeout=opts["wait_s"])
        yield client


def _cluster(request: PrepRequest, opts: dict[str, Any], run_dir: Path):
    if request.backend == "slurm":
        from dask_jobqueue import SLURMCluster

        extra = {"scheduler_options": {"interface": opts["interface"]}} if opts["interface"] else {}
        return SLURMCluster(**slurm_kwargs(request, opts, run_dir), **extra)
    if request.backend == "k8s":
        from dask_kubernetes.operator import KubeCluster

        spec = daskcluster(request, opts, run_dir.name)
        return KubeCluster(custom_cluster_spec=spec, namespace=opts["namespace"], shutdown_on_close=True)
    from distributed import LocalCluster

    return LocalCluster(**local_kwargs(request, opts), silence_logs=logging.CRITICAL,
                        local_directory=str(Path(run_dir) / "dask"))
