"""How often the Slurm backend asks Slurm, without a cluster: stand-in `sbatch`, `sacct` and `squeue`
on PATH log every call to one file, and the tests count them (issue 18: one sacct query for all the
jobs of a sweep, with back-off; squeue only for the jobs accounting lags on, batched, and never more
often than sacct).

The stand-in sacct answers its N-th call from line N of `sacct-states` (the last line after that):
one state for every job asked about, or `-` for no rows at all (accounting does not know the jobs
yet). The stand-in squeue lists every job asked about as RUNNING until sacct has said COMPLETED,
then none (the jobs left the queue). So what the backend learns depends on how many times it asked,
not on when: the counts below do not depend on timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import fake_commands

from scalelab.core.records import RecordWriter
from scalelab.core.rundir import SWEEP_FILE, read_state, write_json
from scalelab.core.spec import Spec, save_spec
from scalelab.launcher.cli import main
from scalelab.launcher.sweep import continue_sweep, sweep_specs
from scalelab.slurm.backend import SlurmBackend, SlurmWatcher

# The ownership query (scalelab/slurm/backend.py job_fields: is the job in launch.json the run's?) is logged apart
# and answered with nothing: these tests count the status queries only.
LOG = ('case "$*" in *"%j|%u|%Z"*|*JobName,User,WorkDir*) echo "$(basename "$0")-owner $*" >> "$FAKE_SLURM/calls"; '
       'exit 0;; esac\necho "$(basename "$0") $*" >> "$FAKE_SLURM/calls"\n')
FAKES = {
    "sbatch": "#!/bin/bash\n" + LOG + """[ "$1" = --test-only ] && exit 0
n=$(( $(cat "$FAKE_SLURM/last-id" 2>/dev/null || echo 100) + 1 )); echo $n > "$FAKE_SLURM/last-id"
echo "Submitted batch job $n"
""",
    "sacct": "#!/bin/bash\n" + LOG + """n=$(grep -c '^sacct ' "$FAKE_SLURM/calls"); last=$(wc -l < "$FAKE_SLURM/sacct-states")
