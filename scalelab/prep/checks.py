"""The text datasets' checks of a corpus, made on the scan's counts instead of on the text.

Messages are `train.text`'s, so a corpus refused by `--data text` is refused by `launch prep` in
the same words (naming the file, the line and the flag), before any shard is written.
"""

from __future__ import annotations

from typing import Any

from scalelab.core.errors import DataError
from scalelab.core.presets import ModelConfig
from scalelab.prep.corpus import flag


def check_split(family: str, cfg: ModelConfig, train: Any, metas: list[dict], valid: Any,
                vmetas: list[dict] | None) -> list[str]:
    """Raise DataError where `--data text` would; return the sorted training labels (sentiment)."""
    for corpus, scans in ((train, metas), (valid, vmetas)):
        if corpus is not None:
            _no_empty_files(corpus, scans)
            _enough_samples(family, cfg, corpus, scans)
    if family != "sentiment":
        return []
    labels = sorted({label for m in metas for label in m["labels"]})
    if len(labels) < 2:
        raise DataError(f"{train.urls[0][0]} has a single label {labels[0]!r}: a classifier needs at least two")
    for meta in vmetas or []:
        for label, where in meta["labels"].items():
            if label not in labels:
                raise DataError(f"{where}: label {label!r} does not occur in the training file "
                                f"{train.urls[0][0]} (labels there: {', '.join(labels)})")
    return labels


def _no_empty_files(corpus: Any, metas: list[dict]) -> None:
    """Every file has a non-blank line (a piece's first mark names its file)."""
    nonblank = [[0] * len(corpus.keys) for _ in corpus.urls]
    for meta in metas:
        number = meta["marks"][0][0]
        nonblank[number] = [a + b for a, b in zip(nonblank[number], meta["nonblank"])]
    for urls, counts in zip(corpus.urls, nonblank):
        for url, key, count in zip(urls, corpus.keys, counts):
            if count == 0:
                raise DataError(f"data file is empty: {url} ({flag(key)})")


def _enough_samples(family: str, cfg: ModelConfig, corpus: Any, metas: list[dict]) -> None:
    first = corpus.urls[0]
    if family == "nmt" and not sum(m["samples"] for m in metas):
        raise DataError(f"no sentence pair of {first[0]} and {first[1]} has words on both sides")
    stream = sum(m["units"] for m in metas)
    if family == "rnnlm" and stream < cfg.seq_len + 1:
        raise DataError(
            f"{first[0]} has {stream} tokens (with one eos a line), fewer than one sequence of seq_len + 1 = "
            f"{cfg.seq_len + 1}: use more text or a smaller seq_len"
        )
