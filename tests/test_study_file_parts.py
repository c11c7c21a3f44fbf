"""A study file's nested parts are checked as its top level is: a wrong kind of value or a misspelt key
inside `scales`, a variant or `instances` is one message naming its path in the file (`scales.cpu.layots`),
where before it was a traceback (`scales: [1]`), read letter by letter (`scales: abc`) or ignored with
exit 0 (`market: nope`, `title: 5`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scalelab.core.errors import SpecError
from scalelab.launcher.study import load_study
from tests.conftest import ROOT, run_entry

SEED002 = ROOT / "examples" / "seed002-rnnlm-strong-weak.yaml"


def _study(tmp_path: Path, replace: str) -> Path:
    """seed002 with one top-level key (`key: value`) replaced, or added when the file has no such key."""
    text = SEED002.read_text()
    key = replace.split(":")[0]
    if key == "scales":
        text = text[: text.index("\nscales:")] + "\n" + replace + "\n"
    elif re.search(rf"^{key}:", text, flags=re.M):
        text = re.sub(rf"^{key}:.*$", replace, text, flags=re.M)
    else:
        text += replace + "\n"
    path = tmp_path / "X.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("replace, says", [
    ("scales: [1]", r"scales in .*X.yaml must be a mapping of scale names to their settings.*got \[1\]"),
    ("scales: abc", r"scales in .*X.yaml must be a mapping of scale names.*got 'abc'"),
    ("scales: {cpu: [1]}", r"scales.cpu in .*must be a mapping of the settings the scale changes.*got \[1\]; "
                           r"write cpu: \{\}"),
    ("scales: {cpu: {layots: [1x1]}}", r"unknown key\(s\) in .*: scales.cpu.layots; valid in a scale: .*layouts"),
    ("scales: {cpu: {market: x}}", r"scales.cpu.market in .* must be one of on-demand, spot; got 'x'"),
    ("scales: {1: {}, cpu: {}}", r"a scale named 1: name each scale with text"),
    ("scales: {cpu: {variants: [{label: a, set: 5}]}}", r"scales.cpu.variants\[0\].set in .* must be a mapping"),
    ("scales: {cpu: {variants: [{label: a, lay: [1x1]}]}}", r"scales.cpu.variants\[0\].lay; valid in a variant"),
    ("market: nope", r"^market in .* must be one of on-demand, spot; got 'nope'"),
    ("instances: bogus", r"^instances in .* must be a mapping of layouts to instance mixes"),
    ("instances: {1x1: '2*'}", r"^instances.1x1 in .*cannot read instances '2\*'"),
    ("title: 5", r"^title in .* must be text"),
    ("epochs_shown: abc", r"^epochs_shown in .* must be a whole number of at least 1.*got 'abc'"),
    ("layouts: [1]", r"^layouts in .* must be a non-empty list of NODESxGPUS layouts.*got \[1\]"),
    ("mode: [1]", r"^mode in .* must be text: strong or weak"),
    ("gemm: {hiddens: [8]}", r"sets gemm options, which only a study of kind: gemm reads"),
])
def test_a_wrong_part_is_named_by_its_path(tmp_path, replace, says):
    with pytest.raises(SpecError, match=says):
        load_study(_study(tmp_path, replace), "cpu")


def test_a_gemm_option_of_the_wrong_kind_is_refused_not_iterated():
    """`hiddens: 5` was iterated (TypeError) when the GEMM study's options were checked."""
    from scalelab.launcher.study import _check_gemm

    with pytest.raises(SpecError, match=r"gemm.hiddens in .* must be a list of positive whole numbers, got 5"):
        _check_gemm({"hiddens": 5}, SEED002)


@pytest.mark.parametrize("replace", ["scales: [1]", "scales: {cpu: [1]}"])
def test_launch_study_says_one_line_and_exits_2(tmp_path, monkeypatch, capsys, replace):
    """Through the command as the review ran it: both were a traceback with exit 1."""
    monkeypatch.chdir(tmp_path)
    code, err, out = run_entry(["study", "--dry-run", str(_study(tmp_path, replace)), "--scale", "cpu"],
                               monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err and out == ""
    assert err.strip().startswith("launch: error: scales") and len(err.strip().splitlines()) == 1, err
