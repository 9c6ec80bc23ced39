"""The one interface every model family offers, the Kneser-Ney n-gram model included.

Evaluation, scoring, rescoring, interpolation and generation are written once against this
protocol; none of them asks which family a model is.

A `Batch` holds B rows of T predicted positions. Row b predicts `targets[b, t]` from the inputs up
to and including `inputs[b, t]`. A sentence starts wherever `resets[b, t]` is True: there the input
is the start symbol and no earlier input may be used as context. Padding has `mask` False.
Sentence-per-row batches (evaluation) and packed 200-token batches of whole sentences (FOFE training)
are both Batches; only the reset pattern differs.
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
    previous call returned (None at the very start). Used by `eval --stream` and by TBPTT training.
    """

    def score_stream(self, batch: Batch, state: State | None) -> tuple[Tensor, State]: ...


def context_order(model: LanguageModel) -> int | None:
    """n when the model predicts from its last n-1 tokens only (a finite-context model), else None.

    An optional attribute `context_order` (an n-gram model's order, an AFP-K model's K + 1): with it the
    lattice rescorer (seqlm.lattice.expand) expands exactly, without asking which family a model is.
    Models without it are treated as having unbounded histories.
    """
    return getattr(model, "context_order", None)
