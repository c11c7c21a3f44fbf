"""`launch memory`'s text output: it fits 80 columns, shows a tiny model's peak in MiB and its shares as
"<1%", suggests only the remedies the flags have not already taken, and the README names its flags."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from scalelab.costs.memory_cli import memory_cmd

README = Path(__file__).resolve().parents[1] / "README.md"


def run(*args: str) -> str:
    result = CliRunner().invoke(memory_cmd, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_the_seed_models_bf16_output_fits_80_columns():
    out = run("--model", "nmt-seed", "--batch-per-worker", "360", "--precision", "bf16", "--output-loss", "full")
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 80, out
    assert "no bf16" in out and "GiB" in out.splitlines()[0]


def test_a_tiny_models_peak_is_in_mib_and_its_shares_are_under_one_percent():
    out = run("--model", "nmt-tiny", "--batch-per-worker", "16")
    assert "0.00" not in out and "MiB" in out.splitlines()[0], out
    assert " 0% " not in out and "<1%" in out, out
    from scalelab.costs.memory_cli import share_text, size_text
    assert size_text(0.05 * 1024**3) == "51 MiB" and size_text(2.5 * 1024**3) == "2.50 GiB"
    assert share_text(0.004) == "<1%" and share_text(0.5) == "50%"


def test_the_footer_names_only_the_remedies_not_already_taken():
    bf16 = run("--model", "nmt-seed", "--batch-per-worker", "1440", "--precision", "bf16")
    flat = " ".join(bf16.split())
    assert "does not fit" in flat and "--batch-per-worker" in flat
    footer = flat[flat.index("where it does not"):]
    assert footer == "where it does not, use a smaller --batch-per-worker.", footer
    full = " ".join(run("--model", "nmt-seed", "--batch-per-worker", "360", "--output-loss", "full").split())
    assert "--precision bf16" in full and "--output-loss compiled" in full
    from scalelab.costs.memory_cli import remedies_left
    assert remedies_left("fp32", "auto") == "a smaller --batch-per-worker or --precision bf16"
    assert remedies_left("bf16", "compiled") == "a smaller --batch-per-worker"


def test_the_readme_names_exactly_the_flags_launch_memory_takes():
    text = " ".join(README.read_text().split())
    start = text.index("`launch memory --model nmt-seed --batch-per-worker 360 --precision bf16` predicts")
    passage = text[start:start + 600]
    taken = {p.opts[0] for p in memory_cmd.params if p.opts[0].startswith("--") and p.name not in ("instance_types", "fmt")}
    for flag in taken:
        assert f"`{flag}`" in passage, flag
    assert "`--rnn`" in passage and "`--ps-state`" in passage
    assert "--rnn" not in taken and "--ps-state" not in taken
