"""Reading text: one sentence per line, whitespace-separated tokens (the PTB convention).

Files may be gzip-compressed (`.gz`). `raw=True` reads untokenised UTF-8 text instead (see
`tokenize_raw`). Encoded corpora are cached as memory-mapped `.npy` arrays so that a corpus larger
than RAM streams: `ids` holds every token with `</s>` after each sentence, `starts[i]` is the offset
of sentence i (`starts[-1] == len(ids)`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqlm.data.vocab import EOS, Vocab
from seqlm.errors import SeqlmError

SPLITS = ("train", "valid", "test")

# --raw: a sentence ends after . ! or ? followed by white space; a token is a run of letters/digits
# (with inner - ' . , as in "don't", "u.s.", "3.5") or any other single non-space character.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TOKEN = re.compile(r"\w+(?:[-'.,]\w+)*|[^\w\s]")


def tokenize_raw(line: str) -> list[list[str]]:
    """Split one line of running text into sentences of tokens (the documented --raw rule)."""
    return [toks for part in _SENTENCE_END.split(line.strip()) if (toks := _TOKEN.findall(part))]


def _open_binary(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_sentences(path: str | Path, raw: bool = False) -> Iterator[list[str]]:
    """Yield sentences (token lists). Blank lines are skipped. Errors name the file and line.

    Lines are decoded one at a time so that an encoding error reports its own line number.
    """
    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: no such file")
    try:
        with _open_binary(path) as f:
            for lineno, data in enumerate(f, 1):
                if b"\x00" in data:
                    raise SeqlmError(f"{path}:{lineno}: contains a NUL byte; is this a text file?")
                try:
                    line = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise SeqlmError(f"{path}:{lineno}: invalid UTF-8 ({e.reason} at byte {e.start}); "
                                     "convert the file to UTF-8") from None
                if raw:
                    yield from tokenize_raw(line)
                elif toks := line.split():
                    yield toks
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise SeqlmError(f"{path}: cannot read ({e})") from None


def count_words(path: str | Path, raw: bool = False) -> Counter:
    """Word counts of a training file, one streaming pass; `</s>` counted once per sentence."""
    counter: Counter = Counter()
    sentences = 0
    for sent in read_sentences(path, raw):
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

    @property
    def num_sentences(self) -> int:
        return len(self.starts) - 1

    def sentence(self, i: int) -> np.ndarray:
        return self.ids[self.starts[i] : self.starts[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)


def cache_dir() -> Path:
    return Path(os.environ.get("SEQLM_CACHE", Path.home() / ".cache" / "seqlm"))


def _cache_key(path: Path, vocab: Vocab, raw: bool) -> str:
    st = path.stat()
    h = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{raw}|v2".encode())
    h.update("\n".join(vocab.itos).encode())
    return h.hexdigest()[:20]


def _write_npy_from_raw(raw_path: Path, out_path: Path, dtype: np.dtype, count: int) -> None:
    """Turn a raw binary file into an .npy file without loading it (bounded memory)."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (count,)}
    tmp = out_path.with_suffix(".tmp")
    with open(tmp, "wb") as out, open(raw_path, "rb") as src:
        np.lib.format.write_array_header_1_0(out, header)
        while chunk := src.read(1 << 24):
            out.write(chunk)
    os.replace(tmp, out_path)


def encode_file(path: str | Path, vocab: Vocab, raw: bool = False, use_cache: bool = True) -> TokenStream:
    """Encode a text file with `vocab`, streaming, and cache the ids as memory-mapped .npy arrays."""
    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: no such file")
    key = _cache_key(path, vocab, raw)
    cdir = cache_dir() / "ids"
    ids_path, starts_path = cdir / f"{key}.ids.npy", cdir / f"{key}.starts.npy"
    if use_cache and ids_path.exists() and starts_path.exists():
        return TokenStream(np.load(ids_path, mmap_mode="r"), np.load(starts_path, mmap_mode="r"))
    try:
        cdir.mkdir(parents=True, exist_ok=True)
        workdir = tempfile.mkdtemp(dir=cdir)
    except OSError:
        use_cache, workdir = False, tempfile.mkdtemp()
    work = Path(workdir)
    n_tok = 0
    starts = [0]
    buf: list[int] = []
    eos = vocab.eos_id
    with open(work / "ids.raw", "wb") as f:
        for sent in read_sentences(path, raw):
            buf.extend(vocab.encode(sent))
            buf.append(eos)
            n_tok += len(sent) + 1
            starts.append(n_tok)
            if len(buf) >= 1 << 20:
                f.write(np.asarray(buf, dtype=np.int32).tobytes())
                buf.clear()
        f.write(np.asarray(buf, dtype=np.int32).tobytes())
    if n_tok == 0:
        raise SeqlmError(f"{path}: no sentences (the file is empty or blank); give a file with text in it")
    if not use_cache:
        ids = np.fromfile(work / "ids.raw", dtype=np.int32)
        return TokenStream(ids, np.asarray(starts, dtype=np.int64))
    _write_npy_from_raw(work / "ids.raw", ids_path, np.int32, n_tok)
    np.save(work / "starts.npy", np.asarray(starts, dtype=np.int64))
    os.replace(work / "starts.npy", starts_path)
    (work / "ids.raw").unlink()
    work.rmdir()
    return TokenStream(np.load(ids_path, mmap_mode="r"), np.load(starts_path, mmap_mode="r"))


def encode_sentences(sentences: list[list[str]], vocab: Vocab) -> TokenStream:
    """Encode in-memory sentences (API use, n-best lists) without touching the cache."""
    ids: list[int] = []
    starts = [0]
    for sent in sentences:
        ids.extend(vocab.encode(sent))
        ids.append(vocab.eos_id)
        starts.append(len(ids))
    return TokenStream(np.asarray(ids, dtype=np.int32), np.asarray(starts, dtype=np.int64))
