"""A hash index over an order's sorted n-gram keys: open addressing, linear probing, built without a loop.

The keys of order k (`prefix_id * V + last_word`, see counts.py) stay sorted, because their rank is
the n-gram's id and `step` scans the continuations of a context as one range. Binary search over
millions of keys costs ~20 dependent cache misses per lookup; this table answers in ~1.5 probes.

Layout: `slots` (S + tail,) holds n-gram ids (-1 = empty), S a power of two >= 2 M (load <= 1/2).
A key's home slot is the top bits of key * FIB (Fibonacci hashing, 64-bit wrap-around); it lives at
its home or in the first free slot after it. Probing never wraps: the table is extended by a tail
long enough for the last cluster, and ends with an empty slot.

Building: sort the keys by home slot; the i-th key in that order goes to
pos_i = max(home_i, pos_{i-1} + 1) = i + cummax(home_j - j, j <= i), which is what inserting them
one by one with linear probing gives (a cluster's layout does not depend on insertion order).
"""

from __future__ import annotations

import numpy as np

FIB_INT = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd
FIB = np.uint64(FIB_INT)
SMALL = 64  # below this many queries a plain loop beats the vectorised probe (one sentence, one decoder step)


def table_bits(num_keys: int) -> int:
    """log2 of the table size: the smallest power of two >= 2 * num_keys (at least 2)."""
    return max(1, int(2 * num_keys - 1).bit_length())


def home_slots(keys: np.ndarray, bits: int) -> np.ndarray:
    """(M,) int64 home slot of each key: the top `bits` bits of key * FIB."""
    with np.errstate(over="ignore"):
        h = keys.astype(np.uint64, copy=False) * FIB  # (M,) wraps mod 2^64
    return (h >> np.uint64(64 - bits)).astype(np.int64)


def build_slots(keys: np.ndarray) -> np.ndarray:
    """The slot table of sorted keys (M,): (S + tail,) int32 ids (int64 beyond 2^31 - 1 keys), -1 empty."""
    m = len(keys)
    bits = table_bits(m)
    home = home_slots(keys, bits)  # (M,)
    by_home = np.argsort(home, kind="stable")  # (M,)
    rank = np.arange(m, dtype=np.int64)
    pos = rank + np.maximum.accumulate(home[by_home] - rank) if m else rank  # (M,) final slots, increasing
    size = max(1 << bits, int(pos[-1]) + 2 if m else 1)  # room for the last cluster plus one empty slot
    slots = np.full(size, -1, dtype=np.int32 if m < 2**31 - 1 else np.int64)
    slots[pos] = by_home
    return slots


def lookup(slots: np.ndarray, keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Id of each query key (any shape, int64) among `keys`, -1 where absent. Negative queries give -1."""
    flat = query.reshape(-1)  # (Q,)
    if len(flat) <= SMALL and len(keys):
        return np.array(_lookup_each(slots, keys, flat.tolist()), dtype=np.int64).reshape(query.shape)
    out = np.full(len(flat), -1, dtype=np.int64)
    if len(keys) == 0:
        return out.reshape(query.shape)
    bits = table_bits(len(keys))
    todo = np.flatnonzero(flat >= 0)  # (q,) queries still probing
    pos = home_slots(flat[todo], bits)  # (q,)
    while len(todo):
        ids = slots[pos].astype(np.int64)  # (q,)
        full = ids >= 0
        found = full & (keys[np.maximum(ids, 0)] == flat[todo])  # (q,)
        out[todo[found]] = ids[found]
        more = full & ~found  # an occupied slot holding another key: try the next one
        todo, pos = todo[more], pos[more] + 1
    return out.reshape(query.shape)


def _lookup_each(slots: np.ndarray, keys: np.ndarray, queries: list[int]) -> list[int]:
    """`lookup` one query at a time, in Python integers: the same probe sequence."""
    bits = table_bits(len(keys))
    slots, keys = memoryview(np.ascontiguousarray(slots)), memoryview(np.ascontiguousarray(keys))  # fast items
    return [probe(slots, keys, bits, q) for q in queries]


def probe(slots: memoryview, keys: memoryview, bits: int, q: int) -> int:
    """The id of key q (a Python int) by walking its probe sequence; -1 if absent or q < 0."""
    if q < 0:
        return -1
    pos = ((q * FIB_INT) & 0xFFFFFFFFFFFFFFFF) >> (64 - bits)
    while True:
        i = slots[pos]
        if i < 0 or keys[i] == q:
            return i
        pos += 1


def build_slots_file(keys, out, window: int, chunk: int):
    """build_slots for keys in a FileArray (filearray.py), written to the file `out` in bounded memory.

    The slot range is cut into windows of `window` slots; for each, the keys are streamed and those
    whose home slot falls in it placed as build_slots places them (stable by home, so ties go by id),
    starting after the last slot the previous windows filled (a cluster may run over a window's end)."""
    from seqlm.ngram.filearray import Appender

    m = len(keys)
    bits = table_bits(m)
    dtype = np.int32 if m < 2**31 - 1 else np.int64
    filled = last = -1  # slots written so far: [0, filled + 1); the last slot taken
    with Appender(out, dtype) as slots:
        for w0 in range(0, 1 << bits, window):
            homes, ids = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
            for a, part in keys.chunks(chunk):
                home = home_slots(part, bits)  # (c,)
                mine = np.flatnonzero((home >= w0) & (home < w0 + window))
                homes.append(home[mine])
                ids.append(a + mine)
            home, ids = np.concatenate(homes), np.concatenate(ids)
            order = np.argsort(home, kind="stable")
            rank = np.arange(len(home), dtype=np.int64)
            pos = rank + np.maximum(np.maximum.accumulate(home[order] - rank), last + 1) if len(home) else rank
            end = max(min(w0 + window, 1 << bits), int(pos[-1]) + 1 if len(pos) else 0, filled + 1)
            region = np.full(end - (filled + 1), -1, dtype=dtype)
            region[pos - (filled + 1)] = ids[order]
            slots.add(region)
            filled, last = end - 1, int(pos[-1]) if len(pos) else last
        size = max(1 << bits, last + 2 if m else 1)
        slots.add(np.full(size - (filled + 1), -1, dtype=dtype))
    return slots.array
