"""Issue #37 ask 3: `launch resume` checks spec.json against the spec the run last ran with.

A field that changes the trajectory (optimizer, learning rate and schedule, model and its arguments,
batch, precision, data, seed) edited in spec.json is refused, naming each difference (one
`launch: error:` line, exit 2, the run's state and files byte-for-byte as they were), unless
`--allow-changed FIELD` names it; then a `spec_changed` event in records/launcher-events.jsonl says from
which step what changed, the ranks accept the checkpoint's identity differing in that field, and
`launch report` says it. On the local backend, DDP and Horovod on 2 ranks each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import launch, needs_horovod, read_jsonl, run_entry, runs_made_once
from tests.test_issue37 import ENGINES as ISSUE37_ENGINES, SPEC, _copy, _one_error_line, _tree

# test_issue37.py's spec (4 steps, a checkpoint every 2, Adam at the default lr 0.001) and its made-once
# prefix: its DDP run is this file's too.
ENGINES = {"ddp": ISSUE37_ENGINES["ddp"], "horovod": ["--engine", "horovod", "--gpus-per-node", "2"]}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A COMPLETED 4-step run of each engine (checkpoint at step 4), made once; tests work on copies."""
    return runs_made_once(tmp_path_factory, SPEC, ENGINES, "done")


def _edit(run: Path, **fields) -> None:
    """spec.json edited by hand: `steps` raised to 6 (so that the resume trains) and `fields` changed."""
    spec = json.loads((run / "spec.json").read_text())
    for key, value in fields.items():
        if "." in key:
            outer, inner = key.split(".")
            spec[outer][inner] = value
        else:
            spec[key] = value
    (run / "spec.json").write_text(json.dumps({**spec, "steps": 6}))


def _steps(run: Path, rank: int = 0) -> list[dict]:
    return [r for r in read_jsonl(run / "records" / f"rank-{rank}.jsonl") if r["kind"] == "step"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_a_changed_learning_rate_is_refused_then_recorded_when_allowed(engine, finished, tmp_path) -> None:
    run = _copy(finished(engine), tmp_path / "run")
    _edit(run, lr=0.002, optimizer="sgd")
    before = _tree(run)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path))
    assert "optimizer adam -> sgd; lr 0.001 -> 0.002" in err, err
    assert "--allow-changed optimizer --allow-changed lr" in err, err
    assert _tree(run) == before, "a refused resume changed the run directory"

    err = _one_error_line(launch("resume", str(run), "--allow-changed", "lr", cwd=tmp_path))  # one of the two
    assert "optimizer adam -> sgd" in err and "lr 0.001" not in err, err
    assert _tree(run) == before

    proc = launch("resume", str(run), "--allow-changed", "lr", "--allow-changed", "optimizer", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "spec changed from step 5" in proc.stdout, proc.stdout[-2000:]
    for rank in (0, 1):
        lrs = {s["step"]: s["lr"] for s in _steps(run, rank)}
        assert sorted(lrs) == [1, 2, 3, 4, 5, 6]
        assert lrs[5] == pytest.approx(2 * lrs[4]) and lrs[6] == lrs[5], lrs  # the new value from step 5 on
    events = read_jsonl(run / "records" / "launcher-events.jsonl")
    changed = [e for e in events if e["event"] == "spec_changed"]
    assert len(changed) == 1 and changed[0]["step"] == 5
    assert changed[0]["changes"] == {"optimizer": {"was": "adam", "now": "sgd"}, "lr": {"was": 0.001, "now": 0.002}}
    assert json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"

    report = launch("report", str(run), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    said = " ".join(report.stderr.split())
    assert "from step 5: optimizer adam -> sgd; lr 0.001 -> 0.002" in said, report.stderr

    proc = launch("resume", str(run), cwd=tmp_path)  # the changed spec is now the run's: nothing more to say
    assert proc.returncode == 0 and "COMPLETED already" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_an_allowed_batch_change_reaches_the_ranks(engine, finished, tmp_path) -> None:
    """The checkpoint's identity holds the global batch: the ranks refused it before; allowed, they take it."""
    run = _copy(finished(engine), tmp_path / "run")
    _edit(run, global_batch=16)
    before = _tree(run)
    err = _one_error_line(launch("resume", str(run), cwd=tmp_path))
    assert "global_batch 8 -> 16" in err and "--allow-changed global_batch" in err, err
    assert _tree(run) == before
    proc = launch("resume", str(run), "--allow-changed", "batch", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = {s["step"]: s["samples"] for s in _steps(run, 0)}
    assert samples[4] == 4 and samples[5] == 8, samples  # each of 2 ranks: 8/2, then 16/2


# ---- fast: the check itself, on a run directory made by hand ---------------------------------------


def _run_dir(tmp_path: Path, **spec_fields) -> Path:
    """A run directory as a submit leaves it: spec.json and the `trajectory` event of that spec."""
    from scalelab.core.spec import Spec, save_spec
    from scalelab.core.trajectory import record_trajectory

    run = tmp_path / "run"
    run.mkdir()
    spec = Spec.from_dict({"engine": {"name": "single"}, "data": {"kind": "task"}, **spec_fields}).validate()
    save_spec(spec, run)
    record_trajectory(spec, run)
    (run / "launch.json").write_text(json.dumps({"state": "CANCELLED", "run_dir": str(run)}))
    return run


def _refused_naming(run: Path, words: list[str], monkeypatch, capsys) -> None:
    """`launch resume RUN` refused in one error line holding each of `words`, the run left as it was."""
    before = _tree(run)
    code, err, _ = run_entry(["resume", str(run)], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert _tree(run) == before


@pytest.mark.parametrize("edit, words", [
    ({"lr": 0.01}, ["lr 0.001 -> 0.01", "--allow-changed lr"]),
    ({"lr_warmup_steps": 5}, ["lr_warmup_steps 0 -> 5"]),
    ({"model_args": {"hidden_size": 64}}, ["model_args {} -> {'hidden_size': 64}"]),
    ({"precision": "bf16"}, ["precision fp32 -> bf16"]),
    ({"data": {"kind": "synthetic"}}, ["data.kind task -> synthetic", "--allow-changed data.kind"]),
    ({"batch_per_worker": 4}, ["batch_per_worker (none) -> 4"]),
    ({"seed": 7}, ["seed 1234 -> 7"]),
])
def test_each_trajectory_field_is_named(edit, words, tmp_path, monkeypatch, capsys) -> None:
    run = _run_dir(tmp_path)
    spec = json.loads((run / "spec.json").read_text())
    for key, value in edit.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) and key != "model_args" else value
    (run / "spec.json").write_text(json.dumps(spec))
    _refused_naming(run, words, monkeypatch, capsys)


@pytest.mark.parametrize("edit", [{"nodes": 2, "engine": {"name": "ddp"}}, {"engine": {"name": "horovod"}}, {"threads": 1}, {"checkpoint_every": 3}])
def test_a_change_that_keeps_the_trajectory_is_not_refused(edit, tmp_path) -> None:
    """Layout, engine, threads and checkpoints: the same seed and batch give the same losses on any."""
    from scalelab.core.spec import read_spec
    from scalelab.core.trajectory import check_resume

    run = _run_dir(tmp_path)
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, **edit}))
    assert check_resume(run, read_spec(run).validate()) == {}


