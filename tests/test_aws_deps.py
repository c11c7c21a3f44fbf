"""The instance's dependency check (`python -m scalelab.aws.deps`): the user data installs the shipped wheel
without its dependencies and calls pip for them only when this check says something is missing or of a
version the wheel does not accept; a check that passed wrongly would leave an instance that cannot train."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def fake_distribution(site: Path, requires: list[str]) -> None:
    info = site / "fakedist-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedist\nVersion: 1.0\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))


def test_missing_and_mismatched_requirements_are_named_and_extras_and_markers_left_out(tmp_path, monkeypatch) -> None:
    from scalelab.aws.deps import unmet

    fake_distribution(tmp_path, ["click>=8", "click<1", "no-such-package-here>=1", "pytest; extra == 'dev'",
                                 "also-not-here; python_version < '3'"])
    monkeypatch.syspath_prepend(str(tmp_path))
    got = unmet("fakedist")
    assert len(got) == 2, got
    assert got[0].startswith("click<1 (") and "installed)" in got[0]
    assert got[1] == "no-such-package-here>=1 (not installed)"


def test_this_environment_meets_scalelab_and_the_module_exits_0_or_1(monkeypatch, capsys) -> None:
    """Here every dependency is installed (scripts/install.sh): exit 0, nothing said. In a Python without them
    (a bare virtualenv, as on a plain AMI) it exits 1, naming the first of pyproject's dependencies, torch."""
    from scalelab.aws import deps

    here = subprocess.run([sys.executable, "-m", "scalelab.aws.deps"], capture_output=True, text=True, cwd=ROOT)
    assert (here.returncode, here.stderr) == (0, "")

    def nothing_installed(name: str) -> str:
        raise deps.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(deps.metadata, "version", nothing_installed)
    code, err = deps.main(), capsys.readouterr().err
    assert code == 1, err
    assert err.splitlines()[0].startswith("scalelab: needs torch>=2.1 (not installed)"), err
