"""Data: batches are a pure function of (seed, epoch, step); text loaders; prefetching."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from scalelab.core.errors import DataError, SpecError
from scalelab.train.batch import Batch
from scalelab.train.data import (
    Prefetcher,
    SyntheticDataset,
    TaskDataset,
    iterate_batches,
)
from scalelab.train.datasets import build_dataset
from scalelab.train.models import BOS_ID, EOS_ID, PAD_ID, PRESETS, config_with_overrides
from scalelab.train.text import Vocab

TINY = ["nmt-tiny", "rnnlm-tiny", "sentiment-tiny"]


def same(a: Batch, b: Batch) -> bool:
    return (a.inputs.keys() == b.inputs.keys()
            and all(torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
            and (a.samples, a.words) == (b.samples, b.words))


def cat(parts: list[Batch]) -> Batch:
    inputs = {k: torch.cat([p.inputs[k] for p in parts]) for k in parts[0].inputs}
    return Batch(inputs, sum(p.samples for p in parts), sum(p.words for p in parts))


# ---- determinism and sharding ----------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("kind", ["task", "synthetic"])
def test_rank_slices_concatenate_to_the_global_batch(name: str, kind: str) -> None:
    cfg = PRESETS[name]
    data = build_dataset(kind, cfg, 7, {})
    whole = data.get_batch(1, 5, 16, 0, 16)
    for world in (2, 4):
        share = 16 // world
        parts = [data.get_batch(1, 5, 16, r * share, (r + 1) * share) for r in range(world)]
        key = "src" if "src" in whole.inputs else "tokens"
        assert len({p.inputs[key].shape[1] for p in parts}) == 1  # same padding on every rank
        assert same(cat(parts), whole)


@pytest.mark.parametrize("name", TINY)
def test_batches_are_a_function_of_seed_epoch_and_step(name: str) -> None:
    cfg = PRESETS[name]
    a, b = TaskDataset(cfg, 11, num_train=256), TaskDataset(cfg, 11, num_train=256)
    other_seed = TaskDataset(cfg, 12, num_train=256)
    assert same(a.get_batch(2, 3, 16, 0, 16), b.get_batch(2, 3, 16, 0, 16))
    # asking in another order (as a resumed run does) changes nothing
    late = a.get_batch(0, 7, 16, 4, 12)
    a.get_batch(3, 0, 16, 0, 16)
    assert same(a.get_batch(0, 7, 16, 4, 12), late)
    assert not same(a.get_batch(2, 3, 16, 0, 16), other_seed.get_batch(2, 3, 16, 0, 16))


def test_epochs_are_shuffled_differently_and_cover_each_sample_once() -> None:
    data = TaskDataset(PRESETS["rnnlm-tiny"], 0, num_train=100)
    steps = data.steps_per_epoch(16)
    assert steps == 6  # 100 // 16, the partial batch is dropped
    orders = []
    for epoch in (0, 1):
        idx = torch.cat([data.get_batch(epoch, s, 16, 0, 16).meta["indices"] for s in range(steps)])
        assert idx.unique().numel() == steps * 16
        orders.append(idx)
    assert not torch.equal(orders[0], orders[1])
    assert not same(data.get_batch(0, 0, 16, 0, 16), data.get_batch(1, 0, 16, 0, 16))


def test_resumed_stream_equals_the_uninterrupted_one() -> None:
    data = TaskDataset(PRESETS["nmt-tiny"], 3, num_train=64)
    full = list(iterate_batches(data, 16, 4, 8, first_step=0, num_steps=10))  # crosses epochs
    resumed = list(iterate_batches(data, 16, 4, 8, first_step=6, num_steps=4))
    assert [b.meta["step"] for b in resumed] == [6, 7, 8, 9]
    assert full[4].meta["epoch"] == 1 and full[3].meta["epoch"] == 0
    assert all(same(x, y) for x, y in zip(full[6:], resumed))


def test_too_small_training_set_is_a_data_error() -> None:
    data = TaskDataset(PRESETS["rnnlm-tiny"], 0, num_train=10)
    with pytest.raises(DataError, match="10 samples.*global batch of 16"):
        data.steps_per_epoch(16)


def test_valid_batches_give_every_rank_the_same_count_and_disjoint_shards() -> None:
    data = TaskDataset(PRESETS["sentiment-tiny"], 0, num_train=64, num_valid=37)
    for world in (1, 2, 3, 5):
        shards = [data.valid_batches(4, r, world) for r in range(world)]
        assert len({len(s) for s in shards}) == 1 and len(shards[0]) >= 1
        assert all(b.samples <= 4 for s in shards for b in s)
        assert sum(b.samples for s in shards for b in s) == 37 - 37 % world
    one = torch.cat([b.inputs["labels"] for b in data.valid_batches(5, 0, 1)])
    two = torch.cat([b.inputs["labels"] for r in (0, 1) for b in data.valid_batches(5, r, 2)])
    assert torch.equal(one[:36], two)
    with pytest.raises(DataError, match="validation set has 37 samples"):
        data.valid_batches(4, 0, 40)


# ---- generated data --------------------------------------------------------------------------


def test_task_nmt_target_is_the_mapped_reversed_source() -> None:
    cfg = PRESETS["nmt-tiny"]
    batch = TaskDataset(cfg, 0, num_train=64).get_batch(0, 0, 32, 0, 32)
    src, lengths = batch.inputs["src"], batch.inputs["src_lengths"]
    tgt_in, tgt_out = batch.inputs["tgt_in"], batch.inputs["tgt_out"]
    assert tgt_in.shape == tgt_out.shape
    assert (tgt_in[:, 0] == BOS_ID).all()
    assert lengths.min() >= cfg.src_len // 2 and lengths.min() < lengths.max() <= cfg.src_len
    for i in range(32):
        n = int(lengths[i])
        words = [((t - 4) * 7 + 3) % 60 + 4 for t in reversed(src[i, :n].tolist())][: cfg.tgt_len - 1]
        m = len(words)
        assert tgt_out[i, :m].tolist() == words and tgt_out[i, m] == EOS_ID
        assert (tgt_out[i, m + 1 :] == PAD_ID).all() and (src[i, n:] == PAD_ID).all()
        assert tgt_in[i, 1 : m + 1].tolist() == words
    assert batch.words == int((tgt_out != PAD_ID).sum())


def test_task_rnnlm_and_sentiment_follow_their_rules() -> None:
    lm = TaskDataset(PRESETS["rnnlm-tiny"], 0, num_train=64).get_batch(0, 0, 16, 0, 16)
    assert torch.equal(lm.inputs["targets"][:, :-1], lm.inputs["tokens"][:, 1:])
    assert (lm.inputs["tokens"] >= 4).all()
    steps = (lm.inputs["tokens"][:, 1:] - lm.inputs["tokens"][:, :-1]) % 60
    assert all(len(set(row.tolist())) == 1 for row in steps)  # one stride a sequence
    cfg = PRESETS["sentiment-tiny"]
    s = TaskDataset(cfg, 0, num_train=512).get_batch(0, 0, 512, 0, 512)
    tokens, lengths, labels = s.inputs["tokens"], s.inputs["lengths"], s.inputs["labels"]
    third = 60 // 3
    pos = ((tokens >= 4) & (tokens < 4 + third)).sum(1)
    neg = ((tokens >= 4 + third) & (tokens < 4 + 2 * third)).sum(1)
    assert torch.equal(labels, (pos > neg).long())
    assert 0.3 < labels.float().mean() < 0.7
    assert s.words == int(lengths.sum())


def test_synthetic_data_is_full_length_and_sizes_its_pool() -> None:
    cfg = PRESETS["nmt-tiny"]
    data = SyntheticDataset(cfg, 0)
    b = data.get_batch(0, 0, 16, 0, 16)
    assert b.inputs["src"].shape == (16, cfg.src_len)
    assert b.inputs["tgt_out"].shape == (16, cfg.tgt_len)
    assert b.words == 16 * cfg.tgt_len
    assert data.steps_per_epoch(2000) == 4  # pool grows to 4 x the global batch
    with pytest.raises(DataError, match="synthetic pool has 20 samples"):
        SyntheticDataset(cfg, 0, num_samples=20).steps_per_epoch(32)


def test_build_dataset_rejects_unknown_kinds_and_options() -> None:
    with pytest.raises(SpecError, match="synthetic, task, text"):
        build_dataset("wmt", PRESETS["nmt-tiny"], 0, {})
    with pytest.raises(SpecError, match="num_trian.*num_train"):
        build_dataset("task", PRESETS["nmt-tiny"], 0, {}, num_trian=5)
    with pytest.raises(SpecError, match="--train-tgt"):
        build_dataset("text", PRESETS["nmt-tiny"], 0, {"train_src": "x"})


# ---- text files ------------------------------------------------------------------------------


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def sentences(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    words = [f"w{i}" for i in range(30)]
    out = []
    for _ in range(n):
        length = int(torch.randint(1, 25, (1,), generator=g))
        out.append(" ".join(words[int(i)] for i in torch.randint(0, 30, (length,), generator=g)))
    return out


def test_vocab_orders_by_frequency_then_alphabet() -> None:
    vocab = Vocab.build([["b", "a", "c", "b"], ["c", "d", "b"]], max_size=7)
    assert vocab.itos == ["<pad>", "<unk>", "<s>", "</s>", "b", "c", "a"]
    assert vocab.encode(["c", "zzz", "a"]) == [5, 1, 6]
    assert len(Vocab.build([["x", "y"]], 100)) == 6


def test_parallel_text(tmp_path: Path) -> None:
    src = sentences(200, 1)
    tgt = [" ".join(reversed(s.split())) for s in src]
    paths = {"train_src": write(tmp_path / "train.en", src), "train_tgt": write(tmp_path / "train.de", tgt)}
    cfg = config_with_overrides(PRESETS["nmt-tiny"], {"src_len": 12, "tgt_len": 12})
    data = build_dataset("text", cfg, 0, paths)
    assert len(data.valid) == 10 and len(data.train) == 190  # 5% held out
    assert data.vocab_size == 34 and data.model_overrides() == {"vocab_size": 34}
    b = data.get_batch(0, 0, 16, 0, 16)
    assert b.inputs["src"].shape[1] <= 12 and b.inputs["tgt_out"].shape[1] <= 12
    assert (b.inputs["src_lengths"] <= 12).all()
    # tokens decode back to words of the files
    row = b.inputs["tgt_out"][0]
    words = data.tgt_vocab.decode(row[row > EOS_ID].tolist())
    assert any(" ".join(words) == " ".join(t.split()[:11]) for t in tgt)
    # a validation file pair replaces the hold-out
    paths |= {"valid_src": write(tmp_path / "v.en", src[:7]), "valid_tgt": write(tmp_path / "v.de", tgt[:7])}
    assert len(build_dataset("text", cfg, 0, paths).valid) == 7


def test_plain_text_chunks(tmp_path: Path) -> None:
    lines = ["a b c", "", "d e a b", "c d e a b c d e"] * 10
    cfg = config_with_overrides(PRESETS["rnnlm-tiny"], {"seq_len": 5})
    data = build_dataset("text", cfg, 0, {"train": write(tmp_path / "lm.txt", lines)})
    assert data.vocab.itos[:4] == list(Vocab.SPECIALS)
    assert data.vocab_size == 9  # 4 specials + a..e
    tokens = (3 + 4 + 8) * 10 + 30  # words + one eos a non-blank line
    assert len(data.train) + len(data.valid) == (tokens - 1) // 5
    b = data.get_batch(0, 0, 4, 0, 4)
    assert b.inputs["tokens"].shape == (4, 5)
    assert torch.equal(b.inputs["targets"][:, :-1], b.inputs["tokens"][:, 1:])
    assert (b.inputs["tokens"] == EOS_ID).any()


def test_labelled_text(tmp_path: Path) -> None:
    lines = ["pos\tgood fine", "neg\tbad", "", "neutral\tok then", "pos\tgreat good"] * 8
    cfg = PRESETS["sentiment-tiny"]
    data = build_dataset("text", cfg, 0, {"train": write(tmp_path / "s.tsv", lines)})
    assert data.labels == ["neg", "neutral", "pos"]
    assert data.model_overrides() == {"vocab_size": data.vocab_size, "num_classes": 3}
    assert len(data.train) + len(data.valid) == 32
    b = data.get_batch(0, 0, 8, 0, 8)
    decoded = [data.vocab.decode(r[:n].tolist()) for r, n in zip(b.inputs["tokens"], b.inputs["lengths"])]
    expected = {"good fine": 2, "bad": 0, "ok then": 1, "great good": 2}
    for words, label in zip(decoded, b.inputs["labels"].tolist()):
        assert expected[" ".join(words)] == label


def padding(data, global_batch: int) -> int:
    total = 0
    for step in range(data.steps_per_epoch(global_batch)):
        b = data.get_batch(0, step, global_batch, 0, global_batch)
        total += int((b.inputs["src"] == PAD_ID).sum() + (b.inputs["tgt_out"] == PAD_ID).sum())
    return total


def test_bucketing_reduces_padding(tmp_path: Path) -> None:
    src = sentences(800, 2)
    tgt = [s + " w1" * (i % 3) for i, s in enumerate(src)]  # lengths correlate, as in real pairs
    paths = {"train_src": write(tmp_path / "a", src), "train_tgt": write(tmp_path / "b", tgt)}
    cfg = config_with_overrides(PRESETS["nmt-tiny"], {"src_len": 30, "tgt_len": 30})
    bucketed = build_dataset("text", cfg, 0, paths, bucket_batches=50)
    plain = build_dataset("text", cfg, 0, paths, bucket_batches=0)
    assert padding(bucketed, 8) < 0.6 * padding(plain, 8)
    # same samples over the epoch, just grouped differently
    def epoch_indices(d) -> torch.Tensor:
        steps = range(d.steps_per_epoch(8))
        return torch.cat([d.get_batch(0, s, 8, 0, 8).meta["indices"] for s in steps]).sort().values

    assert torch.equal(epoch_indices(bucketed), epoch_indices(plain))


def test_text_errors_name_the_file(tmp_path: Path) -> None:
    nmt, lm, cls = PRESETS["nmt-tiny"], PRESETS["rnnlm-tiny"], PRESETS["sentiment-tiny"]
    missing = str(tmp_path / "nope.en")
    with pytest.raises(DataError, match=r"data file not found: .*nope\.en \(check --train-src\)"):
        build_dataset("text", nmt, 0, {"train_src": missing, "train_tgt": missing})
    a = write(tmp_path / "a.en", ["x y", "z"])
    b = write(tmp_path / "b.de", ["x y", "z", "w"])
    with pytest.raises(DataError, match=r"a\.en has 2 lines.*b\.de has 3"):
        build_dataset("text", nmt, 0, {"train_src": a, "train_tgt": b})
    bad = write(tmp_path / "s.tsv", ["pos\tfine", "neg\tbad", "no tab here"])
    with pytest.raises(DataError, match=r"s\.tsv:3: expected LABEL<TAB>text"):
        build_dataset("text", cls, 0, {"train": bad})
    good = write(tmp_path / "t.tsv", ["pos\tfine", "neg\tbad"])
    odd = write(tmp_path / "v.tsv", ["pos\tfine", "meh\tso so"])
    with pytest.raises(DataError, match=r"v\.tsv:2: label 'meh' does not occur"):
        build_dataset("text", cls, 0, {"train": good, "valid": odd})
    empty = write(tmp_path / "empty.txt", ["", "  "])
    with pytest.raises(DataError, match=r"data file is empty: .*empty\.txt"):
        build_dataset("text", lm, 0, {"train": empty})
    short = write(tmp_path / "short.txt", ["a b c"])
    with pytest.raises(DataError, match=r"short\.txt has 4 tokens"):
        build_dataset("text", lm, 0, {"train": short})
    pairs = build_dataset("text", nmt, 0, {"train_src": a, "train_tgt": write(tmp_path / "c.de", ["u", "v"])})
    with pytest.raises(DataError, match="1 samples, fewer than one global batch of 2"):
        pairs.steps_per_epoch(2)


# ---- prefetching -----------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetcher_yields_the_plain_sequence(depth: int) -> None:
    data = TaskDataset(PRESETS["nmt-tiny"], 0, num_train=64)
    expected = list(iterate_batches(data, 8, 0, 8, num_steps=12))
    with Prefetcher(iterate_batches(data, 8, 0, 8, num_steps=12), depth=depth, device="cpu") as stream:
        got = list(stream)
    assert len(got) == 12 and all(same(x, y) for x, y in zip(expected, got))


@pytest.mark.parametrize("depth", [0, 2])
def test_prefetcher_propagates_errors(depth: int) -> None:
    def source():
        for i in range(3):
            yield Batch({"x": torch.tensor([i])}, 1, 1)
        raise RuntimeError("disk on fire")

    stream = Prefetcher(source(), depth=depth)
    assert [int(next(stream).inputs["x"]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="disk on fire"):
        next(stream)
    stream.close()


def test_prefetcher_close_stops_an_endless_worker() -> None:
    def endless():
        while True:
            yield Batch({"x": torch.zeros(1)}, 1, 1)

    def workers() -> int:
        return sum(t.name == "prefetcher" and t.is_alive() for t in threading.enumerate())

    before = workers()
    with Prefetcher(endless(), depth=2) as stream:
        next(stream)
        assert workers() == before + 1
    assert workers() == before
    with pytest.raises(StopIteration):
        next(stream)
