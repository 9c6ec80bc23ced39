"""The query API KenLM users know, over seqlm's n-gram tables (ARPA semantics, log10 everywhere).

    m = seqlm.NGramQuery("runs/kn5")           # model dir (binary used when present), .arpa[.gz], .bin
    m.score("the cat sat", bos=True, eos=True)  # log10 P(the cat sat </s> | <s>)
    list(m.full_scores("the cat sat"))          # [(log10 p, matched n-gram length, is OOV), ...]
    m.perplexity("the cat sat")
    s, t = seqlm.ngram.State(), seqlm.ngram.State()
    m.BeginSentenceWrite(s); m.BaseScore(s, "the", t)   # incremental scoring for decoders
    m.score_corpus(["the cat sat", "a dog"])    # batched numpy path: one lookup per order for all tokens

Decoder steps (BaseScore, BaseFullScore), sentences (full_scores) and whole corpora (score_corpus) run the
compiled per-token walk (scalar.py) where it could be built; without it, NGramModel.score_word (Python
scalars, one token at a time) serves the steps and sentences, and NGramModel.walk (one array lookup per
order for all tokens, also the LanguageModel protocol's path) the corpora. Tests hold them all equal.
A binary model (binary.py) makes each lookup a hash probe instead of a binary search. Missing suffixes of
listed n-grams are added as KenLM adds them (with_suffix_blanks), so reported lengths are kenlm's. seqlm.kenlm.Model
is this class for n-gram files, with the kenlm module's own float32 sentence sums on top.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.ngram.arpa import ArpaData
from seqlm.ngram.files import load_tables
from seqlm.ngram.model import NGramModel
from seqlm.ngram.native import extension
from seqlm.ngram.scalar import scalar_scorer


class PyState:
    """What a decoder must remember: for an n-gram model `words[k-1]` is the id at order k of the n-gram of
    the last k words (order 1: the last word's id; -1 where not listed), for k up to the longest n-gram
    matched (at most N-1), as NGramModel.score_word keeps it; for a neural model (seqlm.kenlm.neural) a
    node of the history. Two states with equal `words` give identical scores from here on, so hypotheses
    can be recombined, as with kenlm.

    `State` (`seqlm.kenlm.State`, `seqlm.ngram.State`) is _state.cpp's twin of this class where the compiled
    n-gram loops are built: the same attribute and behaviour, its ids held in the object, so that BaseScore
    makes no Python object per call. This class is what runs without them.
    """

    __slots__ = ("words",)

    def __init__(self, words: tuple[int, ...] = ()):
        self.words = words  # kenlm's fresh State: no context (an n-gram model scores unigrams from it)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PyState) and self.words == other.words

    def __hash__(self) -> int:
        return hash(self.words)

    def __repr__(self) -> str:
        return f"State(words={self.words!r})"

    def __copy__(self) -> PyState:
        return PyState(self.words)

    def __deepcopy__(self, memo: dict) -> PyState:
        return self.__copy__()  # the contents are immutable (a tuple, or a node shared by design)


if TYPE_CHECKING:
    State = PyState


def state_type() -> type:
    """The State class decoders use: the compiled one (_state.cpp), or PyState where it is not built."""
    ext = extension()
    return ext.State if ext is not None else PyState


def state_attribute(module: str) -> Callable[[str], type]:
    """The module `__getattr__` of a module that exports `State`: state_type(), chosen on first use, so that
    importing seqlm builds nothing."""

    def __getattr__(name: str) -> type:  # noqa: N807 (a module's __getattr__)
        if name == "State":
            return state_type()
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


__getattr__ = state_attribute(__name__)


class FullScoreReturn:
    """What BaseFullScore returns: log10 p, the length of the n-gram matched, whether the word is OOV."""

    __slots__ = ("log_prob", "ngram_length", "oov")

    def __init__(self, log_prob: float, ngram_length: int, oov: bool):
        self.log_prob, self.ngram_length, self.oov = log_prob, ngram_length, oov

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.log_prob!r}, {self.ngram_length!r}, {self.oov!r})"


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


def with_suffix_blanks(model: NGramModel) -> NGramModel:
    """`model` with every suffix of every n-gram listed: the tables KenLM queries.

    KenLM's probing model finds p(w | context) by extending the n-gram leftwards from w, one context word
    at a time, and reports the length of the last entry it found (lm/model.cc ResumeScore). So that every
    listed n-gram can be reached that way, it lists each missing suffix when loading, as a "blank": back-off
    0, log10 p the back-off estimate (lm/search_hashed.cc FindLower, AdjustLower). With "a b c" listed and
    "b c" not, kenlm scores "c" after "b" from the blank: length 2, where the plain tables match only "c".
    seqlm's tables are keyed by prefix, so from_grams adds missing prefixes; this adds the missing suffixes
    too. No probability changes (a blank holds the estimate it stands for): the lengths reported become
    KenLM's, and with them the states (which keep the words of the n-gram matched). A model that lacks no
    suffix (an unpruned Kneser-Ney one, say) comes back as it is, after one vectorised lookup per n-gram of
    order 3 and above (about half a second for 2.4 million n-grams, a binary model's load ~0.1 s).
    """
    if _suffixes_listed(model):
        return model
    n = model.order
    grams = [model.words_of(k, np.arange(len(model.keys[k - 1]))) for k in range(1, n + 1)]  # (M_k, k)
    added = [np.zeros((0, k), dtype=np.int64) for k in range(1, n + 1)]  # (B_k, k) the blanks per order
    for k in range(n, 2, -1):  # longest first: a blank's own suffixes may be missing too
        suffixes = np.unique(np.concatenate([grams[k - 1], added[k - 1]])[:, 1:], axis=0)  # (m, k-1)
        added[k - 2] = suffixes[_row_ids(model, suffixes) < 0]
    nan, zero = np.float32(np.nan), np.float32(0.0)  # from_grams fills a NaN probability with the estimate
    # (zip, not strict, stops the back-offs at order N-1, which is the last that has them)
    return NGramModel.from_grams(ArpaData(
        list(model.vocab.itos),
        [np.concatenate([g, b]) for g, b in zip(grams, added, strict=True)],
        [np.concatenate([p, np.full(len(b), nan)]) for p, b in zip(model.log10_prob, added, strict=True)],
        [np.concatenate([o, np.full(len(b), zero)]) for o, b in zip(model.log10_backoff, added, strict=False)],

    ))


def _suffixes_listed(model: NGramModel) -> bool:
    """Whether the suffix of every n-gram (its last k-1 words) is listed, orders ascending: the suffix of
    an order-k n-gram is its prefix's suffix extended by its last word."""
    if model.order < 3:
        return True  # a bigram's suffix is a unigram, always listed
    V = len(model.vocab)
    suffix = model.keys[1] % V  # (M_2,) each bigram's suffix: its word (the id at order 1)
    for k in range(3, model.order + 1):
        keys = model.keys[k - 1]
        suffix = model.find(k - 1, suffix[keys // V], keys % V)  # (M_k,) id at order k-1; -1: not listed
        if (suffix < 0).any():
            return False
    return True


def _row_ids(model: NGramModel, rows: np.ndarray) -> np.ndarray:
    """(m,) the id of each (m, k) row of word ids at order k; -1 where it is not listed."""
    ids = rows[:, 0]
    for j in range(2, rows.shape[1] + 1):
        ids = model.find(j, ids, rows[:, j - 1])
    return ids


ENTRY_BYTES = 24  # an n-gram's share of the compiled scorer's entry tables (scalar.scalar_scorer)
ENTRIES_AUTO_MAX = 2 << 30  # entries=None builds them up to this size: a 100M-token KN5 (184M n-grams) took
# 30 s and 8.9 GB to load with them (4.4 GB of tables), 19 s and 4.3 GB without (docs/scaling.md)


def entries_by_default(model: NGramModel) -> bool:
    """Whether the compiled scorer builds its per-call entry tables when not told: when they take at most
    ENTRIES_AUTO_MAX bytes of this process (GCIDE KN5: 190 MB), so that a big model loads without copying its
    tables and stays shared between processes; entries=True builds them at any size."""
    return ENTRY_BYTES * sum(model.sizes[1:]) <= ENTRIES_AUTO_MAX


class NGramQuery:
    """The queries over an NGramModel's tables: KenLM's `kenlm.Model` interface (score, full_scores,
    perplexity, BeginSentenceWrite, BaseScore, BaseFullScore), a batched `score_corpus` and the whole
    next-word distribution (`next_distribution`). NGramModel is the model (tables, estimation, ARPA, the
    LanguageModel protocol); this is how a decoder or a KenLM user asks it things."""

    def __init__(self, model: str | Path | NGramModel, entries: bool | None = None):
        # KenLM's tables (blanks added where a suffix is missing), so that matched lengths are kenlm's
        self.model = with_suffix_blanks(model if isinstance(model, NGramModel) else load_tables(model))
        entries = entries_by_default(self.model) if entries is None else entries
        self.vocab = self.model.vocab
        self.order = self.model.order
        v = self.vocab
        self._stoi, self._unk, self._bos, self._eos = v.stoi, v.unk_id, v.bos_id, v.eos_id
        # compiled (its tables list every suffix: with_suffix_blanks), or on score_word
        self._scalar = scalar_scorer(self.model, v.stoi, v.unk_id, v.bos_id, v.eos_id, closed=True, entries=entries)
        self._compiled = extension() is not None
        self._entries = entries
        # the per-word call is the scorer's own method: a decoder pays no wrapper frame per word
        self.BaseScore = self._scalar.base_score

    def __repr__(self) -> str:
        return f"NGramQuery(order={self.order}, sizes={self.model.sizes})"

    def entry_bytes(self) -> int:
        """Memory of this process the compiled scorer's entry tables hold (scalar.scalar_scorer); 0 without."""
        return self._scalar.entry_bytes() if self._compiled else 0

    def compiled_sentence_calls(self) -> tuple[Callable, Callable] | None:
        """kenlm.Model's score and full_scores, (sentence: str or UTF-8 bytes, bos=True, eos=True) each, as one
        compiled call a sentence (split, looked up, walked, summed in float32 as kenlm); None without them."""
        return (self._scalar.kenlm_score, self._scalar.kenlm_full_scores) if self._compiled else None

    def __reduce__(self):
        return type(self), (self.model, self._entries)  # the compiled scorer is rebuilt; a mapped model maps again

    def __contains__(self, word: str) -> bool:
        return word in self._stoi

    # ---- whole sentences ------------------------------------------------------------------------

    def full_scores(self, sentence: str | list[str], bos: bool = True, eos: bool = True
                    ) -> Iterator[tuple[float, int, bool]]:
        """(log10 p, length of the n-gram matched, is OOV) for each word, then </s> when eos. OOV: whatever
        maps to <unk>, a literal <unk> too, as KenLM."""
        words = sentence.split() if isinstance(sentence, str) else sentence
        return iter(self._scalar.full_scores((self._bos,) if bos else (), words, self._eos if eos else -1))

    def score(self, sentence: str | list[str], bos: bool = True, eos: bool = True) -> float:
        """log10 probability of the sentence (from <s> when bos, with </s> when eos)."""
        return float(sum(p for p, _, _ in self.full_scores(sentence, bos, eos)))

    def kenlm_score(self, words: list[str], bos: bool, eos: bool) -> float:
        """`score` summed in float32 word after word, bit for bit as the kenlm module adds (seqlm.kenlm)."""
        return self._scalar.sentence_score((self._bos,) if bos else (), words, self._eos if eos else -1)

    def perplexity(self, sentence: str | list[str]) -> float:
        """10 ** (-log10 P / tokens), </s> counted, as kenlm.Model.perplexity."""
        scores = [p for p, _, _ in self.full_scores(sentence)]
        return math.pow(10.0, -sum(scores) / len(scores))

    # ---- incremental scoring (decoders) ---------------------------------------------------------

    def BeginSentenceWrite(self, state: State) -> None:  # noqa: N802 (KenLM's name)
        """Set `state` to a sentence start: the context is <s>."""
        state.words = (self._bos,)

    def NullContextWrite(self, state: State) -> None:  # noqa: N802
        """Set `state` to no context at all (the first word gets its unigram probability)."""
        state.words = ()

    def BaseScore(self, in_state: State, word: str, out_state: State) -> float:  # noqa: N802
        """log10 p(word | in_state); `out_state` becomes the state after it (may be `in_state` itself).
        (Replaced in __init__ by the scorer's own method, which does exactly this.)"""
        return self._scalar.base_score(in_state, word, out_state)

    def BaseFullScore(self, in_state: State, word: str, out_state: State) -> FullScoreReturn:  # noqa: N802
        """BaseScore with the length of the n-gram matched and the OOV flag."""
        w = self._stoi.get(word)
        if w is None:
            if not isinstance(word, str):
                raise TypeError(f"Argument 'word' has incorrect type (expected str, got {type(word).__name__})")
            w = self._unk
        logp, length, out_state.words = self._scalar.score(in_state.words, w)
        return FullScoreReturn(logp, length, w == self._unk)

    def next_distribution(self, states: list[State]) -> np.ndarray:
        """(N, V) float64 log10 p(w | state) of every word after each state, vectorised (no loop over words);
        column w equals BaseScore(state, vocab.itos[w]), but <s>'s: -inf."""
        # a state holds the ids the walk needs (State.words), so the contexts need no lookup
        ctx = np.full((len(states), max(self.order - 1, 0)), -1, dtype=np.int64)  # (B, N-1)
        for b, s in enumerate(states):
            ctx[b, : len(s.words)] = s.words
        logp = self.model.log10_distribution_after(ctx)  # (B, V)
        logp[:, self._bos] = -np.inf  # <s> is context only: each row sums to 1 over the words that can follow
        return logp

    # ---- whole corpora --------------------------------------------------------------------------

    def score_corpus(self, sentences: Iterable[str | list[str]] | TokenStream) -> CorpusScores:
        """Every token of every sentence (each from <s>, </s> last) in one vectorised pass."""
        if isinstance(sentences, TokenStream):
            ids = np.asarray(sentences.ids, dtype=np.int64)
            starts = np.asarray(sentences.starts, dtype=np.int64)
            oov = ids == self.vocab.unk_id
        else:
            ids, starts, oov = self._encode(sentences)
        if self._compiled:  # the compiled walk; without it the numpy walk beats Python scalars on corpora
            logp, length = compiled_stream(self._scalar, ids, starts, self.vocab.bos_id)
        else:
            logp, length = score_stream(self.model, ids, starts)
        return CorpusScores(logp, length, oov, starts)

    def _encode(self, sentences: Iterable[str | list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sentences = sentences if isinstance(sentences, list) else list(sentences)
        stoi, unk, eos = self.vocab.stoi, self.vocab.unk_id, self.vocab.eos_id
        if self._compiled:  # split and looked up in C (_kenlm_calls.cpp, as kenlm_score splits), if all are str
            try:  # (asking first, with a Python pass over the list, cost a tenth of the whole call)
                ids_bytes, starts_bytes = self._scalar.encode(sentences)
            except TypeError:  # word lists among them
                pass
            else:
                ids_array = np.frombuffer(ids_bytes, dtype=np.int64)  # (N,)
                return ids_array, np.frombuffer(starts_bytes, dtype=np.int64), ids_array == unk
        ids: list[int] = []
        starts = [0]
        for s in sentences:
            words = s.split() if isinstance(s, str) else s
            ids += [stoi.get(w, unk) for w in words] + [eos]
            starts.append(len(ids))
        ids_array = np.array(ids, dtype=np.int64)
        return ids_array, np.array(starts, dtype=np.int64), ids_array == unk


def compiled_stream(scorer, ids: np.ndarray, starts: np.ndarray, bos: int) -> tuple[np.ndarray, np.ndarray]:
    """score_stream's numbers from the compiled walk (scalar.py): one pass over the tokens."""
    n = len(ids)
    logp, length = np.empty(n), np.empty(n, dtype=np.int64)  # (N,)
    scorer.stream(np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(starts, dtype=np.int64), bos,
                  logp, length)
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
