"""Studies: the seeds' experiments as recipes, runnable on any backend, ending in the seed's tables.

A study file (YAML, see examples/) is a base spec, a list of variants (a label + spec overrides), the
layouts to sweep, the scaling mode, and which seed-shaped tables to produce. Named `scales` shrink or
grow it: `--scale test` is what the tests run on a CPU in seconds, `--scale seed` is the seed's own
size (for GPUs). `launch study FILE --backend slurm` runs the same study on Slurm.

    launch study examples/seed001-nmt-data-parallel.yaml --scale cpu

Every variant is a sweep (one run per layout) under one study directory; the tables are computed
from the runs' records (analysis.scaling), like every other report.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pandas as pd

from core.errors import SpecError
from core.rundir import new_run_dir, write_json
from core.spec import Spec

TABLES = ("throughput", "epochs", "convergence", "arrangement", "money")
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


def load_study(path: Path, scale: str | None = None, overrides: dict[str, Any] | None = None) -> Study:
    """Read a study file, apply a named scale and command-line spec overrides, validate it all."""
    import yaml

    from launcher.sweep import parse_layouts

    if not path.is_file():
        raise SpecError(f"study file not found: {path} (the recipes are in examples/)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"study file {path} is not valid YAML: {exc}") from None
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
    variants = []
    for v in raw.get("variants", [{"label": "base"}]):
        extra = sorted(set(v) - {"label", "set", "layouts", "instances"})
        if extra or "label" not in v:
            raise SpecError(f"a variant in {path} needs a label and may have set, layouts, instances; got {sorted(v)}")
        layouts = parse_layouts(None, ",".join(v["layouts"])) if v.get("layouts") else None
        variants.append(Variant(str(v["label"]), v.get("set", {}), layouts, v.get("instances", {})))
    tables = raw.get("tables", ["throughput"])
    for t in tables:
        if t not in TABLES:
            raise SpecError(f"unknown table {t!r} in {path}; valid: {', '.join(TABLES)}")
    layouts = parse_layouts(None, ",".join(raw.get("layouts", ["1x1", "1x2"])))
    study = Study(
        title=raw.get("title", path.stem), seed_scale=raw.get("seed_scale", ""), base=base,
        mode=raw.get("mode", "strong"), layouts=layouts, variants=variants, tables=tables,
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
    """Seed 003: recurrent GEMM and training-step throughput against batch size, table + plot + knee."""
    from train.bench import gemm_sweep, knee, step_sweep

    cfg = {**GEMM_KEYS, **study.gemm}
    out = new_run_dir(runs_root, "study-seed-003-gemm")
    gemm = pd.DataFrame(gemm_sweep(cfg["hiddens"], cfg["batches"], threads=cfg["threads"]))
    steps = pd.DataFrame(step_sweep(cfg["preset"], cfg["step_hiddens"], cfg["batches"], threads=cfg["threads"]))
    gemm.to_csv(out / "gemm.csv", index=False)
    steps.to_csv(out / "step.csv", index=False)
    _plot_gemm(gemm, steps, out / "gemm.png")
    fwd = gemm[gemm["op"] == "NN forward"]
    knees = knee(fwd.to_dict("records"), "hidden", "gflops")
    step_knees = knee(steps.to_dict("records"), "hidden", "words_per_s")
    table = gemm.pivot_table(index="batch", columns=["hidden", "op"], values="gflops").round(1)
    table.columns = [f"H={h} {op} (GFLOP/s)" for h, op in table.columns]
    wide = steps.pivot_table(index="batch", columns="hidden", values="words_per_s").round(0)
    wide.columns = [f"step H={h} (words/s)" for h in wide.columns]
    parts = [f"# {study.title}", "", f"Scale of the seed: {study.seed_scale.strip()}", "",
             "## Recurrent multiply and training step throughput against batch size", "",
             _markdown(table.join(wide).reset_index().astype({"batch": int})), "",
             "## Where to pick the batch", "",
             *[f"- hidden {h}: the forward recurrent GEMM reaches 90% of its best rate at batch {b}" for h, b in knees.items()],
             *[f"- hidden {h}: the {cfg['preset']} training step reaches 90% of its best words/s at batch {b}"
               for h, b in step_knees.items()], "", "![GEMM and step throughput against batch size](gemm.png)", ""]
    path = out / "study.md"
    path.write_text("\n".join(parts))
    return path


def _plot_gemm(gemm: pd.DataFrame, steps: pd.DataFrame, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    for (h, op), g in gemm.groupby(["hidden", "op"]):
        ax1.plot(g["batch"], g["gflops"], marker="o", ms=3, label=f"H={h} {op}")
    ax1.set(xlabel="batch size", ylabel="GFLOP/s", title="Recurrent GEMM (h @ U and its gradients)")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    for h, g in steps.groupby("hidden"):
        ax2.plot(g["batch"], g["words_per_s"], marker="o", ms=3, label=f"hidden {h}")
    ax2.set(xlabel="batch size", ylabel="words/s", title="One training step")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def variant_specs(study: Study, variant: Variant) -> list[Spec]:
    from launcher.sweep import sweep_specs

    spec = Spec.from_dict(_deep_merge(study.base, variant.overrides), where=f"variant {variant.label!r}")
    spec.name = variant.label
    layouts = variant.layouts or study.layouts
    spec.nodes, spec.gpus_per_node = layouts[0]  # validated as its first layout, then per layout
    return sweep_specs(spec.validate(), layouts, study.mode)


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_study(study: Study, runs_root: Path) -> Path:
    """Run every variant's sweep into one study directory; return it."""
    from launcher.backend import get_backend
    from launcher.sweep import run_sweep

    study_dir = new_run_dir(runs_root, "study-" + study.title.split(":")[0].replace(" ", "-").lower())
    sweeps = []
    for i, variant in enumerate(study.variants):
        specs = variant_specs(study, variant)
        backend = get_backend(specs[0].backend, specs[0].backend_options)
        backend.validate(specs[0])
        sweep = run_sweep(backend, specs, study_dir, f"v{i}")
        sweeps.append({"label": variant.label, "dir": sweep.name})
        write_json(study_dir / "study.json", {"title": study.title, "sweeps": sweeps})
    return study_dir


