"""ARPA back-off files (plain or gzip): the exchange format of KenLM, SRILM and seqlm's n-gram models.

    \\data\\
    ngram 1=M1            one count line per order
    \\1-grams:
    log10p  w  [log10bo]  back-off optional (missing means 0); none at the highest order
    ...
    \\end\\

Reading accepts what KenLM (`<s>` with log10 p 0) and SRILM (`<s>` at -99, back-offs left out when
0, fields separated by any white space) write. Anything malformed raises SeqlmError naming the file.
Writing (atomic, gzip when the name ends in `.gz`) is in arpa_write.py.
"""

from __future__ import annotations

import gc
import gzip
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from pathlib import Path

import numpy as np

from seqlm.errors import SeqlmError


@dataclass
class ArpaData:
    """An ARPA file's contents in file order, words as ids into `tokens` (the unigrams, in file order)."""

    tokens: list[str]
    grams: list[np.ndarray]  # grams[k-1] (M_k, k) int64 word ids of the order-k n-grams
    log10_prob: list[np.ndarray]  # (M_k,) float32
    log10_backoff: list[np.ndarray]  # (M_k,) float32 for k < N (0 where the file has none)


def _read_text(path: Path) -> str:
    """The whole file as text, gunzipped if it starts with the gzip magic (whatever its name)."""
    if not path.is_file():
        raise SeqlmError(f"{path}: no such ARPA file")
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, EOFError, zlib.error) as e:
        raise SeqlmError(f"{path}: cannot read the ARPA file ({e}); it is corrupt or truncated") from None
    except UnicodeDecodeError as e:
        raise SeqlmError(f"{path}: ARPA file is not UTF-8 ({e.reason}); convert it to UTF-8") from None


def _header(path: Path, lines: list[str]) -> tuple[list[int], int]:
    """Parse `\\data\\` and the `ngram k=M` lines: (M_1..M_N, index of the first line after them)."""
    i = next((n for n, line in enumerate(lines) if line.strip() == "\\data\\"), None)
    if i is None:
        raise SeqlmError(f"{path}: no \\data\\ line; is this an ARPA file?")
    sizes: list[int] = []
    i += 1
    while i < len(lines) and lines[i].strip().startswith("ngram "):
        k, _, m = lines[i].strip()[6:].partition("=")
        if not (k.strip().isdigit() and m.strip().isdigit()) or int(k) != len(sizes) + 1:
            want = f"ngram {len(sizes) + 1}=COUNT"
            raise SeqlmError(f"{path}:{i + 1}: bad header line {lines[i].strip()!r}; expected {want!r}")
        sizes.append(int(m))
        i += 1
    if not sizes or sizes[0] == 0:
        raise SeqlmError(f"{path}: the \\data\\ header lists no n-grams; the ARPA file is corrupt")
    return sizes, i


# KenLM reads an ARPA line as bytes, its fields separated by ASCII white space alone: a word may be any other
# character, e.g. NeMo's token words chr(id + 100), among them U+0085 and U+00A0, where str.split() would cut.
_ODD_SPACE = re.compile(r"[^\S \t\n\r\f\v]")
_ASCII_SPACE = re.compile(r"[ \t\n\r\f\v]+")


def _splitter(text: str):
    """str.split, unless the text holds white space that is not ASCII: then a split at ASCII white space only."""
    if text.isascii() or _ODD_SPACE.search(text) is None:
        return str.split
    return lambda line: [f for f in _ASCII_SPACE.split(line) if f]


