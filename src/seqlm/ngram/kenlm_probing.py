"""KenLM's probing layout (build_binary's default) read back into n-grams: kenlm_binary.py's other half.

A probing file keeps no word ids above the unigrams. Order k >= 2 is a linear-probing hash table (empty
slot: key 0; a key's first slot: key mod buckets) of 64-bit keys, each the hash of an n-gram's words taken
newest first: h(w_n) = w_n, then h(w_i..w_n) = combine(h(w_{i+1}..w_n), w_i), where
combine(h, w) = h * C1 ^ (w + 1) * C2 mod 2^64 (lm/search_hashed.hh). The hash is not inverted; the n-grams
are found again by asking, order by order, which extensions of n-grams already found are in the table:

    an n-gram (w_1..w_n) has its context (w_1..w_{n-1}) listed (build_binary refuses a file otherwise) and
    its suffix (w_2..w_n) listed (build_binary adds a blank when the ARPA file lacks it); both share the
    middle (w_2..w_{n-1}). So each context A and suffix B of order n-1 meeting on a middle is a candidate,
    its key combine(h(B), first word of A), and the table says which candidates are n-grams.

Two flags KenLM keeps in the sign bits cut the candidates down: a back-off of -0.0 marks an n-gram that is
no context, a probability stored with its sign bit clear one that is some longer n-gram's suffix (the sign
of a probability, always negative, is restored on reading). Every occupied slot must be found; one that is
not (a flag KenLM did not set, say) is found by trying every first word against it: costly, but rare.

The cost is the candidates: for the bigrams, the words that are contexts times the words that are
suffixes (3.5e7 for a 6,000-word vocabulary, 1e8 for PTB's 10,000); above them, per middle, its left
extensions times its right ones (1.4e8 for PTB KN5's trigrams). At some 25 ns a candidate (a flag test
in a cache-sized bit array, then a probe for the few that pass), PTB KN5 takes about 7 s; a vocabulary of
100,000 words minutes (a warning says so), and past BUDGET candidates the file is refused with the advice
to use the trie layout, which stores word ids and reads in one pass.
"""

from __future__ import annotations

import warnings

import numpy as np

C1, C2 = np.uint64(8978948897894561157), np.uint64(17894857484156487943)  # the key hash's multipliers
C1_INVERSE = np.uint64(pow(8978948897894561157, -1, 1 << 64))  # C1 is odd, so it has one mod 2^64
NO_EXTENSION = 0x80000000  # -0.0: KenLM's back-off of an n-gram that is no context
SLOW = 10**9  # candidates above which a warning says how long the search takes
BUDGET = 10**11  # candidates above which the file is refused (about 40 minutes)
NS_PER_CANDIDATE = 25  # the search's cost, measured on PTB KN5 (2.6e8 candidates, one core)
CHUNK = 1 << 22  # candidates per vectorised step
LARGE = 1 << 16  # a group with this many candidates has its keys made as an outer XOR
FLAG_BITS = 25  # KeySet: 2^25 flags, 4 MB
MIDDLE = np.dtype([("key", "<u8"), ("prob", "<f4"), ("backoff", "<f4")])  # 16 bytes
LONGEST = np.dtype({"names": ["key", "prob"], "formats": ["<u8", "<f4"], "offsets": [0, 8], "itemsize": 12})
UNIGRAM = np.dtype([("prob", "<f4"), ("backoff", "<f4")])


def read_probing(fail, buf: np.ndarray, at: int, counts: list[int], multiplier: float):
    """grams, log10 probs and back-offs of every order, the end of the search section and the word count."""
    N, V = len(counts), counts[0]
    if len(buf) < at + 8:
        fail("cut short in its vocabulary")
    version, bound = (int(x) for x in np.frombuffer(buf, "<u4", 2, at))
    if version != 0 or not 3 <= bound <= V + 1:
        fail(f"its vocabulary header says version {version}, {bound} words")
    at += 8 + 12 * _buckets(V, multiplier)
    tables = []
    for k, dtype in enumerate([UNIGRAM] + [MIDDLE] * (N - 2) + [LONGEST], 1):
        n = V + 1 if k == 1 else _buckets(counts[k - 1], multiplier)
        if len(buf) < at + n * dtype.itemsize:
            fail(f"cut short in its {k}-grams")
        tables.append(np.frombuffer(buf, dtype, n, at))
        at += n * dtype.itemsize
    grams, probs, backoffs = _recover(fail, tables, bound)
    return grams, probs, backoffs, at, bound


