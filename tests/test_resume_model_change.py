"""`launch resume --allow-changed model_args` with a model the checkpoint cannot hold (user review, item 4).

It started the ranks, which failed with PyTorch's line per tensor ("size mismatch for ..."), turned the
CANCELLED run FAILED, and advised deleting the checkpoint - which the next resume refused (steps recorded, no
checkpoint). Now the launcher builds the model before and after on PyTorch's meta device and refuses a change
of tensor shapes in one line, before anything is written; the advice it gives (put the value back, or a new
run of the edited spec) works. The runs are test_issue37.py's completed 4-step runs, copied, marked CANCELLED.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.core.errors import ScalelabError
from tests.conftest import launch, runs_made_once
from tests.test_issue37 import ENGINES, SPEC, _copy, _one_error_line, _tree


@pytest.fixture(scope="module")
def completed(tmp_path_factory):
    return runs_made_once(tmp_path_factory, SPEC, ENGINES, "done")


def _set_model_args(run: Path, args: dict) -> None:
    spec = json.loads((run / "spec.json").read_text())
    spec["model_args"] = args
    (run / "spec.json").write_text(json.dumps(spec, indent=2))


@pytest.mark.slow
def test_a_model_the_checkpoint_cannot_hold_is_refused_before_anything_starts(completed, tmp_path) -> None:
    run = _copy(completed("single"), tmp_path / "run", state="CANCELLED")
    _set_model_args(run, {"hidden_size": 64})
    before = _tree(run)
    err = " ".join(_one_error_line(launch("resume", str(run), "--allow-changed", "model_args", cwd=tmp_path)).split())
    assert "cannot continue from its checkpoint with model_args {} -> {'hidden_size': 64}" in err, err
    assert "16 of its 19 tensors have other shapes, saved -> now (encoder.weight_ih_l0 [128, 32] -> [256, 32]" in err
    assert "and 14 more" in err and "size mismatch" not in err and "delete" not in err
    assert f"Put the value back in {run}/spec.json to resume" in err and f"launch run --spec {run}/spec.json" in err
    assert _tree(run) == before, "a refused resume changed the run (its state, its records)"
    # the advice works: with the value put back, the run resumes from its checkpoint
    _set_model_args(run, {})
    proc = launch("resume", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run / "launch.json").read_text())["state"] == "COMPLETED"


@pytest.mark.slow
def test_a_sweeps_layout_is_refused_before_any_layout_changes(completed, tmp_path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    run = _copy(completed("single"), sweep / "1x1", state="CANCELLED")
    _set_model_args(run, {"embed_size": 16})
    (sweep / "sweep.json").write_text(json.dumps({"runs": ["1x1"], "layouts": [[1, 1]]}))
    before = _tree(sweep)
    err = _one_error_line(launch("resume", str(sweep), "--allow-changed", "model_args", cwd=tmp_path))
    assert "cannot continue from its checkpoint with model_args {} -> {'embed_size': 16}" in err, err
    assert _tree(sweep) == before


def test_a_change_that_keeps_every_shape_goes_ahead(completed, tmp_path) -> None:
    """Another dropout, or the stepwise RNN for the fused one, fits the same checkpoint: not refused."""
    from scalelab.core.spec import read_spec
    from scalelab.launcher.runner import refuse_model_change

    run = _copy(completed("single"), tmp_path / "run", state="CANCELLED")
    _set_model_args(run, {"dropout": 0.3})
    spec = read_spec(run).validate(stored=True)
    refuse_model_change(run, spec, {"model_args": [{}, {"dropout": 0.3}], "rnn": ["stepwise", spec.rnn]})
    _set_model_args(run, {"enc_layers": 2})
    with pytest.raises(ScalelabError, match="tensors of the model are not in it"):
        refuse_model_change(run, read_spec(run).validate(stored=True), {"model_args": [{}, {"enc_layers": 2}]})
    (run / "checkpoint.pt").unlink()  # no checkpoint: nothing to fit (refuse_restart says what happens then)
    refuse_model_change(run, read_spec(run).validate(stored=True), {"model_args": [{}, {"enc_layers": 2}]})


def test_the_ranks_own_check_is_one_line_with_advice_that_works(tmp_path) -> None:
    """Where the launcher could not tell (a run from before the trajectory records), the ranks' message is a
    summary, not a line per tensor, and names the new run rather than deleting the checkpoint."""
    import torch

    from scalelab.train.checkpoint import CheckpointError, restore
    from scalelab.train.models import PRESETS, build_model, config_with_overrides

    saved = build_model(config_with_overrides(PRESETS["nmt-tiny"], {}))
    now = build_model(config_with_overrides(PRESETS["nmt-tiny"], {"hidden_size": 64}))
    optimizer = torch.optim.SGD(now.parameters(), lr=0.1)
    with pytest.raises(CheckpointError) as info:
        restore({"model": saved.state_dict(), "rng": [None]}, now, optimizer, 0, tmp_path)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "size mismatch" not in message and "delete" not in message
    assert "16 of its 19 tensors have other shapes" in message
    assert f"launch run --spec {tmp_path}/spec.json" in message
