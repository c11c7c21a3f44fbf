"""The shape of a study file, checked part by part before any of it is used.

Why: `launch study` refused a misspelt top-level key but read the parts below it as they came, so a
list where a mapping belongs (`scales: [1]`, `scales: {cpu: [1]}`) ended in a TypeError or
AttributeError traceback, text where a list belongs (`scales: abc`) was read letter by letter, and a
misspelt key inside a scale (`scales.cpu.layots`), `market: nope` or `title: 5` were ignored with
exit 0. Here every part is checked where it is written, and a wrong one is one SpecError naming its
path in the file (`scales.cpu.layots`), what it must be and what was found. What the parts mean (a
spec's settings, a table's name, a gemm option's values) is checked where they are used
(`launcher.study.load_study`); this module checks only that each is the kind of thing it must be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from scalelab.core.errors import SpecError
from scalelab.costs.billing import Mix
from scalelab.costs.catalog import MARKETS, CatalogError
from scalelab.launcher.sweep import _LAYOUT  # NODESxGPUS, as --layouts and a study's layouts are parsed

STUDY_KEYS = {"title", "seed_scale", "base", "mode", "layouts", "variants", "tables", "scales", "instances",
              "market", "epochs_shown", "kind", "gemm"}
SCALE_KEYS = STUDY_KEYS - {"scales"}  # a scale replaces top-level parts (base is merged into the file's)
VARIANT_KEYS = {"label", "set", "layouts", "instances"}


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _market(value: Any) -> bool:
    return value in MARKETS


#: key -> (test, what it must be): the parts whose check is their kind alone
SIMPLE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "title": (_text, "text, e.g. title: \"Seed 002: RNNLM strong vs weak scaling\""),
    "seed_scale": (_text, "text: the scale the seed ran at, in words"),
    "mode": (_text, "text: strong or weak"),
    "kind": (_text, "text: scaling or gemm"),
    "tables": (_texts, "a list of table names, e.g. tables: [throughput]"),
    "epochs_shown": (_positive, "a whole number of at least 1, e.g. epochs_shown: 3"),
    "market": (_market, f"one of {', '.join(MARKETS)}"),
    "base": (lambda v: isinstance(v, dict), "a mapping of spec settings, e.g. base: {model: rnnlm-small}"),
    "gemm": (lambda v: isinstance(v, dict), "a mapping of gemm options, e.g. gemm: {hiddens: [256, 512]}"),
}


def check_study_file(raw: dict[str, Any], path: Path) -> None:
    """Refuse (SpecError) the first part of the study file `raw` (read from `path`) that is not the kind it
    must be, or a key that is not read where it is written; every scale is checked, not only the one asked."""
    _check_parts(raw, path, "", STUDY_KEYS)
    scales = raw.get("scales", {})
    if not isinstance(scales, dict):
        raise SpecError(f"scales in {path} must be a mapping of scale names to their settings, e.g. "
                        f"scales: {{test: {{base: {{steps: 4}}}}, cpu: {{}}}}; got {scales!r}")
    for name, patch in scales.items():
        if not isinstance(name, str):
            raise SpecError(f"scales in {path} has a scale named {name!r}: name each scale with text (quote it, "
                            f"\"{name}\"), as `--scale` gives it")
        if not isinstance(patch, dict):
            raise SpecError(f"scales.{name} in {path} must be a mapping of the settings the scale changes "
                            f"({', '.join(sorted(SCALE_KEYS))}), got {patch!r}; write {name}: {{}} for the file "
                            "as it is")
        _check_parts(patch, path, f"scales.{name}.", SCALE_KEYS)


def _check_parts(raw: dict[str, Any], path: Path, where: str, valid: set[str]) -> None:
    """The keys of one level (the file's top, or a scale; `where` is its path prefix) and each part's kind."""
    unknown = sorted(str(k) for k in set(raw) - valid)
    if unknown:
        raise SpecError(f"unknown key(s) in {path}: {', '.join(where + k for k in unknown)}; valid"
                        f"{' in a scale' if where else ''}: {', '.join(sorted(valid))}")
    for key, (test, must) in SIMPLE.items():
        if key in raw and not test(raw[key]):
            raise SpecError(f"{where}{key} in {path} must be {must}; got {raw[key]!r}")
    if "layouts" in raw:
        _check_layouts(raw["layouts"], path, f"{where}layouts")
    if "instances" in raw:
        _check_instances(raw["instances"], path, f"{where}instances")
    if "variants" in raw:
        _check_variants(raw["variants"], path, f"{where}variants")


def _check_layouts(value: Any, path: Path, name: str) -> None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and _LAYOUT.match(v) for v in value):
        raise SpecError(f"{name} in {path} must be a non-empty list of NODESxGPUS layouts, e.g. [1x1, 1x2]; "
                        f"got {value!r}")


def _check_instances(value: Any, path: Path, name: str) -> None:
    """Layout -> instance mix (the money table's): the mix's grammar is checked here, its types when priced."""
    example = "e.g. instances: {1x1: 1*g3.4xlarge, 1x2: 1*p2.xlarge+1*g3.4xlarge}"
    if not isinstance(value, dict):
        raise SpecError(f"{name} in {path} must be a mapping of layouts to instance mixes, {example}; got {value!r}")
    for layout, mix in value.items():
        if not isinstance(layout, str) or not _LAYOUT.match(layout) or not isinstance(mix, str):
            raise SpecError(f"{name} in {path} must map NODESxGPUS layouts to instance mixes, {example}; "
                            f"got {layout!r}: {mix!r}")
        try:
            Mix.parse(mix)
        except CatalogError as exc:
            raise SpecError(f"{name}.{layout} in {path}: {exc}") from None


def _check_variants(value: Any, path: Path, name: str) -> None:
    """Each variant's parts (`launcher.study._variants` reads them: label, set, layouts, instances)."""
    if not isinstance(value, list) or not value:
        raise SpecError(f"{name} in {path} must be a non-empty list of {{label, set}} entries, got {value!r}; "
                        "give at least one variant, or leave the key out to run the base alone")
    for i, variant in enumerate(value):
        here = f"{name}[{i}]"
        if not isinstance(variant, dict) or "label" not in variant:
            raise SpecError(f"{here} in {path} must be a mapping with a label (and set, layouts, instances), e.g. "
                            f"{{label: ddp, set: {{engine: {{name: ddp}}}}}}; got {variant!r}")
        unknown = sorted(str(k) for k in set(variant) - VARIANT_KEYS)
        if unknown:
            raise SpecError(f"unknown key(s) in {path}: {', '.join(f'{here}.{k}' for k in unknown)}; valid in a "
                            f"variant: {', '.join(sorted(VARIANT_KEYS))}")
        if "set" in variant and not isinstance(variant["set"], dict):
            raise SpecError(f"{here}.set in {path} must be a mapping of spec settings, e.g. set: {{rnn: fused}}; "
                            f"got {variant['set']!r}")
        if "layouts" in variant:
            _check_layouts(variant["layouts"], path, f"{here}.layouts")
        if "instances" in variant:
            _check_instances(variant["instances"], path, f"{here}.instances")
