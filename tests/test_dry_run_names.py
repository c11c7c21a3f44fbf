"""What a Slurm user found (2026-12-07): a dry run named the run otherwise than the real run, and `launch sweep
--detach` was answered with click's nearest option names."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_entry


def test_a_dry_run_names_the_run_as_the_real_run_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    """`launch --backend slurm --nodes 2 --dry-run` printed runs/nmt-tiny-DRYRUN and the job name
    scalelab-nmt-tiny-DRYRUN where the real submission is nmt-tiny-ddp-2x1-DATE: only the date may differ.
    And the request is printed exactly: the sbatch script's last newline, not one more."""
    code, err, out = run_entry(["--backend", "slurm", "--nodes", "2", "--gpus-per-node", "1", "--steps", "10",
                                "--runs-dir", str(tmp_path / "runs"), "--dry-run"], monkeypatch, capsys)
    assert code == 0, err
    assert "--job-name=scalelab-nmt-tiny-ddp-2x1-DRYRUN" in out and "runs/nmt-tiny-ddp-2x1-DRYRUN/" in out, out
    assert not out.endswith("\n\n") and not (tmp_path / "runs").exists()


def test_sweep_detach_says_why_a_sweep_is_followed(monkeypatch, capsys) -> None:
    code, err, _ = run_entry(["sweep", "--detach", "--workers", "1,2"], monkeypatch, capsys)
    said = " ".join(err.split())
    assert code == 2 and "a sweep is not detached" in said and "launch status SWEEP" in said, said
