"""Model presets as data: the shape of every model, with no dependency on PyTorch.

The launcher validates `--model` and `--model-arg` against these before anything runs, and the
backends' dry runs need them too; keeping them free of torch lets `launch --backend k8s --dry-run`
answer without importing it. `train.models` builds the networks from these configs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from scalelab.core.errors import SpecError
from scalelab.core.options import coerce_fields, coerce_items

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
NUM_SPECIALS = 4

FAMILIES = ("nmt", "rnnlm", "sentiment")
RNN_KINDS = ("fused", "stepwise")
OUTPUT_LOSSES = ("auto", "full", "chunked", "compiled")  # scalelab/train/outloss.py
LOSS_CHUNK_ELEMENTS = 2**24  # logits per chunk of --output-loss chunked (64 MiB in float32); costs/memory.py counts it

# Backward costs about twice the forward matmuls (gradients w.r.t. inputs and w.r.t. weights).
TRAIN_FLOPS_FACTOR = 3.0


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes a model's shape; one dataclass for all families.

    Fields a family does not use keep their defaults and are ignored. Lengths are maxima: data is
    truncated to them. `tgt_len` counts decoder steps including the end-of-sentence token, so a
    translation target has at most `tgt_len - 1` words. `default_batch` is the global batch the
    preset was designed for (the trainer may use another).
    """

    family: str
    vocab_size: int
    embed_size: int
    hidden_size: int
    num_layers: int = 1  # rnnlm, sentiment
    enc_layers: int = 1  # nmt
    dec_layers: int = 1  # nmt
    bidirectional: bool = False  # nmt encoder, sentiment
    src_len: int = 0  # nmt
    tgt_len: int = 0  # nmt
    seq_len: int = 0  # rnnlm, sentiment
    num_classes: int = 2  # sentiment
    dropout: float = 0.0
    attention: bool = True  # nmt
    default_batch: int = 32

    def __post_init__(self) -> None:
        coerce_fields(self, "model field ")  # the types come from the annotations above
        _validate_config(self)


# Sizes past these cannot be allocated (hidden_size=1e12 was accepted and each rank died in torch): far
# above every preset (nmt-seed: hidden 512, vocabulary 50,000), so no real model is refused.
_MAXIMA = {"vocab_size": 10_000_000, "embed_size": 65_536, "hidden_size": 65_536, "num_layers": 1_024,
           "enc_layers": 1_024, "dec_layers": 1_024, "src_len": 1_000_000, "tgt_len": 1_000_000,
           "seq_len": 1_000_000, "num_classes": 10_000_000, "default_batch": 10_000_000}


