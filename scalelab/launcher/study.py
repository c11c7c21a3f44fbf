"""Studies: the seeds' experiments as recipes, runnable on any backend, ending in the seed's tables.

A study file (YAML, see examples/) is a base spec, a list of variants (a label + spec overrides), the
layouts to sweep, the scaling mode, and which seed-shaped tables to produce. Named `scales` shrink or
grow it: `--scale test` is what the tests run on a CPU in seconds, `--scale seed` is the seed's own
size (for GPUs). `launch study FILE --backend slurm` runs the same study on Slurm.

    launch study examples/seed001-nmt-data-parallel.yaml --scale cpu

Every variant is a sweep (one run per layout) under one study directory. This module loads and
checks the recipe, decides which sweeps run, and writes the files; the tables and figures are
analysis.studies (from the runs' records, like every other report), the dollars costs.studies.
"""

from __future__ import annotations

import copy
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import click

from scalelab.core.checks import InputFile
from scalelab.core.errors import ScalelabError, SpecError, shell_word
from scalelab.core.flags import shared_flags
from scalelab.core.records import load_run
from scalelab.core.rundir import (GEMM_FILE, STUDY_FILE, STUDY_SOURCE, RunPaths, dryrun_dir, new_run_dir, read_json,
                                  study_sweeps, sweep_runs, write_json)
from scalelab.core.spec import BACKEND_NAMES, MODE_AXES, Spec, read_yaml_mapping
from scalelab.core.writes import refuse_links
from scalelab.launcher.backend import get_backend
from scalelab.launcher.cli import console
from scalelab.launcher.runner import err_console
from scalelab.launcher.pricing import guard, price_options, show_quote
from scalelab.launcher.studyfile import check_study_file
from scalelab.launcher.runner import owning
from scalelab.launcher.sweep import (checked_resume, continue_sweep, make_sweep, parse_layouts, preflight_sweep,
                                     removed_on_failure, sweep_backend, sweep_specs, unfinished_layouts)


@dataclass
class Variant:
    label: str
    overrides: dict[str, Any]
    layouts: list[tuple[int, int]] | None = None  # None: the study's layouts
    instances: dict[str, str] = field(default_factory=dict)  # layout -> instance mix, for the money table


@dataclass
class Study:
    title: str
    seed_scale: str
    base: dict[str, Any]
    mode: str
    layouts: list[tuple[int, int]]
    variants: list[Variant]
    tables: list[str]
    instances: dict[str, str] = field(default_factory=dict)  # layout "NxG" -> "2*g3.4xlarge" (money table)
    market: str = "on-demand"
    epochs_shown: int = 3
    kind: str = "scaling"  # scaling: sweeps of training runs; gemm: seed 003's single-process measurements
    gemm: dict[str, Any] = field(default_factory=dict)
    scale: str | None = None  # the named scale it was loaded at (`--scale`); None: the file's base
    source: Path | None = None  # the file it was loaded from, copied into its directory (`launch resume STUDY`)
    overrides: dict[str, Any] = field(default_factory=dict)  # the command line's spec overrides (--backend)

    def instance_mixes(self) -> dict[tuple[str, str], str | None]:
        """(variant label, layout "NxG") -> the instance mix it runs on (the variant's, else the
        study's), for the money table."""
        return {(v.label, f"{n}x{g}"): v.instances.get(f"{n}x{g}") or self.instances.get(f"{n}x{g}")
                for v in self.variants for n, g in (v.layouts or self.layouts)}


