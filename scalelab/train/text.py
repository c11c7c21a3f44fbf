"""Datasets read from text files: parallel text (nmt), plain text (rnnlm), labelled lines (sentiment).

All three tokenize on whitespace (as the WMT files are distributed), build their vocabulary from
the training file only, truncate to the model's maximum lengths and, by default, bucket batches
by length (see `Dataset`). Without a validation file a fixed fraction of the training samples is
held out; which ones depends only on the file, not on the run's seed, so runs with different seeds
are validated on the same samples.

Paths come in a dict whose keys match the command-line flags (`train_src` <-> `--train-src`):
nmt needs `train_src`, `train_tgt` (optional `valid_src`, `valid_tgt`); rnnlm and sentiment need
`train` (optional `valid`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from scalelab.core.errors import DataError, SpecError
from scalelab.core.presets import PATH_KEYS
from scalelab.core.presets import path_flag
from scalelab.train.data import Dataset, Examples, Ragged, generator_for
from scalelab.train.models import EOS_ID, NUM_SPECIALS, UNK_ID, ModelConfig


def flag(key: str) -> str:
    """The `launch run` flag that gave path `key`: a one-file family reads --train-src as `train` and --valid-src
    as `valid` (train.loop.data_paths), so a message naming `--train` named `launch prep`'s flag instead."""
    return path_flag({"train": "train_src", "valid": "valid_src"}.get(key, key))


class Vocab:
    """Token <-> id mapping: the four specials, then tokens by falling frequency.

    Ties in frequency are broken alphabetically so the same file always gives the same ids.
    """

    SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")

    def __init__(self, itos: list[str]) -> None:
        self.itos = list(itos)
        self.stoi = {tok: i for i, tok in enumerate(self.itos)}

    @classmethod
    def build(cls, token_iterables: Iterable[Iterable[str]], max_size: int) -> "Vocab":
        """The `max_size` (specials included) most frequent tokens of `token_iterables`."""
        if max_size <= NUM_SPECIALS:
            raise SpecError(f"vocabulary size must exceed {NUM_SPECIALS}, got {max_size}")
        counts: Counter[str] = Counter()
        for tokens in token_iterables:
            counts.update(tokens)
        for special in cls.SPECIALS:
            counts.pop(special, None)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls(list(cls.SPECIALS) + [tok for tok, _ in ranked[: max_size - NUM_SPECIALS]])

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Ids of `tokens`; unknown tokens become <unk>."""
        get = self.stoi.get
        return [get(tok, UNK_ID) for tok in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in ids]


def read_lines(path: str | Path, key: str) -> list[str]:
    """All lines of a UTF-8 file (line breaks only at \\n, so stray \\x0b or \\u2028 in a corpus
    cannot shift one side of a parallel pair); DataError if missing, unreadable or blank."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p} (check {flag(key)})")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"data file {p} ({flag(key)}) is not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise DataError(f"cannot read data file {p} ({flag(key)}): {exc.strerror}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]
    if not any(line.strip() for line in lines):
        raise DataError(f"data file is empty: {p} ({flag(key)})")
    return lines


