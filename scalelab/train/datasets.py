"""The dataset factory: one entry point over the synthetic, task, text and shards datasets.

It lives apart from `train.data` (the base classes and generated datasets) and `train.text` (file
datasets built on those base classes) so that both import downward only.
"""

from __future__ import annotations

from typing import Any

from scalelab.core.errors import SpecError
from scalelab.core.presets import ModelConfig
from scalelab.core.spec import DATA_KINDS
from scalelab.train.data import Dataset, SyntheticDataset, TaskDataset
from scalelab.train.text import build_text_dataset

# The options each data kind (core.spec.DATA_KINDS, the one list of them) takes here.
_OPTIONS = {
    "synthetic": ("num_samples", "num_valid", "global_batch"),
    "task": ("num_train", "num_valid", "fixed_length", "bucket_batches"),
    "text": ("valid_fraction", "bucket_batches"),
    "shards": ("directory", "rank", "world", "bucket_batches"),
}
assert tuple(_OPTIONS) == DATA_KINDS, "a data kind in core.spec.DATA_KINDS needs its options here"


def build_dataset(
    kind: str, cfg: ModelConfig, seed: int, paths: dict[str, str] | None = None, **opts: Any
) -> Dataset:
    """The dataset of `kind` ("synthetic", "task", "text" or "shards") for `cfg.family`.

    `paths` is used by "text" only (see `train.text` for the keys of each family); "shards" reads
    the `directory` written by `launch prep`, this `rank`'s shards of `world` (see `train.shards`).
    For text and shards data the vocabulary may be smaller than `cfg.vocab_size`: apply
    `dataset.model_overrides()` to the model config before building the model.
    """
    if kind not in DATA_KINDS:
        raise SpecError(f"unknown data kind {kind!r}: use one of {', '.join(DATA_KINDS)}")
    unknown = sorted(set(opts) - set(_OPTIONS[kind]))
    if unknown:
        raise SpecError(
            f"unknown option(s) {', '.join(unknown)} for {kind} data: valid options are "
            f"{', '.join(_OPTIONS[kind])}"
        )
    if kind == "synthetic":
        return SyntheticDataset(cfg, seed, **opts)
    if kind == "task":
        return TaskDataset(cfg, seed, **opts)
    if kind == "shards":
        from scalelab.train.shards import ShardDataset  # pyarrow only where shards are read

        return ShardDataset(cfg, seed, **opts)
    return build_text_dataset(cfg, seed, paths or {}, **opts)
