"""Kneser-Ney estimation in bounded memory (`--memory`, lmplz -S): every stage on tables in files.

The stages are kneser_ney.py's, on per-order FileArrays (filearray.py) in a temporary folder, each
read in chunks or windows that fit the budget; only vocabulary-sized arrays are held whole:

    count        external.count_to_files: keys_k, counts_k, suffix_k per order (sorted runs, merged)
    adjust       left_k = bincount(suffix_{k+1}), window by window over the bins; the n-grams that begin
                 with <s> keep their raw count: in trie order (lexicographic) they are one id range
                 per order, found by two searches per order
    discounts    count-of-counts, streamed
    interpolate  order by order, in chunks that never split a context (keys are sorted by context):
                 a(c.) and the discount mass, so gamma(c) and u; p = u + gamma(c) p_{k-1}(suffix),
                 the lower p gathered window by window; log10 p, and log10 gamma as order k-1's back-off
    prune        (--prune t1 t2 ..) interpolate gives a marked n-gram's whole count to gamma(c); then
                 each order is filtered chunk by chunk and its kept n-grams renumbered: a kept key's
                 context id goes through the lower order's new ids (non-decreasing, read in order)
    write        DiskNGramModel.to_arpa streams the files (arpa_write.py); binary.py copies them

The result equals the in-memory estimate bit for bit, pruned or not: every sum adds the same numbers in
the same order (a context's continuations are never split across chunks), every other step is elementwise.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.arpa_write import write_arpa
from seqlm.ngram.counts import NGramCounts
from seqlm.ngram.discounts import BOS_LOG10, Discount, _log10_f32, count_of_counts, cuts_per_order, discount_of
from seqlm.ngram.external import count_to_files
from seqlm.ngram.filearray import (
    Appender,
    FileArray,
    Table,
    gather_answer,
    searchsorted,
    take_sorted,
    windowed_bincount,
    windowed_map,
)
from seqlm.ngram.heap import retained_heap
from seqlm.ngram.index import build_slots_file
from seqlm.ngram.model import NGramModel, ngram_capabilities
from seqlm.protocol import Capabilities, LMBase


@dataclass(frozen=True)
class Budget:
    """How many rows a step handles at once within `memory` bytes."""

    memory: int

    @property
    def chunk(self) -> int:
        """Rows of an order streamed per step (measured: ~110 bytes each at the peak of interpolation)."""
        return max(1024, self.memory // 200)

    @property
    def window(self) -> int:
        """Rows of a table held for random access while queries stream past."""
        return max(1024, self.memory // 48)

    @property
    def slots(self) -> int:
        """Slots of a hash table placed at once (measured: ~30 bytes each at the peak)."""
        return max(1024, self.memory // 96)


class DiskNGramModel(LMBase):
    """An estimated model whose tables are files: it writes itself (ARPA, binary), it is not queried.

    The folder is deleted when the object is. `load()` gives the in-memory NGramModel. It states the
    contract of the model it holds (saved in config.json), the NGramModel's."""

    def capabilities(self) -> Capabilities:
        return ngram_capabilities(self.order)

    def __init__(self, vocab: Vocab, keys: list[Table], log10_prob: list[Table], log10_backoff: list[Table],
                 folder: Path, memory: int):
        self.vocab, self.order, self.folder = vocab, len(keys), folder
        self.keys, self.log10_prob, self.log10_backoff = keys, log10_prob, log10_backoff
        self.index = _Slots(self)  # hash tables (index.py), each built in a file when binary.py asks
        self.budget = Budget(memory)
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(folder), True)

    def __repr__(self) -> str:
        return f"DiskNGramModel(order={self.order}, sizes={self.sizes}, folder={self.folder})"

    @property
    def sizes(self) -> list[int]:
        return [len(k) for k in self.keys]

    def to_arpa(self, path: str | Path) -> None:
        write_arpa(path, self.vocab.itos, self.keys, self.log10_prob, self.log10_backoff)

    def load(self) -> NGramModel:
        arrays = [[np.asarray(a) for a in tables] for tables in (self.keys, self.log10_prob, self.log10_backoff)]
        return NGramModel(self.vocab, *arrays)