def holdout_split(n: int, fraction: float, what: str, hint: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, valid) indices holding out `fraction` of `n` samples (at least one each side).

    The choice depends only on `n`, not on the run's seed, so every run validates on the same
    samples.
    """
    if not 0.0 < fraction < 1.0:
        raise SpecError(f"valid_fraction must be between 0 and 1, got {fraction}")
    n_valid = max(1, round(n * fraction))
    if n - n_valid < 1:
        raise DataError(f"{what} has only {n} samples, too few to hold some out for validation: {hint}")
    order = torch.randperm(n, generator=generator_for(0, "holdout", n))
    return order[n_valid:].sort().values, order[:n_valid].sort().values


def _select(rows: list, index: torch.Tensor) -> list:
    return [rows[i] for i in index.tolist()]


class TextDataset(Dataset):
    """Common part of the file-backed datasets: holds the splits and the bucketing option."""

    def __init__(self, cfg: ModelConfig, seed: int, bucket_batches: int = 50) -> None:
        super().__init__()
        self.family, self.seed, self.bucket_batches = cfg.family, seed, bucket_batches


class ParallelTextDataset(TextDataset):
    """Sentence pairs from two aligned files (line i of `train_src` translates line i of
    `train_tgt`). Pairs with an empty side are skipped. Source and target get their own
    vocabularies; `vocab_size` is the larger, since the model sizes both embeddings alike."""

    def __init__(
        self,
        cfg: ModelConfig,
        seed: int,
        paths: dict[str, str],
        valid_fraction: float = 0.05,
        bucket_batches: int = 50,
    ) -> None:
        super().__init__(cfg, seed, bucket_batches)
        train = self._read_pairs(paths, "train_src", "train_tgt")
        if "valid_src" in paths or "valid_tgt" in paths:
            if not ("valid_src" in paths and "valid_tgt" in paths):
                raise SpecError("give both --valid-src and --valid-tgt, or neither")
            valid = self._read_pairs(paths, "valid_src", "valid_tgt")
        else:
            keep, held = holdout_split(
                len(train), valid_fraction, paths["train_src"],
                "add more sentence pairs or give --valid-src/--valid-tgt")
            train, valid = _select(train, keep), _select(train, held)
        self.src_vocab = Vocab.build((s for s, _ in train), cfg.vocab_size)
        self.tgt_vocab = Vocab.build((t for _, t in train), cfg.vocab_size)
        self.vocab_size = max(len(self.src_vocab), len(self.tgt_vocab))
        self._train = self._encode(train, cfg)
        self._valid = self._encode(valid, cfg)

    @staticmethod
    def _read_pairs(paths: dict[str, str], src_key: str, tgt_key: str) -> list[tuple[list[str], list[str]]]:
        src, tgt = read_lines(paths[src_key], src_key), read_lines(paths[tgt_key], tgt_key)
        if len(src) != len(tgt):
            raise DataError(
                f"parallel files differ in length: {paths[src_key]} has {len(src)} lines, "
                f"{paths[tgt_key]} has {len(tgt)} (line i of {flag(src_key)} must translate "
                f"line i of {flag(tgt_key)})"
            )
        pairs = [(s.split(), t.split()) for s, t in zip(src, tgt)]
        pairs = [(s, t) for s, t in pairs if s and t]
        if not pairs:
            raise DataError(
                f"no sentence pair of {paths[src_key]} and {paths[tgt_key]} has words on both sides"
            )
        return pairs

    def _encode(self, pairs: list[tuple[list[str], list[str]]], cfg: ModelConfig) -> Examples:
        src = [self.src_vocab.encode(s[: cfg.src_len]) for s, _ in pairs]
        tgt = [self.tgt_vocab.encode(t[: cfg.tgt_len - 1]) for _, t in pairs]
        return Examples("nmt", src=Ragged.from_lists(src), tgt=Ragged.from_lists(tgt))


class PlainTextDataset(TextDataset):
    """Language-model text: all tokens, an eos after each non-blank line, cut into chunks of
    seq_len + 1 tokens that overlap by one, so every token but the first is a target once.
    Without a validation file, whole chunks are held out (the vocabulary is built before)."""

    def __init__(
        self,
        cfg: ModelConfig,
        seed: int,
        paths: dict[str, str],
        valid_fraction: float = 0.05,
        bucket_batches: int = 50,
    ) -> None:
        super().__init__(cfg, seed, bucket_batches)
        train_lines = [line.split() for line in read_lines(paths["train"], "train")]
        self.vocab = Vocab.build(train_lines, cfg.vocab_size)
        self.vocab_size = len(self.vocab)
        train = self._chunks(train_lines, cfg.seq_len, paths["train"])
        if "valid" in paths:
            lines = [line.split() for line in read_lines(paths["valid"], "valid")]
            valid = self._chunks(lines, cfg.seq_len, paths["valid"])
        else:
            keep, held = holdout_split(train.size(0), valid_fraction, paths["train"],
                                       "add more text or give --valid")
            train, valid = train[keep], train[held]
        self._train = Examples("rnnlm", seq=self._ragged(train))
        self._valid = Examples("rnnlm", seq=self._ragged(valid))

    def _chunks(self, lines: list[list[str]], seq_len: int, path: str) -> torch.Tensor:
        stream: list[int] = []
        for tokens in lines:
            if tokens:
                stream.extend(self.vocab.encode(tokens))
                stream.append(EOS_ID)
        if len(stream) < seq_len + 1:
            raise DataError(
                f"{path} has {len(stream)} tokens (with one eos a line), fewer than one sequence "
                f"of seq_len + 1 = {seq_len + 1}: use more text or a smaller seq_len"
            )
        ids = torch.tensor(stream, dtype=torch.int32)
        return ids.unfold(0, seq_len + 1, seq_len)

    @staticmethod
    def _ragged(chunks: torch.Tensor) -> Ragged:
        n, width = chunks.shape
        return Ragged(chunks.reshape(-1), torch.full((n,), width, dtype=torch.long))


class LabelledTextDataset(TextDataset):
    """Classification lines `LABEL<TAB>text`; labels get ids in sorted (string) order, recorded
    in `labels`. Blank lines are skipped; any other line without a label or text is an error."""

    def __init__(
        self,
        cfg: ModelConfig,
        seed: int,
        paths: dict[str, str],
        valid_fraction: float = 0.05,
        bucket_batches: int = 50,
    ) -> None:
        super().__init__(cfg, seed, bucket_batches)
        train = self._read(paths["train"], "train")
        self.labels = sorted({label for label, _, _ in train})
        if len(self.labels) < 2:
            raise DataError(
                f"{paths['train']} has a single label {self.labels[0]!r}: a classifier needs at "
                f"least two"
            )
        if "valid" in paths:
            valid = self._read(paths["valid"], "valid")
        else:
            keep, held = holdout_split(len(train), valid_fraction, paths["train"],
                                       "add more lines or give --valid")
            train, valid = _select(train, keep), _select(train, held)
        self.vocab = Vocab.build((tokens for _, tokens, _ in train), cfg.vocab_size)
        self.vocab_size = len(self.vocab)
        self.num_classes = len(self.labels)
        label_ids = {label: i for i, label in enumerate(self.labels)}
        for label, _, number in valid:
            if label not in label_ids:
                raise DataError(
                    f"{paths['valid']}:{number}: label {label!r} does not occur in the training "
                    f"file {paths['train']} (labels there: {', '.join(self.labels)})"
                )
        self._train = self._encode(train, label_ids, cfg.seq_len)
        self._valid = self._encode(valid, label_ids, cfg.seq_len)

    def model_overrides(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "num_classes": self.num_classes}

    @staticmethod
    def _read(path: str, key: str) -> list[tuple[str, list[str], int]]:
        """(label, tokens, line number) of each non-blank line."""
        rows = []
        for number, line in enumerate(read_lines(path, key), start=1):
            if not line.strip():
                continue
            label, tab, text = line.partition("\t")
            tokens = text.split()
            if not tab or not label.strip() or not tokens:
                raise DataError(
                    f"{path}:{number}: expected LABEL<TAB>text, got {line[:80]!r}"
                )
            rows.append((label.strip(), tokens, number))
        return rows

    def _encode(self, rows: list[tuple[str, list[str], int]], label_ids: dict[str, int],
                seq_len: int) -> Examples:
        seq = Ragged.from_lists([self.vocab.encode(tokens[:seq_len]) for _, tokens, _ in rows])
        labels = torch.tensor([label_ids[label] for label, _, _ in rows], dtype=torch.long)
        return Examples("sentiment", seq=seq, labels=labels)


_CLASSES: dict[str, type[TextDataset]] = {
    "nmt": ParallelTextDataset,
    "rnnlm": PlainTextDataset,
    "sentiment": LabelledTextDataset,
}


def build_text_dataset(cfg: ModelConfig, seed: int, paths: dict[str, str], **opts: Any) -> Dataset:
    """The file-backed dataset for `cfg.family`; checks the path keys first."""
    required, optional = PATH_KEYS[cfg.family]
    given = {k: v for k, v in paths.items() if v is not None}
    unknown = sorted(set(given) - set(required) - set(optional))
    if unknown:
        raise SpecError(
            f"unknown data path(s) {', '.join(unknown)} for {cfg.family}: valid are "
            f"{', '.join(required + optional)}"
        )
    missing = [k for k in required if k not in given]
    if missing:
        raise SpecError(
            f"text data for {cfg.family} needs {' and '.join(flag(k) for k in missing)}"
        )
    return _CLASSES[cfg.family](cfg, seed, {k: str(v) for k, v in given.items()}, **opts)
