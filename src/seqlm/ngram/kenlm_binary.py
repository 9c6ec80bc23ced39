"""KenLM's own binary files (`build_binary`, format version 5) read into an NGramModel.

Both of KenLM's layouts are read, as pyctcdecode and Hugging Face users have them: probing (hash tables, the
default) and trie, with or without quantization (-q/-b) and array-compressed pointers (-a). What is taken
from a file is what KenLM scores with: its vocabulary (the words stored at the file's end, in KenLM's id
order, which becomes seqlm's), every n-gram of every order (the blanks KenLM inserted for missing suffixes
included), and log10 probabilities and back-offs, a quantized value being its bin's centre. The n-grams
go through NGramModel.from_grams like an ARPA file's, so every seqlm command scores with them.

The layout facts below were read from KenLM's source (lm/binary_format.cc, lm/vocab.cc, lm/search_trie.cc,
lm/trie.cc, lm/quantize.cc, lm/bhiksha.cc); the reader is seqlm's own. Every integer and float is
little-endian, as build_binary writes them on x86-64 and ARM:

    header     a fixed 88-byte sanity block (magic text, 0.0, 1.0, -0.5, 1, 2^32-1, 0, 1), then order (u8),
               probing multiplier (f32), model type (i32), has-vocabulary (u8), search version (u32) as a
               padded 20-byte struct, then the n-gram count of each order (u64); 8-byte aligned
    vocabulary probing: a hash table of word hashes; trie: sorted word hashes. Not needed here: the words
               themselves follow the search structures, NUL-terminated, in id order, <unk> first
    search     probing: kenlm_probing.py; trie: the unigram records, then per middle order bit-packed
               (word, value, next pointer) entries, then (word, prob) entries of the highest order

A trie stores each n-gram under its suffix: unigram w's children are the bigrams ending in w, each
child holding its *first* word, so an n-gram's words are its first word followed by its parent's.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from seqlm.errors import SeqlmError
from seqlm.ngram.arpa import ArpaData
from seqlm.ngram.kenlm_probing import read_probing
from seqlm.ngram.model import NGramModel

PREFIX = b"mmap lm "  # every KenLM binary, complete or not, begins so
MAGIC = b"mmap lm http://kheafield.com/code format version 5\n\0"
INCOMPLETE = b"mmap lm http://kheafield.com/code incomplete\n"
SANITY = MAGIC.ljust(56, b"\0") + struct.pack("<fffIIIQ", 0.0, 1.0, -0.5, 1, 0xFFFFFFFF, 0, 1)  # 88 bytes
FIXED = struct.Struct("<B3xfiB3xI")  # order, probing multiplier, model type, has vocabulary, search version
LAYOUTS = {0: "probing", 1: "probing with rest costs", 2: "trie", 3: "trie -q", 4: "trie -a", 5: "trie -q -a"}
SEARCH_VERSION = {0: 0, 2: 1, 3: 1, 4: 1, 5: 1}  # the version of each layout this reader knows
QUANT_VERSION, BHIKSHA_VERSION = 2, 0
TRIE_UNIGRAM = np.dtype([("prob", "<f4"), ("backoff", "<f4"), ("next", "<u8")])  # 16 bytes, no padding
REBUILD = "rebuild it with build_binary from the ARPA file, or give seqlm the ARPA file"


def is_kenlm_binary(path: str | Path) -> bool:
    """True when the file begins as KenLM's binary files do (its magic; an unfinished build's too)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(PREFIX)) == PREFIX
    except OSError:
        return False


def read_kenlm_binary(path: str | Path) -> NGramModel:
    """The model a KenLM binary file holds; SeqlmError for a damaged, truncated or unsupported file."""
    path = Path(path)
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise SeqlmError(f"{path}: cannot read the KenLM binary file ({e})") from None
    counts, model_type, multiplier, at = _header(path, buf)
    if model_type == 0:
        grams, probs, backoffs, end, bound = read_probing(_fail(path), buf, at, counts, multiplier)
    else:
        grams, probs, backoffs, end, bound = _read_trie(_fail(path), buf, at, counts, model_type)
    words = _words(path, buf, end, bound)
    probs = [p.astype(np.float32) for p in probs]
    backoffs = [b.astype(np.float32) + np.float32(0.0) for b in backoffs]  # -0.0 (KenLM's "no extension") -> 0
    return NGramModel.from_grams(ArpaData(words, grams, probs, backoffs), f"{path} (KenLM binary file)")