def load_study(path: Path, scale: str | None = None, overrides: dict[str, Any] | None = None) -> Study:
    """Read a study file, apply a named scale and command-line spec overrides, validate it all."""
    from scalelab.analysis.studies import TABLES

    raw = read_yaml_mapping(path, "study file")
    check_study_file(raw, path)  # every part's kind, every scale's and variant's keys, before any is used
    scales = raw.get("scales", {})
    if scale is not None:
        if scale not in scales:
            raise SpecError(f"{path} has no scale {scale!r}; its scales: {', '.join(scales) or 'none'}")
        patch = scales[scale]
        raw = {**raw, **{k: v for k, v in patch.items() if k != "base"},
               "base": {**raw.get("base", {}), **patch.get("base", {})}}
    base = _deep_merge(raw.get("base", {}), overrides or {})
    variants = _variants(raw, path)
    mode = raw.get("mode", "strong")
    if mode not in MODE_AXES:  # 'medium' was a KeyError traceback when the sweeps were made
        raise SpecError(f"mode {mode!r} in {path} is not a scaling mode: use one of {', '.join(MODE_AXES)}")
    tables = raw.get("tables", ["throughput"])
    for t in tables:
        if t not in TABLES:
            raise SpecError(f"unknown table {t!r} in {path}; valid: {', '.join(TABLES)}")
    layouts = parse_layouts(None, ",".join(raw.get("layouts", ["1x1", "1x2"])))
    study = Study(
        title=raw.get("title", path.stem), seed_scale=raw.get("seed_scale", ""), base=base,
        mode=mode, layouts=layouts, variants=variants, tables=tables,
        instances=raw.get("instances", {}), market=raw.get("market", "on-demand"),
        epochs_shown=int(raw.get("epochs_shown", 3)),
    )
    study.kind, study.gemm, study.scale = raw.get("kind", "scaling"), raw.get("gemm", {}), scale
    study.source, study.overrides = path, dict(overrides or {})
    if study.kind == "gemm":
        _check_gemm(study.gemm, path)
        return study
    if study.kind != "scaling":
        raise SpecError(f"unknown study kind {study.kind!r} in {path}; valid: scaling, gemm")
    if study.gemm:  # read by a GEMM study alone: in a scaling study it was ignored without a word
        raise SpecError(f"{path} sets gemm options, which only a study of kind: gemm reads; remove them, or set kind: gemm")
    for v in study.variants:  # every variant x layout is checked before anything runs
        variant_specs(study, v)
    _refuse_unread_base(study, path)
    return study


def _refuse_unread_base(study: Study, path: Path) -> None:
    """A base setting that no variant reads (`fusion_threshold_mb` in a study whose variants are all DDP) is
    refused as the same flag is in one run; one that some variants read is theirs (`_variant_spec` drops it
    from the others)."""
    unread = [{u.key: u for u in _variant_spec(study, v)[1]} for v in study.variants]
    for key, first in unread[0].items():
        if all(key in each for each in unread[1:]):
            raise SpecError(f"the base of {path} sets {first.given}, which none of its variants reads: it is for "
                            f"{first.needs} ({first.words}); set it in the variants with {first.needs}, or leave "
                            "it out")


def _variants(raw: dict[str, Any], path: Path) -> list[Variant]:
    """The study's variants (the base alone when the key is left out), refused when two share a label: that was
    accepted without a word, and its tables merged two variants' rows under one name. Each variant's shape (a
    non-empty list of mappings with a label, their keys) is `check_study_file`'s, checked before this is read."""
    given = raw.get("variants", [{"label": "base"}])
    variants, seen = [], set()
    for v in given:
        label = str(v["label"])
        if label in seen:
            raise SpecError(f"two variants in {path} have the label {label!r}: give each variant its own label")
        seen.add(label)
        layouts = parse_layouts(None, ",".join(v["layouts"])) if v.get("layouts") else None
        variants.append(Variant(label, v.get("set", {}), layouts, v.get("instances", {})))
    return variants


GEMM_KEYS = {"hiddens": [256, 512], "batches": [1, 8, 16, 32, 64], "preset": "rnnlm-small", "step_hiddens": [256],
             "threads": None}


