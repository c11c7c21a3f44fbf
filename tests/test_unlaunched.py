"""A launch that fails before anything is submitted leaves no run directory, on every backend.

`launch` makes the run directory before the backend sends its request; where that request failed before anything
was launched (no launch.json), only a Slurm refusal (NotQueued) and a full disk removed it. A cluster that cannot
be reached left an empty directory that `launch ls` showed NEW for ever (a user review: k8s with no kubeconfig or
an unreachable API server; AWS with an unreachable endpoint, tests/test_aws_moto.py). Here the Kubernetes cases,
for a run and for a sweep, whose directory is removed the same way when none of its layouts was launched; and a
study and a probe whose first submission Slurm refuses (a stand-in sbatch), which left their directories behind.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from conftest import launch

needs_kubernetes = pytest.mark.skipif(importlib.util.find_spec("kubernetes") is None,
                                      reason="the kubernetes client is not installed")

UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@needs_kubernetes
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


REFUSING_SBATCH = """#!/bin/bash
echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
exit 1
"""

STUDY = """title: "Refused: two variants"
mode: weak
layouts: [1x1]
base: {model: nmt-tiny, backend: slurm, batch_per_worker: 8, steps: 4, warmup_steps: 1}
variants:
  - {label: a, set: {rnn: fused}}
  - {label: b, set: {rnn: stepwise}}
tables: [throughput]
"""


@pytest.mark.parametrize("command", [
    ["study", "study.yaml"],
    ["probe", "--backend", "slurm", "--model", "nmt-tiny", "--warmup-steps", "1", "--probe-steps", "2",
     "--instance-types", "a", "--gpus-per-node", "1", "--yes"]])
def test_a_study_or_probe_that_slurm_refuses_leaves_no_directory(tmp_path: Path, command):
    """The study's sweep was removed but its empty study directory stayed; the probe directory (its runs'
    directories, sweep.json, probe.json) stayed whole: `launch ls` listed both for ever."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(REFUSING_SBATCH)
    (fake / "sbatch").chmod(0o755)
    (tmp_path / "study.yaml").write_text(STUDY)
    out = launch(*command, "--runs-dir", "runs", cwd=tmp_path, env={"PATH": f"{fake}{os.pathsep}/usr/bin:/bin"})
    assert out.returncode == 2 and "Slurm refused the job" in out.stderr and "Traceback" not in out.stderr, out.stderr
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == [], list(runs.rglob("*"))


def _fails_on_second_save(monkeypatch, module) -> None:
    """`save_spec` in `module` fails as a full disk does on the second layout's spec.json."""
    import errno

    from scalelab.core.spec import save_spec

    calls = []

    def save(spec, run_dir):
        calls.append(run_dir)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "spec.json"))
        return save_spec(spec, run_dir)

    monkeypatch.setattr(module, "save_spec", save)


def _specs():
    from scalelab.core.spec import Spec

    return [Spec.from_dict({"model": "nmt-tiny", "nodes": 1, "gpus_per_node": g}).validate() for g in (1, 2)]


def test_a_sweep_whose_layouts_cannot_be_written_leaves_no_directory(tmp_path: Path, monkeypatch):
    """A full disk while a sweep's layouts were written left RUNS/NAME/1x1/spec.json and an empty 1x2 with no
    sweep.json: `launch ls` listed it, `launch resume` could not take it. The directory goes, the error stays."""
    import scalelab.launcher.sweep as sweep

    _fails_on_second_save(monkeypatch, sweep)
    with pytest.raises(OSError, match="No space left"):
        sweep.run_sweep(None, _specs(), tmp_path / "runs", "s")
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_study_whose_first_sweep_cannot_be_written_leaves_no_directory(tmp_path: Path, monkeypatch):
    """The same under a study: its first sweep's layouts fail, so neither the sweep nor the study directory
    stays (the study caught only ScalelabError, so an OSError left the empty study directory)."""
    import scalelab.launcher.sweep as sweep
    from scalelab.launcher.study import load_study, run_study

    path = tmp_path / "study.yaml"
    path.write_text(STUDY.replace("layouts: [1x1]", "layouts: [1x1, 1x2]").replace("backend: slurm", "backend: local"))
    study = load_study(path)
    _fails_on_second_save(monkeypatch, sweep)
    with pytest.raises(OSError, match="No space left"):
        run_study(study, tmp_path / "runs")
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_probe_whose_runs_cannot_be_written_leaves_no_directory(tmp_path: Path, monkeypatch):
    """And a probe's directory (its runs, sweep.json and probe.json are written before anything is launched)."""
    import scalelab.launcher.probe as probe

    _fails_on_second_save(monkeypatch, probe)
    cand = probe.Candidate("local-1t", 2)
    with pytest.raises(OSError, match="No space left"):
        probe.create_probe_dir(tmp_path / "runs", "p", "local", "strong", 4, [(cand, s) for s in _specs()], [])
    assert list((tmp_path / "runs").iterdir()) == []
