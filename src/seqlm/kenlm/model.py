"""`kenlm.Model` over seqlm models: n-gram files through seqlm.ngram.NGramQuery, neural model directories
through neural.py's NeuralScorer; both answer the same calls, and this class adds what is kenlm's own
(its errors, float32 sentence sums, `<unk>` not "in" the model).

Every per-word call (BaseScore, BaseFullScore) is bound straight to the scorer's method when the model
is loaded, so a decoder calling it once per word pays no extra Python frame for the wrapper; so are score
and full_scores on an n-gram model where its compiled loops are built (the sentence split and every word
looked up in C, as kenlm's Cython does).
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from seqlm.errors import SeqlmError
from seqlm.ngram.model import NGramModel
from seqlm.ngram.query import FullScoreReturn, NGramQuery, state_attribute  # noqa: F401 (kenlm's name, re-exported)
from seqlm.protocol import Capabilities, TextSpec, require

if TYPE_CHECKING:
    from seqlm.ngram.query import PyState as State


__getattr__ = state_attribute(__name__)  # kenlm.State: seqlm.ngram.query.state_type()


LN10 = math.log(10.0)


class LoadMethod:
    """kenlm's load methods (Config.load_method). seqlm maps binary files lazily whatever is chosen; LAZY also
    leaves out the per-call entry tables (seqlm.ngram.scalar: 24 bytes an n-gram of this process's memory),
    so that processes which each open the model share all of it, at one more cache miss a lookup."""

    LAZY, POPULATE_OR_LAZY, POPULATE_OR_READ, READ, PARALLEL_READ = range(5)


class ARPALoadComplain:
    """kenlm's ARPA warnings setting (Config.arpa_complain); seqlm's reader raises on errors instead."""

    ALL, EXPENSIVE, NONE = range(3)


class Config:
    """kenlm.Config: loading knobs. Accepted for compatibility; none changes a score (LoadMethod.LAZY: memory)."""

    def __init__(self) -> None:
        self.load_method = LoadMethod.POPULATE_OR_READ  # kenlm's default
        self.show_progress = True  # seqlm prints no progress bar while loading
        self.arpa_complain = ARPALoadComplain.ALL


class Model:
    """kenlm.Model on a seqlm model: an ARPA file (.arpa, .arpa.gz, any name), seqlm's binary n-gram file, KenLM's
    own (build_binary, probing or trie: seqlm.ngram.kenlm_binary), or a seqlm model directory of any family
    (neural ones: see seqlm.kenlm.neural for what they support)."""

    def __init__(self, path: str | bytes | os.PathLike, config: Config | None = None):
        self.path = os.path.abspath(os.fsencode(path))  # bytes, as kenlm's
        self.config = config if config is not None else Config()
        lm = _load(path)
        require(lm, words="seqlm.kenlm (kenlm's calls; seqlm.score_text reads any model's text)")
        self._lm = lm
        if isinstance(lm, NGramModel):
            lazy = self.config.load_method == LoadMethod.LAZY  # else the per-call tables where they fit (query.py)
            self._scorer = NGramQuery(lm, entries=False if lazy else None)
        else:
            from seqlm.kenlm.neural import NeuralScorer

            self._scorer = NeuralScorer(lm)
        # beyond kenlm: whether NullContextWrite works (a neural model has only <s> to start from)
        self.has_null_context = isinstance(self._scorer, NGramQuery)
        self.vocab, self.order, self.model = self._scorer.vocab, self._scorer.order, self._scorer.model
        self._stoi, self._unk = self.vocab.stoi, self.vocab.unk_id
        # the per-word calls: the scorer's bound methods themselves, shadowing the methods below
        self.BaseScore, self.BaseFullScore = self._scorer.BaseScore, self._scorer.BaseFullScore
        calls = self._scorer.compiled_sentence_calls() if isinstance(self._scorer, NGramQuery) else None
        if calls is not None:  # and the sentence calls, one compiled call a sentence
            self.score, self.full_scores = calls
        self._distribution = self._ngram_distribution if isinstance(lm, NGramModel) else self._scorer.next_distribution

    def __repr__(self) -> str:
        return f"<Model from {os.path.basename(self.path)!r}>"

    def __reduce__(self):
        return type(self), (self.path, self.config)

    def __contains__(self, word: str) -> bool:
        """True for a word the model knows; False for <unk> itself, as kenlm."""
        return self._stoi.get(word, self._unk) != self._unk

    # ---- whole sentences ------------------------------------------------------------------------

    def full_scores(self, sentence: str | bytes, bos: bool = True, eos: bool = True
                    ) -> Iterator[tuple[float, int, bool]]:
        """(log10 p, n-gram length, OOV) of each word, then of </s> when eos."""
        return self._scorer.full_scores(_split(sentence), bos, eos)

    def score(self, sentence: str | bytes, bos: bool = True, eos: bool = True) -> float:
        """log10 P(sentence), summed in float32 one word after another, exactly as kenlm adds them."""
        return self._scorer.kenlm_score(_split(sentence), bos, eos)

    def perplexity(self, sentence: str | bytes) -> float:
        """10 ** (-log10 P / (words + 1)): </s> counted, as kenlm."""
        return 10.0 ** (-self.score(sentence) / (len(_split(sentence)) + 1))

    # ---- incremental scoring (decoders) ---------------------------------------------------------

    def BeginSentenceWrite(self, state: State) -> None:  # noqa: N802 (kenlm's names)
        """Set `state` to a sentence start (the context is <s>)."""
        self._scorer.BeginSentenceWrite(state)

    def NullContextWrite(self, state: State) -> None:  # noqa: N802
        """Set `state` to no context at all (n-gram models only: a neural model always starts at <s>)."""
        self._scorer.NullContextWrite(state)

    def BaseScore(self, in_state: State, word: str, out_state: State) -> float:  # noqa: N802
        """log10 p(word | in_state); out_state becomes the state after the word."""
        return self._scorer.BaseScore(in_state, word, out_state)

    def BaseFullScore(self, in_state: State, word: str, out_state: State) -> FullScoreReturn:  # noqa: N802
        """BaseScore with the n-gram length matched and the OOV flag."""
        return self._scorer.BaseFullScore(in_state, word, out_state)

    # ---- beyond kenlm ---------------------------------------------------------------------------

    def text_spec(self) -> TextSpec:
        """The loaded model's text conventions (seqlm.protocol.TextSpec): word units, tokenised text."""
        return self._lm.text_spec()

    def capabilities(self) -> Capabilities:
        """What the loaded model can do (seqlm.protocol.Capabilities)."""
        return self._lm.capabilities()

    def next_distribution(self, states: list[State]) -> np.ndarray:
        """(N, V) float64 log10 p(w | state) of every word w of `self.vocab` after each of N states, in
        one batched call: the model's `advance` (seqlm.protocol) on their histories; column w equals
        BaseScore(state, vocab.itos[w]), but <s>'s: -inf."""
        return self._distribution(list(states))

    def _ngram_distribution(self, states: list[State]) -> np.ndarray:
        """An n-gram State holds the ids of its context at each order, which advance's tables take as they
        are; in float64, as kenlm's floats come out of the other calls."""
        ctx = torch.full((len(states), max(self.order - 1, 0)), -1, dtype=torch.long)  # (N, N-1)
        for b, s in enumerate(states):
            ctx[b, : len(s.words)] = torch.tensor(s.words, dtype=torch.long)
        logp = self.model.tensors(torch.device("cpu"), torch.float64).distribution(ctx)  # (N, V) natural logs
        return logp.numpy() / LN10


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
    try:
        return seqlm.load(p) if p.is_dir() else load_tables(p)
    except SeqlmError as e:
        raise OSError(f"Cannot read model '{shown}' ({e})") from e
