"""Issue #37 ask 5: the inputs still accepted without a word, or answered about the wrong cause.

Each row was a silent acceptance (exit 0, a plan or a run made of it) or a message naming another
cause; each is now refused where the value enters, saying why and the limit: one `launch: error:` line
(click's usage line and hint around it for a flag's own type, as for every flag), a non-zero exit, no
traceback. In-process through the console entry point (`conftest.run_entry`), so the table takes
seconds. The rows of the first round are in tests/test_issue37.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_entry

FILES = {
    "src.txt": "a b c\nd e f\n",
    "good.csv": "label,workers,throughput\nA,1,100\nA,2,180\nA,4,300\n",
    "twice.json": json.dumps({"on_demand": [
        {"instance_type": "g5.xlarge", "region": "us-east-1", "usd_per_hour": 0.9},
        {"instance_type": "g5.xlarge", "region": "us-east-1", "usd_per_hour": 0.1}]}),
    "rate-twice.json": json.dumps({"rates": [{"name": "lab", "usd_per_gpu_hour": 1.0},
                                             {"name": "lab", "usd_per_gpu_hour": 2.0}]}),
    "comma.json": '{"on_demand": [\n  {"instance_type": "g5.xlarge", "region": "us-east-1", "usd_per_hour": 0.9},\n]}\n',
    "flow.yaml": "on_demand:\n  - instance_type: g5.xlarge\n    region: [us-east-1\n",
    "deep.json": '{"on_demand": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "cost-0.csv": "label,seconds,instances\nA,0,g5.xlarge\n",
    "cost-1e30.csv": "label,seconds,instances\nA,100,g5.xlarge\nB,1e30,g5.xlarge\n",
}
DRY = ["--dry-run", "--runs-dir", "runs"]
AWS = ["--backend", "aws", "--bucket", "my-bucket"]

# (case, argv, words the one error line must hold, words it must not, lines allowed on stderr)
CASES = [
    ("prefetch 1e9", ["--prefetch", "1000000000", *DRY], ["--prefetch", "at most 1024", "held in memory"], [], 1),
    ("nodes 1e20", ["--nodes", "99999999999999999999", *DRY], ["--nodes", "at most 100,000", "more nodes"],
     ["global batch", "split"], 1),
    ("gpus per node", ["--gpus-per-node", "5000", *DRY], ["--gpus-per-node", "at most 1024"], ["global batch"], 1),
    ("global batch 1e11", ["--global-batch", "100000000000", *DRY], ["--global-batch", "at most 10,000,000 samples"],
     [], 1),
    ("batch per worker 1e11", ["--batch-per-worker", "100000000000", *DRY], ["--batch-per-worker", "at most 10,000,000"],
     [], 1),
    ("fusion buffer 1e12", ["--engine", "horovod", "--fusion-threshold-mb", "1e12", *DRY],
     ["--fusion-threshold-mb", "at most 65,536 MB", "GPU's memory"], [], 1),
    ("bucket 1e12", ["--bucket-cap-mb", "1e12", *DRY], ["--bucket-cap-mb", "at most 65,536 MB"], [], 1),
    ("slurm time abc", ["--backend", "slurm", "--time", "abc", *DRY], ["--time", "Slurm's format", "1:30:00"], [], 1),
    ("nmt text without tgt", ["--data", "text", "--train-src", "src.txt", *DRY], ["translates", "--train-tgt is missing"],
     [], 1),
    ("nmt valid src alone", ["--data", "text", "--train-src", "src.txt", "--train-tgt", "src.txt", "--valid-src",
                             "src.txt", *DRY], ["--valid-tgt is missing"], [], 1),
    ("rnnlm with tgt", ["--model", "rnnlm-tiny", "--data", "text", "--train-src", "src.txt", "--train-tgt", "src.txt",
                        *DRY], ["--train-tgt is for translation", "rnnlm"], [], 1),
    ("region mars", [*AWS, "--region", "mars-1", *DRY], ["--region 'mars-1' is not an AWS region", "us-east-1",
                                                          "eu-west-1"], [], 1),
    ("plan region mars", ["plan", "--from-csv", "good.csv", "--measured-on", "g5.xlarge", "--work", "1e6", "--region",
                          "mars-1"], ["--region 'mars-1' is not an AWS region", "us-east-1"], ["--refresh"], 1),
    ("cost region mars", ["cost", "--list", "--region", "mars-1"], ["--region 'mars-1' is not an AWS region"], [], 1),
    ("measured on unknown", ["plan", "--from-csv", "good.csv", "--measured-on", "nosuch.type"],
     ["--measured-on nosuch.type", "unknown instance type", "g5.xlarge"], [], 1),
    ("plan work 1e300", ["plan", "--from-csv", "good.csv", "--work", "1e300", "--measured-on", "g5.xlarge"],
     ["--work", "<= 1e+15", "largest training runs"], [], 3),
    ("prices type twice", ["cost", "--list", "--prices", "twice.json"],
     ["twice.json", "on_demand[1] lists g5.xlarge in us-east-1 again", "first at on_demand[0]", "keep one"], [], 1),
    ("prices rate twice", ["cost", "--list", "--prices", "rate-twice.json"], ["rates[1] lists lab again"], [], 1),
    ("prices trailing comma", ["cost", "--list", "--prices", "comma.json"],
     ["comma.json", "a trailing comma before the closing ] at line 3"], [], 1),
    ("prices yaml error", ["cost", "--list", "--prices", "flow.yaml"], ["flow.yaml", "line 4, column 1"],
     ["<unicode string>"], 1),  # was eight lines: PyYAML's excerpt of the text
    ("prices nested deep", ["cost", "--list", "--prices", "deep.json"], ["deep.json", "nested deeper"], [], 1),
    ("cost 0 seconds", ["cost", "--from-csv", "cost-0.csv"], ["cost-0.csv:2", "'seconds'", "> 0 and at most a year"],
     [], 1),
    ("cost 1e30 seconds", ["cost", "--from-csv", "cost-1e30.csv"], ["cost-1e30.csv:3", "at most a year"], [], 1),
    ("prep 0 lines", ["prep", "--model", "nmt-tiny", "--train-src", "src.txt", "--train-tgt", "src.txt", "--mode",
                      "weak", "--lines-per-worker", "0", "--workers", "1", *DRY],
     ["--lines-per-worker", "at least one line"], [], 3),
    ("sweep layout twice", ["sweep", "--layouts", "1x1,2x1,1x1", *DRY],
     ["layout 1x1 twice", "--layouts 1x1,2x1,1x1", "--repeats"], ["(1, 1)", "[("], 1),
    ("sweep workers twice", ["sweep", "--workers", "2,2", *DRY], ["layout 1x2 twice", "--workers 2,2"], ["[("], 1),
]


@pytest.mark.parametrize("case, argv, words, absent, lines", CASES, ids=[c[0] for c in CASES])
def test_an_input_accepted_before_is_refused_saying_why(case, argv, words, absent, lines, tmp_path, monkeypatch,
                                                        capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCALELAB_PRICES", raising=False)
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    code, err, out = run_entry(argv, monkeypatch, capsys)
    assert code == 2, (case, code, err[-2000:], out[-1500:])
    assert "Traceback" not in err + out, err
    said = [line for line in err.strip().splitlines() if line.startswith("launch: error:")]
    assert len(said) == 1 and len(err.strip().splitlines()) <= lines, err
    for word in words:
        assert word in said[0], (word, said[0])
    for word in absent:
        assert word not in said[0], (word, said[0])
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv", [["--prefetch", "1024", *DRY], ["--nodes", "2", "--gpus-per-node", "2", *DRY],
                                  ["--model", "rnnlm-tiny", "--data", "text", "--train-src", "src.txt", *DRY],
                                  [*AWS, "--region", "eu-west-1", *DRY],
                                  ["sweep", "--layouts", "1x1,2x1", *DRY],
                                  *(["--backend", "slurm", "--time", t, *DRY] for t in ("90", "1:30:00", "2-00", "2-12:30"))])
def test_the_values_beside_them_are_still_accepted(argv, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src.txt").write_text(FILES["src.txt"])
    code, err, _ = run_entry(argv, monkeypatch, capsys)
    assert code == 0, err[-2000:]


def test_a_model_arg_given_as_text_is_converted_once_and_saved_typed(tmp_path) -> None:
    """`hidden_size: "256"` was kept as the text "256" in spec.json; now it is read as the field's type
    where the spec is validated and saved so (a value that is no number is refused, as before)."""
    from scalelab.core.errors import SpecError
    from scalelab.core.spec import Spec, load_spec, save_spec

    (tmp_path / "s.yaml").write_text('model: nmt-tiny\nmodel_args:\n  hidden_size: "256"\n  dropout: "0.1"\n')
    spec = load_spec(tmp_path / "s.yaml").validate()
    assert spec.model_args == {"hidden_size": 256, "dropout": 0.1}
    save_spec(spec, tmp_path)
    assert json.loads((tmp_path / "spec.json").read_text())["model_args"] == {"hidden_size": 256, "dropout": 0.1}
    with pytest.raises(SpecError, match="hidden_size: expected int"):
        Spec.from_dict({"model_args": {"hidden_size": "256x"}}).validate()


# ---- hand-edited run state: named, not taken as something else -------------------------------------


def _run(tmp_path: Path, launch_json: object) -> Path:
    from scalelab.core.spec import Spec, save_spec

    run = tmp_path / "run"
    run.mkdir()
    save_spec(Spec.from_dict({"engine": {"name": "single"}, "data": {"kind": "task"}}).validate(), run)
    (run / "launch.json").write_text(json.dumps(launch_json))
    return run


@pytest.mark.parametrize("command", ["status", "cancel", "resume", "logs"])
@pytest.mark.parametrize("state, words", [
    ({"state": 5, "backend": "local"}, ["field 'state' holds 5", "COMPLETED"]),
    ({"state": "DONE", "backend": "local"}, ["field 'state' holds \"DONE\""]),
    ({"state": "RUNNING", "backend": "local", "pids": "abc"}, ["field 'pids'", "list of process ids"]),
    ({"state": "RUNNING", "backend": "local", "pids": [-4]}, ["field 'pids'"]),
    ({"state": "RUNNING", "backend": "local", "processes": [5]}, ["field 'processes'"]),
    ({"state": "RUNNING", "backend": 7}, ["field 'backend' holds 7"]),
    ({"state": "CANCELLED", "backend": "local", "launched": "yesterday"}, ["field 'launched'"]),
])
def test_a_hand_edited_state_file_is_named(command, state, words, tmp_path, monkeypatch, capsys) -> None:
    """Before: `"state": 5` was reported UNKNOWN, `"pids": "abc"` taken as no process, without a word."""
    run = _run(tmp_path, state)
    before = (run / "launch.json").read_bytes()
    code, err, _ = run_entry([command, str(run)], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().startswith("launch: error:") and len(err.strip().splitlines()) == 1, err
    assert "launch.json" in err and "restore it" in err, err
    for word in words:
        assert word in err, (word, err)
    assert (run / "launch.json").read_bytes() == before


@pytest.mark.parametrize("text", ["garbage", "[]", '{"pid": "x"}', '{"pid": 1e300, "host": 5}'])
def test_a_garbage_owner_lock_is_said_and_replaced(text, tmp_path, capsys) -> None:
    """An owner.json that names no process cannot belong to a live launcher: it is taken over, as a dead
    owner's is, but no longer without a word."""
    from scalelab.core.lock import OWNER_FILE, RunLock

    (tmp_path / OWNER_FILE).write_text(text)
    with RunLock(tmp_path):
        assert json.loads((tmp_path / OWNER_FILE).read_text())["pid"] > 0
    err = capsys.readouterr().err
    assert "launch: warning:" in err and "names no launcher" in err and OWNER_FILE in err, err