def _check_gemm(cfg: dict[str, Any], path: Path) -> None:
    unknown = sorted(set(cfg) - set(GEMM_KEYS))
    if unknown:
        raise SpecError(f"unknown gemm option(s) in {path}: {', '.join(unknown)}; valid: {', '.join(GEMM_KEYS)}")
    for key in ("hiddens", "batches", "step_hiddens"):
        values = cfg.get(key, GEMM_KEYS[key])
        if not isinstance(values, list) or not values or any(not isinstance(v, int) or v < 1 for v in values):
            raise SpecError(f"gemm.{key} in {path} must be a list of positive whole numbers, got {values!r}")


#: The file a GEMM study directory holds (seed 003 runs no training: no spec, sweep or study.json): what
#: ran, at which scale, whether it finished, and its advice. `report_gemm` is `launch report`'s for it.


def scale_name(study: Study) -> str:
    return f"--scale {study.scale}" if study.scale else "the file's base scale"


def gemm_here(study: Study) -> str:
    """What a GEMM study measures at the scale it was loaded at, for study.md (the file's words are the seed's)."""
    cfg = {**GEMM_KEYS, **study.gemm}
    threads = f"{cfg['threads']} threads" if cfg["threads"] else "PyTorch's default threads"
    return (f"Here ({scale_name(study)}): PyTorch's GEMM on this machine's CPU ({threads}), hidden "
            f"{', '.join(map(str, cfg['hiddens']))}; batches {', '.join(map(str, cfg['batches']))}; the "
            f"{cfg['preset']} training step at hidden {', '.join(map(str, cfg['step_hiddens']))}.")


def gemm_progress(total: int, what: str) -> Callable[[int, int, list[dict]], None]:
    """Prints each measured point as it comes (`train.bench.Progress`): which GEMM or step, n of N, the time
    so far; a cpu-scale study runs for minutes, and was silent until its end."""
    import time

    start = time.perf_counter()

    def show(done: int, _of: int, rows: list[dict]) -> None:
        figures = ", ".join(f"{r['op'].split()[0]} {r['gflops']:,.1f} GFLOP/s" if "op" in r
                            else f"{r['words_per_s']:,.0f} words/s" for r in rows)
        err_console.print(f"[{what} {done}/{total}] hidden {rows[0]['hidden']}, batch {rows[0]['batch']}: {figures} "
                          f"({time.perf_counter() - start:,.0f} s)", highlight=False, markup=False)

    return show


def gemm_study(study: Study, runs_root: Path) -> Path:
    """Seed 003: recurrent GEMM and training-step throughput against batch size: CSV, plot, study.md, gemm.json.
    Each file is written as soon as its part is measured, gemm.json first, so the directory says what it is."""
    import pandas as pd
    from scalelab.analysis.studies import gemm_markdown, plot_gemm
    from scalelab.train.bench import gemm_sweep, step_sweep

    cfg = {**GEMM_KEYS, **study.gemm}
    out = new_run_dir(runs_root, "study-seed-003-gemm")
    refuse_links(out, ("gemm.csv", "step.csv", "gemm.png", "study.md", GEMM_FILE))  # never written through a link
    meta = {"title": study.title, "kind": "gemm", "scale": study.scale, "gemm": cfg, "complete": False}
    write_json(out / GEMM_FILE, meta)
    err_console.print(f"{study.title}: {len(cfg['hiddens']) * len(cfg['batches'])} GEMM points, then "
                      f"{len(cfg['step_hiddens']) * len(cfg['batches'])} training steps, into {out}", highlight=False)
    gemm = pd.DataFrame(gemm_sweep(cfg["hiddens"], cfg["batches"], threads=cfg["threads"],
                                   progress=gemm_progress(len(cfg["hiddens"]) * len(cfg["batches"]), "gemm")))
    gemm.to_csv(out / "gemm.csv", index=False)
    steps = pd.DataFrame(step_sweep(cfg["preset"], cfg["step_hiddens"], cfg["batches"], threads=cfg["threads"],
                                    progress=gemm_progress(len(cfg["step_hiddens"]) * len(cfg["batches"]), "step")))
    steps.to_csv(out / "step.csv", index=False)
    plot_gemm(gemm, steps).savefig(out / "gemm.png", dpi=110)
    path = out / "study.md"
    path.write_text(gemm_markdown(study.title, study.seed_scale, gemm_here(study), gemm, steps, cfg["preset"]))
    write_json(out / GEMM_FILE, {**meta, "complete": True, "here": gemm_here(study)})
    return path


