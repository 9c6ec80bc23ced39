"""Any seqlm model as the language model of pyctcdecode's CTC beam search (`pip install 'seqlm[ctc]'`).

    from seqlm.kenlm.ctc import build_ctcdecoder
    decoder = build_ctcdecoder(labels, "runs/lstm", alpha=0.5, beta=1.5)   # or an ARPA file, a KN dir
    text = decoder.decode(logits)                                          # logits (frames, len(labels))

`SeqlmLanguageModel` implements pyctcdecode's AbstractLanguageModel as its kenlm-backed LanguageModel
does: a finished word scores alpha * ln p(word | history) + beta, plus `unk_score_offset` when the word
is not among the unigrams (or unknown to the model); a word still being spelled scores
`unk_score_offset` (longer than AVG_TOKEN_LEN characters: scaled by length) unless some unigram starts
with it; the last word of a beam also gets ln p(</s>) when `score_boundary`. Without `score_boundary` the
first word is scored from no context (kenlm's NullContextWrite) and no </s> is added; a neural model has
no null context (seqlm.kenlm.neural), so it starts from <s> all the same and only leaves out the </s>.

States are seqlm.kenlm States: pyctcdecode caches them per beam prefix, and a neural model steps all newly
ended words of the beam together when the next frame first needs one (seqlm.kenlm.neural), so W beams cost
about one batched step of W rows per word. pyctcdecode releases after 0.5.0 (its main branch) pass states
around as `AbstractLMState`s and ask each for a picklable copy (`get_mp_safe_state`) when decoding in batch;
where the installed release has that class the States go out wrapped in SeqlmLMState, found by looking for
the class, not by version number.

`build_ctcdecoder` returns a SeqlmDecoderCTC: pyctcdecode's decoder keeps its language model in a class-level
table that only a forked worker inherits, so pyctcdecode decodes a batch given a spawn pool one utterance after
another in the calling process (0.5.0 warns and does so). Pickled, a SeqlmDecoderCTC carries its language model
(a seqlm.kenlm.Model pickles as its path), which a worker that lacks it loads once, so `decode_batch` and
`decode_beams_batch` run in the pool's workers whatever their start method: fork, spawn or forkserver.
"""

from __future__ import annotations

import functools
import inspect
import math
import pickle
from bisect import bisect_left
from collections.abc import Collection
from typing import Any

from seqlm.errors import SeqlmError
from seqlm.kenlm.model import Model, State

try:
    from pyctcdecode.alphabet import Alphabet
    from pyctcdecode.constants import (
        AVG_TOKEN_LEN,
        DEFAULT_ALPHA,
        DEFAULT_BETA,
        DEFAULT_SCORE_LM_BOUNDARY,
        DEFAULT_UNK_LOGP_OFFSET,
    )
    from pyctcdecode.decoder import BeamSearchDecoderCTC
    from pyctcdecode.language_model import AbstractLanguageModel
except ImportError:  # pragma: no cover - depends on the environment
    raise SeqlmError("seqlm.kenlm.ctc needs pyctcdecode: pip install 'seqlm[ctc]' (or pip install pyctcdecode)"
                     ) from None
try:
    from pyctcdecode.language_model import AbstractLMState
except ImportError:  # 0.5.0 and before: the decoder hands the language model's own states back to it
    AbstractLMState = None

LN10 = math.log(10.0)
UNBOUNDED_ORDER = 1_000_000  # what `order` says for a model with an unbounded history (prune_history keeps all)


if AbstractLMState is not None:

    class SeqlmLMState(AbstractLMState):
        """A seqlm.kenlm State as pyctcdecode's AbstractLMState (releases that have that class)."""

        def __init__(self, state: State):
            self._state = state

        @property
        def state(self) -> State:
            return self._state

        def get_mp_safe_state(self) -> SeqlmLMState | None:
            """A copy that survives pickling to another process: an n-gram state is a few ids, valid for the
            same model file anywhere; a neural one is a node of this process's history tree, so None, as
            pyctcdecode's own kenlm states give."""
            return SeqlmLMState(State(self._state.words)) if isinstance(self._state.words, tuple) else None

        def __eq__(self, other: object) -> bool:
            return isinstance(other, SeqlmLMState) and self._state == other._state

        def __hash__(self) -> int:
            return hash(self._state)

        def __repr__(self) -> str:
            return f"SeqlmLMState({self._state!r})"

    def _wrap(state: State) -> SeqlmLMState:
        return SeqlmLMState(state)

    def _unwrap(state: SeqlmLMState | State) -> State:
        return state.state if isinstance(state, SeqlmLMState) else state  # a caller's own start state may be bare

else:

    def _wrap(state: State) -> State:
        return state

    def _unwrap(state: State) -> State:
        return state


