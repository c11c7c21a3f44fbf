"""The experiment spec: YAML + flags, validation messages, batch semantics, LR scaling."""

from __future__ import annotations

import pytest

from scalelab.core.errors import SpecError
from scalelab.core.spec import Spec, load_spec, read_spec, save_spec


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
        ({"nodes": 0}, "nodes must be a positive whole number, got 0"),
        ({"gpus_per_node": -2}, "gpus_per_node must be a positive whole number, got -2"),
        ({"model": "gpt-9"}, "unknown model preset 'gpt-9'; valid presets: .*nmt-tiny"),
        ({"engine.name": "mpi"}, "engine.name must be one of single, ddp, horovod, ps, got 'mpi'"),
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


# ---- types: one coercion for spec fields, model fields and backend options (scalelab/core/options.py) ------


@pytest.mark.parametrize(
    "text, needle",
    [
        ("nodes: true\n", "nodes: expected int (a whole number), got true"),
        ("nodes: 2.5\n", "nodes: expected int (a whole number), got 2.5"),
        ("lr: .nan\n", "lr: expected float (a finite number), got nan"),
        ("lr: null\n", "lr: expected float (a finite number), got null"),
        ("loss_threshold: -.inf\nval_every: 5\n", "loss_threshold: expected float (a finite number) or null, got -inf"),
        ("engine: {fusion_threshold_mb: .inf}\n", "engine.fusion_threshold_mb: expected float (a finite number), got inf"),
        ("engine: {cycle_time_ms: -1}\n", "engine.cycle_time_ms must be > 0, got -1.0"),
        ("data: {prefetch: -1}\n", "data.prefetch must be >= 0, got -1"),
        ("data: {train_samples: 0}\n", "data.train_samples must be a positive whole number, got 0"),
        ("data: {bucket: 1}\n", "data.bucket: expected bool (true or false), got 1"),
        ("model: 7\n", "model: expected str (text), got 7"),
        ("emulate_slowdown: [1, .nan]\n", "emulate_slowdown: expected a list of float"),
        ("clip_grad_norm: 0\n", "clip_grad_norm must be > 0, got 0.0"),
        ("seed: -3\n", "seed must be >= 0, got -3"),
        ("model_args: {hidden_size: true}\n", "model field hidden_size: expected int (a whole number), got true"),
        ("model_args: {dropout: .nan}\n", "model field dropout: expected float (a finite number), got nan"),
        ("model_args: {hidden_size: null}\n", "model field hidden_size: expected int (a whole number), got null"),
        ("model_args: {hidden_size: -4}\n", "model field hidden_size must be a positive integer"),
    ],
)
def test_bad_values_in_a_spec_file_name_the_field_and_the_file(tmp_path, text, needle):
    f = tmp_path / "exp.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_spec(f).validate()
    assert needle in str(exc.value)
    if not needle.startswith("model field"):  # model_args are checked against the preset in validate()
        assert f"in spec file {f}" in str(exc.value)


def test_optional_fields_take_null_and_floats_take_whole_numbers(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("steps: null\nepochs: 2\nlr: 1\nclip_grad_norm: null\nengine: {bucket_cap_mb: 10}\n")
    spec = load_spec(f).validate()
    assert (spec.steps, spec.epochs, spec.clip_grad_norm) == (None, 2, None)
    assert spec.lr == 1.0 and isinstance(spec.lr, float) and isinstance(spec.engine.bucket_cap_mb, float)


def test_a_spec_built_in_code_is_checked_by_validate():
    spec = Spec(lr=float("inf"))
    with pytest.raises(SpecError, match="lr: expected float"):
        spec.validate()
    spec = Spec(nodes=True)
    with pytest.raises(SpecError, match="nodes: expected int"):
        spec.validate()


def test_read_spec_names_the_run_directory_file(tmp_path):
    (tmp_path / "spec.json").write_text('{"gpus_per_node": "two"}')
    with pytest.raises(SpecError, match=r"gpus_per_node: expected int .* \(in .*spec.json\)"):
        read_spec(tmp_path)


# ---- YAML 1.2 numbers and unique keys (issue #27 items 6 and 7) ----------------------------------


@pytest.mark.parametrize("value", ["6:8", "1:30", "2:59"])
def test_profile_steps_with_a_colon_is_not_read_as_base_60(tmp_path, value):
    """YAML 1.1 reads 6:8 as 368; the spec loader reads YAML 1.2, so the range reaches its own parser."""
    f = tmp_path / "s.yaml"
    f.write_text(f"model: nmt-tiny\nsteps: 200\nprofile_steps: {value}\n")
    assert load_spec(f).profile_steps == value


def test_numbers_other_than_base_60_are_read_as_before():
    from scalelab.core.yamltext import load_yaml

    assert load_yaml("a: 12\nb: 1.5\nc: 0x10\nd: 1e3\ne: -4\nf: 1_000\n") == {
        "a": 12, "b": 1.5, "c": 16, "d": 1000.0, "e": -4, "f": 1000}  # 1e3: a float in YAML 1.2, text in PyYAML's 1.1
    assert load_yaml("t: 1:30:00.5") == {"t": "1:30:00.5"}


@pytest.mark.parametrize("text, key", [("nodes: 2\nseed: 1\nnodes: 4\n", "nodes"),
                                       ("engine: {name: ddp, name: horovod}\n", "name")])
def test_a_duplicate_yaml_key_is_refused_naming_it(tmp_path, text, key):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_spec(f)
    msg = str(exc.value)
    assert f"duplicate key '{key}'" in msg and str(f) in msg and "\n" not in msg


def test_a_spec_file_may_say_what_the_flags_say(tmp_path):
    """Issue 35: `engine: horovod` and `data: task` (the flags' words) were refused without a hint; a
    section given one word sets the field its flag sets, a flag's name is read as its field, and a wrong
    value or an unknown key is still one clear error."""
    from scalelab.core.errors import SpecError
    from scalelab.core.spec import load_spec

    f = tmp_path / "exp.yaml"
    f.write_text("engine: horovod\ndata: task\nmodel: nmt-tiny\nloss-threshold: 4.3\n--fusion-threshold-mb: 32\n")
    spec = load_spec(f)
    assert (spec.engine.name, spec.data.kind, spec.loss_threshold, spec.engine.fusion_threshold_mb) == \
        ("horovod", "task", 4.3, 32.0)
    f.write_text("engine:\n  name: ps\n  fusion_threshold_mb: 8\n")  # the mapping form is unchanged
    assert (load_spec(f).engine.name, load_spec(f).engine.fusion_threshold_mb) == ("ps", 8.0)
    for text, message in [("engine: nosuch\n", "engine.name must be one of"), ("bogus-key: 3\n", "unknown option")]:
        f.write_text(text)
        with pytest.raises(SpecError, match=message):
            load_spec(f)
