"""`launch plan --gradient-mb 1e305` overflowed the gradient's bytes to inf and the throughput fit died with numpy's
`LinAlgError: SVD did not converge` (a traceback). The flag now has a physical bound, and a fit the arithmetic
cannot do is one error naming the series, never numpy's exception."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scalelab.core.errors import DataError
from scalelab.costs import fitting
from scalelab.costs.fitting import LinkModel, fit_series
from scalelab.costs.planner import PlanRequest, plan
from tests.conftest import run_entry

TABLE = "label,workers,nodes,throughput\na,1,1,100\na,2,2,180\na,4,4,300\n"
MEASURED = pd.DataFrame({"label": ["a"] * 3, "workers": [1, 2, 4], "nodes": [1, 2, 4], "throughput": [100.0, 180.0, 300.0]})


def test_gradient_mb_above_any_model_is_refused_in_one_line(monkeypatch, capsys, tmp_path) -> None:
    (tmp_path / "it.csv").write_text(TABLE)
    for value in ("1e305", "1.1e7"):
        code, err, out = run_entry(["plan", "--from-csv", str(tmp_path / "it.csv"), "--gradient-mb", value],
                                   monkeypatch, capsys)
        assert code == 2 and "Traceback" not in err and "LinAlgError" not in err, err
        assert "--gradient-mb" in err and "<= 1e+07" in err and "10 TB" in err and value in err, err
    code, err, out = run_entry(["plan", "--from-csv", str(tmp_path / "it.csv"), "--gradient-mb", "1e7"],
                               monkeypatch, capsys)
    assert code == 0 and "Predicted throughput" in out, err  # the bound itself is a gradient one may give


def test_a_fit_the_arithmetic_cannot_do_names_its_series() -> None:
    with pytest.raises(fitting.FitError, match="not finite"):
        fitting.nnls(np.array([[1.0, np.inf], [1.0, 2.0]]), np.ones(2))
    with np.errstate(all="ignore"):  # inf bytes times a one-worker ring's zero is NaN, said by the error
        with pytest.raises(DataError, match="series 'a' could not be fitted: the comm model"):
            fit_series("a", MEASURED, LinkModel(gradient_bytes=math.inf))
        with pytest.raises(DataError, match=r"series 'a' could not be fitted.*--gradient-mb") as exc:
            plan(PlanRequest(MEASURED, [1, 2, 4, 8], link=LinkModel(gradient_bytes=math.inf)))
    assert "second GPU count" not in str(exc.value)  # a fit that overflowed: measuring more would not help


def test_nnls_still_solves_what_it_solved() -> None:
    x = fitting.nnls(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), np.array([1.0, 2.0, 3.0]))
    assert x == pytest.approx([1.0, 2.0])