class SeqlmLanguageModel(AbstractLanguageModel):
    """pyctcdecode's language model interface over a seqlm model (a path, or a seqlm.kenlm.Model)."""

    def __init__(self, model: str | Model, unigrams: Collection[str] | None = None, alpha: float = DEFAULT_ALPHA,
                 beta: float = DEFAULT_BETA, unk_score_offset: float = DEFAULT_UNK_LOGP_OFFSET,
                 score_boundary: bool = DEFAULT_SCORE_LM_BOUNDARY):
        self.model = model if isinstance(model, Model) else Model(model)
        # as pyctcdecode: only unigrams the model knows count; without any, every partial word is penalised
        self._unigram_set = {w for w in unigrams if w in self.model} if unigrams is not None else set()
        self._prefixes = sorted(self._unigram_set) if unigrams is not None else None  # bisect stands in for a trie
        self.alpha, self.beta = alpha, beta
        self.unk_score_offset, self.score_boundary = unk_score_offset, score_boundary

    @property
    def order(self) -> int:
        return self.model.order or UNBOUNDED_ORDER

    def get_start_state(self):
        """A sentence start (score_boundary), else no context, or <s> for a model that has none (neural)."""
        state = State()
        if self.score_boundary or not self.model.has_null_context:
            self.model.BeginSentenceWrite(state)
        else:
            self.model.NullContextWrite(state)
        return _wrap(state)

    def _is_prefix(self, partial: str) -> bool:
        """Whether some unigram starts with `partial`."""
        i = bisect_left(self._prefixes, partial)
        return i < len(self._prefixes) and self._prefixes[i].startswith(partial)

    def score_partial_token(self, partial_token: str) -> float:
        is_oov = self._prefixes is None or not self._is_prefix(partial_token)
        score = self.unk_score_offset * is_oov
        if len(partial_token) > AVG_TOKEN_LEN:  # longer than a typical word: penalised in proportion
            score = score * len(partial_token) / AVG_TOKEN_LEN
        return score

    def score(self, prev_state, word: str, is_last_word: bool = False) -> tuple[float, Any]:
        """(alpha * ln p(word | prev_state) + beta with pyctcdecode's offsets, the state after the word);
        states are seqlm States, or SeqlmLMStates where pyctcdecode has AbstractLMState."""
        end_state = State()
        lm_score = self.model.BaseScore(_unwrap(prev_state), word, end_state)
        if (self._unigram_set and word not in self._unigram_set) or word not in self.model:
            lm_score += self.unk_score_offset
        if is_last_word and self.score_boundary:  # end_state itself stays extensible
            lm_score += self.model.BaseScore(end_state, "</s>", State())
        return self.alpha * lm_score * LN10 + self.beta, _wrap(end_state)

    def reset_params(self, **params: Any) -> None:
        """Change alpha, beta, unk_score_offset or score_boundary in place (type-checked, as pyctcdecode)."""
        kinds = {"alpha": float, "beta": float, "unk_score_offset": float, "score_boundary": bool}
        for name, value in params.items():
            if name not in kinds:
                raise ValueError(f"unknown parameter {name!r}; choose from {', '.join(kinds)}")
            if value is not None:
                if not isinstance(value, kinds[name]):
                    raise ValueError(f"{name} must be a {kinds[name].__name__}. Got {type(value)}.")
                setattr(self, name, value)


def build_ctcdecoder(labels: list[str], model: str | Model, unigrams: Collection[str] | None = None,
                     alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA,
                     unk_score_offset: float = DEFAULT_UNK_LOGP_OFFSET,
                     lm_score_boundary: bool = DEFAULT_SCORE_LM_BOUNDARY) -> BeamSearchDecoderCTC:
    """pyctcdecode.build_ctcdecoder with a seqlm model; the unigrams default to the model's vocabulary
    (pyctcdecode reads them from an ARPA file's unigram section)."""
    lm = model if isinstance(model, Model) else Model(model)
    words = unigrams if unigrams is not None else lm.vocab.itos
    language_model = SeqlmLanguageModel(lm, words, alpha, beta, unk_score_offset, lm_score_boundary)
    return SeqlmDecoderCTC(Alphabet.build_alphabet(labels), language_model)


class SeqlmDecoderCTC(BeamSearchDecoderCTC):
    """pyctcdecode's decoder, whose batch calls use any multiprocessing pool (see the module docstring)."""

    def __reduce__(self):
        return _decoder_in_worker, (type(self), dict(vars(self)), pickle.dumps(self._language_model))

    def decode_batch(self, pool, logits_list, **options: Any) -> list[str]:
        """decode() of each logit matrix, in the pool's workers when a pool is given."""
        if pool is None:
            return super().decode_batch(None, logits_list, **options)
        return pool.map(functools.partial(self.decode, **options), logits_list)

    def decode_beams_batch(self, pool, logits_list, **options: Any) -> list:
        """pyctcdecode's picklable beams of each logit matrix (no LM states), in the pool's workers."""
        one = getattr(self, "_decode_beams_mp_safe", None)  # pyctcdecode's own per-utterance step
        if pool is None or one is None:
            return super().decode_beams_batch(pool, logits_list, **options)
        # that step takes every option, with no defaults of its own: the batch call's defaults fill them in
        call = inspect.signature(super().decode_beams_batch).bind(pool, logits_list, **options)
        call.apply_defaults()
        options = {k: v for k, v in call.arguments.items() if k not in ("pool", "logits_list")}
        return pool.map(functools.partial(one, **options), logits_list)


def _decoder_in_worker(cls: type, attributes: dict, language_model: bytes) -> SeqlmDecoderCTC:
    """The decoder again in a pool worker: a forked one (or this process) still holds the language model under
    the decoder's key; any other loads it once, and the worker's later tasks find it there."""
    key = attributes["_model_key"]
    if key not in BeamSearchDecoderCTC.model_container:
        BeamSearchDecoderCTC.model_container[key] = pickle.loads(language_model)
    decoder = cls.__new__(cls)
    vars(decoder).update(attributes)
    return decoder
