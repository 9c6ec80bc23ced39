"""seqlm's binary n-gram format: the arrays of an NGramModel in one file, memory-mapped on load.

Loading maps the file and wraps each array with np.frombuffer: nothing is parsed or copied but the
vocabulary (one UTF-8 block split on newlines). Pages are read from disk when a lookup touches them.
The layout (docs/ngram.md), every integer little-endian whatever the machine:

    offset 0   magic      8 bytes  b"SEQLMNGB"
           8   version    uint32   FORMAT_VERSION; another version is refused with a one-line error
          12   byte order uint32   0x01020304 as written by a little-endian writer (a check, not a switch)
          16   order N    uint32
          20   table crc  uint32   zlib.crc32 of these 32 header bytes (this field 0) and the section table
          24   V          uint64   vocabulary size (<s>, </s> and <unk> included)
          32   sections   N_s x (offset uint64, bytes uint64, dtype 8 bytes ASCII, e.g. b"<i8", checksum uint64)
    sections, each starting on a 64-byte boundary, in this order:
        vocab          uint8   the words in id order, each followed by "\\n"
        per order k = 1..N:
        keys_k         <i8     (M_k,) sorted trie keys prefix_id * V + last_word (counts.py)
        prob_k         <f4     (M_k,) log10 p
        backoff_k      <f4     (M_k,) log10 back-off (orders k < N only)
        slots_k        <i4/<i8 hash slot table over keys_k (index.py; orders k >= 2 only)

Loading verifies every section's checksum (checksum.py: one pass at memory speed over the file), its
type, and the ranges of the ids that lookups follow (keys, slots), so a damaged or truncated file is
refused with one line instead of scoring wrongly or failing inside a lookup. Version 1 files (no
checksums) are refused with the command that rebuilds them. Writing is atomic (seqlm.checkpoint.atomic_path):
a reader never sees half a file.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from seqlm.checkpoint import atomic_path
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.checksum import BLOCK_BYTES, checksum, checksum_and_max, checksum_blocks
from seqlm.ngram.filearray import FileArray
from seqlm.ngram.index import build_slots, table_bits
from seqlm.ngram.model import NGramModel

MAGIC = b"SEQLMNGB"
FORMAT_VERSION = 2  # 2: section checksums and a header crc (version 1 had neither)
BYTE_ORDER = 0x01020304
HEADER = struct.Struct("<8sIIIIQ")  # magic, version, byte order, order, table crc, V
SECTION = struct.Struct("<QQ8sQ")  # offset, bytes, dtype, checksum
ALIGN = 64
REBUILD = "rebuild it from the ARPA file with `seqlm convert MODEL.arpa FILE.bin`"


def is_binary(path: str | Path) -> bool:
    """True when the file starts with this format's magic."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def layout(order: int) -> list[tuple[str, tuple[str, ...]]]:
    """(name, the dtypes it may have) of each section of a model of `order`, in file order."""
    out = [("vocab", ("|u1",))]
    for k in range(1, order + 1):
        out += [(f"keys_{k}", ("<i8",)), (f"prob_{k}", ("<f4",))]
        out += [(f"backoff_{k}", ("<f4",))] if k < order else []
        out += [(f"slots_{k}", ("<i4", "<i8"))] if k >= 2 else []
    return out


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

    Sections are written one after another; each is then read back from the file to checksum what is
    on disk (in blocks: bounded memory for tables of any size), and the section table, in front, last."""
    count = len(layout(model.order))
    at = -(-(HEADER.size + SECTION.size * count) // ALIGN) * ALIGN
    placed = []  # (offset, bytes, dtype) per section
    with atomic_path(Path(path)) as tmp, open(tmp, "w+b") as f:
        for a in _sections(model, with_index=True):
            f.seek(at)
            if isinstance(a, FileArray):  # bounded-memory estimation's tables: copied in pieces
                a.copy_to(f)
            else:
                f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
            placed.append((at, a.nbytes, a.dtype.str.encode("ascii")))
            at = -(-(at + a.nbytes) // ALIGN) * ALIGN
        f.truncate(at)
        table = b"".join(SECTION.pack(off, n, dt, _checksum_on_disk(f, off, n)) for off, n, dt in placed)
        header = HEADER.pack(MAGIC, FORMAT_VERSION, BYTE_ORDER, model.order, 0, len(model.vocab))
        f.seek(0)
        f.write(HEADER.pack(MAGIC, FORMAT_VERSION, BYTE_ORDER, model.order, zlib.crc32(header + table),
                            len(model.vocab)) + table)


def _checksum_on_disk(f, offset: int, nbytes: int) -> int:
    f.flush()
    f.seek(offset)
    blocks = (np.fromfile(f, dtype=np.uint8, count=min(BLOCK_BYTES, nbytes - a)) for a in range(0, nbytes, BLOCK_BYTES))
    return checksum_blocks(blocks, nbytes)


def read_binary(path: str | Path) -> NGramModel:
    """Map a binary model file, verified (checksums, types, id ranges); raises SeqlmError naming the file
    if it is not one this seqlm reads or it is damaged."""
    path = Path(path)
    stamp = file_stamp(path)  # before mapping: a file replaced meanwhile then fails the check when remapped
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise SeqlmError(f"{path}: cannot open the binary n-gram model ({e})") from None
    order, V = _check_header(path, buf)
    arrays, ranges = _read_sections(path, buf, order)
    _check_ranges(path, V, arrays, ranges, order)
    try:
        tokens = bytes(arrays["vocab"]).decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError:
        raise SeqlmError(f"{path}: the vocabulary block is not UTF-8; the file is corrupt; {REBUILD}") from None
    if len(tokens) != V:
        raise SeqlmError(f"{path}: vocabulary block holds {len(tokens)} words, header says {V}; file is corrupt")
    keys = [arrays[f"keys_{k}"] for k in range(1, order + 1)]
    probs = [arrays[f"prob_{k}"] for k in range(1, order + 1)]
    backoffs = [arrays[f"backoff_{k}"] for k in range(1, order)]
    index = [None] + [arrays[f"slots_{k}"] for k in range(2, order + 1)]
    try:
        model = NGramModel(Vocab(tokens), keys, probs, backoffs, index)
    except SeqlmError as e:
        raise SeqlmError(f"{path}: {e}") from None
    model.mapped_file = (str(path.absolute()), stamp)  # pickling sends this, not the tables
    return model


def file_stamp(path: str | Path) -> tuple[int, int, int] | None:
    """(size, mtime in ns, inode) of the file, None if it is gone: what tells a remapped file from the original."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _check_header(path: Path, buf: np.memmap) -> tuple[int, int]:
    """(order, V) from a header whose magic, version, byte order and crc hold."""
    if len(buf) < HEADER.size or bytes(buf[:8]) != MAGIC:
        raise SeqlmError(f"{path}: not a seqlm binary n-gram model; convert an ARPA file with `seqlm convert`")
    magic, version, byte_order, order, crc, V = HEADER.unpack_from(buf, 0)
    if version == 1:
        raise SeqlmError(f"{path}: binary n-gram format version 1 (no checksums), this seqlm reads version "
                         f"{FORMAT_VERSION}; {REBUILD}")
    if version != FORMAT_VERSION:
        raise SeqlmError(f"{path}: binary n-gram format version {version}, this seqlm reads version "
                         f"{FORMAT_VERSION}; {REBUILD}")
    end = HEADER.size + SECTION.size * len(layout(order)) if 1 <= order <= 64 else 0
    if byte_order != BYTE_ORDER or not end:
        raise SeqlmError(f"{path}: corrupt binary n-gram header; {REBUILD}")
    if end > len(buf):
        raise SeqlmError(f"{path}: truncated binary n-gram file; {REBUILD}")
    header = HEADER.pack(magic, version, byte_order, order, 0, V)
    if zlib.crc32(header + bytes(buf[HEADER.size:end])) != crc:
        raise SeqlmError(f"{path}: the header or section table fails its checksum; the file is damaged; {REBUILD}")
    return order, V


