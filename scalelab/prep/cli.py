"""`launch prep`: tokenise a corpus once, on a Dask cluster, into shards the trainer memory-maps.

    launch prep --model nmt-small --train-src 'wmt/train.*.en' --train-tgt 'wmt/train.*.de' --out shards/wmt
    launch prep --model rnnlm-small --train corpus.txt --out shards/lm --workers 4
    launch prep --model rnnlm-small --train corpus.txt --out shards/lm --workers 1,2,4       (a strong sweep)
    launch prep ... --workers 1,2 --mode weak --lines-per-worker 100000                    (a weak sweep)
    launch --model nmt-small --data shards --shards shards/wmt ...                           (train on them)

Loaded lazily by `launch` (LAZY_COMMANDS); Dask and pyarrow are imported only when a prep runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from scalelab.core.checks import Number, OutputDir
from scalelab.core.errors import SpecError, shell_word
from scalelab.core.rundir import dryrun_dir, new_run_dir, write_json
from scalelab.core.flags import shared_flags, spec_from_flags
from scalelab.core.spec import BATCH_MODES, check_text_file
from scalelab.core.writes import check_writable
from scalelab.launcher.cli import console, parse_pairs
from scalelab.launcher.runner import err_console, stop_signals_interrupt
from scalelab.prep.request import PREP_FILE, PrepRequest

INPUTS = ("train", "valid", "train_src", "train_tgt", "valid_src", "valid_tgt")


def _inputs(func):
    helps = {"train": "Training text: plain text (rnnlm) or LABEL<TAB>text lines (sentiment).",
             "valid": "Validation text [default: held out from the training text, as --data text does].",
             "train_src": "Translation: source side, one sentence a line.",
             "train_tgt": "Translation: target side, line i translating line i of --train-src.",
             "valid_src": "Translation: validation source.", "valid_tgt": "Translation: validation target."}
    for key in reversed(INPUTS):
        func = click.option("--" + key.replace("_", "-"), key, multiple=True, metavar="FILE",
                            help=helps[key] + " Files, globs or s3:// URLs; repeatable.")(func)
    return func


@click.command("prep")
@shared_flags("--model", "--model-arg")  # declared, and defaulted, as `launch run`'s (scalelab/core/flags.py)
@_inputs
@click.option("--out", required=True, type=OutputDir("--out", remote_ok=True), help="Shards directory (local path or s3://BUCKET/PREFIX); must not hold shards yet.")
@click.option("--workers", default="2", show_default=True, help="Dask workers; a list (1,2,4) runs a sweep.")
@click.option("--mode", type=click.Choice(BATCH_MODES), default="strong", show_default=True,
              help="Sweep: strong = the same corpus on more workers; weak = --lines-per-worker x workers lines.")
@click.option("--lines-per-worker", type=Number(minimum=1, integer=True, why="each worker preps at least one line"),
              help="Weak scaling: prep only the first N x workers training lines.")
@shared_flags("--backend", "--backend-opt")
@click.option("--scheduler", help="Use this running Dask scheduler (tcp://HOST:8786) instead of starting a cluster.")
@click.option("--shard-size", type=int, default=50_000, show_default=True, help="Samples per shard.")
@click.option("--block-mb", type=float, default=16.0, show_default=True, help="Bytes of text per read task, in MiB.")
@click.option("--valid-fraction", type=float, default=0.05, show_default=True, help="Held out without validation files.")
@shared_flags("--name", "--runs-dir", "--dry-run")
def prep_cmd(**params: Any) -> None:
    """Normalise, tokenise and shard a corpus on Dask; records and a scaling table like training's.

    The vocabulary, truncation and hold-out follow `--data text` exactly, so training with
    `--data shards --shards OUT` sees the same token ids without tokenising at start-up.
    """
    requests = build_requests(params)
    runs = Path(params["runs_dir"])
    if requests[0].backend == "local" or not params["dry_run"]:  # a local dry run too: it said nothing of a
        check_local_inputs(requests[0])  # missing --train (a cluster's dry run names paths as its nodes see them)
    if params["dry_run"]:
        from scalelab.prep.clusters import render

        for request in requests:
            click.echo(render(request, dryrun_dir(runs, request.name or "prep")))
        return
    if "://" not in params["out"]:  # a read-only or forbidden --out fails now, not after the cluster started
        check_writable(params["out"], "the shards directory", "or give --out a writable directory")
    check_local_out(requests)
    with stop_signals_interrupt():
        _prep(requests, runs)


def _prep(requests: list[PrepRequest], runs: Path) -> None:
    """One prep run, or a sweep of them, each then reported."""
    from scalelab.prep.report import report_dirs

    if len(requests) == 1:
        report_dirs([run_one(requests[0], new_run_dir(runs, _name(requests[0])))], None, "table")
        return
    sweep = new_run_dir(runs, f"{_name(requests[0])}-sweep-{requests[0].mode}")
    names = [f"{r.workers}w" for r in requests]
    write_json(sweep / PREP_FILE, {"sweep": names, "mode": requests[0].mode})
    for request, name in zip(requests, names):
        (sweep / name).mkdir()
        run_one(request, sweep / name)
    report_dirs([sweep], None, "table")


def build_requests(params: dict[str, Any]) -> list[PrepRequest]:
    """One validated request per worker count; a sweep writes each run's shards to OUT/<N>w."""
    spec = spec_from_flags(params)  # --model, --backend, --name typed and checked as `launch run` does, its defaults
    counts = _counts(params["workers"])
    if params["mode"] == "weak" and not params["lines_per_worker"]:
        raise SpecError("--mode weak grows the corpus with the workers: give --lines-per-worker N")
    if params["lines_per_worker"] and params["mode"] != "weak":
        raise SpecError("--lines-per-worker is for --mode weak (strong scaling preps the whole corpus)")
    out = []
    for n in counts:
        request = PrepRequest(
            model=spec.model, model_args=parse_pairs(params["model_args"], "--model-arg"),
            inputs={k: list(params[k]) for k in INPUTS if params[k]},
            out=params["out"] if len(counts) == 1 else params["out"].rstrip("/") + f"/{n}w",
            workers=n, backend=spec.backend, backend_options=parse_pairs(params["backend_opts"], "--backend-opt"),
            shard_size=params["shard_size"], block_mb=params["block_mb"], valid_fraction=params["valid_fraction"],
            lines_limit=params["lines_per_worker"] * n if params["lines_per_worker"] else None, mode=params["mode"],
            scheduler=params["scheduler"], name=spec.name,
        )
        out.append(request.validate())
    from scalelab.prep.clusters import resolve_options

    resolve_options(out[0])  # unknown or missing backend options fail before anything starts
    return out


