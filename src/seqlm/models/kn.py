"""Family `kn`: back-off n-gram models; by default interpolated modified Kneser-Ney, estimated exactly as
KenLM's lmplz, or with `--smoothing` another of Chen & Goodman's methods (ngram/smoothing.py).

The estimators and the model live in seqlm.ngram; this file is the glue the registry and CLI use:
the config (`seqlm train --model kn --order 5`), estimation from an encoded corpus, and the model
directory's `model.arpa` (a plain ARPA file any KenLM/SRILM tool reads) with `model.bin` beside it
(seqlm's memory-mapped binary, ngram/binary.py), which loading prefers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import BOS, Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.binary import write_binary
from seqlm.ngram.counts import NGramCounts, count_ngrams
from seqlm.ngram.files import ARPA, BINARY, load_kn, load_ngram_file  # noqa: F401 (the family's loaders)
from seqlm.ngram.kneser_ney import (
    adjust_counts,
    compute_discounts,
    drop_pruned,
    estimate_model,
    initial_probabilities,
    interpolate,
    prune_marks,
)
from seqlm.ngram.model import NGramModel
from seqlm.ngram.prune import prune_entropy
from seqlm.ngram.smoothing import BACKOFF_BY_DEFAULT, METHODS, Smoothing, estimate_smoothed

MAX_ORDER = 64


@dataclass
class KNConfig:
    order: int = 5  # n: predicts from the previous n-1 words
    # modified-kn (lmplz's, exact) | kn (one discount per order) | absolute | witten-bell | katz | additive
    smoothing: str = "modified-kn"
    # interpolated | backoff | auto (katz and additive back off, the others interpolate); ARPA either way
    form: str = "auto"
    # D1 D2 D3+ used for an order whose count-of-counts are too sparse (lmplz --discount_fallback); kn and
    # absolute take D1
    discount_fallback: str = "0.5 1 1.5"
    discount: float = 0.0  # kn, absolute: one discount D in (0, 1] for every order; 0 = n1 / (n1 + 2 n2) per order
    add_k: float = 1.0  # additive: k added to every count (1: Laplace; Lidstone otherwise)
    katz_max: int = 5  # katz: counts up to this are discounted by Good-Turing, larger ones kept (Katz's k)
    # lmplz --prune: per order, drop n-grams seen at most this often ("0 1": singleton bigrams and up)
    prune: str = "0"
    # SRILM -prune: drop n-grams whose removal raises the relative entropy less than this (Stolcke 1998)
    prune_entropy: float = 0.0
    # lmplz -S: estimation memory (e.g. 1G, 300M); every stage works on tables in files (TMPDIR); "" = all in RAM
    memory: str = ""

    # Options one smoothing method alone reads (seqlm.config refuses them, given, under another).
    USED_BY: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        "discount_fallback": ("smoothing", ("modified-kn", "kn", "absolute")),
        "discount": ("smoothing", ("kn", "absolute")),
        "add_k": ("smoothing", ("additive",)),
        "katz_max": ("smoothing", ("katz",)),
        "memory": ("smoothing", ("modified-kn",)),
    }

    def __post_init__(self) -> None:
        if not 1 <= self.order <= MAX_ORDER:
            raise SeqlmError(f"--order must be between 1 and {MAX_ORDER} for kn, got {self.order}")
        _ = self.fallback, self.thresholds, self.memory_bytes, self.spec  # validate now, not at estimation time
        if not self.prune_entropy >= 0:
            raise SeqlmError(f"--prune-entropy must be >= 0 (e.g. 1e-8), got {self.prune_entropy}")

    @property
    def lmplz(self) -> bool:
        """Whether lmplz's own estimator runs (interpolated modified KN): --memory and --vocab need it."""
        return self.smoothing == "modified-kn" and self.form != "backoff"

    @property
    def spec(self) -> Smoothing:
        """What ngram/smoothing.py reads, checked: the method, its form and its numbers."""
        if self.smoothing not in METHODS:
            raise SeqlmError(f"--smoothing must be one of {', '.join(METHODS)}; got {self.smoothing!r}")
        if self.form not in ("auto", "interpolated", "backoff"):
            raise SeqlmError(f"--form must be one of auto, interpolated, backoff; got {self.form!r}")
        if not 0 <= self.discount <= 1:
            raise SeqlmError(f"--discount must lie in (0, 1] (0: estimated per order), got {self.discount}")
        if not self.add_k > 0:
            raise SeqlmError(f"--add-k must be positive (1: Laplace), got {self.add_k}")
        if self.katz_max < 1:
            raise SeqlmError(f"--katz-max must be at least 1, got {self.katz_max}")
        if self.memory and not self.lmplz:
            raise SeqlmError("--memory: bounded-memory estimation is interpolated modified Kneser-Ney only; drop "
                             "--memory or --form backoff")
        interpolated = self.form == "interpolated" or (self.form == "auto" and self.smoothing not in BACKOFF_BY_DEFAULT)
        return Smoothing(self.smoothing, interpolated, self.discount, self.fallback, self.add_k, self.katz_max)

    @property
    def thresholds(self) -> tuple[int, ...]:
        """The --prune counts per order: integers >= 0, non-decreasing, 0 for unigrams (as lmplz)."""
        try:
            t = tuple(int(x) for x in str(self.prune).replace(",", " ").split())
        except ValueError:
            t = ()
        if not t or t[0] != 0 or any(x < 0 for x in t) or list(t) != sorted(t):
            raise SeqlmError(f"--prune must be non-decreasing counts starting with 0 (unigrams are never "
                             f"pruned), e.g. --prune 0 1 1; got {self.prune!r}")
        return t

    @property
    def memory_bytes(self) -> int | None:
        """--memory as bytes (suffixes K, M, G, T as lmplz -S; no suffix: bytes); None when unset."""
        text = str(self.memory).strip().upper().removesuffix("B")
        if not text:
            return None
        scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(text[-1:], 1)
        try:
            value = float(text[:-1] if scale > 1 else text) * scale
        except ValueError:
            value = 0
        if value < 2**20:
            raise SeqlmError(f"--memory must be a size of at least 1M, like 1G or 300M; got {self.memory!r}")
        return int(value)

    @property
    def fallback(self) -> tuple[float, float, float]:
        """The three fallback discounts; D_j must lie in (0, j] so no probability goes negative."""
        try:
            d = tuple(float(x) for x in str(self.discount_fallback).replace(",", " ").split())
        except ValueError:
            d = ()
        if len(d) != 3 or not all(0 < dj <= j for j, dj in zip((1, 2, 3), d)):
            got = self.discount_fallback
            raise SeqlmError(f"--discount-fallback must be three numbers D1 D2 D3, 0 < Dj <= j; got {got!r}")
        return d  # type: ignore[return-value]


