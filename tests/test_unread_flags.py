"""A review of input handling: each problem as the user met it, each test failing before its fix.

1. `lr: 1e-3` in a spec file was refused ("expected float, got '1e-3'") while a config file took it: the YAML
   loader kept PyYAML's 1.1 floats (a dot and a signed exponent); it reads YAML 1.2's numbers now. It kept 1.1's
   booleans too: `name: no` was refused in a spec file and named a run "False" from a config file; yes/no/on/off
   are text now, which an option declared bool reads as 1.1 did.
2. Flags the built-in trainer never read were accepted (exit 0): --train-src without --data text, Horovod's
   fusion settings with another engine, --bucket-cap-mb without DDP, --ps-* without the parameter server,
   --balance-every without --balance dynamic, --max-price without --spot. Refused in one line as
   --ps-placement separate with --engine ddp was, unless a config file's default (or a study's base) meant
   for other runs gave it.
3. `--device cuda` on a machine without a GPU, and an empty --train-src, were said by the ranks once started
   (exit 1, a run directory left): now before anything starts, naming the right flag.
4. A config file's bad value (`steps: nan`) broke `launch --help` and `launch ls`.
5. Wording and bounds: `launch sweep -- X`, track.step(items=10**30), "1 characters", "1 units", an empty
   prices file, --time-limit-min 1e9, Slurm's --time 400-00 and Kubernetes' timeout_min past a year,
   --toleration ':::'.
Run in-process (tests/conftest.py::run_entry), dry runs where a run would start.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_entry

from scalelab.core.errors import SpecError
from scalelab.core.spec import EngineSpec, Spec
from tests.test_flag_inputs import config, spec_of  # noqa: F401 - fixtures: a config file; the Spec each `launch run` builds


def _refused(argv: list[str], monkeypatch, capsys, *words: str) -> str:
    """`launch ARGV` exits 2 with one `launch: error:` line holding `words`, no traceback; that line."""
    code, err, out = run_entry(argv, monkeypatch, capsys)
    said = [line for line in err.splitlines() if line.startswith("launch: error:")]
    assert code == 2 and len(said) == 1 and "Traceback" not in err + out, (code, err[-3000:])
    for word in words:
        assert word in said[0], (word, said[0])
    return said[0]


# ---- 1. YAML 1.2's numbers, in a spec file as in a config file ------------------------------------------------


@pytest.mark.parametrize("text, value", [
    ("1e-3", 0.001), ("1E5", 100000.0), (".5", 0.5), ("-.5", -0.5), ("+1.5e3", 1500.0), ("1e3", 1000.0),
    ("1.5e+3", 1500.0), ("2.", 2.0), ("017", 17), ("0o17", 15), ("0x1F", 31), ("12", 12), ("-4", -4),
    ("1_000", 1000), ("6:8", "6:8"), ("1:30:00", "1:30:00"), ("1e", "1e"), ("1.2.3", "1.2.3"),
])
def test_the_loader_reads_numbers_as_yaml_1_2_does(text, value):
    """1.1 (PyYAML) read 1e-3, 1E5, -.5 and 1e3 as text, 017 as octal 15 and 0o17 as text."""
    from scalelab.core.yamltext import load_yaml

    got = load_yaml(f"x: {text}\n")["x"]
    assert got == value and type(got) is type(value), (text, got)


def test_an_explicit_tag_on_text_that_is_no_number_is_a_yaml_error():
    import yaml

    from scalelab.core.yamltext import load_yaml

    for text in ("x: !!int abc", "x: !!float abc"):
        with pytest.raises(yaml.YAMLError):
            load_yaml(text)


@pytest.mark.parametrize("where", ["spec", "config"])
def test_lr_1e_minus_3_is_read_the_same_from_a_spec_file_and_a_config_file(where, config, monkeypatch, capsys,
                                                                            spec_of, tmp_path):
    (tmp_path / "sci.yaml").write_text("lr: 1e-3\nwarmup_steps: 1\n")
    config("lr: 1e-3\n" if where == "config" else "runs-dir: runs\n")
    argv = ["--dry-run", "--runs-dir", "runs"] + (["--spec", "sci.yaml"] if where == "spec" else [])
    code, err, _ = run_entry(argv, monkeypatch, capsys)
    assert code == 0, err
    assert spec_of[-1].lr == pytest.approx(0.001)


def test_a_fraction_for_a_whole_number_is_refused_in_a_config_file_as_in_a_spec_file(config, monkeypatch, capsys,
                                                                                   tmp_path):
    """Before: click's int type cut `steps: 40.5` in a config file to 40 without a word; a spec file refused it."""
    (tmp_path / "s.yaml").write_text("steps: 40.5\n")
    config("runs-dir: runs\n")
    _refused(["--spec", "s.yaml", "--dry-run"], monkeypatch, capsys, "steps", "40.5")
    config("steps: 40.5\n")
    _refused(["--dry-run"], monkeypatch, capsys, "config file c.yaml", "steps", "40.5")
    assert not (tmp_path / "runs").exists()


