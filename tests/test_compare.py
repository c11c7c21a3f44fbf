"""scalelab.analysis.compare: the change between two reports in percent, per layout."""

import json

import pandas as pd
import pytest

from scalelab.analysis.compare import compare_tables, load_table


def test_changes_in_percent_and_unmatched_layouts(tmp_path):
    a = pd.DataFrame({"workers": [1, 2], "words_per_s": [100.0, 180.0], "speedup": [1.0, 1.8],
                      "efficiency": [1.0, 0.9], "time_to_threshold_s": [50.0, 30.0]})
    (tmp_path / "report.json").write_text(json.dumps(a.to_dict("records")))
    b = pd.DataFrame({"workers": [1, 2, 4], "words_per_s": [110.0, 171.0, 300.0], "speedup": [1.0, 1.55, 2.7],
                      "efficiency": [1.0, 0.775, 0.675], "time_to_threshold_s": [45.0, 33.0, 20.0]})
    out = compare_tables(load_table(tmp_path), b)
    assert list(out["workers"]) == [1, 2, 4]
    assert out["words_per_s_change_pct"].iloc[0] == pytest.approx(10.0)
    assert out["words_per_s_change_pct"].iloc[1] == pytest.approx(-5.0)
    assert out["time_to_threshold_s_change_pct"].iloc[1] == pytest.approx(10.0)
    assert pd.isna(out["speedup_change_pct"].iloc[2])  # only B has 4 workers: no change invented


def test_cli_compare_refuses_one_report(tmp_path):
    from tests.conftest import launch

    proc = launch("report", str(tmp_path), "--compare", cwd=tmp_path)
    assert proc.returncode == 2 and "--compare takes two reports" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_compare_warns_when_the_models_differ(tmp_path):
    """Comparing an nmt-tiny report with an rnnlm-small one printed percentages without a word."""
    from click.testing import CliRunner

    from scalelab.launcher.cli import main

    for name, model in (("a", "nmt-tiny"), ("b", "rnnlm-small"), ("c", "nmt-tiny")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps([{"workers": 1, "model": model, "words_per_s": 100.0}]))
    out = CliRunner().invoke(main, ["report", str(tmp_path / "a"), str(tmp_path / "b"), "--compare"])
    assert out.exit_code == 0, out.output
    assert "warning: the reports compare different models (nmt-tiny against rnnlm-small)" in out.stderr
    same = CliRunner().invoke(main, ["report", str(tmp_path / "a"), str(tmp_path / "c"), "--compare"])
    assert same.exit_code == 0 and "warning" not in same.stderr