def check_local_inputs(request: PrepRequest) -> None:
    """Every local input file or glob names a non-empty text file, checked before the run directory is made: a
    missing, empty or binary --train was found by a task, after the cluster started, and left a run directory
    (and an empty --out) behind. So is their content where it is cheap to see (`core.datafiles`): parallel files
    of different lengths (file i of --train-src against file i of --train-tgt, as the index task pairs them) and
    sentiment lines without LABEL<TAB>, which left a FAILED prep and --out's marker. Remote URLs are checked by
    the cluster (listing a bucket here would cost a round trip per pattern)."""
    from scalelab.core.datafiles import check_labelled, check_parallel
    from scalelab.prep.corpus import expand, flag, is_remote

    local_files: dict[str, list[str]] = {}
    for key, patterns in request.inputs.items():
        local = [p for p in patterns if not is_remote(p)]
        found = expand(local, key, request.storage) if local else []  # globbed and stat-ed once
        for path, size in found:
            if size == 0:
                raise SpecError(f"data file is empty: {path} ({flag(key)}); give a file with text in it")
            check_text_file(path, flag(key))
        if local and len(local) == len(patterns):  # all local: the files the prep reads, in its order
            local_files[key] = [path for path, _ in found]
    family = request.config.family
    if family == "nmt":
        for src, tgt in (("train_src", "train_tgt"), ("valid_src", "valid_tgt")):
            if src in local_files and tgt in local_files and len(local_files[src]) == len(local_files[tgt]):
                for a, b in zip(local_files[src], local_files[tgt]):
                    check_parallel(a, b, flag(src), flag(tgt))
    elif family == "sentiment":
        for key in ("train", "valid"):
            for path in local_files.get(key, []):
                check_labelled(path, flag(key))


