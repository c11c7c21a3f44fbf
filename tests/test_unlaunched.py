"""A launch that fails before anything is submitted leaves no run directory, on every backend.

`launch` makes the run directory before the backend sends its request; where that request failed before anything
was launched (no launch.json), only a Slurm refusal (NotQueued) and a full disk removed it. A cluster that cannot
be reached left an empty directory that `launch ls` showed NEW for ever (a user review: k8s with no kubeconfig or
an unreachable API server; AWS with an unreachable endpoint, tests/test_aws_moto.py). Here the Kubernetes cases,
for a run and for a sweep, whose directory is removed the same way when none of its layouts was launched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import launch

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")

UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize("command", [[], ["sweep", "--workers", "1,2"]])
@pytest.mark.parametrize("kubeconfig, says", [(None, "no kubeconfig at"), (UNREACHABLE, "cannot reach the Kubernetes API")])
def test_a_k8s_launch_that_reaches_no_cluster_leaves_no_run_directory(tmp_path: Path, command, kubeconfig, says):
    config = tmp_path / "kubeconfig.yaml"
    if kubeconfig is not None:
        config.write_text(kubeconfig)
    out = launch(*command, "--backend", "k8s", "--image", "r/i:1", "--yes", "--runs-dir", "runs", cwd=tmp_path,
                 env={"KUBECONFIG": str(config)}, timeout=180)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == [], list(runs.iterdir())