class KeySet:
    """The keys of one KenLM table, indexed for the search's many look-ups. A bit per value of a key's low
    FLAG_BITS bits, set where a key has them (4 MB, so that it stays in the processor's cache), turns most
    absent keys away; a copy of the keys in sorted open addressing at a quarter load (a key at its home slot,
    its top bits, or the first free one after it, so that a probe stops at an empty slot or a larger key)
    answers the rest in a probe or two, with the key's slot in KenLM's table."""

    def __init__(self, keys: np.ndarray):
        where = np.flatnonzero(keys)  # (M,) occupied slots of KenLM's table (key 0 marks an empty one)
        held = keys[where]
        order = np.argsort(held)
        held, where = held[order], where[order]
        flags = np.zeros(1 << FLAG_BITS, dtype=bool)
        flags[self.low(held)] = True
        self.flags = np.packbits(flags, bitorder="little")  # (2^FLAG_BITS / 8,) bit i of byte j: value 8j + i
        bits = max(int(4 * len(held)).bit_length(), 1)
        self.shift = np.uint64(64 - bits)
        rank = np.arange(len(held))
        pos = rank + np.maximum.accumulate((held >> self.shift).view(np.int64) - rank) if len(held) else rank
        size = max(1 << bits, int(pos[-1]) + 2 if len(held) else 1)  # room for the last cluster, then empty
        self.keys, self.slots = np.zeros(size, dtype=np.uint64), np.full(size, -1, dtype=np.int64)
        self.keys[pos], self.slots[pos] = held, where

    @staticmethod
    def low(keys: np.ndarray) -> np.ndarray:
        """The flag index of each key, its low bits; that of a XOR b is low(a) XOR low(b)."""
        return (keys & np.uint64((1 << FLAG_BITS) - 1)).view(np.int64)

    def flagged(self, low: np.ndarray) -> np.ndarray:
        """Indices of the flag indices whose flag is set."""
        return np.flatnonzero((self.flags[low >> 3] >> (low & 7).astype(np.uint8)) & 1)

    def find(self, query: np.ndarray) -> np.ndarray:
        """Slot in KenLM's table of each query key, -1 where the table lacks it."""
        out = np.full(len(query), -1, dtype=np.int64)
        todo = self.flagged(self.low(query))
        pos = (query[todo] >> self.shift).view(np.int64)
        while len(todo):
            got, want = self.keys[pos], query[todo]
            hit = got == want
            out[todo[hit]] = self.slots[pos[hit]]
            more = (got != 0) & (got < want)
            todo, pos = todo[more], pos[more] + 1
        return out


class Order:
    """The n-grams of one order found so far: their table slots and what the next order's search needs."""

    def __init__(self, table: np.ndarray, slots: np.ndarray, grams: np.ndarray, ctx: np.ndarray, suf: np.ndarray,
                 keyset: KeySet | None = None):
        self.table, self.slots, self.grams = table, slots, grams  # grams: (M, k) word ids
        self.ctx, self.suf = ctx, suf  # (M,) ids one order below of the context and of the suffix
        self.hash = table["key"][slots] if "key" in table.dtype.names else slots.astype(np.uint64)
        bits = table["prob"][slots].view(np.uint32)
        self.prob = (bits | np.uint32(NO_EXTENSION)).view(np.float32)  # (M,) the sign bit restored
        self.is_suffix = (bits & np.uint32(NO_EXTENSION)) == 0  # (M,)
        if "backoff" in table.dtype.names:
            self.backoff = table["backoff"][slots]
            self.is_context = self.backoff.view(np.uint32) != NO_EXTENSION  # (M,)
        self.id_of_slot = np.full(len(table), -1, dtype=np.int64)  # (buckets,)
        self.id_of_slot[slots] = np.arange(len(slots))
        self.keyset = keyset

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Id among this order's n-grams of each key, -1 where absent."""
        slot = self.keyset.find(keys)
        return np.where(slot >= 0, self.id_of_slot[np.maximum(slot, 0)], -1)


