"""Reading text: one sentence per line, whitespace-separated tokens (the PTB convention).

Files may be gzip-compressed (`.gz`). `raw=True` reads untokenised UTF-8 text instead (see
`tokenize_raw`). Encoded corpora are cached as memory-mapped `.npy` arrays so that a corpus larger
than RAM streams: `ids` holds every token with `</s>` after each sentence, `starts[i]` is the offset
of sentence i (`starts[-1] == len(ids)`).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import itertools
import os
import re
import shutil
import stat
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from seqlm.data.native import tokens
from seqlm.data.vocab import EOS, Vocab
from seqlm.errors import SeqlmError

if TYPE_CHECKING:
    from seqlm.data.tokenizers import Tokenizer

SPLITS = ("train", "valid", "test")

# --raw: a sentence ends after . ! or ? followed by white space; a token is a run of letters/digits
# (with inner - ' . , as in "don't", "u.s.", "3.5") or any other single non-space character.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TOKEN = re.compile(r"\w+(?:[-'.,]\w+)*|[^\w\s]")


WORD_SEP = "_"  # --unit char: the token between words, as in the usual character-level PTB


def as_units(tokens: list[str], unit: str | Tokenizer) -> list[str]:
    """A sentence as the units a model reads: its words, (`char`) its characters with `_` between words, or the
    pieces a Tokenizer (seqlm.data.tokenizers, --unit token) makes of them."""
    if unit == "word":
        return tokens
    if unit == "char":
        return list(WORD_SEP.join(tokens))
    if isinstance(unit, str):  # the name alone: the tokenizer is the model's (seqlm.data.tokenizers.units_of)
        raise SeqlmError(f"this command cannot read --unit {unit} text yet: it needs the model's tokenizer")
    return unit.pieces(tokens)


def tokenize_raw(line: str) -> list[list[str]]:
    """Split one line of running text into sentences of tokens (the documented --raw rule)."""
    return [toks for part in _SENTENCE_END.split(line.strip()) if (toks := _TOKEN.findall(part))]


def _open_binary(path: Path) -> io.BufferedIOBase:
    if str(path) == "-":
        return open(sys.stdin.fileno(), "rb", closefd=False)
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _check_readable(path: Path) -> None:
    """Regular files, pipes (`<(...)`) and `-` (standard input) are all fine; directories are not."""
    if str(path) != "-" and (not path.exists() or path.is_dir()):
        raise SeqlmError(f"{path}: no such file")


def read_sentences(path: str | Path, raw: bool = False, unit: str | Tokenizer = "word") -> Iterator[list[str]]:
    """Yield sentences (token lists; characters with `unit="char"`). Blank lines are skipped. Errors name the
    file and line."""
    for block in read_blocks(path, raw, unit):
        yield from block


BLOCK = 1 << 20  # bytes of text decoded and split at once (whole lines: a block ends at a newline)


def read_blocks(path: str | Path, raw: bool = False, unit: str | Tokenizer = "word") -> Iterator[list[list[str]]]:
    """read_sentences a block of lines at a time: Python's per-line work (decoding, the NUL check) runs
    once a block, and a caller can encode a block's words in one pass."""
    for _, text in _text_blocks(path):
        lines = text.split("\n")  # the lines binary iteration gives (str.splitlines also cuts at \r, ...)
        if raw:
            yield [as_units(t, unit) for line in lines for t in tokenize_raw(line)]
        elif isinstance(unit, str):
            yield [as_units(toks, unit) for line in lines if (toks := line.split())]
        else:  # a tokenizer encodes a block's lines in one call
            yield unit.pieces_batch([line for line in lines if line.split()])


def sentences_per_line(path: str | Path, raw: bool = False) -> np.ndarray:
    """(L,) how many sentences each line of the file gives: 0 for a blank line (no sentence, for every
    command), 1 for a tokenised line, any number for a raw one (split at sentence ends). `seqlm score` uses
    it to print one line per input line."""
    counts: list[int] = []
    for _, text in _text_blocks(path):
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the empty piece after the block's last newline is no line
        counts.extend(len(tokenize_raw(line)) if raw else int(bool(line.split())) for line in lines)
    return np.asarray(counts, dtype=np.int64)


