"""Writing ARPA files fast, a chunk of lines at a time.

A line of order k is k + 2 pieces of text:

    'log10p\\t'  'w1'  ' w2' .. ' wk'  '\\tlog10bo\\n'   (just '\\n' at the highest order)

With the compiled module (native.py, _arpa_text.cpp) a chunk's lines are written there whole, numbers
included. Without it, numpy: the pieces live in one byte buffer (each word once, with a leading space; the
chunk's numbers, one fixed-width row per distinct value, floattext.py), and a chunk of lines is one gather
of pieces whose source index is a running sum of jumps. The two give the same bytes (tests hold both
against a line-by-line reference). Python never touches a line or a number; memory beyond the tables is
a few buffers the size of one chunk.
Numbers are the shortest text that reads back as the same float32, as KenLM writes them and as
numpy's str prints a float32 ('-2.6589744', '0.0', '-inf').

`ArpaWriter` takes the n-grams order by order in chunks (the bounded-memory estimator streams them);
`write_arpa` feeds it from trie-numbered tables (counts.py).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from seqlm.checkpoint import atomic_path
from seqlm.ngram.filearray import take_sorted
from seqlm.ngram.floattext import WIDTH, float32_texts
from seqlm.ngram.native import extension

CHUNK = 1 << 14  # lines assembled at once: ~5 MB of text and ~40 MB of gather indices


@dataclass
class Pieces:
    """Byte strings stored back to back: entry i is buf[start[i] : start[i] + length[i]]."""

    buf: np.ndarray  # (B,) uint8
    start: np.ndarray  # (n,) int64
    length: np.ndarray  # (n,) int64

    @classmethod
    def of(cls, texts: list[str]) -> Pieces:
        encoded = [t.encode("utf-8") for t in texts]
        length = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))  # (n,)
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), np.cumsum(length) - length, length)


def numpy_assemble(buf: np.ndarray, start: np.ndarray, length: np.ndarray) -> bytes:
    """The pieces buf[start[i] : start[i] + length[i]] joined, in order: the source of each output byte is
    the previous byte's plus one, except where a piece begins, a running sum of jumps."""
    some = length > 0
    start, length = start[some], length[some]  # (P,)
    if len(start) == 0:
        return b""
    end = np.cumsum(length)  # (P,) where each piece ends in the output
    step = np.ones(int(end[-1]), dtype=np.int64)  # (bytes,) source of byte i minus that of byte i - 1
    step[0] = start[0]
    step[end[:-1]] = start[1:] - (start[:-1] + length[:-1] - 1)
    return buf[np.cumsum(step, out=step)].tobytes()