def variant_specs(study: Study, variant: Variant) -> list[Spec]:
    spec, _ = _variant_spec(study, variant)
    layouts = variant.layouts or study.layouts
    spec.nodes, spec.gpus_per_node = layouts[0]  # validated as its first layout, then per layout
    # a study's mode is its batch axis; its length (steps or epochs) is kept on every layout, as the
    # seed it reproduces did: the work axis is what that length does (launcher.sweep.sweep_axes)
    return sweep_specs(spec.validate(), layouts, batch_scaling=MODE_AXES[study.mode][0])


def _variant_spec(study: Study, variant: Variant) -> tuple[Spec, list]:
    """The variant's spec before its layouts, and the base's settings it leaves unread (`Spec.unread_settings`):
    a study whose base sets Horovod's fusion for its Horovod variants also has DDP and parameter-server variants,
    so those are set back to the default there; one the variant's own `set:` gives is refused, naming it."""
    spec = Spec.from_dict(_deep_merge(study.base, variant.overrides), where=f"variant {variant.label!r}")
    spec.name = variant.label
    own = _dotted_keys(variant.overrides)
    unread = spec.unread_settings()
    for setting in unread:
        if setting.key in own:
            raise SpecError(f"variant {variant.label!r}: {setting.message()}")
    base_only = [u for u in unread if u.key not in own]
    for setting in base_only:
        spec.drop_setting(setting.key)
    return spec, base_only


def _dotted_keys(mapping: dict[str, Any], prefix: str = "") -> set[str]:
    """The dotted keys a variant's `set:` gives (`engine: {bucket_cap_mb: 50}` gives engine.bucket_cap_mb)."""
    out: set[str] = set()
    for key, value in mapping.items():
        if isinstance(value, dict):
            out |= _dotted_keys(value, f"{prefix}{key}.")
        else:
            out.add(f"{prefix}{key}")
    return out


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def study_name(study: Study) -> str:
    """The name of the study's directory (before its date): `study-` and the title up to a colon; its dry run's
    placeholder directory takes it too (NAME-DRYRUN), as a run's and a sweep's do."""
    return "study-" + study.title.split(":")[0].replace(" ", "-").lower()


def run_study(study: Study, runs_root: Path, planned: list[list[Spec]] | None = None) -> Path:
    """Run every variant's sweep into one study directory; return it. `planned`: each variant's specs where the
    caller made them already (`study_cmd`, for the price).

    Every variant's sweep (its layouts' directories and specs), study.json and a copy of the study file are
    written before the first run starts, as a sweep writes every layout's first: a study stopped at any point
    is reported as far as it went and resumed (`launch resume STUDY`) from there. A study that launched
    nothing (its first submission refused) leaves no directory, as `run_sweep` leaves no sweep."""
    planned = planned or [variant_specs(study, v) for v in study.variants]
    for specs in planned:  # every variant's backend refuses before anything is made
        get_backend(specs[0].backend, specs[0].backend_options).validate(specs[0])
    study_dir = new_run_dir(runs_root, study_name(study))
    with removed_on_failure(study_dir):
        sweeps = [{"label": variant.label, "dir": make_sweep(specs, study_dir, f"v{i}").name}
                  for i, (variant, specs) in enumerate(zip(study.variants, planned))]
        if study.source is not None:
            (study_dir / STUDY_SOURCE).write_bytes(study.source.read_bytes())
        write_json(study_dir / STUDY_FILE, {"title": study.title, "scale": study.scale,
                                            "overrides": study.overrides, "sweeps": sweeps})
    try:
        return continue_study(study_dir)
    except ScalelabError:  # launched nothing: nothing to report or resume
        if not any(RunPaths(run).launch.exists() for _, sweep in study_sweeps(study_dir) for run in sweep_runs(sweep)):
            shutil.rmtree(study_dir, ignore_errors=True)
        raise


