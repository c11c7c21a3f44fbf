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

from core.errors import DataError
from core.presets import EOS_ID, UNK_ID, ModelConfig


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

    def units(self, sample: Any) -> int:
        """Positions a sample takes in the corpus: one, or its tokens and an eos in the rnnlm stream."""
        return len(sample) + 1 if self.windowed else 1

    def count(self, sample: Any, counts: dict[str, Counter]) -> None:
        if self.family == "nmt":
            counts["src"].update(sample[0])
            counts["tgt"].update(sample[1])
        else:
            counts["tokens"].update(sample if self.windowed else sample[1])

    def tokens(self, sample: Any) -> int:
        if self.family == "nmt":
            return len(sample[0]) + len(sample[1])
        return len(sample) if self.windowed else len(sample[1])

    def label(self, sample: Any) -> str | None:
        return sample[0] if self.family == "sentiment" else None

    def encode(self, sample: Any, vocab: "Payload") -> dict[str, Any]:
        """The row of one sample (rnnlm: its stream ids), as the text datasets encode it."""
        if self.family == "nmt":
            return {"src": vocab.ids("src", sample[0][: self.src_len]),
                    "tgt": vocab.ids("tgt", sample[1][: self.tgt_len - 1])}
        if self.windowed:
            return {"seq": vocab.ids("tokens", sample) + [EOS_ID]}
        return {"seq": vocab.ids("tokens", sample[1][: self.seq_len]), "label": vocab.labels[sample[0]]}


@dataclass
class Payload:
    """The vocabularies (token -> id per vocabulary) and label ids, sent once to every worker."""

    stoi: dict[str, dict[str, int]]
    labels: dict[str, int]

    def ids(self, name: str, tokens: list[str]) -> list[int]:
        get = self.stoi[name].get
        return [get(tok, UNK_ID) for tok in tokens]
