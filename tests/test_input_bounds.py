"""Numbers past any real cluster or run, and inputs that say one thing twice: one error line each.

Found by a review: `--predict-workers 1e20` was planned, a CSV's 1e23 workers shown as 99999999999999991611392,
`--steps 1e20` priced at $6e15 by --dry-run; a CSV with both throughput and time_s used one of them without a
word; a rate named like an AWS type replaced that type's shape and price silently ($2.28 became $0.90).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_entry


def _one_error(argv: list[str], monkeypatch, capsys) -> str:
    code, err, _ = run_entry(argv, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: error:"), err
    return lines[0]


def _csv(tmp_path: Path, text: str) -> str:
    path = tmp_path / "t.csv"
    path.write_text(text)
    return str(path)


def test_a_csv_worker_count_past_any_cluster_is_refused(tmp_path, monkeypatch, capsys) -> None:
    path = _csv(tmp_path, "workers,throughput\n1,100\n99999999999999999999999,200\n")
    err = _one_error(["plan", "--from-csv", path], monkeypatch, capsys)
    assert "t.csv:3" in err and "up to 1,000,000" in err, err


def test_predict_workers_past_any_cluster_is_refused(tmp_path, monkeypatch, capsys) -> None:
    path = _csv(tmp_path, "workers,throughput\n1,100\n2,190\n")
    err = _one_error(["plan", "--from-csv", path, "--predict-workers", "99999999999999999999"], monkeypatch, capsys)
    assert "more GPUs than any cluster has" in err, err


def test_a_csv_with_both_throughput_and_time_is_refused(tmp_path, monkeypatch, capsys) -> None:
    path = _csv(tmp_path, "workers,throughput,time_s\n1,100,10\n2,190,6\n")
    err = _one_error(["plan", "--from-csv", path], monkeypatch, capsys)
    assert "both 'throughput' and 'time_s'" in err, err


def test_steps_past_years_of_training_are_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    err = _one_error(["run", "--steps", "99999999999999999999", "--dry-run"], monkeypatch, capsys)
    assert "steps must be at most 1,000,000,000" in err, err


def test_a_rate_named_like_a_known_instance_type_is_refused(monkeypatch, capsys) -> None:
    err = _one_error(["cost", "--list", "--rate", "g3.4xlarge=0.9/gpu-hour"], monkeypatch, capsys)
    assert "'g3.4xlarge'" in err and "instance type the catalog knows" in err and "g3.4xlarge-onprem" in err, err


@pytest.mark.parametrize("extra", [["--from-csv", "x.csv"], ["--instances", "2*g3.4xlarge"]])
def test_cost_list_with_what_it_would_ignore_is_refused(extra, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.csv").write_text("instances,seconds\n1*g3.4xlarge,60\n")
    err = _one_error(["cost", "--list", *extra], monkeypatch, capsys)
    assert "--list prints the catalog; it does not go with" in err, err


@pytest.mark.parametrize("given", ["", ","])
def test_memory_instance_types_naming_none_is_refused(given, monkeypatch, capsys) -> None:
    err = _one_error(["memory", "--model", "nmt-tiny", "--batch-per-worker", "8", "--instance-types", given],
                     monkeypatch, capsys)
    assert "names no type" in err, err


def test_ls_of_a_runs_dir_that_is_a_device_says_what_it_is(monkeypatch, capsys) -> None:
    err = _one_error(["ls", "--runs-dir", "/dev/null"], monkeypatch, capsys)
    assert "/dev/null is a character device, not a directory" in err, err


def test_a_misspelt_allow_changed_is_refused_even_for_a_completed_run(tmp_path, monkeypatch, capsys) -> None:
    import json as _json

    from scalelab.core.spec import Spec, save_spec

    run = tmp_path / "run"
    run.mkdir()
    save_spec(Spec.from_dict({"engine": {"name": "single"}}).validate(), run)
    (run / "launch.json").write_text(_json.dumps({"state": "COMPLETED", "run_dir": str(run)}))
    err = _one_error(["resume", str(run), "--allow-changed", "learning_rate"], monkeypatch, capsys)
    assert "'learning_rate' is not a field" in err, err
