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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from scalelab.core.checks import InputFile
from scalelab.core.errors import SpecError
from scalelab.core.flags import shared_flags
from scalelab.core.records import load_run
from scalelab.core.rundir import STUDY_FILE, new_run_dir, study_sweeps, write_json
from scalelab.core.spec import BACKEND_NAMES, MODE_AXES, Spec, read_yaml_mapping
from scalelab.core.writes import refuse_links
from scalelab.launcher.backend import get_backend
from scalelab.launcher.cli import console
from scalelab.launcher.pricing import guard, price_options, show_quote
from scalelab.launcher.sweep import parse_layouts, run_sweep, sweep_specs

STUDY_KEYS = {"title", "seed_scale", "base", "mode", "layouts", "variants", "tables", "scales", "instances",
              "market", "epochs_shown", "kind", "gemm"}


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

    def instance_mixes(self) -> dict[tuple[str, str], str | None]:
        """(variant label, layout "NxG") -> the instance mix it runs on (the variant's, else the
        study's), for the money table."""
        return {(v.label, f"{n}x{g}"): v.instances.get(f"{n}x{g}") or self.instances.get(f"{n}x{g}")
                for v in self.variants for n, g in (v.layouts or self.layouts)}


def load_study(path: Path, scale: str | None = None, overrides: dict[str, Any] | None = None) -> Study:
    """Read a study file, apply a named scale and command-line spec overrides, validate it all."""
    from scalelab.analysis.studies import TABLES

    raw = read_yaml_mapping(path, "study file")
    unknown = sorted(set(raw) - STUDY_KEYS)
    if unknown:
        raise SpecError(f"unknown key(s) in {path}: {', '.join(unknown)}; valid: {', '.join(sorted(STUDY_KEYS))}")
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
    study.kind, study.gemm = raw.get("kind", "scaling"), raw.get("gemm", {})
    if study.kind == "gemm":
        _check_gemm(study.gemm, path)
        return study
    if study.kind != "scaling":
        raise SpecError(f"unknown study kind {study.kind!r} in {path}; valid: scaling, gemm")
    for v in study.variants:  # every variant x layout is checked before anything runs
        variant_specs(study, v)
    return study


def _variants(raw: dict[str, Any], path: Path) -> list[Variant]:
    """The study's variants (the base alone when the key is left out), refused when `variants:` is given
    but empty, or two share a label: both were accepted without a word, and the study then ran nothing,
    or its tables merged two variants' rows under one name."""
    given = raw.get("variants", [{"label": "base"}])
    if not isinstance(given, list) or not given:
        raise SpecError(f"variants in {path} must be a non-empty list of {{label, set}} entries, got {given!r}; "
                        "give at least one variant, or leave the key out to run the base alone")
    variants, seen = [], set()
    for v in given:
        extra = sorted(set(v) - {"label", "set", "layouts", "instances"}) if isinstance(v, dict) else ["?"]
        if extra or "label" not in v:
            raise SpecError(f"a variant in {path} needs a label and may have set, layouts, instances; got {v!r}")
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
        if not values or any(not isinstance(v, int) or v < 1 for v in values):
            raise SpecError(f"gemm.{key} in {path} must be a list of positive whole numbers, got {values!r}")


def gemm_study(study: Study, runs_root: Path) -> Path:
    """Seed 003: recurrent GEMM and training-step throughput against batch size: CSV, plot, study.md."""
    import pandas as pd
    from scalelab.analysis.studies import gemm_markdown, plot_gemm
    from scalelab.train.bench import gemm_sweep, knee, step_sweep

    cfg = {**GEMM_KEYS, **study.gemm}
    out = new_run_dir(runs_root, "study-seed-003-gemm")
    gemm = pd.DataFrame(gemm_sweep(cfg["hiddens"], cfg["batches"], threads=cfg["threads"]))
    steps = pd.DataFrame(step_sweep(cfg["preset"], cfg["step_hiddens"], cfg["batches"], threads=cfg["threads"]))
    refuse_links(out, ("gemm.csv", "step.csv", "gemm.png", "study.md"))  # never written through a link
    gemm.to_csv(out / "gemm.csv", index=False)
    steps.to_csv(out / "step.csv", index=False)
    plot_gemm(gemm, steps).savefig(out / "gemm.png", dpi=110)
    knees = knee(gemm[gemm["op"] == "NN forward"].to_dict("records"), "hidden", "gflops")
    step_knees = knee(steps.to_dict("records"), "hidden", "words_per_s")
    path = out / "study.md"
    path.write_text(gemm_markdown(study.title, study.seed_scale, gemm, steps, knees, step_knees, cfg["preset"]))
    return path