def continue_study(study_dir: Path, allow_changed: tuple[str, ...] | None = None) -> Path:
    """Each variant's sweep that has not completed, in study order, held as one (`owning`: a stop names the study
    to resume), every layout of every one asked of its backend first (`preflight_sweep`: Slurm's `sbatch
    --test-only`); a layout that does not complete stops the study. `allow_changed` None: the study's first run;
    otherwise `launch resume STUDY`, whose checks (`checked_resume`) pass for every sweep before any goes on."""
    todo = [sweep for _, sweep in study_sweeps(study_dir) if unfinished_layouts(sweep)]
    if allow_changed is None:
        backends = [sweep_backend(sweep) for sweep in todo]
    else:
        backends = [checked_resume(sweep, allow_changed) for sweep in todo]
    for backend, sweep in zip(backends, todo):  # every variant's layouts asked of the backend before the first is sent
        preflight_sweep(backend, sweep)
    with owning(study_dir):
        for backend, sweep in zip(backends, todo):
            continue_sweep(backend, sweep, within=study_dir)
    return study_dir


def resume_study(study_dir: Path, allow_changed: tuple[str, ...] = ()) -> Path:
    """`launch resume STUDY`: its unfinished layouts continued from their checkpoints or started, variant after
    variant, then its tables and study.md written as `launch study` writes them; the study file it ran is its
    own copy, so the tables are those of the study that ran even where the original was edited since."""
    source = study_dir / STUDY_SOURCE
    if not source.is_file():
        raise ScalelabError(f"{study_dir} holds no copy of its study file ({STUDY_SOURCE}): it was made by an "
                            "older scalelab, which wrote none; resume its sweeps one by one (`launch status "
                            f"{shell_word(study_dir)}` lists them), or run `launch study` again")
    meta = read_json(study_dir / STUDY_FILE, STUDY_FILE, dict)
    study = load_study(source, meta.get("scale"), meta.get("overrides") or None)  # refused before anything runs
    return study_report(continue_study(study_dir, allow_changed), study)


def resume_and_show(study_dir: Path, allow_changed: tuple[str, ...] = ()) -> None:
    """`launch resume STUDY` (launcher.cli.STUDY_RESUME): the study resumed, then its study.md shown."""
    show_study(resume_study(study_dir, allow_changed))


def report_gemm(paths: list[Path], out: Path | None, fmt: str) -> None:
    """`launch report` of a GEMM study directory (it holds gemm.json, the marker `launcher.cli.LAZY_REPORTS`
    maps to this; (paths, out, fmt) as `report_dirs`): it ran no training, so there is no scaling report, only
    its own table, advice and plot: printed (table, markdown), as JSON, or as report.html (its path printed)."""
    import json

    import pandas as pd
    from scalelab.analysis.studies import gemm_advice, gemm_html
    from scalelab.core.errors import RecordError
    from scalelab.core.rundir import read_json

    if len(paths) != 1:
        raise SpecError("a GEMM study is reported alone: give one GEMM study directory (it has no runs to merge)")
    where = paths[0]
    meta = read_json(where / GEMM_FILE, GEMM_FILE, dict)
    if not meta.get("complete") or not (where / "study.md").is_file():
        raise RecordError(f"the GEMM study {where} has not finished (or was stopped): its measurements so far are "
                          "gemm.csv and step.csv; run `launch study` again for its report")
    gemm, steps = pd.read_csv(where / "gemm.csv"), pd.read_csv(where / "step.csv")
    preset = meta.get("gemm", {}).get("preset", "")
    if fmt == "json":
        click.echo(json.dumps({**meta, "advice": [a[2:] for a in gemm_advice(gemm, steps, preset)],
                               "gemm_rows": gemm.to_dict("records"), "step_rows": steps.to_dict("records")}, indent=2))
    elif fmt == "markdown":
        click.echo((where / "study.md").read_text())
    elif fmt == "html":
        page = (out or where) / "report.html"
        refuse_links(page.parent, ("report.html",))
        click.echo(str(gemm_html(page, meta.get("title", where.name), meta.get("here", ""), gemm, steps, preset,
                                 (where / "gemm.png").read_bytes())))
    else:
        show_study(where / "study.md")


