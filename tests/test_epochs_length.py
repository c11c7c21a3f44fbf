"""`--epochs N` runs N epochs: the default 40 steps (built in, or a config file's) is no cap on them; only
steps chosen for the run (--steps, a spec file's `steps`) are a second bound, whichever ends first.

Why: `launch run --epochs 3` on 16 steps an epoch printed `step 40/40 ... ended (steps)` and recorded
"steps": 40, and `launch sweep --mode weak --epochs 3` stopped every layout at 40 steps, with nothing said.
"""

from __future__ import annotations

import json

import pytest
from conftest import launch, only_run_dir, read_jsonl, run_entry, steps_of

from scalelab.core.spec import Spec

TASK = ["--model", "sentiment-tiny", "--data", "task", "--train-samples", "512"]


@pytest.fixture
def quoted(monkeypatch):
    """The specs `launch run/sweep --dry-run` would launch, as they reach the cost preview."""
    seen: list[Spec] = []
    monkeypatch.setattr("scalelab.launcher.cli.show_quote", lambda specs, params: seen.extend(s for s, _ in specs))
    return seen


@pytest.fixture
def config_files(tmp_path, monkeypatch):
    """Config files on (conftest turns them off), the project's in the cwd."""
    monkeypatch.delenv("SCALELAB_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "scalelab.yaml"


@pytest.mark.parametrize("flags, length", [
    (["--epochs", "3"], (None, 3)),            # the epochs alone: no 40-step cap
    (["--epochs", "3", "--steps", "10"], (10, 3)),  # both chosen: whichever ends first
    ([], (40, None)),                          # neither: the default length
])
def test_the_length_a_run_asks_for(flags, length, quoted, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(["run", *TASK, "--global-batch", "32", *flags, "--dry-run"], monkeypatch, capsys)
    assert code == 0, err
    assert [(s.steps, s.epochs) for s in quoted] == [length]


def test_a_config_files_steps_do_not_cap_the_epochs(config_files, quoted, monkeypatch, capsys):
    config_files.write_text("steps: 7\n")
    code, err, _ = run_entry(["run", *TASK, "--global-batch", "32", "--epochs", "3", "--dry-run"], monkeypatch, capsys)
    assert code == 0, err
    code, err, _ = run_entry(["run", *TASK, "--global-batch", "32", "--dry-run"], monkeypatch, capsys)
    assert code == 0, err
    assert [(s.steps, s.epochs) for s in quoted] == [(None, 3), (7, None)]  # the default still is one without


def test_a_spec_files_steps_are_chosen_its_epochs_alone_are_not_capped(quoted, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "steps.yaml").write_text("model: sentiment-tiny\nsteps: 9\n")
    (tmp_path / "epochs.yaml").write_text("model: sentiment-tiny\nepochs: 2\n")
    for argv in (["--spec", "steps.yaml", "--epochs", "3"], ["--spec", "epochs.yaml"]):
        code, err, _ = run_entry(["run", *argv, "--data", "task", "--global-batch", "32", "--dry-run"], monkeypatch, capsys)
        assert code == 0, err
    assert [(s.steps, s.epochs) for s in quoted] == [(9, 3), (None, 2)]
    # a study's variant is a mapping too: `epochs: 5` without `steps: null` ran 40 steps
    assert (Spec.from_dict({"epochs": 5}).steps, Spec.from_dict({"epochs": 5, "steps": 8}).steps) == (None, 8)


def test_a_weak_sweep_of_epochs_runs_every_layouts_epochs(quoted, monkeypatch, capsys, tmp_path):
    """The README's `launch sweep --mode weak --epochs 3 --workers 1,2`: 3 and 6 epochs, no step cap."""
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(["sweep", *TASK, "--batch-per-worker", "32", "--mode", "weak", "--epochs", "3",
                              "--workers", "1,2", "--dry-run"], monkeypatch, capsys)
    assert code == 0, err
    assert [(s.workers, s.steps, s.epochs) for s in quoted] == [(1, None, 3), (2, None, 6)]


@pytest.mark.slow
def test_epochs_run_to_their_end_and_resume_to_more_epochs(tmp_path):
    """The review's repro: 512 samples / 32 = 16 steps an epoch, 3 epochs = 48 steps, ended by the epochs. A
    completed run of epochs says to raise `epochs` (not `steps`), and raising them continues it."""
    proc = launch("run", *TASK, "--global-batch", "32", "--epochs", "3", "--warmup-steps", "1",
                  "--checkpoint-every", "16", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(tmp_path / "runs")
    assert json.loads((run / "spec.json").read_text())["steps"] is None
    assert [s["step"] for s in steps_of(run)][-1] == 48 and "step 48/48" in proc.stderr
    ends = [r for r in read_jsonl(run / "records" / "rank-0.jsonl") if r.get("event") == "end"]
    assert (ends[-1]["step"], ends[-1]["reason"]) == (48, "epochs")

    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0 and "raise `epochs` in its spec.json" in proc.stdout, proc.stdout + proc.stderr
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "epochs": 4}))
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [s["step"] for s in steps_of(run)][-1] == 64


