"""Estimation's fast paths against the numpy calls they replace, exactly.

counts.unique against np.unique (packed-sort path, the fallback for keys too wide to pack, sorted runs), on the
compiled radix sort and on numpy's (sort_keys against np.sort and the stable argsort, both paths); the
compiled ARPA line assembly against the numpy one and plain slicing. (ARPA files as a whole are held
byte for byte against a line-by-line reference writer in test_ngram_arpa_write.py, on both paths.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqlm.ngram import counts
from seqlm.ngram.arpa_write import numpy_assemble
from seqlm.ngram.counts import sort_keys, unique
from seqlm.ngram.native import extension

from conftest import require_env


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 2**62), max_size=200), st.integers(1, 40), st.integers(0, 5))
def test_unique_equals_numpy_unique(sort_path, values: list[int], spread: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    narrow = rng.integers(0, spread, size=len(values) * 3)  # many repeats, packable
    for key in (np.array(values, dtype=np.int64), narrow.astype(np.int64)):  # wide values: the fallback
        got = unique(key)
        want = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == np.int64 and np.array_equal(g, w.reshape(-1))
    runs = np.concatenate([np.sort(part) for part in np.array_split(narrow, 1 + seed)])  # a merge's input
    for g, w in zip(unique(runs, runs=True), np.unique(runs, True, True, True), strict=True):
        assert np.array_equal(g, w.reshape(-1))
    uniq, first, none, cnt = unique(narrow, inverse=False)
    want = np.unique(narrow, True, False, True)
    assert none is None and all(np.array_equal(g, w) for g, w in zip((uniq, first, cnt), want, strict=True))


@pytest.fixture(params=["compiled", "numpy"])
def sort_path(request, monkeypatch):  # the same for every hypothesis example: a module attribute, patched once
    if request.param == "numpy":
        monkeypatch.setattr(counts, "extension", lambda: None)
    elif extension() is None:
        require_env("the compiled loops could not be built here")
    return request.param


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 2**63 - 1), max_size=300), st.integers(0, 63), st.integers(0, 5))
def test_sort_keys_equals_numpy_sort_and_stable_argsort(sort_path, values: list[int], bits: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    masked = rng.integers(0, 2**63 - 1, size=len(values) * 4, dtype=np.int64) >> (63 - bits)  # 0..bits bits, repeats
    for key in (np.array(values, dtype=np.int64), masked):
        a, b = key.copy(), key.copy()
        assert sort_keys(a) is None and np.array_equal(a, np.sort(key))
        perm = sort_keys(b, stable_argsort=True)
        assert np.array_equal(perm, np.argsort(key, kind="stable")) and np.array_equal(b, np.sort(key))


def test_the_compiled_sort_refuses_negative_keys() -> None:
    ext = extension()
    if ext is None:
        require_env("the compiled loops could not be built here")
    key = np.array([3, -1, 2], dtype=np.int64)
    with pytest.raises(ValueError, match="non-negative"):
        ext.radix_sort(key, np.empty_like(key), None, None)
    assert key.tolist() == [3, -1, 2]  # refused before anything moved


def test_the_compiled_runs_refuse_arrays_that_do_not_fit() -> None:
    ext = extension()
    if ext is None:
        require_env("the compiled loops could not be built here")
    work = np.array([5 << 2 | 1, 5 << 2 | 3, 7 << 2 | 0, 7 << 2 | 2], dtype=np.int64)  # packed, 2 bits
    assert ext.sorted_runs(work, 2, None, None, None, None, None) == 2
    uniq, first, cnt, inv = (np.zeros(n, dtype=np.int64) for n in (2, 2, 2, 4))
    assert ext.sorted_runs(work, 2, None, uniq, first, cnt, inv) == 2
    assert (uniq.tolist(), first.tolist(), cnt.tolist(), inv.tolist()) == ([5, 7], [1, 0], [2, 2], [1, 0, 1, 0])
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(ValueError, match="runs do not match"):  # room for one run where there are two
        ext.sorted_runs(work, 2, None, one, one.copy(), one.copy(), None)
    with pytest.raises(ValueError, match="runs do not match"):  # a position past the array
        ext.sorted_runs(np.array([9 << 2 | 3], dtype=np.int64), 2, None, one, one.copy(), one.copy(), None)
    with pytest.raises(ValueError, match="do not fit"):  # a permutation of another length
        ext.sorted_runs(work, 0, np.arange(3), uniq, first, cnt, None)


def test_scratch_hands_back_one_array_a_name_until_asked_for_more() -> None:
    scratch = counts.Scratch()
    a, b = scratch("x", 10), scratch("x", 5)
    assert np.shares_memory(a, b) and len(b) == 5
    c = scratch("x", 20)
    assert not np.shares_memory(a, c) and len(c) == 20 and scratch("y", 3, np.int32).dtype == np.int32
    assert scratch.arange(4).tolist() == [0, 1, 2, 3] and scratch.arange(6).tolist() == list(range(6))
    assert scratch.arange(2).tolist() == [0, 1]


def test_the_compiled_chunk_keys_refuse_what_does_not_fit() -> None:
    ext = extension()
    if ext is None:
        require_env("the compiled loops could not be built here")
    ids, starts = np.array([4, 5, 1, 7, 1], dtype=np.int32), np.array([0, 3, 5], dtype=np.int64)  # 1 is </s>
    key, at = np.zeros(5, dtype=np.int64), np.zeros(5, dtype=np.int64)
    assert ext.chunk_keys(ids, starts, 9, 2, 10, None, key, at) == 5
    assert key.tolist() == [94, 45, 51, 97, 71] and at.tolist() == [1, 2, 3, 5, 6]  # <s> at 0 and 4
    rank = np.array([-1, 0, 1, 2, -1, 3, 4], dtype=np.int32)  # the bigrams' ranks, where each ends
    assert ext.chunk_keys(ids, starts, 9, 3, 10, rank, key[:3], at[:3]) == 3
    assert key[:3].tolist() == [5, 11, 31] and at[:3].tolist() == [2, 3, 6]
    with pytest.raises(ValueError, match="out of range"):  # a word id past V
        ext.chunk_keys(ids, starts, 9, 2, 6, None, key, at)
    with pytest.raises(ValueError, match="out of range"):  # no room for the fifth
        ext.chunk_keys(ids, starts, 9, 2, 10, None, key[:4], at[:4])
    with pytest.raises(ValueError, match="out of range"):  # a trigram whose bigram has no rank
        ext.chunk_keys(ids, starts, 9, 3, 10, np.where(rank == 3, -1, rank).astype(np.int32), key[:3], at[:3])
    with pytest.raises(ValueError, match="do not fit"):  # ranks for another chunk
        ext.chunk_keys(ids, starts, 9, 3, 10, rank[:6], key[:3], at[:3])
    with pytest.raises(ValueError, match="do not fit"):  # order 2 reads no ranks
        ext.chunk_keys(ids, starts, 9, 2, 10, rank, key, at)
    with pytest.raises(TypeError, match="4-byte"):  # int64 ids
        ext.chunk_keys(ids.astype(np.int64), starts, 9, 2, 10, None, key, at)


def test_the_compiled_merge_sums_equal_keys_and_refuses_unsorted_parts() -> None:
    ext = extension()
    if ext is None:
        require_env("the compiled loops could not be built here")
    a = np.array([[1, 2, 0], [4, 1, 3], [9, 5, 2]], dtype=np.int64)  # (key, count, suffix) rows
    b = np.array([[4, 3, 3], [6, 1, 1]], dtype=np.int64)
    keys, cnt, sfx = (np.zeros(5, dtype=np.int64) for _ in range(3))
    maps = [np.zeros(3, dtype=np.int64), np.zeros(2, dtype=np.int64)]
    assert ext.merge_runs([a, b], keys, cnt, sfx, maps, 100, 3) == 4
    assert (keys[:4].tolist(), cnt[:4].tolist(), sfx[:4].tolist()) == ([1, 4, 6, 9], [2, 4, 1, 5], [0, 3, 1, 2])
    assert maps[0].tolist() == [100, 101, 103] and maps[1].tolist() == [101, 102]
    packed = [np.stack([p[:, 0], p[:, 1] << 32 | p[:, 2]], axis=1) for p in (a, b)]  # (key, count << 32 | suffix)
    keys[:], cnt[:], sfx[:] = 0, 0, 0
    assert ext.merge_runs(packed, keys, cnt, sfx, None, 0, 2) == 4
    assert (keys[:4].tolist(), cnt[:4].tolist(), sfx[:4].tolist()) == ([1, 4, 6, 9], [2, 4, 1, 5], [0, 3, 1, 2])
    with pytest.raises(ValueError, match="do not increase"):
        ext.merge_runs([a[::-1].copy(), b], keys, cnt, sfx, None, 0, 3)
    with pytest.raises(ValueError, match="more distinct keys"):
        ext.merge_runs([a, b], keys[:3], cnt[:3], sfx[:3], None, 0, 3)
    with pytest.raises(ValueError, match="another length"):
        ext.merge_runs([a, b], keys, cnt, sfx, [maps[1], maps[0]], 0, 3)
    with pytest.raises(ValueError, match="2 or 3 fields"):
        ext.merge_runs([a, b], keys, cnt, sfx, None, 0, 4)


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.lists(st.tuples(st.integers(0, 299), st.integers(0, 20)), max_size=80))
def test_compiled_assemble_equals_numpy_and_slicing(data: bytes, pieces: list[tuple[int, int]]) -> None:
    ext = extension()
    if ext is None:
        require_env("the compiled loops could not be built here")
    buf = np.frombuffer(data, dtype=np.uint8)
    pieces = [(a % len(data), min(n, len(data) - a % len(data))) for a, n in pieces]
    start = np.array([a for a, _ in pieces], dtype=np.int64)
    length = np.array([n for _, n in pieces], dtype=np.int64)
    want = b"".join(data[a : a + n] for a, n in pieces)
    assert ext.assemble(buf, start, length) == want == numpy_assemble(buf, start, length)
    if len(pieces):
        with pytest.raises(ValueError, match="outside the buffer"):
            ext.assemble(buf, start, length + len(data) + 1)


def test_compiled_arpa_lines_refuse_what_they_cannot_write() -> None:
    ext = extension()
    if ext is None:
        require_env("the compiled loops could not be built here")
    text = np.frombuffer(b" a b\n", dtype=np.uint8)
    start, length = np.array([0, 2, 4], dtype=np.int64), np.array([2, 2, 1], dtype=np.int64)
    prob = np.array([-1.5], dtype=np.float32)
    assert ext.arpa_lines(np.array([[0, 1]]), 2, prob, None, text, start, length) == b"-1.5\ta b\n"
    assert ext.arpa_lines(np.array([[1]]), 1, prob, prob, text, start, length) == b"-1.5\tb\t-1.5\n"
    with pytest.raises(ValueError, match="without text"):
        ext.arpa_lines(np.array([[0, 3]]), 2, prob, None, text, start, length)
    with pytest.raises(ValueError, match="disagree"):
        ext.arpa_lines(np.array([[0, 1]]), 1, prob, None, text, start, length)