def _read_sections(path: Path, buf: np.memmap, order: int) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Zero-copy views of the sections listed after the header, each of its expected type and verified
    against its checksum; and the largest value of each id section, taken in the same pass: keys read
    as unsigned (a negative key counts as huge), slots signed (lookups treat any negative slot as empty)."""
    arrays, ranges = {}, {}
    for i, (name, dtypes) in enumerate(layout(order)):
        off, nbytes, dtype, digest = SECTION.unpack_from(buf, HEADER.size + i * SECTION.size)
        dtype = dtype.rstrip(b"\0").decode("ascii", errors="replace")
        if dtype not in dtypes:
            raise SeqlmError(f"{path}: section {name} has type {dtype!r}, expected {' or '.join(dtypes)}; "
                             f"the file is corrupt; {REBUILD}")
        dt = np.dtype(dtype)
        if off % ALIGN or off + nbytes > len(buf) or nbytes % dt.itemsize:
            raise SeqlmError(f"{path}: section {name} lies past the end; the binary n-gram file is truncated; "
                             f"{REBUILD}")
        data = buf[off:off + nbytes]
        if name.startswith(("keys", "slots")):
            found, ranges[name] = checksum_and_max(data, dt.str.replace("i", "u") if name[0] == "k" else dt)
        else:
            found = checksum(data)
        if found != digest:
            raise SeqlmError(f"{path}: section {name} fails its checksum; the file is damaged; {REBUILD}")
        arrays[name] = np.frombuffer(buf, dtype=dt, count=nbytes // dt.itemsize, offset=off)
    return arrays, ranges


def _check_ranges(path: Path, V: int, arrays: dict[str, np.ndarray], ranges: dict[str, int], order: int) -> None:
    """The sizes and ids lookups rely on: keys of order k in [0, M_{k-1} V) (unigrams: 0..V-1), slots
    below M_k, a slot table at least as long as its hash range and ending empty (probing stops there)."""
    def bad(what: str) -> SeqlmError:
        return SeqlmError(f"{path}: {what}; the binary n-gram file is corrupt; {REBUILD}")

    sizes = [len(arrays[f"keys_{k}"]) for k in range(1, order + 1)]
    for name, a in arrays.items():
        k = int(name.rsplit("_", 1)[-1]) if name != "vocab" else 0
        if name.startswith(("prob", "backoff")) and len(a) != sizes[k - 1]:
            raise bad(f"{name} holds {len(a)} values for {sizes[k - 1]} n-grams")
    if sizes[0] != V:
        raise bad(f"keys_1 holds {sizes[0]} unigrams, the header says V = {V}")
    for k in range(1, order + 1):
        if ranges[f"keys_{k}"] >= (V if k == 1 else sizes[k - 2] * V):
            raise bad(f"keys_{k} hold ids out of range")
        if k == 1:
            continue
        slots = arrays[f"slots_{k}"]
        if len(slots) < (1 << table_bits(sizes[k - 1])) or slots[-1] != -1:
            raise bad(f"slots_{k} is shorter than its hash range or does not end with an empty slot")
        if ranges[f"slots_{k}"] >= sizes[k - 1]:
            raise bad(f"slots_{k} hold ids out of range")
