"""`--cuda-graph` (scalelab/train/graphs.py): which steps are captured, and that a captured step trains as
an eager one does. The capture itself needs a GPU: those tests are GPU-marked and run by scripts/gpu-check.sh
(and the issue-36 device runs); on a CPU the rules and the eager fallback are tested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scalelab.core.spec import EngineSpec
from scalelab.train import graphs
from scalelab.train.engines import make_engine
from tests.conftest import launch, only_run_dir, read_jsonl, steps_of

CUDA = torch.device("cuda", 0)


class _Engine:
    name = "ddp"

    def __init__(self, graphable: bool) -> None:
        self._graphable = graphable

    def graphable(self) -> bool:
        return self._graphable


def test_a_step_is_captured_only_where_the_graph_would_replay_the_same_work() -> None:
    """Each rule names its reason: off asked, no GPU, an exchange inside the backward, fp16's host-side
    skip, the stepwise RNN, an emulated slowdown; a single-engine bf16 fused step on a GPU is captured."""
    ok = dict(mode="auto", device=CUDA, engine=_Engine(True), precision="bf16", rnn="fused", slowdown=1.0)
    assert graphs.why_not(**ok) is None
    assert graphs.why_not(**{**ok, "mode": "off"}) == "--cuda-graph off"
    assert graphs.why_not(**{**ok, "device": torch.device("cpu")}) == "not on a GPU"
    assert "exchanges gradients" in graphs.why_not(**{**ok, "engine": _Engine(False)})
    assert "fp16" in graphs.why_not(**{**ok, "precision": "fp16"})
    assert "stepwise" in graphs.why_not(**{**ok, "rnn": "stepwise"})
    assert "slowdown" in graphs.why_not(**{**ok, "slowdown": 2.0})


def test_the_engines_say_whether_their_backward_can_be_captured() -> None:
    """The single engine can; DDP (hooks in the backward) cannot, unless its replicas exchange nothing."""
    single = make_engine(EngineSpec(name="single"))
    assert single.graphable()
    from scalelab.train.engines import DDPEngine

    eng = DDPEngine.__new__(DDPEngine)
    eng.exchanging = True
    assert not eng.graphable()
    eng.exchanging = False
    assert eng.graphable()


@pytest.mark.slow
def test_a_cpu_run_records_why_it_ran_eagerly(tmp_path: Path) -> None:
    """The start record says the graph is off and why; no step claims to be graphed; backward is timed."""
    proc = launch("run", "--model", "nmt-tiny", "--steps", "7", "--warmup-steps", "2", "--device", "cpu",
                  "--runs-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = only_run_dir(tmp_path)
    start = next(r for r in read_jsonl(run / "records" / "rank-0.jsonl") if r["kind"] == "start")
    assert start["cuda_graph"] == "off: not on a GPU"
    steps = steps_of(run)
    assert steps and not any(s.get("graphed") for s in steps)
    assert all(s["backward_s"] is not None for s in steps)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh runs it there)")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_graphed_run_trains_as_the_eager_run_does(tmp_path: Path, precision: str) -> None:
    """nmt-small on the GPU (the single engine: DDP's hooks are not captured), 12 steps with `--cuda-graph
    auto` and `off` from one seed: the steps after the
    capture are replays (`graphed`, backward not timed apart), the capture step is a warm-up step, and the
    losses of every step agree with the eager run's (the same kernels; atomics may reorder sums)."""
    losses = {}
    for mode in ("auto", "off"):
        out = tmp_path / mode
        proc = launch("run", "--model", "nmt-small", "--engine", "single", "--steps", "12", "--warmup-steps", "1", "--device", "cuda",
                      "--precision", precision, "--cuda-graph", mode, "--data", "synthetic",
                      "--runs-dir", str(out), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        steps = steps_of(only_run_dir(out))
        losses[mode] = [s["loss"] for s in steps]
        graphed = [s["step"] for s in steps if s.get("graphed")]
        if mode == "auto":
            assert graphed == list(range(graphs.EAGER_STEPS_FIRST + 1, 13)), json.dumps(steps[:4])
            assert steps[graphs.EAGER_STEPS_FIRST]["warmup"] is True  # the capture step
            assert all(s["backward_s"] is None for s in steps if s.get("graphed"))
            assert not any("graph_note" in s for s in steps), [s.get("graph_note") for s in steps]
        else:
            assert graphed == []
    assert losses["auto"] == pytest.approx(losses["off"], rel=2e-3 if precision == "bf16" else 1e-4)
