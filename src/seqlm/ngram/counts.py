"""Stage 1 of the estimator: count every n-gram of orders 1..N in a corpus, vectorised.

Sentences are read as `<s> w1 .. wn </s>`, as KenLM's lmplz reads them; an n-gram never crosses a
sentence boundary, and `<s>` occurs only as the first word of an n-gram (it is never predicted).

N-grams are numbered like the levels of a trie, which keeps every key an int64 whatever the order:
a unigram's id is its word id; an n-gram of order k > 1 has the key `prefix_id * V + last_word`,
where `prefix_id` is the id of its first k-1 words at order k-1, and its id is the rank of that key
among the sorted keys of order k. The same numbering is what `NGramModel` searches at query time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.ngram.native import extension


@dataclass
class NGramCounts:
    """Every n-gram seen in the text, per order k = 1..N (index k-1 in each list).

    `keys[0]` is arange(V): every vocabulary word is a unigram, seen or not.
    """

    vocab_size: int
    bos_id: int
    keys: list[np.ndarray]  # (M_k,) int64, sorted; order k > 1: prefix_id * V + last word
    # (M_k,) int64 raw occurrence counts (<s> unigram: number of sentences); float64 when fractional (weighted
    # lines, count files)
    counts: list[np.ndarray]
    suffix: list[np.ndarray]  # (M_k,) id at order k-1 of the n-gram minus its first word; order 1: -1

    @property
    def order(self) -> int:
        return len(self.keys)

    def prefix(self, k: int) -> np.ndarray:
        """(M_k,) id at order k-1 of each order-k n-gram's first k-1 words (its context)."""
        return self.keys[k - 1] // self.vocab_size

    def last_word(self, k: int) -> np.ndarray:
        """(M_k,) the predicted (last) word of each order-k n-gram."""
        return self.keys[k - 1] % self.vocab_size

    def first_word(self, k: int) -> np.ndarray:
        """(M_k,) the first word of each order-k n-gram, found by following prefixes down to order 1."""
        ids = np.arange(len(self.keys[k - 1]), dtype=np.int64)  # (M_k,)
        for j in range(k, 1, -1):
            ids = self.keys[j - 1][ids] // self.vocab_size  # (M_k,) ids at order j-1
        return ids


def id_dtype(n: int) -> type:
    """The narrowest of int32/int64 that holds ids 0..n-1 and -1: halves the big arrays of the
    estimator (its peak RSS against lmplz is a goal), int64 past 2^31 n-grams or tokens."""
    return np.int32 if n < 2**31 else np.int64


