"""seqlm's binary n-gram format: the arrays of an NGramModel in one file, memory-mapped on load.

Loading maps the file and wraps each array with np.frombuffer: nothing is parsed or copied but the
vocabulary (one UTF-8 block split on newlines). Pages are read from disk when a lookup touches them.
The layout (docs/ngram.md), every integer little-endian whatever the machine:

    offset 0   magic      8 bytes  b"SEQLMNGB"
           8   version    uint32   FORMAT_VERSION; another version is refused with a one-line error
          12   byte order uint32   0x01020304 as written by a little-endian writer (a check, not a switch)
          16   order N    uint32
          20   reserved   uint32   0
          24   V          uint64   vocabulary size (<s>, </s> and <unk> included)
          32   sections   N_s x (offset uint64, bytes uint64, dtype 8 bytes ASCII, e.g. b"<i8")
    sections, each starting on a 64-byte boundary, in this order:
        vocab          uint8   the words in id order, each followed by "\\n"
        per order k = 1..N:
        keys_k         <i8     (M_k,) sorted trie keys prefix_id * V + last_word (counts.py)
        prob_k         <f4     (M_k,) log10 p
        backoff_k      <f4     (M_k,) log10 back-off (orders k < N only)
        slots_k        <i4/<i8 hash slot table over keys_k (index.py; orders k >= 2 only)

Writing is atomic (seqlm.checkpoint.atomic_path): a reader never sees half a file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from seqlm.checkpoint import atomic_path
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.filearray import FileArray
from seqlm.ngram.index import build_slots
from seqlm.ngram.model import NGramModel

MAGIC = b"SEQLMNGB"
FORMAT_VERSION = 1
BYTE_ORDER = 0x01020304
HEADER = struct.Struct("<8sIIIIQ")  # magic, version, byte order, order, reserved, V
SECTION = struct.Struct("<QQ8s")  # offset, bytes, dtype
ALIGN = 64


def is_binary(path: str | Path) -> bool:
    """True when the file starts with this format's magic."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _sections(model: NGramModel, with_index: bool) -> Iterator[np.ndarray]:
    """The arrays in file order (see the module docstring), one at a time: a hash table is built only
    when its turn comes, so at most one is in memory."""
    yield np.frombuffer("".join(w + "\n" for w in model.vocab.itos).encode("utf-8"), dtype=np.uint8)
    for k in range(1, model.order + 1):
        yield _little(model.keys[k - 1], "<i8")
        yield _little(model.log10_prob[k - 1], "<f4")
        if k < model.order:
            yield _little(model.log10_backoff[k - 1], "<f4")
        if k >= 2:
            slots = model.index[k - 1] if with_index else None
            slots = slots if slots is not None else build_slots(np.asarray(model.keys[k - 1]))
            yield slots if isinstance(slots, FileArray) else slots.astype(slots.dtype.newbyteorder("<"), copy=False)


def _little(a, dtype: str):
    """a as the little-endian dtype: arrays converted (no copy when they are already), FileArrays as they
    are (native order: checked)."""
    if isinstance(a, FileArray):
        if a.dtype != np.dtype(dtype):
            raise ValueError(f"{a.path}: {a.dtype}, the binary format wants {dtype}")
        return a
    return a.astype(dtype, copy=False)


def write_binary(model: NGramModel, path: str | Path) -> None:
    """Write `model` in the binary format (atomically), building the hash index of each order.

    Sections are written one after another and the section table, in front, last."""
    count = 1 + 4 * model.order - 2
    at = -(-(HEADER.size + SECTION.size * count) // ALIGN) * ALIGN
    table = []
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as f:
        for a in _sections(model, with_index=True):
            f.seek(at)
            if isinstance(a, FileArray):  # bounded-memory estimation's tables: copied in pieces
                a.copy_to(f)
            else:
                f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
            table.append(SECTION.pack(at, a.nbytes, a.dtype.str.encode("ascii")))
            at = -(-(at + a.nbytes) // ALIGN) * ALIGN
        f.seek(0)
        f.write(HEADER.pack(MAGIC, FORMAT_VERSION, BYTE_ORDER, model.order, 0, len(model.vocab)) + b"".join(table))
        f.truncate(at)


def read_binary(path: str | Path) -> NGramModel:
    """Map a binary model file; raises SeqlmError naming the file if it is not one this seqlm reads."""
    path = Path(path)
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise SeqlmError(f"{path}: cannot open the binary n-gram model ({e})") from None
    if len(buf) < HEADER.size or bytes(buf[:8]) != MAGIC:
        raise SeqlmError(f"{path}: not a seqlm binary n-gram model; convert an ARPA file with `seqlm convert`")
    magic, version, byte_order, order, _, V = HEADER.unpack_from(buf, 0)
    if version != FORMAT_VERSION:
        raise SeqlmError(f"{path}: binary n-gram format version {version}, this seqlm reads version "
                         f"{FORMAT_VERSION}; rebuild it from the ARPA file with `seqlm convert`")
    if byte_order != BYTE_ORDER or not 1 <= order <= 64:
        raise SeqlmError(f"{path}: corrupt binary n-gram header; rebuild it with `seqlm convert`")
    arrays = _read_sections(path, buf, 1 + 4 * order - 2)
    tokens = bytes(arrays[0]).decode("utf-8").split("\n")[:-1]
    if len(tokens) != V:
        raise SeqlmError(f"{path}: vocabulary block holds {len(tokens)} words, header says {V}; file is corrupt")
    keys, probs, backoffs, index = [], [], [], [None]
    it = iter(arrays[1:])
    for k in range(1, order + 1):
        keys.append(next(it))
        probs.append(next(it))
        if k < order:
            backoffs.append(next(it))
        if k >= 2:
            index.append(next(it))
    if len(keys[0]) != V or any(len(p) != len(q) for p, q in zip(keys, probs, strict=True)):
        raise SeqlmError(f"{path}: array sizes disagree; the binary n-gram file is corrupt")
    return NGramModel(Vocab(tokens), keys, probs, backoffs, index)


def _read_sections(path: Path, buf: np.memmap, count: int) -> list[np.ndarray]:
    """Zero-copy views of the `count` sections listed after the header."""
    out = []
    for i in range(count):
        at = HEADER.size + i * SECTION.size
        if at + SECTION.size > len(buf):
            raise SeqlmError(f"{path}: truncated binary n-gram file; rebuild it with `seqlm convert`")
        off, nbytes, dtype = SECTION.unpack_from(buf, at)
        try:
            dt = np.dtype(dtype.rstrip(b"\0").decode("ascii"))
        except (TypeError, UnicodeDecodeError):
            raise SeqlmError(f"{path}: section {i} has a bad type; the file is corrupt") from None
        if off + nbytes > len(buf) or nbytes % dt.itemsize:
            raise SeqlmError(f"{path}: section {i} lies past the end; the binary n-gram file is truncated")
        out.append(np.frombuffer(buf, dtype=dt, count=nbytes // dt.itemsize, offset=off))
    return out
