"""`--data shards`: samples from the memory-mapped shards `launch prep` wrote (scalelab/train/shard_format.py).

Why it reads the way it does:

- No tokenising at start-up: a rank opens the manifest, memory-maps its shard files and reads only
  the lengths of its samples; token ids are paged in as batches use them, so start-up costs the
  same for a thousand lines or a WMT corpus, and ranks on one node share the page cache.
- Each rank its own shards: rank r of W takes training shards r, r + W, r + 2W, ... . A rank
  draws its part of every global batch from its own shards, so a node needs only its ranks'
  files (downloaded once from s3:// into a local cache) and no rank ever reads another's.
  Epochs are cut by the same rules as in `train.data` (a shuffled order per epoch from the seed,
  length bucketing, the last partial batch dropped) applied to the rank's own samples; every rank
  runs the same number of steps per epoch, set by the rank with the fewest samples.
- One rank reads the batches `--data text` gives: the same ids (prep uses the text datasets'
  rules), the same order (same seed keys) and the same hold-out. With several ranks the global
  batch is the union of each rank's batch, so it differs from `--data text`'s for that layout.
- With `--balance dynamic` a rank whose share grows past the equal share reads on into its next
  rows, so within an epoch some of its samples may repeat (and others wait for the next epoch).
- Validation uses every validation shard on every rank, like `train.data.Dataset.valid_batches`.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scalelab.core.errors import DataError
from scalelab.core.presets import PAD_ID, ModelConfig
from scalelab.train.batch import Batch
from scalelab.train.data import Dataset, Examples, Ragged, generator_for
from scalelab.train.shard_format import (
    CONFIG_FIELDS,
    MANIFEST,
    SCALAR_COLUMNS,
    list_columns,
    parse_manifest,
)

CACHE_ENV = "SCALELAB_SHARD_CACHE"  # where shards from s3:// are kept [default: ~/.cache/scalelab/shards]


class MappedRagged(Ragged):
    """Rows of a token-list column spread over several memory-mapped shards, as one `Ragged`.

    Only lengths, shard numbers and offsets (20 bytes a sample) live in the process; `padded`
    gathers the ids of the rows asked for from each shard's mapped buffer.
    """

    def __init__(self, columns: list[Any]) -> None:
        with warnings.catch_warnings():  # the mapped buffers are read-only; nothing here writes them
            warnings.simplefilter("ignore", UserWarning)
            self.flats = [torch.from_numpy(c.values.to_numpy(zero_copy_only=True)) for c in columns]
        offsets = [c.offsets.to_numpy() for c in columns]
        super().__init__(torch.empty(0, dtype=torch.int32),
                         torch.from_numpy(np.concatenate([np.diff(o) for o in offsets]).astype(np.int64)))
        self.shard = torch.from_numpy(np.concatenate([np.full(len(o) - 1, i, np.int32) for i, o in enumerate(offsets)]))
        self.start = torch.from_numpy(np.concatenate([o[:-1] for o in offsets]).astype(np.int64))

    def padded(self, indices: Tensor, width: int) -> Tensor:
        steps = torch.arange(width).unsqueeze(0)
        keep = steps < self.lengths[indices].unsqueeze(1)
        out = torch.full(keep.shape, PAD_ID, dtype=torch.long)
        shards = self.shard[indices]
        for s in torch.unique(shards).tolist():
            rows = (shards == s).nonzero().squeeze(1)
            pos = torch.where(keep[rows], self.start[indices[rows]].unsqueeze(1) + steps, 0)
            out[rows] = self.flats[s][pos].long().masked_fill_(~keep[rows], PAD_ID)
        return out


def load_examples(root: Path, family: str, shards: list[dict[str, Any]]) -> Examples:
    """The samples of `shards` (manifest entries), memory-mapped."""
    import pyarrow as pa

    if not shards:
        raise DataError(f"{root / MANIFEST} lists no shard for a split the run needs: re-run launch prep")
    batches = []
    for entry in shards:
        path = root / entry["file"]
        if not path.is_file():
            raise DataError(f"shard {path} listed in {root / MANIFEST} is missing: copy it back or re-run launch prep")
        batches.append(pa.ipc.open_file(pa.memory_map(str(path))).get_batch(0))
    cols = {c: MappedRagged([b.column(c) for b in batches]) for c in list_columns(family)}
    if family == "sentiment":
        labels = np.concatenate([b.column(SCALAR_COLUMNS[0]).to_numpy() for b in batches]).astype(np.int64)
        cols["labels"] = torch.from_numpy(labels)
    return Examples(family, **cols)


class _RankPool(Dataset):
    """One rank's training samples seen as a dataset whose "global batch" is the rank's share:
    `train.data.Dataset` then cuts its epochs. Every rank's pool agrees on the steps per epoch."""

    def __init__(self, examples: Examples, seed: int, bucket_batches: int, counts: list[int]) -> None:
        super().__init__()
        self.family, self.seed, self.bucket_batches = examples.family, seed, bucket_batches
        self._train = self._valid = examples
        self.counts = counts

    def steps_per_epoch(self, global_batch: int) -> int:
        fewest = min(self.counts)
        if fewest < global_batch:
            rank = self.counts.index(fewest)
            raise DataError(
                f"rank {rank}'s shards hold {fewest} training samples, fewer than its batch of {global_batch}: "
                "prep with a smaller --shard-size (more shards), or use fewer ranks or a smaller batch"
            )
        return fewest // global_batch