# ---- seed-shaped tables (pure: from the summaries and step tables of the runs) ------------------


def study_speedups(rows: pd.DataFrame) -> list[float]:
    """Speedup of every run against its variant's smallest layout, or - for a variant with no run at
    the study's smallest worker count (the same 4 GPUs arranged, a mixed pair) - against the first
    variant's smallest layout, as seed 004 compares everything with one g3.4xlarge."""
    fewest = rows["workers"].min()
    first = rows.iloc[0]
    base = {}
    for label, grp in rows.groupby("label", sort=False):
        small = grp.loc[grp["workers"].idxmin()]
        base[label] = small["words_per_s"] if small["workers"] == fewest else first["words_per_s"]
    return [r["words_per_s"] / base[r["label"]] for _, r in rows.iterrows()]


def throughput_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Seed 001's table: GPUs, batch per GPU, total time of the measured batches, words/s, speedup."""
    return pd.DataFrame({
        "variant": rows["label"], "GPU number": rows["workers"],
        "Batch size (per GPU)": rows["global_batch"] // rows["workers"],
        "Measured batches": rows["steps_measured"],
        "Total time of measured batches (s)": (rows["step_s_mean"] * rows["steps_measured"]).round(3),
        "Processing speed (words/s)": rows["words_per_s"].round(1),
        "Speedup ratio": rows["speedup"].round(2),
    })