def _text_blocks(path: str | Path) -> Iterator[tuple[bytes, str]]:
    """The file in blocks of whole lines, as bytes and as text. An encoding error or NUL byte is located
    within its block, so it still names its own line (and its byte within the line)."""
    path = Path(path)
    _check_readable(path)
    lineno = 0  # lines before this block
    try:
        with _open_binary(path) as f:
            while data := f.read(BLOCK):
                data += f.readline()  # to the end of the line
                yield data, _decoded(path, data, lineno)
                lineno += data.count(b"\n")
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise SeqlmError(f"{path}: cannot read ({e})") from None


def id_blocks(path: str | Path, raw: bool, unit: str | Tokenizer, table: dict[str, int], grow: bool, unk: int,
              eos: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The text's sentences a block at a time as (ids (n,) int32 with `eos` after every sentence, the end of
    each sentence in them (S,) int64): each word looked up in `table`, a new one added with the next id
    when `grow` (first-appearance ids), else mapped to `unk`. Words are split and looked up in compiled
    code (data/native.py) for plain word-level text, else by Python, with the same result."""
    ext = tokens() if unit == "word" and not raw else None
    if ext is not None:
        for data, _ in _text_blocks(path):  # decoded once to check it; the words are read from the bytes
            ids, ends = ext.encode_lines(data, table, grow, unk, eos)
            yield np.frombuffer(ids, dtype=np.int32), np.frombuffer(ends, dtype=np.int64)
        return
    for block in read_blocks(path, raw, unit):
        ends = np.cumsum(np.fromiter(map(len, block), dtype=np.int64, count=len(block)) + 1)  # (S,)
        ids = np.full(int(ends[-1]) if len(ends) else 0, eos, dtype=np.int32)  # (n,) eos where a sentence ends
        words = np.ones(len(ids), dtype=bool)
        words[ends - 1] = False
        flat = itertools.chain.from_iterable(block)
        ids[words] = ([table.setdefault(w, len(table)) for w in flat] if grow else
                      [table.get(w, unk) for w in flat])
        yield ids, ends


def closed_id_blocks(path: str | Path, raw: bool, unit: str | Tokenizer,
                     vocab: Vocab) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """id_blocks for a closed vocabulary (--unk none): the first word outside it is an error naming the word and
    its line. Looked up by Python, line by line, to know the line (standard input cannot be read again)."""
    lineno = 0  # lines before this block
    for _, text in _text_blocks(path):
        sentences = []
        for n, line in enumerate(text.split("\n"), lineno + 1):
            for toks in tokenize_raw(line) if raw else [line.split()]:
                if toks:
                    sentences.append([vocab.known(u, f"{path}:{n}: ") for u in as_units(toks, unit)])
        lineno += text.count("\n")
        ends = np.cumsum(np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences)) + 1)  # (S,)
        ids = itertools.chain.from_iterable(s + [vocab.eos_id] for s in sentences)
        yield np.fromiter(ids, dtype=np.int32, count=int(ends[-1]) if len(ends) else 0), ends


def _decoded(path: Path, data: bytes, lineno: int) -> str:
    """A block as text; its first NUL byte or invalid UTF-8 as an error naming the line."""
    def line_of(at: int) -> tuple[int, int]:  # (line number, offset within that line) of byte `at`
        return lineno + data.count(b"\n", 0, at) + 1, at - (data.rfind(b"\n", 0, at) + 1)

    nul = data.find(b"\x00")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, at = line_of(e.start)
        if nul < 0 or line_of(nul)[0] > line:  # a line is checked for NUL before it is decoded
            raise SeqlmError(f"{path}:{line}: invalid UTF-8 ({e.reason} at byte {at}); "
                             "convert the file to UTF-8") from None
    if nul >= 0:
        raise SeqlmError(f"{path}:{line_of(nul)[0]}: contains a NUL byte; is this a text file?")
    return text


def count_words(path: str | Path, raw: bool = False, unit: str | Tokenizer = "word") -> Counter:
    """Word counts of a training file, one streaming pass; `</s>` counted once per sentence."""
    counter: Counter = Counter()
    sentences = 0
    for sent in read_sentences(path, raw, unit):
        counter.update(sent)
        sentences += 1
    if sentences == 0:
        raise SeqlmError(f"{path}: no sentences (the file is empty or blank); give a file with text in it")
    counter[EOS] += sentences
    return counter


@dataclass
class TokenStream:
    """An encoded text: `ids` (N,) int32 with `</s>` closing each sentence; `starts` (S+1,) int64."""

    ids: np.ndarray
    starts: np.ndarray
    # --unit token: the text's white-space words (</s> not counted), for eval's ppl_per_word; None otherwise
    words: int | None = None
    # --text-has-weights (kn): (S,) float64 each sentence's weight, its n-grams count it (ngram/weighted.py); None
    # otherwise: every sentence counts once
    weights: np.ndarray | None = None

    @property
    def num_sentences(self) -> int:
        return len(self.starts) - 1

    def sentence(self, i: int) -> np.ndarray:
        return self.ids[self.starts[i] : self.starts[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)


def cache_dir() -> Path:
    return Path(os.environ.get("SEQLM_CACHE", Path.home() / ".cache" / "seqlm"))


def _cache_key(path: Path, vocab: Vocab, raw: bool, unit: str | Tokenizer = "word") -> str:
    st = path.stat()
    mode = f"{raw}" if unit == "word" else f"{raw}|{unit}"  # word-level keys as before: old caches stay valid
    h = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{mode}|v2".encode())
    h.update("\n".join(vocab.itos).encode())
    if vocab.closed:  # its ids were checked for unknown words; an open vocabulary's were not
        h.update(b"|closed")
    return h.hexdigest()[:20]


_ARRAY_CHUNK = 1 << 20  # ids per numpy pass over a raw file: 4 MB int32 (8 MB as int64 temporaries)


def _write_npy_from_raw(raw_path: Path, out_path: Path, dtype: np.dtype, count: int,
                        lut: np.ndarray | None = None) -> None:
    """Turn a raw binary file into an .npy file without loading it (bounded memory).

    `lut` (optional) maps every value on the way through. The temporary file lives next to `raw_path`
    (a private work directory): data-parallel ranks encode the same file at once, and a shared
    temporary name would let one rank truncate the file another is still writing.
    """
    dtype = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (count,)}
    tmp = raw_path.with_suffix(".npy.tmp")
    with open(tmp, "wb") as out, open(raw_path, "rb") as src:
        np.lib.format.write_array_header_1_0(out, header)
        while len(chunk := np.fromfile(src, dtype=dtype, count=_ARRAY_CHUNK)):
            out.write((chunk if lut is None else lut[chunk].astype(dtype, copy=False)).tobytes())
    os.replace(tmp, out_path)


def _write_ids(blocks: Iterator[tuple[np.ndarray, np.ndarray]], work: Path) -> int:
    """Write id blocks (id_blocks) into work/ids.raw (int32) and work/starts.raw (int64, every sentence's
    start and the end). Neither is ever held whole: memory is bounded by a block. Returns the ids written."""
    n_tok = 0
    with open(work / "ids.raw", "wb") as f_ids, open(work / "starts.raw", "wb") as f_starts:
        f_starts.write(np.zeros(1, dtype=np.int64).tobytes())
        for ids, ends in blocks:
            f_ids.write(ids.tobytes())
            f_starts.write((ends + n_tok).tobytes())
            n_tok += len(ids)
    return n_tok


def _workdir(cdir: Path) -> tuple[Path, bool]:
    """A private scratch directory in the cache (same file system, so renames are atomic), else in /tmp."""
    try:
        cdir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=cdir)), True
    except OSError:
        return Path(tempfile.mkdtemp()), False


def _finish(work: Path, n_tok: int, paths: tuple[Path, Path] | None) -> TokenStream:
    """Turn work/ids.raw and work/starts.raw into the cached, memory-mapped pair (or in-memory arrays)."""
    if paths is None:
        return TokenStream(np.fromfile(work / "ids.raw", dtype=np.int32),
                           np.fromfile(work / "starts.raw", dtype=np.int64))
    ids_path, starts_path = paths
    n_sent = (work / "starts.raw").stat().st_size // 8 - 1
    _write_npy_from_raw(work / "ids.raw", ids_path, np.int32, n_tok)
    _write_npy_from_raw(work / "starts.raw", starts_path, np.int64, n_sent + 1)
    return TokenStream(np.load(ids_path, mmap_mode="r"), np.load(starts_path, mmap_mode="r"))


def _cache_paths(path: Path, vocab: Vocab, raw: bool, unit: str | Tokenizer = "word") -> tuple[Path, Path]:
    key = _cache_key(path, vocab, raw, unit)
    cdir = cache_dir() / "ids"
    return cdir / f"{key}.ids.npy", cdir / f"{key}.starts.npy"


def _empty(path: Path) -> SeqlmError:
    return SeqlmError(f"{path}: no sentences (the file is empty or blank); give a file with text in it")


def encode_file(path: str | Path, vocab: Vocab, raw: bool = False, use_cache: bool = True,
                unit: str | Tokenizer = "word") -> TokenStream:
    """Encode a text file with `vocab`, streaming, and cache the ids as memory-mapped .npy arrays. Pieces of a
    tokenizer come with the text's word count (TokenStream.words), a text read once spooled to read it twice."""
    path = Path(path)
    _check_readable(path)
    if isinstance(unit, str):
        return _encode_file(path, vocab, raw, use_cache, unit)
    if path.is_file():
        return _with_words(_encode_file(path, vocab, raw, use_cache, unit), path)
    with tempfile.TemporaryDirectory(prefix="seqlm-text-") as tmp:
        text = spool(path, Path(tmp) / "text")
        return _with_words(_encode_file(text, vocab, raw, False, unit), text)