YAML_11_TRUE = ["y", "Y", "yes", "Yes", "YES", "on", "On", "ON"]
YAML_11_FALSE = ["n", "N", "no", "No", "NO", "off", "Off", "OFF"]


@pytest.mark.parametrize("text", YAML_11_TRUE + YAML_11_FALSE)
def test_the_loader_reads_yaml_1_1s_boolean_words_as_text_as_yaml_1_2_does(text):
    """1.1 (PyYAML) read yes/no/on/off as booleans: a run named `no` became False."""
    from scalelab.core.yamltext import load_yaml

    assert load_yaml(f"x: {text}\n")["x"] == text


@pytest.mark.parametrize("text, value", [("true", True), ("True", True), ("TRUE", True), ("false", False),
                                         ("False", False), ("FALSE", False)])
def test_yaml_1_2s_booleans_are_still_booleans(text, value):
    from scalelab.core.yamltext import load_yaml

    assert load_yaml(f"x: {text}\n")["x"] is value


@pytest.mark.parametrize("where", ["spec", "config", "study"])
@pytest.mark.parametrize("word", ["yes", "On", "y", "NO", "off", "N"])
def test_a_bool_option_takes_yaml_1_1s_boolean_words_in_every_file(word, where, config, monkeypatch, capsys,
                                                                  spec_of, tmp_path):
    """A spec file took yes/no/on/off (1.1 read them) and refused y/n; a config file took them all (click's
    bool type). Read as 1.2 text, a bool option takes each as the boolean 1.1 meant (core/yamltext.py)."""
    want = word in YAML_11_TRUE
    if where == "study":
        from scalelab.launcher.study import load_study, variant_specs

        (tmp_path / "s.yaml").write_text("title: b\nlayouts: [1x1]\nbase: {model: nmt-tiny, steps: 6, warmup_steps: 1, "
                                         f"engine: {{name: single}}, data: {{kind: task, fixed_length: {word}}}}}\n")
        study = load_study(tmp_path / "s.yaml")
        assert variant_specs(study, study.variants[0])[0].data.fixed_length is want
        return
    (tmp_path / "exp.yaml").write_text(f"data: {{kind: task, fixed_length: {word}}}\n")
    config(f"data: task\nfixed-length: {word}\n" if where == "config" else "runs-dir: runs\n")
    argv = ["--dry-run", "--runs-dir", "runs"] + (["--spec", "exp.yaml"] if where == "spec" else [])
    code, err, _ = run_entry(argv, monkeypatch, capsys)
    assert code == 0, err
    assert spec_of[-1].data.fixed_length is want


@pytest.mark.parametrize("where", ["spec", "config", "study"])
@pytest.mark.parametrize("word", ["no", "on", "Off", "YES", "n"])
def test_a_text_option_given_a_yaml_1_1_boolean_word_keeps_the_word(word, where, config, monkeypatch, capsys,
                                                                   spec_of, tmp_path):
    """Before: `name: no` was refused in a spec file ("expected str (text) or null, got false") and made a run
    named False from a config file."""
    if where == "study":
        from scalelab.launcher.study import load_study, variant_specs

        (tmp_path / "s.yaml").write_text("title: b\nlayouts: [1x1]\nbase: {model: nmt-tiny, steps: 6, "
                                         f"warmup_steps: 1, profile_steps: null}}\nvariants: [{{label: {word}}}]\n")
        study = load_study(tmp_path / "s.yaml")
        assert study.variants[0].label == word and variant_specs(study, study.variants[0])[0].name == word
        return
    (tmp_path / "exp.yaml").write_text(f"name: {word}\n")
    config(f"name: {word}\n" if where == "config" else "runs-dir: runs\n")
    argv = ["--dry-run", "--runs-dir", "runs"] + (["--spec", "exp.yaml"] if where == "spec" else [])
    code, err, out = run_entry(argv, monkeypatch, capsys)
    assert code == 0, err
    assert spec_of[-1].name == word


