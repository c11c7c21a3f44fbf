"""The backends' own writes into a run directory never follow a planted link (issue #27 item 3): the
Slurm rank's placement records, the AWS mirror's merged records and logs, through `write_inside`."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.aws.mirror import merge, mirrored
from scalelab.core.writes import LinkError, write_inside
from scalelab.slurm.rank import PLACEMENT_DIR, Task, record_placement


def planted(run: Path, rel: str) -> Path:
    """A link at RUN/rel to a file outside the run directory; returns the outside file."""
    outside = run.parent / "elsewhere.txt"
    outside.write_text("keep me\n")
    (run / rel).parent.mkdir(parents=True, exist_ok=True)
    (run / rel).symlink_to(outside)
    return outside


def test_write_inside_writes_appends_and_refuses_a_link(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    write_inside(run, run / "a.txt", "one\n")
    write_inside(run, run / "a.txt", b"two\n", append=True)
    assert (run / "a.txt").read_text() == "one\ntwo\n"
    outside = planted(run, "b.txt")
    with pytest.raises(LinkError, match="symbolic link"):
        write_inside(run, run / "b.txt", "x", append=True)
    assert outside.read_text() == "keep me\n"


def test_a_slurm_placement_record_is_not_appended_through_a_link(tmp_path: Path) -> None:
    run = tmp_path / "run"
    outside = planted(run, f"{PLACEMENT_DIR}/placement-0.jsonl")
    task = Task(rank=0, world=1, local=0, node=0, nodes=1, hostnames=("node1",), job_id="7")
    with pytest.raises(LinkError):
        record_placement(run, task, {}, {})
    assert outside.read_text() == "keep me\n"


def test_the_aws_mirror_does_not_merge_records_through_a_link(tmp_path: Path) -> None:
    run = tmp_path / "run"
    gen = mirrored(run).records / "gen-0"
    gen.mkdir(parents=True)
    (gen / "rank-0.jsonl").write_text('{"kind": "step"}\n')
    outside = planted(run, "records/rank-0.jsonl")
    with pytest.raises(LinkError):
        merge(run)
    assert outside.read_text() == "keep me\n"
