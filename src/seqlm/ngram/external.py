"""Stage `count` in bounded memory (lmplz -S): the same NGramCounts as counts.count_ngrams, exactly.

The in-memory counter sorts every position of the corpus at once, which takes ~100 bytes per token.
Here the corpus is read in chunks of whole sentences straight from the memory-mapped id cache (no copy
of the token stream), order by order as the in-memory counter goes:

    order k, chunk c:  keys of the k-grams ending in the chunk (prefix * V + word, the prefix's rank in
                       the chunk's run at k-1, renumbered as merged ids after the sort)
                       -> np.unique with counts: a sorted run, spilled to disk, and each position's
                          rank in that run (unique's inverse, int32), spilled too
    all runs           -> merged window by window (a k-way merge of sorted files) into the files
                          keys{k}, counts{k}, suffix{k} (filearray.FileArray; counts and suffix int32
                          below 2^31 positions), and for each run the
                          merged id of each of its keys (runmap{k}-{c})
    order k+1, chunk c -> each position's prefix: its rank in run c (run c's merged ids for the keys)

Only one chunk's positions and one window per run are in memory. The unigram
counts (vocabulary-sized) stay in memory. `count_to_files` leaves the per-order tables in the folder
it is given (external_estimate.py works on them); `count_ngrams_bounded` reads them back into arrays
and deletes its temporary folder (in TMPDIR unless told otherwise).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.ngram.counts import NGramCounts, Scratch, id_dtype, unique
from seqlm.ngram.filearray import Appender, FileArray
from seqlm.ngram.native import extension

BYTES_PER_POSITION = 256  # measured: ~200 bytes per position at the peak of counting (the sort and its inputs)
RUN_FIELDS = 3  # key, count, suffix: int64 each
RANK = np.dtype(np.int32)  # a position's rank in its chunk's run: below a chunk's positions (memory // 256)


def chunk_bounds(starts: np.ndarray, max_positions: int) -> list[tuple[int, int]]:
    """Sentence ranges [s0, s1) whose tokens plus <s> markers fit in max_positions (one sentence at least)."""
    bounds, s0, n = [], 0, len(starts) - 1
    while s0 < n:
        limit = starts[s0] + s0 + max_positions  # augmented position where the chunk must end
        s_end = min(n, s0 + max_positions)  # each sentence takes at least one position (its <s>)
        aug_end = starts[s0 + 1 : s_end + 1] + np.arange(s0 + 1, s_end + 1)  # (<= max_positions,) sentence ends
        s1 = s0 + max(1, int(np.searchsorted(aug_end, limit, side="right")))
        bounds.append((s0, s1))
        s0 = s1
    return bounds


def _chunk(stream: TokenStream, s0: int, s1: int, bos_id: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """seq (counts.with_sentence_starts) of sentences s0..s1-1, read from the id cache, and the positions in
    it that end an order-k n-gram: at least k-1 after their sentence's <s> (marked per sentence, not per
    position)."""
    starts = np.asarray(stream.starts[s0 : s1 + 1], dtype=np.int64)  # (S+1,)
    ids = np.asarray(stream.ids[starts[0] : starts[-1]], dtype=np.int64)  # (N,) one chunk, copied
    lengths = np.diff(starts)  # (S,)
    bos_at = (starts[:-1] - starts[0]) + np.arange(len(lengths))  # (S,)
    seq = np.empty(len(ids) + len(lengths), dtype=np.int64)
    ends = np.ones(len(seq), dtype=bool)  # (L,)
    ends[bos_at] = False
    seq[ends], seq[bos_at] = ids, bos_id
    for d in range(1, k - 1):  # the first k-2 words of a sentence end no k-gram either
        ends[(bos_at + d)[lengths >= d]] = False
    return seq, np.flatnonzero(ends)


class _Runs:
    """Sorted runs (key, count, suffix) of one order, one file each, merged window by window. packed: rows
    (key, count << 32 | suffix), a third less to write and read, where counts and ids fit 31 bits."""

    def __init__(self, folder: Path, k: int, scratch: Scratch, packed: bool):
        self.folder, self.k, self.sizes, self.scratch = folder, k, [], scratch
        self.fields = 2 if packed else RUN_FIELDS

    def add(self, keys: np.ndarray, counts: np.ndarray, suffix: np.ndarray) -> None:
        rows = self.scratch("rows", self.fields * len(keys)).reshape(-1, self.fields)  # (M, 2 or 3)
        rows[:, 0] = keys
        if self.fields == 2:
            np.left_shift(counts, 32, out=rows[:, 1])
            rows[:, 1] |= suffix
        else:
            rows[:, 1], rows[:, 2] = counts, suffix
        rows.tofile(self.folder / f"run{self.k}-{len(self.sizes)}.bin")
        self.sizes.append(len(keys))

    def _read(self, i: int, at: int, count: int) -> np.ndarray:
        """Rows [at, at + count) of run i, into the one of run i's two windows not read last (the other
        may still hold the part being merged)."""
        self.flip[i] ^= 1
        buf = self.scratch(f"window{i}-{self.flip[i]}", count * self.fields)
        got = _read_into(self.folder / f"run{self.k}-{i}.bin", at * self.fields, buf)
        return buf[: got - got % self.fields].reshape(-1, self.fields)

    def _merge_step(self, parts: list[np.ndarray], out: list[Appender], maps: list[Appender], done: int) -> int:
        """Append the merge of `parts` (each (n_i, fields) rows sorted by key, no key twice in one) to `out`, and
        to each map the merged ids of its part's keys (ids from `done` on). Returns how many keys it added:
        compiled (_count.cpp merge_runs) or numpy (a stable argsort, which merges the runs it finds)."""
        if (ext := extension()) is not None:
            n = sum(len(p) for p in parts)
            columns = [self.scratch(name, n) for name in ("keys", "counts", "suffix")]
            ids = [self.scratch(f"ids{i}", len(p)) for i, p in enumerate(parts)] if maps else None
            m = ext.merge_runs([np.ascontiguousarray(p) for p in parts], *columns, ids, done, self.fields)
            for o, column in zip(out, columns, strict=True):
                o.add(column[:m])
            for a, part_ids in zip(maps, ids or [], strict=True):
                a.add(part_ids)
            return m
        block = np.concatenate(parts)  # (P, fields) sorted runs one after another
        keys, first, inverse, _ = unique(block[:, 0], runs=True)
        count, suffix = (block[:, 1] >> 32, block[:, 1] & 0xFFFFFFFF) if self.fields == 2 else block[:, 1:].T
        for o, column in zip(out, (keys, np.bincount(inverse, count), suffix[first]), strict=True):
            o.add(column)
        a = 0
        for m, part in zip(maps, parts):  # (no maps without ids)
            m.add(inverse[a : a + len(part)] + done)  # (n_i,) merged ids of run i's keys in this step
            a += len(part)
        return len(keys)

    def merge(self, window: int, out: list[Appender], ids: type | None) -> None:
        """Append (keys, counts, suffix) of all runs to `out`, equal keys summed. Each step takes, from
        every run, the keys up to the smallest last key of the current windows, so no later key can
        precede them. ids (a dtype): also write runmap{k}-{i}.bin, the merged id of each key of run i."""
        at, done, self.flip = [0] * len(self.sizes), 0, [0] * len(self.sizes)
        bufs = [self._read(i, 0, window) for i in range(len(self.sizes))]
        maps = [Appender(self.folder / f"runmap{self.k}-{i}.bin", ids) for i in range(len(bufs))] if ids else []
        while any(len(b) for b in bufs):
            pivot = min(int(b[-1, 0]) for b in bufs if len(b))
            parts = []
            for i, b in enumerate(bufs):
                n = int(np.searchsorted(b[:, 0], pivot, side="right")) if len(b) else 0
                parts.append(b[:n])
                at[i] += n
                bufs[i] = b[n:] if n < len(b) else self._read(i, at[i], window)
            done += self._merge_step(parts, out, maps, done)
        for m in maps:
            m.__exit__()
        for i in range(len(self.sizes)):
            (self.folder / f"run{self.k}-{i}.bin").unlink()


def count_ngrams_bounded(stream: TokenStream, bos_id: int, vocab_size: int, order: int, memory: int,
                         tmp_dir: str | Path | None = None) -> NGramCounts:
    """count_ngrams within about `memory` bytes of working space, as in-memory arrays at the end (counts int64,
    as count_ngrams gives them; the files may hold int32)."""
    folder = Path(tempfile.mkdtemp(prefix="seqlm-kn-", dir=tmp_dir))
    try:
        c = count_to_files(stream, bos_id, vocab_size, order, memory, folder)
        return NGramCounts(vocab_size, bos_id, [np.asarray(a) for a in c.keys],
                           [np.asarray(a).astype(np.int64) for a in c.counts], [np.asarray(a) for a in c.suffix])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def count_to_files(stream: TokenStream, bos_id: int, vocab_size: int, order: int, memory: int,
                   folder: Path) -> NGramCounts:
    """count_ngrams within about `memory` bytes: orders >= 2 as FileArrays (keys{k}, counts{k},
    suffix{k} in `folder`), the unigrams in memory."""
    V = vocab_size
    starts = np.asarray(stream.starts, dtype=np.int64)
    bounds = chunk_bounds(starts, max(1024, min(memory // BYTES_PER_POSITION, 2**31 - 1)))  # ranks fit RANK
    unigram = np.zeros(V, dtype=np.int64)
    for s0, s1 in bounds:
        unigram += np.bincount(stream.ids[stream.starts[s0] : stream.starts[s1]], minlength=V)
        unigram[bos_id] += s1 - s0  # <s> once per sentence
    keys, counts, suffix = [np.arange(V, dtype=np.int64)], [unigram], [np.full(V, -1, dtype=np.int64)]
    scratch = Scratch()
    small = id_dtype(len(stream.ids) + len(starts))  # holds any count (<= positions) and any n-gram id
    for k in range(2, order + 1):
        k_keys, k_counts, k_suffix = _count_order(stream, bounds, bos_id, V, k, folder, memory, k < order, scratch,
                                                  small)
        keys.append(k_keys)
        counts.append(k_counts)
        suffix.append(k_suffix)
        if k > 2:  # order k-1's ranks and run maps have served as order k's prefixes
            for f in [folder / f"rank{k - 1}.bin", *(folder / f"runmap{k - 1}-{c}.bin" for c in range(len(bounds)))]:
                f.unlink(missing_ok=True)
    return NGramCounts(V, bos_id, keys, counts, suffix)


def _prefix_ids(stream, bounds, c, k, folder, scratch, small) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Where chunk c's (k-1)-grams stand in the merged numbering (k > 2): each position's rank in chunk c's
    run of order k-1 (L,) int32, -1 where no (k-1)-gram ends, and that run's merged ids (None with one
    run: the rank is the id). (None, None) for k = 2: the prefixes are words."""
    if k == 2:
        return None, None
    s0, s1 = bounds[c]
    rank = scratch("prefix-rank", _positions(stream, s0, s1), RANK.type)  # (L,)
    _read_into(folder / f"rank{k - 1}.bin", int(stream.starts[s0]) + s0, rank)
    if len(bounds) == 1:
        return rank, None
    path = folder / f"runmap{k - 1}-{c}.bin"
    merged = scratch("merged", path.stat().st_size // np.dtype(small).itemsize, small)  # (keys of run c,)
    _read_into(path, 0, merged)
    return rank, merged


def _positions(stream: TokenStream, s0: int, s1: int) -> int:
    """L: the positions of sentences s0..s1-1 with a <s> before each (their words, </s> and <s>)."""
    return int(stream.starts[s1] - stream.starts[s0]) + s1 - s0


def _read_into(path: Path, at: int, out: np.ndarray) -> int:
    """Read the file's elements from element `at` on into `out` (a reused array: no fresh pages); returns how
    many it read (fewer at the end of the file)."""
    with open(path, "rb") as f:
        f.seek(at * out.itemsize)
        return f.readinto(memoryview(out).cast("B")) // out.itemsize


def _chunk_keys(stream, s0, s1, bos_id, V, k, rank, scratch) -> tuple[np.ndarray, np.ndarray]:
    """key (P,) = prefix * V + word of each order-k n-gram ending in sentences s0..s1-1, and at (P,) its
    position in the chunk's seq, in position order: compiled (_count.cpp chunk_keys) or numpy, the same.
    The prefix is a word (k = 2) or the (k-1)-gram's rank in the chunk's run (`rank`): the chunk's keys sort
    as their merged ids would, and only the distinct ones are renumbered after the sort."""
    if (ext := extension()) is not None:
        starts = np.asarray(stream.starts[s0 : s1 + 1], dtype=np.int64)  # (S+1,)
        ids = np.asarray(stream.ids[starts[0] : starts[-1]], dtype=np.int32)  # (N,) no copy of the id cache
        P = int(np.maximum(np.diff(starts) + 2 - k, 0).sum())  # words and </s> at least k-1 after <s>
        key, at = scratch("key", P), scratch("at", P)
        ext.chunk_keys(ids, starts, bos_id, k, V, rank, key, at)
        return key, at
    seq, at = _chunk(stream, s0, s1, bos_id, k)
    gram = seq if rank is None else rank.astype(np.int64)  # (L,)
    key = gram[at - 1]  # (P,) the prefix ends one position earlier
    key *= V
    key += seq[at]
    return key, at


def _count_order(stream, bounds, bos_id, V, k, folder, memory, with_ids: bool, scratch: Scratch, small: type
                 ) -> tuple[FileArray, FileArray, FileArray]:
    """Sorted runs of one order, one per chunk, merged into keys{k} (int64), counts{k} and suffix{k} (`small`:
    a third less to write and read back than int64); with_ids (below the highest order): also rank{k} (each
    position's rank in its chunk's run) and the runs' merged ids."""
    runs = _Runs(folder, k, scratch, packed=small == np.int32)
    out = [Appender(folder / f"{name}{k}.bin", dtype) for name, dtype in (("keys", np.int64), ("counts", small),
                                                                           ("suffix", small))]
    ranks = Appender(folder / f"rank{k}.bin", RANK) if with_ids else None
    for c, (s0, s1) in enumerate(bounds):
        rank, merged = _prefix_ids(stream, bounds, c, k, folder, scratch, small)
        key, at = _chunk_keys(stream, s0, s1, bos_id, V, k, rank, scratch)  # (P,) each, at: positions
        uniq, first, inverse, cnt = unique(key, overwrite=True, inverse=with_ids, scratch=scratch)  # np.unique's
        del key
        if merged is not None:  # prefixes as ranks in this chunk's run -> merged ids (in the same order)
            uniq = np.multiply(merged[uniq // V], V, dtype=np.int64) + uniq % V  # (M,)
        if rank is None:
            suffix = uniq % V  # (M,) the (k-1)-gram ending where a bigram ends: its word
        else:
            suffix = rank[at[first]].astype(np.int64) if merged is None else merged[rank[at[first]]]  # (M,)
        columns = (uniq, cnt, suffix)
        if len(bounds) > 1:
            runs.add(*columns)
        else:
            for o, column in zip(out, columns, strict=True):
                o.add(column)
        if ranks is not None:
            ranked = scratch("rank", _positions(stream, s0, s1), RANK.type)  # (L,)
            ranked.fill(-1)
            ranked[at] = inverse  # each position's rank in this chunk's run
            ranks.add(ranked)
    if ranks is not None:
        ranks.__exit__()
    if len(bounds) > 1:  # ~10x the windows at the peak
        scratch.clear()  # the chunks' arrays, before the windows'
        runs.merge(max(1024, memory // (12 * RUN_FIELDS * 8 * len(runs.sizes))), out, ids=small if with_ids else None)
    scratch.clear()
    for o in out:
        o.__exit__()
    return out[0].array, out[1].array, out[2].array
