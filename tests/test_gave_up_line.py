"""`launch status`'s line for a run whose launcher went away while a rank could not stop (`gave_up_line`): how
the ranks that ended with no record are said to have ended, from the exit statuses their agent reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.launcher.backend import RankEnd, gave_up_line

GAVE_UP = {"gave_up": True, "cause": "its launcher (pid 7) is gone", "grace_s": 25.0, "step": 5}


def _line(tmp_path: Path, exits: dict[str, int]) -> str:
    (tmp_path / "launch.json").write_text(json.dumps({"state": "CANCELLED", "rank_exits": exits}))
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    ranks = [RankEnd(0, 2, 5, {"reason": "interrupted"}, [], [GAVE_UP]), RankEnd(1, 2, 5, None, [], [])]
    return gave_up_line(tmp_path, ranks)


@pytest.mark.parametrize("code", [143, -15])  # horovodrun's word for it, torchrun's
def test_a_peer_its_agent_stopped_is_said_so_not_killed_by_sigterm(tmp_path: Path, code: int) -> None:
    """Before: "rank 1 ended with no record after step 5 (killed by SIGTERM)" when horovodrun happened to report
    the 143 of the stopped (SIGSTOP) rank it terminated after rank 0 gave up (a CI run of stop 67): SIGTERM read as
    if someone had sent it, in the line whose point is that the launcher's loss is the cause."""
    line = _line(tmp_path, {"0": 143, "1": code})
    assert line.startswith("its launcher (pid 7) is gone; rank 0 did not stop within 25 s and exited after step 5, ")
    assert (f"rank 1 ended with no record after step 5 (exit status {code}: stopped by its agent, as agents stop the "
            "ranks left once one has exited)") in line
    assert "SIGTERM" not in line and "no new checkpoint was saved" in line


def test_other_ends_keep_their_signal_or_status_and_an_unknown_one_says_nothing(tmp_path: Path) -> None:
    assert "rank 1 ended with no record after step 5 (killed by SIGKILL);" in _line(tmp_path, {"1": -9})
    assert "rank 1 ended with no record after step 5 (exit status 3);" in _line(tmp_path, {"1": 3})
    assert "rank 1 ended with no record after step 5; no new checkpoint" in _line(tmp_path, {})
