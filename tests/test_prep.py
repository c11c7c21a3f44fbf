"""`launch prep` and `--data shards`: same ids as `--data text`, same shards for any number of
workers, bounded memory per task, records and the scaling table, S3 (moto), dry runs.

Most tests run the pipeline on an in-process Dask cluster (threads: fast, and the logic is the
same); one runs the real command with worker processes and trains on its shards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason='launch prep needs Dask: pip install "scalelab[prep]"')
pytest.importorskip("pyarrow", reason='launch prep needs pyarrow: pip install "scalelab[prep]"')

import torch  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

from scalelab.core.errors import DataError, SpecError  # noqa: E402
from scalelab.core.presets import PRESETS, config_with_overrides  # noqa: E402
from scalelab.prep import tasks  # noqa: E402
from scalelab.prep.bench import generate  # noqa: E402
from scalelab.prep.corpus import ROLES  # noqa: E402
from scalelab.prep.pipeline import Prep, plan_spans  # noqa: E402
from scalelab.prep.request import PrepRequest  # noqa: E402
from tests.conftest import ROOT, launch, only_run_dir, read_jsonl  # noqa: E402
from scalelab.train.datasets import build_dataset  # noqa: E402
from scalelab.train.text import PATH_KEYS  # noqa: E402

MODELS = {"nmt": "nmt-tiny", "rnnlm": "rnnlm-tiny", "sentiment": "sentiment-tiny"}
ARGS = {"vocab_size": 300}  # the corpora have more words: the cut (ties by spelling) must agree


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        yield c


@pytest.fixture(autouse=True)
def marks_every_few_lines(monkeypatch):
    """Marks every 7 lines, so shards start from marks in the middle of blocks."""
    monkeypatch.setattr(tasks, "MARK_EVERY", 7)


def prep(client, model: str, inputs: dict, out: Path, **kw) -> tuple[dict, list[dict]]:
    request = PrepRequest(model=model, inputs=inputs, out=str(out), model_args=kw.pop("model_args", ARGS),
                          **{"shard_size": 97, "block_mb": 2 / 1024, **kw}).validate()
    records: list[dict] = []
    return Prep(client, request, records.append).run(), records


def text_paths(inputs: dict) -> dict[str, str]:
    return {k: v[0] for k, v in inputs.items()}


def test_prep_roles_are_the_text_datasets_keys() -> None:
    assert ROLES == PATH_KEYS


@pytest.mark.parametrize("family", ["nmt", "rnnlm", "sentiment"])
@pytest.mark.parametrize("valid", ["holdout", "files"])
def test_shards_hold_the_token_ids_of_data_text(client, tmp_path: Path, family: str, valid: str) -> None:
    inputs = generate(tmp_path / "c", family, 800, words=600, seed=1)
    if valid == "files":
        held = generate(tmp_path / "v", family, 150, words=700, seed=2)  # words unseen in training -> <unk>
        inputs.update({k.replace("train", "valid"): v for k, v in held.items()})
    manifest, _ = prep(client, MODELS[family], inputs, tmp_path / "shards")
    cfg = config_with_overrides(PRESETS[MODELS[family]], ARGS)
    text = build_dataset("text", cfg, 5, text_paths(inputs), bucket_batches=3)
    shards = build_dataset("shards", cfg, 5, directory=str(tmp_path / "shards"), bucket_batches=3)
    assert shards.model_overrides() == text.model_overrides()
    assert len(manifest["splits"]["train"]["shards"]) > 3 and manifest["splits"]["train"]["shards"][0]["samples"] == 97
    for split in ("train", "valid"):
        a, b = getattr(text, split), getattr(shards, split)
        assert len(a) == len(b) == manifest["splits"][split]["samples"]
        every = torch.arange(len(a))
        assert_same(a.batch(every), b.batch(every))
    # one rank reads the batches --data text gives, epoch after epoch
    assert shards.steps_per_epoch(16) == text.steps_per_epoch(16)
    for epoch, step in ((0, 0), (0, 5), (1, 2)):
        assert_same(text.get_batch(epoch, step, 16, 0, 16), shards.get_batch(epoch, step, 16, 0, 16))


def assert_same(a, b) -> None:
    assert a.inputs.keys() == b.inputs.keys()
    for key in a.inputs:
        assert torch.equal(a.inputs[key], b.inputs[key]), key
    assert (a.samples, a.words) == (b.samples, b.words)


@pytest.mark.slow
def test_same_shards_for_any_number_of_workers(tmp_path: Path) -> None:
    inputs = generate(tmp_path / "c", "nmt", 900, words=400, seed=3)
    outs = []
    for workers, block_kb in ((1, 4), (3, 1)):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
                Client(cluster) as c:
            _, records = prep(c, "nmt-tiny", inputs, tmp_path / f"w{workers}", block_mb=block_kb / 1024)
        assert len({r["worker"] for r in records if r["kind"] == "task"}) == workers
        outs.append({p.name: p.read_bytes() for p in sorted((tmp_path / f"w{workers}").iterdir())})
    assert outs[0].keys() == outs[1].keys() and "manifest.json" in outs[0]
    assert outs[0] == outs[1], [name for name in outs[0] if outs[0][name] != outs[1][name]]


def test_a_glob_of_files_is_one_corpus_in_sorted_order(client, tmp_path: Path) -> None:
    """Parallel text split over three file pairs (a glob each side) gives the shards of the whole
    files: shards and reads cross file boundaries."""
    whole = generate(tmp_path / "c", "nmt", 700, words=400, seed=8)
    parts = tmp_path / "parts"
    parts.mkdir()
    for key, ext in (("train_src", "src"), ("train_tgt", "tgt")):
        lines = Path(whole[key][0]).read_bytes().split(b"\n")[:-1]
        for k, (lo, hi) in enumerate(((0, 250), (250, 251), (251, 700))):
            (parts / f"part{k}.{ext}").write_bytes(b"".join(line + b"\n" for line in lines[lo:hi]))
    prep(client, "nmt-tiny", whole, tmp_path / "one")
    manifest, _ = prep(client, "nmt-tiny", {"train_src": [str(parts / "*.src")], "train_tgt": [str(parts / "*.tgt")]},
                       tmp_path / "many")
    assert [Path(u).name for u in manifest["sources"]["train_src"]] == ["part0.src", "part1.src", "part2.src"]
    for name in sorted(p.name for p in (tmp_path / "one").iterdir() if p.suffix != ".json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes(), name


def test_spans_tile_the_corpus_with_full_training_shards() -> None:
    held = torch.tensor([0, 1, 5, 9, 10, 11, 19]).numpy()
    spans = plan_spans(20, held, 4)
    assert [(lo, hi) for lo, hi, _ in spans] == [(0, 7), (7, 14), (14, 18), (18, 20)]
    for lo, hi, mine in spans[:-1]:
        assert hi - lo - len(mine) == 4
    assert sorted(x for _, _, m in spans for x in m.tolist()) == held.tolist()


@pytest.mark.slow
def test_a_task_needs_memory_for_its_piece_not_for_the_corpus(tmp_path: Path, monkeypatch) -> None:
    """A task's peak of Python allocations (traced in the worker's own process) does not grow when
    the corpus doubles: a worker holds one block of text or one shard at a time, so a corpus
    larger than its memory still goes through."""
    monkeypatch.setenv(tasks.TRACE_ENV, "1")
    peaks = []
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        c.run(tasks.warm_up)  # imports and first calls allocate too: warm up before measuring
        prep(c, "rnnlm-tiny", generate(tmp_path / "warm", "rnnlm", 300, seed=5), tmp_path / "warm-out")
        for lines in (6_000, 12_000):
            inputs = generate(tmp_path / f"c{lines}", "rnnlm", lines, words=3000, seed=4)
            _, records = prep(c, "rnnlm-tiny", inputs, tmp_path / f"s{lines}", shard_size=200, block_mb=1 / 32)
            by_phase: dict[str, float] = {}
            for r in records:
                if r["kind"] == "task":
                    by_phase[r["phase"]] = max(by_phase.get(r["phase"], 0.0), r["alloc_peak_mb"])
            peaks.append(by_phase)
    print(f"peak allocations of a task (MB) per phase, corpus and corpus x 2: {peaks}")
    # the work per task; other threads of the worker (Dask's heartbeats, its event loop) add up to ~0.25 MB noise
    # under load (a full-suite run measured scan 0.58 -> 0.82 MB), where a task holding the corpus would double
    for phase in ("scan", "merge", "encode"):
        assert peaks[1][phase] < 1.25 * peaks[0][phase] + 0.3, (phase, peaks)
    assert max(peaks[1].values()) < 1.0


def test_data_errors_name_the_file_as_data_text_does(client, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("pos\tgood film\nno tab here\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: expected LABEL<TAB>text"):
        prep(client, "sentiment-tiny", {"train": [str(bad)]}, tmp_path / "o1")
    src, tgt = tmp_path / "a.src", tmp_path / "a.tgt"
    src.write_text("a b\nc d\n")
    tgt.write_text("x\n")
    with pytest.raises(DataError, match="parallel files differ in length"):
        prep(client, "nmt-tiny", {"train_src": [str(src)], "train_tgt": [str(tgt)]}, tmp_path / "o2")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match=r"data file is empty: .*empty.txt \(--train\)"):
        prep(client, "rnnlm-tiny", {"train": [str(tmp_path / "empty.txt")]}, tmp_path / "o5")
    with pytest.raises(DataError, match="matches no file"):
        prep(client, "rnnlm-tiny", {"train": [str(tmp_path / "nothing*.txt")]}, tmp_path / "o3")
    done = generate(tmp_path / "c", "rnnlm", 300)
    (tmp_path / "o4").mkdir()
    (tmp_path / "o4" / ".scalelab-prep").write_text("{}")  # an unfinished prep's marker: its leftovers are its own
    (tmp_path / "o4" / "train-00007.arrow").write_text("left by an unfinished prep")
    prep(client, "rnnlm-tiny", done, tmp_path / "o4")
    assert not (tmp_path / "o4" / "train-00007.arrow").exists() and not (tmp_path / "o4" / "_held").exists()
    with pytest.raises(DataError, match="already holds shards"):
        prep(client, "rnnlm-tiny", done, tmp_path / "o4")


@pytest.mark.slow
def test_a_worker_side_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """The bad line lies past what `launch prep` checks before it starts (`core.datafiles.LABEL_LIMIT`): a worker
    finds it."""
    from scalelab.core.datafiles import LABEL_LIMIT

    bad = tmp_path / "bad.tsv"
    good = "pos\tgood film\n"
    bad.write_text(good * (LABEL_LIMIT // len(good) + 1) + "no tab here\n")
    line = LABEL_LIMIT // len(good) + 2
    done = launch("prep", "--model", "sentiment-tiny", "--train", str(bad), "--out", str(tmp_path / "o"),
                  "--workers", "1", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and f"{bad}:{line}: expected LABEL<TAB>text" in done.stderr
    listed = json.loads(invoke(["ls", "--runs-dir", str(tmp_path / "runs"), "--format", "json"]).output)
    assert [(r["kind"], r["state"], r["layout"]) for r in listed] == [("prep", "FAILED", "1 worker")]


def test_the_trainer_refuses_shards_cut_for_another_model(client, tmp_path: Path) -> None:
    prep(client, "rnnlm-tiny", generate(tmp_path / "c", "rnnlm", 600), tmp_path / "s")
    other = config_with_overrides(PRESETS["rnnlm-tiny"], {"seq_len": 12, **ARGS})
    with pytest.raises(DataError, match="seq_len 16 .shards. vs 12 .model."):
        build_dataset("shards", other, 0, directory=str(tmp_path / "s"))
    with pytest.raises(DataError, match="fewer than the 64 ranks"):
        build_dataset("shards", config_with_overrides(PRESETS["rnnlm-tiny"], ARGS), 0, directory=str(tmp_path / "s"),
                      rank=0, world=64)


def test_each_rank_reads_its_own_shards(client, tmp_path: Path) -> None:
    manifest, _ = prep(client, "sentiment-tiny", generate(tmp_path / "c", "sentiment", 900), tmp_path / "s")
    cfg = config_with_overrides(PRESETS["sentiment-tiny"], ARGS)
    ranks = [build_dataset("shards", cfg, 3, directory=str(tmp_path / "s"), rank=r, world=3) for r in range(3)]
    shards = manifest["splits"]["train"]["shards"]
    assert [len(d.train) for d in ranks] == [sum(s["samples"] for s in shards[r::3]) for r in range(3)]
    assert len({d.steps_per_epoch(24) for d in ranks}) == 1  # every rank runs the same steps
    batches = [d.get_batch(0, 1, 24, 8 * r, 8 * (r + 1)) for r, d in enumerate(ranks)]
    assert [b.samples for b in batches] == [8, 8, 8]
    grown = ranks[0].get_batch(0, 1, 24, 0, 12)  # --balance dynamic gave rank 0 a larger share
    assert grown.samples == 12 and torch.equal(grown.meta["indices"][:8], batches[0].meta["indices"])


# ---- the command, records and report -----------------------------------------------------------


@pytest.mark.slow
def test_launch_prep_sweep_records_report_and_training_on_the_shards(tmp_path: Path, capsys) -> None:
    """A strong sweep over 1 and 2 worker processes: records per task, the scaling table, and a
    2-rank training run on the shards (each rank its own)."""
    inputs = generate(tmp_path / "c", "rnnlm", 20_000, words=2000, seed=6)
    runs = tmp_path / "runs"
    done = launch("prep", "--model", "rnnlm-tiny", "--train", inputs["train"][0], "--out", str(tmp_path / "shards"),
                  "--workers", "1,2", "--shard-size", "2000", "--block-mb", "0.25", "--runs-dir", str(runs),
                  cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with capsys.disabled():  # the scaling table of prep itself, shown in the CI log
        print("\n" + done.stdout)
    sweep = only_run_dir(runs)
    assert "Prep scaling" in done.stdout and "lines/s/worker" in done.stdout
    rows = json.loads((sweep / "report.json").read_text())
    assert_table_from_records(rows, [sweep / "1w", sweep / "2w"], "strong", lines=[20_000, 20_000])
    assert all(r["peak_rss_mb"] > 0 for r in rows)
    records = read_jsonl(sweep / "2w" / "records" / "prep.jsonl")
    scans = [r for r in records if r["kind"] == "task" and r["phase"] == "scan"]
    assert sum(r["lines"] for r in scans) == 20_000 and {r["worker"] for r in scans} == {"0", "1"}
    assert all(r["seconds"] >= 0 and r["bytes"] > 0 and r["pid"] for r in scans)
    assert_work_split(records, workers=2)
    assert {r["phase"] for r in records if r["kind"] == "phase"} >= {"index", "scan", "encode", "regroup", "manifest"}
    assert (tmp_path / "shards" / "1w" / "manifest.json").read_bytes() == (tmp_path / "shards" / "2w" / "manifest.json").read_bytes()

    listed = json.loads(invoke(["ls", "--runs-dir", str(runs), "--format", "json"]).output)  # beside training runs
    assert [(r["kind"], r["state"], r["layout"]) for r in listed] == [("prep", "COMPLETED", "1,2 workers")]
    assert [r["words_per_s"] for r in listed[0]["layouts"]] == pytest.approx([r["lines_per_s"] for r in rows])
    again = invoke(["report", str(sweep / "1w"), "--format", "json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)[0]["workers"] == 1

    trained = launch("--model", "rnnlm-tiny", "--data", "shards", "--shards", str(tmp_path / "shards" / "2w"),
                     "--gpus-per-node", "2", "--steps", "3", "--warmup-steps", "1", "--threads", "1",
                     "--runs-dir", str(tmp_path / "train"), cwd=tmp_path, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    steps = [r for p in sorted((only_run_dir(tmp_path / "train") / "records").glob("rank-*.jsonl"))
             for r in read_jsonl(p) if r["kind"] == "step"]
    assert len(steps) == 6 and all(r["samples"] == 8 for r in steps)


def assert_work_split(records: list[dict], workers: int) -> None:
    """The reading and writing tasks (index, scan, encode) were shared: every worker ran at least half
    its equal share (1/W) of them and read at least half its share of their lines. Counts, not times:
    on a loaded machine a worker may be slower, but not starved, and none may be left out."""
    work = [r for r in records if r["kind"] == "task" and r["phase"] in ("index", "scan", "encode")]
    assert len(work) >= 4 * workers, f"too few tasks ({len(work)}) to show a split"
    for measure in ("tasks", "lines"):
        share = {str(w): 0 for w in range(workers)}
        for r in work:
            share[r["worker"]] += 1 if measure == "tasks" else r.get("lines", 0)
        total = sum(share.values())
        assert len(share) == workers and min(share.values()) >= total / workers / 2, (measure, share)


def assert_table_from_records(rows: list[dict], runs: list[Path], mode: str, lines: list[int]) -> None:
    """The report's rows, one per run in order, recomputed from each run's records: lines of the scan
    tasks, wall time from the first phase's start to the manifest, speedup and efficiency against the
    fewest workers (the trainer's definitions: efficiency = speedup / (workers / base workers))."""
    assert [r["workers"] for r in rows] == [int(p.name.rstrip("w")) for p in runs]
    assert [r["mode"] for r in rows] == [mode] * len(runs) and [r["lines"] for r in rows] == lines
    speed = []
    for row, run in zip(rows, runs):
        records = read_jsonl(run / "records" / "prep.jsonl")
        phases = [r for r in records if r["kind"] == "phase"]
        wall = max(p["end"] for p in phases) - min(p["start"] for p in phases)
        scanned = sum(r["lines"] for r in records if r["kind"] == "task" and r["phase"] == "scan")
        assert scanned == row["lines"] and row["wall_s"] == pytest.approx(wall)
        speed.append(scanned / wall)
        assert row["lines_per_s"] == pytest.approx(speed[-1])
        assert row["lines_per_s_per_worker"] == pytest.approx(speed[-1] / row["workers"])
        assert row["speedup"] == pytest.approx(speed[-1] / speed[0])
        assert row["efficiency"] == pytest.approx(speed[-1] / speed[0] / (row["workers"] / rows[0]["workers"]))


@pytest.mark.slow
def test_weak_mode_grows_the_corpus_with_the_workers(tmp_path: Path) -> None:
    """A weak sweep (run directories as `launch prep --mode weak` writes them): run N preps the first
    N x 700 lines, each on its own cluster of N workers, and the report's table is computed from the
    records."""
    from scalelab.prep.records import Recorder
    from scalelab.prep.report import report_dirs

    inputs = generate(tmp_path / "c", "rnnlm", 2000)
    sweep = tmp_path / "sweep"
    (sweep / "1w").mkdir(parents=True)
    (sweep / "2w").mkdir()
    (sweep / "prep.json").write_text(json.dumps({"sweep": ["1w", "2w"], "mode": "weak"}))
    for workers in (1, 2):
        run = sweep / f"{workers}w"
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
                Client(cluster) as c:
            request = PrepRequest(model="rnnlm-tiny", inputs=inputs, out=str(tmp_path / f"w{workers}"), model_args=ARGS,
                                  workers=workers, shard_size=97, block_mb=1 / 1024, mode="weak",
                                  lines_limit=700 * workers).validate()
            (run / "prep.json").write_text(json.dumps(request.to_dict()))
            recorder = Recorder(run)
            Prep(c, request, recorder).run()
            recorder.close()
        records = read_jsonl(run / "records" / "prep.jsonl")
        assert sum(r["lines"] for r in records if r["kind"] == "task" and r["phase"] == "scan") == 700 * workers
        assert {r["worker"] for r in records if r["kind"] == "task"} == {str(w) for w in range(workers)}
    report_dirs([sweep], None, "json")
    rows = json.loads((sweep / "report.json").read_text())
    assert_table_from_records(rows, [sweep / "1w", sweep / "2w"], "weak", lines=[700, 1400])


def invoke(argv: list[str]):
    """`launch ARGV` in this process through click (exceptions kept, not printed)."""
    from click.testing import CliRunner

    from scalelab.launcher.cli import main

    return CliRunner().invoke(main, argv)


@pytest.mark.parametrize("extra,message", [
    (["--backend", "aws"], "writes shards to S3"),
    (["--backend", "k8s"], "needs --backend-opt image"),
    (["--backend-opt", "colour=red"], "unknown local prep backend option.*valid options: memory_limit"),
    (["--mode", "weak"], "give --lines-per-worker"),
    (["--workers", "1,x"], "--workers takes"),
    (["--train-src", "c.txt"], "--train-src do.es. not apply to rnnlm"),
    (["--model-arg", "seq_len=0"], "seq_len must be a positive integer"),
])
def test_cli_refuses_what_it_cannot_run(extra: list[str], message: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(["prep", "--model", "rnnlm-tiny", "--train", "c.txt", "--out", "o", *extra, "--dry-run"])
    assert isinstance(result.exception, SpecError), (result.exception, result.output)
    assert re.search(message, str(result.exception)), str(result.exception)
    assert not any(tmp_path.iterdir()), "a refused prep leaves nothing behind"


def test_data_shards_colon_dir_is_data_shards_with_shards_dir(tmp_path: Path) -> None:
    """`--data shards:DIR` (the issue's spelling) builds the spec `--data shards --shards DIR` does."""
    from scalelab.launcher.cli import build_spec, run_cmd

    (tmp_path / "manifest.json").write_text("{}")

    def spec(*argv: str):
        with run_cmd.make_context("run", ["--model", "rnnlm-tiny", "--steps", "8", *argv]) as ctx:
            return build_spec(ctx.params)

    short = spec("--data", f"shards:{tmp_path}")
    assert short == spec("--data", "shards", "--shards", str(tmp_path))
    assert (short.data.kind, short.data.shards) == ("shards", str(tmp_path))
    assert spec("--data", f"shards:{tmp_path}", "--shards", str(tmp_path)).data == short.data  # the same twice: fine
    assert spec("--data", "shards:s3://corpora/shards").data.shards == "s3://corpora/shards"


@pytest.mark.parametrize("argv,message", [
    (["--data", "shards:"], "--data shards:DIR needs the directory launch prep wrote after the colon"),
    (["--data", "text:corpus.txt"], "'text:corpus.txt' is not one of synthetic, task, text, shards, or shards:DIR"),
    (["--data", "shard:x"], "'shard:x' is not one of"),
    (["--data", "shards:a", "--shards", "b"], "--data shards:a and --shards b name two shards directories"),
    (["--data", "shards:absent"], "--shards absent holds no manifest.json: run launch prep --out absent first"),
])
def test_a_bad_data_shards_flag_is_one_clear_error(argv: list[str], message: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(["run", "--model", "rnnlm-tiny", "--steps", "8", "--runs-dir", str(tmp_path / "runs"), *argv,
                     "--dry-run"])
    # click's usage errors exit 2 here; a SpecError is raised to `launch`'s entry, which prints it and exits 2
    assert result.exit_code == 2 or isinstance(result.exception, SpecError), (result.exception, result.output)
    assert not (tmp_path / "runs").exists()
    text = result.output if isinstance(result.exception, SystemExit) else str(result.exception)
    assert message in " ".join(text.split()), text


def test_data_shards_needs_a_shards_directory(tmp_path: Path) -> None:
    from scalelab.core.spec import Spec

    with pytest.raises(SpecError, match="--data shards reads --shards DIR"):
        from scalelab.core.spec import Spec

        Spec.from_dict({"data": {"kind": "shards"}}).validate()
    with pytest.raises(SpecError, match="holds no manifest.json: run launch prep"):
        Spec.from_dict({"data": {"kind": "shards", "shards": str(tmp_path)}}).validate()


# ---- backends: Kubernetes manifests, Slurm job script, S3 -------------------------------------


@pytest.mark.slow
def test_k8s_dry_run_renders_a_valid_daskcluster_without_torch(tmp_path: Path) -> None:
    import yaml

    code = (
        "import sys\nfrom scalelab.launcher.cli import entry\n"
        "sys.argv = ['launch', 'prep', '--model', 'nmt-tiny', '--train-src', '/scalelab/runs/c/train.src',\n"
        "            '--train-tgt', '/scalelab/runs/c/train.tgt', '--out', '/scalelab/runs/shards', '--workers', '3',\n"
        "            '--backend', 'k8s', '--backend-opt', 'image=example.org/scalelab:1', '--dry-run']\n"
        "try:\n    entry()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'horovod') if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stderr
    doc = yaml.safe_load(done.stdout)
    assert doc["kind"] == "DaskCluster" and doc["spec"]["worker"]["replicas"] == 3
    validate_daskcluster(doc)
    mount = doc["spec"]["worker"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount["mountPath"] == "/scalelab/runs"


def validate_daskcluster(doc: dict) -> None:
    """Against the DaskCluster CRD shipped with dask-kubernetes (strict: unknown fields are errors,
    as scalelab/k8s/validate.py treats the MPIJob CRD), and the pod templates and Service against the core
    Kubernetes schemas."""
    import jsonschema
    import yaml
    from dask_kubernetes import operator as dk

    from scalelab.k8s.validate import _strict, validate_doc

    crds = Path(dk.__file__).parent / "deployment" / "helm" / "dask-kubernetes-operator" / "crds"
    crd = yaml.safe_load((crds / "daskcluster.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # every object has these; a CRD's schema leaves them out and the API server checks them itself
    schema["properties"].update(apiVersion={"const": "kubernetes.dask.org/v1"}, kind={"const": "DaskCluster"},
                                metadata={"type": "object"})
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(doc))
    assert not errors, errors[0].message
    for role in ("scheduler", "worker"):
        validate_doc({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"prep-{role}"},
                      "template": {"spec": doc["spec"][role]["spec"]}})
    validate_doc({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "prep-scheduler"},
                  "spec": doc["spec"]["scheduler"]["service"]})


def test_k8s_refuses_paths_the_workers_cannot_see(tmp_path: Path) -> None:
    done = launch("prep", "--model", "rnnlm-tiny", "--train", "/home/me/corpus.txt", "--out", "/scalelab/runs/s",
                  "--backend", "k8s", "--backend-opt", "image=x", "--dry-run", cwd=tmp_path)
    assert done.returncode == 2 and "/home/me/corpus.txt is neither" in done.stderr


def test_slurm_dry_run_prints_the_dask_jobqueue_job_script(tmp_path: Path) -> None:
    done = launch("prep", "--model", "rnnlm-tiny", "--train", "c.txt", "--out", "s", "--backend", "slurm",
                  "--backend-opt", "partition=debug", "--backend-opt", "cpus_per_worker=4", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert script.startswith("#!/usr/bin/env bash") and "#SBATCH -p debug" in script
    assert "#SBATCH --cpus-per-task=4" in script and "distributed.cli.dask_worker tcp://SCHEDULER:8786" in script
    assert not (tmp_path / "runs").exists(), "a dry run writes nothing"


@pytest.mark.slow
def test_prep_to_s3_and_train_from_it(client, tmp_path: Path, moto_url: str, monkeypatch) -> None:
    """On moto's S3: inputs read from and shards written to a bucket; the trainer copies its shards
    into the cache and reads the same samples as from a local copy."""
    import boto3

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_url,
                       "SCALELAB_SHARD_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", endpoint_url=moto_url)
    s3.create_bucket(Bucket="corpora")
    local = generate(tmp_path / "c", "sentiment", 800)
    s3.upload_file(local["train"][0], "corpora", "reviews/train.txt")
    opts = {"endpoint_url": moto_url, "region_name": "us-east-1"}
    manifest, _ = prep(client, "sentiment-tiny", {"train": ["s3://corpora/reviews/*.txt"]}, "s3://corpora/shards",
                       backend="aws", backend_options=opts)
    names = {o["Key"] for o in s3.list_objects_v2(Bucket="corpora", Prefix="shards/")["Contents"]}
    assert "shards/manifest.json" in names and not any("_held" in n for n in names)
    assert manifest["sources"]["train"] == ["s3://corpora/reviews/train.txt"]
    cfg = config_with_overrides(PRESETS["sentiment-tiny"], ARGS)
    remote = build_dataset("shards", cfg, 1, directory="s3://corpora/shards")
    prep(client, "sentiment-tiny", local, tmp_path / "local")
    here = build_dataset("shards", cfg, 1, directory=str(tmp_path / "local"))
    every = torch.arange(len(here.train))
    assert_same(remote.train.batch(every), here.train.batch(every))