def _validate_config(cfg: ModelConfig) -> None:
    """Reject configurations that cannot build a working model, with the fix in the message."""
    if cfg.family not in FAMILIES:
        raise SpecError(f"unknown model family {cfg.family!r}: use one of {', '.join(FAMILIES)}")
    if cfg.vocab_size <= NUM_SPECIALS:
        raise SpecError(
            f"vocab_size must be greater than {NUM_SPECIALS} (ids 0-3 are pad/unk/bos/eos), "
            f"got {cfg.vocab_size}"
        )
    needed = ["embed_size", "hidden_size", "default_batch"]
    if cfg.family == "nmt":
        needed += ["enc_layers", "dec_layers", "src_len", "tgt_len"]
    else:
        needed += ["num_layers", "seq_len"]
    for name in ("num_layers", "enc_layers", "dec_layers"):  # every family's: 0 layers was accepted where unused
        if getattr(cfg, name) < 1:
            raise SpecError(f"model field {name} must be at least 1 (a model has at least one layer), got "
                            f"{getattr(cfg, name)}")
    for name in needed:
        if getattr(cfg, name) <= 0:
            raise SpecError(
                f"model field {name} must be a positive integer for family {cfg.family}, "
                f"got {getattr(cfg, name)}"
            )
    for name in needed + ["vocab_size", "num_classes"]:
        limit = _MAXIMA[name]
        if getattr(cfg, name) > limit:
            raise SpecError(f"model field {name} must be at most {limit:,} (a model that size cannot be built "
                            f"in memory), got {getattr(cfg, name):,}; choose a smaller {name}")
    if cfg.family == "sentiment" and cfg.num_classes < 2:
        raise SpecError(f"num_classes must be at least 2, got {cfg.num_classes}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise SpecError(f"dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.family == "rnnlm" and cfg.bidirectional:
        raise SpecError("a language model cannot be bidirectional: set bidirectional to false")


#: The fields each family's model (scalelab/train/models.py) and data read; the rest keep their defaults unread.
_EVERY_FAMILY = ("family", "vocab_size", "embed_size", "hidden_size", "dropout", "default_batch")
FAMILY_FIELDS: dict[str, tuple[str, ...]] = {
    "nmt": (*_EVERY_FAMILY, "enc_layers", "dec_layers", "bidirectional", "src_len", "tgt_len", "attention"),
    "rnnlm": (*_EVERY_FAMILY, "num_layers", "seq_len"),
    "sentiment": (*_EVERY_FAMILY, "num_layers", "bidirectional", "seq_len", "num_classes"),
}
#: What a family reads instead of a field it does not: said in the refusal.
_INSTEAD = {("nmt", "num_layers"): "enc_layers and dec_layers", ("nmt", "seq_len"): "src_len and tgt_len",
            ("rnnlm", "enc_layers"): "num_layers", ("rnnlm", "dec_layers"): "num_layers",
            ("sentiment", "enc_layers"): "num_layers", ("sentiment", "dec_layers"): "num_layers",
            ("rnnlm", "src_len"): "seq_len", ("rnnlm", "tgt_len"): "seq_len",
            ("sentiment", "src_len"): "seq_len", ("sentiment", "tgt_len"): "seq_len"}


def refuse_unread_fields(model: str, family: str, overrides: dict[str, Any], flag: str = "--model-arg") -> None:
    """An override the model's family never reads is refused, naming what it reads instead. Why: `--model-arg
    num_layers=2` on nmt-small (whose encoder and decoder read enc_layers and dec_layers) was accepted, and the run
    trained the preset's model unchanged, without a word."""
    unread = [key for key in overrides if key not in FAMILY_FIELDS[family]]
    if not unread:
        return
    instead = [f"{key}: give {_INSTEAD[(family, key)]}" for key in unread if (family, key) in _INSTEAD]
    hint = f" ({'; '.join(instead)})" if instead else ""
    raise SpecError(f"{flag} {', '.join(unread)}: {model} (family {family}) does not read "
                    f"{'it' if len(unread) == 1 else 'them'}{hint}; its fields: {', '.join(FAMILY_FIELDS[family][1:])}")


def model_overrides(overrides: dict[str, Any], where: str = "") -> dict[str, Any]:
    """Overrides of preset fields typed and checked; text is read as the field's type (`--model-arg
    hidden_size=256`). Unknown fields fail listing the valid ones; `where` says where they came from."""
    return coerce_items(ModelConfig, overrides, where, label="model field ", text=True)


def config_with_overrides(cfg: ModelConfig, overrides: dict[str, Any], where: str = "") -> ModelConfig:
    """Return `cfg` with `overrides` applied, validated (unknown keys, types, sizes -> SpecError)."""
    return dataclasses.replace(cfg, **model_overrides(overrides, where))


PRESETS: dict[str, ModelConfig] = {
    # The seed experiment: WMT14 En-De, tf/nmt-style GNMT-lite, batch 360, 100-token sentences.
    "nmt-seed": ModelConfig(
        family="nmt", vocab_size=50000, embed_size=512, hidden_size=512, enc_layers=2,
        dec_layers=4, bidirectional=True, src_len=100, tgt_len=100, attention=True,
        default_batch=360,
    ),
    "nmt-small": ModelConfig(
        family="nmt", vocab_size=8000, embed_size=256, hidden_size=256, enc_layers=2,
        dec_layers=2, bidirectional=True, src_len=30, tgt_len=30, attention=True,
        default_batch=64,
    ),
    "nmt-tiny": ModelConfig(
        family="nmt", vocab_size=64, embed_size=32, hidden_size=32, enc_layers=1,
        dec_layers=1, bidirectional=True, src_len=10, tgt_len=10, attention=True,
        default_batch=16,
    ),
    "rnnlm-small": ModelConfig(
        family="rnnlm", vocab_size=10000, embed_size=256, hidden_size=256, num_layers=2,
        seq_len=35, default_batch=64,
    ),
    "rnnlm-tiny": ModelConfig(
        family="rnnlm", vocab_size=64, embed_size=32, hidden_size=32, num_layers=1,
        seq_len=16, default_batch=16,
    ),
    # The distributed sentiment-RNN study: 128-wide embedding and LSTM, two classes.
    "sentiment-small": ModelConfig(
        family="sentiment", vocab_size=20000, embed_size=128, hidden_size=128, num_layers=1,
        seq_len=100, num_classes=2, default_batch=64,
    ),
    "sentiment-tiny": ModelConfig(
        family="sentiment", vocab_size=64, embed_size=16, hidden_size=32, num_layers=1,
        seq_len=16, num_classes=2, default_batch=16,
    ),
}


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------


# The data files each family reads: (required, optional) keys of `DataSpec`/`launch prep`. Data, so that
# the trainer (train.text) and `launch prep` (which must not import PyTorch to plan) share one table.
PATH_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "nmt": (("train_src", "train_tgt"), ("valid_src", "valid_tgt")),
    "rnnlm": (("train",), ("valid",)),
    "sentiment": (("train",), ("valid",)),
}


def path_flag(key: str) -> str:
    """The command-line flag that sets path `key`, for error messages."""
    return "--" + key.replace("_", "-")