@pytest.mark.parametrize("where", ["spec", "config"])
def test_cuda_graph_off_is_the_choice_off(where, config, monkeypatch, capsys, spec_of, tmp_path):
    """Before: YAML 1.1 read `cuda_graph: off` as false, which the choice auto|off refused in a spec file and a
    config file alike."""
    (tmp_path / "exp.yaml").write_text("cuda_graph: off\n")
    config("cuda-graph: off\n" if where == "config" else "runs-dir: runs\n")
    argv = ["--dry-run", "--runs-dir", "runs"] + (["--spec", "exp.yaml"] if where == "spec" else [])
    code, err, _ = run_entry(argv, monkeypatch, capsys)
    assert code == 0, err
    assert spec_of[-1].cuda_graph == "off"


def test_a_config_files_text_backend_option_keeps_a_yaml_1_1_boolean_word(config, monkeypatch, capsys, spec_of):
    """Before: `partition: off` became the partition 'False'."""
    config("backend: slurm\npartition: off\n")
    code, err, _ = run_entry(["--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err
    assert spec_of[-1].backend_options["partition"] == "off"


@pytest.mark.parametrize("word, value", [("y", True), ("Yes", True), ("n", False), ("OFF", False)])
def test_a_backend_bool_option_takes_the_same_words_from_backend_opt_and_a_spec_file(word, value, monkeypatch, capsys,
                                                                                    spec_of, tmp_path):
    """Before: `--backend-opt spot=y` was refused while a config file's `spot: y` was taken (click's bool type)."""
    monkeypatch.chdir(tmp_path)
    aws = ["--backend", "aws", "--bucket", "my-bucket", "--region", "us-east-1", "--dry-run"]
    code, err, _ = run_entry([*aws, "--backend-opt", f"spot={word}"], monkeypatch, capsys)
    assert code == 0 and spec_of[-1].backend_options["spot"] is value, err
    (tmp_path / "exp.yaml").write_text(f"backend_options: {{spot: {word}}}\n")
    code, err, _ = run_entry([*aws, "--spec", "exp.yaml"], monkeypatch, capsys)
    assert code == 0 and spec_of[-1].backend_options["spot"] is value, err


def test_a_prices_files_true_or_false_field_takes_yaml_1_1s_words(tmp_path):
    from scalelab.costs.catalog import CatalogError, load_catalog

    path = tmp_path / "prices.yaml"
    path.write_text("instances: [{name: x1.big, gpus: 1, efa: yes, per_gpu: Off}]\n")
    assert (load_catalog(path).instances["x1.big"].efa, load_catalog(path).instances["x1.big"].per_gpu) == (True, False)
    path.write_text("instances: [{name: x1.big, gpus: 1, efa: maybe}]\n")
    with pytest.raises(CatalogError, match=r"efa must be true or false, got 'maybe'"):
        load_catalog(path)


def test_a_bool_option_still_refuses_other_text(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text("data: {kind: task, fixed_length: maybe}\n")
    _refused(["--spec", "exp.yaml", "--dry-run"], monkeypatch, capsys, "data.fixed_length", "expected bool", "'maybe'")


# ---- 2. settings the trainer never reads ----------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--train-src", "foo.txt"], ["--train-src foo.txt", "--data text", "--data synthetic"]),
    (["--valid-src", "foo.txt", "--data", "task"], ["--valid-src foo.txt", "--data text", "--data task"]),
    (["--train-tgt", "foo.txt"], ["--train-tgt foo.txt", "--data text"]),
    (["--fusion-threshold-mb", "32"], ["--fusion-threshold-mb 32", "--engine horovod", "not --engine ddp"]),
    (["--cycle-time-ms", "5"], ["--cycle-time-ms 5", "--engine horovod", "not --engine ddp"]),
    (["--engine", "horovod", "--bucket-cap-mb", "50"], ["--bucket-cap-mb 50", "--engine ddp", "not --engine horovod"]),
    (["--engine", "single", "--bucket-cap-mb", "50"], ["--bucket-cap-mb 50", "--engine ddp", "not --engine single"]),
    (["--ps-shards", "5"], ["--ps-shards 5", "--engine ps", "not --engine ddp"]),
    (["--ps-state", "cpu"], ["--ps-state cpu", "--engine ps", "not --engine ddp"]),
    (["--ps-placement", "separate"], ["--ps-placement separate", "--engine ps", "not --engine ddp"]),
    (["--balance-every", "3"], ["--balance-every 3", "--balance dynamic", "not --balance static"]),
    (["--train-samples", "100"], ["--train-samples 100", "--data task", "not --data synthetic"]),
    (["--fixed-length"], ["--fixed-length", "--data task", "not --data synthetic"]),
    (["--model", "rnnlm-tiny", "--data", "text", "--train-src", "corpus.txt", "--fixed-length"],
     ["--fixed-length", "--data task", "not --data text"]),
    (["--shards", "shards"], ["--shards shards", "--data shards", "not --data synthetic"]),
    (["--data", "task", "--shards", "shards"], ["--shards shards", "--data shards", "not --data task"]),
    (["--backend", "aws", "--bucket", "my-bucket", "--region", "us-east-1", "--max-price", "0.5"],
     ["--max-price 0.5", "--spot", "--on-demand"]),
    (["--backend", "aws", "--bucket", "my-bucket", "--region", "us-east-1", "--backend-opt", "spot_max_price=0.5"],
     ["--max-price 0.5", "--spot"]),
])
def test_a_setting_nothing_reads_is_refused_naming_it_and_what_it_needs(args, words, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("a b c\nd e f\n")
    line = _refused([*args, "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys, *words)
    assert "add " in line and "leave " in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args", [
    ["--engine", "horovod", "--fusion-threshold-mb", "32", "--cycle-time-ms", "5"],
    ["--engine", "ddp", "--bucket-cap-mb", "50"],
    ["--engine", "ps", "--ps-shards", "1", "--ps-state", "cpu"],
    ["--balance", "dynamic", "--balance-every", "3", "--gpus-per-node", "2", "--device", "cpu"],
    ["--fusion-threshold-mb", "64", "--bucket-cap-mb", "25", "--balance-every", "10"],  # their defaults: harmless
    ["--data", "task", "--train-samples", "100", "--fixed-length"],
    ["--train-samples", "4096", "--variable-length", "--prefetch", "0"],  # defaults, and what every kind reads
    ["--backend", "aws", "--bucket", "my-bucket", "--region", "us-east-1", "--spot", "--max-price", "0.5"],
])
def test_the_same_settings_where_they_are_read_still_run(args, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry([*args, "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err


def test_a_script_under_ddp_is_refused_horovods_fusion_settings(monkeypatch, capsys, tmp_path):
    """horovodrun passes --fusion-threshold-mb to a --script's ranks; no other engine's starter does."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    _refused(["--script", "train.py", "--engine", "ddp", "--fusion-threshold-mb", "8", "--dry-run"], monkeypatch,
             capsys, "--fusion-threshold-mb 8", "--engine horovod")


def test_a_config_files_defaults_for_other_runs_are_no_conflict(config, monkeypatch, capsys, spec_of):
    """A project's scalelab.yaml tuned for its Horovod, parameter-server, dynamic-balance, text and spot runs: a
    plain run neither refuses its values nor keeps them; the runs they are for get them."""
    config("fusion-threshold-mb: 32\nps-shards: 1\nps-state: cpu\nbalance-every: 4\ntrain-src: corpus.txt\n"
           "max-price: 0.5\nbucket: my-bucket\nregion: us-east-1\n")
    code, err, _ = run_entry(["--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err
    spec = spec_of[-1]
    assert (spec.engine.fusion_threshold_mb, spec.engine.ps_shards, spec.engine.ps_state) == (64.0, None, "device")
    assert (spec.balance_every, spec.data.train_src) == (10, None)
    code, err, out = run_entry(["--engine", "horovod", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0 and spec_of[-1].engine.fusion_threshold_mb == 32.0, err
    code, err, _ = run_entry(["--engine", "ps", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0 and (spec_of[-1].engine.ps_shards, spec_of[-1].engine.ps_state) == (1, "cpu"), err
    code, err, _ = run_entry(["--backend", "aws", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0 and "spot_max_price" not in spec_of[-1].backend_options, err
    code, err, _ = run_entry(["--backend", "aws", "--spot", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0 and spec_of[-1].backend_options["spot_max_price"] == 0.5, err


def test_a_config_files_task_data_defaults_are_for_task_runs(config, monkeypatch, capsys, spec_of, tmp_path):
    """`train-samples`, `fixed-length` and `shards` in a project's config file: a synthetic run drops them (it
    refused `shards` before, "give both, or neither"), a task run keeps its own."""
    (tmp_path / "sh").mkdir()
    (tmp_path / "sh" / "manifest.json").write_text("{}")
    config("train-samples: 100\nfixed-length: true\nshards: sh\n")
    code, err, _ = run_entry(["--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err
    data = spec_of[-1].data
    assert (data.train_samples, data.fixed_length, data.shards) == (4096, False, None)
    code, err, _ = run_entry(["--data", "task", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err
    data = spec_of[-1].data
    assert (data.train_samples, data.fixed_length, data.shards) == (100, True, None)
    code, err, _ = run_entry(["--data", "shards", "--model", "rnnlm-tiny", "--dry-run", "--runs-dir", "runs"],
                             monkeypatch, capsys)
    assert code == 0 and spec_of[-1].data.shards == "sh", err


@pytest.mark.parametrize("data, words", [
    ("{valid_samples: 64}", ["data.valid_samples: 64", "--data task", "not --data synthetic"]),
    ("{kind: synthetic, bucket: false}", ["data.bucket: false", "--data task, text or shards", "leave data.bucket out"]),
    ("{kind: text, train_src: corpus.txt, train_samples: 64}", ["--train-samples 64", "not --data text"]),
])
def test_a_spec_files_data_setting_its_kind_of_data_does_not_read_is_refused(data, words, monkeypatch, capsys,
                                                                             tmp_path):
    """Before: `valid_samples` and `bucket` with synthetic data were ignored (exit 0); they have no flag, so
    the message names the spec file's key."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("a b c\nd e f\n")
    (tmp_path / "exp.yaml").write_text(f"model: rnnlm-tiny\ndata: {data}\n")
    _refused(["--spec", "exp.yaml", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys, *words)
    (tmp_path / "exp.yaml").write_text("model: rnnlm-tiny\ndata: {kind: task, valid_samples: 64, bucket: false}\n")
    code, err, _ = run_entry(["--spec", "exp.yaml", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err


def test_a_studys_base_task_data_settings_are_for_its_task_variants(tmp_path):
    from scalelab.launcher.study import load_study, variant_specs

    path = tmp_path / "s.yaml"
    path.write_text("title: data\nlayouts: [1x1]\n"
                    "base: {model: nmt-tiny, steps: 6, warmup_steps: 1, engine: {name: single},\n"
                    "       data: {kind: task, train_samples: 64, fixed_length: true}}\n"
                    "variants:\n  - {label: task}\n  - {label: synthetic, set: {data: {kind: synthetic}}}\n")
    study = load_study(path)
    got = {v.label: [(s.data.train_samples, s.data.fixed_length) for s in variant_specs(study, v)]
           for v in study.variants}
    assert got == {"task": [(64, True)], "synthetic": [(4096, False)]}
    path.write_text(path.read_text().replace("{label: task}", "{label: plain, set: {data: {kind: synthetic}}}"))
    with pytest.raises(SpecError, match=r"the base of .*s.yaml sets --train-samples 64, which none of its variants "
                                        r"reads.*--data task"):
        load_study(path)
    path.write_text(path.read_text().replace("{data: {kind: synthetic}}}\n", "{data: {kind: synthetic, "
                                             "fixed_length: true}}}\n", 1))
    with pytest.raises(SpecError, match=r"variant 'plain': --fixed-length is for --data task"):
        load_study(path)


def test_a_flag_typed_over_a_config_files_engine_is_still_refused(config, monkeypatch, capsys):
    config("engine: ddp\n")
    _refused(["--fusion-threshold-mb", "32", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys,
             "--fusion-threshold-mb 32", "--engine horovod")


def test_a_spec_files_setting_nothing_reads_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text("engine: {name: ddp, fusion_threshold_mb: 32}\n")
    _refused(["--spec", "exp.yaml", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys,
             "--fusion-threshold-mb 32", "--engine horovod")


def test_a_run_made_before_the_refusal_still_resumes():
    """spec.json of a DDP run given --fusion-threshold-mb before it was refused: validate(stored=True) takes it."""
    spec = Spec(engine=EngineSpec(name="ddp", fusion_threshold_mb=32.0), steps=10)
    with pytest.raises(SpecError, match="--fusion-threshold-mb 32 is for --engine horovod"):
        Spec.from_dict(spec.to_dict()).validate()
    assert Spec.from_dict(spec.to_dict()).validate(stored=True).engine.fusion_threshold_mb == 32.0


STUDY = """title: engines
layouts: [1x1]
base: {{model: nmt-tiny, steps: 6, warmup_steps: 1, engine: {{name: horovod, {base}}}}}
variants:
  - {{label: hvd}}
  - {{label: ddp, set: {{engine: {{name: ddp{ddp}}}}}}}
  - {{label: ps, set: {{engine: {{name: ps}}}}}}
"""


def test_a_studys_base_setting_is_for_the_variants_that_read_it(tmp_path):
    """Fusion in the base of a study whose variants change the engine: the Horovod variant keeps it, the others
    run with their defaults; refused only where no variant reads it, or a variant sets it for itself."""
    from scalelab.launcher.study import load_study, variant_specs

    path = tmp_path / "s.yaml"
    path.write_text(STUDY.format(base="fusion_threshold_mb: 32", ddp=""))
    study = load_study(path)
    fusion = {v.label: [s.engine.fusion_threshold_mb for s in variant_specs(study, v)] for v in study.variants}
    assert fusion == {"hvd": [32.0], "ddp": [64.0], "ps": [64.0]}
    path.write_text(STUDY.format(base="fusion_threshold_mb: 32", ddp="").replace("{label: hvd}",
                                                                                  "{label: hvd, set: {rnn: fused, engine: {name: single}}}"))
    with pytest.raises(SpecError, match=r"the base of .*s.yaml sets --fusion-threshold-mb 32, which none of its "
                                        r"variants reads.*--engine horovod"):
        load_study(path)
    path.write_text(STUDY.format(base="cycle_time_ms: 1", ddp=", bucket_cap_mb: 50, ps_state: cpu"))
    with pytest.raises(SpecError, match=r"variant 'ddp': --ps-state cpu is for --engine ps"):
        load_study(path)


@pytest.mark.parametrize("name", ["seed001-nmt-data-parallel", "seed002-rnnlm-strong-weak", "seed004-sentiment"])
@pytest.mark.parametrize("scale", ["test", "cpu", "seed"])
def test_the_example_studies_still_load_at_every_scale(name, scale):
    from pathlib import Path

    from scalelab.launcher.study import load_study

    load_study(Path(__file__).resolve().parents[1] / "examples" / f"{name}.yaml", scale)


# ---- 3. said before anything starts -------------------------------------------------------------------------


def test_device_cuda_without_a_gpu_is_refused_before_any_rank_starts(monkeypatch, capsys, tmp_path):
    """Before: the ranks said it, exit 1, a run directory left. (A GPU machine is made to see none.)"""
    import scalelab.core.devices as devices

    monkeypatch.setattr(devices, "visible_gpus", lambda: 0)
    monkeypatch.chdir(tmp_path)
    _refused(["--device", "cuda", "--engine", "single", "--steps", "4", "--warmup-steps", "1", "--runs-dir", "runs",
              "-y"], monkeypatch, capsys, "--device cuda", "no GPU", "--device cpu")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("text", ["", "\n  \n\t\n"])
@pytest.mark.parametrize("flag", ["--train-src", "--valid-src"])
def test_an_empty_data_file_is_refused_before_any_rank_starts_naming_its_flag(text, flag, monkeypatch, capsys,
                                                                             tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text(text)
    (tmp_path / "corpus.txt").write_text("a b c\nd e f\n")
    files = {"--train-src": "corpus.txt", "--valid-src": "corpus.txt", flag: "empty.txt"}
    line = _refused(["--model", "rnnlm-tiny", "--data", "text", *[w for f, p in files.items() for w in (f, p)],
                     "--engine", "single", "--steps", "4", "--warmup-steps", "1", "--runs-dir", "runs", "-y"],
                    monkeypatch, capsys, "empty.txt", "empty", flag)
    assert "--train " not in line and "(--train)" not in line, line
    assert not (tmp_path / "runs").exists()


def test_the_ranks_name_launch_runs_flag_for_a_one_file_familys_data(tmp_path):
    """A rank reads --train-src as `train`; its messages named `--train`, a flag of launch prep, not of run."""
    from scalelab.core.errors import DataError
    from scalelab.train.text import read_lines

    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match=r"\(--train-src\)"):
        read_lines(tmp_path / "empty.txt", "train")
    with pytest.raises(DataError, match=r"check --valid-src"):
        read_lines(tmp_path / "missing.txt", "valid")


# ---- 4. a config file's bad value and --help -----------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["sweep", "--help"], ["ls", "--runs-dir", "."]])
def test_a_bad_config_value_leaves_help_and_other_commands_working(argv, config, monkeypatch, capsys):
    config("steps: nan\nbackend: slurm\n")
    code, err, out = run_entry(argv, monkeypatch, capsys)
    assert code == 0 and "launch: error" not in err and "Traceback" not in err, err
    if "--help" in argv:
        assert "Usage: launch" in out
        assert err.count("launch: warning:") == 1 and "config file c.yaml: steps" in err, err
    if argv[0] == "run":
        flat = " ".join(out.split())
        assert "your script's own arguments go after `--`). [default: 40]" in flat and "[default: slurm, from c.yaml]" in flat, flat


def test_a_command_that_reads_the_bad_value_still_refuses_it(config, monkeypatch, capsys, tmp_path):
    config("steps: nan\n")
    _refused(["--dry-run", "--runs-dir", "runs"], monkeypatch, capsys, "config file c.yaml: steps", "nan")
    _refused(["sweep", "--workers", "1", "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys,
             "config file c.yaml: steps")
    _refused(["run", "--name", "--help", "--runs-dir", "runs", "--dry-run"], monkeypatch, capsys,
             "config file c.yaml: steps")  # --help as a value asks for no help: the value is still refused
    assert not (tmp_path / "runs").exists()


def test_help_with_a_config_file_that_has_an_unknown_key_warns_and_prints(config, monkeypatch, capsys):
    config("partiton: gpu\n")
    code, err, out = run_entry(["run", "--help"], monkeypatch, capsys)
    assert code == 0 and "Usage: launch run" in out, err
    assert "launch: warning:" in err and "partiton is no option" in err, err
    _refused(["--dry-run"], monkeypatch, capsys, "partiton is no option")


# ---- 5. wording and bounds ------------------------------------------------------------------------------------


def test_arguments_after_the_dashes_without_a_script_name_the_command_given(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    line = _refused(["sweep", "--workers", "1", "--dry-run", "--", "--foo"], monkeypatch, capsys, "'--foo'")
    assert "`launch sweep` takes only options" in line, line
    line = _refused(["--dry-run", "--", "--foo"], monkeypatch, capsys, "'--foo'")
    assert "`launch run` takes only options" in line, line


def test_track_step_says_what_is_wrong_with_a_count(tmp_path):
    from scalelab.train import track

    with pytest.raises(track.TrackError, match=r"items must be at most 2\*\*53"):
        track._number("track.step", "items", 10**30, whole=True)
    with pytest.raises(track.TrackError, match=r"items must be a whole number$"):
        track._number("track.step", "items", 2.5, whole=True)
    with pytest.raises(track.TrackError, match=r"step must be a whole number$"):
        track._number("track.step", "step", 7.5, whole=True)
    with pytest.raises(track.TrackError, match=r"loss must be a finite number"):
        track._number("track.step", "loss", 10**400, negative=True)  # an OverflowError traceback before
    assert track._number("track.step", "items", 8.0, whole=True) == 8


def test_one_is_said_in_the_singular(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / "no-prices.json"))
    line = _refused(["--backend", "aws", "--region", "us-east-1", "--bucket", "b", "--dry-run"], monkeypatch, capsys)
    assert "is 1 character long" in line, line
    code, err, _ = run_entry(["--backend", "slurm", "--rate", "slurm=4/node-hour@4", "--dry-run", "--runs-dir", "runs"],
                             monkeypatch, capsys)
    assert code == 0 and "1 unit)" in err and "1 units" not in err, err


@pytest.mark.parametrize("name, text", [("p.json", ""), ("p.json", "  \n"), ("p.yaml", "# nothing yet\n")])
def test_an_empty_prices_file_is_refused_as_an_empty_spec_file_is(name, text, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(text)
    monkeypatch.setenv("SCALELAB_PRICES", str(tmp_path / name))
    _refused(["--dry-run", "--runs-dir", "runs"], monkeypatch, capsys, f"prices file {tmp_path / name} is empty",
             "docs/costs.md")
    (tmp_path / name).write_text("{}\n")  # a mapping with no prices says so: as `{}` is a spec file's
    code, err, _ = run_entry(["--dry-run", "--runs-dir", "runs"], monkeypatch, capsys)
    assert code == 0, err


@pytest.mark.parametrize("flag", ["--time-limit-min", "--heartbeat-timeout-min"])
def test_an_aws_time_limit_past_a_year_is_refused(flag, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    aws = ["--backend", "aws", "--region", "us-east-1", "--bucket", "my-bucket", "--dry-run"]
    _refused([*aws, flag, "1e9"], monkeypatch, capsys, flag, "at most 525,600 minutes")
    code, err, _ = run_entry([*aws, flag, "600"], monkeypatch, capsys)
    assert code == 0, err


@pytest.mark.parametrize("value, minutes", [
    ("366-00", "527,040"), ("99999999", "99,999,999"), ("365-00:00:01", "525,601"), ("8760:00:01", "525,601"),
    ("525601", "525,601"), ("9" * 30, "more minutes than can be counted"),
])
def test_a_slurm_time_past_a_year_is_refused(value, minutes, monkeypatch, capsys, tmp_path):
    """Before: any number of days or minutes in Slurm's format went to sbatch, which leaves a job whose limit is
    past its partition's MaxTime pending (`man sbatch`); AWS's --time-limit-min was capped at a year already."""
    monkeypatch.chdir(tmp_path)
    _refused(["--backend", "slurm", "--time", value, "--dry-run", "--runs-dir", "runs"], monkeypatch, capsys,
             "(--time)", f"got '{value}'", "at most a year, 365-00:00:00 (525,600 minutes)", minutes)


@pytest.mark.parametrize("value", ["365-00", "364-23:59:59", "8760:00:00", "525600", "2-12:30", "0", "UNLIMITED", ""])
def test_a_slurm_time_up_to_a_year_or_no_limit_is_taken(value, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, _ = run_entry(["--backend", "slurm", "--time", value, "--dry-run", "--runs-dir", "runs"], monkeypatch,
                             capsys)
    assert code == 0, err


def test_a_config_files_slurm_time_in_minutes_past_a_year_is_refused_naming_the_file(config, monkeypatch, capsys):
    config("backend: slurm\ntime: 1000000\n")
    _refused(["--dry-run", "--runs-dir", "runs"], monkeypatch, capsys, "config file c.yaml", "--time",
             "at most a year", "1,000,000 minutes")


@pytest.mark.parametrize("value, minutes", [("90", 90), ("30:30", 31), ("1:30:00", 90), ("2-12", 3600),
                                            ("2-12:30", 3630), ("2-12:30:15", 3631), ("0:30", 1), ("0", None),
                                            ("UNLIMITED", None), ("infinite", None)])
def test_slurm_minutes_reads_every_format_as_sbatch_does(value, minutes):
    """`man sbatch`: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]; seconds
    are rounded up to the next minute, and 0 is no limit."""
    from scalelab.slurm.options import slurm_minutes

    assert slurm_minutes(value) == minutes


def test_a_kubernetes_deadline_past_a_year_is_refused_as_the_other_backends_limits(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    k8s = ["--backend", "k8s", "--image", "trainer:1", "--dry-run"]
    _refused([*k8s, "--backend-opt", "timeout_min=525601"], monkeypatch, capsys, "timeout_min", "at most 525,600")
    code, err, _ = run_entry([*k8s, "--backend-opt", "timeout_min=600"], monkeypatch, capsys)
    assert code == 0, err


@pytest.mark.parametrize("value, words", [
    (":::", ["effect must be one of", "(after the last ':')"]),
    ("gpu:", ["effect must be one of", "(after the last ':')"]),
    ("a b:NoSchedule", ["the key 'a b'"]),
    ("a:b:NoSchedule", ["the key 'a:b'"]),
    ("Nvidia.Com/gpu", ["prefix 'Nvidia.Com'"]),
    ("team=m l", ["the value 'm l'"]),
    ("k" * 64, ["at most 63"]),
])
def test_a_toleration_is_checked_as_kubernetes_checks_it(value, words, monkeypatch, capsys, tmp_path):
    """Before: `--toleration :::` wrote `key: '::'` into the manifest, for the API server to refuse."""
    monkeypatch.chdir(tmp_path)
    k8s = ["--backend", "k8s", "--image", "trainer:1", "--dry-run"]
    _refused([*k8s, "--toleration", value], monkeypatch, capsys, "--toleration", "KEY[=VALUE][:EFFECT]", *words)


def test_valid_tolerations_reach_the_manifest(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err, out = run_entry(["--backend", "k8s", "--image", "trainer:1", "--dry-run", "--toleration",
                                "example.com/gpu-type=a100_80g.v2:NoExecute", "--toleration", "dedicated=",
                                "--toleration", "gpu"], monkeypatch, capsys)
    assert code == 0, err
    assert re.search(r"key: example\.com/gpu-type\s", out) and "value: a100_80g.v2" in out, out
    assert json.dumps("") in out or "value: ''" in out, out