class ShardDataset(Dataset):
    """Training and validation samples from a shards directory (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, seed: int, directory: str, rank: int = 0, world: int = 1,
                 bucket_batches: int = 0) -> None:
        super().__init__()
        root, manifest = open_shards(directory, rank, world)
        _check_config(manifest, cfg, root)
        self.family, self.seed, self.bucket_batches = cfg.family, seed, bucket_batches
        self.rank, self.world = rank, world
        train = manifest["splits"]["train"]["shards"]
        if len(train) < world:
            raise DataError(f"{root} has {len(train)} training shard(s), fewer than the {world} ranks that each read "
                            "their own: re-run launch prep with a smaller --shard-size, or use fewer ranks")
        self.labels = list(manifest.get("labels", []))
        sizes = [v["size"] for v in manifest["vocab"].values()]
        self.vocab_size = max(sizes)
        self._train = load_examples(root, cfg.family, train[rank::world])
        self._valid = load_examples(root, cfg.family, manifest["splits"]["valid"]["shards"])
        counts = [sum(s["samples"] for s in train[r::world]) for r in range(world)]
        # One rank keeps the run's seed, so its batches are those of `--data text`.
        pool_seed = seed if world == 1 else generator_for(seed, "shards", rank, world).initial_seed()
        self._pool = _RankPool(self._train, pool_seed, bucket_batches, counts)

    def model_overrides(self) -> dict[str, Any]:
        extra = {"num_classes": len(self.labels)} if self.family == "sentiment" else {}
        return {"vocab_size": self.vocab_size, **extra}

    def steps_per_epoch(self, global_batch: int) -> int:
        if global_batch <= 0:
            raise DataError(f"global batch must be positive, got {global_batch}")
        return self._pool.steps_per_epoch(max(global_batch // self.world, 1))

    def get_batch(self, epoch: int, step_in_epoch: int, global_batch: int, start: int, stop: int) -> Batch:
        """This rank's `stop - start` samples of step `step_in_epoch`, from its own shards (the
        slice bounds only size the batch; `meta["indices"]` are positions among the rank's samples)."""
        if not 0 <= start < stop <= global_batch:
            raise ValueError(f"bad slice [{start}, {stop}) of a global batch of {global_batch}")
        share = max(global_batch // self.world, 1)
        rows = self._pool._epoch_layout(epoch, share)
        if not 0 <= step_in_epoch < rows.size(0):
            raise IndexError(f"step {step_in_epoch} outside epoch of {rows.size(0)} steps")
        want = stop - start
        if want <= share:
            index = rows[step_in_epoch, :want]
        else:
            flat = rows.reshape(-1)
            index = flat[(step_in_epoch * share + torch.arange(want)) % flat.numel()]
        batch = self.train.batch(index)
        batch.meta.update(epoch=epoch, step_in_epoch=step_in_epoch, indices=index)
        return batch


def _check_config(manifest: dict[str, Any], cfg: ModelConfig, root: Path) -> None:
    """The shards must have been cut for this model family, lengths and vocabulary limit."""
    if manifest["family"] != cfg.family:
        raise DataError(f"{root} holds {manifest['family']} shards, but model family is {cfg.family}: "
                        f"prep the corpus with launch prep --model for this model")
    differ = [f"{k} {manifest['config'].get(k)} (shards) vs {getattr(cfg, k)} (model)"
              for k in CONFIG_FIELDS[cfg.family] if manifest["config"].get(k) != getattr(cfg, k)]
    if differ:
        raise DataError(f"{root} was prepped for {manifest.get('model')} and differs from this model in "
                        f"{', '.join(differ)}: re-run launch prep --model with the same preset and --model-arg")


def open_shards(directory: str, rank: int = 0, world: int = 1) -> tuple[Path, dict[str, Any]]:
    """(local directory, manifest); a remote directory (s3://...) is first copied into the cache,
    only the files this rank reads (its training shards, the validation shards, the manifest)."""
    if "://" not in directory or directory.startswith("file://"):
        root = Path(directory.removeprefix("file://"))
        path = root / MANIFEST
        if not path.is_file():
            raise DataError(f"{directory} holds no {MANIFEST}: it is not a shards directory (or its prep did not "
                            "finish); run launch prep --out DIR first")
        return root, parse_manifest(path.read_text(), str(path))
    import fsspec

    fs, base = fsspec.core.url_to_fs(directory)
    default = Path.home() / ".cache" / "scalelab" / "shards"
    root = Path(os.environ.get(CACHE_ENV) or default) / hashlib.sha256(directory.encode()).hexdigest()[:16]
    root.mkdir(parents=True, exist_ok=True)
    try:
        text = fs.cat_file(f"{base.rstrip('/')}/{MANIFEST}").decode()
    except FileNotFoundError:
        raise DataError(f"{directory} holds no {MANIFEST}: run launch prep --out {directory} first") from None
    manifest = parse_manifest(text, f"{directory}/{MANIFEST}")
    wanted = manifest["splits"]["train"]["shards"][rank::world] + manifest["splits"]["valid"]["shards"]
    for entry in wanted:
        _fetch(fs, f"{base.rstrip('/')}/{entry['file']}", root / entry["file"], entry["sha256"])
    (root / MANIFEST).write_text(text)
    return root, manifest


def _fetch(fs: Any, remote: str, local: Path, sha256: str) -> None:
    """Copy `remote` to `local` unless an intact copy is there; a partial download never replaces it."""
    if local.is_file() and _sha256(local) == sha256:
        return
    part = local.with_name(f".{local.name}.{os.getpid()}.part")
    fs.get_file(remote, str(part))
    if _sha256(part) != sha256:
        part.unlink()
        raise DataError(f"{remote} does not match the SHA-256 in its manifest: the shards changed after prep")
    os.replace(part, local)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