class _Slots:
    """model.index of a DiskNGramModel: order k's slot table built in a file on first use (none at k = 1)."""

    def __init__(self, model: DiskNGramModel):
        self.model, self.built = weakref.proxy(model), {}

    def __getitem__(self, i: int) -> FileArray | None:
        if i == 0:
            return None
        if i not in self.built:
            m = self.model
            self.built[i] = build_slots_file(m.keys[i], m.folder / f"slots{i + 1}.bin", m.budget.slots,
                                             m.budget.chunk)
        return self.built[i]


def estimate_bounded(stream: TokenStream, vocab: Vocab, order: int, fallback: tuple[float, float, float],
                     memory: int, tmp_dir: str | Path | None = None, prune: tuple[int, ...] = (0,)
                     ) -> DiskNGramModel:
    """kneser_ney.estimate_model in about `memory` bytes of working space; `vocab` has <s> appended.

    `prune`: lmplz's --prune thresholds (non-decreasing, the last repeats), as kneser_ney.prune_marks.

    The tables go to a new folder in `tmp_dir` (default: TMPDIR); a folder that cannot be made or
    filled (a full disk) is a SeqlmError."""
    where = tmp_dir or tempfile.gettempdir()
    try:
        folder = Path(tempfile.mkdtemp(prefix="seqlm-kn-", dir=tmp_dir))
    except OSError as e:
        raise SeqlmError(f"--memory: cannot make a folder for the estimate's tables in {where} ({e.strerror}); "
                         "set TMPDIR to a directory on a disk with room") from None
    try:
        with retained_heap():  # the stages' arrays, freed chunk after chunk, reused without new page faults
            budget = Budget(memory)
            counts = count_to_files(stream, vocab.bos_id, len(vocab), order, memory, folder)
            adjusted, coc = adjust_counts(counts, folder, budget)
            discounts = [discount_of(k, n, fallback) for k, n in enumerate(coc, 1)]
            cuts = cuts_per_order(prune, order)
            log_p, backoffs = interpolate(counts, adjusted, discounts, folder, budget, cuts)
            keys = counts.keys
            if any(cuts):
                keys, log_p, backoffs = drop_pruned(counts, log_p, backoffs, cuts, folder, budget)
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise SeqlmError(f"--memory: writing the estimate's tables in {folder} failed ({e.strerror}); "
                         "set TMPDIR to a disk with room (GCIDE KN5 needs about 300 MB)") from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    for name in ("counts", "suffix"):
        for t in getattr(counts, name)[1:]:
            t.path.unlink()
    return DiskNGramModel(vocab, keys, log_p, backoffs, folder, memory)


def adjust_counts(counts: NGramCounts, folder: Path, b: Budget) -> tuple[list[Table], list[np.ndarray]]:
    """kneser_ney.adjust_counts on files, and each order's count-of-counts n_1..n_4."""
    V, N, bos = counts.vocab_size, counts.order, counts.bos_id
    lo, hi = bos, bos + 1  # ids of the n-grams that begin with <s>, at order 1
    adjusted, coc = [], []
    for k in range(1, N + 1):
        raw = counts.counts[k - 1]
        if k > 1:
            lo, hi = (searchsorted(counts.keys[k - 1], x * V, b.chunk) for x in (lo, hi))
        if k == N:
            left = raw
        else:
            left = windowed_bincount(counts.suffix[k], len(raw), folder / f"left{k}.bin", b.window, b.chunk)
        if k == 1:
            ids = np.arange(len(raw))
            a = np.where((ids >= lo) & (ids < hi), raw, np.asarray(left))
            a[bos] = 0
            adjusted.append(a)
            coc.append(count_of_counts(a))
            continue
        n = np.zeros(4, dtype=np.int64)
        with Appender(folder / f"adjusted{k}.bin", raw.dtype) as out:  # (int32 where the raw counts are)
            for a0 in range(0, len(raw), b.chunk):
                ids = np.arange(a0, min(len(raw), a0 + b.chunk))
                a = np.where((ids >= lo) & (ids < hi), raw.read(a0, a0 + b.chunk), left.read(a0, a0 + b.chunk))
                n += count_of_counts(a)
                out.add(a)
        if k < N:
            left.path.unlink()
        adjusted.append(out.array)
        coc.append(n)
    return adjusted, coc


