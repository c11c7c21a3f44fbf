"""A Slurm job id in launch.json is checked before `launch cancel` and `launch status` act on it
(issue #12, item 4, on the Slurm backend): its name, user and working directory must be the run's, or
nothing is sent to it. Offline: fake squeue, sacct and scancel on PATH play the controller."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import fake_commands

from scalelab.core.errors import ScalelabError
from scalelab.core.rundir import RUNNING, start_state
from scalelab.slurm.backend import SlurmBackend, job_mismatch, job_owner

# The controller's view of one job: squeue answers from $FAKE_SLURM/job (name|user|workdir) until
# scancel has run; sacct answers from $FAKE_SLURM/acct. Every call is logged in $FAKE_SLURM/calls.
FAKE = {
    "squeue": """#!/bin/bash
echo "squeue $*" >> "$FAKE_SLURM/calls"
[ -e "$FAKE_SLURM/cancelled" ] && exit 0
case "$*" in *%T*) echo "4242|RUNNING" ;; *%j*) cat "$FAKE_SLURM/job" 2>/dev/null ;; esac  # %i|%T: id|state
""",
    "sacct": """#!/bin/bash
echo "sacct $*" >> "$FAKE_SLURM/calls"
cat "$FAKE_SLURM/acct" 2>/dev/null; exit 0
""",
    "scancel": """#!/bin/bash
echo "scancel $*" >> "$FAKE_SLURM/calls"; touch "$FAKE_SLURM/cancelled"
""",
}


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch) -> Path:
    return fake_commands(tmp_path / "fake-slurm", FAKE, monkeypatch)


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "slurm").mkdir(parents=True)
    start_state(run, backend="slurm", state=RUNNING, job_id="4242",
                runs=[{"job_id": "4242", "folder": str(run / "slurm")}], **job_owner("", "scalelab-run"))
    return run


def _calls(slurm: Path) -> list[str]:
    return (slurm / "calls").read_text().splitlines() if (slurm / "calls").exists() else []


@pytest.mark.parametrize("job, differs", [
    ("scalelab-other|{user}|{cwd}", "name"),            # another run's job: an edited id
    ("backup-db|{user}|{cwd}", "name"),                 # an unrelated job of this user (id reused)
    ("scalelab-run|alice|{cwd}", "user"),               # someone else's job: root could cancel it
    ("scalelab-run|{user}|/somewhere/else", "workdir"),
])
def test_cancel_refuses_a_job_that_is_not_the_runs(slurm: Path, tmp_path: Path, job: str, differs: str) -> None:
    run = _run(tmp_path)
    owner = job_owner()
    (slurm / "job").write_text(job.format(user=owner["user"], cwd=owner["workdir"][0]) + "\n")
    with pytest.raises(ScalelabError) as info:
        SlurmBackend().cancel(run, grace_s=5)
    message = str(info.value)
    assert f"its {differs} is" in message and "nothing was sent to it" in message and "4242" in message
    assert not [c for c in _calls(slurm) if c.startswith("scancel")], "scancel reached a job of another run"


def test_cancel_of_the_runs_own_job_sends_scancel(slurm: Path, tmp_path: Path) -> None:
    run = _run(tmp_path)
    owner = job_owner()
    (slurm / "job").write_text(f"scalelab-run|{owner['user']}|{owner['workdir'][0]}\n")
    SlurmBackend().cancel(run, grace_s=5)
    assert [c for c in _calls(slurm) if c.startswith("scancel")] == ["scancel 4242"]


def test_status_does_not_report_another_jobs_state(slurm: Path, tmp_path: Path) -> None:
    """A job gone from the queue is checked against accounting (sacct) instead."""
    run = _run(tmp_path)
    (slurm / "acct").write_text(f"nightly-backup|{job_owner()['user']}|/srv\n")
    status = SlurmBackend().status(run)
    assert status.state == "UNKNOWN" and "not this run's job" in status.detail and "nightly-backup" in status.detail


def test_a_run_recorded_before_users_were_is_checked_against_this_user() -> None:
    assert job_mismatch({"job_name": "a"}, {"name": "a", "user": job_owner()["user"], "workdir": "/x"}) == ""
    assert "user" in job_mismatch({"job_name": "a"}, {"name": "a", "user": "someone-else", "workdir": "/x"})
    assert job_mismatch({"job_name": "a"}, {}) == "", "a job Slurm no longer knows has nothing to compare"


def test_what_slurm_will_show_is_read_from_the_script() -> None:
    """`--sbatch-arg` may add a --job-name or --chdir after submitit's: Slurm takes the last one."""
    owner = job_owner("#SBATCH --job-name=a\n#SBATCH --chdir=/srv/x\n#SBATCH --job-name=b\n", "a")
    assert owner["job_name"] == "b" and owner["workdir"][0] == "/srv/x"
    assert job_owner("", "scalelab-x")["workdir"][0] == os.getcwd()