def _fail(path: Path):
    """A function that raises the one-line error for a damaged file, naming it."""
    def fail(why: str):
        raise SeqlmError(f"{path}: damaged KenLM binary file ({why}); {REBUILD}")
    return fail


def _header(path: Path, buf: np.ndarray) -> tuple[list[int], int, float, int]:
    """(n-gram counts per order, model type, probing multiplier, offset of the vocabulary section)."""
    head = bytes(buf[: len(SANITY) + FIXED.size])
    _check_sanity(path, head)
    order, multiplier, model_type, has_vocab, version = FIXED.unpack(head[len(SANITY):])
    at = len(SANITY) + FIXED.size
    if model_type not in LAYOUTS or not 2 <= order <= 64 or multiplier < 1.0 or len(buf) < at + 8 * order:
        raise SeqlmError(f"{path}: damaged KenLM binary file (header: order {order}, model type {model_type}, "
                         f"probing multiplier {multiplier}); {REBUILD}")
    if model_type not in SEARCH_VERSION or version != SEARCH_VERSION[model_type]:
        raise SeqlmError(f"{path}: KenLM binary file of a layout seqlm does not read ({LAYOUTS[model_type]}, "
                         f"search version {version}); rebuild it with `build_binary [trie] lm.arpa lm.bin` (no -r)")
    if not has_vocab:
        raise SeqlmError(f"{path}: KenLM binary file without its words (built with build_binary -v); rebuild it "
                         "without -v, or give seqlm the ARPA file")
    counts = [int(c) for c in np.frombuffer(buf, "<u8", order, at)]
    return counts, model_type, multiplier, _align8(at + 8 * order)


def _check_sanity(path: Path, head: bytes) -> None:
    """The fixed block KenLM begins every file with, byte for byte: an unfinished build, a short file, another
    format version, another byte order or damage each fail with its own line."""
    if head.startswith(INCOMPLETE):
        raise SeqlmError(f"{path}: KenLM binary file whose build did not finish (build_binary failed); {REBUILD}")
    if len(head) < len(SANITY) + FIXED.size and SANITY.startswith(head[: len(SANITY)]):
        raise SeqlmError(f"{path}: truncated KenLM binary file (header cut short); {REBUILD}")
    if head[: len(SANITY)] != SANITY:
        version = head[len(MAGIC) - 3 : len(MAGIC) + 3].split(b"\n")[0]
        why = (f"format version {version.decode('ascii', 'replace')}, not 5" if head.startswith(MAGIC[:-3])
               and version != b"5" else "its magic or test values differ from KenLM's format version 5, "
               "little-endian (damaged, or built on another kind of machine)")
        raise SeqlmError(f"{path}: unreadable KenLM binary file: {why}; {REBUILD}")


def _words(path: Path, buf: np.ndarray, end: int, bound: int) -> list[str]:
    """The vocabulary: `bound` NUL-terminated words from offset `end` to the end of the file, <unk> first."""
    if len(buf) < end:
        raise SeqlmError(f"{path}: truncated KenLM binary file ({len(buf)} bytes; its header's counts need at "
                         f"least {end}); {REBUILD}")
    words = bytes(buf[end:]).split(b"\0")
    if words[-1] != b"" or len(words) - 1 != bound or words[0] != b"<unk>":
        raise SeqlmError(f"{path}: damaged or truncated KenLM binary file (the vocabulary at its end should hold "
                         f"{bound} words, <unk> first; it holds {len(words) - 1}); {REBUILD}")
    try:
        return [w.decode("utf-8") for w in words[:-1]]
    except UnicodeDecodeError as e:
        raise SeqlmError(f"{path}: KenLM binary file with a word that is not UTF-8 ({e.reason})") from None