def interpolate(counts: NGramCounts, adjusted: list[Table], discounts: list[Discount], folder: Path,
                b: Budget, cuts: list[int] | None = None) -> tuple[list[Table], list[Table]]:
    """initial_probabilities + interpolate of kneser_ney.py, order by order on files."""
    V, N, bos = counts.vocab_size, counts.order, counts.bos_id
    a = adjusted[0]
    taken = discounts[0](a)
    ctx = np.zeros(V, dtype=np.int64)
    total, mass = np.bincount(ctx, weights=a, minlength=1), np.bincount(ctx, weights=taken, minlength=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (a - taken) / total[ctx] + (mass / total)[0] * (1.0 / (V - 1))  # (V,) float64
    p[bos] = 0.0
    log_p, backoffs = [_log10_f32(p)], []
    log_p[0][bos] = BOS_LOG10
    lower: Table = p
    for k in range(2, N + 1):
        cut = cuts[k - 1] if cuts else 0
        log_p_k, backoff, p_k = _order(counts, k, adjusted[k - 1], discounts[k - 1], lower, folder, b, cut)
        log_p.append(log_p_k)
        backoffs.append(np.asarray(backoff) if k == 2 else backoff)
        if isinstance(lower, FileArray):
            lower.path.unlink()
        adjusted[k - 1].path.unlink()
        lower = p_k
    return log_p, backoffs


def _order(counts: NGramCounts, k: int, adjusted: FileArray, disc: Discount, lower: Table, folder: Path,
           b: Budget, cut: int = 0) -> tuple[FileArray, FileArray, FileArray | None]:
    """Order k: log10 p_k, order k-1's log10 back-off and (below the highest order) p_k in float64.

    cut > 0: an n-gram seen at most `cut` times gives its whole adjusted count to gamma (lmplz's
    CutoffCount, as kneser_ney.initial_probabilities); drop_pruned removes it afterwards."""
    V, keys = counts.vocab_size, counts.keys[k - 1]
    # (M_k,) p_{k-1} of each n-gram's suffix; with a cut, only of the n-grams kept (pruned ones: NaN, dropped):
    # a kept n-gram's suffix is seen at least as often, so kept too, and order k+1 reads no NaN from p_k
    kept = (lambda a, z: counts.counts[k - 1].read(a, z) > cut) if cut else None
    below = windowed_map(lower, counts.suffix[k - 1], folder / f"lower{k}.bin", np.float64, np.nan, gather_answer,
                         b.window, b.chunk, kept)
    keep_p = k < counts.order
    with (Appender(folder / f"logp{k}.bin", np.float32) as log_p, Appender(folder / f"p{k}.bin", np.float64) as p_out,
          Appender(folder / f"backoff{k - 1}.bin", np.float32) as backoff):
        done = 0  # contexts (order k-1 ids) whose back-off is written
        for a0, key in context_chunks(keys, V, b.chunk):
            ctx = key // V  # (m,) sorted, no context split across chunks
            new = np.ones(len(ctx), dtype=bool)
            new[1:] = ctx[1:] != ctx[:-1]
            local = np.cumsum(new) - 1  # (m,) dense context number within the chunk
            a = adjusted.read(a0, a0 + len(key))
            taken = disc(a)
            if cut:
                taken = np.where(counts.counts[k - 1].read(a0, a0 + len(key)) <= cut, a, taken)  # (m,)
            total, mass = np.bincount(local, weights=a), np.bincount(local, weights=taken)  # (c,)
            with np.errstate(divide="ignore", invalid="ignore"):
                gamma = mass / total  # (c,)
                p = (a - taken) / total[local] + gamma[local] * below.read(a0, a0 + len(key))  # (m,)
            log_p.add(_log10_f32(p))
            if keep_p:
                p_out.add(p)
            done = _add_backoffs(backoff, done, ctx[new], gamma, b.chunk)
        _add_backoffs(backoff, done, np.zeros(0, dtype=np.int64), np.zeros(0), b.chunk, end=len(counts.keys[k - 2]))
    below.path.unlink()
    if not keep_p:
        p_out.path.unlink()
    return log_p.array, backoff.array, p_out.array if keep_p else None


def drop_pruned(counts: NGramCounts, log_p: list[Table], backoffs: list[Table], cuts: list[int], folder: Path,
                b: Budget) -> tuple[list[Table], list[Table], list[Table]]:
    """kneser_ney.drop_pruned on files: each order's n-grams seen more than its cut, renumbered.

    A kept n-gram's context is kept (thresholds never decrease), so its new key is the context's new id
    (order k-1's table of new ids, read in key order: contexts are non-decreasing) times V plus its word."""
    N = counts.order
    keys_out, p_out, bo_out = [counts.keys[0]], [log_p[0]], backoffs[:1]
    new_id: FileArray | None = None  # order k-1's new id of each old id (order 1: unchanged)
    for k in range(2, N + 1):
        top = k == N
        keys, logp, bo, ids = _kept_order(counts, k, log_p[k - 1], None if top else backoffs[k - 1], cuts[k - 1],
                                          new_id, folder, b)
        done = [counts.keys[k - 1], log_p[k - 1]] + ([] if top else [backoffs[k - 1]]) + [new_id]
        for t in done:
            if t is not None:
                t.path.unlink()
        new_id = ids
        keys_out.append(keys)
        p_out.append(logp)
        if not top:
            bo_out.append(bo)
    return keys_out, p_out, bo_out


def _kept_order(counts: NGramCounts, k: int, log_p: Table, backoff: Table | None, cut: int,
                new_id: FileArray | None, folder: Path, b: Budget) -> tuple[FileArray, ...]:
    """Order k's kept keys (renumbered), log10 p and back-off, and the new id of every old n-gram (None
    at the highest order)."""
    V, top = counts.vocab_size, backoff is None
    with (Appender(folder / f"kept-keys{k}.bin", np.int64) as keys,
          Appender(folder / f"kept-logp{k}.bin", np.float32) as logp,
          Appender(folder / f"kept-backoff{k}.bin", np.float32) as bo,
          Appender(folder / f"new-id{k}.bin", np.int64) as ids):
        kept = 0
        for a0 in range(0, len(counts.keys[k - 1]), b.chunk):
            keep = counts.counts[k - 1].read(a0, a0 + b.chunk) > cut  # (m,)
            key = counts.keys[k - 1].read(a0, a0 + b.chunk)[keep]  # (m',)
            ctx = key // V if new_id is None else take_sorted(new_id, key // V)  # (m',)
            keys.add(ctx * V + key % V)
            logp.add(log_p[a0 : a0 + b.chunk][keep])
            if not top:
                bo.add(backoff[a0 : a0 + b.chunk][keep])
                ids.add(kept + np.cumsum(keep) - 1)  # (m,) meaningful where kept
            kept += int(keep.sum())
    if top:
        bo.array.path.unlink()
        ids.array.path.unlink()
    return keys.array, logp.array, None if top else bo.array, None if top else ids.array


def _add_backoffs(out: Appender, done: int, contexts: np.ndarray, gamma: np.ndarray, chunk: int,
                  end: int | None = None) -> int:
    """Append log10 back-offs for contexts done .. (the last of `contexts` or `end`): gamma where given,
    NaN (read as 0: never followed by anything) in between. Returns the new `done`."""
    end = int(contexts[-1]) + 1 if end is None else end
    for a0 in range(done, end, chunk):
        g = np.full(min(chunk, end - a0), np.nan)
        i, j = np.searchsorted(contexts, [a0, a0 + len(g)])
        g[contexts[i:j] - a0] = gamma[i:j]
        out.add(np.nan_to_num(_log10_f32(g), nan=0.0))
    return max(done, end)


def context_chunks(keys: Table, V: int, size: int) -> Iterator[tuple[int, np.ndarray]]:
    """(start, keys) of consecutive chunks of about `size` rows that never split a context (keys // V)."""
    a, M = 0, len(keys)
    while a < M:
        key = keys[a : a + size]
        if a + len(key) < M:
            ctx = key // V
            cut = int(np.searchsorted(ctx, ctx[-1]))  # the last context may continue: leave it for later
            if cut > 0:
                key = key[:cut]
            else:  # one context fills the chunk: read on to its end
                end = a + len(key) + searchsorted(_Offset(keys, a + len(key)), (int(ctx[-1]) + 1) * V, size)
                key = keys[a:end]
        yield a, key
        a += len(key)


class _Offset:
    """keys[start:] as a table for filearray.searchsorted."""

    def __init__(self, keys: Table, start: int):
        self.keys, self.start = keys, start

    def chunks(self, size: int) -> Iterator[tuple[int, np.ndarray]]:
        for a in range(self.start, len(self.keys), size):
            yield a - self.start, self.keys[a : a + size]
