"""Options declared once (scalelab/core/options.py): each backend's flags, `--backend-opt` keys, spec-file keys and
checks all come from its options class; one coercion types spec fields, model fields and backend options."""

from __future__ import annotations

import dataclasses
import importlib
import json

import click
import pytest
from click.testing import CliRunner

from tests.test_spec_flags import _command
from scalelab.core.errors import SpecError
from scalelab.core.options import BackendOptions, at_least, option
from scalelab.core.presets import PRESETS, config_with_overrides
from scalelab.launcher.backend import BACKENDS, Registered, backend_flags, options_type
from scalelab.launcher.cli import SPEC_FLAGS, build_spec, main
from scalelab.slurm.backend import SlurmBackend
from scalelab.slurm.options import SlurmOptions


@dataclasses.dataclass(frozen=True)
class WiderSlurmOptions(SlurmOptions):
    """The slurm options plus two, declared the way every option is: nothing else is written for them."""

    burst_buffer: str = option("", "Burst buffer request (sbatch --bb).", flag="--burst-buffer")
    reservation_h: int = option(0, "Hours of an advance reservation.", at_least(0))


def command_with(monkeypatch, backend: str, ref: str) -> tuple[click.Command, dict]:
    """A fresh `run`-like command built after the registry names `ref` as `backend`'s options."""
    monkeypatch.setitem(BACKENDS, backend, Registered(BACKENDS[backend].backend, ref))
    return _command()


def invoke(cmd: click.Command, *args: str):
    return CliRunner().invoke(cmd, list(args), standalone_mode=False, catch_exceptions=True)


def test_a_new_option_field_is_a_flag_a_backend_opt_and_a_backend_option(monkeypatch):
    cmd, seen = command_with(monkeypatch, "slurm", f"{__name__}:WiderSlurmOptions")
    help_text = invoke(cmd, "--help").output
    assert "--burst-buffer" in help_text and "[slurm] Burst buffer request (sbatch --bb)." in help_text
    assert "--reservation-h" not in help_text  # no flag declared: only --backend-opt and spec files

    assert invoke(cmd, "--backend", "slurm", "--burst-buffer", "bb:1").exception is None
    assert seen["spec"].backend_options == {"burst_buffer": "bb:1"}
    assert invoke(cmd, "--backend", "slurm", "--backend-opt", "reservation_h=3").exception is None
    assert seen["spec"].backend_options == {"reservation_h": 3}

    bad = invoke(cmd, "--backend", "slurm", "--backend-opt", "reservation_h=-1").exception
    assert isinstance(bad, SpecError)
    assert str(bad) == "slurm backend option reservation_h must be >= 0, got -1 (from --backend-opt)"
    unknown = invoke(cmd, "--backend", "slurm", "--backend-opt", "burst_bufer=x").exception
    assert "burst_bufer" in str(unknown) and "burst_buffer (default '')" in str(unknown)
    other = invoke(cmd, "--backend", "local", "--burst-buffer", "x").exception
    assert "--burst-buffer is an option of --backend slurm, not of --backend local" in str(other)

    monkeypatch.setattr(SlurmBackend, "Options", WiderSlurmOptions)
    backend = SlurmBackend({"burst_buffer": "bb:1", "partition": "gpu"})
    assert backend.options["burst_buffer"] == "bb:1" and backend.options.reservation_h == 0


def test_each_backend_class_names_its_registered_options_type():
    for name, ref in BACKENDS.items():
        module, cls = ref.backend.split(":")
        backend_cls = getattr(importlib.import_module(module), cls)
        assert backend_cls.Options is options_type(name), name
        assert backend_cls.Options.backend == name


def test_flags_are_unique_and_all_in_the_help():
    names = [flag.name for flag in SPEC_FLAGS]
    for flags in backend_flags().values():
        names += [f.name for f in flags]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    help_text = CliRunner().invoke(main, ["run", "--help"], terminal_width=200).output
    for backend, flags in backend_flags().items():
        for flag in flags:
            assert flag.name in help_text, flag.name
        assert f"[{backend}]" in help_text
    assert "[default: 40]" in help_text  # --steps: shown from Spec's own default
    assert "[default: 1]" in help_text  # --cpus-per-task: shown from SlurmOptions' default


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_option_key_is_accepted_as_text(name):
    """Each option's default, written as a user writes it after --backend-opt KEY=, reads back as itself."""
    options = options_type(name)
    for key, default in options().items():
        text = default if isinstance(default, str) else json.dumps(default)
        assert options.coerce({key: text}, "from --backend-opt", text=True) == {key: default}, key


