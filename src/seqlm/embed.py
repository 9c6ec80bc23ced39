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


@dataclass
class EmbedOptions:
    dim: int = 200  # vector size (the paper: 200)
    window: int = 5  # context words on each side
    negative: int = 5  # negative samples per positive pair
    min_count: int = 2  # words seen fewer times get no vector (the LM's --min-count 2 vocabulary)
    epochs: int = 5  # passes over the corpus
    threads: int = 1  # gensim worker threads
    seed: int = 1


def train_embeddings(text: Path, out: Path, opt: EmbedOptions) -> dict:
    """Skip-gram with negative sampling on a tokenised text file (.gz ok), one sentence per line."""
    from gensim.models import Word2Vec
    from gensim.models.word2vec import LineSentence

    if not text.is_file():
        raise SeqlmError(f"{text}: no such text file")
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
    try:
        kv = KeyedVectors.load_word2vec_format(str(path), binary=_is_binary(path))
    except (ValueError, UnicodeDecodeError, EOFError, IndexError) as e:
        raise SeqlmError(f"{path}: not a word2vec text or binary file ({e.__class__.__name__}: {e})") from None
    if len(kv) == 0:
        raise SeqlmError(f"{path}: no vectors in the file")
    return list(kv.index_to_key), np.asarray(kv.vectors, dtype=np.float32)


def embed_from_cli(args) -> dict:
    """`seqlm embed CORPUS --out FILE`: CORPUS is a text file or a corpus (name or directory: its train split)."""
    path = Path(args.corpus)
    if not path.is_file():
        from seqlm.data.datasets import resolve_corpus, split_path

        path = split_path(resolve_corpus(args.corpus), "train")
    opt = EmbedOptions(dim=args.dim, window=args.window, negative=args.negative, min_count=args.min_count,
                       epochs=args.epochs, threads=args.threads, seed=args.seed)
    return train_embeddings(path, Path(args.out), opt)


def add_embed_options(p) -> None:
    d = EmbedOptions()
    p.add_argument("corpus", help="tokenised text file (.gz ok), or a corpus name/directory (its train split)")
    p.add_argument("--out", required=True, help="word2vec text file to write")
    p.add_argument("--dim", type=int, default=d.dim, help="vector size")
    p.add_argument("--window", type=int, default=d.window, help="context words on each side")
    p.add_argument("--negative", type=int, default=d.negative, help="negative samples per pair")
    p.add_argument("--min-count", type=int, default=d.min_count, help="skip words seen fewer times")
    p.add_argument("--epochs", type=int, default=d.epochs, help="passes over the text")
    p.add_argument("--threads", type=int, default=d.threads, help="gensim worker threads")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed")
