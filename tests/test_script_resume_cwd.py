"""A --script run's ranks start in the directory `launch run` started in, on every launch: `launch resume RUN`
from another directory runs them there too (relative paths in the script and its arguments resolve where the
run's first half wrote), and a resume whose recorded directory is gone is refused in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import launch, only_run_dir

# First launch: writes OUT/first.txt (relative to its working directory) and fails (a run to resume, without waiting for a cancel). A resume:
# reads data/points.csv and OUT/first.txt by relative path (both only in the run's own directory) and writes
# OUT/second.txt next to it.
SCRIPT = """import sys
from pathlib import Path
from scalelab import track
out = Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
if not (out / "first.txt").exists():  # the first launch (a resume elsewhere, too, before the fix)
    (out / "first.txt").write_text("first half")
    track.step(items=1, loss=1.0)
    sys.exit(3)
points = Path("data/points.csv").read_text()
(out / "second.txt").write_text((out / "first.txt").read_text() + " + " + points)
track.step(items=1, loss=0.5)
"""


def first_half(tmp_path: Path) -> tuple[Path, Path]:
    """(the project directory the run was launched from, the run directory) after a first launch that failed."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "points.csv").write_text("x,y\n1,2\n")
    (tmp_path / "code").mkdir()  # the script's folder is not its working directory: only the latter is checked
    (tmp_path / "code" / "train.py").write_text(SCRIPT)
    proc = launch("--script", "../code/train.py", "--engine", "single", "--", "--out", "outputs/x", cwd=project)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (project / "outputs" / "x" / "first.txt").read_text() == "first half"
    run_dir = only_run_dir(project / "runs")
    return project, run_dir


def test_a_resume_from_another_directory_runs_the_script_where_the_run_started(tmp_path: Path) -> None:
    project, run_dir = first_half(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = launch("resume", str(run_dir), cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (project / "outputs" / "x" / "second.txt").read_text() == "first half + x,y\n1,2\n"
    assert not (elsewhere / "outputs").exists() and list(elsewhere.iterdir()) == []
    assert "FileNotFoundError" not in launch("logs", str(run_dir), cwd=elsewhere).stdout
    assert json.loads((run_dir / "spec.json").read_text()).get("workdir") == str(project)  # recorded


def test_a_resume_whose_working_directory_is_gone_is_refused_in_one_line(tmp_path: Path) -> None:
    project, run_dir = first_half(tmp_path)
    moved = tmp_path / "runs-kept"
    shutil.move(str(project / "runs"), moved)  # the run directory kept, its project removed
    run_dir = moved / run_dir.name
    shutil.rmtree(project)
    before = (run_dir / "launch.json").read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = launch("resume", str(run_dir), cwd=elsewhere)
    assert resumed.returncode != 0
    lines = resumed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in resumed.stderr, resumed.stderr
    assert str(project) in lines[0] and "no longer exists" in lines[0] and "recreate" in lines[0], lines[0]
    assert (run_dir / "launch.json").read_text() == before  # nothing started, nothing written
    assert list(elsewhere.iterdir()) == [] and not project.exists()


def test_a_built_in_trainer_run_records_no_working_directory(tmp_path: Path) -> None:
    proc = launch("--model", "nmt-tiny", "--engine", "single", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert " cd " not in proc.stdout and "\ncd " not in proc.stdout


def test_a_slurm_script_run_is_submitted_to_run_where_it_was_first_launched(tmp_path) -> None:
    """Slurm: `launch resume` submits a new sbatch from wherever it is run; the job runs in the recorded
    directory (`--chdir`), as the local backend's processes do; a gone one is refused by the backend's check."""
    from scalelab.core.errors import SpecError
    from scalelab.core.spec import Spec
    from scalelab.slurm.backend import SlurmBackend

    first = tmp_path / "project"
    first.mkdir()
    spec = Spec.from_dict({"engine": {"name": "ddp"}, "gpus_per_node": 2, "script": "train.py",
                           "workdir": str(first), "backend": "slurm"}).validate()
    backend = SlurmBackend({"python": "/usr/bin/python3"})
    assert f"#SBATCH --chdir={first}" in backend.submit_dryrun(spec, tmp_path / "run").render()
    trainer = Spec.from_dict({"engine": {"name": "ddp"}, "gpus_per_node": 2, "backend": "slurm"}).validate()
    assert "--chdir" not in backend.submit_dryrun(trainer, tmp_path / "run2").render()
    first.rmdir()
    with pytest.raises(SpecError, match="no longer exists"):
        backend.check(spec)