def _recover(fail, tables: list[np.ndarray], bound: int):
    """Every order's n-grams (M_k, k), probabilities and back-offs from the tables, lowest order first."""
    words = np.arange(bound, dtype=np.int64)
    zero = np.zeros(bound, dtype=np.int64)
    orders = [Order(tables[0], words, words[:, None], zero, zero)]
    for table in tables[1:]:
        orders.append(_next_order(fail, orders, table, bound))
    return [o.grams for o in orders], [o.prob for o in orders], [o.backoff for o in orders[:-1]]


def _next_order(fail, orders: list[Order], table: np.ndarray, bound: int) -> Order:
    """The n-grams of the order above orders[-1]: every context-suffix pair the table holds, then the rest."""
    low, keyset = orders[-1], KeySet(table["key"])
    a = np.flatnonzero(low.is_context)
    b = np.flatnonzero(low.is_suffix & (low.ctx >= 0))
    a, b = a[np.argsort(low.suf[a], kind="stable")], b[np.argsort(low.ctx[b], kind="stable")]
    groups = len(orders[-2].slots) if len(orders) > 1 else 1
    cnt_a = np.bincount(low.suf[a], minlength=groups)  # (G,) contexts ending in each middle
    cnt_b = np.bincount(low.ctx[b], minlength=groups)  # (G,) suffixes starting with it
    _check_cost(fail, float(np.dot(cnt_a.astype(np.float64), cnt_b)), low.grams.shape[1] + 1)
    first = low.grams[a, 0]
    left = (first.astype(np.uint64) + np.uint64(1)) * C2  # (|A|,) each context's share of the key
    right = low.hash[b] * C1  # (|B|,) each suffix's share
    found = []
    for i, j in _candidates(keyset, left, right, cnt_a, cnt_b):
        slot = keyset.find(left[i] ^ right[j])  # combine(h(suffix), first word of the context)
        hit = slot >= 0
        found.append((a[i[hit]], b[j[hit]], slot[hit], first[i[hit]]))
    ctx, suf, slots, first = (np.concatenate(x) for x in zip(*found)) if found else [np.zeros(0, np.int64)] * 4
    slots, once = np.unique(slots, return_index=True)  # a key met twice is one n-gram (a 2^-64 event)
    ctx, suf, first = ctx[once], suf[once], first[once]
    missing = np.flatnonzero((table["key"] != 0) & (np.bincount(slots, minlength=len(table)) == 0))
    if len(missing):
        more = _invert(fail, orders, table["key"][missing], missing, bound)
        ctx, suf, slots, first = (np.concatenate(x) for x in zip((ctx, suf, slots, first), more, strict=True))
    grams = np.concatenate([first[:, None], low.grams[suf]], axis=1)  # (M, k)
    return Order(table, slots, grams, ctx, suf, keyset)


def _check_cost(fail, candidates: float, k: int) -> None:
    """Refuse a search that would take too long; warn about one that takes minutes."""
    minutes = candidates * NS_PER_CANDIDATE / 6e10
    if candidates > BUDGET:
        fail(f"finding its {k}-grams from their hashes would take about {minutes:.0f} minutes ({candidates:.2g} "
             "candidates); build_binary's trie layout stores the words and reads in seconds")
    if candidates > SLOW:
        warnings.warn(f"a KenLM probing file: finding its {k}-grams from their hashes takes about {minutes:.0f} "
                      "minutes; `seqlm convert` it to a seqlm binary once to load it in a moment", stacklevel=2)