#: How study.md names each data kind (core.spec.DATA_KINDS) in what ran.
DATA_WORDS = {"synthetic": "synthetic batches", "task": "a learnable synthetic task", "text": "text files",
              "shards": "prepared shards"}


def scaling_here(study: Study) -> str:
    """What a scaling study ran at the scale it was loaded at (models, data, length, layouts, where), for
    study.md: the file's `seed_scale` is the seed's, and said sentiment-small under `--scale test`."""
    specs = [spec for v in study.variants for spec in variant_specs(study, v)]

    def listed(values: Any) -> str:
        return ", ".join(dict.fromkeys(str(v) for v in values))

    length = listed(f"{s.steps} steps" if s.steps and not s.epochs else f"{s.epochs} epochs"
                    + (f" (at most {s.steps} steps)" if s.steps else "") for s in specs)
    devices = {_device(s) for s in specs}
    stand_in = "; CPU worker processes standing in for GPUs" if devices == {"cpu"} else ""
    data = listed(DATA_WORDS.get(s.data.kind, s.data.kind) for s in specs)
    layouts = listed(f"{s.nodes}x{s.gpus_per_node}" for s in specs)
    return (f"Here ({scale_name(study)}): {listed(s.model for s in specs)} on {data}, {length}, layouts {layouts}, "
            f"on the {listed(s.backend for s in specs)} backend (device {listed(sorted(devices))}){stand_in}.")


def _device(spec: Spec) -> str:
    """The device a run computes on as far as this machine can tell: `auto` on the local backend is this
    machine's (a GPU when PyTorch sees one); elsewhere it is the remote machine's, said as auto."""
    if spec.device != "auto" or spec.backend != "local":
        return spec.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def study_report(study_dir: Path, study: Study) -> Path:
    """The seed-shaped tables of the study's runs (a CSV each) and study.md, plus the scaling report."""
    from scalelab.analysis.results import expand_run_dirs, summarize_loaded, write_report
    from scalelab.analysis.scaling import step_table
    from scalelab.analysis.results import run_settings
    from scalelab.analysis.studies import (RESOLVED_IN_START, VariantRun, money_note, resolved_settings,
                                           same_settings_warnings, seed_table, speedup_note, study_markdown,
                                           study_runs, worker_batches)
    from scalelab.costs.studies import price_money_table

    runs = expand_run_dirs([sweep for _, sweep in study_sweeps(study_dir)])
    loaded, extra, settings = [], {}, []
    for run in runs:
        records = load_run(run)  # each run is read once, for its summary, its per-step table and its wall time
        steps = step_table(records.steps)  # made once: the summary is drawn from it too
        loaded.append((str(run), summarize_loaded(records, steps), steps))
        start = _first_start(records)
        extra[str(run)] = {"wall_s": _wall_seconds(records), "backend": records.spec.backend,
                           "worker_batch": worker_batches(records.steps) if records.spec.balance == "dynamic" else None,
                           **{key: start.get(key) for key in RESOLVED_IN_START}}
        given = run_settings(records.spec)
        settings.append(VariantRun(str(records.spec.name), f"{records.spec.nodes}x{records.spec.gpus_per_node}",
                                   given, resolved_settings(given, start)))
    data = study_runs(loaded, extra)
    warnings = same_settings_warnings(settings)
    tables = {}
    refuse_links(study_dir, (*(f"{name}.csv" for name in study.tables), "study.md"))  # never through a link
    for name in study.tables:
        tables[name] = (price_money_table(data.rows, study.instance_mixes(), study.market) if name == "money"
                        else seed_table(name, data, study.epochs_shown))
        tables[name].to_csv(study_dir / f"{name}.csv", index=False)
    report = write_report([summary for _, summary, _ in loaded], runs, study_dir)
    if warnings:  # the study's own (study.md says them first), beside the scaling report's in warnings.json
        write_json(study_dir / "warnings.json", [*warnings, *report.warnings])
    notes = {"arrangement": speedup_note(data, "arrangement"), "throughput": speedup_note(data),
             "convergence": speedup_note(data, "convergence"),
             "money": money_note(study.market, [e["backend"] for e in extra.values()])}
    path = study_dir / "study.md"
    path.write_text(study_markdown(study.title, study.seed_scale, study.mode, [v.label for v in study.variants],
                                   tables, report.markdown_path.name, scaling_here(study), notes, warnings))
    return path


