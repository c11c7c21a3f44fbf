"""Issue 35: `launch memory` and `launch prep` declared their own --model, --engine, --backend... and drifted from
`launch run`'s (memory defaulted to nmt-seed and horovod, run to nmt-tiny and ddp). Every such flag is now declared
once (scalelab/core/flags.py) and a flag spelled the same in two commands has the same type, default and help."""

from __future__ import annotations

import json

import click
import pytest

from conftest import launch
from scalelab.core.flags import COMMON, SPEC_FLAGS, shared_flag_names, shared_flags
from scalelab.core.spec import Spec
from scalelab.launcher.cli import main

COMMANDS = ("run", "sweep", "memory", "prep")

# Same spelling, another meaning, on purpose: prep's --workers and --mode size one Dask prep (default 2 workers,
# strong), not a sweep of training layouts; its text inputs are repeatable globs or s3:// URLs, run's one file each.
MEANT_TO_DIFFER = {("prep", "--workers"), ("prep", "--mode"), ("prep", "--train-src"), ("prep", "--train-tgt"),
                   ("prep", "--valid-src"), ("prep", "--valid-tgt")}


def _options(name: str) -> dict[str, click.Option]:
    command = main.get_command(click.Context(main), name)
    return {p.opts[0]: p for p in command.params if isinstance(p, click.Option)}


def _effective_default(option: click.Option, spec: Spec) -> object:
    """What a command uses when the flag is not given: a spec flag's click default is None everywhere and the
    Spec field's default stands (run through build_spec, memory and prep through spec_from_flags)."""
    flag = next((f for f in SPEC_FLAGS if f.name == option.opts[0]), None)
    if flag is None or option.default is not None:
        return option.default
    value = spec
    for part in flag.key.split("."):
        value = getattr(value, part)
    return value


def _signature(option: click.Option) -> tuple:
    kind = type(option.type).__name__
    choices = tuple(getattr(option.type, "choices", ()) or ())
    return option.help, _effective_default(option, Spec()), kind, choices, option.multiple, option.is_flag


def test_a_flag_in_several_commands_has_one_type_default_and_help():
    options = {name: _options(name) for name in COMMANDS}
    shared = 0
    for flag in sorted({f for opts in options.values() for f in opts}):
        having = [name for name in COMMANDS if flag in options[name] and (name, flag) not in MEANT_TO_DIFFER]
        if len(having) < 2:
            continue
        shared += 1
        signatures = {name: _signature(options[name][flag]) for name in having}
        assert len(set(signatures.values())) == 1, (flag, signatures)
    assert shared >= 12  # --model, --engine, --precision, --backend, --runs-dir... are really compared


def test_memory_and_prep_take_their_model_and_engine_flags_from_the_one_table():
    memory, prep, run = _options("memory"), _options("prep"), _options("run")
    for flag in ("--model", "--model-arg", "--batch-per-worker", "--precision", "--engine", "--output-loss", "--optimizer"):
        assert memory[flag].help == run[flag].help and memory[flag].help
    for flag in ("--model", "--model-arg", "--backend", "--backend-opt", "--name", "--runs-dir", "--dry-run"):
        assert prep[flag].help == run[flag].help and prep[flag].help
    # neither requires it: memory takes the model's batch where it is not given, as a one-worker run does
    assert not memory["--batch-per-worker"].required and not run["--batch-per-worker"].required
    assert set(COMMON) <= set(shared_flag_names())


def test_a_command_cannot_declare_a_shared_flag_again_differently():
    with pytest.raises(ValueError, match="no shared flag --modle"):
        shared_flags("--modle")
    with pytest.raises(ValueError, match="--engine has a default"):
        shared_flags("--engine", required=("--engine",))


def test_launch_memory_uses_launch_runs_defaults(tmp_path):
    """Not given, --model and --engine are run's (nmt-tiny, ddp), not nmt-seed and horovod as before."""
    proc = launch("memory", "--batch-per-worker", "16", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    spec = Spec()
    assert (out["model"], out["engine"], out["precision"], out["output_loss"], out["optimizer"]) == (
        spec.model, spec.engine.name, spec.precision, spec.output_loss, spec.optimizer) == (
        "nmt-tiny", "ddp", "fp32", "auto", "adam")


def test_a_config_file_default_reaches_memory_as_it_reaches_run(tmp_path):
    (tmp_path / "scalelab.yaml").write_text("model: rnnlm-tiny\nengine: horovod\n")
    proc = launch("memory", "--batch-per-worker", "16", "--format", "json", cwd=tmp_path,
                  env={"SCALELAB_CONFIG": str(tmp_path / "scalelab.yaml")})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["model"], out["engine"]) == ("rnnlm-tiny", "horovod")


@pytest.mark.parametrize("args, says", [
    (("memory", "--batch-per-worker", "16", "--model", "nmt-huge"), "unknown model preset 'nmt-huge'"),
    (("memory", "--batch-per-worker", "0"), "batch_per_worker must be a positive whole number"),
    (("memory", "--batch-per-worker", "16", "--engine", "mpi"), "'mpi' is not one of"),
    (("prep", "--model", "nmt-huge", "--train", "x.txt", "--out", "shards", "--dry-run"), "unknown model preset"),
])
def test_a_bad_shared_flag_is_one_line_in_memory_and_prep(tmp_path, args, says):
    proc = launch(*args, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("launch: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and says in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