# ---- trie ---------------------------------------------------------------------------------------------


def _read_trie(fail, buf: np.ndarray, at: int, counts: list[int], model_type: int):
    """grams, log10 probs and back-offs of every order, the end of the search section and the word count."""
    N, V = len(counts), counts[0]
    if len(buf) < at + 8 * (V + 1):
        fail("cut short in its vocabulary")
    bound = int(np.frombuffer(buf, "<u8", 1, at)[0]) + 1  # the sorted vocabulary's size, <unk> not counted
    at += 8 * (V + 1)
    quant = _quant_tables(fail, buf, at, N) if model_type in (3, 5) else None
    at += 0 if quant is None else 8 + 4 * ((N - 2) * ((1 << quant[0]) + (1 << quant[1])) + (1 << quant[0]))
    if bound != V:  # the header counts <unk> among the unigrams even when the ARPA file lacked it
        fail(f"{bound} words but {V} unigrams")
    if len(buf) < at + (V + 2) * TRIE_UNIGRAM.itemsize:
        fail("cut short in its unigrams")
    unigrams = np.frombuffer(buf, TRIE_UNIGRAM, V + 2, at)
    at += (V + 2) * TRIE_UNIGRAM.itemsize
    chop = None
    if model_type in (4, 5) and N > 2:  # -a: the first middle order's array header holds the bits asked for
        if len(buf) < at + 2 or buf[at] != BHIKSHA_VERSION:
            fail("its pointer compression header is not version 0")
        chop = int(buf[at + 1])
    probs, backoffs = [unigrams["prob"][:V]], [unigrams["backoff"][:V]]
    grams, nxt = [np.arange(V, dtype=np.int64)[:, None]], unigrams["next"][: V + 1].astype(np.int64)
    for k in range(2, N + 1):
        words, p, b, child_next, at = _trie_order(fail, buf, at, counts, k, quant, chop)
        grams.append(np.concatenate([words[:, None], grams[-1][_parents(fail, nxt, len(words), k)]], axis=1))
        probs.append(p)
        if b is not None:
            backoffs.append(b)
        nxt = child_next
    return grams, probs, backoffs, at, bound


def _quant_tables(fail, buf: np.ndarray, at: int, N: int) -> tuple[int, int, list[np.ndarray]]:
    """(prob bits, back-off bits, the bin centres): per middle order its prob then back-off bins, then the
    highest order's prob bins, after an 8-byte header (version, prob bits, back-off bits)."""
    if len(buf) < at + 8 or buf[at] != QUANT_VERSION or not (1 <= buf[at + 1] <= 25 and 1 <= buf[at + 2] <= 25):
        fail("its quantization header is not version 2 with 1 to 25 bits")
    pb, bb = int(buf[at + 1]), int(buf[at + 2])
    sizes = [1 << pb, 1 << bb] * (N - 2) + [1 << pb]
    if len(buf) < at + 8 + 4 * sum(sizes):
        fail("cut short in its quantization tables")
    offsets = at + 8 + 4 * np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return pb, bb, [np.frombuffer(buf, "<f4", n, int(o)) for n, o in zip(sizes, offsets, strict=True)]


