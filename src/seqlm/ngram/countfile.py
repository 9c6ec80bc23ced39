"""SRILM's count files (`ngram-count -write FILE`, `-read FILE`): one n-gram a line, its words separated by
spaces, a tab, then its count: an integer, or a decimal where counts are fractional (weighted lines).

Written (`write_counts`): every n-gram of orders 1..N that NGramCounts holds, as SRILM's -write gives them:
`<s>` as a unigram counting the sentences, the n-grams that begin with `<s>`, and every word of the vocabulary
as a unigram, count 0 for a word never seen (`<unk>` when the text has none), so that the vocabulary reads
back whole. Lines go depth-first (each n-gram followed by its extensions, as SRILM walks its count trie), the
words of one level in the order they first occur in the text. That order is what the file must keep for the
estimate to be the text's byte for byte: the vocabulary lists words by count and breaks ties by first
occurrence, and reading files A then B finds A's words first, then B's new ones, as the text A+B has them.
A fractional count is written as the shortest decimal that reads back as the same float64.

Read (`read_counts`): any number of files, merged by summing the counts of equal n-grams (repeated lines
within a file too), lines in any order, each split at white space as SRILM splits it (the last field is the
count). An n-gram's first k-1 and last k-1 words must be listed as well (a file holds every order 1..N, as
-write writes it), `<s>` begins an n-gram or nothing, and all files have one order.
"""

from __future__ import annotations

import gzip
import re
import sys
from array import array
from dataclasses import dataclass

import numpy as np

from seqlm.checkpoint import atomic_path
from seqlm.data.vocab import BOS
from seqlm.errors import SeqlmError
from seqlm.ngram.counts import NGramCounts, id_dtype, unique, weighted_counts
from seqlm.ngram.model import _row_ids

MAX_ORDER = 64  # as the kn family's --order
_DECIMAL = re.compile(r"\+?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")  # a count: no sign, no nan or inf
CHUNK = 1 << 16  # lines formatted and written at once


@dataclass
class CountFile:
    """Count files read and merged: their n-grams numbered over `tokens` (ids in order of first appearance)."""

    tokens: list[str]
    unigram_order: np.ndarray  # (V,) ids in the order their unigram lines first appear (the text's order)
    counts: NGramCounts  # orders 1..order, bos_id = the id of <s>
    order: int  # the files' order (counts may hold fewer when fewer were asked for)


# ---- writing ----

def write_counts(path: str, counts: NGramCounts, tokens: list[str], first_seen: np.ndarray) -> list[int]:
    """Write `counts` (over `tokens`) to `path` (`-`: standard output; `.gz`: compressed; atomically), words of
    a level ordered by `first_seen` (V,), each word's place in the text. Returns the lines written per order."""
    words = [words_of(counts, k) for k in range(1, counts.order + 1)]  # (M_k, k) each
    if path == "-":
        _write_lines(sys.stdout, counts, words, tokens, first_seen)
        sys.stdout.flush()
    else:
        opener = gzip.open if path.endswith(".gz") else open
        with atomic_path(path) as tmp, opener(tmp, "wt", encoding="utf-8", newline="\n") as f:
            _write_lines(f, counts, words, tokens, first_seen)
    return [len(w) for w in words]


def _write_lines(f, counts: NGramCounts, words: list[np.ndarray], tokens: list[str], first_seen: np.ndarray) -> None:
    """The lines in depth-first order, made a chunk at a time (the text of every line at once would be
    several times the tables)."""
    names = np.asarray(tokens, dtype=object)
    offsets = np.cumsum([0] + [len(w) for w in words])  # (N+1,) where each order starts among all n-grams
    perm = _line_order(words, first_seen)
    for lo in range(0, len(perm), CHUNK):
        chunk = perm[lo:lo + CHUNK]
        order_of = np.searchsorted(offsets, chunk, side="right") - 1  # (C,) order - 1 of each line
        lines = np.empty(len(chunk), dtype=object)
        for k in np.unique(order_of).tolist():
            at = order_of == k
            rows = chunk[at] - offsets[k]
            text = names[words[k][rows, 0]]
            for j in range(1, k + 1):
                text = text + " " + names[words[k][rows, j]]
            lines[at] = text + "\t" + count_texts(counts.counts[k][rows]) + "\n"
        f.write("".join(lines.tolist()))


