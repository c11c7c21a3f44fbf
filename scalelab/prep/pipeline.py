"""The prep of one corpus on a Dask cluster, phase by phase (docs/prep.md has the picture).

    index    newline counts per byte block of every file: line numbers and block offsets
    locate   (translation) the target file's offset at the first line of each source block
    scan     per block: samples, tokens, labels, marks; token counts merged pairwise as blocks finish
    held     (no validation files) token counts of the held-out samples, taken off the vocabulary
    encode   per training shard: read its samples from the nearest mark, write ids as Arrow
    regroup  held-out samples gathered into validation shards (or: encode the validation files)
    manifest vocabularies and manifest written last

The driver (this module) only plans: it sees sizes, counts and marks, never the text or the ids,
and builds the vocabulary from the merged counts with `train.text.Vocab` and the hold-out with
`train.text.holdout_split`, the trainer's own rules. The shards depend on the corpus and the
options only, not on the number of workers or on how the blocks fell.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from typing import Any, Callable

import numpy as np

from scalelab.core.errors import DataError
from scalelab.prep import tasks
from scalelab.prep.checks import check_split
from scalelab.prep.corpus import (
    Block,
    Position,
    blocks_of,
    expand,
    flag,
    index_block,
    locate_lines,
    number_lines,
)
from scalelab.prep.families import Payload, Rules
from scalelab.prep.request import PrepRequest
from scalelab.train.shard_format import (
    CONFIG_FIELDS,
    FORMAT,
    MANIFEST,
    VERSION,
    VOCAB_FILES,
    shard_name,
)


class Corpus:
    """The files of one split: per file number a tuple of URLs (one per role), sizes, line blocks."""

    def __init__(self, keys: tuple[str, ...], files: list[list[tuple[str, int]]]) -> None:
        self.keys = keys
        if len({len(f) for f in files}) > 1:
            raise DataError(f"{flag(keys[0])} names {len(files[0])} file(s) but {flag(keys[1])} {len(files[1])}: "
                            "give the parallel files in the same order, one target file per source file")
        self.urls = list(zip(*[[u for u, _ in f] for f in files]))
        self.sizes = list(zip(*[[s for _, s in f] for f in files]))
        self.blocks: list[list[list[Block]]] = []  # [file][role] -> blocks
        self.lines: list[int] = []


class Prep:
    """One run of the pipeline on `client`; `record` receives every task and phase record."""

    def __init__(self, client, request: PrepRequest, record: Callable[[dict], None], run: str = "") -> None:
        self.client, self.request, self.record, self.run_name = client, request, record, run
        self.storage = request.storage
        self.cfg = request.config
        self.family = self.cfg.family

    # ---- running tasks -------------------------------------------------------------------------

    def submit(self, phase: str, calls: list[tuple[Callable, tuple]]) -> list:
        return [self.client.submit(tasks.measured, phase, i, fn, *args, pure=False) for i, (fn, args) in enumerate(calls)]

    def finish(self, phase: str, futures: list, started: float, key: str | None = "result") -> list:
        """Write the records of `futures` and of the phase; fetch `key` of their results here
        (each picked on its worker, so counts or ids never travel to the driver unasked)."""
        records = self.client.gather([self.client.submit(tasks.pick, f, "record", pure=False) for f in futures])
        for rec in records:
            self.record(rec)
        ended = time.time()
        self.record({"kind": "phase", "phase": phase, "tasks": len(futures), "start": started, "end": ended,
                     "seconds": ended - started})
        if key is None:
            return []
        return self.client.gather([self.client.submit(tasks.pick, f, key, pure=False) for f in futures])

    def phase(self, phase: str, calls: list[tuple[Callable, tuple]], key: str | None = "result") -> list:
        started = time.time()
        return self.finish(phase, self.submit(phase, calls), started, key)

    def counted(self, phase: str, calls: list[tuple[Callable, tuple]], key: str | None) -> tuple[list, dict]:
        """Run counting tasks, a few per worker at a time, and merge their token counts pairwise on
        the workers as they finish; return `key` of each task's result (in order) and the total.

        Why not all at once, then a tree: a finished task holds a vocabulary-sized count until it is
        merged, so a thousand blocks done before the first merge would hold a thousand of them.
        Merging as they come keeps a few alive, whatever the corpus size.
        """
        from distributed import as_completed

        if not calls:  # an empty corpus: the checks that follow say which file
            return [], {name: Counter() for name in Rules.for_config(self.cfg, ()).vocabs}
        started, todo, running = time.time(), iter(enumerate(calls)), as_completed()
        counting: set[str] = set()
        briefs, waiting, merges = [], None, 0

        def launch() -> None:
            i, (fn, args) = next(todo, (None, (None, None)))
            if i is not None:
                future = self.client.submit(tasks.measured, phase, i, fn, *args, pure=False)
                counting.add(future.key)
                briefs.append(self.client.submit(tasks.brief, future, key, pure=False))
                running.add(future)

        for _ in range(4 * max(1, len(self.client.scheduler_info()["workers"]))):
            launch()
        for done in running:
            if done.key in counting:
                launch()
            else:
                briefs.append(self.client.submit(tasks.brief, done, None, pure=False))
            if waiting is None:
                waiting = done
            else:
                running.add(self.client.submit(tasks.measured, "merge", merges, _merge, waiting, done, pure=False))
                waiting, merges = None, merges + 1
        total = self.client.submit(tasks.merge_counts, waiting, pure=False)
        parts = self.client.gather(briefs)
        for record, _ in parts:
            self.record(record)
        self.record({"kind": "phase", "phase": phase, "tasks": len(calls) + merges, "start": started,
                     "end": time.time(), "seconds": time.time() - started})
        return [part for record, part in parts if record["phase"] == phase], self.client.gather(total)

    # ---- the phases ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Prep the corpus; return the manifest written."""
        req = self.request
        inputs = tuple(p for patterns in req.inputs.values() for p in patterns)
        self.phase("prepare", [(tasks.prepare_out, (self.storage, req.out, self.run_name, inputs))], key=None)
        train = self.index(req.keys("train"))
        valid = self.index(req.keys("valid")) if req.keys("valid") else None
        pieces = self.pieces(train, req.lines_limit)
        metas, counts = self.counted("scan", [(tasks.scan, (self.storage, self.rules(train), train.urls, p, n, True))
                                              for p, n in pieces], "meta")
        vmetas = self.scan_valid(valid)
        self.check(train, metas, valid, vmetas)
        held = self.hold_out(train, metas) if valid is None else np.zeros(0, dtype=np.int64)
        if len(held) and not self.rules(train).windowed:
            counts = self.without_held(train, pieces, metas, held, counts)
        vocab = self.vocabulary(counts, metas)
        payload = self.client.scatter(Payload({k: {t: i for i, (t, _) in enumerate(v)} for k, v in vocab.items()},
                                              {label: i for i, label in enumerate(self.labels)}),
                                      broadcast=True, hash=False)
        splits = {"train": self.encode(train, metas, held, payload, "train")}
        splits["valid"] = self.regroup(splits["train"].pop("held")) if valid is None else \
            self.encode(valid, vmetas, np.zeros(0, dtype=np.int64), payload, "valid")
        splits["valid"].pop("held", None)
        return self.write_manifest(train, valid, vocab, splits)

    def rules(self, corpus: Corpus) -> Rules:
        return Rules.for_config(self.cfg, corpus.keys)

    def index(self, keys: tuple[str, ...]) -> Corpus:
        """Expand the inputs of `keys`, count the lines of every block, check parallel files agree."""
        req, block = self.request, max(1, int(self.request.block_mb * 2**20))
        corpus = Corpus(keys, [expand(req.inputs[k], k, self.storage) for k in keys])
        corpus.blocks = [[blocks_of(size, block) for size in sizes] for sizes in corpus.sizes]
        calls = [(index_block, (self.storage, url, b.start, b.end))
                 for urls, per_role in zip(corpus.urls, corpus.blocks) for url, blocks in zip(urls, per_role)
                 for b in blocks]
        counts = iter(self.phase("index", calls))
        for urls, per_role in zip(corpus.urls, corpus.blocks):
            lines = [number_lines(blocks, [next(counts) for _ in blocks]) for blocks in per_role]
            if len(set(lines)) > 1:
                raise DataError(f"parallel files differ in length: {urls[0]} has {lines[0]} lines, {urls[1]} has "
                                f"{lines[1]} (line i of {flag(keys[0])} must translate line i of {flag(keys[1])})")
            corpus.lines.append(lines[0])
        return corpus

    def pieces(self, corpus: Corpus, limit: int | None) -> list[tuple[Position, int]]:
        """(start, lines) of every scan task: the lines owned by each block of the first role's files,
        with the other roles' offsets located; only the first `limit` lines when one is given."""
        out: list[tuple[int, int, int, int]] = []  # file, first line, lines, offset
        left = math.inf if limit is None else limit
        for number, per_role in enumerate(corpus.blocks):
            for b in per_role[0]:
                take = min(b.lines, left)
                if take > 0:
                    out.append((number, b.first_line, int(take), b.offset))
                    left -= take
        if len(corpus.keys) == 1:
            return [(Position(f, line, (offset,)), n) for f, line, n, offset in out]
        others = self.locate(corpus, [(f, line) for f, line, _, _ in out])
        return [(Position(f, line, (offset, other)), n) for (f, line, n, offset), other in zip(out, others)]

    def locate(self, corpus: Corpus, wanted: list[tuple[int, int]]) -> list[int]:
        """Byte offsets in the second role's files of the lines `wanted` (file, line)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (f, line) in enumerate(wanted):
            blocks = corpus.blocks[f][1]
            b = max(k for k, blk in enumerate(blocks) if blk.lines and blk.first_line <= line)
            groups.setdefault((f, b), []).append(i)
        calls = []
        for (f, b), items in groups.items():
            blk = corpus.blocks[f][1][b]
            calls.append((locate_lines, (self.storage, corpus.urls[f][1], blk.offset, blk.end,
                                         [wanted[i][1] - blk.first_line for i in items])))
        out = [0] * len(wanted)
        for items, offsets in zip(groups.values(), self.phase("locate", calls)):
            for i, offset in zip(items, offsets):
                out[i] = offset
        return out

    def scan_valid(self, valid: Corpus | None) -> list[dict] | None:
        if valid is None:
            return None
        calls = [(tasks.scan, (self.storage, self.rules(valid), valid.urls, p, n, False))
                 for p, n in self.pieces(valid, None)]
        return [r["meta"] for r in self.phase("scan-valid", calls)]

    def check(self, train: Corpus, metas: list[dict], valid: Corpus | None, vmetas: list[dict] | None) -> None:
        """The text datasets' checks, on counts: empty files, no samples, labels."""
        self.labels = check_split(self.family, self.cfg, train, metas, valid, vmetas)

    def hold_out(self, train: Corpus, metas: list[dict]) -> np.ndarray:
        """Indices of the held-out samples (windows for rnnlm): `train.text.holdout_split`'s choice."""
        from scalelab.train.text import holdout_split

        n = _count_samples(self.rules(train), metas)
        hint = {"nmt": "add more sentence pairs or give --valid-src/--valid-tgt",
                "rnnlm": "add more text or give --valid", "sentiment": "add more lines or give --valid"}[self.family]
        _, held = holdout_split(n, self.request.valid_fraction, train.urls[0][0], hint)
        return held.numpy().astype(np.int64)

    def without_held(self, train: Corpus, pieces: list, metas: list[dict], held: np.ndarray, counts: dict) -> dict:
        """`counts` less the held-out samples' tokens (nmt, sentiment build vocabularies from training
        samples only)."""
        starts = np.cumsum([0] + [m["samples"] for m in metas])
        calls = []
        for k, (pos, n) in enumerate(pieces):
            mine = held[np.searchsorted(held, starts[k]): np.searchsorted(held, starts[k + 1])] - starts[k]
            if len(mine):
                calls.append((tasks.count_held, (self.storage, self.rules(train), train.urls, pos, n, mine)))
        _, minus = self.counted("held", calls, None)
        return {name: c - minus[name] for name, c in counts.items()}

    def vocabulary(self, counts: dict, metas: list[dict]) -> dict[str, Any]:
        """Vocabularies (id -> token, with counts) from the merged counts, as `train.text.Vocab`."""
        from scalelab.train.text import Vocab

        out = {}
        for name, counter in counts.items():
            itos = Vocab.build([counter], self.cfg.vocab_size).itos
            out[name] = [(tok, counter.get(tok, 0) if i >= len(Vocab.SPECIALS) else 0) for i, tok in enumerate(itos)]
        return out

    def encode(self, corpus: Corpus, metas: list[dict], held: np.ndarray, payload: Any, split: str) -> dict:
        """Write the shards of `split`; with `held`, also the held-out samples (to `_held/`).
        `payload` is the vocabulary already sent to every worker (a future)."""
        rules, req = self.rules(corpus), self.request
        total = _count_samples(rules, metas)
        marks = _marks(metas, rules)
        calls = []
        for j, (lo, hi, mine) in enumerate(plan_spans(total, held, req.shard_size)):
            mark = marks[np.searchsorted(marks["unit"], lo * (rules.seq_len if rules.windowed else 1), "right") - 1]
            urls = (self.storage.join(req.out, shard_name(split, j)),
                    self.storage.join(req.out, f"_held/{shard_name('held', j)}") if len(mine) else None)
            calls.append((tasks.encode, (self.storage, rules, corpus.urls, _mark(mark, len(corpus.keys)), (lo, hi), mine, payload, urls)))
        infos = self.phase("encode" if split == "train" else "encode-valid", calls)
        return {"shards": [i["shard"] for i in infos], "held": [i.get("held") for i in infos]}

    def regroup(self, held: list[dict | None]) -> dict:
        """Validation shards of `shard_size` held-out samples, in order, from the pieces `encode` wrote."""
        req, parts, at = self.request, [], 0
        for j, info in enumerate(held):
            if info:
                parts.append((self.storage.join(req.out, f"_held/{info['file']}"), at, at + info["samples"]))
                at += info["samples"]
        calls = []
        for v, lo in enumerate(range(0, at, req.shard_size)):
            hi = min(lo + req.shard_size, at)
            use = [(url, max(lo, a) - a, min(hi, b) - a) for url, a, b in parts if a < hi and b > lo]
            calls.append((tasks.regroup, (self.storage, self.family, use, self.storage.join(req.out, shard_name("valid", v)))))
        return {"shards": self.phase("regroup", calls)}

    def write_manifest(self, train: Corpus, valid: Corpus | None, vocab: dict, splits: dict) -> dict[str, Any]:
        """Vocabulary files, then the manifest (last: its presence means the shards are complete)."""
        req, files = self.request, VOCAB_FILES[self.family]
        calls = [(tasks.write_text, (self.storage, self.storage.join(req.out, files[name]),
                                     "".join(f"{tok}\t{n}\n" for tok, n in entries))) for name, entries in vocab.items()]
        manifest = {
            "format": FORMAT, "version": VERSION, "family": self.family, "model": req.model,
            "config": {k: getattr(self.cfg, k) for k in CONFIG_FIELDS[self.family]},
            "shard_size": req.shard_size,
            "vocab": {name: {"file": files[name], "size": len(entries)} for name, entries in vocab.items()},
            "labels": list(self.labels),
            "valid_from": "files" if valid else "holdout", "valid_fraction": None if valid else req.valid_fraction,
            "sources": {key: [urls[i] for urls in corpus.urls] for corpus in (train, valid) if corpus
                        for i, key in enumerate(corpus.keys)},
            "splits": {s: {"samples": sum(x["samples"] for x in d["shards"]), "tokens": sum(x["tokens"] for x in d["shards"]),
                           "shards": d["shards"]} for s, d in splits.items()},
        }
        calls.append((tasks.cleanup, (self.storage, req.out)))
        self.phase("vocab", calls, key=None)
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        self.phase("manifest", [(tasks.write_manifest, (self.storage, req.out, text))], key=None)
        return manifest


