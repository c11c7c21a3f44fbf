"""Issue #37 ask 6: property-based tests of the inputs (hypothesis).

Any input the CLI reads - flag values, spec files, record files, state files - gives exit 0 or one
`launch: error:` line and a non-zero exit, never a traceback. Hypothesis draws the inputs: the flags of
`launch run`, `sweep`, `plan`, `cost` and `memory` with values from nasty text and numbers (NaN,
infinity, 1e309, 10**30, empty, commas, unicode), specs as arbitrary YAML/JSON mappings over the real
field names, and record and state lines of any shape. Run and sweep always carry `--dry-run`: nothing
trains. Everything runs in-process (`conftest.run_entry`); the search budget is small for CI (about 60
examples a property, derandomized: the same inputs every run; a few seconds once the commands' modules are
imported); `SCALELAB_HYPOTHESIS_EXAMPLES=N` searches longer, `SCALELAB_HYPOTHESIS_RANDOM=1` elsewhere.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is a test dependency (pyproject's dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.conftest import run_entry  # noqa: E402

EXAMPLES = int(os.environ.get("SCALELAB_HYPOTHESIS_EXAMPLES", "60"))
RANDOM = os.environ.get("SCALELAB_HYPOTHESIS_RANDOM")  # set: a new search each run (else the same, for CI)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=RANDOM is None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ---- values: what a user (or a fault injector) types ---------------------------------------------

NUMBERS = st.sampled_from(["0", "-1", "1", "2", "3", "8", "1.5", "1e9", "1e30", "1e309", "-1e309", "nan", "NaN",
                           "inf", "-inf", "0.0", "-0", "1_000", "0x10", "99999999999999999999", "1e-320", "4,096"])
WORDS = st.sampled_from(["", " ", ",", "a,b", "1,1", "1x1,1x1", "2x2", "0x1", "none", "null", "true", "fused",
                         "ddp", "horovod", "single", "ps", "bf16", "fp16", "task", "text", "synthetic",
                         "shards", "nmt-tiny", "rnnlm-tiny", "g5.xlarge", "nosuch.type", "us-east-1", "mars-1",
                         "1*g5.xlarge+1*g3.4xlarge", "V100=2", "=", "a=b", "hidden_size=0", "num_layers=x",
                         "1:2", "5:3", "../x", "/dev/null", "/proc/x", "é", "\x00", "$(id)", "a\nb", "-", "--",
                         "local", "slurm", "k8s", "aws", "partition=gpu", "bucket=my-bucket", "image=x:1"])
TEXT = st.text(alphabet=string.printable + "é€\u200b", max_size=12)
VALUES = st.one_of(NUMBERS, WORDS, TEXT, st.integers(-(10**25), 10**25).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr))

RUN_FLAGS = ["--model", "--rnn", "--precision", "--engine", "--nodes", "--gpus-per-node", "--global-batch",
             "--batch-per-worker", "--steps", "--epochs", "--warmup-steps", "--optimizer", "--lr", "--lr-warmup-steps",
             "--seed", "--val-every", "--val-batches", "--loss-threshold", "--checkpoint-every", "--threads",
             "--interop-threads", "--balance", "--balance-every", "--emulate-slowdown", "--device", "--output-loss",
             "--profile-steps", "--name", "--data", "--train-src", "--train-tgt", "--prefetch", "--train-samples",
             "--shards", "--fusion-threshold-mb", "--cycle-time-ms", "--grad-compression", "--bucket-cap-mb",
             "--ps-shards", "--ps-state", "--ps-placement", "--model-arg", "--backend", "--backend-opt",
             "--rate", "--max-usd"]
SWEEP_FLAGS = RUN_FLAGS + ["--workers", "--layouts", "--mode", "--batch-scaling", "--work-scaling", "--repeats"]
PLAN_FLAGS = ["--instance-types", "--market", "--work", "--measured-on", "--speed", "--deadline-h", "--budget",
              "--confidence", "--predict-workers", "--predict-batch", "--predict", "--rate", "--region",
              "--gradient-mb", "--intra-gbps"]
COST_FLAGS = ["--rate", "--format", "--region"]
MEMORY_FLAGS = ["--model", "--model-arg", "--batch-per-worker", "--precision", "--engine", "--rnn"]

GOOD_CSV = "label,workers,throughput\nA,1,100\nA,2,180\nA,4,300\n"
COST_CSV = "label,seconds,instances\nA,100,g5.xlarge\n"


def _pairs(flags: list[str], most: int = 4):
    return st.lists(st.tuples(st.sampled_from(flags), VALUES), max_size=most).map(
        lambda items: [x for flag, value in items for x in (flag, value)])


COMMANDS = st.one_of(
    _pairs(RUN_FLAGS).map(lambda a: [*a, "--dry-run", "--runs-dir", "runs"]),
    _pairs(SWEEP_FLAGS).map(lambda a: ["sweep", *a, "--dry-run", "--runs-dir", "runs"]),
    _pairs(PLAN_FLAGS, 3).map(lambda a: ["plan", "--from-csv", "good.csv", *a]),
    _pairs(COST_FLAGS, 2).map(lambda a: ["cost", "--from-csv", "cost.csv", *a]),
    _pairs(MEMORY_FLAGS, 3).map(lambda a: ["memory", *a]),
)


def _assert_clean(argv: list[str], code: int, err: str, out: str) -> None:
    """Exit 0, or a non-zero exit with exactly one `launch: error:` line; never a traceback."""
    assert "Traceback" not in err + out, (argv, err[-3000:])
    if code == 0:
        return
    said = [line for line in err.splitlines() if line.startswith("launch: error:")]
    assert len(said) == 1, (argv, code, err[-3000:])


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCALELAB_PRICES", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no user prices file or AWS config of this machine
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    (tmp_path / "good.csv").write_text(GOOD_CSV)
    (tmp_path / "cost.csv").write_text(COST_CSV)
    return tmp_path


@settings(max_examples=max(EXAMPLES * 2 // 3, 10), deadline=None, derandomize=RANDOM is None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(argv=COMMANDS)
def test_any_flags_give_exit_0_or_one_error_line(argv, workdir, monkeypatch, capsys) -> None:
    code, err, out = run_entry(argv, monkeypatch, capsys)
    _assert_clean(argv, code, err, out)
    assert not (workdir / "runs").exists(), argv  # a dry run, accepted or refused, makes no run directory


# ---- spec files: any mapping over the real field names, any text --------------------------------

SPEC_KEYS = ["model", "rnn", "precision", "nodes", "gpus_per_node", "global_batch", "batch_per_worker", "steps",
             "epochs", "warmup_steps", "optimizer", "lr", "seed", "threads", "name", "emulate_slowdown",
             "profile_steps", "link_probe_mb", "backend", "device", "model_args", "engine", "data",
             "backend_options", "loss_threshold", "val_every", "nosuch"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(), st.text(max_size=8),
                    NUMBERS, WORDS)
NESTED = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6) | st.sampled_from(
                                                           ["kind", "name", "hidden_size", "num_layers", "dropout",
                                                            "train_src", "prefetch", "partition"]), inner,
                                                           max_size=3)), max_leaves=8)
SPECS = st.dictionaries(st.sampled_from(SPEC_KEYS), NESTED, max_size=5)


def _dump_yaml(value) -> str:
    return json.dumps(value, allow_nan=True)  # JSON is YAML (flow style); NaN and Infinity as YAML reads them


@SETTINGS
@given(spec=SPECS, as_json=st.booleans())
def test_any_spec_file_gives_exit_0_or_one_error_line(spec, as_json, workdir, monkeypatch, capsys) -> None:
    name = "spec.json" if as_json else "spec.yaml"
    text = json.dumps(spec, allow_nan=True) if as_json else _dump_yaml(spec).replace("NaN", ".nan").replace(
        "Infinity", ".inf")
    (workdir / name).write_text(text)
    argv = ["--spec", name, "--dry-run", "--runs-dir", "runs"]
    code, err, out = run_entry(argv, monkeypatch, capsys)
    _assert_clean([*argv, text], code, err, out)


@SETTINGS
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_any_spec_text_is_read_or_refused_as_a_user_error(text, workdir) -> None:
    """The one loader (core/yamltext.py) and the spec: anything is a Spec or a ScalelabError."""
    from scalelab.core.errors import ScalelabError
    from scalelab.core.spec import load_spec

    for name in ("s.yaml", "s.json"):
        path = workdir / name
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            load_spec(path).validate()
        except ScalelabError:
            pass


# ---- records and state files ------------------------------------------------------------------------

RECORD_FIELDS = ["kind", "rank", "world", "time", "step", "warmup", "step_s", "samples", "words", "loss", "epoch",
                 "val_loss", "elapsed_s", "event", "message", "global_batch", "lr"]
RECORD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), st.text(max_size=6),
                          st.sampled_from(["step", "start", "val", "event", "error", "link", "nosuch"]))
RECORDS = st.lists(st.one_of(
    st.dictionaries(st.sampled_from(RECORD_FIELDS), RECORD_VALUES, max_size=10).map(
        lambda d: json.dumps(d, allow_nan=True)),
    st.text(max_size=40),
), max_size=8)


def _good_step(step: int) -> str:
    return json.dumps({"kind": "step", "rank": 0, "world": 1, "time": 100.0 + step, "step": step, "warmup": step == 1,
                       "step_s": 0.5, "samples": 16, "words": 160, "loss": 4.0})


def _run_dir(root: Path) -> Path:
    from scalelab.core.spec import Spec, save_spec

    run = root / "run"
    if not run.exists():
        (run / "records").mkdir(parents=True)
        save_spec(Spec.from_dict({"engine": {"name": "single"}, "data": {"kind": "task"}, "steps": 12,
                                  "warmup_steps": 1}).validate(), run)
    return run


def _records_with(workdir: Path, lines: list[str], where: int) -> tuple[Path, str]:
    """A run of twelve good steps with arbitrary `lines` put among them (after the first `where`)."""
    run = _run_dir(workdir)
    good = [_good_step(s) for s in range(1, 13)]
    text = "\n".join(good[:where] + lines + good[where:]) + "\n"
    (run / "records" / "rank-0.jsonl").write_text(text)
    return run, text


@SETTINGS
@given(lines=RECORDS, where=st.integers(0, 12))
def test_any_record_lines_are_summarised_or_refused_as_a_user_error(lines, where, workdir) -> None:
    """The one reader and what a report computes from it (summary, contradictions): a summary, or a
    ScalelabError (one line in the CLI), never another exception."""
    from scalelab.analysis.consistency import contradictions
    from scalelab.analysis.results import summarize_loaded
    from scalelab.core.errors import ScalelabError
    from scalelab.core.records import load_run

    run, _ = _records_with(workdir, lines, where)
    try:
        loaded = load_run(run)
        summarize_loaded(loaded)
        contradictions(loaded)
    except ScalelabError:
        pass


@settings(max_examples=max(EXAMPLES // 6, 5), deadline=None, derandomize=RANDOM is None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=RECORDS, where=st.integers(0, 12))
def test_any_record_lines_give_a_report_or_one_error_line(lines, where, workdir, monkeypatch, capsys) -> None:
    """The same through `launch report` (plots and report files included: a few examples)."""
    run, text = _records_with(workdir, lines, where)
    argv = ["report", str(run), "--out", str(workdir / "rep"), "--format", "json"]
    code, err, out = run_entry(argv, monkeypatch, capsys)
    _assert_clean([*argv, text], code, err, out)


REMOTE = ("slurm", "k8s", "aws")  # a state naming one would ask its scheduler or API: not here
STATE_VALUES = st.recursive(RECORD_VALUES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=6)
STATES = st.one_of(
    st.dictionaries(st.sampled_from(["state", "detail", "backend", "pids", "processes", "launched", "ended",
                                     "started", "job_id", "run_dir"]), STATE_VALUES, max_size=6).map(
        lambda d: json.dumps({**d, "backend": "local"} if d.get("backend") in REMOTE else d)),
    st.text(max_size=30),
    STATE_VALUES.map(json.dumps),
)


@SETTINGS
@given(launch_json=STATES, owner=st.one_of(st.none(), STATES), command=st.sampled_from(["status", "logs", "ls"]))
def test_any_state_file_gives_exit_0_or_one_error_line(launch_json, owner, command, workdir, monkeypatch,
                                                       capsys) -> None:
    """launch.json and owner.json as anything: `status`, `logs` and `ls` answer or refuse in one line
    (`cancel` and `resume` would signal or start processes named by a state that happens to be valid)."""
    run = _run_dir(workdir)
    (run / "launch.json").write_text(launch_json)
    if owner is not None:
        (run / "owner.json").write_text(owner)
    argv = [command, *(["--runs-dir", str(workdir)] if command == "ls" else [str(run)])]
    code, err, out = run_entry(argv, monkeypatch, capsys)
    _assert_clean([*argv, launch_json, owner], code, err, out)


@SETTINGS
@given(lines=RECORDS, where=st.integers(0, 12), state=st.sampled_from(["COMPLETED", "CANCELLED", "FAILED", "RUNNING"]),
       command=st.sampled_from(["status", "ls", "logs"]))
def test_any_record_lines_give_status_or_one_error_line(lines, where, state, command, workdir, monkeypatch,
                                                        capsys) -> None:
    """What follows a run (`status`, `ls`, `logs`: progress, loss, ETA from every rank's records) over
    the same arbitrary lines, the run in any recorded state (no process of it lives)."""
    run, text = _records_with(workdir, lines, where)
    (run / "launch.json").write_text(json.dumps({"state": state, "backend": "local", "pids": [], "processes": [],
                                                 "launched": 90.0}))
    argv = [command, *(["--runs-dir", str(workdir)] if command == "ls" else [str(run)])]
    code, err, out = run_entry(argv, monkeypatch, capsys)
    _assert_clean([*argv, text], code, err, out)


PRICES = st.one_of(
    st.dictionaries(st.sampled_from(["on_demand", "spot", "rates", "instances", "gpu_models", "interruptions", "x"]),
                    st.lists(st.dictionaries(st.sampled_from(["instance_type", "region", "usd_per_hour", "name", "gpus",
                                                              "usd_per_gpu_hour", "per_hour", "mem_bandwidth_gbs",
                                                              "fp32_tflops"]), RECORD_VALUES, max_size=4),
                             max_size=3) | RECORD_VALUES, max_size=3).map(lambda d: json.dumps(d, allow_nan=True)),
    st.text(max_size=60),
)


@SETTINGS
@given(text=PRICES, suffix=st.sampled_from([".json", ".yaml"]))
def test_any_prices_file_is_read_or_refused_as_a_user_error(text, suffix, workdir) -> None:
    """The prices file reader (the catalog, through its one schema): a catalog, or a ScalelabError."""
    from scalelab.core.errors import ScalelabError
    from scalelab.costs.catalog import load_catalog

    path = workdir / f"prices{suffix}"
    path.write_text(text)
    try:
        load_catalog(str(path))
    except ScalelabError:
        pass


CSV_COLUMNS = ["label", "workers", "nodes", "throughput", "time_s", "instance_type", "seconds", "instances", "market",
               "batch_scaling", "work_scaling", "x"]
CSVS = st.tuples(st.lists(st.sampled_from(CSV_COLUMNS), min_size=1, max_size=4),
                 st.lists(st.lists(VALUES, min_size=1, max_size=4), max_size=4)).map(
    lambda t: "\n".join([",".join(t[0]), *(",".join(v.replace("\n", " ") for v in row) for row in t[1])]) + "\n")


@SETTINGS
@given(text=CSVS | st.text(max_size=80), command=st.sampled_from([["report", "--from-csv", "t.csv", "--format", "json"],
                                                                   ["cost", "--from-csv", "t.csv"],
                                                                   ["plan", "--from-csv", "t.csv"]]))
def test_any_csv_table_gives_exit_0_or_one_error_line(text, command, workdir, monkeypatch, capsys) -> None:
    """The CSV tables (`--from-csv` of report, cost and plan) as anything."""
    (workdir / "t.csv").write_text(text)
    argv = [*command, *(["--out", str(workdir / "rep")] if command[0] == "report" else [])]
    code, err, out = run_entry(argv, monkeypatch, capsys)
    _assert_clean([*argv, text], code, err, out)
