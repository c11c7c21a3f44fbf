"""The experiment spec: YAML + flags, validation messages, batch semantics, LR scaling."""

from __future__ import annotations

import pytest

from core.errors import SpecError
from core.spec import Spec, load_spec, read_spec, save_spec


def test_unknown_option_lists_valid_ones(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: nmt-tiny\ngpus: 4\n")
    with pytest.raises(SpecError) as exc:
        load_spec(f)
    msg = str(exc.value)
    assert "gpus" in msg and "gpus_per_node" in msg and "valid options" in msg


def test_nested_unknown_option(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("engine:\n  name: ddp\n  fusion: 3\n")
    with pytest.raises(SpecError, match=r"engine.*fusion.*fusion_threshold_mb"):
        load_spec(f)


def test_yaml_then_overrides_and_roundtrip(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: rnnlm-tiny\nnodes: 2\nengine: {name: horovod, fp16_allreduce: true}\nlr: 1\n")
    spec = load_spec(f).with_overrides({"gpus_per_node": 4, "engine.name": "ddp", "nodes": None})
    assert (spec.model, spec.nodes, spec.gpus_per_node, spec.engine.name) == ("rnnlm-tiny", 2, 4, "ddp")
    assert spec.engine.fp16_allreduce is True and spec.lr == 1.0 and isinstance(spec.lr, float)
    save_spec(spec.validate(), tmp_path)
    assert read_spec(tmp_path) == spec


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"nodes": 0}, "--nodes must be a positive"),
        ({"gpus_per_node": -2}, "--gpus-per-node must be a positive"),
        ({"model": "gpt-9"}, "unknown model preset 'gpt-9'; valid presets: .*nmt-tiny"),
        ({"engine.name": "mpi"}, "unknown engine 'mpi'; valid: single, ddp, horovod"),
        ({"engine.name": "single", "gpus_per_node": 2}, "engine 'single' runs one worker"),
        ({"loss_threshold": 1.0}, "--loss-threshold needs validation"),
        ({"global_batch": 8, "batch_per_worker": 4}, "not both"),
        ({"data.kind": "text"}, "needs --train-src"),
        ({"model_args": {"hidden": 3}}, "hidden"),
    ],
)
def test_invalid_specs_have_clear_messages(overrides, pattern):
    with pytest.raises(SpecError, match=pattern):
        Spec().with_overrides(overrides).validate()


def test_strong_batch_must_split_evenly():
    with pytest.raises(SpecError, match="does not split evenly across 3 workers"):
        Spec(gpus_per_node=3, global_batch=16).validate()
    with pytest.raises(SpecError, match="multiple of 4"):  # the preset's batch (nmt-tiny: 16) when none given
        Spec(gpus_per_node=4).per_worker_batch(18)


def test_batch_modes_and_lr_scaling():
    strong = Spec(gpus_per_node=4, global_batch=32)
    assert (strong.batch_mode, strong.per_worker_batch(99), strong.lr_scale(99)) == ("strong", 8, 1.0)
    weak = Spec(nodes=2, gpus_per_node=2, batch_per_worker=8)
    assert (weak.batch_mode, weak.resolved_global_batch(99), weak.lr_scale(99)) == ("weak", 32, 4.0)
    assert Spec(gpus_per_node=2).resolved_global_batch(16) == 16  # the preset's batch by default