def test_allow_changed_names_a_known_field(tmp_path, monkeypatch, capsys) -> None:
    run = _run_dir(tmp_path)
    code, err, _ = run_entry(["resume", str(run), "--allow-changed", "learning_rate"], monkeypatch, capsys)
    assert code == 2 and err.count("launch: error:") == 1 and "Traceback" not in err, err
    assert "'learning_rate' is not a field" in err and "lr," in err, err


def test_identity_fields_accepted_are_those_of_the_last_change(tmp_path) -> None:
    """What the ranks skip when they compare the checkpoint's identity: the last spec_changed event's."""
    from scalelab.core.trajectory import accepted_identity_changes, record_changes

    run = _run_dir(tmp_path)
    assert accepted_identity_changes(run) == {}
    record_changes(run, {"lr": [0.001, 0.01]})
    assert accepted_identity_changes(run) == {}  # the lr is no part of the identity
    record_changes(run, {"batch_per_worker": [None, 4], "optimizer": ["adam", "sgd"]})
    assert accepted_identity_changes(run) == {"global_batch": True, "optimizer": True}


# ---- a property: whatever is edited, exactly the trajectory fields changed are named -----------------

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is a test dependency (pyproject's dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EDITS = st.fixed_dictionaries({}, optional={
    "lr": st.sampled_from([0.001, 0.002, 1e-4, 10.0]), "optimizer": st.sampled_from(["adam", "sgd"]),
    "seed": st.sampled_from([1234, 7]), "precision": st.sampled_from(["fp32", "bf16"]),
    "global_batch": st.sampled_from([None, 16, 32]), "lr_warmup_steps": st.sampled_from([0, 3]),
    "steps": st.sampled_from([40, 80]), "threads": st.sampled_from([None, 1]), "checkpoint_every": st.sampled_from([0, 2]),
    "model_args": st.sampled_from([{}, {"dropout": 0.1}, {"hidden_size": 64}]), "rnn": st.sampled_from(["fused", "stepwise"]),
})
ALLOW = st.lists(st.sampled_from(["lr", "optimizer", "seed", "precision", "batch", "global_batch", "lr_warmup_steps",
                                  "model_args", "rnn", "data"]), max_size=4)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=EDITS, allow=ALLOW)
