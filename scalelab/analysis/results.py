"""From run directories to summaries and reports: the glue between the run store and scalelab/costs/.

All numbers come from the per-rank records (analysis.scaling does the arithmetic); this module only
finds the runs, hands their records and metadata over, and writes the outputs.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from scalelab.analysis.report import (
    REPORT_FILES,
    to_json_records,
    write_markdown,
)
from scalelab.analysis.consistency import contradictions
from scalelab.analysis.scaling import (
    LayoutSummary,
    RunMeta,
    UnmeasuredError,
    scale_layouts,
    summarize_run,
    trust_warnings,
)
from scalelab.core.errors import RecordError, ScalelabError, SpecError, shell_word
from scalelab.core.options import Flag, option_flags
from scalelab.core.presets import PRESETS, config_with_overrides
from scalelab.core.records import error_messages, load_run, read_errors
from scalelab.core.rundir import (
    CANCELLED,
    COMPLETED,
    FAILED,
    STUDY_FILE,
    SWEEP_FILE,
    RunPaths,
    checked_state,
    read_state,
    run_state,
    study_sweeps,
    sweep_runs,
)
from scalelab.core.runids import holds_runs
from scalelab.core.spec import BATCH_SCALING, Spec, read_spec
from scalelab.core.trajectory import spec_changes
from scalelab.core.writes import refuse_links


def run_label(spec: Spec) -> str:
    """The series a run belongs to: runs that differ only in layout share a label (its --name if given).
    The precision is part of it: a bf16 layout's speedup is over the bf16 base, not the fp32 one."""
    if spec.own_code:  # the preset's RNN and precision are not the script's, nor its batch (strong or weak)
        return spec.name or f"{spec.script_label} {spec.engine.name}"
    return spec.name or f"{spec.model} {spec.rnn} {spec.precision} {spec.engine.name} {spec.scaling}"


#: Spec fields that never set a series apart (every other field of spec.json does: `run_settings`), and why:
#: nodes and gpus_per_node are the layout, what a series runs over; name is the label itself where given;
#: backend_options say how the jobs were submitted (partition, job name, image; `launch probe` names each
#: candidate's series after it itself); seed draws the same experiment again, which is what a repeated
#: measurement is; link_probe_mb is set by `launch probe` on layouts of two ranks or more only, and times the
#: links after the last step; script_dir is where a script's code was shipped from (--script or the cwd), workdir
#: where its ranks ran (the launch's cwd).
NOT_SETTINGS = frozenset({"nodes", "gpus_per_node", "name", "backend_options", "seed", "link_probe_mb", "script_dir",
                          "workdir"})


