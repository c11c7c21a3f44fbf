"""Slurm fixes found by a tester on the two-node test cluster (nodes with 4 GPUs each, by GRES).

- A sweep with one impossible layout (1x5) queued 1x1, cancelled it, recorded it FAILED with 1x5's error and
  said "nothing was queued"; every layout is now asked of Slurm (`sbatch --test-only`) before the first is sent.
- A layout the launcher cancelled because a later one was refused is recorded CANCELLED, saying why.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import launch, run_entry

pytestmark = pytest.mark.slow  # on the cluster

SMALL = ["--backend", "slurm", "--model", "nmt-tiny", "--threads", "1", "--warmup-steps", "1",
         "--global-batch", "20", "--steps", "8"]


def _jobs_named(prefix: str, since: float) -> list[str]:
    """The job ids Slurm accounting lists under a name starting with `prefix`, submitted since `since`."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 60))
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-S", start, "-o", "JobID,JobName"],
                         capture_output=True, text=True).stdout
    return [line.split("|")[0] for line in out.splitlines() if line.split("|")[-1].startswith(prefix)]


def test_a_sweep_with_one_impossible_layout_queues_nothing(slurm_cluster, tmp_path: Path) -> None:
    """1x5 on nodes of 4 GPUs: refused naming 1x5 before 1x1 is sent; no job, no sweep directory left."""
    name, since = f"bad{uuid.uuid4().hex[:6]}", time.time()
    done = launch("sweep", *SMALL, "--layouts", "1x1,1x5", "--name", name, "-y", "--runs-dir", "runs", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "1x5" in done.stderr and "Traceback" not in done.stderr
    assert not any((tmp_path / "runs").glob(f"{name}*")), "the refused sweep's directory was left"
    assert _jobs_named(f"scalelab-{name}", since) == [], "a layout was queued before the refusal"


def test_layouts_queued_before_a_refused_one_are_recorded_cancelled(slurm_cluster, tmp_path: Path, monkeypatch,
                                                                    capsys) -> None:
    """A refusal the preflight could not foresee (here: no preflight) cancels 1x1, recorded CANCELLED with why."""
    from scalelab.slurm.backend import SlurmBackend

    monkeypatch.setattr(SlurmBackend, "preflight", lambda self, spec, run_dirs: None, raising=False)
    monkeypatch.chdir(tmp_path)
    name = f"late{uuid.uuid4().hex[:6]}"
    code, err, _ = run_entry(["sweep", *SMALL, "--layouts", "1x1,1x5", "--name", name, "-y", "--runs-dir", "runs"],
                             monkeypatch, capsys)
    assert code == 2, err
    (sweep,) = (tmp_path / "runs").glob(f"{name}*")
    state = json.loads((sweep / "1x1" / "launch.json").read_text())
    assert state["state"] == "CANCELLED", state
    assert "layout 1x5" in state["detail"] and "refused" in state["detail"], state["detail"]
    assert "(1x1) was cancelled" in err, err


# ---- Slurm unreachable: a recorded end shown at once; sacct's errors one line; sbatch's not a refusal ----------


class _NoStatus:
    """A backend that must not be asked: the run's end is recorded."""

    def status(self, run_dir: Path):
        raise AssertionError("settle asked the backend about a run recorded as ended")


def test_settle_returns_a_recorded_end_without_asking_the_backend(tmp_path: Path) -> None:
    from scalelab.launcher.runner import settle

    (tmp_path / "launch.json").write_text(json.dumps({"backend": "slurm", "job_id": "111", "state": "CANCELLED",
                                                       "detail": "cancelled by the user"}))
    status = settle(_NoStatus(), tmp_path)
    assert (status.state, status.detail) == ("CANCELLED", "cancelled by the user")


def _unreachable_conf(where: Path) -> Path:
    """A copy of the cluster's slurm.conf whose controller and accounting ports nothing listens on."""
    text = Path("/etc/slurm/slurm.conf").read_text()
    lines = ["SlurmctldPort=6899" if line.startswith("SlurmctldPort=") else
             "AccountingStoragePort=6898" if line.startswith("AccountingStoragePort=") else line
             for line in text.splitlines()]
    conf = where / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def test_sacct_errors_are_one_line_not_printed(slurm_cluster, tmp_path: Path, monkeypatch, capfd) -> None:
    from scalelab.slurm.backend import SlurmWatcher

    monkeypatch.setenv("SLURM_CONF", str(_unreachable_conf(tmp_path)))
    watcher = SlurmWatcher(delay_s=2.0)
    watcher.register_job("111")
    watcher.update()
    assert "sacct" not in capfd.readouterr().err, "sacct's own error lines reached the terminal"
    assert getattr(watcher, "problem", "").startswith("sacct failed"), "the error was not kept as one line"


def test_sbatch_that_reaches_no_controller_is_not_called_a_refusal() -> None:
    from scalelab.slurm.backend import SlurmRequest, _refusal

    proc = subprocess.CompletedProcess(["sbatch"], 1, "", "sbatch: error: Batch job submission failed: Unable to "
                                       "contact slurm controller (connect failure)\n")
    said = _refusal("Slurm refused the job", proc, SlurmRequest(Path("/tmp/r1"), run_dirs=[Path("/tmp/r1")]))
    assert "refused" not in said, said
    assert "is slurmctld up?" in said and "scontrol ping" in said, said


# ---- the time limit with --no-requeue: the stop names the flag given -------------------------------------------


class _Executor:
    """submitit's executor as `_send` uses it, keeping the rank functions it is given instead of sending them."""

    def __init__(self) -> None:
        self.sent: list = []

    def submit(self, rank):
        self.sent.append(rank)
        return rank


def test_a_time_limit_stop_with_no_requeue_names_the_flag(tmp_path: Path, monkeypatch) -> None:
    """The rank function `--no-requeue` sends says, at the time limit, that --no-requeue was given."""
    import scalelab.slurm.backend as slurm
    from scalelab.slurm.rank import RankJob

    executor = _Executor()
    monkeypatch.setattr(slurm, "make_executor", lambda *args: executor)
    monkeypatch.setattr(slurm, "need", lambda command: None)
    backend = slurm.SlurmBackend({"requeue": False})
    backend._send(slurm.SlurmRequest(tmp_path, run_dirs=[tmp_path], parameters={}, python="python"))
    said = executor.sent[0]._why_not_requeued()
    assert "--no-requeue was given" in said and "no requeue is left" not in said, said
    spent = RankJob(tmp_path, 1, True).checkpoint().function  # requeued once: the last one spent next time
    assert "max_requeues" in spent._why_not_requeued() and spent.requeues_left == 0


# ---- a --gpu-type the cluster does not have: the hint names it and the types there are ------------------------


def test_an_unknown_gpu_type_is_named_with_the_types_the_nodes_have(slurm_cluster, tmp_path: Path) -> None:
    done = launch("run", *SMALL, "--gpu-type", "c", "-y", "--runs-dir", "runs", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "--gpu-type c" in done.stderr and "GPU types are a, b" in done.stderr, done.stderr


# ---- `launch logs` of a Slurm run: its note fits an 80-column terminal ------------------------------------------


def test_the_task_logs_note_fits_80_columns(tmp_path: Path, monkeypatch) -> None:
    from scalelab.slurm.backend import summarised_task_logs

    monkeypatch.setenv("COLUMNS", "80")
    folder = tmp_path / "runs" / "nmt-tiny-ddp-1x1-20261207-103551" / "slurm"
    folder.mkdir(parents=True)
    (folder / "7_0_log.out").write_text("submitit INFO (2026-12-07 10:00:00,123) - Starting with JobEnvironment()\n")
    (folder / "7_0_log.err").write_text("step 1\n")
    text = summarised_task_logs([folder / "7_0_log.out", folder / "7_0_log.err"])
    note = text.split("==>")[0]
    assert "left out" in note and str(folder) in note
    assert max(len(line) for line in note.splitlines()) <= max(80, len(str(folder)) + 1), note
