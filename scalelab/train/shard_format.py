"""The on-disk format of prepared shards: written by `launch prep`, read by `--data shards`.

A shards directory holds:

- `manifest.json`: what the shards are (family, the model lengths and vocabulary limit they were
  cut for, vocabularies, labels) and, per split, every shard file with its sample and token counts
  and SHA-256. It is written last, so a directory without one is an unfinished prep. It holds no
  times, hosts or worker counts: the same corpus and options give the same manifest, byte for byte.
- `train-NNNNN.arrow`, `valid-NNNNN.arrow`: Arrow IPC files (uncompressed, one record batch), so a
  reader memory-maps them and touches only the pages of the samples it uses. Columns per family
  are `COLUMNS`: lists of int32 token ids, and for sentiment an int32 `label`.
- `vocab*.txt`: one `TOKEN<TAB>COUNT` line per id, in id order (specials first, count 0).

Every train shard but the last holds exactly `shard_size` samples. This module is the single
definition of the format and imports neither PyTorch nor (until asked) pyarrow, so the Dask
workers of `launch prep` can use it without loading the trainer.
"""

from __future__ import annotations

import json
from typing import Any

from scalelab.core.errors import DataError

FORMAT = "scalelab-shards"
VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "valid")

#: Columns of a shard, per family: token-id lists first, then scalar columns.
COLUMNS: dict[str, tuple[str, ...]] = {"nmt": ("src", "tgt"), "rnnlm": ("seq",), "sentiment": ("seq", "label")}
SCALAR_COLUMNS = ("label",)

#: Vocabularies per family (name -> file); nmt has one per side, as `--data text` builds them.
VOCAB_FILES: dict[str, dict[str, str]] = {
    "nmt": {"src": "vocab.src.txt", "tgt": "vocab.tgt.txt"},
    "rnnlm": {"tokens": "vocab.txt"},
    "sentiment": {"tokens": "vocab.txt"},
}

#: Model fields that decide what a shard holds (truncation, window length, vocabulary limit).
CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "nmt": ("vocab_size", "src_len", "tgt_len"),
    "rnnlm": ("vocab_size", "seq_len"),
    "sentiment": ("vocab_size", "seq_len"),
}


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.arrow"


def list_columns(family: str) -> tuple[str, ...]:
    return tuple(c for c in COLUMNS[family] if c not in SCALAR_COLUMNS)


def schema(family: str):
    """The Arrow schema of a shard of `family` (pyarrow is imported here, not at module load)."""
    import pyarrow as pa

    fields = [pa.field(c, pa.int32() if c in SCALAR_COLUMNS else pa.list_(pa.int32()), nullable=False)
              for c in COLUMNS[family]]
    return pa.schema(fields)


def parse_manifest(text: str, where: str) -> dict[str, Any]:
    """The manifest as a dict, checked for the fields readers rely on; DataError names `where`."""
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}): re-run launch prep") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{where} is not a scalelab shards manifest (no \"format\": \"{FORMAT}\")")
    if manifest.get("version") != VERSION:
        raise DataError(f"{where} has format version {manifest.get('version')!r}; this scalelab reads version "
                        f"{VERSION}: re-run launch prep with this version")
    missing = [k for k in ("family", "config", "shard_size", "splits", "vocab") if k not in manifest]
    if missing or set(manifest.get("splits", {})) != set(SPLITS):
        raise DataError(f"{where} lacks {', '.join(missing) or 'the train and valid splits'}: re-run launch prep")
    return manifest
