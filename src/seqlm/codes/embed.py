"""`seqlm embed`: skip-gram word vectors (Mikolov et al. 2013) to code rare words from (sparse-codes).

Training is gensim's Word2Vec (skip-gram, negative sampling: the field's standard C implementation);
the output is word2vec text format, most frequent word first, which is the order `seqlm sparse-codes`
takes its base words from. `load_vectors` reads word2vec text or binary files made by any tool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqlm.checkpoint import atomic_path
from seqlm.errors import SeqlmError
from seqlm.outputs import claim_output


@dataclass
class EmbedOptions:
    dim: int = 200  # vector size (the paper: 200)
    window: int = 5  # context words on each side
    negative: int = 5  # negative samples per positive pair
    min_count: int = 2  # words seen fewer times get no vector (the LM's --min-count 2 vocabulary)
    epochs: int = 5  # passes over the corpus
    threads: int = 1  # gensim worker threads
    seed: int = 1


def train_embeddings(text: Path, out: Path, opt: EmbedOptions, force: bool = False) -> dict:
    """Skip-gram with negative sampling on a tokenised text file (.gz ok), one sentence per line; an
    existing `out` is replaced only with `force`."""
    from gensim.models import Word2Vec
    from gensim.models.word2vec import LineSentence

    if not text.is_file():
        raise SeqlmError(f"{text}: no such text file")
    claim_output(out, force, "--out", inputs=[text])
    for name in ("dim", "window", "negative", "min_count", "epochs", "threads"):
        if getattr(opt, name) < 1:
            raise SeqlmError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(opt, name)}")
    t0 = time.time()
    model = Word2Vec(sentences=LineSentence(str(text)), vector_size=opt.dim, window=opt.window, sg=1, hs=0,
                     negative=opt.negative, min_count=opt.min_count, workers=opt.threads, epochs=opt.epochs,
                     seed=opt.seed)
    if len(model.wv) == 0:
        raise SeqlmError(f"{text}: no word occurs --min-count {opt.min_count} times; nothing to embed")
    with atomic_path(out) as tmp:
        model.wv.save_word2vec_format(str(tmp), binary=False)
    return {"out": str(out), "words": len(model.wv), "dim": opt.dim, "seconds": round(time.time() - t0, 2)}


def _is_binary(path: Path) -> bool:
    """word2vec binary files have raw float bytes after the header line; text files are UTF-8 throughout."""
    with open(path, "rb") as f:
        f.readline()
        chunk = f.read(1 << 16)
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(chunk) - 4  # a character cut at the chunk's end is not evidence
    return b"\0" in chunk


def load_vectors(path: str | Path) -> tuple[list[str], np.ndarray]:
    """Words (file order) and their vectors (N, E) float32 from a word2vec text or binary file."""
    from gensim.models import KeyedVectors

    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: vectors file not found (make one with `seqlm embed CORPUS --out FILE`)")
    binary = _is_binary(path)
    _check_header(path, binary)
    try:
        with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused below
            kv = KeyedVectors.load_word2vec_format(str(path), binary=binary)
    except (ValueError, UnicodeDecodeError, EOFError, IndexError, TypeError, KeyError) as e:  # TypeError, KeyError:
        # gensim's own failures on repeated or missing words
        raise SeqlmError(f"{path}: not a word2vec text or binary file ({e.__class__.__name__}: {e})") from None
    words = list(kv.index_to_key)
    if not words:
        raise SeqlmError(f"{path}: no vectors in the file")
    if not all(isinstance(w, str) and w for w in words) or len(set(words)) != len(words):
        raise SeqlmError(f"{path}: fewer vectors than the header says, or a word twice (a damaged or mistyped file)")
    vectors = np.asarray(kv.vectors, dtype=np.float32)  # (N, E)
    if not np.isfinite(vectors).all():
        raise SeqlmError(f"{path}: the vectors hold NaN or infinite values")
    return words, vectors


def _check_header(path: Path, binary: bool) -> None:
    """The header line 'count dim': two positive integers the file is long enough to hold (gensim would
    allocate count x dim floats before reading a single vector)."""
    with open(path, "rb") as f:
        head = f.readline().split()
    if len(head) != 2 or not all(x.isdigit() and int(x) > 0 for x in head):
        raise SeqlmError(f"{path}:1: not a word2vec file (the first line must be 'count dim', two positive integers)")
    count, dim = int(head[0]), int(head[1])
    if count * dim * (4 if binary else 2) > path.stat().st_size:  # a value takes >= 4 bytes, or 2 as text ("0 ")
        raise SeqlmError(f"{path}:1: the header promises {count} vectors of {dim} values, more than the file holds")


def embed_from_cli(args) -> dict:
    """`seqlm embed CORPUS --out FILE`: CORPUS is a text file or a corpus (name or directory: its train split)."""
    path = Path(args.corpus)
    if not path.is_file():
        from seqlm.data.datasets import resolve_corpus, split_path

        path = split_path(resolve_corpus(args.corpus), "train")
    opt = EmbedOptions(dim=args.dim, window=args.window, negative=args.negative, min_count=args.min_count,
                       epochs=args.epochs, threads=args.threads, seed=args.seed)
    return train_embeddings(path, Path(args.out), opt, args.force)


def add_embed_options(p) -> None:
    d = EmbedOptions()
    p.add_argument("corpus", help="tokenised text file (.gz ok), or a corpus name/directory (its train split)")
    p.add_argument("--out", required=True, help="word2vec text file to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--dim", type=int, default=d.dim, help="vector size")
    p.add_argument("--window", type=int, default=d.window, help="context words on each side")
    p.add_argument("--negative", type=int, default=d.negative, help="negative samples per pair")
    p.add_argument("--min-count", type=int, default=d.min_count, help="skip words seen fewer times")
    p.add_argument("--epochs", type=int, default=d.epochs, help="passes over the text")
    p.add_argument("--threads", type=int, default=d.threads, help="gensim worker threads")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed")
