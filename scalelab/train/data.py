"""Datasets that hand out the global batch as a pure function of (seed, epoch, step).

Why this shape: in data parallelism every rank must train on its own, disjoint part of the same
global batch. If the global batch is a deterministic function of (seed, epoch, step), each rank
computes it and takes its slice `[start, stop)` without talking to the others; a run resumed at
step k sees exactly the batches an uninterrupted run would; and two engines (or two layouts) with
the same seed and global batch train on the same data, so their times-to-accuracy are comparable.

A global batch is padded to its own longest sample (not to each rank's slice), so the rank slices
of one step have the same shapes and concatenate back to the global batch.

Token ids: 0 pad, 1 unk, 2 bos, 3 eos; real tokens start at 4. Text files are read in
`scalelab/train/text.py`; this module holds the base class, the generated datasets, the prefetcher and the
`build_dataset` factory.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from abc import ABC
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from scalelab.core.errors import DataError, SpecError
from scalelab.core.spec import synthetic_pool_size
from scalelab.train.batch import Batch
from scalelab.train.models import BOS_ID, EOS_ID, NUM_SPECIALS, PAD_ID, ModelConfig


def generator_for(seed: int, *keys: object) -> torch.Generator:
    """A CPU generator seeded from `seed` and `keys` (e.g. "epoch", 3), stable across processes.

    Python's `hash` is salted per process, so the keys are mixed with SHA-256 instead.
    """
    text = ":".join(str(k) for k in (seed, *keys)).encode()
    value = int.from_bytes(hashlib.sha256(text).digest()[:8], "little") & ((1 << 63) - 1)
    return torch.Generator().manual_seed(value)


# --------------------------------------------------------------------------------------------
# Examples: the in-memory form of a split, and how batches are cut from it
# --------------------------------------------------------------------------------------------


class Ragged:
    """Variable-length id sequences stored back to back as int32.

    Memory is the number of tokens, not samples x longest sample: a WMT-sized corpus padded to
    100 tokens would take several times more, in every rank's process.
    """

    def __init__(self, flat: Tensor, lengths: Tensor) -> None:
        self.flat = flat.to(torch.int32)
        self.lengths = lengths.to(torch.long)
        self.offsets = torch.cumsum(self.lengths, 0) - self.lengths

    @classmethod
    def from_padded(cls, padded: Tensor, lengths: Tensor) -> "Ragged":
        keep = torch.arange(padded.size(1)).unsqueeze(0) < lengths.unsqueeze(1)
        return cls(padded[keep], lengths)

    @classmethod
    def from_lists(cls, rows: list[list[int]]) -> "Ragged":
        flat = torch.tensor([i for row in rows for i in row], dtype=torch.int32)
        return cls(flat, torch.tensor([len(row) for row in rows], dtype=torch.long))

    def __len__(self) -> int:
        return self.lengths.numel()

    def padded(self, indices: Tensor, width: int) -> Tensor:
        """Rows `indices` as a [n, width] long tensor, pad id beyond each length."""
        steps = torch.arange(width).unsqueeze(0)
        keep = steps < self.lengths[indices].unsqueeze(1)
        if self.flat.numel() == 0:
            return torch.full(keep.shape, PAD_ID, dtype=torch.long)
        pos = torch.where(keep, self.offsets[indices].unsqueeze(1) + steps, 0)
        return self.flat[pos].long().masked_fill_(~keep, PAD_ID)


class Examples:
    """One split of a dataset; `batch(indices)` builds a `Batch` from it.

    Family layouts:
    - nmt: `src` and `tgt` (target words, without bos/eos).
    - rnnlm: `seq`, chunks of up to seq_len + 1 tokens; inputs are `seq[:-1]`, targets `seq[1:]`.
    - sentiment: `seq` and `labels` [N].
    """

    def __init__(
        self,
        family: str,
        src: Ragged | None = None,
        tgt: Ragged | None = None,
        seq: Ragged | None = None,
        labels: Tensor | None = None,
    ) -> None:
        self.family = family
        self.src, self.tgt, self.seq, self.labels = src, tgt, seq, labels
        main = src if family == "nmt" else seq
        assert main is not None
        self.size = len(main)

    def __len__(self) -> int:
        return self.size

    def sort_key(self) -> Tensor:
        """Per-sample length used for bucketing: the padding a sample forces on its batch."""
        if self.family == "nmt":
            return self.src.lengths + self.tgt.lengths  # type: ignore[union-attr]
        return self.seq.lengths  # type: ignore[union-attr]

    def max_lengths(self, indices: Tensor) -> dict[str, int]:
        """Padded lengths a batch of `indices` needs (the decoder length includes the eos)."""
        if self.family == "nmt":
            return {"src": int(self.src.lengths[indices].max()),  # type: ignore[union-attr]
                    "tgt": int(self.tgt.lengths[indices].max()) + 1}  # type: ignore[union-attr]
        return {"seq": int(self.seq.lengths[indices].max())}  # type: ignore[union-attr]

    def batch(self, indices: Tensor, pad_to: dict[str, int] | None = None) -> Batch:
        """Gather `indices` into a Batch, padded to `pad_to` (default: their own longest)."""
        pad_to = pad_to or self.max_lengths(indices)
        n = indices.numel()
        if self.family == "nmt":
            assert self.src is not None and self.tgt is not None
            T = pad_to["tgt"]
            words = self.tgt.padded(indices, T - 1)
            tgt_in = torch.full((n, T), PAD_ID, dtype=torch.long)
            tgt_in[:, 0] = BOS_ID
            tgt_in[:, 1:] = words
            tgt_out = torch.full((n, T), PAD_ID, dtype=torch.long)
            tgt_out[:, : T - 1] = words
            tgt_out[torch.arange(n), self.tgt.lengths[indices]] = EOS_ID
            inputs = {
                "src": self.src.padded(indices, pad_to["src"]),
                "src_lengths": self.src.lengths[indices],
                "tgt_in": tgt_in,
                "tgt_out": tgt_out,
            }
            return Batch(inputs, samples=n, words=int((tgt_out != PAD_ID).sum()))
        assert self.seq is not None
        seq = self.seq.padded(indices, pad_to["seq"])
        if self.family == "rnnlm":
            tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
            return Batch({"tokens": tokens, "targets": targets}, samples=n,
                         words=int((targets != PAD_ID).sum()))
        assert self.labels is not None
        lengths = self.seq.lengths[indices]
        inputs = {"tokens": seq, "lengths": lengths, "labels": self.labels[indices]}
        return Batch(inputs, samples=n, words=int(lengths.sum()))


# --------------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------------


class Dataset(ABC):
    """Training and validation data addressed by (epoch, step); see the module docstring.

    Subclasses set `family`, `vocab_size`, `seed`, `bucket_batches` and provide `train` and
    `valid` `Examples`. `bucket_batches` > 0 turns on length bucketing: within each epoch's
    shuffled order, chunks of that many global batches are sorted by length and cut into batches,
    and the order of all batches is then shuffled (deterministically), so a batch holds samples of
    similar length and is padded less.
    """

    family: str
    vocab_size: int
    seed: int
    bucket_batches: int = 0

    def __init__(self) -> None:
        self._layout_key: tuple[int, int] | None = None
        self._layout: Tensor | None = None
        self._valid_cache: dict[tuple[int, int, int, int | None], list[Batch]] = {}

    _train: Examples  # set by every subclass's constructor
    _valid: Examples

    @property
    def train(self) -> Examples:
        return self._train

    @property
    def valid(self) -> Examples:
        return self._valid

    @property
    def num_train(self) -> int:
        return len(self.train)

    def model_overrides(self) -> dict[str, Any]:
        """Model fields the data fixes (the built vocabulary size, the number of labels)."""
        return {"vocab_size": self.vocab_size}

    def steps_per_epoch(self, global_batch: int) -> int:
        """Full global batches per epoch; the last partial batch is dropped."""
        if global_batch <= 0:
            raise SpecError(f"global batch must be positive, got {global_batch}")
        if self.num_train < global_batch:
            raise DataError(
                f"the {self.family} training set has {self.num_train} samples, fewer than one "
                f"global batch of {global_batch}: use more training data or a smaller batch"
            )
        return self.num_train // global_batch

    def _epoch_layout(self, epoch: int, global_batch: int) -> Tensor:
        """[steps, G] sample indices of every global batch of `epoch`.

        Cached for the last (epoch, batch) asked, since a run walks through one epoch at a time.
        """
        key = (epoch, global_batch)
        if self._layout_key == key and self._layout is not None:
            return self._layout
        steps = self.steps_per_epoch(global_batch)
        order = torch.randperm(self.num_train, generator=generator_for(self.seed, "epoch", epoch))
        order = order[: steps * global_batch]
        if self.bucket_batches > 0:
            lengths = self.train.sort_key()
            chunk = self.bucket_batches * global_batch
            parts = []
            for begin in range(0, order.numel(), chunk):
                part = order[begin : begin + chunk]
                part = part[torch.sort(lengths[part], stable=True).indices]
                parts.append(part)
            batches = torch.cat(parts).view(steps, global_batch)
            shuffle = torch.randperm(steps, generator=generator_for(self.seed, "batches", epoch))
            batches = batches[shuffle]
        else:
            batches = order.view(steps, global_batch)
        self._layout_key, self._layout = key, batches
        return batches

    def get_batch(
        self, epoch: int, step_in_epoch: int, global_batch: int, start: int, stop: int
    ) -> Batch:
        """Samples [start, stop) of global batch `step_in_epoch` of `epoch`, on the CPU.

        Rank r of W with equal shares asks for start=r*G/W, stop=(r+1)*G/W. Padding follows the
        whole global batch, so slices of one step share shapes. `meta` records `epoch`,
        `step_in_epoch` and the training-sample `indices`.
        """
        if not 0 <= start < stop <= global_batch:
            raise ValueError(f"bad slice [{start}, {stop}) of a global batch of {global_batch}")
        batches = self._epoch_layout(epoch, global_batch)
        if not 0 <= step_in_epoch < batches.size(0):
            raise IndexError(f"step {step_in_epoch} outside epoch of {batches.size(0)} steps")
        whole = batches[step_in_epoch]
        batch = self.train.batch(whole[start:stop], self.train.max_lengths(whole))
        batch.meta.update(epoch=epoch, step_in_epoch=step_in_epoch, indices=whole[start:stop])
        return batch

    def valid_batches(self, batch_size: int, rank: int, world: int, max_batches: int | None = None) -> list[Batch]:
        """This rank's shard of the validation set, in batches of at most `batch_size`.

        The set is cut into `world` equal contiguous shards (the last `len % world` samples are
        left out), so every rank gets the same number of batches; a shard's last batch may be
        smaller, which is why each Batch carries its `samples` and `words` for weighting.
        `max_batches` keeps only the first ones (only those are built: validation sets can be large).
        """
        if batch_size <= 0 or world <= 0 or not 0 <= rank < world:
            raise ValueError(f"bad validation request: batch {batch_size}, rank {rank}/{world}")
        n = len(self.valid)
        per_rank = n // world
        if per_rank == 0:
            raise DataError(
                f"the {self.family} validation set has {n} samples, fewer than the {world} ranks "
                f"that must share it: use a larger validation set"
            )
        key = (batch_size, rank, world, max_batches)
        if key not in self._valid_cache:
            first = rank * per_rank
            starts = range(0, per_rank, batch_size)[:max_batches]
            self._valid_cache[key] = [
                self.valid.batch(torch.arange(first + b, first + min(b + batch_size, per_rank))) for b in starts
            ]
        return self._valid_cache[key]


def iterate_batches(
    dataset: Dataset,
    global_batch: int,
    start: int,
    stop: int,
    first_step: int = 0,
    num_steps: int | None = None,
) -> Iterator[Batch]:
    """This rank's batches from global step `first_step` (0-based) on, across epochs.

    Resuming is `first_step = steps already done`; `meta["step"]` is the 0-based global step.
    """
    per_epoch = dataset.steps_per_epoch(global_batch)
    step = first_step
    while num_steps is None or step < first_step + num_steps:
        batch = dataset.get_batch(step // per_epoch, step % per_epoch, global_batch, start, stop)
        batch.meta["step"] = step
        yield batch
        step += 1


# --------------------------------------------------------------------------------------------
# Generated data
# --------------------------------------------------------------------------------------------


def _lengths(n: int, max_len: int, fixed: bool, gen: torch.Generator) -> Tensor:
    """Lengths uniform in [max_len // 2, max_len] (at least 1), or all `max_len` when fixed."""
    if fixed:
        return torch.full((n,), max_len, dtype=torch.long)
    return torch.randint(max(max_len // 2, 1), max_len + 1, (n,), generator=gen)


def _random_examples(cfg: ModelConfig, n: int, gen: torch.Generator) -> Examples:
    """Uniformly random full-length samples: the shapes of real data, nothing to learn."""
    V = cfg.vocab_size

    def full(length: int) -> Ragged:
        ids = torch.randint(NUM_SPECIALS, V, (n, length), generator=gen)
        return Ragged(ids.flatten(), torch.full((n,), length, dtype=torch.long))

    if cfg.family == "nmt":
        return Examples("nmt", src=full(cfg.src_len), tgt=full(cfg.tgt_len - 1))
    if cfg.family == "rnnlm":
        return Examples("rnnlm", seq=full(cfg.seq_len + 1))
    seq = full(cfg.seq_len)
    return Examples("sentiment", seq=seq,
                    labels=torch.randint(0, cfg.num_classes, (n,), generator=gen))


class SyntheticDataset(Dataset):
    """Random full-length samples for throughput runs (the seeds' `--use_synthetic_data`).

    One pool is generated and indexed into, so producing a batch costs a gather; every target
    token counts as a word. The pool holds `num_samples` samples or, by default,
    max(4 * global batch, 1024): it is sized for the global batch first asked of
    `steps_per_epoch`/`get_batch` (regenerated, deterministically, if another is asked), so any
    batch works without the caller sizing the pool.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        seed: int,
        num_samples: int | None = None,
        num_valid: int = 256,
        global_batch: int | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.family, self.vocab_size, self.seed = cfg.family, cfg.vocab_size, seed
        self._num_samples = num_samples
        self._train = self._pool(global_batch or cfg.default_batch)
        self._valid = _random_examples(cfg, num_valid, generator_for(seed, "synthetic", "valid"))

    def _pool(self, global_batch: int) -> Examples:
        size = self._num_samples or synthetic_pool_size(global_batch)
        return _random_examples(self.cfg, size, generator_for(self.seed, "synthetic", "train"))

    def steps_per_epoch(self, global_batch: int) -> int:
        if self._num_samples is None and global_batch > 0:
            if len(self._train) != synthetic_pool_size(global_batch):
                self._train = self._pool(global_batch)
                self._layout_key = None
        elif 0 < len(self._train) < global_batch:
            raise DataError(
                f"the synthetic pool has {len(self._train)} samples, fewer than one global batch "
                f"of {global_batch}: raise num_samples or leave it unset"
            )
        return super().steps_per_epoch(global_batch)


def _task_examples(cfg: ModelConfig, n: int, fixed: bool, gen: torch.Generator) -> Examples:
    """Learnable samples; see `TaskDataset`."""
    V, R = cfg.vocab_size, cfg.vocab_size - NUM_SPECIALS  # R real tokens
    if cfg.family == "nmt":
        src_len = _lengths(n, cfg.src_len, fixed, gen)
        src = torch.randint(NUM_SPECIALS, V, (n, cfg.src_len), generator=gen)
        mapped = ((_reverse_rows(src, src_len) - NUM_SPECIALS) * 7 + 3) % R + NUM_SPECIALS
        W = cfg.tgt_len - 1
        if W > cfg.src_len:
            mapped = torch.cat([mapped, mapped.new_zeros(n, W - cfg.src_len)], 1)
        tgt_len = src_len.clamp(max=W)
        return Examples("nmt", src=Ragged.from_padded(src, src_len),
                        tgt=Ragged.from_padded(mapped[:, :W], tgt_len))
    if cfg.family == "rnnlm":
        L = cfg.seq_len + 1
        start = torch.randint(0, R, (n, 1), generator=gen)
        strides = torch.tensor([1, 2, 3, 5])
        stride = strides[torch.randint(0, len(strides), (n, 1), generator=gen)]
        seq = (start + stride * torch.arange(L).unsqueeze(0)) % R + NUM_SPECIALS
        return Examples("rnnlm", seq=Ragged(seq.flatten(), torch.full((n,), L, dtype=torch.long)))
    L = cfg.seq_len
    seq_len = _lengths(n, L, fixed, gen)
    third = max(R // 3, 1)
    # Each document leans one way: 70% of its sentiment-bearing tokens have one polarity.
    lean = torch.rand(n, 1, generator=gen) < 0.5
    bearing = torch.rand(n, L, generator=gen) < 0.5
    positive = torch.where(lean, 0.7, 0.3) > torch.rand(n, L, generator=gen)
    offset = torch.randint(0, third, (n, L), generator=gen)
    neutral = torch.randint(2 * third, max(R, 2 * third + 1), (n, L), generator=gen)
    real = torch.where(bearing, torch.where(positive, offset, third + offset), neutral) % R
    valid = torch.arange(L).unsqueeze(0) < seq_len.unsqueeze(1)
    pos = ((real < third) & valid).sum(1)
    neg = ((real >= third) & (real < 2 * third) & valid).sum(1)
    labels = (pos > neg).long()
    return Examples("sentiment", seq=Ragged.from_padded(real + NUM_SPECIALS, seq_len),
                    labels=labels)


def _reverse_rows(seq: Tensor, lengths: Tensor) -> Tensor:
    """Reverse each row within its length (padding stays at the end)."""
    T = seq.size(1)
    steps = torch.arange(T).unsqueeze(0)
    rev = lengths.unsqueeze(1) - 1 - steps
    return seq.gather(1, torch.where(rev >= 0, rev, steps.expand_as(rev)))


class TaskDataset(Dataset):
    """Small learnable tasks, so time-to-loss-threshold can be measured on a CPU in minutes.

    - nmt: the target is the source reversed, each token t mapped to ((t-4)*7+3) mod (V-4) + 4;
      source lengths uniform in [src_len // 2, src_len] unless `fixed_length`.
    - rnnlm: arithmetic progressions mod (V-4) with a random start and a stride from {1, 2, 3, 5}:
      after two tokens the rest is determined, so the loss can fall far below log(V).
    - sentiment: label 1 when tokens of the "positive" id range (first third of the real ids)
      outnumber those of the "negative" range (second third); documents are generated leaning
      one way so the classes are balanced and the rule is learnable.
    Everything is generated in memory from `seed`; validation comes from a separate stream.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        seed: int,
        num_train: int | None = None,
        num_valid: int | None = None,
        fixed_length: bool = False,
        bucket_batches: int = 0,
    ) -> None:
        """`num_train`/`num_valid` default (also when None) to 20000 and 1000 samples."""
        super().__init__()
        num_train = 20000 if num_train is None else num_train
        num_valid = 1000 if num_valid is None else num_valid
        self.family, self.vocab_size, self.seed = cfg.family, cfg.vocab_size, seed
        self.bucket_batches = bucket_batches
        fixed = bool(fixed_length)
        self._train = _task_examples(cfg, num_train, fixed, generator_for(seed, "task", "train"))
        self._valid = _task_examples(cfg, num_valid, fixed, generator_for(seed, "task", "valid"))


# --------------------------------------------------------------------------------------------
# Prefetching
# --------------------------------------------------------------------------------------------


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()


class Prefetcher:
    """Produce the items of `source` from a background thread, up to `depth` ahead.

    `depth=0` runs synchronously (no thread). With a `device`, batches are moved there as they are
    handed out; for CUDA they are pinned in the worker thread and copied with `non_blocking`, on
    the consumer's current stream, so the copy is ordered before the compute that uses it. An
    exception raised by `source` is re-raised in the consumer at the point it would have occurred.
    Call `close()` (or use `with`) to stop the worker early.
    """

    def __init__(
        self,
        source: Iterable[Batch],
        depth: int = 2,
        device: torch.device | str | None = None,
    ) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self.depth = depth
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._pin = self.device is not None and self.device.type == "cuda"
        self._source = iter(source)
        self._done = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._queue: queue.Queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._work, name="prefetcher", daemon=True)
            self._thread.start()

    def _prepare(self, item: Batch) -> Batch:
        return item.pin_memory() if self._pin else item

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            for item in self._source:
                if not self._put(self._prepare(item)):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, not swallowed
            self._put(_Failure(exc))
            return
        self._put(_END)

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        if self._thread is None:
            try:
                item: object = self._prepare(next(self._source))
            except StopIteration:
                self._done = True
                raise
        else:
            item = self._queue.get()
        if item is _END:
            self._done = True
            self._join()
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            self._join()
            raise item.exc
        batch: Batch = item  # type: ignore[assignment]
        if self.device is not None:
            batch = batch.to(self.device, non_blocking=self._pin)
        return batch

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Stop the worker (it finishes the item it is producing) and drop what is queued."""
        self._done = True
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.05)
                except queue.Empty:
                    pass
            self._join()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
