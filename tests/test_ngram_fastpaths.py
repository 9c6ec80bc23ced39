"""Estimation's fast paths against the numpy calls they replace, exactly.

counts.unique against np.unique (packed-sort path and the fallback for keys too wide to pack).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlm.ngram.counts import unique


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**62), max_size=200), st.integers(1, 40), st.integers(0, 5))
def test_unique_equals_numpy_unique(values: list[int], spread: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    narrow = rng.integers(0, spread, size=len(values) * 3)  # many repeats, packable
    for key in (np.array(values, dtype=np.int64), narrow.astype(np.int64)):  # wide values: the fallback
        got = unique(key)
        want = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == np.int64 and np.array_equal(g, w.reshape(-1))
