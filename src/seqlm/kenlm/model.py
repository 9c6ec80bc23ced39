"""`kenlm.Model` over seqlm models: the n-gram scorer here, the neural one in neural.py.

Every per-word call (BaseScore, BaseFullScore) is bound straight to the scorer's method when the model
is loaded, so a decoder calling it once per word pays no extra Python frame for the wrapper.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from seqlm.errors import SeqlmError
from seqlm.ngram.model import NGramModel
from seqlm.ngram.scalar import scalar_scorer

KENLM_BINARY_MAGIC = b"mmap lm "  # how KenLM's build_binary files begin (its binary_format.cc)


class FullScoreReturn:
    """What BaseFullScore returns: log10 p, the length of the n-gram matched, whether the word is OOV."""

    __slots__ = ("log_prob", "ngram_length", "oov")

    def __init__(self, log_prob: float, ngram_length: int, oov: bool):
        self.log_prob, self.ngram_length, self.oov = log_prob, ngram_length, oov

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.log_prob!r}, {self.ngram_length!r}, {self.oov!r})"


class State:
    """A decoder's context. `words` is what the scorer keeps: for an n-gram model the trie ids of the
    context (seqlm.ngram.query.State), for a neural model a node of the history (neural.py). Equal
    states give equal scores from here on, so hypotheses can be recombined on them, as with kenlm."""

    __slots__ = ("words",)

    def __init__(self) -> None:
        self.words = ()  # kenlm's fresh State: no context (an n-gram model scores unigrams from it)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, State) and self.words == other.words

    def __hash__(self) -> int:
        return hash(self.words)

    def __copy__(self) -> State:
        s = State()
        s.words = self.words
        return s

    def __deepcopy__(self, memo: dict) -> State:
        return self.__copy__()  # the contents are immutable (a tuple, or a node shared by design)


class LoadMethod:
    """kenlm's load methods (Config.load_method); seqlm maps binary files lazily whatever is chosen."""

    LAZY, POPULATE_OR_LAZY, POPULATE_OR_READ, READ, PARALLEL_READ = range(5)


class ARPALoadComplain:
    """kenlm's ARPA warnings setting (Config.arpa_complain); seqlm's reader raises on errors instead."""

    ALL, EXPENSIVE, NONE = range(3)


class Config:
    """kenlm.Config: loading knobs. Accepted for compatibility; none changes a score."""

    def __init__(self) -> None:
        self.load_method = LoadMethod.POPULATE_OR_READ  # kenlm's default
        self.show_progress = True  # seqlm prints no progress bar while loading
        self.arpa_complain = ARPALoadComplain.ALL


class NgramScorer:
    """The kenlm calls on seqlm's n-gram tables: the walk of NGramModel.score_word, one token per call,
    compiled where it can be (seqlm.ngram.scalar); BaseScore is the compiled method itself."""

    def __init__(self, tables: NGramModel):
        self.tables, self.order, self.vocab = tables, tables.order, tables.vocab
        v = tables.vocab
        self._stoi, self._unk, self._bos, self._eos = v.stoi, v.unk_id, v.bos_id, v.eos_id
        self._scalar = scalar_scorer(tables, self._stoi, self._unk)
        self._score = self._scalar.score  # (context ids, word id) -> (log10 p, length, context after)
        self.BaseScore = self._scalar.base_score  # (in_state, word, out_state) -> log10 p

    def begin(self) -> tuple[int, ...]:
        return (self._bos,)

    def null(self) -> tuple[int, ...]:
        return ()

    def BaseFullScore(self, in_state: State, word: str, out_state: State) -> FullScoreReturn:  # noqa: N802
        w = self._stoi.get(word)
        if w is None:
            w = self._unknown(word)
        logp, length, out_state.words = self._score(in_state.words, w)
        return FullScoreReturn(logp, length, w == self._unk)

    def _unknown(self, word: object) -> int:
        if not isinstance(word, str):
            raise TypeError(f"Argument 'word' has incorrect type (expected str, got {type(word).__name__})")
        return self._unk

    def full_scores(self, words: list[str], bos: bool, eos: bool) -> Iterator[tuple[float, int, bool]]:
        # a literal <unk> is OOV too, as kenlm (its id is 0); </s> never is
        return iter(self._scalar.full_scores((self._bos,) if bos else (), words, self._eos if eos else -1))

    def sentence_score(self, words: list[str], bos: bool, eos: bool) -> float:
        return self._scalar.sentence_score((self._bos,) if bos else (), words, self._eos if eos else -1)

    def next_distribution(self, states: list[State]) -> np.ndarray:
        from seqlm.eval.distribution import ngram_state_distribution

        return ngram_state_distribution(self.tables, [s.words for s in states])