def check_local_out(requests: list[PrepRequest]) -> None:
    """A local --out that holds shards or someone else's files is refused before the cluster starts
    (the prepare task checks again, on the workers' side, for every --out)."""
    from scalelab.prep.corpus import is_remote
    from scalelab.prep.tasks import check_out

    for request in requests:
        if not is_remote(request.out):
            check_out(request.storage, request.out)


def _counts(text: str) -> list[int]:
    items = [s.strip() for s in str(text).split(",")]
    if not all(s.isdigit() and int(s) > 0 for s in items) or len(set(items)) != len(items):
        raise SpecError(f"--workers takes a positive whole number or a list of distinct ones (1,2,4), got {text!r}")
    return [int(s) for s in items]


def _name(request: PrepRequest) -> str:
    return request.name or f"prep-{request.model}"


def run_one(request: PrepRequest, run_dir: Path) -> Path:
    """Start the cluster, prep, write the records and summary; return the run directory."""
    import scalelab.train.text  # noqa: F401 - the driver's vocabulary rules (and PyTorch): loaded before the clock runs
    from scalelab.prep.clusters import connect
    from scalelab.prep.pipeline import Prep
    from scalelab.prep.records import Recorder
    from scalelab.prep.report import summarize
    from scalelab.prep.tasks import warm_up, where

    write_json(run_dir / PREP_FILE, request.to_dict())
    recorder = Recorder(run_dir, echo=_progress)
    started = time.time()
    try:
        with connect(request, run_dir) as client:
            client.run(warm_up)
            recorder({"kind": "cluster", "startup_s": time.time() - started, "backend": request.backend,
                      "workers": len(client.scheduler_info()["workers"])})
            for info in client.run(where).values():
                recorder({"kind": "worker", **info})
            Prep(client, request, recorder, run_dir.name).run()
    except (Exception, KeyboardInterrupt) as exc:
        record_failure(recorder, request, run_dir, exc)
        raise
    finally:
        recorder.close()
    write_json(run_dir / "summary.json", summarize(run_dir))
    console.print(f"shards: [bold]{request.describe_out()}[/]  run directory: {run_dir}  (launch report {shell_word(run_dir)})")
    return run_dir


def record_failure(recorder: Any, request: PrepRequest, run_dir: Path, exc: BaseException) -> None:
    """Why the prep stopped, as an `error` record (`launch report` says it), and the scratch folder
    `_held/` of --out removed when this run's marker says the folder is this prep's (best effort)."""
    from scalelab.prep.tasks import remove_scratch

    stopped = isinstance(exc, KeyboardInterrupt)
    message = "interrupted (a stop signal)" if stopped else (str(exc).strip() or type(exc).__name__)
    try:
        recorder({"kind": "failure", "error": "interrupted" if stopped else type(exc).__name__,
                  "message": message, "time": time.time()})
    except Exception:  # noqa: BLE001 - the error being raised matters more than its record
        pass
    try:
        remove_scratch(request.storage, request.out, run_dir.name)
    except Exception:  # noqa: BLE001 - an unreachable --out: the next prep into it cleans it
        pass


def _progress(record: dict[str, Any]) -> None:
    if record["kind"] == "phase":
        err_console.print(f"prep {record['phase']}: {record['tasks']} task(s), {record['seconds']:.2f} s", highlight=False)