def _trie_order(fail, buf: np.ndarray, at: int, counts: list[int], k: int, quant, chop):
    """Order k's entries: first words, log10 probs, back-offs (None at the highest order), the next pointers
    into order k + 1 (M_k + 1 of them; None at the highest order), and where the next order starts."""
    N, V, M = len(counts), counts[0], counts[k - 1]
    top = k == N
    value_bits = (quant[0] if quant else 31) if top else (quant[0] + quant[1] if quant else 63)
    inline, high, skip = 0, None, 0
    if not top:
        inline, high, skip = _pointer_layout(fail, buf, at, M, counts[k], chop)
    word_bits = _required_bits(V)
    total = word_bits + value_bits + inline
    size = skip + ((M + 1) * total + 7) // 8 + 8
    if len(buf) < at + size:
        fail(f"cut short in its {k}-grams")
    view = _bytes_as_u64(buf, at + skip, at + size)
    slot = np.arange(M + 1, dtype=np.uint64) * np.uint64(total)  # (M + 1,) bit offset of each entry
    words = _field(view, slot[:M], word_bits).astype(np.int64)
    if M and words.max() >= V:
        fail(f"a {k}-gram's word id is out of range")
    prob, backoff = _values(view, slot[:M] + np.uint64(word_bits), k, top, quant)
    if top:
        return words, prob, None, None, at + size
    nxt = _field(view, slot + np.uint64(word_bits + value_bits), inline).astype(np.int64)
    if high is not None:  # -a: the high bits of entry i's pointer are the last t with high[t] <= i
        nxt |= (np.searchsorted(high, np.arange(M + 1), side="right") - 1) << inline
    return words, prob, backoff, nxt, at + size


def _pointer_layout(fail, buf: np.ndarray, at: int, M: int, max_next: int, chop):
    """(inline pointer bits, the -a offsets array or None, bytes before the packed entries) of a middle order.
    Without -a a pointer is stored whole; with -a its top `chop` bits come from a sorted array, `chop` chosen
    as build_binary chose it: the count that saves the most bits, at most the bits asked for."""
    required = _required_bits(max_next)
    if chop is None:
        return required, None, 0
    best, cut = None, 0
    for c in range(min(required, chop) + 1):
        change = (max_next >> (required - c)) * 64 - (M + 1) * c
        if best is None or change < best:
            best, cut = change, c
    inline = required - cut
    n = (max_next >> inline) + 1
    base = _align8(at) + 8
    if len(buf) < base + 8 * n:
        fail("cut short in its pointer arrays")
    return inline, np.frombuffer(buf, "<u8", n, base).astype(np.int64), 8 * (1 + n) + 7


def _values(view: np.ndarray, bits: np.ndarray, k: int, top: bool, quant):
    """log10 probs and back-offs (None at the highest order) of entries whose value starts at `bits`."""
    if quant is not None:
        pb, bb, tables = quant
        if top:
            return tables[-1][_field(view, bits, pb)], None
        probs, backs = tables[2 * (k - 2)], tables[2 * (k - 2) + 1]
        return probs[_field(view, bits + np.uint64(bb), pb)], backs[_field(view, bits, bb)]
    # a probability is stored in 31 bits, its sign (always negative) dropped; a back-off in 32
    prob = (_field(view, bits, 31) | np.uint64(0x80000000)).astype(np.uint32).view(np.float32)
    if top:
        return prob, None
    return prob, _field(view, bits + np.uint64(31), 32).astype(np.uint32).view(np.float32)


def _parents(fail, nxt: np.ndarray, M: int, k: int) -> np.ndarray:
    """(M,) the order-(k-1) entry (suffix) of each order-k entry: entry i's children are nxt[i]:nxt[i+1]."""
    if nxt[0] != 0 or nxt[-1] != M or np.any(np.diff(nxt) < 0):
        fail(f"the pointers to its {k}-grams are out of order")
    return np.searchsorted(nxt, np.arange(M), side="right") - 1


def _bytes_as_u64(buf: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The little-endian 8-byte word at every byte offset of buf[start:stop] (a strided view, no copy)."""
    return np.ndarray((stop - start - 7,), dtype="<u8", buffer=buf, offset=start, strides=(1,))


def _field(view: np.ndarray, bits: np.ndarray, width: int) -> np.ndarray:
    """The `width`-bit (<= 57) fields at bit offsets `bits`, least significant bit first, as KenLM packs."""
    words = view[(bits >> np.uint64(3)).astype(np.int64)]  # (n,) the 8 bytes holding each field
    return (words >> (bits & np.uint64(7))) & np.uint64((1 << width) - 1)


def _required_bits(max_value: int) -> int:
    return int(max_value).bit_length()


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8