def variant_specs(study: Study, variant: Variant) -> list[Spec]:

    spec = Spec.from_dict(_deep_merge(study.base, variant.overrides), where=f"variant {variant.label!r}")
    spec.name = variant.label
    layouts = variant.layouts or study.layouts
    spec.nodes, spec.gpus_per_node = layouts[0]  # validated as its first layout, then per layout
    # a study's mode is its batch axis; its length (steps or epochs) is kept on every layout, as the
    # seed it reproduces did: the work axis is what that length does (launcher.sweep.sweep_axes)
    return sweep_specs(spec.validate(), layouts, batch_scaling=MODE_AXES[study.mode][0])


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_study(study: Study, runs_root: Path) -> Path:
    """Run every variant's sweep into one study directory; return it."""

    study_dir = new_run_dir(runs_root, "study-" + study.title.split(":")[0].replace(" ", "-").lower())
    sweeps = []
    for i, variant in enumerate(study.variants):
        specs = variant_specs(study, variant)
        backend = get_backend(specs[0].backend, specs[0].backend_options)
        backend.validate(specs[0])
        sweep = run_sweep(backend, specs, study_dir, f"v{i}")
        sweeps.append({"label": variant.label, "dir": sweep.name})
        write_json(study_dir / STUDY_FILE, {"title": study.title, "sweeps": sweeps})
    return study_dir


def study_report(study_dir: Path, study: Study) -> Path:
    """The seed-shaped tables of the study's runs (a CSV each) and study.md, plus the scaling report."""
    from scalelab.analysis.results import expand_run_dirs, summarize_loaded, write_report
    from scalelab.analysis.scaling import step_table
    from scalelab.analysis.studies import seed_table, study_markdown, study_runs
    from scalelab.costs.studies import price_money_table

    runs = expand_run_dirs([sweep for _, sweep in study_sweeps(study_dir)])
    loaded = []
    for run in runs:
        records = load_run(run)  # each run is read once, for its summary and its per-step table
        loaded.append((str(run), summarize_loaded(records), step_table(records.steps)))
    data = study_runs(loaded)
    tables = {}
    refuse_links(study_dir, (*(f"{name}.csv" for name in study.tables), "study.md"))  # never through a link
    for name in study.tables:
        tables[name] = (price_money_table(data.rows, study.instance_mixes(), study.market) if name == "money"
                        else seed_table(name, data, study.epochs_shown))
        tables[name].to_csv(study_dir / f"{name}.csv", index=False)
    report = write_report([summary for _, summary, _ in loaded], runs, study_dir)
    path = study_dir / "study.md"
    path.write_text(study_markdown(study.title, study.seed_scale, study.mode, [v.label for v in study.variants],
                                   tables, report.markdown_path.name))
    return path


@click.command("study")
@click.argument("study_file", type=InputFile("study file"))
@click.option("--scale", help="A named scale of the study (e.g. test, cpu, seed); default: the file's base.")
@click.option("--backend", type=str, help=f"Run on this backend instead of the study's ({', '.join(BACKEND_NAMES)}).")
@shared_flags("--runs-dir")  # the one declaration `launch run` uses: the same rule, check and help
@click.option("--dry-run", is_flag=True, help="Print every variant x layout request (and, on stderr, what it "
                                             "would cost) and run nothing.")
@price_options
def study_cmd(study_file: str, scale: str | None, backend: str | None, runs_dir: str, dry_run: bool, **price: Any) -> None:
    """Run a seed's study (examples/*.yaml) and write its tables (study.md, CSV) and scaling report."""

    study = load_study(Path(study_file), scale, {"backend": backend} if backend else None)
    specs = [(spec, 1) for v in study.variants for spec in variant_specs(study, v)] if study.kind == "scaling" else []
    price = {**price, "runs_dir": runs_dir}
    if dry_run:
        for v in study.variants:
            for spec in variant_specs(study, v):
                b = get_backend(spec.backend, spec.backend_options)
                click.echo(f"# variant {v.label!r}, layout {spec.nodes}x{spec.gpus_per_node}")
                click.echo(b.submit_dryrun(spec, Path(runs_dir) / "study-DRYRUN" / f"{spec.nodes}x{spec.gpus_per_node}").render())
        if specs:
            show_quote(specs, price)
        return
    if specs:
        guard(specs, price)
    if study.kind == "gemm":
        path = gemm_study(study, Path(runs_dir))
    else:
        path = study_report(run_study(study, Path(runs_dir)), study)
    show_study(path)


def show_study(path: Path) -> None:
    """study.md on the terminal with its tables drawn as tables (raw Markdown pipes are hard to read)."""
    from rich.markdown import Markdown

    console.print(Markdown(path.read_text()), width=min(console.width, 100))
    console.print(f"study report: [bold]{path}[/]")