# ---- the cost preview counts the steps the run will take ------------------------------------------


PRICED = ["--rate", "1.14/gpu-hour", "--dry-run"]


def test_the_preview_prices_the_epochs_not_a_larger_steps(monkeypatch, capsys, tmp_path):
    """The review's repro: 100,000 steps priced at $15.83 and refused by --max-usd 1, though 3 epochs of 16
    steps end the run after 48 steps."""
    monkeypatch.chdir(tmp_path)  # no measured runs: 0.5 s a step, assumed
    code, err, _ = run_entry(["run", *TASK, "--global-batch", "32", "--epochs", "3", "--steps", "100000",
                              "--max-usd", "1", *PRICED], monkeypatch, capsys)
    assert code == 0, err
    assert "for 48 steps (--epochs 3 x 16 steps an epoch, fewer than --steps 100,000)" in err, err
    assert "would be refused" not in err
    code, err, _ = run_entry(["run", *TASK, "--global-batch", "32", "--epochs", "3", "--steps", "20", *PRICED],
                             monkeypatch, capsys)
    assert code == 0 and "for 20 steps (--steps 20, fewer than --epochs 3 x 16 steps an epoch)" in err, err


def test_the_sweep_preview_prices_each_layouts_epochs(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(["sweep", *TASK, "--batch-per-worker", "32", "--mode", "weak", "--epochs", "3",
                              "--workers", "1,2", *PRICED], monkeypatch, capsys)
    assert code == 0, err
    assert "1x1: " in err and "for 48 steps (--epochs 3 x 16 steps an epoch)" in err, err
    assert "1x2: " in err and "for 48 steps (--epochs 6 x 8 steps an epoch)" in err, err


def test_data_read_at_start_prices_at_most_its_steps():
    from scalelab.costs.expected import planned_steps

    text = {"model": "sentiment-tiny", "data": {"kind": "text"}}
    steps, basis = planned_steps(Spec.from_dict({**text, "epochs": 3, "steps": 500}))
    assert steps == 500 and basis.startswith("at most: --steps 500; --epochs 3 may end it sooner"), basis
    steps, basis = planned_steps(Spec.from_dict({**text, "epochs": 3}))
    assert steps is None and "give --steps too" in basis
    assert planned_steps(Spec.from_dict({**text, "steps": 30})) == (30, "")


@pytest.mark.parametrize("kind, samples, batch", [("task", 512, 32), ("task", 1000, 48), ("synthetic", 4096, 64),
                                                  ("synthetic", 4096, 512)])
def test_the_preview_cuts_epochs_as_the_data_does(kind, samples, batch):
    """The steps an epoch the preview counts (without torch) are those the trainer's dataset cuts."""
    from scalelab.core.presets import PRESETS
    from scalelab.train.datasets import build_dataset
    from scalelab.train.loop import data_options

    spec = Spec.from_dict({"model": "sentiment-tiny", "data": {"kind": kind, "train_samples": samples},
                           "global_batch": batch, "epochs": 2})
    dataset = build_dataset(kind, PRESETS["sentiment-tiny"], spec.seed, **data_options(spec))
    assert spec.known_steps_per_epoch() == dataset.steps_per_epoch(batch)