def _first_start(records: Any) -> dict[str, Any]:
    """Rank 0's start record (the lowest rank's, and the latest launch's where the run was resumed), {} without."""
    start = records.start
    if not len(start):
        return {}
    ordered = start.sort_values(["rank", "time"] if "time" in start.columns else ["rank"], kind="stable")
    first = ordered[ordered["rank"] == ordered["rank"].min()]
    return first.iloc[-1].to_dict()


def _wall_seconds(records: Any) -> float | None:
    """The run's billed time, launch to its last record (costs.expected.run_seconds, as `launch cost`
    bills it); None for a run with no timed record."""
    from scalelab.core.errors import ScalelabError
    from scalelab.costs.expected import run_seconds

    try:
        return run_seconds(records)
    except ScalelabError:
        return None


@click.command("study")
@click.argument("study_file", type=InputFile("study file"))
@click.option("--scale", help="A named scale of the study (e.g. test, cpu, seed); default: the file's base.")
@click.option("--backend", type=click.Choice(BACKEND_NAMES), help=f"Run on this backend instead of the study's ({', '.join(BACKEND_NAMES)}).")
@shared_flags("--runs-dir")  # the one declaration `launch run` uses: the same rule, check and help
@click.option("--dry-run", is_flag=True, help="Print every variant x layout request (and, on stderr, what it "
                                             "would cost) and run nothing.")
@price_options
def study_cmd(study_file: str, scale: str | None, backend: str | None, runs_dir: str, dry_run: bool, **price: Any) -> None:
    """Run a seed's study (examples/*.yaml) and write its tables (study.md, CSV) and scaling report."""

    study = load_study(Path(study_file), scale, {"backend": backend} if backend else None)
    # each variant's specs, made once for the price, the dry run and the run (a GEMM study's dry run shows its base)
    planned = [(v, variant_specs(study, v)) for v in study.variants] if dry_run or study.kind == "scaling" else []
    specs = [(spec, 1) for _, v_specs in planned for spec in v_specs] if study.kind == "scaling" else []
    price = {**price, "runs_dir": runs_dir}
    if dry_run:
        for _, (first, *_) in planned:  # what `run_study` refuses or notes of each variant, before anything is printed
            get_backend(first.backend, first.backend_options).check_dry_run(first)
        for v, v_specs in planned:
            for spec in v_specs:
                b = get_backend(spec.backend, spec.backend_options)
                click.echo(f"# variant {v.label!r}, layout {spec.nodes}x{spec.gpus_per_node}")
                click.echo(b.submit_dryrun(spec, dryrun_dir(Path(runs_dir), study_name(study))
                                           / f"{spec.nodes}x{spec.gpus_per_node}").render())
        if specs:
            show_quote(specs, price)
        return
    if specs:
        guard(specs, price)
    if study.kind == "gemm":
        path = gemm_study(study, Path(runs_dir))
    else:
        path = study_report(run_study(study, Path(runs_dir), [v_specs for _, v_specs in planned]), study)
    show_study(path)