def with_sentence_starts(stream: TokenStream, bos_id: int, clip: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The corpus as one array with `<s>` before each sentence, and each token's position in its sentence.

    Returns seq (L,) int64 and pos (L,) int64, pos == 0 exactly at the inserted `<s>`. With `clip`
    (the order, at most 255) pos is min(pos, clip) as uint8 and seq has id_dtype(V): all the counter
    compares pos with, at an eighth and a half of the memory.
    """
    dtype = np.int64 if clip is None else id_dtype(max(int(bos_id) + 1, int(np.max(stream.ids, initial=0)) + 1))
    ids = np.asarray(stream.ids, dtype=dtype)  # (N,)
    starts = np.asarray(stream.starts, dtype=np.int64)  # (S+1,)
    lengths = np.diff(starts)  # (S,)
    bos_at = starts[:-1] + np.arange(len(lengths))  # (S,) where each <s> lands in the longer array
    seq = np.empty(len(ids) + len(lengths), dtype=dtype)  # (L,)
    is_word = np.ones(len(seq), dtype=bool)  # (L,)
    is_word[bos_at] = False
    seq[is_word], seq[bos_at] = ids, bos_id
    del ids, is_word
    pos = np.arange(len(seq)) - np.repeat(bos_at, lengths + 1)  # (L,)
    if clip is not None:
        pos = np.minimum(pos, clip).astype(np.uint8)  # (L,)
    return seq, pos


def count_ngrams(stream: TokenStream, bos_id: int, vocab_size: int, order: int,
                 weights: np.ndarray | None = None) -> NGramCounts:
    """Stage `count`: TokenStream (ids with </s> closing each sentence) -> NGramCounts of orders 1..order.

    One np.unique per order over all positions: gram[j] holds the id at the current order of the
    n-gram ending at position j (-1 where it would cross the sentence start). `weights` (S,), one per
    sentence (SRILM's -text-has-weights): each n-gram counts its sentences' weights summed instead of 1.
    """
    seq, pos = with_sentence_starts(stream, bos_id, clip=order if order < 256 else None)
    V = vocab_size
    small = id_dtype(len(seq))  # ids of n-grams at any order, and of their suffixes
    at_pos = None if weights is None else np.repeat(np.asarray(weights, dtype=np.float64), np.diff(stream.starts) + 1)
    keys = [np.arange(V, dtype=np.int64)]
    counts = [np.bincount(seq, minlength=V).astype(np.int64) if at_pos is None  # (V,) <s> once per sentence
              else weighted_counts(np.bincount(seq, weights=at_pos, minlength=V))]
    suffix = [np.full(V, -1, dtype=small)]
    gram = seq  # (L,) order-1 ids are word ids
    for k in range(2, order + 1):
        at = np.flatnonzero(pos >= k - 1)  # (P,) positions that end an order-k n-gram
        key = gram[at - 1].astype(np.int64)  # (P,) the prefix ends one position earlier; then: prefix * V + word
        key *= V
        key += seq[at]
        uniq, first, inverse, cnt = unique(key, overwrite=True)  # big temporaries reused: this is the peak
        del key
        keys.append(uniq)
        counts.append(cnt if at_pos is None else weighted_counts(np.bincount(inverse, at_pos[at], len(uniq))))
        suffix.append(gram[at[first]].astype(small, copy=False))  # (M_k,) the (k-1)-gram ending where each ends
        del first, cnt
        gram = np.full(len(seq), -1, dtype=small) if gram is seq else gram  # (L,)
        gram.fill(-1)
        gram[at] = inverse
        del at, inverse
    return NGramCounts(V, bos_id, keys, counts, suffix)


def weighted_counts(summed: np.ndarray) -> np.ndarray:
    """Counts summed as float64 (np.bincount's weights) as int64 when every one is a whole number, so that
    whole weights count exactly as repeated lines do; fractional counts stay float64."""
    whole = np.all(summed == np.floor(summed)) and float(summed.max(initial=0)) < 2.0**53
    return summed.astype(np.int64) if whole else summed


class Scratch:
    """Working arrays by name, kept from one call to the next and grown when asked for more. A fresh array of
    a hundred megabytes costs the kernel a zeroed page per 4 kB on first touch: a quarter of bounded
    counting's time at 100M tokens (perf: clear_page), where reusing its arrays chunk after chunk costs
    nothing. A named array is valid until the next request for that name."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def __call__(self, name: str, n: int, dtype: type = np.int64) -> np.ndarray:
        a = self._arrays.get(name)
        if a is None or len(a) < n or a.dtype != dtype:
            self._arrays.pop(name, None)  # the old one freed before the new one is made
            a = self._arrays[name] = np.empty(n, dtype=dtype)
        return a[:n]

    def arange(self, n: int) -> np.ndarray:
        """arange(n) as int64, filled only when n passes what it holds."""
        have = self._arrays.get("arange")
        if have is None or len(have) < n:
            have = self("arange", n)
            have[:] = np.arange(n, dtype=np.int64)
        return have[:n]

    def clear(self) -> None:
        self._arrays.clear()


def _fresh(name: str, n: int, dtype: type = np.int64) -> np.ndarray:
    return np.empty(n, dtype=dtype)


def unique(key: np.ndarray, overwrite: bool = False, runs: bool = False, inverse: bool = True,
           scratch: Scratch | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """np.unique(key, return_index=True, return_inverse=True, return_counts=True) for int64 keys >= 0,
    the same four arrays, faster: np.unique's stable argsort is the bulk of counting. When the keys leave
    room for the positions in 63 bits, one plain sort of `key << bits | position` gives the keys sorted
    and, within a key, its positions in order: the stable argsort for free; otherwise the keys are
    argsorted (stable) by sort_keys. overwrite: `key` may be used as scratch space (its contents are lost).
    runs: `key` is a few sorted runs one after another (a merge): numpy's stable argsort (a timsort, which
    merges runs it finds) is then several times faster than any full sort. inverse=False: None for the
    inverse (its scatter is a random write per key). scratch: the work arrays and all four results come
    from it (valid until the next call with it)."""
    n = len(key)
    get = scratch or _fresh
    if n == 0:
        uniq, first, out, cnt = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        return uniq, first, out if inverse else None, cnt
    bits = max(int(n - 1).bit_length(), 1)
    work = key if overwrite else key.copy()  # (P,)
    packed = not runs and int(key.max()) < 1 << (63 - bits)
    if runs:
        perm = np.argsort(work, kind="stable")  # (P,)
        work[:] = work[perm]
    elif packed:
        work <<= bits
        work |= np.arange(n, dtype=np.int64) if scratch is None else scratch.arange(n)
        sort_keys(work, scratch=scratch)
        perm = None
    else:
        perm = sort_keys(work, stable_argsort=True, scratch=scratch)
    if (ext := extension()) is not None:  # what follows, in one compiled pass (_sort.cpp sorted_runs)
        m = ext.sorted_runs(work, bits, perm, None, None, None, None)
        uniq, first, cnt = (get(name, m) for name in ("uniq", "first", "count"))
        out = get("inverse", n) if inverse else None
        ext.sorted_runs(work, bits, perm, uniq, first, cnt, out)
        return uniq, first, out, cnt
    if packed:
        perm = work & ((1 << bits) - 1)  # (P,) the stable argsort of key
        work >>= bits  # (P,) key sorted
    new = np.empty(n, dtype=bool)  # (P,) where a run of equal keys begins
    new[0] = True
    np.not_equal(work[1:], work[:-1], out=new[1:])
    begin = np.flatnonzero(new)  # (M,)
    uniq = work[begin]
    if not inverse:
        return uniq, perm[begin], None, np.diff(begin, append=n)
    run = np.cumsum(new, dtype=np.int64, out=work)  # (P,) run number + 1, in sorted order (reusing work)
    run -= 1
    out = np.empty(n, dtype=np.int64)
    out[perm] = run
    return uniq, perm[begin], out, np.diff(begin, append=n)


def sort_keys(key: np.ndarray, stable_argsort: bool = False, scratch: Scratch | None = None) -> np.ndarray | None:
    """Sort int64 keys >= 0 in place; with stable_argsort, return the stable argsort of the keys as given.
    Compiled (_sort.cpp's radix sort, several times faster on n-gram keys) or numpy's, the same result.
    scratch: the work arrays and the argsort come from it."""
    ext = extension()
    get = scratch or _fresh
    if ext is None:
        if not stable_argsort:
            key.sort()
            return None
        perm = np.argsort(key, kind="stable")
        key[:] = key[perm]
        return perm
    n = len(key)
    perm = get("perm", n) if stable_argsort else None
    ext.radix_sort(key, get("sort", n), perm, get("perm-sort", n) if stable_argsort else None)
    return perm