def epochs_table(rows: pd.DataFrame, epoch_times: dict[str, list[float]], shown: int) -> pd.DataFrame:
    """Seed 002's table: time for each of the first epochs per layout, and the speedup of their sum."""
    out = pd.DataFrame({"variant": rows["label"], "workers": rows["workers"], "global batch": rows["global_batch"]})
    sums = []
    for i in range(shown):
        out[f"epoch {i + 1} (s)"] = [round(epoch_times[r][i], 3) if len(epoch_times[r]) > i else None for r in rows["run"]]
    for r in rows["run"]:
        sums.append(sum(epoch_times[r][:shown]) if len(epoch_times[r]) >= shown else None)
    out["total (s)"] = [round(s, 3) if s is not None else None for s in sums]
    base = {}
    speed = []
    for label, workers, s in zip(rows["label"], rows["workers"], sums):
        base.setdefault(label, (workers, s))
        speed.append(round(base[label][1] / s, 2) if s and base[label][1] else None)
    out["speedup"] = speed
    return out


def convergence_table(rows: pd.DataFrame, epochs_to: dict[str, float | None]) -> pd.DataFrame:
    """Seed 004's convergence: epochs and time to the loss threshold per layout."""
    return pd.DataFrame({
        "variant": rows["label"], "layout": rows["nodes"].astype(str) + "x" + rows["gpus_per_node"].astype(str),
        "workers": rows["workers"], "threshold": rows["loss_threshold"],
        "reached": rows["reached_threshold"], "steps to threshold": rows["steps_to_threshold"],
        "epochs to threshold": [epochs_to.get(r) for r in rows["run"]],
        "time to threshold (s)": pd.to_numeric(rows["time_to_threshold_s"], errors="coerce").round(2),
    })


def arrangement_table(rows: pd.DataFrame, epoch_times: dict[str, list[float]]) -> pd.DataFrame:
    """Seed 004's arrangement table: nodes, GPUs per node, time per epoch, speedup."""
    per_epoch = [sum(epoch_times[r]) / len(epoch_times[r]) / 60 if epoch_times[r] else None for r in rows["run"]]
    return pd.DataFrame({
        "variant": rows["label"], "# of Node": rows["nodes"], "# of GPUs per Node": rows["gpus_per_node"],
        "Time (min/epoch)": [round(x, 4) if x else None for x in per_epoch], "Speed-up": pd.to_numeric(rows["speedup"], errors="coerce").round(2),
    })


def money_table(rows: pd.DataFrame, instances: dict[tuple[str, str], str], market: str, price) -> pd.DataFrame:
    """Seed 004's money-speed table: the instance mix of each layout, seconds, hours and dollars.

    Seconds are the run's training time (to the threshold when one was set and reached, else all
    measured steps); `price(mix, seconds, market)` is the catalog's billing (per second, 60 s minimum).
    """
    out = []
    for _, r in rows.iterrows():
        layout = f"{r['nodes']}x{r['gpus_per_node']}"
        mix = instances.get((r["label"], layout))
        seconds = r["time_to_threshold_s"] if r.get("reached_threshold") else r["train_s"]
        dollars = price(mix, seconds, market) if mix else None
        out.append({"Experiment": f"{r['label']} {layout}", "Instances": mix or "—", "Seconds": round(seconds, 1),
                    "Hours": round(seconds / 3600, 4), "Total Price ($)": dollars})
    return pd.DataFrame(out)


def _pricer():
    """`price(mix, seconds, market)` in dollars from the price catalog, read once (per-second
    billing, 60 s minimum per instance)."""
    from costs.billing import run_cost
    from costs.catalog import load_catalog

    catalog = load_catalog()
    return lambda mix, seconds, market: round(run_cost(seconds, mix, catalog, market).dollars, 4)


def _markdown(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(":--" for _ in cols) + "|"]
    for row in df.astype(object).itertuples(index=False):  # object: ints stay ints in mixed rows
        lines.append("| " + " | ".join("—" if pd.isna(v) else str(v) for v in row) + " |")
    return "\n".join(lines)