def _section(
    path: Path, lines: list[str], i: int, k: int, size: int, order: int, split=str.split
) -> tuple[list[list[str]], int]:
    """The split entries of the `\\k-grams:` section starting at or after line i, and the line after it."""
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or lines[i].strip() != f"\\{k}-grams:":
        raise SeqlmError(f"{path}:{i + 1}: no \\{k}-grams: section here; the file is truncated or corrupt")
    start, end = i + 1, i + 1 + size
    after = lines[end].strip() if end < len(lines) else ""
    if end > len(lines) or (after and not after.startswith("\\")):
        _check_count(path, lines, start, k, size)
    fields = [split(line) for line in lines[start:end]]
    widths = np.fromiter(map(len, fields), dtype=np.int64, count=len(fields))  # (M_k,)
    bad = np.flatnonzero((widths != k + 1) & ((widths != k + 2) | (k == order)))
    if len(bad):
        _check_count(path, lines, start, k, size)  # a blank line or the next header inside: a wrong count
        line, entry = start + bad[0] + 1, " ".join(fields[bad[0]])
        raise SeqlmError(f"{path}:{line}: malformed {k}-gram entry {entry!r}; the ARPA file is corrupt")
    return fields, end


def _check_count(path: Path, lines: list[str], start: int, k: int, size: int) -> None:
    """Raise if the section starting at line `start` does not hold exactly `size` entries."""
    end = start
    while end < len(lines) and lines[end].strip() and not lines[end].startswith("\\"):
        end += 1
    if end - start != size:
        raise SeqlmError(
            f"{path}: the header says ngram {k}={size} but the \\{k}-grams: section has {end - start} "
            "entries; the ARPA file is truncated or corrupt"
        )


def _numbers(path: Path, k: int, column: list[str]) -> np.ndarray:
    """A column of log10 values as float32; NaN, a finite value beyond float32's range or text that is no
    number means a corrupt file."""
    try:
        wide = np.fromiter(map(float, column), dtype=np.float64, count=len(column))  # (M_k,)
    except ValueError:
        wide = np.array([np.nan])
    with np.errstate(over="ignore"):
        x = wide.astype(np.float32)  # (M_k,)
    if np.isnan(x).any() or (np.isinf(x) & np.isfinite(wide)).any():
        raise SeqlmError(f"{path}: bad number in the \\{k}-grams: section; the file is corrupt")
    return x


@contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing makes millions of small lists that it would rescan
    over and over (8x slower on a PTB 5-gram); none of them form cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_arpa(path: str | Path) -> ArpaData:
    """Parse an ARPA file. Raises SeqlmError (naming the file) on any inconsistency."""
    with _no_gc():
        return _parse(Path(path))


def _parse(path: Path) -> ArpaData:
    text = _read_text(path)
    lines, split = text.split("\n"), _splitter(text)
    sizes, i = _header(path, lines)
    order = len(sizes)
    tokens: list[str] = []
    stoi: dict[str, int] = {}
    grams, probs, backoffs = [], [], []
    for k, size in enumerate(sizes, 1):
        fields, i = _section(path, lines, i, k, size, order, split)
        probs.append(_numbers(path, k, [f[0] for f in fields]))
        if k < order:
            backoffs.append(_numbers(path, k, [f[k + 1] if len(f) == k + 2 else "0" for f in fields]))
        if k == 1:
            tokens = [f[1] for f in fields]
            stoi = {t: n for n, t in enumerate(tokens)}
            if len(stoi) != len(tokens):
                raise SeqlmError(f"{path}: a word is listed twice among the unigrams; the file is corrupt")
            grams.append(np.arange(len(tokens), dtype=np.int64)[:, None])
            continue
        words = chain.from_iterable(map(itemgetter(*range(1, k + 1)), fields))
        try:
            ids = np.fromiter(map(stoi.__getitem__, words), dtype=np.int64, count=size * k)  # (M_k * k,)
        except KeyError as e:
            raise SeqlmError(f"{path}: a {k}-gram uses {e.args[0]!r}, which has no unigram entry") from None
        grams.append(ids.reshape(size, k))
    if not any(line.strip() == "\\end\\" for line in lines[i:]):
        raise SeqlmError(f"{path}: no \\end\\ line; the ARPA file is truncated")
    return ArpaData(tokens, grams, probs, backoffs)