def estimate_kn(cfg: KNConfig, train: TokenStream, vocab: Vocab) -> NGramModel:
    """Estimate from the encoded training text; `vocab` is the training vocabulary (OOVs already <unk>), or
    one whose words from `vocab.limit` on lie outside a --vocab file (`estimate_limited`).

    A resumed model directory hands back the model's own vocabulary, which ends with <s>: estimation
    is deterministic, so resuming re-estimates from the same text with the training vocabulary.
    """
    if vocab.itos[-1] == BOS and vocab.counts[-1] == 0:  # the model vocabulary: <s> appended, never seen
        print("kn: estimation has no epochs to resume; re-estimating from the training text", file=sys.stderr)
        vocab = Vocab(vocab.itos[:-1], vocab.counts[:-1])
    if train.weights is not None:  # --text-has-weights: counted with the weights, then estimated as count files are
        from seqlm.ngram.from_counts import estimate_counted, weighted_model_counts

        return estimate_counted(cfg, weighted_model_counts(train, vocab, cfg.order, train.weights), vocab)
    if vocab.limit is not None:
        model = estimate_limited(train, vocab, cfg)
    elif not cfg.lmplz:
        model = estimate_smoothed(train, vocab, cfg.order, cfg.spec, cfg.thresholds)
    else:
        model = estimate_model(train, vocab, cfg.order, cfg.fallback, cfg.thresholds, cfg.memory_bytes)
    if cfg.prune_entropy > 0:
        model = prune_entropy(model, cfg.prune_entropy)
    return model