def show_study(path: Path, out: Any = None) -> None:
    """study.md on the terminal (`out`: a rich console, default the shared one): headings bold, prose as
    written, tables drawn as tables with every cell's text as it is. rich's Markdown took the stars of
    `1*p2.xlarge+1*g3.4xlarge` for italics and the output was cut at 100 columns (`cudnn_ls…`)."""
    from rich.markup import escape
    from rich.text import Text

    out = out or console
    for kind, block in markdown_blocks(path.read_text()):
        if kind == "table":
            print_cells(out, *block)
        else:
            out.print(Text(block, style="bold" if kind == "heading" else ""))
        out.print()
    out.print(f"study report: [bold]{escape(str(path))}[/]", soft_wrap=True)


def markdown_blocks(text: str) -> list[tuple[str, Any]]:
    """study.md as ("heading", text), ("text", paragraph) and ("table", (headers, right-aligned, rows))
    blocks; links read as their text (and target), images as their caption and file."""
    blocks: list[tuple[str, Any]] = []
    for chunk in re.split(r"\n\s*\n", text.strip()):
        lines = chunk.splitlines()
        if lines and all(line.lstrip().startswith("|") for line in lines) and len(lines) >= 2:
            rows = [_md_cells(line) for line in lines]
            blocks.append(("table", (rows[0], [c.endswith(":") and c.startswith("-") for c in rows[1]], rows[2:])))
        elif chunk.startswith("#"):
            blocks.append(("heading", chunk.lstrip("#").strip()))
        else:
            chunk = re.sub(r"!\[([^\]]*)\]\(([^)]*)\)", r"\1: \2", chunk)
            chunk = re.sub(r"\[([^\]]*)\]\(([^)]*)\)", lambda m: m[1] if m[1] == m[2] else f"{m[1]} ({m[2]})", chunk)
            blocks.append(("text", chunk))
    return blocks


def _md_cells(line: str) -> list[str]:
    """The cells of one Markdown table line (analysis.report.markdown_table's: `|` inside a cell is `\\|`)."""
    inner = line.strip()[1:-1] if line.strip().endswith("|") else line.strip()[1:]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def print_cells(out: Any, headers: list[str], right: list[bool], rows: list[list[str]]) -> None:
    """A table whose cells are printed exactly as they are: boxed where it fits the terminal, else with
    its columns two spaces apart under a rule (as `launch cost` prints a wide table), else one record per
    row ("header: cell" lines) - never a cell cut or wrapped inside. Every column is as wide as its widest
    cell and its header's longest word (`costs.cli._natural_widths`): a header wraps between its words."""
    from rich.text import Text

    from scalelab.costs.cli import _natural_widths, _table_width

    widths = _natural_widths(headers, rows)
    for boxed in (True, False):
        if _table_width(widths, boxed) <= out.width:
            out.print(_cells_table(headers, right, rows, widths, boxed))
            return
    for row in rows:
        for i, (h, c) in enumerate(zip(headers, row)):
            out.print(Text(f"{'  ' if i else ''}{h}: {c}"), soft_wrap=True)


def _cells_table(headers: list[str], right: list[bool], rows: list[list[str]], widths: list[int], boxed: bool) -> Any:
    """The rich table of `print_cells`, each column `widths` wide (no cell wraps; a header between words)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = (Table(header_style="bold") if boxed else
             Table(header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True))
    for h, r, w in zip(headers, right, widths):
        table.add_column(Text(h), justify="right" if r else "left", width=w, overflow="fold")
    for row in rows:
        table.add_row(*(Text(c) for c in row))
    return table