# ---- records that contradict their spec: named by the report ---------------------------------------


def _records_run(tmp_path: Path, extra: list[dict], summary: str | None = None) -> Path:
    """A finished single-rank run of 12 steps, written by hand, plus `extra` records of rank 0 or 1."""
    from scalelab.core.spec import Spec, save_spec

    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    save_spec(Spec.from_dict({"engine": {"name": "single"}, "data": {"kind": "task"}, "steps": 12,
                              "warmup_steps": 1}).validate(), run)
    (run / "launch.json").write_text(json.dumps({"state": "COMPLETED", "backend": "local"}))
    common = {"world": 1, "rank": 0}
    recs = [{"kind": "start", "time": 100.0, "global_batch": 16, **common}]
    recs += [{"kind": "step", "time": 100.0 + s, "step": s, "warmup": s == 1, "step_s": 0.5, "samples": 16,
              "words": 160, "loss": 4.0, **common} for s in range(1, 13)]
    by_rank: dict[int, list[dict]] = {}
    for rec in recs + extra:
        by_rank.setdefault(rec["rank"], []).append(rec)
    for rank, items in by_rank.items():
        (run / "records" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    if summary is not None:
        (run / "summary.json").write_text(summary)
    return run


STEP = {"kind": "step", "warmup": False, "step_s": 0.5, "samples": 16, "words": 160, "loss": 4.0}


@pytest.mark.parametrize("extra, summary, words", [
    ([{**STEP, "rank": 1, "world": 1, "time": 105.5, "step": 5}], None,
     ["step records of rank 1", "rank-1.jsonl", "spec has 1 rank"]),
    ([{**STEP, "rank": 0, "world": 4, "time": 112.5, "step": 12}], None,
     ["rank 0 recorded world size 4 at step 12", "its spec 1"]),
    ([{**STEP, "rank": 0, "world": 1, "time": 113.0, "step": 13}], None,
     ["rank 0 recorded step 13", "beyond the 12 steps"]),
    ([{**STEP, "rank": 0, "world": 1, "time": 107.5, "step": 7}], None,
     ["rank 0 recorded step 7 twice in one launch", "rank-0.jsonl"]),
    ([], "{not json", ["summary.json is corrupt"]),
])
def test_the_report_names_each_record_contradiction(extra, summary, words, tmp_path, monkeypatch, capsys) -> None:
    """Before: the report printed its numbers with only a timing-spread warning."""
    run = _records_run(tmp_path, extra, summary)
    code, err, out = run_entry(["report", str(run), "--out", str(tmp_path / "rep")], monkeypatch, capsys)
    assert code == 0 and "Traceback" not in err, err
    said = " ".join(err.split())
    for word in words:
        assert word in said, (word, err)


def test_a_step_redone_after_a_resume_is_no_contradiction(tmp_path, monkeypatch, capsys) -> None:
    """A resume replays the steps after its checkpoint: a new `start` record, then the same step numbers."""
    again = [{"kind": "start", "time": 120.0, "global_batch": 16, "world": 1, "rank": 0}]
    again += [{**STEP, "rank": 0, "world": 1, "time": 120.0 + s, "step": s} for s in (9, 10, 11, 12)]
    run = _records_run(tmp_path, again)
    code, err, _ = run_entry(["report", str(run), "--out", str(tmp_path / "rep")], monkeypatch, capsys)
    assert code == 0, err
    assert "twice" not in err and "recorded" not in err, err
