"""The one interface every model family offers, the Kneser-Ney n-gram model included.

Evaluation, scoring, rescoring, interpolation and generation are written once against this
protocol; none of them asks which family a model is.

A `Batch` holds B rows of T predicted positions. Row b predicts `targets[b, t]` from the inputs up
to and including `inputs[b, t]`. A sentence starts wherever `resets[b, t]` is True: there the input
is the start symbol and no earlier input may be used as context. Padding has `mask` False.
Sentence-per-row batches (evaluation) and packed 200-token batches of whole sentences (FOFE training)
are both Batches; only the reset pattern differs.

States of `step` are batched: one row per sequence. Beam search keeps and reorders rows, lattice expansion
picks rows of many `step` calls and concatenates them; both do so only through `select_state` and
`cat_states` below, never by looking inside a state. By default a state is a tensor, or nested tuples /
lists / dicts of tensors, each with the batch on dimension 0, and rows concatenate along it. A family
whose state is laid out otherwise (an LSTM's (layers, B, H), a Transformer's key/value caches of different
lengths, a mixture's per-component states) defines methods `select_state(state, rows)` and
`cat_states(states)` with the same meaning, and the helpers use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from seqlm.data.vocab import Vocab

State = Any  # whatever a family needs to continue a sequence (hidden vector, recent ids, codes)


@dataclass
class Batch:
    inputs: Tensor  # (B, T) int64 context tokens; the start symbol at each sentence start
    targets: Tensor  # (B, T) int64 predicted tokens
    mask: Tensor  # (B, T) bool, False on padding
    resets: Tensor  # (B, T) bool, True where a new sentence starts (history is cut before it)

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device, non_blocking=True) for t in (self.inputs, self.targets, self.mask, self.resets)))


@runtime_checkable
class LanguageModel(Protocol):
    """What eval/score/rescore/interpolate/generate rely on."""

    vocab: Vocab

    def score(self, batch: Batch) -> Tensor:
        """(B, T) natural-log probability of each target; 0 where `mask` is False."""
        ...

    def initial_state(self, batch_size: int) -> State:
        """The state at a sentence start, before the start symbol has been read."""
        ...

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """Read tokens (B,) and return log-probabilities of the next token (B, V) and the new state."""
        ...


@runtime_checkable
class StreamingModel(LanguageModel, Protocol):
    """A model that can carry its history across sentence boundaries (recurrent families).

    `score_stream` scores a batch whose rows continue the rows of the previous call; `state` is what the
    previous call returned (None at the very start). Used by `eval --stream` and by TBPTT training. The scores
    must not depend on how the text is cut into calls (tests/test_conformance.py checks chunks of 1 token up).
    """

    def score_stream(self, batch: Batch, state: State | None) -> tuple[Tensor, State]: ...


def select_state(model: LanguageModel, state: State, rows: Tensor) -> State:
    """The state of rows `rows` (R,) of a batched `state`, in that order (a row may repeat)."""
    own = getattr(model, "select_state", None)
    return own(state, rows) if own is not None else _select_batch_first(state, rows)


def cat_states(model: LanguageModel, states: list[State]) -> State:
    """One batched state holding the rows of `states` (a non-empty list), in order."""
    own = getattr(model, "cat_states", None)
    return own(states) if own is not None else _cat_batch_first(states)


def _select_batch_first(state: State, rows: Tensor) -> State:
    if isinstance(state, Tensor):
        return state.index_select(0, rows.to(state.device))
    if isinstance(state, (tuple, list)):
        return type(state)(_select_batch_first(s, rows) for s in state)
    if isinstance(state, dict):
        return {k: _select_batch_first(v, rows) for k, v in state.items()}
    return state  # no per-row content (None, a number)


def _cat_batch_first(states: list[State]) -> State:
    first = states[0]
    if isinstance(first, Tensor):
        return torch.cat(states)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat_batch_first([s[i] for s in states]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _cat_batch_first([s[k] for s in states]) for k in first}
    return first  # no per-row content (None, a number)


def context_order(model: LanguageModel) -> int | None:
    """n when the model predicts from its last n-1 tokens only (a finite-context model), else None.

    An optional attribute `context_order` (an n-gram model's order, an AFP-K model's K + 1): with it the
    lattice rescorer (seqlm.lattice.expand) expands exactly, without asking which family a model is.
    Models without it are treated as having unbounded histories.
    """
    return getattr(model, "context_order", None)
