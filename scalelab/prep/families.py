"""What a sample is, per model family, and how it is counted and encoded: `train.text`'s rules.

The trainer's text datasets read a whole file into one process; prep reads it in pieces, so the
same rules are stated here per line (a test checks that a corpus prepped into shards and the same
corpus read by `--data text` give the same token ids):

- tokens are whitespace-separated (`str.split()`), vocabularies count untruncated samples;
- nmt: a sample is a line pair with words on both sides; the source is cut to `src_len` tokens,
  the target to `tgt_len - 1` (the decoder adds the eos);
- rnnlm: every non-blank line adds its tokens and an eos to one stream; samples are windows of
  `seq_len + 1` stream tokens starting every `seq_len` tokens (`Tensor.unfold`);
- sentiment: a sample is a non-blank `LABEL<TAB>text` line, the text cut to `seq_len` tokens.

No PyTorch here: these run in the Dask workers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from scalelab.core.errors import DataError
from scalelab.core.presets import EOS_ID, UNK_ID, ModelConfig


@dataclass(frozen=True)
class Rules:
    """The family's rules with the lengths of the model the shards are cut for."""

    family: str
    keys: tuple[str, ...]  # input flag of each role (for messages), e.g. ("train_src", "train_tgt")
    src_len: int = 0
    tgt_len: int = 0
    seq_len: int = 0

    @classmethod
    def for_config(cls, cfg: ModelConfig, keys: tuple[str, ...]) -> "Rules":
        return cls(cfg.family, keys, cfg.src_len, cfg.tgt_len, cfg.seq_len)

    @property
    def vocabs(self) -> tuple[str, ...]:
        return ("src", "tgt") if self.family == "nmt" else ("tokens",)

    @property
    def windowed(self) -> bool:
        """Samples are windows of one token stream (rnnlm), not lines."""
        return self.family == "rnnlm"

    def sample(self, texts: list[str], url: str, line: int) -> Any:
        """The sample of one line (a pair of lines for nmt), or None for a line that holds none."""
        if self.family == "nmt":
            src, tgt = texts[0].split(), texts[1].split()
            return (src, tgt) if src and tgt else None
        text = texts[0]
        if self.family == "rnnlm":
            return text.split() or None
        if not text.strip():
            return None
        label, tab, body = text.partition("\t")
        tokens = body.split()
        if not tab or not label.strip() or not tokens:
            raise DataError(f"{url}:{line + 1}: expected LABEL<TAB>text, got {text[:80]!r}")
        return label.strip(), tokens

    def has_sample(self, texts: list[str]) -> bool:
        """Whether the line holds a sample, without tokenising it (nmt, sentiment: `sample` is not
        None exactly when this is true; a malformed sentiment line was refused by the scan)."""
        return all(t.strip() for t in texts)

    def units(self, sample: Any) -> int:
        """Positions a sample takes in the corpus: one, or its tokens and an eos in the rnnlm stream."""
        return len(sample) + 1 if self.windowed else 1

    def encode(self, sample: Any, vocab: "Payload") -> dict[str, Any]:
        """The row of one sample (rnnlm: its stream ids), as the text datasets encode it."""
        if self.family == "nmt":
            return {"src": vocab.ids("src", sample[0][: self.src_len]),
                    "tgt": vocab.ids("tgt", sample[1][: self.tgt_len - 1])}
        if self.windowed:
            return {"seq": vocab.ids("tokens", sample) + [EOS_ID]}
        return {"seq": vocab.ids("tokens", sample[1][: self.seq_len]), "label": vocab.labels[sample[0]]}


class Tally:
    """Running totals of a scan: samples, positions taken (`Rules.units`), tokens, labels first seen
    (where) and, when `counting`, token counts per vocabulary. Tokens are gathered in lists and
    counted in bulk: a `Counter.update` per line would cost more than the tokenising."""

    FLUSH = 1 << 16

    def __init__(self, rules: Rules, counting: bool = True) -> None:
        self.rules, self.counting = rules, counting
        self.samples = self.units = self.tokens = 0
        self.labels: dict[str, Any] = {}
        self._pending: dict[str, list[str]] = {name: [] for name in rules.vocabs}
        self._counts: dict[str, Counter] = {name: Counter() for name in rules.vocabs}

    def add(self, sample: Any, where: Any = None) -> None:
        family, pending = self.rules.family, self._pending
        self.samples += 1
        if family == "nmt":
            self.units += 1
            self.tokens += len(sample[0]) + len(sample[1])
            if self.counting:
                pending["src"] += sample[0]
                pending["tgt"] += sample[1]
        elif family == "rnnlm":
            self.units += len(sample) + 1
            self.tokens += len(sample)
            if self.counting:
                pending["tokens"] += sample
        else:
            self.units += 1
            self.tokens += len(sample[1])
            self.labels.setdefault(sample[0], where)
            if self.counting:
                pending["tokens"] += sample[1]
        if self.counting and len(next(iter(pending.values()))) > self.FLUSH:
            self._flush()

    def _flush(self) -> None:
        for name, tokens in self._pending.items():
            self._counts[name].update(tokens)
            tokens.clear()

    def counts(self) -> dict[str, Counter]:
        self._flush()
        return self._counts


@dataclass
class Payload:
    """The vocabularies (token -> id per vocabulary) and label ids, sent once to every worker."""

    stoi: dict[str, dict[str, int]]
    labels: dict[str, int]

    def ids(self, name: str, tokens: list[str]) -> list[int]:
        get = self.stoi[name].get
        return [get(tok, UNK_ID) for tok in tokens]