def estimate_limited(train: TokenStream | None, vocab: Vocab, cfg: KNConfig, counts: NGramCounts | None = None
                     ) -> NGramModel:
    """lmplz --limit_vocab_file: every word is counted (its continuation counts and discounts stay), then each
    n-gram holding a word from `vocab.limit` on is pruned as --prune prunes (its mass goes to its context's
    back-off), unigrams too, and the unigram level's uniform share is spread over the words kept. `counts`: the
    n-grams already counted, numbered as below (<s> at `vocab.limit`, the words from there on one higher)."""
    if cfg.memory_bytes is not None:
        raise SeqlmError("--memory: bounded-memory estimation cannot prune by a --vocab file yet; drop --memory "
                         "(or give --unk none, which keeps only the file's words from the start)")
    if not cfg.lmplz:
        raise SeqlmError(f"--vocab: only interpolated modified-kn prunes by a --vocab file (lmplz's "
                         f"--limit_vocab_file), not --smoothing {cfg.smoothing} --form {cfg.form}; give --unk none "
                         "(the file's words as a closed vocabulary) or drop --vocab")
    if BOS in vocab.stoi:
        raise SeqlmError(f"the training text contains {BOS}, which n-gram models reserve; remove it")
    keep = vocab.limit
    V = len(vocab) + 1
    if counts is None:  # <s> goes between the kept words and the others: dropping the others keeps every kept id
        ids = np.asarray(train.ids, dtype=np.int64)
        counts = count_ngrams(TokenStream(ids + (ids >= keep), train.starts), keep, V, cfg.order)
    adjusted = adjust_counts(counts)
    discounts = compute_discounts(adjusted, cfg.fallback)
    marks = _outside_marks(counts, keep, prune_marks(counts, list(cfg.thresholds)))
    initial = initial_probabilities(counts, adjusted, discounts, marks)
    initial.gamma[0] *= (V - 1) / keep  # the uniform share: 1 / keep (the words kept, <s> aside), not 1 / (V - 1)
    log_p, backoffs = interpolate(counts, initial)
    keys, log_p, backoffs = drop_pruned(counts.keys, log_p, backoffs, marks)
    tokens, kept_counts = vocab.itos[:keep] + [BOS], vocab.counts[:keep] + [0]
    kept_counts[vocab.unk_id] += sum(vocab.counts[keep:])  # as a vocabulary's dropped words count as <unk>
    return NGramModel(Vocab(tokens, kept_counts), *_renumbered(keys, log_p, backoffs, V, keep + 1))


def _outside_marks(counts: NGramCounts, bos: int, pruned: list[np.ndarray] | None) -> list[np.ndarray]:
    """(M_k,) bool per order: the n-gram holds a word past <s> (outside the --vocab file) or --prune marks it."""
    outside = [np.arange(counts.vocab_size) > bos]  # (V,) order 1
    for k in range(2, counts.order + 1):
        outside.append(outside[-1][counts.prefix(k)] | outside[0][counts.last_word(k)])  # (M_k,)
    return outside if pruned is None else [a | b for a, b in zip(outside, pruned, strict=True)]


def _renumbered(keys: list[np.ndarray], log_p: list[np.ndarray], backoffs: list[np.ndarray], V: int, kept: int):
    """The tables without the unigrams past id `kept` - 1 and with keys over `kept` words instead of V (no n-gram
    left holds such a word, and the order of keys is kept)."""
    keys = [keys[0][:kept]] + [k // V * kept + k % V for k in keys[1:]]
    return keys, [log_p[0][:kept], *log_p[1:]], ([backoffs[0][:kept], *backoffs[1:]] if backoffs else [])


def save_kn(model: NGramModel, out_dir: Path) -> None:
    """Write out_dir/model.arpa and the binary out_dir/model.bin beside it (each atomically)."""
    model.to_arpa(Path(out_dir) / ARPA)
    write_binary(model, Path(out_dir) / BINARY)