def _merge(*parts: Any) -> tuple[dict, dict]:
    return tasks.merge_counts(*parts), {}


def _count_samples(rules: Rules, metas: list[dict]) -> int:
    """Samples of a split: lines with a sample, or for rnnlm the windows of its stream."""
    if rules.windowed:
        stream = sum(m["units"] for m in metas)
        return max(stream - 1, 0) // rules.seq_len
    return sum(m["samples"] for m in metas)


def _marks(metas: list[dict], rules: Rules) -> np.ndarray:
    """Every mark of the scan with its global unit (sample number, or rnnlm stream position)."""
    rows, base = [], 0
    for meta in metas:
        rows += [(f, line, offs + (0,) * (2 - len(offs)), base + u) for f, line, offs, u in meta["marks"]]
        base += meta["units"]
    dtype = [("file", np.int64), ("line", np.int64), ("offsets", np.int64, (2,)), ("unit", np.int64)]
    return np.array(rows, dtype=dtype)


def _mark(row: Any, roles: int) -> tuple:
    """A mark as `tasks.encode` takes it: (file, line, offsets of the `roles` files, unit)."""
    return int(row["file"]), int(row["line"]), tuple(int(o) for o in row["offsets"][:roles]), int(row["unit"])


def plan_spans(total: int, held: np.ndarray, shard_size: int) -> list[tuple[int, int, np.ndarray]]:
    """(lo, hi, held in [lo, hi)) per training shard: sample numbers [lo, hi) hold exactly
    `shard_size` training samples (the last shard: the rest), the spans tile [0, total)."""
    n_train = total - len(held)
    adjusted = held - np.arange(len(held))  # the t-th training sample is number t + #(adjusted <= t)
    spans, lo = [], 0
    shards = math.ceil(n_train / shard_size)
    for j in range(shards):
        last = min((j + 1) * shard_size, n_train) - 1
        hi = total if j == shards - 1 else last + int(np.searchsorted(adjusted, last, "right")) + 1
        spans.append((lo, hi, held[np.searchsorted(held, lo): np.searchsorted(held, hi)]))
        lo = hi
    return spans