def test_exactly_the_changed_trajectory_fields_are_named_or_allowed(edit, allow, tmp_path_factory) -> None:
    from scalelab.core.errors import SpecError
    from scalelab.core.spec import read_spec
    from scalelab.core.trajectory import allowed_fields, check_resume, trajectory

    run = _run_dir(tmp_path_factory.mktemp("prop"))
    before = trajectory(read_spec(run).validate())
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, **edit}))
    now = read_spec(run).validate()
    changed = {k for k, v in trajectory(now).items() if before[k] != v}
    refused = changed - allowed_fields(allow)
    if refused:
        with pytest.raises(SpecError) as caught:
            check_resume(run, now, tuple(allow))
        for field in refused:
            assert f"--allow-changed {field} " in str(caught.value)
        for field in changed - refused:
            assert f"--allow-changed {field} " not in str(caught.value)
    else:
        assert set(check_resume(run, now, tuple(allow))) == changed


def test_a_sweeps_resume_checks_each_unfinished_layout(tmp_path, monkeypatch, capsys) -> None:
    """`launch resume SWEEP_DIR` compares every layout it would continue before any is submitted."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    layout = _run_dir(sweep)  # sweep/run, CANCELLED
    (sweep / "sweep.json").write_text(json.dumps({"runs": ["run"], "layouts": [[1, 1]]}))
    spec = json.loads((layout / "spec.json").read_text())
    (layout / "spec.json").write_text(json.dumps({**spec, "lr": 0.005}))
    before = _tree(sweep)
    code, err, _ = run_entry(["resume", str(sweep)], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "lr 0.001 -> 0.005" in err and str(layout) in err, err
    assert _tree(sweep) == before


def test_a_change_whose_resume_never_submitted_is_not_reported(tmp_path) -> None:
    """`spec_changed` is recorded before the submit (the ranks read it); a resume refused after it (a live
    run, a planted link) submitted nothing, so reports say only the changes a launch followed."""
    from scalelab.core.spec import read_spec
    from scalelab.core.trajectory import record_changes, record_trajectory, spec_changes

    run = _run_dir(tmp_path)
    record_changes(run, {"lr": [0.001, 0.01]})
    assert spec_changes(run) == []
    record_trajectory(read_spec(run).validate(), run)
    assert len(spec_changes(run)) == 1 and "from step 1: lr 0.001 -> 0.01" in spec_changes(run)[0]


# ---- a --script run: its code and arguments are its trajectory, the trainer's fields are not ------------


def _script_run(tmp_path: Path) -> Path:
    """A script run's directory as a submit leaves it (`_run_dir`'s, with --script train.py -- --lr 0.1)."""
    from scalelab.core.spec import Spec, save_spec
    from scalelab.core.trajectory import record_trajectory

    run = tmp_path / "run"
    run.mkdir()
    spec = Spec.from_dict({"engine": {"name": "single"}, "script": "train.py", "script_args": ["--lr", "0.1"]}).validate()
    save_spec(spec, run)
    record_trajectory(spec, run)
    (run / "launch.json").write_text(json.dumps({"state": "CANCELLED", "run_dir": str(run)}))
    return run


def test_a_script_runs_trainer_fields_are_not_its_trajectory(tmp_path) -> None:
    """An lr or seed left in a script run's spec.json (runs from before the trainer-only refusal have them)
    is never read by the script: editing it is no change of trajectory, and its resume is not refused."""
    from scalelab.core.spec import read_spec
    from scalelab.core.trajectory import check_resume

    run = _script_run(tmp_path)
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "lr": 0.5, "seed": 7, "optimizer": "sgd"}))
    assert check_resume(run, read_spec(run).validate(stored=True)) == {}


@pytest.mark.parametrize("edit, words", [
    ({"script_args": ["--lr", "0.2"]}, ["script_args ['--lr', '0.1'] -> ['--lr', '0.2']", "--allow-changed script_args"]),
    ({"script": "other.py"}, ["script train.py -> other.py", "--allow-changed script"]),
])
def test_a_script_runs_code_or_arguments_changed_are_refused(edit, words, tmp_path, monkeypatch, capsys) -> None:
    run = _script_run(tmp_path)
    (run / "train.py").write_text("")
    (run / "other.py").write_text("")
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, **edit}))
    monkeypatch.chdir(run)
    _refused_naming(run, words, monkeypatch, capsys)


def test_a_built_in_run_turned_into_a_script_run_is_refused(tmp_path) -> None:
    from scalelab.core.errors import SpecError
    from scalelab.core.spec import read_spec
    from scalelab.core.trajectory import check_resume

    run = _run_dir(tmp_path)
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "script": "train.py"}))
    with pytest.raises(SpecError, match=r"script \(none\) -> train.py"):
        check_resume(run, read_spec(run).validate(stored=True))
