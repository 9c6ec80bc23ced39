"""One token at a time over an NGramModel: the per-call path of kenlm.Model.BaseScore and full_scores.

NGramModel.score_word is the reference walk. When a decoder calls once per word, the interpreter's
steps are the whole cost (docs/ngram.md, "Where the time goes"), so `scalar_scorer` returns the same
walk compiled (_native.cpp's Scorer, see native.py), over tables in the machine's native format with a
hash slot table for every order (an order parsed from ARPA gets one built here, index.py). Where that
cannot be built, or SEQLM_NATIVE=0, ScalarScorer gives the same calls on score_word itself.
"""

from __future__ import annotations

import numpy as np

from seqlm.ngram.index import build_slots, table_bits
from seqlm.ngram.model import NGramModel
from seqlm.ngram.native import extension


def _native(a, dtype: str) -> np.ndarray:
    """`a` as a contiguous array of `dtype` in the machine's byte order (no copy when it already is)."""
    return np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("="))


def tables(model: NGramModel) -> tuple[np.ndarray, list[tuple]]:
    """The unigram log10 p (V,) and, per order k + 1 >= 2: keys, log10 p, order k's back-off, the hash
    slots, their item size and the table bits (index.py)."""
    orders = []
    for k in range(1, model.order):
        slots = np.asarray(model.index[k] if model.index[k] is not None else build_slots(model.keys[k]))
        slots = _native(slots, slots.dtype.str)
        orders.append((_native(model.keys[k], "i8"), _native(model.log10_prob[k], "f4"),
                       _native(model.log10_backoff[k - 1], "f4"), slots, slots.itemsize,
                       table_bits(len(model.keys[k]))))
    return _native(model.log10_prob[0], "f4"), orders


def scalar_scorer(model: NGramModel, stoi: dict[str, int], unk: int, bos: int = -1, eos: int = -1,
                  closed: bool = False, entries: bool = True, compiled_only: bool = False):
    """The compiled scorer when it can be built, else ScalarScorer (None if compiled_only): both have
    score, walk, full_scores, sentence_score, stream and base_score; the compiled one also kenlm_score and
    kenlm_full_scores (kenlm.Model's calls on a sentence), given the ids of <s> and </s>.

    `closed`: the model lists every suffix of every n-gram (query.with_suffix_blanks), so the compiled walk
    stops at the first order that misses, as KenLM's does (otherwise it probes every order). `entries`: the
    compiled scorer copies every order into an entry table (key, id and log10 p side by side: one cache miss a
    probe where the model's slot table costs two; 24 bytes an n-gram of this process's memory, as KenLM's
    probing tables, plus a copy of the back-offs, in huge pages where the kernel gives them); without, it
    probes the model's own tables only (mapped from a binary file: shared between processes)."""
    ext = extension()
    if ext is None and compiled_only:
        return None
    if ext is not None:
        return ext.Scorer(len(model.vocab), model.order - 1, *tables(model), stoi, unk, bos, eos, closed, entries)
    return ScalarScorer(model, stoi, unk)


class ScalarScorer:
    """The compiled scorer's calls in Python, on NGramModel.score_word (where _native.cpp cannot be built)."""

    def __init__(self, model: NGramModel, stoi: dict[str, int], unk: int):
        self.stoi, self.unk = stoi, unk
        self.score = model.score_word  # (context, word) -> (log10 p, matched length, context after)

    def walk(self, context: tuple[int, ...], ids: list[int]) -> tuple[list[float], list[int], tuple[int, ...]]:
        """`score` along ids: their log10 p, their matched lengths, and the context after the last."""
        probs, lengths = [], []
        for w in ids:
            logp, length, context = self.score(context, w)
            probs.append(logp)
            lengths.append(length)
        return probs, lengths, context

    def full_scores(self, context: tuple[int, ...], words: list[str], eos: int) -> list[tuple[float, int, bool]]:
        """(log10 p, length, OOV) of each word (unknown ones, and a literal <unk>, are OOV), then of </s>
        when eos >= 0 (its id)."""
        ids = [self.stoi.get(w, self.unk) for w in words]
        probs, lengths, _ = self.walk(context, ids + [eos] * (eos >= 0))
        return list(zip(probs, lengths, [w == self.unk for w in ids] + [False] * (eos >= 0), strict=True))

    def sentence_score(self, context: tuple[int, ...], words: list[str], eos: int) -> float:
        """log10 P of the words (then </s> when eos >= 0) as kenlm sums it: float32, word after word."""
        probs = np.array([p for p, _, _ in self.full_scores(context, words, eos)], dtype=np.float32)
        return float(np.cumsum(probs, dtype=np.float32)[-1]) if len(probs) else 0.0

    def stream(self, ids: np.ndarray, starts: np.ndarray, bos: int, logp: np.ndarray, length: np.ndarray) -> None:
        """Score sentences laid end to end (ids (N,) int64; sentence i is ids[starts[i] : starts[i + 1]]), the
        context reset to <s> where one begins, into logp (N,) float64 and length (N,) int64."""
        starts = np.asarray(starts, dtype=np.int64)  # (S + 1,)
        if np.any(np.diff(starts) < 0) or (len(starts) and (starts[0] < 0 or starts[-1] > len(ids))):
            raise ValueError("stream: sentence starts out of order or range")
        begins = set(starts[:-1][np.diff(starts) > 0].tolist())
        context: tuple[int, ...] = ()
        for t, w in enumerate(ids.tolist()):
            logp[t], length[t], context = self.score((bos,) if t in begins else context, w)

    def base_score(self, in_state, word: str, out_state) -> float:
        """kenlm's BaseScore: log10 p(word | in_state.words); out_state.words becomes the context after it."""
        w = self.stoi.get(word)
        if w is None:
            if not isinstance(word, str):
                raise TypeError(f"Argument 'word' has incorrect type (expected str, got {type(word).__name__})")
            w = self.unk
        logp, _, out_state.words = self.score(in_state.words, w)
        return logp