def words_of(counts: NGramCounts, k: int) -> np.ndarray:
    """(M_k, k) the word ids of each order-k n-gram, found by following prefixes down to order 1."""
    V, ids = counts.vocab_size, np.arange(len(counts.keys[k - 1]), dtype=np.int64)
    cols = []
    for j in range(k, 0, -1):
        key = counts.keys[j - 1][ids]  # (M_k,)
        cols.append(key % V)
        ids = key // V
    return np.stack(cols[::-1], axis=1)


def _line_order(words: list[np.ndarray], first_seen: np.ndarray) -> np.ndarray:
    """(M,) the depth-first order of every n-gram of every order (numbered one order after another): rows of
    word places padded with -1, sorted as rows, put a prefix before its extensions."""
    N = len(words)
    table = np.concatenate([np.pad(first_seen[w], ((0, 0), (0, N - w.shape[1])), constant_values=-1) for w in words])
    return np.lexsort(table.T[::-1])  # (M,) the first column decides first


def count_texts(c: np.ndarray) -> np.ndarray:
    """(M,) object array of counts as text: integers as such, fractional ones as the shortest decimal that
    reads back as the same float64 (a whole one without '.0')."""
    if c.dtype.kind != "f":
        return np.asarray([str(x) for x in c.tolist()], dtype=object)
    return np.asarray([np.format_float_positional(x, unique=True, trim="-") for x in c.tolist()], dtype=object)


# ---- reading ----

def read_counts(paths: list[str], order: int | None = None) -> CountFile:
    """Read and merge count files (orders 1..`order`, default all) into one CountFile."""
    if not paths:
        raise SeqlmError("--counts: give one or more count files, comma-separated")
    table: dict[str, int] = {}
    grams: list[array] = []  # per order: the word ids of its rows one after another, every file's (8 bytes an id)
    values: list[array] = []  # per order: the counts, as float64 (exact for whole counts below 2^53)
    orders = {path: _parse(path, table, grams, values) for path in paths}
    if len(set(orders.values())) > 1:
        listed = ", ".join(f"{p}: {k}" for p, k in orders.items())
        raise SeqlmError(f"--counts: the files have different orders ({listed}); merging them would lose the "
                         "longer n-grams of the shorter files' text: count every shard with one --order")
    top = len(grams)
    if order is not None and order > top:
        raise SeqlmError(f"--order {order}: the count files hold n-grams up to order {top}; give --order {top} or "
                         "less, or count the text again with a higher --order")
    table.setdefault(BOS, len(table))  # files counted without sentence starts: <s> is still the model's context
    rows = [np.frombuffer(g, dtype=np.int64).reshape(-1, k) for k, g in enumerate(grams, 1)]
    counts = _tables(rows[:order or top], [np.frombuffer(v, dtype=np.float64) for v in values], table,
                     ", ".join(paths))
    seen, first = np.unique(rows[0][:, 0], return_index=True)
    return CountFile(list(table), seen[np.argsort(first, kind="stable")], counts, top)


def _parse(path: str, table: dict[str, int], grams: list, values: list) -> int:
    """Add the lines of one count file to `grams` and `values` (per order), words numbered in `table`;
    returns its order. Errors name the file and line."""
    from seqlm.data.corpus import _text_blocks

    top, lineno = 0, 0  # lines before this block
    for _, text in _text_blocks(path):
        for n, line in enumerate(text.split("\n"), lineno + 1):
            fields = line.split()
            if not fields:
                continue
            k = len(fields) - 1
            if k < 1 or k > MAX_ORDER:
                raise SeqlmError(f"{path}:{n}: expected 'w1 .. wn<TAB>count' (1 to {MAX_ORDER} words), got "
                                 f"{line.strip()[:60]!r}; is this an SRILM count file?")
            value = _count(fields[-1], k, f"{path}:{n}")
            while len(grams) < k:
                grams.append(array("q"))
                values.append(array("d"))
            grams[k - 1].extend(table.setdefault(w, len(table)) for w in fields[:-1])
            values[k - 1].append(value)
            top = max(top, k)
        lineno += text.count("\n")
    if top == 0:
        raise SeqlmError(f"{path}: no n-gram counts (the file is empty or blank); give a count file "
                         "(seqlm count --write-counts, SRILM's ngram-count -write)")
    return top


