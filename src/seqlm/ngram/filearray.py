"""Arrays in files, read a piece at a time: the tables of bounded-memory estimation (external_estimate.py).

A FileArray is never memory-mapped: mapping a table would cost its whole size in address space
(RLIMIT_AS counts mappings), so every access reads just the rows it needs with np.fromfile at an
offset. The access patterns the estimator needs, each within a fixed memory budget:

- a slice, or `take_sorted` (non-decreasing ids: a context's table row for each of its n-grams);
- `windowed_map`: out[i] = f(table, q[i]) for queries in any order (p of each n-gram's suffix):
  the table is read window by window and the queries streamed once per window, each window filling
  the answers that fall in it (one pass when the table fits the budget);
- `windowed_bincount`: counts of query values over the table's rows, window by window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

SPAN = 1 << 20  # most rows one take_sorted read may cover


class FileArray:
    """A 1-d array stored raw (native byte order) in `path`."""

    def __init__(self, path: str | Path, dtype: np.dtype | type, length: int):
        self.path, self.dtype, self.length = Path(path), np.dtype(dtype), int(length)

    def __len__(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        return self.length * self.dtype.itemsize

    def read(self, a: int, b: int) -> np.ndarray:
        """Rows [a, b) (clipped to the array)."""
        a, b = max(0, a), min(b, self.length)
        if b <= a:
            return np.zeros(0, dtype=self.dtype)
        with open(self.path, "rb") as f:
            f.seek(a * self.dtype.itemsize)
            return np.fromfile(f, dtype=self.dtype, count=b - a)

    def write_at(self, a: int, values: np.ndarray) -> None:
        with open(self.path, "r+b") as f:
            f.seek(a * self.dtype.itemsize)
            np.ascontiguousarray(values, dtype=self.dtype).tofile(f)

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a FileArray reads slices; use take_sorted for ids")
        a, b, _ = key.indices(self.length)
        return self.read(a, b)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self.read(0, self.length)
        return whole if dtype is None else whole.astype(dtype)

    def chunks(self, size: int) -> Iterator[tuple[int, np.ndarray]]:
        for a in range(0, self.length, size):
            yield a, self.read(a, a + size)

    def copy_to(self, f: BinaryIO, size: int = 1 << 22) -> None:
        for _, part in self.chunks(size):
            f.write(memoryview(part).cast("B"))

    @classmethod
    def full(cls, path: str | Path, dtype, length: int, value, size: int = 1 << 20) -> FileArray:
        with Appender(path, dtype) as out:
            for a in range(0, length, size):
                out.add(np.full(min(size, length - a), value, dtype=dtype))
        return out.array


class Appender:
    """Writes a FileArray from consecutive pieces: `with Appender(path, dtype) as out: out.add(x)`; then
    `out.array`."""

    def __init__(self, path: str | Path, dtype):
        self.path, self.dtype, self.length = Path(path), np.dtype(dtype), 0
        self.f = open(self.path, "wb")

    def add(self, values: np.ndarray) -> None:
        np.ascontiguousarray(values, dtype=self.dtype).tofile(self.f)
        self.length += len(values)

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()
        self.array = FileArray(self.path, self.dtype, self.length)


Table = np.ndarray | FileArray


def take_sorted(table: Table, ids: np.ndarray) -> np.ndarray:
    """table[ids] for non-decreasing ids, reading at most SPAN rows at a time from a FileArray."""
    if isinstance(table, np.ndarray):
        return table[ids]
    out = np.empty(len(ids), dtype=table.dtype)
    i = 0
    while i < len(ids):
        j = int(np.searchsorted(ids, ids[i] + SPAN, side="left"))
        rows = table.read(int(ids[i]), int(ids[j - 1]) + 1)
        out[i:j] = rows[ids[i:j] - ids[i]]
        i = j
    return out


def windowed_map(table: Table, queries: Table, out: str | Path, dtype, fill,
                 answer: Callable[[np.ndarray, int, np.ndarray], tuple[np.ndarray, np.ndarray]],
                 window: int, chunk: int, wanted: Callable[[int, int], np.ndarray] | None = None) -> FileArray:
    """out[i] = the answer for queries[i] from the table window that holds it (`fill` where none does).

    answer(rows, w0, q) -> (mask of the queries this window answers, their answers); rows are table rows
    [w0, w0 + len(rows)). The queries are read once per window; the answers written in place. A table that
    fits one window is read whole and each chunk's answers written once (no filled file to read back); there,
    `wanted(a, b)` (a mask of queries [a, b)) leaves the queries it does not want at `fill`, unanswered."""
    if len(table) <= window:
        rows = _part(table, 0, len(table))
        with Appender(out, dtype) as whole:
            for a in range(0, len(queries), chunk):
                q = _part(queries, a, a + chunk)
                part = np.full(len(q), fill, dtype=dtype)
                if wanted is None:
                    mask, values = answer(rows, 0, q)
                    part[mask] = values
                else:
                    keep = wanted(a, a + len(q))  # (len(q),)
                    mask, values = answer(rows, 0, q[keep])
                    part[np.flatnonzero(keep)[mask]] = values
                whole.add(part)
        return whole.array
    result = FileArray.full(out, dtype, len(queries), fill)
    for w0 in range(0, max(len(table), 1), window):
        rows = _part(table, w0, w0 + window)
        for a in range(0, len(queries), chunk):
            q = _part(queries, a, a + chunk)
            mask, values = answer(rows, w0, q)
            if mask.any():
                current = result.read(a, a + len(q))
                current[mask] = values
                result.write_at(a, current)
    return result


def gather_answer(rows: np.ndarray, w0: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """windowed_map's answer for out[i] = table[q[i]] (q[i] < 0 stays `fill`)."""
    mask = (q >= w0) & (q < w0 + len(rows))
    return mask, rows[q[mask] - w0]


def windowed_bincount(values: Table, bins: int, out: str | Path, window: int, chunk: int) -> FileArray:
    """np.bincount(values, minlength=bins) (values in [0, bins)) as a FileArray, `window` bins at a time."""
    with Appender(out, np.int64) as result:
        for w0 in range(0, bins, window):
            w1 = min(bins, w0 + window)
            counts = np.zeros(w1 - w0, dtype=np.int64)
            for a in range(0, len(values), chunk):
                v = _part(values, a, a + chunk)
                v = v[(v >= w0) & (v < w1)]
                counts += np.bincount(v - w0, minlength=w1 - w0)
            result.add(counts)
    return result.array


def searchsorted(table: Table, x: int, chunk: int) -> int:
    """np.searchsorted(table, x) for a sorted table, streamed."""
    if isinstance(table, np.ndarray):
        return int(np.searchsorted(table, x))
    at = 0
    for a, rows in table.chunks(chunk):
        at = a + int(np.searchsorted(rows, x))
        if at < a + len(rows):
            break
    return at


def _part(table: Table, a: int, b: int) -> np.ndarray:
    return table[a:b] if isinstance(table, np.ndarray) else table.read(a, b)