def study_report(study_dir: Path, study: Study) -> Path:
    """Compute the seed-shaped tables from the study's runs and write study.md (+ the scaling report)."""
    import json

    from analysis.results import expand_run_dirs, summarize_loaded, write_report
    from analysis.scaling import scale_layouts, step_table
    from core.records import load_run

    meta = json.loads((study_dir / "study.json").read_text())
    sweeps = [study_dir / s["dir"] for s in meta["sweeps"]]
    runs = expand_run_dirs(sweeps)
    summaries, epoch_times, epochs_to, train_s = [], {}, {}, {}
    for run in runs:
        records = load_run(run)  # each run is read once, for its summary and its per-step table
        summaries.append(summarize_loaded(records))
        steps = step_table(records.steps)
        key = str(run)
        epoch_times[key] = steps.groupby("epoch")["t_step"].sum().tolist()
        train_s[key] = float(steps["t_step"].sum())
        s = summaries[-1]
        epochs_to[key] = (round(float(steps.loc[steps["step"] <= s.steps_to_threshold, "epoch"].max()) + 1, 2)
                          if s.steps_to_threshold else None)
    rows = scale_layouts(summaries)
    order = {(s.label, s.nodes, s.gpus_per_node): str(r) for s, r in zip(summaries, runs)}
    rows["run"] = [order[(lab, n, g)] for lab, n, g in zip(rows["label"], rows["nodes"], rows["gpus_per_node"])]
    rows["train_s"] = [train_s[r] for r in rows["run"]]
    rows["speedup"] = study_speedups(rows)
    parts = [f"# {study.title}", "", f"Scale of the seed: {study.seed_scale.strip()}", "",
             f"Scaling mode: {study.mode}; variants: {', '.join(v.label for v in study.variants)}.", ""]
    for table in study.tables:
        if table == "throughput":
            df = throughput_table(rows)
        elif table == "epochs":
            df = epochs_table(rows, epoch_times, study.epochs_shown)
        elif table == "convergence":
            df = convergence_table(rows, epochs_to)
        elif table == "arrangement":
            df = arrangement_table(rows, epoch_times)
        else:
            mixes = {(v.label, f"{n}x{g}"): v.instances.get(f"{n}x{g}") or study.instances.get(f"{n}x{g}")
                     for v in study.variants for n, g in (v.layouts or study.layouts)}
            df = money_table(rows, mixes, study.market, _pricer())
        parts += [f"## {table.capitalize()}", "", _markdown(df), ""]
        df.to_csv(study_dir / f"{table}.csv", index=False)
    report = write_report(summaries, runs, study_dir)
    parts += ["## Scaling", "", f"Full scaling report: [report.md]({report.markdown_path.name})", "",
              "![speedup](speedup.png)", ""]
    path = study_dir / "study.md"
    path.write_text("\n".join(parts))
    return path


@click.command("study")
@click.argument("study_file", type=click.Path(dir_okay=False))
@click.option("--scale", help="A named scale of the study (e.g. test, cpu, seed); default: the file's base.")
@click.option("--backend", type=str, help="Run on this backend instead of the study's (local, slurm, k8s, aws).")
@click.option("--runs-dir", type=click.Path(file_okay=False), default="runs", show_default=True)
@click.option("--dry-run", is_flag=True, help="Print every variant x layout request and run nothing.")
def study_cmd(study_file: str, scale: str | None, backend: str | None, runs_dir: str, dry_run: bool) -> None:
    """Run a seed's study (examples/*.yaml) and write its tables (study.md, CSV) and scaling report."""
    from launcher.backend import get_backend
    from launcher.cli import console

    study = load_study(Path(study_file), scale, {"backend": backend} if backend else None)
    if dry_run:
        for v in study.variants:
            for spec in variant_specs(study, v):
                b = get_backend(spec.backend, spec.backend_options)
                click.echo(f"# variant {v.label!r}, layout {spec.nodes}x{spec.gpus_per_node}")
                click.echo(b.submit_dryrun(spec, Path(runs_dir) / "study-DRYRUN" / f"{spec.nodes}x{spec.gpus_per_node}").render())
        return
    if study.kind == "gemm":
        path = gemm_study(study, Path(runs_dir))
        console.print(path.read_text(), markup=False, highlight=False)
        console.print(f"study report: [bold]{path}[/]")
        return
    study_dir = run_study(study, Path(runs_dir))
    path = study_report(study_dir, study)
    console.print(path.read_text(), markup=False, highlight=False)
    console.print(f"study report: [bold]{path}[/]")
