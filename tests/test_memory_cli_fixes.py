"""`launch memory`'s text output: it fits 80 columns, shows a tiny model's peak in MiB and its shares as
"<1%", suggests only the remedies the flags have not already taken, and the README names its flags."""

from __future__ import annotations

import re
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


# ---- `launch bench`'s quick tables (kept here: the brief allows no other new test file) -----------------


def _rendered(results: dict, monkeypatch) -> str:
    import io

    from rich.console import Console

    from scalelab.launcher import bench

    out = io.StringIO()
    monkeypatch.setattr(bench, "console", Console(file=out, width=250, color_system=None))
    bench._decorate(results)
    bench.render(results)
    return out.getvalue()


def _cells(text: str, first: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.strip("│ ").startswith(first))
    return [c.strip() for c in line.strip().strip("│").split("│")]


def test_bench_exchange_shows_a_negative_exposed_time_as_noise_and_memcpys_own_figure(monkeypatch):
    results = {"exchange": [
        {"label": "memcpy (one process)", "bytes": 2**28, "bytes_per_s": 45.09e9},
        {"label": "gloo 1 MB", "mb": 1, "time_s": 0.001, "busbw": 2e9},
        {"bucket_cap_mb": 25, "compression": "bf16", "step_with_exchange_s": 0.345, "step_without_exchange_s": 0.532,
         "exposed_exchange_s": -0.187},
        {"bucket_cap_mb": 100, "compression": "none", "step_with_exchange_s": 0.6, "step_without_exchange_s": 0.5,
         "exposed_exchange_s": 0.1}]}
    text = _rendered(results, monkeypatch)
    assert "-0.18" not in text and _cells(text, "25")[-1] == "0 (noise)" and _cells(text, "100")[-1] == "0.100"
    assert "timing noise" in " ".join(text.split())
    assert _cells(text, "memcpy (one process)")[-1] == "45.09" and _cells(text, "gloo 1 MB")[-1] == "45.09"
    assert results["exchange"][2]["exposed_exchange_s"] == -0.187  # bench.json keeps the measurement


def test_bench_compute_flags_a_vs_fp32_median_that_contradicts_its_words_per_s(monkeypatch):
    def row(rnn, precision, words, speedup):
        return {"preset": "nmt-small", "rnn": rnn, "precision": precision, "batch": 64, "threads": 4, "step_s": 1.0,
                "words_per_s": words, "speedup_vs_fp32": speedup, "flops_per_s": 1e9, "matmul_flops_per_s": 2e9,
                "matmul_fp32_flops_per_s": 1e9, "matmul_bf16_flops_per_s": 2e9, "efficiency": 0.5}

    results = {"compute": [row("fused", "fp32", 1000, 1.0), row("fused", "bf16", 1500, 1.45),
                           row("stepwise", "fp32", 100, 1.0), row("stepwise", "bf16", 288, 1.98)]}
    text = _rendered(results, monkeypatch)
    stepwise = next(line for line in text.splitlines() if "stepwise" in line and "bf16" in line)
    fused = next(line for line in text.splitlines() if "fused" in line and "bf16" in line)
    assert "noisy" in stepwise and "2.88" in stepwise and "noisy" not in fused, text
    assert "median of per-round ratios" in " ".join(text.split())


def test_a_combination_launch_run_refuses_is_not_predicted():
    """`launch memory --engine ps --precision fp16` printed a prediction for what `launch run` refuses."""
    from scalelab.core.errors import SpecError

    result = CliRunner().invoke(memory_cmd, ["--engine", "ps", "--precision", "fp16", "--batch-per-worker", "32"])
    assert isinstance(result.exception, SpecError) and "--engine ps does not train in --precision fp16" in str(
        result.exception), result.output


def test_study_names_a_wrong_backend_by_its_flag_listing_the_valid_ones():
    """It said "backend must be one of ... (variant 'cudnn_lstm all-reduce')": a variant nobody named."""
    from scalelab.launcher.study import study_cmd

    study = str(README.parent / "examples" / "seed001-nmt-data-parallel.yaml")
    result = CliRunner().invoke(study_cmd, [study, "--backend", "nope", "--dry-run"])
    assert result.exit_code == 2 and "Invalid value for '--backend': 'nope' is not one of 'local', 'slurm'" in (
        result.output), result.output


def test_a_gpu_short_of_both_memory_and_arithmetic_says_both_within_80_columns():
    """A 1,536 GiB bf16 rank: its rows printed "19197% used no bf16 arithmetic" (no gap before the status), and an
    M60, K80, T4 or V100 never said "does not fit", as if the arithmetic were all it lacked."""
    out = run("--model", "nmt-seed", "--batch-per-worker", "100000", "--precision", "bf16")
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    for name in ("g3.4xlarge", "p2.xlarge", "g4dn.xlarge", "p3.2xlarge"):
        assert re.search(r"% used {2,}does not fit; no bf16 arithmetic$", rows[name]), rows[name]
    assert re.search(r"% used {2,}does not fit$", rows["g5.xlarge"]), rows["g5.xlarge"]
    assert len({line.index("does not") for line in rows.values()}) == 1, out  # the statuses in one column
    assert max(len(line) for line in rows.values()) <= 80, out


def test_without_a_batch_a_rank_takes_the_models_and_says_so():
    """`launch memory --model nmt-tiny` failed "Missing option '--batch-per-worker'", though the README says the
    command's flags take `launch run`'s defaults; the model's batch is that default (one worker's batch)."""
    from scalelab.core.presets import PRESETS

    out = " ".join(run("--model", "nmt-tiny").split())
    batch = PRESETS["nmt-tiny"].default_batch
    assert out.startswith(f"nmt-tiny, {batch} per rank (the model's default batch; --batch-per-worker N for another)"), out
    given = " ".join(run("--model", "nmt-tiny", "--batch-per-worker", "8").split())
    assert given.startswith("nmt-tiny, 8 per rank, fp32"), given


def test_an_unknown_model_is_named_before_anything_missing():
    """`--model nmt-nope` without a batch reported the missing batch, not the model."""
    result = CliRunner().invoke(memory_cmd, ["--model", "nmt-nope"])
    assert result.exit_code != 0 and "unknown model preset 'nmt-nope'" in str(result.exception), result.output
