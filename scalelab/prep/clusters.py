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
import signal
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from scalelab.core.errors import SpecError
from scalelab.core.options import (
    BackendOptions,
    above,
    at_least,
    each,
    one_line,
    one_word,
    option,
)
from scalelab.prep.corpus import is_remote
from scalelab.prep.request import PrepRequest


@dataclass(frozen=True)
class PrepLocalOptions(BackendOptions):
    """A Dask LocalCluster of worker processes on this machine."""

    backend = "local prep"
    memory_limit: str = option("auto", "Memory limit per worker (Dask's syntax, e.g. 2GB; auto = a share of RAM).")
    wait_s: float = option(120.0, "Seconds to wait for the workers to start.", above(0))


@dataclass(frozen=True)
class PrepSlurmOptions(BackendOptions):
    """One Slurm job per Dask worker, through dask-jobqueue."""

    backend = "slurm prep"
    partition: str = option("", "Partition of the worker jobs [default: the cluster's].", one_word)
    account: str = option("", "Account to charge.", one_word)
    cpus_per_worker: int = option(1, "Cores per worker job.", at_least(1))
    mem_gb_per_worker: float = option(4.0, "Memory per worker job, in GB.", above(0))
    walltime: str = option("01:00:00", "Time limit of each worker job (Slurm's format).", one_word)
    interface: str = option("", "Network interface of the workers [default: the hostname's address].", one_word)
    sbatch: list[str] = option([], "More #SBATCH lines for the worker jobs.", each(one_line))
    wait_s: float = option(600.0, "Seconds to wait for the worker jobs to start.", above(0))


@dataclass(frozen=True)
class PrepK8sOptions(BackendOptions):
    """A dask-kubernetes DaskCluster (the Dask operator's custom resource)."""

    backend = "k8s prep"
    image: str = option("", "Worker image (built from scalelab/k8s/Dockerfile with scalelab[prep]).")
    namespace: str = option("default", "Namespace of the DaskCluster.", one_word)
    volume_claim: str = option("scalelab-runs", "ReadWriteMany claim mounted by the workers.", one_word)
    mount_path: str = option("/scalelab/runs", "Where the claim is mounted in the workers.", one_word)
    cpus_per_worker: int = option(1, "CPU request per worker.", at_least(1))
    mem_gb_per_worker: float = option(4.0, "Memory request per worker, in GiB.", above(0))
    service_account: str = option("", "Service account of the worker pods.", one_word)
    wait_s: float = option(900.0, "Seconds to wait for the workers to start.", above(0))


@dataclass(frozen=True)
class PrepAwsOptions(BackendOptions):
    """Workers here (or a --scheduler), reading and writing S3."""

    backend = "aws prep"
    region_name: str = option("", "S3 region [default: the boto3 chain].", one_word)
    endpoint_url: str = option("", "S3 endpoint (e.g. a test server).", one_word)
    memory_limit: str = option("auto", "Memory limit per local worker (Dask's syntax).")
    wait_s: float = option(120.0, "Seconds to wait for the workers to start.", above(0))


# Each cluster kind's options, declared once (defaults, help, checks); unknown keys are refused with the
# valid ones listed, values are read as the field's type (`--backend-opt cpus_per_worker=2`).
OPTIONS: dict[str, type[BackendOptions]] = {
    "local": PrepLocalOptions, "slurm": PrepSlurmOptions, "k8s": PrepK8sOptions, "aws": PrepAwsOptions,
}
SCHEDULER_PLACEHOLDER = "tcp://SCHEDULER:8786"  # in a rendered Slurm job script: the address once it listens


def resolve_options(request: PrepRequest) -> dict[str, Any]:
    """The backend's options with defaults filled in; SpecError on unknown or missing ones."""
    raw = request.backend_options
    text = all(isinstance(v, str) for v in raw.values())  # from --backend-opt KEY=VALUE: read as each field's type
    opts = dict(OPTIONS[request.backend].parse(raw, "from --backend-opt", text=text))
    if request.backend == "k8s" and not request.scheduler:
        if not opts["image"]:
            raise SpecError("--backend k8s needs --backend-opt image=IMAGE (built from scalelab/k8s/Dockerfile with scalelab[prep])")
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
    """A `distributed.Client` on the request's cluster, started here and closed on every path.

    On a stop (Ctrl-C, or the runner's SIGTERM turned into KeyboardInterrupt) the tasks are cancelled
    and Dask's loggers silenced before the cluster is torn down, so the launcher's one line is all
    that is said: no "Task exception was never retrieved", no worker tracebacks.
    """
    try:
        from distributed import Client
    except ImportError:
        raise SpecError('launch prep needs Dask: pip install "scalelab[prep]"') from None
    opts = resolve_options(request)
    if request.scheduler:
        with Client(request.scheduler) as client, _quiet_stop(client):
            yield client
        return
    with _cluster(request, opts, run_dir) as cluster, Client(cluster) as client, _quiet_stop(client):
        if request.backend in ("slurm", "k8s"):
            cluster.scale(request.workers)
        client.wait_for_workers(request.workers, timeout=opts["wait_s"])
        yield client


QUIET_LOGGERS = ("distributed", "asyncio", "tornado", "bokeh")


@contextmanager
def _quiet_stop(client: Any) -> Iterator[None]:
    """On KeyboardInterrupt: silence Dask's and asyncio's loggers for the teardown (and the exit)
    and cancel every task the client holds, then let the interruption go on."""
    try:
        yield
    except KeyboardInterrupt:
        silence_dask()
        try:
            futures = list(getattr(client, "futures", {}).values())
            if futures:
                client.cancel(futures, force=True)
        except Exception:  # noqa: BLE001 - best effort: the cluster is being closed anyway
            pass
        raise


def silence_dask() -> None:
    """Dask's, asyncio's and tornado's loggers say nothing from now on (a stopped prep's teardown)."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.disabled = True
        logger.setLevel(logging.CRITICAL + 1)
    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in QUIET_LOGGERS:
            logging.getLogger(name).disabled = True


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

    # preload: each worker process ignores SIGINT (tasks.dask_setup); the driver stops them on Ctrl-C
    return LocalCluster(**local_kwargs(request, opts), silence_logs=logging.CRITICAL, preload=["scalelab.prep.tasks"],
                        local_directory=str(Path(run_dir) / "dask"))