def _candidates(keyset: KeySet, left: np.ndarray, right: np.ndarray, cnt_a: np.ndarray, cnt_b: np.ndarray):
    """(i, j) of the pairs of context i and suffix j of one group (contexts and suffixes numbered group
    after group, cnt_* of them in each) whose key's flag is set, about CHUNK pairs at a time. A large
    group's flag indices are an outer XOR of its two slices; small groups are expanded into index arrays."""
    low_a, low_b = keyset.low(left), keyset.low(right)
    start_a, start_b = np.cumsum(cnt_a) - cnt_a, np.cumsum(cnt_b) - cnt_b
    sizes = cnt_a * cnt_b  # (G,)
    for g in np.flatnonzero(sizes >= LARGE):
        a0, a1, b0, b1 = start_a[g], start_a[g] + cnt_a[g], start_b[g], start_b[g] + cnt_b[g]
        step = max(CHUNK // int(cnt_b[g]), 1)
        for r in range(a0, a1, step):
            keep = keyset.flagged((low_a[r : min(r + step, a1), None] ^ low_b[None, b0:b1]).ravel())
            yield r + keep // (b1 - b0), b0 + keep % (b1 - b0)
    per_a = np.repeat(np.where(sizes < LARGE, cnt_b, 0), cnt_a)  # (|A|,) suffixes each context meets here
    group = np.repeat(np.arange(len(cnt_a)), cnt_a)  # (|A|,)
    ends = np.cumsum(per_a)
    i0 = 0
    while i0 < len(per_a) and ends[-1] > 0:
        i1 = max(int(np.searchsorted(ends, ends[i0] - per_a[i0] + CHUNK, side="right")), i0 + 1)
        n = per_a[i0:i1]  # (c,) pairs of each context of this chunk
        i = np.repeat(np.arange(i0, i1), n)  # (p,)
        j = np.arange(len(i)) + np.repeat(start_b[group[i0:i1]] - (np.cumsum(n) - n), n)  # (p,)
        keep = keyset.flagged(low_a[i] ^ low_b[j])
        yield i[keep], j[keep]
        i0 = i1


def _invert(fail, orders: list[Order], keys: np.ndarray, slots: np.ndarray, bound: int):
    """(context ids, suffix ids, slots, first words) of the n-grams of these keys, found by undoing the last
    combine for every possible first word w: h(suffix) = (key ^ (w + 1) * C2) * C1^-1."""
    low = orders[-1]
    if len(keys) > max(100, len(low.slots) // 100):  # a flag gone wrong leaves a few; damage leaves many
        fail(f"{len(keys)} of its hash entries extend none of the n-grams one order below")
    found = []
    for w in range(bound):
        h = (keys ^ np.uint64((w + 1) * int(C2) % 2**64)) * C1_INVERSE  # (m,) the suffix's key if w comes first
        if len(orders) == 1:  # the suffix is a unigram: its key is its word id
            suf = np.where(h < np.uint64(bound), h.astype(np.int64), -1)
        else:
            suf = low.find(h)
        hit = np.flatnonzero(suf >= 0)
        if len(hit):
            found.append((_context(orders, suf[hit], w), suf[hit], slots[hit], np.full(len(hit), w)))
    if sum(len(f[1]) for f in found) != len(keys):
        fail("some of its hash entries are no n-gram of its vocabulary")
    return tuple(np.concatenate(x) for x in zip(*found))


def _context(orders: list[Order], suf: np.ndarray, w: int) -> np.ndarray:
    """Id one order below of the context (w, middle) of each n-gram with suffix `suf` and first word w."""
    low = orders[-1]
    if len(orders) == 1:
        return np.full(len(suf), w, dtype=np.int64)
    middle = orders[-2].hash[low.ctx[suf]]  # (m,)
    return low.find((middle * C1) ^ np.uint64((w + 1) * int(C2) % 2**64))


def _buckets(entries: int, multiplier: float) -> int:
    """Slots of a probing table for `entries`: the multiplier's share, computed in float32 as KenLM does."""
    return max(entries + 1, int(np.float32(multiplier) * np.float32(entries)))