@pytest.mark.parametrize("name, raw, text, message", [
    ("slurm", {"cpus_per_task": True}, False, "cpus_per_task (--cpus-per-task): expected int (a whole number), got true"),
    ("slurm", {"mem_gb": float("nan")}, False, "mem_gb (--mem-gb): expected float (a finite number), got nan"),
    ("slurm", {"time": None}, False, "time (--time): expected str (text), got null"),
    ("slurm", {"poll_s": -1}, False, "poll_s must be >= 0, got -1.0"),
    ("slurm", {"requeue": "maybe"}, True, "requeue (--requeue): expected bool (true or false), got 'maybe'"),
    ("k8s", {"shm_gb": "inf"}, True, "shm_gb: expected float (a finite number), got 'inf'"),
    ("k8s", {"cpus_per_node": 0}, False, "cpus_per_node must be > 0, got 0.0"),
    ("k8s", {"master_port": 70000}, False, "master_port must be <= 65535, got 70000"),
    ("k8s", {"clean_pod_policy": "Some"}, False, "clean_pod_policy must be one of Running, All, None, got 'Some'"),
    ("k8s", {"node_selector": ["gpu"]}, False, "node_selector (--node-selector): takes LABEL=VALUE, got 'gpu'"),
    ("aws", {"spot_max_price": -0.5}, False, "spot_max_price (--max-price) must be > 0 USD per instance-hour"),
    ("aws", {"timeout_min": 0}, False, "timeout_min (--time-limit-min) must be > 0, got 0.0"),
    ("aws", {"spot": 1}, False, "spot (--spot/--on-demand): expected bool (true or false), got 1"),
    ("aws", {"volume_gb": 1.5}, False, "volume_gb: expected int (a whole number), got 1.5"),
    ("aws", {"fallback_instance_types": [None]}, False, "expected a list of str (text), got [None]"),
    ("local", {"master_port": "8x"}, True, "master_port: expected int (a whole number), got '8x'"),
])
def test_bad_backend_option_values_name_the_option_and_the_source(name, raw, text, message):
    with pytest.raises(SpecError) as exc:
        options_type(name).parse(raw, "from --backend-opt", text=text)
    assert message in str(exc.value)
    assert str(exc.value).startswith(f"{name} backend option ") and str(exc.value).endswith("(from --backend-opt)")


def test_accepted_forms_are_normalised_once():
    slurm = SlurmOptions.parse({"time": 30, "setup": "module load cuda", "mem_gb": 16})
    assert (slurm["time"], slurm["setup"], slurm["mem_gb"]) == ("30", ["module load cuda"], 16.0)
    k8s = options_type("k8s").parse({"tolerations": "[gpu:NoSchedule, dedicated=ml]", "node_selector": "a=b"}, text=True)
    assert k8s["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "dedicated", "operator": "Equal", "value": "ml"}]
    assert k8s["node_selector"] == {"a": "b"}
    assert options_type("k8s").parse(k8s.to_dict()) == k8s  # what a run saves in spec.json reads back the same
    assert options_type("aws").parse({"spot_max_price": "null", "spot": "on"}, text=True)["spot_max_price"] is None


def test_options_are_a_read_only_mapping():
    options = SlurmOptions.parse({"partition": "gpu"})
    assert options["partition"] == "gpu" and options.get("nope") is None and "qos" in options
    assert dict(options) == options.to_dict() and {**options}["cpus_per_task"] == 1
    with pytest.raises(KeyError):
        options["nope"]
    with pytest.raises(TypeError):
        options["partition"] = "x"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.partition = "x"  # type: ignore[misc]
    assert isinstance(options, BackendOptions)


# ---- spec file < --backend-opt < flags --------------------------------------------------------------


def params(**given) -> dict:
    return {"spec_file": None, "model_args": (), "backend_opts": (), **given}


def test_backend_options_in_a_spec_file_are_checked_with_the_file_named(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("backend: slurm\nbackend_options: {cpus_per_task: 0}\n")
    with pytest.raises(SpecError, match=r"cpus_per_task \(--cpus-per-task\) must be >= 1, got 0 \(in spec file .*exp.yaml\)"):
        build_spec(params(spec_file=str(f)))


def test_flags_win_over_backend_opts_and_the_spec_file(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("backend: slurm\nbackend_options: {partition: a, qos: low}\n")
    spec = build_spec(params(spec_file=str(f), backend_opts=("partition=b", "account=proj"), bopt__slurm__partition="c"))
    assert spec.backend_options == {"partition": "c", "qos": "low", "account": "proj"}


def test_a_batch_flag_wins_over_the_other_batch_key_of_the_spec_file(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("global_batch: 32\n")
    spec = build_spec(params(spec_file=str(f), batch_per_worker=4))
    assert (spec.global_batch, spec.batch_per_worker, spec.batch_mode) == (None, 4, "weak")
    with pytest.raises(SpecError, match="--global-batch .* and --batch-per-worker .* were both given"):
        build_spec(params(global_batch=32, batch_per_worker=4))


def test_model_args_from_the_command_line_are_read_as_their_types():
    spec = build_spec(params(model_args=("hidden_size=48", "attention=off", "dropout=0.25")))
    assert spec.model_args == {"hidden_size": 48, "attention": False, "dropout": 0.25}
    with pytest.raises(SpecError, match=r"model field dropout: expected float \(a finite number\), got 'inf'"):
        config_with_overrides(PRESETS["nmt-tiny"], {"dropout": "inf"})
    with pytest.raises(SpecError, match="model field attention: expected bool"):
        config_with_overrides(PRESETS["nmt-tiny"], {"attention": 1})
