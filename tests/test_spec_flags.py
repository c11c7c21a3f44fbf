"""The spec's flags are generated from its fields (scalelab/core/spec.py declares each with `option()`):
every flagged field has one flag with help, its choices are the field's `one_of`, and `launch run --help`
explains each one. Adding a field with a flag adds a working flag and nothing else has to change."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest
from click.testing import CliRunner

from scalelab.core.options import checked, one_of, option, option_flags, type_hints
from scalelab.core.engines import ENGINE_HELP
from scalelab.core.spec import (
    BACKEND_NAMES,
    BALANCE_MODES,
    DATA_KINDS,
    ENGINES,
    DataSpec,
    EngineSpec,
    Spec,
)
from scalelab.launcher.cli import SPEC_FLAGS, build_spec, main, spec_options

# Fields set only by a spec file or by the code (a sweep sets work_scaling), on purpose without a flag.
NO_FLAG = {"workdir", "backend_options", "model_args", "lr_ref_batch", "clip_grad_norm", "link_probe_mb", "work_scaling",
           "data.valid_samples", "data.bucket",
           "script_args", "script_dir"}  # what follows `--`; the folder of --script / --module, set by the CLI
# Every flag the command line had before the flags were generated: none may disappear or be renamed.
FLAGS_BEFORE = """--backend --model --rnn --precision --engine --nodes --gpus-per-node --global-batch --batch-per-worker
--steps --epochs --warmup-steps --lr --lr-warmup-steps --optimizer --data --shards --train-src --train-tgt --valid-src
--valid-tgt --fixed-length/--variable-length --train-samples --prefetch --val-every --val-batches --loss-threshold
--checkpoint-every --threads --interop-threads --independent-replicas/--exchange --balance --balance-every
--emulate-slowdown --device --cuda-graph --seed --fusion-threshold-mb --cycle-time-ms --grad-compression
--fp16-allreduce/--no-fp16-allreduce --bucket-cap-mb --ps-shards --ps-state --profile-steps --ps-placement --name
--output-loss --script --module --stall-timeout-min""".split()  # --script, --module: issue 34; --stall-timeout-min:
# a hung rank ended by its launcher (tests/test_stalls.py)


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    hints = type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _leaf_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def _run_help() -> str:
    return CliRunner().invoke(main, ["run", "--help"], terminal_width=100).output


def test_every_spec_field_has_a_flag_with_help_or_is_meant_to_have_none():
    flagged = {f.key for f in SPEC_FLAGS}
    assert flagged | NO_FLAG == set(_leaf_keys(Spec)), set(_leaf_keys(Spec)) - flagged - NO_FLAG
    assert not flagged & NO_FLAG
    for flag in SPEC_FLAGS:
        words = re.sub(r"\[default: [^]]*\]", "", flag.help).strip()
        assert len(words) > 10, f"{flag.name}: its help says nothing but the default: {flag.help!r}"


def test_the_flags_that_existed_are_all_still_there_with_their_spelling():
    assert sorted(f.decl for f in SPEC_FLAGS) == sorted(FLAGS_BEFORE)


def test_run_help_explains_every_spec_flag_with_its_default_within_100_columns():
    text = _run_help()
    for flag in SPEC_FLAGS:
        assert re.search(rf"^\s+{re.escape(flag.name)}\b", text, re.M), flag.name
    assert "Nodes in the layout. [default: 1]" in text  # the default read from Spec's own declaration
    assert "[default: 40]" in text and "[default: nmt-tiny]" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_engine_help_lists_every_engine_of_the_one_definition():
    engine = next(f for f in SPEC_FLAGS if f.name == "--engine")
    assert engine.choices == tuple(ENGINES)
    text = " ".join(_run_help().split())
    for name, what in ENGINE_HELP.items():
        assert f"{name} = {' '.join(what.split())}" in text.replace("- ", "-"), name


@pytest.mark.parametrize("flag, values", [("--backend", BACKEND_NAMES), ("--balance", BALANCE_MODES),
                                          ("--engine", tuple(ENGINES))])
def test_choice_flags_offer_exactly_the_fields_choices(flag, values):
    param = next(p for p in main.commands["run"].params if flag in p.opts)
    assert isinstance(param.type, click.Choice) and tuple(param.type.choices) == tuple(values)


def test_data_flag_takes_the_kinds_of_the_one_definition_and_shards_dir(tmp_path):
    param = next(p for p in main.commands["run"].params if "--data" in p.opts)
    assert param.type.get_metavar(param) == "[" + "|".join(DATA_KINDS) + "|shards:DIR]"
    cmd, seen = _command()
    assert _invoke(cmd, "--data", "task").exception is None and seen["spec"].data.kind == "task"
    bad = _invoke(cmd, "--data", "pictures")
    assert bad.exit_code != 0 and "synthetic, task, text, shards" in bad.output + str(bad.exception)


def test_flag_values_are_typed_and_checked_as_the_field_declares():
    cmd, seen = _command()
    assert _invoke(cmd, "--emulate-slowdown", "1,2.5", "--gpus-per-node", "2", "--engine", "ddp").exception is None
    assert seen["spec"].emulate_slowdown == [1.0, 2.5]
    assert _invoke(cmd, "--data", "task", "--fixed-length", "--exchange", "--engine", "ps", "--ps-shards",
                   "1").exception is None
    assert seen["spec"].data.fixed_length is True and seen["spec"].independent_replicas is False
    bad = _invoke(cmd, "--warmup-steps", "-1").exception
    assert str(bad) == "warmup_steps must be >= 0, got -1 (from --warmup-steps)"


@dataclasses.dataclass
class _WiderSpec(Spec):
    """A spec with one more field declared the way every field is."""

    patience: int = option(3, "Validations without improvement before stopping.", one_of(1, 2, 3),
                           flag="--patience")
    note: str = checked("")


def test_a_new_field_declared_with_option_is_a_flag_with_its_choices_and_default():
    flags = {f.key: f for f in option_flags(_WiderSpec)}
    assert flags["patience"].choices == (1, 2, 3)
    assert flags["patience"].help == "Validations without improvement before stopping. [default: 3]"
    assert "note" not in flags
    assert [f.key for f in option_flags(EngineSpec, "engine.")] == [f.key for f in SPEC_FLAGS if f.key.startswith("engine.")]
    assert [f.key for f in option_flags(DataSpec, "data.")] == [f.key for f in SPEC_FLAGS if f.key.startswith("data.")]


def _command():
    """A `run`-like command of the spec flags alone; it stores the Spec it builds in the returned dict."""
    seen: dict = {}

    @click.command()
    @spec_options
    def cmd(**params):
        seen["spec"] = build_spec(params)

    return cmd, seen


def _invoke(cmd, *args: str):
    return CliRunner().invoke(cmd, list(args), standalone_mode=False, catch_exceptions=True)
