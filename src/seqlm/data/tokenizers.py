"""Subword tokens (`--unit token`): text read through a sentencepiece model (`.model`) or a Hugging Face
`tokenizer.json`, each by its own library (the optional extra `tokenizers`).

Each line of text, its white space normalised (`" ".join(line.split())`, as a word model reads it), is encoded
by the tokenizer into ids, and each id is read as its piece (the string the tokenizer's vocabulary lists); the
tokenizer's unknown-piece id becomes seqlm's `<unk>`. The pieces are then a model's tokens exactly as words are:
its vocabulary is built from the training text's pieces (frequency order, `--max-vocab`, `--min-count`,
`--vocab` all apply), not copied from the tokenizer, so that every family and every n-gram estimate works on
pieces as it does on words. Generation joins pieces back with the tokenizer's own decode.

The tokenizer file is copied into the model directory (`tokenizer.model` or `tokenizer.json`) and its hash is
part of the model's TextSpec: a model is never fed text split another way. `Tokenizer.__str__` names that hash,
so the id caches of seqlm.data.corpus keep pieces of different tokenizers apart.

NeMo's token n-grams (`--arpa-encoding nemo-offset`): NeMo's train_kenlm.py writes each token id `i` of a line as
the one character chr(i + 100) (DEFAULT_TOKEN_OFFSET) before lmplz counts them; `nemo_vocab` and `piece_vocab`
rename a vocabulary between pieces and those characters, so such an ARPA file is written and read back.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqlm.config import DataConfig
from seqlm.data.vocab import BOS, EOS, UNK, Vocab
from seqlm.errors import SeqlmError

SP_FILE, HF_FILE = "tokenizer.model", "tokenizer.json"  # the copy's name in a model directory
SPECIAL = (BOS, EOS, UNK)  # kept as they are in an ARPA file under any encoding (lmplz's own symbols)


class Tokenizer:
    """One tokenizer file, loaded: `pieces_batch` (lines -> pieces), `decode` (pieces -> text), `ids`."""

    def __init__(self, path: Path):
        data = path.read_bytes()
        self.path, self.hash = path, hashlib.sha256(data).hexdigest()[:16]
        self.file_name = HF_FILE if path.suffix == ".json" else SP_FILE
        self._lib = _HuggingFace(path, data) if self.file_name == HF_FILE else _SentencePiece(path, data)
        self.unk_id = self._lib.unk_id
        self.itos = [UNK if i == self.unk_id else p for i, p in enumerate(self._lib.pieces())]  # tokenizer id -> piece
        self.stoi = {p: i for i, p in enumerate(self.itos)}
        spaced = next((i for i, p in enumerate(self.itos) if p.split() != [p]), None)
        if spaced is not None:  # vocab.txt and ARPA files separate tokens by white space
            raise SeqlmError(f"{path}: piece {self.itos[spaced]!r} (id {spaced}) holds white space, which seqlm's "
                             "vocabulary and ARPA files cannot hold; use a tokenizer whose pieces have none")

    def __str__(self) -> str:
        return f"token:{self.hash}"

    def __len__(self) -> int:
        return len(self.itos)

    def ids(self, lines: list[str]) -> list[list[int]]:
        """The tokenizer's ids of each line (white space normalised), no special tokens added."""
        return self._lib.encode([" ".join(line.split()) for line in lines])

    def pieces_batch(self, lines: list[str]) -> list[list[str]]:
        itos = self.itos
        return [[itos[i] for i in row] for row in self.ids(lines)]

    def pieces(self, words: list[str]) -> list[str]:
        """One sentence given as its words (seqlm.data.corpus.as_units)."""
        return self.pieces_batch([" ".join(words)])[0]

    def decode(self, pieces: list[str]) -> str:
        """Pieces back to text by the tokenizer's decode; `<unk>` as the tokenizer's unknown piece."""
        ids = [self.stoi[p] for p in pieces if p in self.stoi]
        return self._lib.decode(ids)