class ArpaWriter:
    """Writes an ARPA file to a binary stream: the header, then each order's lines, in chunks."""

    def __init__(self, f: BinaryIO, tokens: list[str], sizes: list[int]):
        self.f, self.sizes, self.order = f, list(sizes), len(sizes)
        words = Pieces.of([" " + t for t in tokens] + ["\n"])  # entry w is " word"; the last one "\n"
        self.word_start, self.word_length = words.start, words.length  # (V + 1,)
        self.room = len(words.buf)  # the chunk's formatted numbers go after the words
        self.buf = np.empty(self.room + 2 * CHUNK * WIDTH, dtype=np.uint8)
        self.buf[: self.room] = words.buf
        self.k, self.written = 0, 0
        f.write(("\\data\\\n" + "".join(f"ngram {k}={m}\n" for k, m in enumerate(sizes, 1))).encode("ascii"))

    def section(self, k: int) -> None:
        """Start the `\\k-grams:` section (after the previous one is complete)."""
        self._close_section()
        self.k, self.written = k, 0
        self.f.write(f"\n\\{k}-grams:\n".encode("ascii"))

    def write(self, words: np.ndarray, log10_prob: np.ndarray, log10_backoff: np.ndarray | None) -> None:
        """Lines for the n-grams `words` (m, k) of the current order, in the order given; log10_backoff
        None at the highest order."""
        for a in range(0, len(words), CHUNK):
            bo = log10_backoff[a : a + CHUNK] if log10_backoff is not None else None
            self.f.write(self._lines(words[a : a + CHUNK], log10_prob[a : a + CHUNK], bo))
        self.written += len(words)

    def _lines(self, words: np.ndarray, prob: np.ndarray, backoff: np.ndarray | None) -> bytes:
        m, k = words.shape
        ext = extension()
        if ext is not None:  # the same bytes, faster (GCIDE KN5's ARPA write 9.67 -> 4.28 s: docs/ngram.md)
            f32 = [None if v is None else np.ascontiguousarray(v, dtype=np.float32) for v in (prob, backoff)]
            return ext.arpa_lines(np.ascontiguousarray(words, dtype=np.int64), k, *f32, self.buf[: self.room],
                                  self.word_start, self.word_length)
        start = np.empty((m, k + 2), dtype=np.int64)  # (m, k + 2) the pieces of each line
        length = np.empty((m, k + 2), dtype=np.int64)
        at = self.room
        for col, values, wrap in ((0, prob, (b"", b"\t")), (k + 1, backoff, (b"\t", b"\n"))):
            if values is None:  # the highest order: the line ends with the newline entry
                start[:, col], length[:, col] = self.word_start[-1], 1
                continue
            # each distinct float32 (bit pattern: -0.0 is not 0.0) formatted once: back-offs repeat a lot
            bits, which = np.unique(np.asarray(values, dtype=np.float32).view(np.uint32), return_inverse=True)
            rows, first, size = float32_texts(bits.view(np.float32), *wrap)  # (u, WIDTH), (u,), (u,)
            self.buf[at : at + rows.size] = rows.reshape(-1)
            which = which.reshape(-1)  # (m,) the row of each line's number
            start[:, col], length[:, col] = at + which * WIDTH + first[which], size[which]
            at += rows.size
        start[:, 1 : k + 1] = self.word_start[words]
        length[:, 1 : k + 1] = self.word_length[words]
        start[:, 1] += 1  # the first word without its leading space
        length[:, 1] -= 1
        return numpy_assemble(self.buf, start.reshape(-1), length.reshape(-1))

    def _close_section(self) -> None:
        if self.k and self.written != self.sizes[self.k - 1]:
            want = self.sizes[self.k - 1]
            raise ValueError(f"order {self.k}: {self.written} n-grams written, the header says {want}")
        if self.k and self.written == 0:
            self.f.write(b"\n")  # an empty section still ends with a blank line

    def close(self) -> None:
        """Finish the last section and write `\\end\\`."""
        self._close_section()
        self.f.write(b"\n\\end\\\n")


@contextmanager
def open_arpa(path: str | Path, tokens: list[str], sizes: list[int]) -> Iterator[ArpaWriter]:
    """An ArpaWriter onto `path`, written atomically (renamed into place when done); gzip if it ends .gz."""
    path = Path(path)
    with atomic_path(path) as tmp:
        raw = gzip.open(tmp, "wb", compresslevel=6) if path.name.endswith(".gz") else open(tmp, "wb")
        with raw as f:
            writer = ArpaWriter(f, tokens, sizes)
            yield writer
            writer.close()


def words_of(keys: list, k: int, ids: np.ndarray) -> np.ndarray:
    """(m, k) the words of the order-k n-grams `ids` (sorted), following prefixes down the trie-numbered
    keys (arrays or FileArrays)."""
    V = len(keys[0])
    out = np.empty((len(ids), k), dtype=np.int64)
    for j in range(k, 0, -1):  # ids stay sorted: a sorted order's prefixes are sorted (trie order)
        key = take_sorted(keys[j - 1], ids)  # (m,)
        out[:, j - 1], ids = key % V, key // V
    return out


def write_arpa(path: str | Path, tokens: list[str], keys: list[np.ndarray], log10_prob: list[np.ndarray],
               log10_backoff: list[np.ndarray]) -> None:
    """Write trie-numbered tables (see counts.py) as an ARPA file, atomically; gzip if the name ends .gz."""
    order = len(keys)
    with open_arpa(path, tokens, [len(k) for k in keys]) as w:
        for k in range(1, order + 1):
            w.section(k)
            for a in range(0, len(keys[k - 1]), CHUNK):
                ids = np.arange(a, min(a + CHUNK, len(keys[k - 1])), dtype=np.int64)  # (m,)
                bo = log10_backoff[k - 1][a : a + CHUNK] if k < order else None
                w.write(words_of(keys, k, ids), log10_prob[k - 1][a : a + CHUNK], bo)
