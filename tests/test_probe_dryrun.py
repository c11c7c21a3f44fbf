"""`launch probe --dry-run` names its runs' directories under --runs-dir (it named ./probe-DRYRUN whatever
--runs-dir said), as a placeholder, as `launch run --dry-run` does."""

from __future__ import annotations

from click.testing import CliRunner

from scalelab.launcher.probe import probe_cmd


def test_the_dry_run_puts_its_runs_under_the_runs_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(probe_cmd, ["--instance-types", "local-1t,local-2t", "--model", "nmt-tiny",
                                            "--probe-steps", "5", "--runs-dir", "elsewhere/runs", "--dry-run"])
    assert result.exit_code == 0, result.output
    dirs = [line.split(": ", 1)[1] for line in result.output.splitlines() if line.startswith("# run directory: ")]
    assert len(dirs) == 6, result.output
    root = tmp_path / "elsewhere" / "runs" / "probe-nmt-tiny-DRYRUN"
    assert all(d.startswith(f"{root}/local-") for d in dirs), dirs
    assert "a placeholder" in result.output
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "probe-DRYRUN").exists()