class Model:
    """kenlm.Model on a seqlm model: an ARPA file (.arpa, .arpa.gz, any name), seqlm's binary n-gram file,
    or a seqlm model directory of any family (neural ones: see seqlm.kenlm.neural for what they support)."""

    def __init__(self, path: str | bytes | os.PathLike, config: Config | None = None):
        self.path = os.path.abspath(os.fsencode(path))  # bytes, as kenlm's
        self.config = config if config is not None else Config()
        lm = _load(path)
        if isinstance(lm, NGramModel):
            self._scorer = NgramScorer(lm)
        else:
            from seqlm.kenlm.neural import NeuralScorer

            self._scorer = NeuralScorer(lm)
        self.vocab, self.order = self._scorer.vocab, self._scorer.order
        self._stoi, self._unk = self.vocab.stoi, self.vocab.unk_id
        # the per-word calls: the scorer's bound methods themselves, shadowing the methods below
        self.BaseScore, self.BaseFullScore = self._scorer.BaseScore, self._scorer.BaseFullScore

    def __repr__(self) -> str:
        return f"<Model from {os.path.basename(self.path)!r}>"

    def __reduce__(self):
        return type(self), (self.path,)

    def __contains__(self, word: str) -> bool:
        """True for a word the model knows; False for <unk> itself, as kenlm."""
        return self._stoi.get(word, self._unk) != self._unk

    @property
    def model(self):
        """The seqlm model underneath (an NGramModel, or a LanguageModel of any family)."""
        return self._scorer.tables if isinstance(self._scorer, NgramScorer) else self._scorer.model

    # ---- whole sentences ------------------------------------------------------------------------

    def full_scores(self, sentence: str | bytes, bos: bool = True, eos: bool = True
                    ) -> Iterator[tuple[float, int, bool]]:
        """(log10 p, n-gram length, OOV) of each word, then of </s> when eos."""
        return self._scorer.full_scores(_split(sentence), bos, eos)

    def score(self, sentence: str | bytes, bos: bool = True, eos: bool = True) -> float:
        """log10 P(sentence), summed in float32 one word after another, exactly as kenlm adds them."""
        if isinstance(self._scorer, NgramScorer):  # the same sum in one compiled call (seqlm.ngram.scalar)
            return self._scorer.sentence_score(_split(sentence), bos, eos)
        probs = np.array([p for p, _, _ in self.full_scores(sentence, bos, eos)], dtype=np.float32)
        return float(np.cumsum(probs, dtype=np.float32)[-1]) if len(probs) else 0.0

    def perplexity(self, sentence: str | bytes) -> float:
        """10 ** (-log10 P / (words + 1)): </s> counted, as kenlm."""
        return 10.0 ** (-self.score(sentence) / (len(_split(sentence)) + 1))

    # ---- incremental scoring (decoders) ---------------------------------------------------------

    def BeginSentenceWrite(self, state: State) -> None:  # noqa: N802 (kenlm's names)
        """Set `state` to a sentence start (the context is <s>)."""
        state.words = self._scorer.begin()

    def NullContextWrite(self, state: State) -> None:  # noqa: N802
        """Set `state` to no context at all (n-gram models only: a neural model always starts at <s>)."""
        state.words = self._scorer.null()

    def BaseScore(self, in_state: State, word: str, out_state: State) -> float:  # noqa: N802
        """log10 p(word | in_state); out_state becomes the state after the word."""
        return self._scorer.BaseScore(in_state, word, out_state)

    def BaseFullScore(self, in_state: State, word: str, out_state: State) -> FullScoreReturn:  # noqa: N802
        """BaseScore with the n-gram length matched and the OOV flag."""
        return self._scorer.BaseFullScore(in_state, word, out_state)

    # ---- beyond kenlm ---------------------------------------------------------------------------

    def next_distribution(self, states: list[State]) -> np.ndarray:
        """(N, V) float64 log10 p(w | state) of every word w of `self.vocab` after each of N states, in
        one batched call (vectorised for n-grams); column w equals BaseScore(state, vocab.itos[w])."""
        return self._scorer.next_distribution(list(states))


class LanguageModel(Model):
    """kenlm's backwards-compatibility name for Model."""


def _split(sentence: str | bytes) -> list[str]:
    if isinstance(sentence, bytes):
        sentence = sentence.decode("utf-8")
    if not isinstance(sentence, str):
        raise TypeError(f"Cannot convert {type(sentence)} to string")
    return sentence.split()


def _load(path: str | bytes | os.PathLike):
    """The seqlm model at `path`; failures raise OSError("Cannot read model 'PATH' (why)"), as kenlm."""
    import seqlm
    from seqlm.ngram.query import load_tables

    shown = os.fsdecode(path)
    p = Path(shown)
    if not p.exists():
        raise OSError(f"Cannot read model '{shown}' ({os.strerror(errno.ENOENT)} while opening {p.absolute()})")
    if p.is_file() and _starts_with(p, KENLM_BINARY_MAGIC):
        raise OSError(f"Cannot read model '{shown}' (a KenLM binary file (build_binary); seqlm reads ARPA files and "
                      "its own binary format: give the ARPA file, or `seqlm convert` it to a seqlm binary)")
    try:
        return seqlm.load(p) if p.is_dir() else load_tables(p)
    except SeqlmError as e:
        raise OSError(f"Cannot read model '{shown}' ({e})") from e


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False