def run_settings(spec: Spec, ignore: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What in a run's spec can set its series apart, by spec.json's dotted key (`data.prefetch`), in the
    spec's order: every field but `NOT_SETTINGS`, each as a layout-free value (`_layout_free`). Read off the
    spec's fields rather than listed, so that a setting added to the spec splits reports without a word here.
    `ignore`: more fields a caller tells apart its own way (`launch plan`: the backend, by instance type)."""
    raw, out = spec.to_dict(), {}
    for f in dataclasses.fields(spec):
        if f.name in NOT_SETTINGS or f.name in ignore:
            continue
        if dataclasses.is_dataclass(getattr(spec, f.name)):  # engine, data: their own fields, dotted
            out.update({f"{f.name}.{k}": v for k, v in raw[f.name].items()})
        else:
            out[f.name] = raw[f.name]
    return dict(_layout_free(spec, key, value) for key, value in out.items())


def _layout_free(spec: Spec, key: str, value: Any) -> tuple[str, Any]:
    """(key, value) of a setting with what the layout decides taken out, so that the layouts of one sweep agree.

    `launch sweep` derives the length from the layout where the batch and work axes differ (`launcher.sweep.
    _length`): those steps are given as the steps the same sweep would give one worker (`steps_at_1_worker`),
    epochs of growing work likewise. A run outside a sweep has no work axis: its length is the same on every
    layout, so its work follows its batch axis, as `sweep_axes` defaults (only epochs: fixed). A strong run with
    no --global-batch runs the preset's, which a sweep writes down. Slowdown factors all 1 emulate nothing."""
    batch_axis = BATCH_SCALING[spec.batch_mode]
    work_axis = spec.work_scaling or ("fixed" if spec.epochs is not None and spec.steps is None else batch_axis)
    if key == "work_scaling":
        return key, work_axis
    if key == "global_batch" and value is None and spec.batch_mode == "strong" and not spec.own_code:
        return key, _preset_batch(spec)
    if key == "emulate_slowdown" and all(f == 1 for f in value):
        return key, []
    derived = not spec.own_code and value is not None  # a script's length is its own, the same on every layout
    if key == "steps" and derived and batch_axis != work_axis:
        at_one = Fraction(value, spec.workers) if work_axis == "growing" else Fraction(value * spec.workers)
        return "steps_at_1_worker", _plain_number(at_one)
    if key == "epochs" and derived and work_axis == "growing":
        return "epochs_at_1_worker", _plain_number(Fraction(value, spec.workers))
    return key, value


def _preset_batch(spec: Spec) -> int | None:
    """The global batch a strong run without --global-batch ran: its preset's (None for an unknown preset)."""
    try:
        return config_with_overrides(PRESETS[spec.model], spec.model_args).default_batch
    except (KeyError, SpecError):
        return None


def _plain_number(x: Fraction) -> int | float:
    return int(x) if x.denominator == 1 else float(x)


def series_labels(specs: Sequence[Spec], ignore: frozenset[str] = frozenset()) -> list[tuple[str, dict[str, Any] | None]]:
    """(label, settings) of each run of a report: runs whose settings (`run_settings`) agree are one series,
    whatever their layouts (repeats of one spec included); runs that differ in any are not, even where their
    `run_label` agrees (two sweeps, one with --prefetch 0: their 1x1 rows were one series, one at 114 %).

    A label is `run_label` followed by the settings that differ among the runs of that `run_label` reported
    together, in the words of their flags (`prefetch=0`, `independent-replicas`); settings holds the same
    fields by spec.json's key. Naming only those keeps the common case's labels as they were (one sweep: no
    setting differs), and as words apart, the terminal's table keeps the shared ones in its title."""
    bases = [run_label(spec) for spec in specs]
    settings = [run_settings(spec, ignore) for spec in specs]
    differing = {base: _differing([st for b, st in zip(bases, settings) if b == base]) for base in set(bases)}
    out = []
    for base, st in zip(bases, settings):
        keys = [k for k in differing[base] if k in st]
        words: list[str] = []
        for k in keys:  # a script's arguments: only those that differ (`script_args_words`)
            told = script_args_words(st[k], [o.get(k) for b, o in zip(bases, settings) if b == base]) \
                if k == "script_args" else None
            words += told or [_setting_text(k, st[k])]
        out.append((" ".join([base, *words]), {k: st[k] for k in keys} or None))
    return _distinct_labels(out)


def _differing(group: list[dict[str, Any]]) -> list[str]:
    """The keys whose values are not the same in every settings of `group` (or absent from some: the steps of a
    sweep whose length follows its layout, `_layout_free`), in their first order."""
    keys = dict.fromkeys(k for st in group for k in st)
    return [k for k in keys if len({json.dumps([k in st, st.get(k)], sort_keys=True, default=str) for st in group}) > 1]


def _distinct_labels(labelled: list[tuple[str, dict[str, Any] | None]]) -> list[tuple[str, dict[str, Any] | None]]:
    """The same labels, with " #2", " #3" added where two series' settings would read the same (values whose
    text collides): series are grouped by label, so two must never share one."""
    seen: dict[str, list[str]] = {}
    out = []
    for label, st in labelled:
        kinds = seen.setdefault(label, [])
        key = json.dumps(st, sort_keys=True, default=str)
        if key not in kinds:
            kinds.append(key)
        i = kinds.index(key)
        out.append((label if i == 0 else f"{label} #{i + 1}", st))
    return out


@functools.cache
def _flags() -> dict[str, Flag]:
    return {f.key: f for f in option_flags(Spec)}


def _setting_text(key: str, value: Any) -> str:
    """A setting as a label says it: its flag's word and value (`prefetch=0`, `engine=horovod`), an on/off
    flag's word (`independent-replicas` / `exchange`); a field without a flag by its name (`clip_grad_norm=1`).
    One word each, so the terminal can put the words that all labels share in its title."""
    flag = _flags().get(key)
    if flag is not None and "/" in flag.decl and isinstance(value, bool):
        on, off = flag.decl.split("/")
        return (on if value else off).lstrip("-")
    name = flag.name.lstrip("-") if flag is not None else key.rsplit(".", 1)[-1]
    return f"{name}={_value_text(value)}"


def script_args_words(args: Any, group: list[Any]) -> list[str] | None:
    """The words that tell a --script run's arguments (`args`, its spec's script_args) apart from the others of
    `group` (their script_args): each argument whose value differs, as given (`--global-batch=64`; a flag alone,
    `--amp`; `--global-batch=default` where this run did not give one, so its script's default; a positional one
    by its place, `arg1=data.txt`). Why not all of them: two sweeps that differed in --global-batch were labelled
    `script_args=--steps,60,--val-every,5,--global-batch,64`, one word that broke the 80-column table and was
    shortened where the two could no longer be told apart. None where no argument's value differs (the same
    arguments in another order): the label then says them all."""
    mine = _script_options(args)
    others = [_script_options(g) for g in group]
    keys = dict.fromkeys(k for opts in [mine, *others] for k in opts)
    words = [(f"{k}={_value_text(mine[k])}" if mine[k] is not None else k) if k in mine
             else f"{k}={'default' if k.startswith('-') else 'none'}"
             for k in keys if len({json.dumps([k in o, o.get(k)]) for o in [mine, *others]}) > 1]
    return words or None


def _script_options(args: Any) -> dict[str, str | None]:
    """A script's arguments by name: `--name value` and `--name=value` as {"--name": "value"}, a flag followed by
    another option (or by nothing) as {"--flag": None}, the others by their place ({"arg1": "data.txt"}); an
    option given twice, its values joined by commas."""
    items = [str(a) for a in args] if isinstance(args, (list, tuple)) else []

    def option(a: str) -> bool:
        return a.startswith("-") and len(a) > 1 and not a.lstrip("-").replace(".", "", 1).isdigit()  # -1: a value

    out: dict[str, str | None] = {}
    i, place = 0, 0
    while i < len(items):
        a, value = items[i], None
        if option(a) and "=" in a:
            a, value = a.split("=", 1)
        elif option(a) and i + 1 < len(items) and not option(items[i + 1]):
            value, i = items[i + 1], i + 1
        elif not option(a):
            place += 1
            a, value = f"arg{place}", a
        out[a] = value if a not in out else ",".join(str(v) for v in (out[a], value) if v is not None)
        i += 1
    return out


def _value_text(value: Any) -> str:
    """A setting's value in one word: none, true, 0.001 (a float as %g where that loses nothing), a list's
    items joined by commas (`1.78,1`), a mapping's as key:value."""
    if value is None or value == [] or value == {}:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_value_text(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}:{_value_text(v)}" for k, v in value.items())
    return str(value).replace(" ", "_")


def label_series(summaries: list[LayoutSummary], specs: Sequence[Spec],
                 ignore: frozenset[str] = frozenset()) -> list[LayoutSummary]:
    """The summaries (one per spec, in order) with their series' labels and settings (`series_labels`)."""
    return [dataclasses.replace(s, label=label, settings=st)
            for s, (label, st) in zip(summaries, series_labels(specs, ignore), strict=True)]


def total_steps(spec: Spec) -> int | None:
    return spec.steps


def summarize_dir(run_dir: Path) -> LayoutSummary:
    return summarize_loaded(load_run(run_dir))


def expand_run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories as given, sweep directories replaced by their runs (in sweep order), study
    directories by their sweeps' runs (in study order)."""
    out: list[Path] = []
    for p in paths:
        if len(paths) > 1 and is_report_dir(p):
            continue  # a glob such as runs/* took an earlier report's directory: not a run, nothing to expand
        if (p / STUDY_FILE).exists():
            out.extend(expand_run_dirs([sweep for _, sweep in study_sweeps(p) if (sweep / SWEEP_FILE).exists()]))
        elif (p / SWEEP_FILE).exists():
            out.extend(sweep_runs(p))
        elif (p / "spec.json").exists():
            out.append(p)
        elif not p.exists():
            raise RecordError(f"not found: {p} (give run, sweep or study directories)")
        else:
            raise RecordError(f"{p} is not a run directory (no spec.json), a sweep directory (no {SWEEP_FILE}) "
                              f"or a study directory (no {STUDY_FILE}); `launch ls` lists them")
    return out


def _finished_runs(path: Path, left_out: str = "it is not in the report") -> tuple[list[Path], list[str]]:
    """The runs of a run, sweep or study directory that a report takes, and warnings about the others
    (`left_out`: what each unfinished layout's warning says of it, `finished_layouts`)."""
    if (path / STUDY_FILE).exists():
        runs, warnings = [], []
        for label, sweep in study_sweeps(path):
            if not (sweep / SWEEP_FILE).exists():  # a study made before every sweep was written at its start
                warnings.append(f"variant {label!r} of {path} never started; `launch study` runs it")
                continue
            try:
                found, said = finished_layouts(sweep, left_out, resume=path)
            except RecordError as exc:  # one variant with nothing finished: report the others
                found, said = [], [str(exc)]
            runs += found
            warnings += said
        if not runs:  # what continues the study said once, not once per variant
            again = f"; `launch resume {shell_word(path)}` continues it"
            said = "; ".join(w.removesuffix(again) for w in warnings)
            raise RecordError(f"no run of the study {path} has finished yet: {said}{again}")
        return runs, warnings
    if (path / SWEEP_FILE).exists():
        return finished_layouts(path, left_out)
    return expand_run_dirs([path]), []


@dataclass
class Report:
    table: pd.DataFrame
    markdown_path: Path
    plot_path: Path | None  # speedup.png, when the report drew its plots (`launch report --plots`, sweeps, studies)
    json_text: str
    warnings: list[str] = field(default_factory=list)
    runs: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the dollars rest on, or how to give them a price


def finished_layouts(sweep_dir: Path, left_out: str = "it is not in the report",
                     resume: Path | None = None) -> tuple[list[Path], list[str]]:
    """The layouts of a sweep that completed, and a warning naming each that did not (and how it stands), saying
    `left_out` of it (`launch plan`: "the plan leaves it out") and what resumes it: the sweep, or `resume` (the
    study the sweep is part of, which resumes its variants in order)."""
    again = f"`launch resume {shell_word(resume or sweep_dir)}` continues it"
    done, unfinished = [], []
    for run_dir in sweep_runs(sweep_dir):
        state = run_state(run_dir) if (run_dir / "spec.json").exists() else None
        if state == COMPLETED:
            done.append(run_dir)
        else:
            info = read_state(run_dir) if state else {}
            # why it failed, as launch said it (runner.kept), over the agents' "exit codes [1]" (the script's was 3)
            detail = info.get("error") or info.get("detail", "")
            unfinished.append((run_dir.name, f"{state.lower()}: {detail}" if state else "never started"))
    if not done:
        raise RecordError(f"no layout of the sweep {sweep_dir} has finished yet "
                          f"({'; '.join(f'{name} {how}' for name, how in unfinished)}); {again}")
    return done, [f"layout {name} of {sweep_dir} did not finish ({how}); {left_out}; {again}"
                  for name, how in unfinished]


#: (run, its summary) -> more columns of its row: the dollars, priced by the caller (costs/ sits above this layer)
Pricer = Callable[[Any, LayoutSummary], dict[str, Any]]


def build_report(paths: list[Path], out: Path | None = None, price: Pricer | None = None,
                 plots: bool = True) -> Report:
    """Summaries of every run, the scaling table, and report.md / report.json (with `plots`, speedup.png and
    throughput.png: matplotlib, most of a short report's time) in `out`.

    A sweep's layouts that did not complete (interrupted, failed, never started) are left out of the
    table, each named in a warning; a run given by its own directory is summarised from its records.
    `price` adds each run's dollars (`launcher.cli.report_dirs` passes costs.expected.recorded_cost).
    """
    runs, warnings, left_out = [], [], []
    for p in paths:
        if len(paths) > 1 and is_report_dir(p):
            warnings.append(f"{p} holds a report, not runs: left out")
            continue
        try:
            found, said = _finished_runs(p)
        except RecordError as exc:  # of several (`runs/*`): a prep directory, a sweep with nothing finished
            left_out.append(_left_out(paths, exc))
            continue
        runs += found
        warnings += said
    summaries, extra, loaded = [], [], []
    for run_dir in runs:  # one run's records in memory at a time
        try:
            run = load_run(run_dir)
            summary = summarize_loaded(run)
        except UnmeasuredError as exc:  # a --script layout that completed without a measured step: said, not fatal
            # Why: one layout that took no step (a script that resumed from another layout's checkpoint) made the
            # whole sweep's report an error; it is left out as a layout that did not finish is (`finished_layouts`)
            left_out.append(str(exc) if len(runs) > 1 else _left_out(paths, exc))
            continue
        except RecordError as exc:  # of several: a run that failed before its first measured step
            left_out.append(_left_out(paths, exc))
            continue
        if not RunPaths(run_dir).summary.exists():
            warnings.append(f"{run_dir} has no summary.json (it did not finish normally); summarised from its records")
        warnings += run.warnings  # record lines dropped (a cut last line): said here, not lost
        warnings += spec_changes(run_dir)  # `launch resume --allow-changed`: from which step what changed
        warnings += contradictions(run)  # records against their spec: which rank, which step
        summaries.append(summary)
        loaded.append(run_dir)
        if price is not None:
            extra.append(price(run, summary))
    if left_out and not loaded:
        raise RecordError(f"none of the {len(paths)} directories has a run to report: {'; '.join(left_out)}"
                          if len(paths) > 1 else f"no run of {paths[0]} has a measured step: {'; '.join(left_out)}")
    runs, warnings = loaded, [f"{why}; left out of the report" for why in left_out] + warnings
    if out is None:
        out = default_report_dir(paths)
    report = write_report(summaries, runs, out, extra if price is not None else None, plots=plots)
    report.warnings = warnings + merged_sweeps(paths, report.table) + report.warnings
    return report


def _left_out(paths: list[Path], exc: RecordError) -> str:
    """Why a report of several directories (`launch report runs/*`) leaves one out that it cannot report (a run
    that failed before its first measured step, a prep directory, a sweep with nothing finished): its error,
    raised as it is when that directory was given alone."""
    if len(paths) < 2:
        raise exc
    return str(exc)


def is_report_dir(path: Path) -> bool:
    """Whether `path` is a directory `launch report` wrote (report.json, and no spec, sweep or study of its own):
    reports made before they went to .reports/ sit beside the runs, where runs/* globs take them."""
    return path.is_dir() and (path / "report.json").is_file() and not holds_runs(path)


#: Where reports of several runs go under their runs' directory: hidden, so `launch report runs/*` and
#: `launch cost runs/*` never take a report for a run (a one-run report in runs/report-DATE/ broke both).
REPORTS_DIR = ".reports"


def default_report_dir(paths: list[Path]) -> Path:
    """Where a report goes without --out: one run, sweep or study directory given, into it; several,
    into .reports/report-DATE under the directory that holds them (out of the runs' globs): runs/ for
    `launch report runs/sweep-*` too, whose runs lie one level deeper, in their sweeps (their parents differ)."""
    if len(paths) == 1 and ((paths[0] / SWEEP_FILE).exists() or (paths[0] / STUDY_FILE).exists()
                            or (paths[0] / "spec.json").exists()):
        return paths[0]
    return _common_parent(paths) / REPORTS_DIR / ("report-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


def price_notes(extra: list[dict[str, Any]]) -> list[str]:
    """What the report's dollars rest on (each price basis once), and how to price the runs that have none."""
    bases = sorted({str(e["price_basis"]) for e in extra if e.get("price_basis")})
    unpriced = sorted({str(e["price_note"]) for e in extra if e.get("price_note")})
    notes = [f"dollars: billed per second from the launch, 60 s minimum per instance, at {'; '.join(bases)}"] if bases else []
    return notes + [f"no dollars: {n}" for n in unpriced]


def merged_sweeps(paths: list[Path], table: pd.DataFrame) -> list[str]:
    """A warning when several sweeps given together (a glob such as `runs/sweep-nmt-small-strong-*`)
    measured the same layout of the same series (the report's `table`, labelled by `series_labels`: the same
    settings): their rows are merged into one series, which the reader should know (the README's own glob
    silently merged two sweeps)."""
    sweeps = [p for p in paths if (p / SWEEP_FILE).exists()]
    if len(sweeps) < 2:
        return []
    seen: dict[tuple, int] = {}
    for key in zip(table["label"], table["nodes"], table["gpus_per_node"]):
        seen[key] = seen.get(key, 0) + 1
    twice = sorted(f"{label} {n}x{g}" for (label, n, g), count in seen.items() if count > 1)
    if not twice:
        return []
    return [f"{len(sweeps)} sweeps given together measured the same layouts ({', '.join(twice[:4])}"
            f"{' ...' if len(twice) > 4 else ''}): their runs are merged into one series; give one sweep "
            "directory to report it alone"]


def write_report(summaries: list[LayoutSummary], runs: list[Path], out: Path,
                 extra: list[dict[str, Any]] | None = None, plots: bool = True) -> Report:
    """The scaling table of already computed summaries of `runs` (one each, in order; and `extra` columns per
    run: its dollars), written as report.md, report.json and, with `plots`, speedup.png and throughput.png.
    The series come from the runs' specs (`series_labels`), not from the summaries' labels alone."""

    # runs that differ in a setting, not only in layout, are series of their own (`series_labels`)
    table = scale_layouts(label_series(summaries, [read_spec(run_dir) for run_dir in runs]), extra=extra)
    notes = price_notes(extra or [])
    out.mkdir(parents=True, exist_ok=True)
    refuse_links(out, REPORT_FILES)
    warnings = trust_warnings(table) + emulation_warnings(runs)
    # with `plots`, write_markdown draws speedup.png and throughput.png beside report.md and links them (once:
    # they were drawn twice, a third of `launch report`'s time on ten runs); without, matplotlib is not imported
    md = write_markdown(table, out, "Scaling report", notes=[f"runs: {', '.join(str(r) for r in runs)}", *notes]
                        + [f"WARNING: {w}" for w in warnings], plots=plots)
    plot = out / "speedup.png" if plots and (out / "speedup.png").is_file() else None
    text = json.dumps(to_json_records(table), indent=2)
    (out / "report.json").write_text(text + "\n")
    (out / "warnings.json").write_text(json.dumps(warnings, indent=2) + "\n")
    return Report(table, md, plot, text, warnings, runs=list(runs), notes=notes)


def emulation_warnings(runs: list[Path]) -> list[str]:
    """Runs whose devices were emulated, so their scaling says little about real hardware: workers
    slowed by sleeping (--emulate-slowdown), or several "nodes" that were processes on one machine."""
    out = []
    for run_dir in runs:
        spec = read_spec(run_dir)
        if any(f != 1 for f in spec.emulate_slowdown or []):
            out.append(f"{run_dir}: slow workers were emulated by sleeping (--emulate-slowdown "
                       f"{','.join(f'{f:g}' for f in spec.emulate_slowdown)}); not a measurement of real mixed hardware")
        if spec.backend == "local" and spec.nodes > 1:
            out.append(f"{run_dir}: its {spec.nodes} nodes were processes on one machine (local backend); "
                       "inter-node communication was not measured")
    return out


def summarize_loaded(run, steps: pd.DataFrame | None = None) -> LayoutSummary:
    """The summary of a run already read with `runstore.load_run` (`steps`: its step table, if made already)."""
    spec = run.spec
    if run.steps.empty and spec.own_code:
        raise UnmeasuredError(unmeasured_note(run), recorded=0, warmup=0)
    if run.steps.empty:
        raise RecordError(f"{run.run_dir} has no step records: the run stopped before its first step; see {run.run_dir}/logs")
    global_batch = int(run.start["global_batch"].iloc[0]) if "global_batch" in run.start else None
    if global_batch is None and spec.own_code:  # a --script's batch: the items all ranks recorded in a step
        global_batch = int(run.steps.groupby("step")["samples"].sum().median())
    per_epoch = run.start["steps_per_epoch"].dropna() if "steps_per_epoch" in run.start else []
    meta = RunMeta(
        label=run_label(spec), nodes=spec.nodes, gpus_per_node=spec.gpus_per_node, workers=spec.workers,
        engine=spec.engine.name, rnn=None if spec.own_code else spec.rnn,  # a --script's are its own business
        precision=None if spec.own_code else spec.precision, model=spec.model, batch_mode=spec.batch_mode,
        work_scaling=spec.work_scaling, global_batch=global_batch, loss_threshold=spec.loss_threshold,
        launched_at=launched_at(run), lr_warmup_steps=spec.lr_warmup_steps,
        steps_per_epoch=int(per_epoch.iloc[0]) if len(per_epoch) else None, unit=run_unit(run),
    )
    try:
        return summarize_run(run.steps, run.val, run.events, meta, steps)
    except UnmeasuredError as exc:
        if not spec.own_code:
            raise
        raise UnmeasuredError(warmup_note(run, exc), exc.recorded, exc.warmup) from None


def run_unit(run) -> str | None:
    """What a --script run's items count: its last `unit` event (`track.unit("images")`), else its start
    record's (`samples`, track's default); None for the built-in trainer, whose throughput is words."""
    if not run.spec.own_code:
        return None
    events = run.events
    if len(events) and "event" in events.columns and "unit" in events.columns:
        named = events[events["event"] == "unit"]["unit"].dropna()
        if len(named):
            return str(named.iloc[-1])
    if "unit" in run.start.columns and run.start["unit"].notna().any():
        return str(run.start["unit"].dropna().iloc[0])
    return "samples"


def script_ends(run) -> tuple[float | None, list[int]]:
    """A --script run's wall time (the longest rank's, from its `end` events) and the ranks' exit statuses."""
    ends = run.events[run.events["event"] == "end"] if len(run.events) and "event" in run.events.columns else run.events
    walls = [float(w) for w in ends.get("wall_s", []) if w == w]
    codes = [int(c) for c in ends.get("exit_code", []) if c == c]
    return (max(walls) if walls else None), codes


def _ran(run) -> str:
    """How long a --script run ran and how it ended, for its notes ("ran 2.1 s, exit status 0")."""
    wall, codes = script_ends(run)
    ran = f"ran {wall:.3g} s" if wall is not None else "ran"
    return ran + (f", exit status {max(codes, key=abs)}" if codes else "")


def unmeasured_note(run) -> str:
    """What a report says of a --script run without step records: how long it ran, how it ended, how to measure;
    of one that failed or was cancelled, that (`not_completed_note`)."""
    from scalelab.train.track import HOW_TO_RECORD

    if failed := not_completed_note(run):
        return failed
    if used_track(run):  # it records with track: adding track is no advice; it took no step in this run
        return (f"{run.run_dir}: {run.spec.script_label} {_ran(run)} and recorded no step, though it imports "
                "scalelab.track (did it skip its training, e.g. resume from a checkpoint that another layout or run "
                "left in a folder of its own? track.checkpoint_dir is each run's own)")
    return f"{run.run_dir}: {run.spec.script_label} {_ran(run)} and has no step records; {HOW_TO_RECORD}"


def used_track(run) -> bool:
    """Whether a --script run's script used `scalelab.track`: its ranks' `end` events say it imported it
    (`imports_track`, scalelab/train/script.py), or, in runs recorded before they said so, it called
    `track.unit` or `track.validation` (its `unit` events, `val` records). Why: a report told a script that
    calls `track.step` in its loop, but resumed from another layout's checkpoint and took no step, to add it."""
    events = run.events
    if len(events) and "event" in events.columns:
        if "imports_track" in events.columns and events[events["event"] == "end"]["imports_track"].eq(True).any():
            return True
        if (events["event"] == "unit").any():
            return True
    return len(run.val) > 0


def not_completed_note(run) -> str | None:
    """What a report says of a --script run with nothing to measure that FAILED or was CANCELLED: that, its one
    line and where its output is; None for any other run. Why: a run whose rank 1 raised before any step was
    told to add `track.step` calls to be measured, as if it had run to its end with nothing recorded."""
    try:
        info = checked_state(run.launch, RunPaths(run.run_dir).launch)
    except ScalelabError:  # a damaged launch.json: the run is said as its records have it
        return None
    state = info.get("state")
    if state not in (FAILED, CANCELLED):
        return None
    said = failure_words(run.run_dir, info) if state == FAILED else str(info.get("detail") or "")
    how = "failed" if state == FAILED else "was cancelled"
    note = f"{run.run_dir}: {run.spec.script_label} {how} before it recorded a step to measure, so there is " \
        "nothing to report" + (f": {said}" if said else "")
    return note if "launch logs" in said else note + f" (its output: `launch logs {shell_word(run.run_dir)}`)"


def failure_words(run_dir: Path, info: dict[str, Any]) -> str:
    """The one line of a failed run (`info`: its launch.json), from its records as the launcher builds it: its
    ranks' own errors, else the launcher's line kept in launch.json (`error`: a rank killed by a signal), else the
    errors of ranks that only lost a peer, else the state's detail."""
    errors = sorted(read_errors(run_dir, since=info.get("launched")), key=lambda rec: float(rec.get("time", 0)))
    own = error_messages(rec for rec in errors if not rec.get("peer_lost"))
    return "; ".join(own) or str(info.get("error") or "") or "; ".join(error_messages(errors)) or \
        str(info.get("detail") or "")


def warmup_note(run, exc: UnmeasuredError) -> str:
    """What a report says of a --script run whose steps were all warm-up (or incomplete): the script decides its
    own length, so the fix is its own arguments or a lower --warmup-steps, not the trainer's --steps; of one that
    failed or was cancelled, that (`not_completed_note`)."""
    failed = not_completed_note(run)
    if failed:
        return failed
    what = "all warm-up" if exc.warmup == exc.recorded else (f"{exc.warmup} warm-up and the others not recorded by "
                                                             "every rank")
    return (f"{run.run_dir}: {run.spec.script_label} {_ran(run)} and recorded only {exc.recorded} step(s), {what} "
            f"(the first {max(1, run.spec.warmup_steps)} after every (re)start are not timed), so it has no throughput "
            "figures; run the script longer (its own arguments, after `--`) or lower --warmup-steps")


def summary_or_facts(run_dir: Path) -> LayoutSummary | dict[str, Any]:
    """A completed run's summary; for a --script run with nothing measured (no step records, or only warm-up
    steps) its facts instead: wall time, exit statuses and a note saying how to measure it. Such a run did
    what its script asked, so it is no error (the built-in trainer's is refused before it starts)."""
    run = load_run(run_dir)
    try:
        return summarize_loaded(run)
    except UnmeasuredError as exc:
        if not run.spec.own_code:
            raise
        wall, codes = script_ends(run)
        return {"label": run_label(run.spec), "model": run.spec.model, "steps_measured": 0, "wall_s": wall,
                "exit_codes": codes, "note": str(exc)}


def launched_at(run) -> float | None:
    """When the run's launch began (launch.json `started`), else its earliest `start` record (the
    start-up before it then goes uncounted), else None."""
    started = run.launch.get("started")
    if started is not None:
        return float(started)
    if len(run.start) and "time" in run.start.columns:
        return float(pd.to_numeric(run.start["time"]).min())
    return None


def _common_parent(paths: list[Path]) -> Path:
    parents = {p.resolve().parent for p in paths}
    return parents.pop() if len(parents) == 1 else Path.cwd()