def _count(text: str, k: int, where: str) -> int | float:
    """A count field: a whole number, or a decimal >= 0 (fractional counts); 0 only for a unigram."""
    if text.isascii() and text.isdigit():
        value: int | float = int(text)
    elif _DECIMAL.fullmatch(text) and np.isfinite(float(text)):
        value = float(text)
    else:
        raise SeqlmError(f"{where}: the count {text!r} is not a number >= 0 (a line is 'w1 .. wn<TAB>count')")
    if value == 0 and k > 1:
        raise SeqlmError(f"{where}: an n-gram of {k} words with count 0; only a unigram may have 0 (a word of the "
                         "vocabulary never seen)")
    return value


def _tables(rows: list[np.ndarray], values: list[np.ndarray], table: dict[str, int], where: str) -> NGramCounts:
    """The trie-numbered tables (counts.py) of the n-grams `rows` (M_k, k) per order, equal ones summed."""
    V, bos, tokens = len(table), table[BOS], list(table)
    listed = np.zeros(V, dtype=bool)
    listed[rows[0][:, 0]] = True
    keys, counts = [np.arange(V, dtype=np.int64)], [weighted_counts(np.bincount(rows[0][:, 0], values[0], V))]
    small = id_dtype(max(V, *(len(r) for r in rows)))
    suffix = [np.full(V, -1, dtype=small)]
    for k in range(2, len(rows) + 1):
        r = rows[k - 1]
        _require(listed[r].all(axis=1), r, "each word as a unigram", tokens, where)
        _require((r[:, 1:] != bos).all(axis=1), r, f"{BOS} only as its first word", tokens, where)
        prefix, found = _row_ids(keys, V, r[:, :-1])
        _require(found, r, "its first words as an n-gram", tokens, where)
        uniq, first, inverse, _ = unique(prefix * V + r[:, -1])
        below, found = _row_ids(keys, V, r[:, 1:])
        _require(found, r, "its last words as an n-gram", tokens, where)
        keys.append(uniq)
        counts.append(weighted_counts(np.bincount(inverse, values[k - 1], len(uniq))))
        suffix.append(below[first].astype(small))
    return NGramCounts(V, bos, keys, counts, suffix)


def _require(ok: np.ndarray, rows: np.ndarray, what: str, tokens: list[str], where: str) -> None:
    """An error naming the first n-gram that fails `ok`."""
    if not ok.all():
        gram = " ".join(tokens[w] for w in rows[int(np.argmin(ok))])
        raise SeqlmError(f"{where}: {gram!r} is listed without {what}; a count file lists every order 1..N "
                         "(SRILM's ngram-count -write, seqlm count)")


# ---- renumbering ----

def relabel(counts: NGramCounts, lut: np.ndarray, vocab_size: int, bos_id: int) -> NGramCounts:
    """The same counts over another vocabulary: word w becomes lut[w]; n-grams that become equal (words mapped to
    <unk>) have their counts summed. lut[counts.bos_id] must be `bos_id`."""
    V, lut = vocab_size, np.asarray(lut, dtype=np.int64)
    keys = [np.arange(V, dtype=np.int64)]
    out = [weighted_counts(np.bincount(lut, counts.counts[0], V))]
    small = id_dtype(max(len(k) for k in counts.keys))
    suffix = [np.full(V, -1, dtype=small)]
    new_id = lut  # old id -> new id at the order below
    for k in range(2, counts.order + 1):
        uniq, first, inverse, _ = unique(new_id[counts.prefix(k)] * V + lut[counts.last_word(k)])
        keys.append(uniq)
        out.append(weighted_counts(np.bincount(inverse, counts.counts[k - 1], len(uniq))))
        suffix.append(new_id[counts.suffix[k - 1][first]].astype(small))
        new_id = inverse
    return NGramCounts(V, bos_id, keys, out, suffix)


def is_fractional(counts: NGramCounts) -> bool:
    """Whether any count is not a whole number (weighted_counts keeps those as float64)."""
    return any(c.dtype.kind == "f" for c in counts.counts)