def _with_words(stream: TokenStream, path: Path) -> TokenStream:
    words = sum(len(text.split()) for _, text in _text_blocks(path))
    return TokenStream(stream.ids, stream.starts, words)


def _encode_file(path: Path, vocab: Vocab, raw: bool, use_cache: bool, unit: str | Tokenizer) -> TokenStream:
    use_cache = use_cache and path.is_file()  # a pipe or stdin can be read only once: never cached
    ids_path, starts_path = _cache_paths(path, vocab, raw, unit) if use_cache else (cache_dir() / "ids" / "-", None)
    if use_cache and ids_path.exists() and starts_path.exists():
        return TokenStream(np.load(ids_path, mmap_mode="r"), np.load(starts_path, mmap_mode="r"))
    work, cached = _workdir(ids_path.parent)
    try:
        blocks = (closed_id_blocks(path, raw, unit, vocab) if vocab.closed else
                  id_blocks(path, raw, unit, vocab.stoi, False, vocab.unk_id, vocab.eos_id))
        n_tok = _write_ids(blocks, work)
        if n_tok == 0:
            raise _empty(path)
        return _finish(work, n_tok, (ids_path, starts_path) if use_cache and cached else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_vocab(path: str | Path, raw: bool = False, max_vocab: int | None = None, min_count: int = 1,
                unit: str | Tokenizer = "word", use_cache: bool = True, fixed: list[str] | None = None,
                outside: bool = False) -> Vocab:
    """The training vocabulary, built in one streaming pass that also leaves the encoded text in the cache.

    Words get provisional ids in order of first appearance while the text streams to disk; their counts
    come from the ids on disk; once the vocabulary is known (Vocab.build: frequency order), one cheap
    array pass maps the provisional ids to the final ones, into the cache entry `encode_file(path,
    vocab)` then opens without reading the text again. Memory is bounded by the vocabulary and the
    longest line, not the corpus. Same result as `Vocab.build(count_words(path), ...)`. `use_cache=False`
    (a temporary file, e.g. spooled standard input) leaves nothing in the cache. `fixed` (a word list, --vocab)
    gives `Vocab.fixed(count_words(path), fixed, outside)` instead.
    """
    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: no such file (the training text must be a regular file)")
    st = path.stat()
    mode = f"{raw}" if unit == "word" else f"{raw}|{unit}"
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{mode}|{max_vocab}|{min_count}|v1".encode())
    if fixed is not None:
        key.update(f"|fixed|{outside}|".encode() + "\n".join(fixed).encode())
    cached_vocab = cache_dir() / "ids" / f"{key.hexdigest()[:20]}.vocab.txt"
    keep_vocab = use_cache and not outside  # vocab.txt cannot hold a `limit`: such a vocabulary is rebuilt
    if keep_vocab and cached_vocab.is_file():  # e.g. built by `train --nproc` before it started the workers
        with contextlib.suppress(SeqlmError):
            return Vocab.load(cached_vocab)
    prov: dict[str, int] = {EOS: 0}  # provisional ids; a literal </s> in the text is the sentence end

    work, cached = _workdir(cache_dir() / "ids")
    cached = cached and use_cache
    try:
        n_tok = _write_ids(id_blocks(path, raw, unit, prov, True, -1, 0), work)
        if n_tok == 0:
            raise _empty(path)
        counts = np.zeros(len(prov), dtype=np.int64)
        with open(work / "ids.raw", "rb") as f:
            while len(chunk := np.fromfile(f, dtype=np.int32, count=_ARRAY_CHUNK)):
                counts += np.bincount(chunk, minlength=len(prov))
        # Insertion order is first appearance, as in count_words, so ties in Vocab.build break alike.
        counter = Counter(dict(zip(prov, counts.tolist(), strict=True)))
        vocab = Vocab.build(counter, max_vocab, min_count) if fixed is None else Vocab.fixed(counter, fixed, outside)
        if cached:
            lut = np.fromiter((vocab.id(w) for w in prov), dtype=np.int32, count=len(prov))
            ids_path, starts_path = _cache_paths(path, vocab, raw, unit)
            _write_npy_from_raw(work / "ids.raw", ids_path, np.int32, n_tok, lut)
            n_sent = (work / "starts.raw").stat().st_size // 8 - 1
            _write_npy_from_raw(work / "starts.raw", starts_path, np.int64, n_sent + 1)
            if keep_vocab:
                vocab.save(cached_vocab)
        return vocab
    finally:
        shutil.rmtree(work, ignore_errors=True)


def stdin_is_input() -> bool:
    """Whether standard input is a pipe or a file (`< text`, `cat text |`), not a terminal or /dev/null:
    then a command given no text file reads it, as KenLM's lmplz and query do."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no stdin, or a stand-in without a descriptor (pytest)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)


def spool(src: Path, dest: Path) -> Path:
    """Copy a text that can be read only once (`-` for standard input, a pipe; `.gz` decompressed) into the
    file `dest`, streaming, so that it can be read twice: for the vocabulary, then for the ids."""
    _check_readable(src)
    try:
        with _open_binary(src) as f, open(dest, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise SeqlmError(f"{src}: cannot read ({e})") from None
    return dest


def build_vocab_and_encode(path: str | Path, raw: bool = False, max_vocab: int | None = None,
                           min_count: int = 1, unit: str | Tokenizer = "word") -> tuple[Vocab, TokenStream]:
    """`build_vocab` and the encoded (memory-mapped) training text: one pass over the file."""
    vocab = build_vocab(path, raw, max_vocab, min_count, unit)
    return vocab, encode_file(path, vocab, raw, unit=unit)


def encode_sentences(sentences: list[list[str]], vocab: Vocab, unit: str | Tokenizer = "word") -> TokenStream:
    """Encode in-memory sentences (API use, n-best lists) without touching the cache."""
    ids: list[int] = []
    starts = [0]
    for i, sent in enumerate(sentences, 1):
        units = as_units(sent, unit)
        ids.extend([vocab.known(u, f"sentence {i}: ") for u in units] if vocab.closed else vocab.encode(units))
        ids.append(vocab.eos_id)
        starts.append(len(ids))
    words = None if isinstance(unit, str) else sum(len(s) for s in sentences)
    return TokenStream(np.asarray(ids, dtype=np.int32), np.asarray(starts, dtype=np.int64), words)
