"""`launch resume STUDY`: a study stopped part way goes on from where it stopped.

Why: a study wrote study.json only as each variant's sweep completed, and could not be resumed. A layout that failed
in its second variant left a study whose first variant was recorded and whose later ones were never made, and a
first variant that failed after launching a layout left no study.json at all; the only way on was to run the whole
study again (hours of GPUs for the seeds' studies). Now every variant's sweep, study.json and a copy of the study
file are written before the first run starts, as a sweep writes its layouts first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.core.rundir import COMPLETED, FAILED, run_state
from scalelab.train.loop import FAIL_AT_STEP_ENV
from tests.conftest import launch, only_run_dir, read_jsonl, run_entry

STUDY = """\
title: "Two variants"
seed_scale: two short variants of nmt-tiny
mode: strong
layouts: [1x1]
base:
  model: nmt-tiny
  engine: {name: single}
  steps: 3
  warmup_steps: 1
  checkpoint_every: 2
variants:
  - label: short
    set: {}
  - label: long
    set: {steps: 6}
tables: [throughput]
"""


def _starts(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "records" / "rank-0.jsonl") if r["kind"] == "start"]


@pytest.mark.slow
def test_a_study_stopped_in_its_second_variant_resumes_there_and_writes_its_tables(tmp_path: Path) -> None:
    """The second variant's rank exits after step 5 (its checkpoint: step 4); the first variant has completed. The
    study names itself as what to resume; the resume leaves the first variant alone, continues the second from
    its checkpoint, and writes study.md from the copy of the study file it ran (the original edited since)."""
    (tmp_path / "s.yaml").write_text(STUDY)
    first = launch("study", "s.yaml", "--runs-dir", "runs", cwd=tmp_path, env={FAIL_AT_STEP_ENV: "5"})
    assert first.returncode == 1, first.stderr[-3000:]
    study = only_run_dir(tmp_path / "runs")
    said = " ".join(first.stderr.split())
    assert f"`launch resume {study.relative_to(tmp_path)}` continues its unfinished layouts" in said, said
    assert "the study stopped at layout v1-" in said and "Traceback" not in first.stderr
    sweeps = json.loads((study / "study.json").read_text())["sweeps"]
    assert [s["label"] for s in sweeps] == ["short", "long"]
    short, long = (study / s["dir"] / "1x1" for s in sweeps)
    assert run_state(short) == COMPLETED and run_state(long) == FAILED
    assert not (study / "study.md").exists()

    (tmp_path / "s.yaml").write_text(STUDY.replace("Two variants", "Edited since"))
    resumed = launch("resume", str(study), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert run_state(long) == COMPLETED and len(_starts(short)) == 1  # the completed variant did not run again
    assert [s["resumed_from_step"] for s in _starts(long)] == [None, 4]
    text = (study / "study.md").read_text()
    assert "Two variants" in text and "Edited since" not in text
    rows = json.loads((study / "report.json").read_text())
    assert len(rows) == 2 and (study / "throughput.csv").exists()


def test_an_older_study_without_its_file_is_refused_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """A study directory from before the copy (study.json, no study.yaml) cannot be reported as a study after a
    resume: said in one line, naming what to do instead, and nothing is run."""
    study = tmp_path / "study-x-20260101-000000"
    (study / "v0-20260101-000000").mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({"title": "x", "sweeps": [{"label": "a", "dir": "v0-20260101-000000"}]}))
    code, err, _ = run_entry(["resume", str(study)], monkeypatch, capsys)
    assert code != 0 and "holds no copy of its study file (study.yaml)" in err and "launch study` again" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err


@pytest.mark.parametrize("flag", [["--detach"], ["--rank-output", "all"]])
def test_resume_of_a_study_refuses_the_one_run_flags(tmp_path: Path, monkeypatch, capsys, flag) -> None:
    study = tmp_path / "study-x-20260101-000000"
    study.mkdir()
    (study / "study.json").write_text(json.dumps({"title": "x", "sweeps": []}))
    code, err, _ = run_entry(["resume", str(study), *flag], monkeypatch, capsys)
    assert code == 2 and "a study" in err and "Traceback" not in err, err


def test_a_study_with_nothing_finished_names_itself_once_as_what_continues_it(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    """`launch report STUDY` before any layout completed: one error naming each variant's state and the study's
    resume once (it named each variant's sweep, each with its own `launch resume`)."""
    from scalelab.launcher.study import load_study, variant_specs
    from scalelab.launcher.sweep import make_sweep

    (tmp_path / "s.yaml").write_text(STUDY)
    study = load_study(tmp_path / "s.yaml")
    root = tmp_path / "study-two-variants-20260101-000000"
    root.mkdir()
    sweeps = [{"label": v.label, "dir": make_sweep(variant_specs(study, v), root, f"v{i}").name}
              for i, v in enumerate(study.variants)]
    (root / "study.json").write_text(json.dumps({"title": study.title, "sweeps": sweeps}))
    code, err, _ = run_entry(["report", str(root)], monkeypatch, capsys)
    said = " ".join(err.split())
    assert code == 2 and "no run of the study" in said and said.count("launch resume") == 1, said
    assert said.rstrip().endswith(f"`launch resume {root}` continues it"), said



class _RefusesLong:
    """A backend whose preflight refuses the 'long' variant's layout (as `sbatch --test-only` refuses 1x5)."""

    queues = True

    def for_sweep(self, name: str) -> "_RefusesLong":
        return self

    def for_spec(self, spec) -> "_RefusesLong":
        return self

    def preflight(self, spec, run_dirs) -> None:
        if spec.steps == 6:
            from scalelab.core.errors import SpecError

            raise SpecError(f"Slurm refused the job for {run_dirs[0].name}")


def test_a_layout_refused_in_a_later_variant_stops_the_study_before_anything_is_sent(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """Every variant's layouts are asked of the backend (`preflight`) before the first is submitted: a study whose
    second variant Slurm would refuse sent its first variant's jobs and then stopped with them spent."""
    import scalelab.launcher.study as study_mod
    from scalelab.core.errors import SpecError

    sent = []
    monkeypatch.setattr(study_mod, "sweep_backend", lambda sweep: _RefusesLong())
    monkeypatch.setattr(study_mod, "continue_sweep", lambda backend, sweep, within: sent.append(sweep))
    (tmp_path / "s.yaml").write_text(STUDY)
    with pytest.raises(SpecError, match="refused the job for 1x1"):
        study_mod.run_study(study_mod.load_study(tmp_path / "s.yaml"), tmp_path / "runs")
    assert sent == [] and list((tmp_path / "runs").iterdir()) == []  # nothing sent, no study directory left