state=$(sed -n "$(( n < last ? n : last ))p" "$FAKE_SLURM/sacct-states"); echo "$state" > "$FAKE_SLURM/sacct-last"
echo "JobID|State|NodeList"
[ "$state" = - ] && exit 0
while [ $# -gt 0 ]; do [ "$1" = -j ] && { echo "$2|$state|node1"; echo "$2.batch|$state|node1"; shift; }; shift; done
""",
    "squeue": "#!/bin/bash\n" + LOG + """[ "$(cat "$FAKE_SLURM/sacct-last" 2>/dev/null)" = COMPLETED ] && exit 0
while [ $# -gt 0 ]; do [ "$1" = -j ] && for id in ${2//,/ }; do echo "$id|RUNNING"; done; shift; done
""",
}


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch) -> Path:
    where = fake_commands(tmp_path / "fake-slurm", FAKES, monkeypatch)
    (where / "calls").write_text("")
    return where


def calls(where: Path, command: str | None = None) -> list[str]:
    lines = (where / "calls").read_text().splitlines()
    return [line for line in lines if command is None or line.split()[0] == command]


def sacct_answers(where: Path, *states: str) -> None:
    (where / "sacct-states").write_text("\n".join(states) + "\n")


def steps_recorded(run_dir: Path, world: int) -> None:
    """What the ranks would have written (the stand-in sbatch runs nothing), so the run summarises."""
    for rank in range(world):
        out = RecordWriter(run_dir, rank, world)
        out.write("start", nodes=1, gpus_per_node=world, global_batch=8)
        for step in range(1, 4):
            out.write("step", step=step, warmup=step == 1, step_s=0.1, samples=8, words=80, loss=2.0)
        out.event("end", step=3, reason="steps")
        out.close()


def two_layout_sweep(tmp_path: Path) -> Path:
    """A sweep over 1x1 and 1x2 on Slurm, written as `launch sweep` writes it, not yet submitted."""
    base = Spec.from_dict(dict(backend="slurm", engine={"name": "ddp"}, steps=3, warmup_steps=1)).validate()
    sweep = tmp_path / "runs" / "sweep"
    names = []
    for spec in sweep_specs(base, [(1, 1), (1, 2)], "strong"):
        run_dir = sweep / f"1x{spec.gpus_per_node}"
        run_dir.mkdir(parents=True)
        save_spec(spec, run_dir)
        steps_recorded(run_dir, spec.workers)
        names.append(run_dir.name)
    write_json(sweep / SWEEP_FILE, {"runs": names, "layouts": [[1, 1], [1, 2]]})
    return sweep


@pytest.mark.slow
def test_a_followed_sweep_queues_every_layout_first_and_asks_slurm_for_all_jobs_at_once(fake_slurm, tmp_path):
    # sacct: no rows yet, then PENDING (accounting lags: the controller runs them), RUNNING, COMPLETED
    sacct_answers(fake_slurm, "-", "PENDING", "RUNNING", "COMPLETED")
    sweep = continue_sweep(SlurmBackend({"python": sys.executable}), two_layout_sweep(tmp_path))

    log = calls(fake_slurm)
    assert len(calls(fake_slurm, "sbatch")) == 4, "each layout asked (--test-only) and sent, once"
    assert all(c.startswith("sbatch") for c in log[:4]), f"both layouts queued before either is followed: {log}"
    sacct = calls(fake_slurm, "sacct")
    assert len(sacct) == 4, f"one sacct call per answer needed, for both jobs at once: {sacct}"
    assert all("-j 101" in c and "-j 102" in c for c in sacct), sacct
    squeue = calls(fake_slurm, "squeue")
    lag, gone = squeue[:2], squeue[2:]
    assert all("-j 101,102 " in c for c in lag), f"the lagging jobs asked together, once per sacct call: {squeue}"
    assert [c.split("-j ")[1].split()[0] for c in gone] == ["101", "102"], f"then once each, as it left: {squeue}"
    assert [read_state(sweep / name)["state"] for name in ("1x1", "1x2")] == ["COMPLETED", "COMPLETED"]


def launched_sweep(tmp_path: Path) -> Path:
    """A 2-layout Slurm sweep whose launcher is gone while launch.json still says RUNNING."""
    sweep = two_layout_sweep(tmp_path)
    for job, name in (("201", "1x1"), ("202", "1x2")):
        write_json(sweep / name / "launch.json", {"backend": "slurm", "state": "RUNNING", "job_id": job,
                                                   "runs": [{"job_id": job, "folder": str(sweep / name / "slurm")}]})
    return sweep


@pytest.mark.parametrize("sacct, squeue_calls", [("RUNNING", 0), ("PENDING", 1)])
def test_status_of_a_sweep_is_one_sacct_query(fake_slurm, tmp_path, sacct, squeue_calls):
    sacct_answers(fake_slurm, sacct)
    sweep = launched_sweep(tmp_path)
    done = CliRunner().invoke(main, ["status", str(sweep), "--format", "json"])
    assert done.exit_code == 0, done.output
    assert '"state": "RUNNING"' in done.output
    (query,) = calls(fake_slurm, "sacct")
    assert "-j 201" in query and "-j 202" in query, query
    squeue = calls(fake_slurm, "squeue")
    assert len(squeue) == squeue_calls and all("-j 201,202 " in c for c in squeue), squeue


def test_squeue_is_asked_only_with_a_sacct_query(fake_slurm):
    """Polled as often as the runner polls, the watcher asks sacct per its back-off and squeue only
    right after a sacct query that left a job without a live state."""
    sacct_answers(fake_slurm, "PENDING")
    watcher = SlurmWatcher(delay_s=60)
    watcher.register_job("301")
    for _ in range(20):
        assert watcher.get_info("301")["State"] == "PENDING" and watcher.queued == {"301": "RUNNING"}
    assert len(calls(fake_slurm, "sacct")) == 1 and len(calls(fake_slurm, "squeue")) == 1
    watcher.get_info("301", "force")
    assert len(calls(fake_slurm, "sacct")) == 2 and len(calls(fake_slurm, "squeue")) == 2
    sacct_answers(fake_slurm, "RUNNING")
    watcher.get_info("301", "force")
    assert len(calls(fake_slurm, "sacct")) == 3 and len(calls(fake_slurm, "squeue")) == 2, "accounting caught up"
    assert watcher.queued == {}
