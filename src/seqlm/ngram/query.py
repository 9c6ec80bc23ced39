"""The query API KenLM users know, over seqlm's n-gram tables (ARPA semantics, log10 everywhere).

    m = seqlm.NgramModel("runs/kn5")           # model dir (binary used when present), .arpa[.gz], .bin
    m.score("the cat sat", bos=True, eos=True)  # log10 P(the cat sat </s> | <s>)
    list(m.full_scores("the cat sat"))          # [(log10 p, matched n-gram length, is OOV), ...]
    m.perplexity("the cat sat")
    s, t = seqlm.ngram.State(), seqlm.ngram.State()
    m.BeginSentenceWrite(s); m.BaseScore(s, "the", t)   # incremental scoring for decoders
    m.score_corpus(["the cat sat", "a dog"])    # batched numpy path: one lookup per order for all tokens

Sentences (full_scores) and whole corpora (score_corpus) run the compiled per-token walk (scalar.py)
where it could be built; decoder steps (BaseScore), and sentences without it, go through
NGramModel.score_word (Python scalars, one token at a time); corpora without it and the LanguageModel
protocol through NGramModel.walk (one array lookup per order for all tokens). Tests hold them all equal.
A binary model (binary.py) makes each lookup a hash probe instead of a binary search.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.errors import SeqlmError
from seqlm.ngram.model import NGramModel
from seqlm.ngram.scalar import scalar_scorer


@dataclass
class State:
    """What a decoder must remember: `words[k-1]` is the id at order k of the n-gram of the last k
    words (order 1: the last word's id; -1 where not listed), for k up to the longest n-gram matched
    (at most N-1), as NGramModel.score_word keeps it. Two states with equal `words` give identical
    scores from here on, so hypotheses can be recombined.
    """

    words: tuple[int, ...] = field(default_factory=tuple)

    def __hash__(self) -> int:
        return hash(self.words)


@dataclass
class CorpusScores:
    """Per token of a scored corpus (</s> included), in order: log10 p, matched length, OOV flag.

    OOV means "scored as <unk>", a literal <unk> included, as KenLM counts it."""

    log10_prob: np.ndarray  # (N,) float64
    length: np.ndarray  # (N,) int64
    oov: np.ndarray  # (N,) bool
    starts: np.ndarray  # (S+1,) where each sentence's tokens begin

    def perplexity(self, include_oov: bool = True) -> float:
        keep = slice(None) if include_oov else ~self.oov
        return float(10.0 ** (-self.log10_prob[keep].mean()))


def load_tables(path: str | Path) -> NGramModel:
    """A model directory (binary model.bin when present, else its ARPA), a binary file or an ARPA file."""
    from seqlm.models.kn import load_kn, load_ngram_file

    path = Path(path)
    if path.is_dir():
        return load_kn(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: no such model file or directory")
    return load_ngram_file(path)


class NgramModel:
    """KenLM's `kenlm.Model` interface (score, full_scores, perplexity, BeginSentenceWrite, BaseScore)."""

    def __init__(self, model: str | Path | NGramModel):
        self.model = model if isinstance(model, NGramModel) else load_tables(model)
        self.vocab = self.model.vocab
        self.order = self.model.order
        self._compiled = False  # the compiled walk (scalar.py), built on first use; None where it cannot be

    def __repr__(self) -> str:
        return f"NgramModel(order={self.order}, sizes={self.model.sizes})"

    def __contains__(self, word: str) -> bool:
        return word in self.vocab.stoi

    # ---- whole sentences ------------------------------------------------------------------------

    def full_scores(self, sentence: str | list[str], bos: bool = True, eos: bool = True
                    ) -> Iterator[tuple[float, int, bool]]:
        """(log10 p, length of the n-gram matched, is OOV) for each word, then </s> when eos."""
        words = sentence.split() if isinstance(sentence, str) else sentence
        stoi, unk = self.vocab.stoi, self.vocab.unk_id
        context: tuple[int, ...] = (self.vocab.bos_id,) if bos else ()
        ids = [stoi.get(w, unk) for w in words] + ([self.vocab.eos_id] if eos else [])
        if self._scalar() is not None:  # the compiled walk: the same numbers as score_word's
            probs, lengths, _ = self._compiled.walk(context, ids)
            yield from zip(probs, lengths, [w == unk for w in ids], strict=True)
            return
        score = self.model.score_word
        for w in ids:
            logp, length, context = score(context, w)
            yield logp, length, w == unk  # as KenLM: whatever maps to <unk>, a literal <unk> too

    def score(self, sentence: str | list[str], bos: bool = True, eos: bool = True) -> float:
        """log10 probability of the sentence (from <s> when bos, with </s> when eos)."""
        return float(sum(p for p, _, _ in self.full_scores(sentence, bos, eos)))

    def perplexity(self, sentence: str | list[str]) -> float:
        """10 ** (-log10 P / tokens), </s> counted, as kenlm.Model.perplexity."""
        scores = [p for p, _, _ in self.full_scores(sentence)]
        return math.pow(10.0, -sum(scores) / len(scores))

    # ---- incremental scoring (decoders) ---------------------------------------------------------

    def BeginSentenceWrite(self, state: State) -> None:  # noqa: N802 (KenLM's name)
        """Set `state` to a sentence start: the context is <s>."""
        state.words = (self.vocab.bos_id,)

    def NullContextWrite(self, state: State) -> None:  # noqa: N802
        """Set `state` to no context at all (the first word gets its unigram probability)."""
        state.words = ()

    def BaseScore(self, in_state: State, word: str, out_state: State) -> float:  # noqa: N802
        """log10 p(word | in_state); `out_state` becomes the state after it (may be `in_state` itself)."""
        return self.score_id(in_state, self.vocab.id(word), out_state)[0]

    def score_id(self, in_state: State, word_id: int, out_state: State) -> tuple[float, int]:
        """BaseScore on a word id; also returns the matched n-gram length (KenLM's FullScore)."""
        logp, length, out_state.words = self.model.score_word(in_state.words, word_id)
        return logp, length

    def _scalar(self):
        """The compiled per-token walk (scalar.py), built on first use; None where it cannot be."""
        if self._compiled is False:
            self._compiled = scalar_scorer(self.model, self.vocab.stoi, self.vocab.unk_id, compiled_only=True)
        return self._compiled

    # ---- whole corpora --------------------------------------------------------------------------

    def score_corpus(self, sentences: Iterable[str | list[str]] | TokenStream) -> CorpusScores:
        """Every token of every sentence (each from <s>, </s> last) in one vectorised pass."""
        if isinstance(sentences, TokenStream):
            ids = np.asarray(sentences.ids, dtype=np.int64)
            starts = np.asarray(sentences.starts, dtype=np.int64)
            oov = ids == self.vocab.unk_id
        else:
            ids, starts, oov = self._encode(sentences)
        if self._scalar() is not None:
            logp, length = compiled_stream(self._compiled, ids, starts, self.vocab.bos_id)
        else:
            logp, length = score_stream(self.model, ids, starts)
        return CorpusScores(logp, length, oov, starts)

    def _encode(self, sentences: Iterable[str | list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids: list[int] = []
        starts = [0]
        stoi, unk, eos = self.vocab.stoi, self.vocab.unk_id, self.vocab.eos_id
        for s in sentences:
            words = s.split() if isinstance(s, str) else s
            ids += [stoi.get(w, unk) for w in words] + [eos]
            starts.append(len(ids))
        ids_array = np.array(ids, dtype=np.int64)
        return ids_array, np.array(starts, dtype=np.int64), ids_array == unk


def compiled_stream(scorer, ids: np.ndarray, starts: np.ndarray, bos: int) -> tuple[np.ndarray, np.ndarray]:
    """score_stream's numbers from the compiled walk (scalar.py): one pass over the tokens."""
    n = len(ids)
    is_start = np.zeros(n, dtype=bool)  # (N,)
    is_start[starts[:-1][np.diff(starts) > 0]] = True
    logp, length = np.empty(n), np.empty(n, dtype=np.int64)  # (N,)
    scorer.stream(np.ascontiguousarray(ids, dtype=np.int64), is_start, bos, logp, length)
    return logp, length


def score_stream(model: NGramModel, ids: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log10 p and matched length of every token of sentences laid end to end (ids (N,), starts (S+1,)).

    The whole corpus is one row: `<s>` is put before each sentence, so no padding is scored and the
    context of every order comes from the previous position's hit (NGramModel.walk).
    """
    n, lengths = len(ids), np.diff(starts)  # (S,)
    if n == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    inputs = np.empty(n, dtype=np.int64)  # (N,) the word before each target; <s> at sentence starts
    inputs[1:] = ids[:-1]
    first = starts[:-1][lengths > 0]
    inputs[first] = model.vocab.bos_id
    is_start = np.zeros(n, dtype=bool)
    is_start[first] = True
    logp, length = model.walk(inputs[None], is_start[None], ids[None])
    return logp[0], length[0]