class _SentencePiece:
    def __init__(self, path: Path, data: bytes):
        spm = library("sentencepiece")
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=data)
        except (RuntimeError, OSError, TypeError) as e:
            raise SeqlmError(f"{path}: not a sentencepiece model ({first_line(e)}); give a .model file or a "
                             "Hugging Face tokenizer.json") from None
        self.unk_id = self.sp.unk_id()

    def pieces(self) -> list[str]:
        return [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self.sp.encode(lines)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(ids)


class _HuggingFace:
    def __init__(self, path: Path, data: bytes):
        lib = library("tokenizers")
        try:
            self.tok = lib.Tokenizer.from_str(data.decode("utf-8"))
            model = json.loads(data).get("model", {})
        except (Exception) as e:  # the library raises its own exception types
            raise SeqlmError(f"{path}: not a Hugging Face tokenizer.json ({first_line(e)})") from None
        unk = model.get("unk_token")
        self.unk_id = self.tok.token_to_id(unk) if unk is not None else model.get("unk_id")

    def pieces(self) -> list[str]:
        n = self.tok.get_vocab_size(with_added_tokens=True)
        return [self.tok.id_to_token(i) or f"<unused:{i}>" for i in range(n)]  # ids with no token are never produced

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(lines, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def library(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise SeqlmError(f"--unit token needs the {name} library: pip install 'seqlm[tokenizers]'") from None


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


# ---- finding and loading --------------------------------------------------------------------------------

_BY_FILE: dict[tuple[str, int, int], Tokenizer] = {}
_BY_HASH: dict[str, Tokenizer] = {}  # every tokenizer loaded in this process: what a TextSpec's hash names


def tokenizer_file(path: str | Path) -> Path:
    """--tokenizer: a file, or a directory holding tokenizer.model or tokenizer.json (a model directory)."""
    path = Path(path)
    if path.is_dir():
        found = [path / n for n in (SP_FILE, HF_FILE) if (path / n).is_file()]
        if not found:
            raise SeqlmError(f"--tokenizer {path}: the directory holds no {SP_FILE} or {HF_FILE}")
        return found[0]
    if not path.is_file():
        raise SeqlmError(f"--tokenizer {path}: no such file (a sentencepiece .model, a tokenizer.json, or a "
                         "directory holding one)")
    return path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a file or directory, loaded once per process (kept by file and by hash)."""
    file = tokenizer_file(path)
    st = file.stat()
    key = (str(file.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _BY_FILE:
        tok = Tokenizer(file)
        _BY_FILE[key] = _BY_HASH.setdefault(tok.hash, tok)
    return _BY_FILE[key]


def token_hash(data: DataConfig) -> str:
    """TextSpec.tokenizer_hash of a model reading text as `data` says: "" but for --unit token."""
    return load_tokenizer(data.tokenizer).hash if data.unit == "token" else ""


def reading(data: DataConfig) -> str | Tokenizer:
    """What seqlm.data.corpus reads text into under `data`: "word", "char" or the Tokenizer."""
    return load_tokenizer(data.tokenizer) if data.unit == "token" else data.unit


def units_of(spec: Any) -> str | Tokenizer:
    """The same for a model's TextSpec: its tokenizer was loaded with the model (seqlm.load, training)."""
    if spec.unit != "token":
        return spec.unit
    tok = _BY_HASH.get(spec.tokenizer_hash)
    if tok is None:
        raise SeqlmError(f"this model reads the pieces of tokenizer {spec.tokenizer_hash}, which is not loaded; "
                         "load the model with seqlm.load (it finds the tokenizer in the model directory)")
    return tok


# ---- model directories ----------------------------------------------------------------------------------

def stored_data(data: DataConfig | None, out: Path) -> DataConfig | None:
    """seqlm.save: copy a token model's tokenizer into `out` and return the data settings naming the copy
    (relative to the directory, so it can move); None when there is nothing to copy."""
    if data is None or data.unit != "token":
        return None
    tok = load_tokenizer(data.tokenizer)
    dest = out / tok.file_name
    if not (dest.is_file() and dest.resolve() == tok.path.resolve()):
        from seqlm.checkpoint import atomic_path

        with atomic_path(dest) as tmp:
            shutil.copyfile(tok.path, tmp)
    return replace(data, tokenizer=tok.file_name)


def read_tokens(model: Any, where: Path | None) -> None:
    """seqlm.load's last step for a token model: its tokenizer (named relative to the model directory
    `where`) loaded, and a NeMo-encoded n-gram model's words renamed back to pieces."""
    data = model.data_config
    if data is None or data.unit != "token":
        return
    if where is not None and not Path(data.tokenizer).is_absolute():
        data.tokenizer = str(where / data.tokenizer)
    tok = load_tokenizer(data.tokenizer)
    if data.arpa_encoding == "nemo-offset":
        model.vocab = piece_vocab(model.vocab, tok, data.arpa_offset, str(where or "the n-gram file"))


@contextmanager
def files_vocab(model: Any) -> Iterator[None]:
    """While seqlm.save writes a model's files: a NeMo-encoded model's words as chr(id + offset)."""
    data = model.data_config
    if data is None or data.arpa_encoding == "plain":
        yield
        return
    pieces = model.vocab
    model.vocab = nemo_vocab(pieces, load_tokenizer(data.tokenizer), data.arpa_offset)
    try:
        yield
    finally:
        model.vocab = pieces


# ---- NeMo's encoding of token ids -----------------------------------------------------------------------

def nemo_vocab(vocab: Vocab, tok: Tokenizer, offset: int) -> Vocab:
    """`vocab` with each piece renamed chr(tokenizer id + offset); <s>, </s> and <unk> stay (lmplz's own)."""
    names = []
    for piece in vocab.itos:
        if piece in SPECIAL:
            names.append(piece)
            continue
        if piece not in tok.stoi:
            raise SeqlmError(f"--arpa-encoding nemo-offset: the token {piece!r} is no piece of the tokenizer")
        names.append(_char(tok.stoi[piece] + offset))
    return _renamed(vocab, names)


def _char(code: int) -> str:
    """chr(code) as an ARPA word: KenLM splits a line at ASCII white space only, so U+0085 or U+00A0 are words."""
    if code >= 0x110000 or 0xD800 <= code < 0xE000 or chr(code) in " \t\n\r\f\v\0":
        raise SeqlmError(f"--arpa-encoding nemo-offset: code point {code:#x} is no word an ARPA file can hold "
                         "(ASCII white space, a surrogate or past Unicode); choose another --arpa-offset")
    return chr(code)


def piece_vocab(vocab: Vocab, tok: Tokenizer, offset: int, source: str) -> Vocab:
    """The inverse of nemo_vocab: each one-character word back to the piece of tokenizer id ord(word) - offset.
    A piece named like a symbol the file has itself (the tokenizer's unknown piece, seqlm's `<unk>`, beside
    lmplz's `<unk>`) is kept apart as `<unk>:ID`: seqlm reads an unknown piece as the file's own `<unk>`."""
    names = []
    for word in vocab.itos:
        i = ord(word) - offset if len(word) == 1 else -1
        if word in SPECIAL:
            names.append(word)
        elif not 0 <= i < len(tok):
            raise SeqlmError(f"{source}: the word {word!r} is no token id under --arpa-encoding nemo-offset "
                             f"--arpa-offset {offset} with this {len(tok)}-piece tokenizer; is the file NeMo-encoded, "
                             "and is this its tokenizer?")
        else:
            names.append(f"{tok.itos[i]}:{i}" if tok.itos[i] in vocab.stoi and tok.itos[i] in SPECIAL else tok.itos[i])
    return _renamed(vocab, names)


def _renamed(vocab: Vocab, names: list[str]) -> Vocab:
    out = Vocab(names, vocab.counts, vocab.limit)
    out.closed = vocab.closed
    return out
